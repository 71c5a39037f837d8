"""Serving under load: requests and arrivals -> a scheduler (static, dynamic,
continuous, chunked) -> steps priced by a step-cost model built from engine
runs -> TTFT, TPOT, P99, throughput and goodput.

    cost = StepCost("k3", "ascend910b2", service.passes, service.pass_options())
    run = simulate(synthetic(2000, seed=0, rate=8), service, cost)
    print(summary(metrics(run)))

On many cards (cluster.py): `serve(requests, service, StepCost(..., tp=2), cards=8,
router="shortest-queue")` runs 8 / 2 replicas behind a router (routers.py);
`serve(..., cards=8, pd=(2, 6))` prefills on 2 cards and decodes on 6, the KV cache
sent between them (disagg.py). plan.py finds the fewest cards meeting the SLOs.
"""

from npusim.serving.arrivals import Request, load_trace, synthetic
from npusim.serving.report import metrics, requests_csv, summary
from npusim.serving.service import ServiceConfig, load_service
from npusim.serving.simulate import ServingRun, serve, simulate
from npusim.serving.stepcost import StepCost

__all__ = ["Request", "ServiceConfig", "ServingRun", "StepCost", "load_service", "load_trace", "metrics",
           "requests_csv", "serve", "simulate", "summary", "synthetic"]
