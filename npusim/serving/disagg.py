"""Prefill/decode disaggregation (DistServe, Splitwise): P cards of prefill instances
and D cards of decode instances, the KV cache of each prompt sent from the one to
the other.

`--pd P:D` on `cards = P + D` cards: P / tp prefill instances (cards 0 .. P - 1) and
D / tp decode instances (cards P .. P + D - 1), each a replica (replica.py) of the
service on tp cards, priced by the same step-cost model. A request goes through
them in two passes, both deterministic:

1. the prefill side serves every request as a one-token request behind `--router`:
   it is tokenized, queued and prefilled as the service does it, and its first
   token sampled and post-processed there;
2. then (the prefill side never waits for the decode side) the request's prompt KV
   cache goes to the decode instance the prefill->decode router (`--pd-router`,
   routers.py; default kv-local) picks at that moment, and the decode instance
   admits it with its cache in place (Seq.kv_ready: no prefill) and decodes the
   rest of its output.

The transfer is priced on the engine (`KvTransfer`): each of the tp cards of the
prefill instance sends its share of the prompt's KV cache (its K/V heads,
kv_bytes_per_token x prompt / tp bytes) to its counterpart in the decode
instance, all tp at once, as one send_recv step on the topology's links: HCCS
inside a node, the RoCE NIC between nodes (a card's node is card //
topology.node_device_count), with the link's start-up and the HBM traffic at both
ends, as the pipeline's hand-over is priced (parallel/pipeline.py).

# assumption: a transfer has its links to itself (transfers of several prompts at once do
# not share a link's bandwidth), and it starts once the prefill instance has sampled and
# post-processed the prompt's first token.
# assumption: the first token reaches the client when the KV cache reaches the decode
# instance (the front end streams a request's tokens from its decode instance, as vLLM's
# disaggregated proxy does), so the transfer time is in TTFT; a one-token request is
# answered by its prefill instance.
# assumption: the prompt's KV cache waits for its decode instance outside the blocks of
# either side (on the prefill instance's host or in flight): a decode instance short of
# blocks queues it, it does not hold up the prefill side.

The decode instances batch at iteration level (continuous or chunked), since a
request-level batch has no way to take sequences whose prefill was done elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from npusim.engine.host import Synchronize
from npusim.engine.links import LinkTransfer
from npusim.engine.run import run
from npusim.errors import ConfigError
from npusim.hw.parse import counted, plain
from npusim.serving.arrivals import Request
from npusim.serving.cluster import Cluster, at_the_door, check_cards, finished
from npusim.serving.replica import Replica, StepCostModel
from npusim.serving.routers import make_router
from npusim.serving.service import ServiceConfig
from npusim.serving.state import Seq, ServingRun

DECODE_SCHEDULERS = ("continuous", "chunked")  # iteration level: a sequence can join with its KV cache
DEFAULT_PD_ROUTER = "kv-local"


def parse_pd(text: str) -> tuple[int, int]:
    """'P:D' -> (P, D): cards of prefill and of decode instances."""
    p, colon, d = text.partition(":")
    try:
        pd = (plain(int, p), plain(int, d))
    except ValueError:
        pd = None
    if not colon or pd is None or min(pd) < 1:
        raise ConfigError(f"--pd: expected P:D, whole numbers of prefill and decode cards (each at least 1), "
                          f"got '{text}'")
    return pd


def check_pd(pd: tuple[int, int], cards: int | None, tp: int, service: ServiceConfig | None = None) -> None:
    """One-line ConfigError for a split that does not fit: P + D not the cards, tp not
    dividing P or D, or a service whose decode instances cannot take a KV cache."""
    p, d = pd
    for side, n in (("prefill", p), ("decode", d)):  # (0, 2) was '--cards: ... got 0', of the prefill side's cluster
        check_cards(f"--pd {p}:{d} ({side} cards)", n)
    check_cards(f"--pd {p}:{d}", p + d)
    check_cards("--tp", tp)
    if cards is not None and p + d != cards:
        raise ConfigError(f"--pd {p}:{d} splits {p + d} cards, but --cards is {cards} (P + D must be the cards)")
    for side, n in (("prefill", p), ("decode", d)):
        if n % tp:
            raise ConfigError(f"--pd {p}:{d}: --tp {tp} does not divide the {counted(n, side + ' card')} (each "
                              f"instance runs on --tp cards)")
    if service is not None and service.scheduler.kind not in DECODE_SCHEDULERS:
        raise ConfigError(f"--pd: service {service.name} batches with '{service.scheduler.kind}', but a decode "
                          f"instance takes requests whose prefill ran elsewhere, which only iteration-level "
                          f"schedulers do ({', '.join(DECODE_SCHEDULERS)}: --service-set scheduler.kind=continuous)")


class KvTransfer:
    """The time (µs) of one prompt's KV cache from a prefill instance to a decode
    instance, from the engine (module doc), memoised by (tokens, across nodes); one per
    (hardware config object, tp, KV bytes a token) in the process (`of`), so that every
    run on those cards shares its prices (the planner serves dozens)."""

    # (id of the HwConfig, which the entry holds, so the id stays its own; tp; bytes a token)
    _of: dict[tuple[int, int, int], KvTransfer] = {}

    @classmethod
    def of(cls, cost: StepCostModel) -> KvTransfer:
        k = (id(cost.hw), cost.tp, cost.workload.kv_bytes_per_token)
        if k not in cls._of:
            cls._of[k] = cls(cost)
        return cls._of[k]

    def __init__(self, cost: StepCostModel):
        self.hw, self.tp = cost.hw, cost.tp
        self.bytes_per_token = cost.workload.kv_bytes_per_token
        self.priced: dict[tuple[int, bool], float] = {}

    def us(self, tokens: int, inter_node: bool) -> float:
        k = (tokens, inter_node)
        if k not in self.priced:
            nbytes = tokens * self.bytes_per_token // self.tp  # one card's K/V heads; its tp peers send theirs at once
            step = run([LinkTransfer("kv_cache", "send_recv", nbytes, (1,), 2, inter_node, 0, "graph"), Synchronize()],
                       self.hw)
            self.priced[k] = self.hw.us(step.kernels[0].cycles)
        return self.priced[k]


class Disaggregated:
    """`pd` = (P, D) cards of prefill and decode instances of `service` (module doc)."""

    def __init__(self, service: ServiceConfig, cost: StepCostModel, pd: tuple[int, int],
                 router: str = "round-robin", pd_router: str = DEFAULT_PD_ROUTER):
        p, d = pd
        check_pd(pd, None, cost.tp, service)
        make_router(pd_router, "--pd-router", prefilled=True)  # the decode side's cluster would name it --router
        self.service, self.cost, self.pd = service, cost, pd
        self.router_name = f"{router}, then {pd_router}"
        self.transfer = KvTransfer.of(cost)
        self.prefill = Cluster(service, cost, p, router, "prefill")
        self.decode = Cluster(service, cost, d, pd_router, "decode", p // cost.tp, self._kv_arrival)
        self.kv_capacity_tokens = self.prefill.kv_capacity_tokens

    def _kv_arrival(self, seq: Seq, replica: Replica) -> float:
        """The prompt's KV cache, sent at seq.ready_us (its first token done), reaches `replica`."""
        seq.kv_transfer_us = self.transfer.us(seq.prompt, replica.node != seq.kv_node)
        arrival = seq.ready_us + seq.kv_transfer_us
        seq.token_us = [arrival]  # the first token reaches the client with the KV cache (module doc)
        return arrival

    def run(self, requests: Sequence[Request]) -> ServingRun:
        """Serve `requests` on fresh instances (each run starts empty)."""
        seqs = at_the_door(requests, self.cost.workload.max_context_tokens)
        live = [s for s in seqs if s.status is None]
        firsts = [Seq(attrs.evolve(s.req, output_tokens=1)) for s in live]  # the prefill side's part of each
        prefill = self.prefill.serve(firsts, lambda s: s.arrival_us)
        sent = []
        for s, f in zip(live, firsts):
            s.started_us, s.preemptions, s.replica = f.started_us, f.preemptions, f.replica
            s.token_us, s.generated = list(f.token_us), f.generated
            if f.status != "ok" or s.output == 1:  # lost on the prefill side, or answered there
                s.finish(f.status, f.done_us)
                continue
            s.ready_us = f.token_us[0]  # the KV cache leaves once its first token is done
            s.kv_node = prefill[f.replica - self.prefill.first_index].node
            s.kv_ready = True
            sent.append(s)
        decode = self.decode.serve(sent, lambda s: s.ready_us)
        return finished(self, seqs, prefill + decode, self.pd)


__all__ = ["DECODE_SCHEDULERS", "DEFAULT_PD_ROUTER", "Disaggregated", "KvTransfer", "check_pd", "parse_pd"]
