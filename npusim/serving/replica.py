"""One replica of a service: a serving process on its `tp` cards, with its
scheduler, its KV blocks and its step-cost model, fed by the cluster's router.

The replica's loop is one inference thread (no SimPy: a serving run has tens of
thousands of steps). Time is in µs. The host, as modelled (every cost is a field
of the service's HostConfig):
- tokenization (`tokenize_us` per request) runs on a pool of `pool_threads`
  threads (FIFO, beside the loop), or on the inference thread itself, which
  tokenizes whatever has arrived between steps;
- post-processing (`postprocess_us_per_token`: sampling, detokenize, streaming)
  of each generated token: on the pool it delays only that token's delivery; on
  the inference thread it is done one token after another after the step;
- every step costs `step_overhead_us` of framework time before its launches, and
  a shape's first run compiles its kernels (StepCost.compile_us) before it runs,
  unless the service compiles every shape before serving (`precompile`);
- the sync policy comes from the passes: without the sync pass the inference
  thread blocks in synchronize for the whole step, so its host work
  (tokenization, post-processing) adds to every step; with event callbacks it
  does that work while the device runs the step, which then takes the longer of
  the two. The device step itself (its launches and waits) is the engine's.

The loop is a generator the cluster drives: it runs while it knows every
request that could reach it by its current time, and pauses (yields) when a
request arriving at or before that time has not been routed yet, or when it is
idle and its next request is not yet known. Each replica has its own tokenizer
pool, compiled shapes and KV blocks; replicas of one cluster share the step-cost
model (their cards are alike). Under disaggregation (disagg.py) a replica is a
prefill or a decode instance (`role`); a decode instance tokenizes nothing: it
takes each request once its KV cache has arrived (`kv_arrival`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator
from typing import Protocol

from npusim.errors import DeadlockError
from npusim.hw import HwConfig
from npusim.serving.schedulers import make_scheduler
from npusim.serving.service import ServiceConfig
from npusim.serving.state import ReplicaRecord, Seq, StepRecord, Work
from npusim.workload import Workload


class StepCostModel(Protocol):
    """What a replica asks of its step prices (serving.stepcost.StepCost is one)."""

    workload: Workload
    hw: HwConfig  # one card
    passes: tuple[str, ...]
    tp: int  # cards of the replica: every step is one card's sharded step

    def work_us(self, work: Work) -> float:
        """Device time of one iteration."""

    def shapes(self, work: Work) -> set[tuple]:
        """The shapes an iteration runs, (phase, *numbers): a new one compiles."""

    def compile_us(self, phase: str) -> float:
        """Host time compiling a new shape of `phase`."""

    def kv_capacity_bytes(self, fraction: float) -> int:
        """KV-cache bytes one card holds beside its weights, activations and workspace, x fraction."""


class KvArrival(Protocol):
    """A decode instance's (disagg.py): when the KV cache of `seq`, routed to `replica`, reaches it (µs)."""

    def __call__(self, seq: Seq, replica: Replica) -> float: ...


class Feed(Protocol):
    """The cluster, as its replicas see it."""

    next_arrival_us: float | None  # arrival of the next request not routed yet (None: all routed)


class Replica:
    """One serving process: `receive` takes a routed request, `advance` runs its loop as
    far as the requests routed so far allow, `record` sums it up once the run is over."""

    def __init__(self, index: int, service: ServiceConfig, cost: StepCostModel, kv_capacity_tokens: int,
                 feed: Feed, role: str = "", kv_arrival: KvArrival | None = None):
        self.index = index
        self.service = service
        self.cost = cost
        self.feed = feed
        self.role = role  # "prefill" or "decode" instance under disaggregation, "" colocated
        self.kv_arrival = kv_arrival  # a decode instance: when a routed request's KV cache reaches it
        self.node = index * cost.tp // cost.hw.topology.node_device_count  # the node of its first card
        self.kv_capacity_tokens = kv_capacity_tokens
        self.sched = make_scheduler(service.scheduler, kv_capacity_tokens)
        self.blocking = "sync" not in cost.passes  # event callbacks only with the sync pass
        self.on_pool = service.host.preprocess_on == "pool"
        # the loop takes a request as it is ready, without tokenizing it: tokenized on the pool,
        # or (a decode instance) tokenized on the prefill instance, ready when its KV cache is in
        self.direct = self.on_pool or kv_arrival is not None
        self.free = [0.0] * service.host.pool_threads  # the tokenizer pool: when each thread is free
        self.queue: list[Seq] = []  # routed here, in the order the loop takes them
        self.i = 0  # queue[:i] are taken
        self.routed: list[Seq] = []
        self.open: list[Seq] = []  # routed and not known to have finished (outstanding)
        self.steps: list[StepRecord] = []
        self.now = 0.0  # where its loop is (a replica may run ahead of the arrival being routed)
        self.done = False
        self._loop = self._run()

    # ---- the router's side

    def receive(self, seq: Seq) -> None:
        """The router sends `seq` here at its arrival."""
        seq.replica = self.index
        if self.kv_arrival is not None:  # its prompt's KV cache is sent here from its prefill instance
            seq.ready_us = self.kv_arrival(seq, self)
        elif self.on_pool:  # FIFO over the pool's threads: each request takes the first free one
            t = max(seq.arrival_us, heapq.heappop(self.free))
            seq.ready_us = t + self.service.host.tokenize_us
            heapq.heappush(self.free, seq.ready_us)
        bisect.insort(self.queue, seq, lo=self.i, key=self._key)
        self.routed.append(seq)
        self.open.append(seq)

    def outstanding(self, now: float) -> tuple[int, int]:
        """(requests, their prompt + output tokens) routed here and not finished by `now`."""
        self.open = [s for s in self.open if s.done_us is None or s.done_us > now]
        return len(self.open), sum(s.prompt + s.output for s in self.open)

    def _key(self, s: Seq) -> tuple[float, int]:
        """When the loop can take a request (tokenized on the pool, or arrived), then its id."""
        return (s.ready_us if self.direct else s.arrival_us), s.req.id

    # ---- the cluster's side

    def advance(self) -> None:
        """Run until the loop needs a request not routed yet, or to the end once all are."""
        if not self.done:
            for _ in self._loop:
                return
            self.done = True

    def record(self) -> ReplicaRecord:
        return ReplicaRecord(self.index, self.index * self.cost.tp, self.cost.tp, len(self.routed),
                             sum(s.prompt for s in self.routed), sum(s.generated for s in self.routed),
                             sum(s.status == "ok" for s in self.routed),
                             sum(st.end_us - st.start_us + st.compile_us + self.service.host.step_overhead_us
                                 for st in self.steps), len(self.steps),
                             self.kv_capacity_tokens, self.role)

    # ---- the loop

    def _run(self) -> Iterator[None]:
        service, cost, sched, feed, queue = self.service, self.cost, self.sched, self.feed, self.queue
        host, blocking, on_pool, direct = service.host, self.blocking, self.on_pool, self.direct
        timeout = service.slo.timeout_ms * 1e3 if service.slo.timeout_ms else None
        shapes_seen: set = set()
        steps = self.steps
        incoming: list[Seq] = []  # arrived, waiting for the inference thread to tokenize them
        now, owed = 0.0, 0.0  # owed: inference-thread post-processing not done yet (µs)

        def key(s: Seq) -> float:
            return s.ready_us if direct else s.arrival_us

        def unrouted_by(t: float) -> bool:
            """A request arriving at or before t has not been routed yet."""
            return feed.next_arrival_us is not None and feed.next_arrival_us <= t

        def tokenize_now() -> None:
            """The inference thread tokenizes what has arrived (after the host work it owes)."""
            nonlocal now, owed, incoming
            now += owed + len(incoming) * host.tokenize_us
            owed = 0.0
            for s in incoming:
                s.ready_us = now
                sched.add(s, now)
            incoming = []

        while True:
            if blocking and owed:  # blocked in synchronize during the step: the host work comes after it
                now, owed = now + owed, 0.0
            self.now = now
            while unrouted_by(now):  # every request that may have reached it by now must be routed
                yield
            while self.i < len(queue) and key(queue[self.i]) <= now:
                incoming.append(queue[self.i])
                self.i += 1
            if direct:
                for s in incoming:
                    sched.add(s, now)
                incoming = []
            elif incoming and (blocking or not sched.busy()):  # nothing to overlap with: tokenize now
                tokenize_now()
                continue  # more may have arrived meanwhile
            sched.flush = feed.next_arrival_us is None and self.i == len(queue) and not incoming
            for s in sched.expire(now, timeout):
                s.finish("timeout", now)
            work = sched.next(now)
            if isinstance(work, Work):
                device = cost.work_us(work)
                new = cost.shapes(work) - shapes_seen
                shapes_seen |= new
                compile_us = 0.0 if service.precompile else sum(cost.compile_us(phase) for phase, *_ in sorted(new))
                # events: the host tokenizes and post-processes while the device runs the step
                overlap = owed + len(incoming) * host.tokenize_us
                start = now + host.step_overhead_us + compile_us
                end = start + (device if blocking else max(device, overlap))
                for s in work.seqs:
                    if s.started_us is None:
                        s.started_us = now
                owed = _advance(work, end, host, on_pool)
                steps.append(StepRecord(start, end, device, compile_us, len(work.decode),
                                        sum(n for _, n in work.prefill), sched.kv_tokens_used(), self.index))
                sched.done(work, end)
                for s in incoming:
                    s.ready_us = end
                    sched.add(s, end)
                incoming = []
                now = end
                continue
            if incoming:  # the scheduler waits (a scan, a timeout): time to tokenize
                tokenize_now()
                continue
            # idle: wait for the next request (or the scheduler's next look)
            while self.i == len(queue) and feed.next_arrival_us is not None:
                if work is not None and work < feed.next_arrival_us:
                    break  # the scheduler looks again before any request can come
                self.now = now
                yield  # its next request is the router's to give
            upcoming = key(queue[self.i]) if self.i < len(queue) else None
            wake = [t for t in (work, upcoming) if t is not None]
            if not wake:
                if sched.busy() and not sched.flush and feed.next_arrival_us is None:
                    # the last request went to another replica meanwhile: a batch waiting for more (static)
                    # runs now with what it has; it was left waiting and its requests counted as out of memory
                    continue
                now += owed
                break
            now = max(now, min(wake))
        if sched.waiting:  # nothing more can run them (cannot happen with a correct scheduler): not an OOM
            raise DeadlockError(f"serving: replica {self.index} stopped at {now / 1e6:.6f} s with "
                                f"{len(sched.waiting)} request(s) waiting and nothing left to run them (request "
                                f"{sched.waiting[0].req.id} first): the {service.scheduler.kind} scheduler deadlocked")
        self.now = now


def _advance(work: Work, end: float, host, on_pool: bool) -> float:
    """Advance the step's sequences: prefill progress, new tokens (delivered once
    post-processed), finished requests. Returns the inference-thread time their
    post-processing takes (0 on the pool)."""
    emitting: list[Seq] = []
    for s, n in work.prefill:
        s.prefilled += n
        if s.prefilled >= s.goal:
            s.decoding = True
            emitting.append(s)
    emitting += work.decode
    post = host.postprocess_us_per_token
    for k, s in enumerate(emitting):
        s.generated += 1
        s.token_us.append(end + (post if on_pool else (k + 1) * post))
        if s.generated >= s.output:
            s.finish("ok", s.token_us[-1])
    return 0.0 if on_pool else len(emitting) * post


__all__ = ["Feed", "KvArrival", "Replica", "StepCostModel"]
