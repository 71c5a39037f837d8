"""The serving simulation: requests arrive, are tokenized, batched by a scheduler
and run step by step on the device, each step priced by the step-cost model.

`simulate` is one replica on one card: the N = 1 case of the cluster
(cluster.py), whose replicas run the loop and host model of replica.py.
`serve` is the general case: `cards / tp` replicas behind a router, or prefill and
decode instances on separate cards (disagg.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from npusim.serving.arrivals import Request
from npusim.serving.cluster import Cluster
from npusim.serving.disagg import DEFAULT_PD_ROUTER, Disaggregated, check_pd
from npusim.serving.replica import StepCostModel
from npusim.serving.service import ServiceConfig
from npusim.serving.state import ReplicaRecord, ServingRun, StepRecord


def simulate(requests: Sequence[Request], service: ServiceConfig, cost: StepCostModel) -> ServingRun:
    """One replica of `service` on cost.tp cards (one card unless the model is sharded)."""
    return Cluster(service, cost).run(requests)


def serve(requests: Sequence[Request], service: ServiceConfig, cost: StepCostModel, cards: int | None = None,
          router: str = "round-robin", pd: tuple[int, int] | None = None,
          pd_router: str = DEFAULT_PD_ROUTER) -> ServingRun:
    """`cards / cost.tp` replicas of `service` behind `router` (routers.ROUTERS); with
    `pd` = (P, D), P cards of prefill instances behind `router` and D = cards - P of
    decode instances behind `pd_router`, the KV cache sent between them (disagg.py)."""
    if pd is not None:
        check_pd(pd, cards, cost.tp, service)
        return Disaggregated(service, cost, pd, router, pd_router).run(requests)
    return Cluster(service, cost, cards, router).run(requests)


__all__ = ["ReplicaRecord", "ServingRun", "StepRecord", "serve", "simulate"]
