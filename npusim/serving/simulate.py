"""The serving simulation: requests arrive, are tokenized, batched by a scheduler
and run step by step on the device, each step priced by the step-cost model.

A plain event loop over one inference thread (no SimPy: there is one device
and one loop, and a serving run has tens of thousands of steps). Time is in µs.

The host, as modelled (every cost is a field of the service's HostConfig):
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
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from attrs import frozen

from npusim.serving.arrivals import Request
from npusim.serving.schedulers import make_scheduler
from npusim.serving.service import ServiceConfig
from npusim.serving.state import Seq, Work
from npusim.serving.stepcost import StepCost


@frozen
class StepRecord:
    start_us: float
    end_us: float
    device_us: float
    compile_us: float
    decode_batch: int
    prefill_tokens: int
    kv_tokens: int  # KV-cache tokens held (reserved) during the step


@frozen
class ServingRun:
    """A finished simulation: every request's record and every step's."""

    service: ServiceConfig
    cost: StepCost
    seqs: tuple[Seq, ...]
    steps: tuple[StepRecord, ...]
    kv_capacity_tokens: int
    preemptions: int
    blocking_sync: bool


def simulate(requests: Sequence[Request], service: ServiceConfig, cost: StepCost) -> ServingRun:
    host = service.host
    blocking = "sync" not in cost.passes  # event callbacks only with the sync pass
    ctx = cost.workload.max_context_tokens
    kv_capacity = cost.kv_capacity_bytes(service.scheduler.kv_memory_fraction) // cost.workload.kv_bytes_per_token
    sched = make_scheduler(service.scheduler, kv_capacity)
    seqs = [Seq(r) for r in requests]
    for s in seqs:  # longer than the model's context: rejected on arrival, never run
        if s.prompt + s.output > ctx:
            s.finish("rejected", s.arrival_us)
    queue = [s for s in seqs if s.status is None]
    on_pool = host.preprocess_on == "pool"
    if on_pool:  # FIFO over the pool's threads: each request takes the first free one
        free = [0.0] * host.pool_threads
        for s in queue:
            t = max(s.arrival_us, heapq.heappop(free))
            s.ready_us = t + host.tokenize_us
            heapq.heappush(free, s.ready_us)
        queue.sort(key=lambda s: (s.ready_us, s.req.id))
    timeout = service.slo.timeout_ms * 1e3 if service.slo.timeout_ms else None
    shapes_seen: set = set()
    steps: list[StepRecord] = []
    incoming: list[Seq] = []  # arrived, waiting for the inference thread to tokenize them
    now, i, owed = 0.0, 0, 0.0  # owed: inference-thread post-processing not done yet (µs)

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
        while i < len(queue) and (queue[i].ready_us if on_pool else queue[i].arrival_us) <= now:
            incoming.append(queue[i])
            i += 1
        if on_pool:
            for s in incoming:
                sched.add(s, now)
            incoming = []
        elif incoming and (blocking or not sched.busy()):  # nothing to overlap with: tokenize now
            tokenize_now()
            continue  # more may have arrived meanwhile
        sched.flush = i == len(queue) and not incoming
        for s in sched.expire(now, timeout):
            s.finish("timeout", now)
        work = sched.next(now)
        if isinstance(work, Work):
            device = cost.work_us(work)
            new = cost.shapes(work) - shapes_seen
            shapes_seen |= new
            compile_us = 0.0 if service.precompile else sum(cost.compile_us(phase) for phase, _, _ in sorted(new))
            # events: the host tokenizes and post-processes while the device runs the step
            overlap = owed + len(incoming) * host.tokenize_us
            start = now + host.step_overhead_us + compile_us
            end = start + (device if blocking else max(device, overlap))
            for s in work.seqs:
                if s.started_us is None:
                    s.started_us = now
            owed = _advance(work, end, host, on_pool)
            steps.append(StepRecord(start, end, device, compile_us, len(work.decode),
                                    sum(n for _, n in work.prefill), sched.kv_tokens_used()))
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
        upcoming = (queue[i].ready_us if on_pool else queue[i].arrival_us) if i < len(queue) else None
        wake = [t for t in (work, upcoming) if t is not None]
        if not wake:
            now += owed
            break
        now = max(now, min(wake))
    for s in sched.waiting:  # nothing more can run them (cannot happen with a correct scheduler)
        s.finish("oom", now)
    return ServingRun(service, cost, tuple(seqs), tuple(steps), kv_capacity, sched.preemptions, blocking)


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


__all__ = ["ServingRun", "StepRecord", "simulate"]
