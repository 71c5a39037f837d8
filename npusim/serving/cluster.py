"""A service on many cards: `cards / tp` replicas behind a router.

Each replica (replica.py) is one serving process on `tp` cards of one node: its
own scheduler, tokenizer pool, compiled shapes and KV blocks, its steps priced by
the step-cost model of one card's tensor-parallel shard (StepCost(tp=...): the
sharded decoder and its all_reduces on the engine, as `npusim run --tp` prices a
step). The router (routers.py) sends each request to a replica as it arrives.
One replica on one card is `simulate` (simulate.py): the same loop, the same
figures.

Memory is checked per card: a replica's weights, activations and workspace (one
card's shard, at the scheduler's largest decode batch) must fit each of its
cards, and what is left of a card, times the service's kv_memory_fraction, holds
that card's share of the replica's KV blocks; a token's KV cache is split over
the tp cards with the K/V heads, so the replica's pool is tp times a card's share.

The run is deterministic: requests are routed in arrival order (ties by their
order in the load; a decode side routes them as their prefill instances send
their KV caches, disagg.py), the replicas are advanced in index order up to each arrival,
and routers break ties by the lowest index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from npusim.errors import ConfigError
from npusim.parallel.plan import Plan, check_plan
from npusim.serving.arrivals import Request, check_load
from npusim.serving.replica import KvArrival, Replica, StepCostModel
from npusim.serving.routers import make_router
from npusim.serving.service import ServiceConfig
from npusim.serving.state import Seq, ServingRun

# Cards of one cluster: the router looks at every replica for every request.
MAX_CARDS = 4096


def check_cards(flag: str, n) -> None:
    """One-line ConfigError unless `n` (what `flag` gives) is a whole number of cards from 1 to MAX_CARDS."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CARDS:
        raise ConfigError(f"{flag}: expected a whole number of cards from 1 to {MAX_CARDS}, got {n!r}")


def check_cluster(cards: int, tp: int, router: str | None = None, prefilled: bool = False) -> None:
    """One-line ConfigError for cards and tp that do not make whole replicas, or an unknown router
    (`prefilled`: a decode side's, routing prefilled requests; see routers.make_router)."""
    for flag, n in (("--tp", tp), ("--cards", cards)):  # --tp first: the default --cards is --tp
        check_cards(flag, n)
    if cards % tp:
        raise ConfigError(f"--cards {cards} is not a multiple of --tp {tp}: each replica runs on --tp cards")
    if router is not None:
        make_router(router, prefilled=prefilled)


def check_topology(flag: str, cards: int, hw) -> None:
    """One-line ConfigError for more cards than `hw`'s topology has (topology.node_device_count
    x topology.node_count, the cards `npusim run` may use too): --cards 64 on a topology of 32
    served 64 replicas, those past the last node on nodes the config does not have."""
    topo = hw.topology
    if cards > topo.max_devices:
        raise ConfigError(f"{flag}: {cards} cards, but {hw.name}'s topology has {topo.size_text()}: give at "
                          f"most {topo.max_devices}, or more nodes (--set topology.node_count=N)")


def check_nodes(tp: int, first_index: int, replicas: int, node_cards: int) -> None:
    """One-line ConfigError for a replica whose cards (replica k: k x tp .. k x tp + tp - 1)
    span two nodes of `node_cards`: its all_reduces were priced as inside one node
    (--tp 2 on nodes of 3 cards put replica 1 on cards 2 and 3, one in each)."""
    for k in range(first_index, first_index + replicas):
        first, last = k * tp, k * tp + tp - 1
        if first // node_cards != last // node_cards:
            raise ConfigError(f"--tp {tp}: replica {k} (cards {first}-{last}) would span two nodes of {node_cards} "
                              f"cards (topology.node_device_count): a tensor-parallel group runs within one node "
                              f"(give a --tp that divides {node_cards})")


class Cluster:
    """`cards / cost.tp` replicas of `service` behind the router named `router`.

    Under disaggregation (disagg.py) a cluster is one side: `role` names it ("prefill" or
    "decode"), its replicas are numbered from `first_index` (their cards from first_index x
    tp), and a decode side's replicas take requests whose KV cache `kv_arrival` prices."""

    def __init__(self, service: ServiceConfig, cost: StepCostModel, cards: int | None = None,
                 router: str = "round-robin", role: str = "", first_index: int = 0,
                 kv_arrival: KvArrival | None = None):
        tp = cost.tp
        cards = tp if cards is None else cards
        check_cluster(cards, tp, router, prefilled=role == "decode")
        check_plan(Plan(tp), cost.workload, cost.hw)  # tp divides the heads, within a node
        check_topology("cards", first_index * tp + cards, cost.hw)  # a decode side's cards follow the prefill's
        check_nodes(tp, first_index, cards // tp, cost.hw.topology.node_device_count)
        self.service, self.cost, self.cards, self.router_name = service, cost, cards, router
        self.role, self.first_index, self.kv_arrival = role, first_index, kv_arrival
        self.kv_capacity_tokens = replica_kv_tokens(service, cost)
        self.next_arrival_us: float | None = None  # what the replicas wait on (replica.Feed)

    def run(self, requests: Sequence[Request]) -> ServingRun:
        """Serve `requests` on fresh replicas (each run starts empty)."""
        seqs = at_the_door(requests, self.cost.workload.max_context_tokens)
        replicas = self.serve([s for s in seqs if s.status is None], lambda s: s.arrival_us)
        return finished(self, seqs, replicas)

    def serve(self, seqs: Sequence[Seq], door: Callable[[Seq], float]) -> list[Replica]:
        """Route `seqs` to fresh replicas, each at its `door` time (its arrival; on a decode
        side, when its prefill instance starts sending its KV cache), and run them to the end."""
        route = make_router(self.router_name, prefilled=self.role == "decode").route
        replicas = [Replica(self.first_index + k, self.service, self.cost, self.kv_capacity_tokens, self, self.role,
                            self.kv_arrival) for k in range(self.cards // self.cost.tp)]
        for s in sorted(seqs, key=door):  # stable: ties in their order in the load
            self.next_arrival_us = door(s)
            for r in replicas:  # each up to the arrival: the router sees them as they are then
                r.advance()
            replicas[route(s, replicas, door(s))].receive(s)
        self.next_arrival_us = None
        for r in replicas:
            r.advance()
        return replicas


def at_the_door(requests: Sequence[Request], context_tokens: int) -> list[Seq]:
    """A sequence per request (check_load: the load is checked here, at the API's door);
    one longer than the model's context (`context_tokens`) is rejected on arrival, never routed."""
    seqs = [Seq(r) for r in check_load(requests)]
    for s in seqs:
        if s.prompt + s.output > context_tokens:
            s.finish("rejected", s.arrival_us)
    return seqs


def finished(cluster, seqs: Sequence[Seq], replicas: Sequence[Replica], pd: tuple[int, int] | None = None
             ) -> ServingRun:
    """The run's record: every request, every replica's steps in order of start (ties by
    replica), and each replica's record; `cluster` gives the service, the step-cost model,
    a replica's KV pool and the router's name."""
    steps = replicas[0].steps if len(replicas) == 1 else sorted(
        (st for r in replicas for st in r.steps), key=lambda st: (st.start_us, st.replica))
    return ServingRun(cluster.service, cluster.cost, tuple(seqs), tuple(steps), cluster.kv_capacity_tokens,
                      sum(r.sched.preemptions for r in replicas), replicas[0].blocking,
                      tuple(r.record() for r in replicas), cluster.router_name, pd)


def replica_kv_tokens(service: ServiceConfig, cost: StepCostModel) -> int:
    """KV-cache tokens one replica's blocks hold: each of its tp cards holds 1/tp of a
    token's KV (its K/V heads) in what its weights, activations and workspace leave.
    ConfigError when those alone do not fit a card."""
    if cost.kv_capacity_bytes(1.0) <= 0:
        raise ConfigError(_does_not_fit(service, cost))
    per_card = cost.workload.kv_bytes_per_token // cost.tp
    return cost.kv_capacity_bytes(service.scheduler.kv_memory_fraction) // per_card


def _does_not_fit(service: ServiceConfig, cost) -> str:
    from npusim.runtime.memory import size

    what = f"a replica of {cost.workload.name} on {cost.tp} card{'s' if cost.tp > 1 else ''} (--tp {cost.tp})"
    try:  # StepCost: the decode step of max_batch its KV capacity is read from
        m = cost.point("decode", cost.max_batch, cost.decode.knots[1][0]).memory
    except AttributeError:
        return f"{what} does not fit a card: no memory is left for its KV cache"
    return (f"{what} does not fit a card: weights {size(m.weights_bytes)} + activations {size(m.activation_bytes)} "
            f"+ workspace {size(m.workspace_bytes)} per card at batch {cost.max_batch} leave no room for KV cache "
            f"in {size(cost.hw.hbm.hbm_bytes)} (more cards per replica: --tp; or a smaller scheduler.max_batch)")


__all__ = ["Cluster", "MAX_CARDS", "at_the_door", "check_cards", "check_cluster", "check_nodes", "check_topology",
           "finished", "replica_kv_tokens"]
