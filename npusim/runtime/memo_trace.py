"""The trace of a memoised run as a whole timeline (see run.py for the memo).

The engine records spans only for what it simulated: a replayed kernel (one whose
lone twin already ran, engine.device.Reuse) has no block spans or instructions,
and the layers the memo replicates have no host, stream or core spans at all.
These functions fill them in from what was simulated, by identity - a span's
kernel id, or its host call's position in the host program - never by name:
- a replayed kernel gets its twin's block spans and instructions, moved to its start;
- each replicated layer gets the pattern layer's spans, moved by whole layers: the
  device tracks (streams, cores, links) by the device time a layer adds, the host
  track by the host time a layer adds; everything after the replicated block moves
  by the same amounts times the number of copies.
# assumption: a host call after the replicated layers starts later by the host time
# of the copies; a Synchronize among them ends when the device does, which moved by
# the device time of the copies (the larger of the two).
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from npusim.engine import KernelRecord, RunResult
from npusim.engine.host import Launch, Synchronize
from npusim.engine.run import Trace
from npusim.runtime.compile import HostProgram


def fill_replays(result: RunResult, program: HostProgram) -> RunResult:
    """Give each replayed kernel its twin's block spans and instruction intervals,
    moved to the replay's start (the twin ran alone on an idle device, as the replay does)."""
    trace = result.trace
    if trace.level == "kernel":
        return result
    reuse = {(c.owner.node, c.owner.index): c.reuse.key for c in program.calls
             if isinstance(c, Launch) and c.reuse is not None and c.owner is not None}
    spans, intervals = defaultdict(list), defaultdict(list)
    for s in trace.block_spans:
        spans[s[5]].append(s)
    for i in trace.intervals:
        intervals[i[5]].append(i)
    twins: dict[tuple, KernelRecord] = {}
    new_spans, new_intervals = list(trace.block_spans), list(trace.intervals)
    for r in sorted(result.kernels, key=lambda r: r.id):
        key = None if r.owner is None else reuse.get((r.owner.node, r.owner.index))
        if key is None:
            continue
        if r.id in spans:
            twins.setdefault(key, r)
        elif key in twins:
            twin = twins[key]
            d = r.start - twin.start
            new_spans += [(core, r.name, b, s + d, e + d, r.id) for core, _, b, s, e, _ in spans[twin.id]]
            new_intervals += [(core, pipe, n, s + d, e + d, r.id) for core, pipe, n, s, e, _ in intervals[twin.id]]
    return attrs.evolve(result, trace=attrs.evolve(trace, block_spans=tuple(new_spans),
                                                   intervals=tuple(new_intervals)))


def replicate_trace(part: RunResult, program: HostProgram, pattern: set[str],
                    replicas: dict[int, list[KernelRecord]], after: set[int], delta: float,
                    window: tuple[float, float]) -> Trace:
    """`part`'s trace with the pattern layer's spans repeated once per copy and what
    follows them moved. `pattern`: the nodes of the pattern layer; `replicas`: pattern
    kernel id -> its copies' records, in copy order; `after`: ids of the simulated
    kernels launched after the pattern layer; `delta`: the device time one layer adds;
    `window`: the device interval (start, end] whose link samples one layer repeats."""
    trace = part.trace
    n = len(next(iter(replicas.values()), ()))
    by_place = {(r.owner.node, r.owner.index): r.id for r in part.kernels if r.id in replicas}
    calls = program.calls
    layer_calls = [i for i, o in enumerate(program.owners) if o in pattern]
    first_call, last_call = layer_calls[0], layer_calls[-1]
    host = [s for s in trace.host_spans if s[0] == "host"]
    host_delta = host[last_call][3] - (host[first_call - 1][3] if first_call else host[first_call][2])

    def place_of(i: int) -> str:
        return "layer" if program.owners[i] in pattern else "after" if i > last_call else "before"

    def launch_names(i: int) -> list[str] | None:
        c = calls[i]
        if isinstance(c, Launch) and c.owner is not None and (c.owner.node, c.owner.index) in by_place:
            return [r.name for r in replicas[by_place[(c.owner.node, c.owner.index)]]]
        return None

    spans: list[tuple] = []
    streams: dict[int, list[int]] = defaultdict(list)  # stream -> its calls in order (one span each)
    for i, c in enumerate(calls):
        if hasattr(c, "stream") and not isinstance(c, Synchronize):
            streams[c.stream].append(i)
    on_stream: dict[str, list] = defaultdict(list)
    for s in trace.host_spans:
        if s[0] != "host":
            on_stream[s[0]].append(s)
    for i, (track, name, start, end) in enumerate(host):
        where = place_of(i)
        if where == "after":
            moved_end = end + n * (delta if isinstance(calls[i], Synchronize) else host_delta)
            spans.append((track, name, start + n * host_delta, max(moved_end, start + n * host_delta)))
            continue
        spans.append((track, name, start, end))
        if where == "layer":
            names = launch_names(i)
            spans += [(track, f"launch {names[j - 1]}" if names else name, start + j * host_delta,
                       end + j * host_delta) for j in range(1, n + 1)]
    for stream, idx in streams.items():
        for i, (track, name, start, end) in zip(idx, on_stream.get(f"stream {stream}", ())):
            where = place_of(i)
            if where == "after":
                spans.append((track, name, start + n * delta, end + n * delta))
                continue
            spans.append((track, name, start, end))
            if where == "layer":
                names = launch_names(i)
                spans += [(track, names[j - 1] if names else name, start + j * delta, end + j * delta)
                          for j in range(1, n + 1)]
    block_spans = []
    for core, kname, b, start, end, kid in trace.block_spans:
        if kid in after:
            block_spans.append((core, kname, b, start + n * delta, end + n * delta, kid))
            continue
        block_spans.append((core, kname, b, start, end, kid))
        block_spans += [(core, r.name, b, start + j * delta, end + j * delta, r.id)
                        for j, r in enumerate(replicas.get(kid, ()), 1)]
    intervals = []
    for core, pipe, name, start, end, kid in trace.intervals:
        if kid in after:
            intervals.append((core, pipe, name, start + n * delta, end + n * delta, kid))
            continue
        intervals.append((core, pipe, name, start, end, kid))
        intervals += [(core, pipe, name, start + j * delta, end + j * delta, r.id)
                      for j, r in enumerate(replicas.get(kid, ()), 1)]
    lo, hi = window
    counters = {}
    for link, samples in trace.counters.items():
        out = [(c, v) for c, v in samples if c <= hi]
        window_samples = [(c, v) for c, v in samples if lo < c <= hi]
        out += [(c + j * delta, v) for j in range(1, n + 1) for c, v in window_samples]
        out += [(c + n * delta, v) for c, v in samples if c > hi]
        counters[link] = tuple(sorted(out, key=lambda s: s[0]))
    return Trace(trace.level, tuple(intervals), tuple(block_spans), tuple(spans), counters)

