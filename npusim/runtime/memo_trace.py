"""The trace of a memoised run as a whole timeline (see run.py for the memo).

The engine records spans only for what it simulated: a replayed kernel (one whose
lone twin already ran, engine.device.Reuse) has no block spans or instructions,
and the layers the memo replicates have no host, stream or core spans at all.
These functions fill them in from what was simulated, by identity - a span's
kernel id, or its host call's position in the host program - never by name:
- a replayed kernel gets its twin's block spans, moved to its start;
- each replicated layer gets the pattern layer's spans, moved by whole layers: the
  device tracks (streams, cores, links) by the device time a layer adds, the host
  track by the host time a layer adds; everything after the replicated block moves
  by the same amounts times the number of copies. A span a copy adds on a stream
  starts no earlier than the span before it on that stream ends (a stream runs one
  item at a time: a wait begins when the stream reaches it), and a copy's events
  carry the names of its own layer's nodes.
Instructions are not copied: a replayed or replicated kernel's are its source's
moved in time, so the trace keeps them once and records the source and the shift
(Trace.copies, Trace.intervals_of); a K3 step's instruction trace would otherwise
hold 29 more copies of a layer (batch 8 at 4096 tokens: a Chrome trace of 1.47 GB
instead of 0.20).
# assumption: a host call after the replicated layers starts later by the host time
# of the copies; a Synchronize among them ends when the device does, which moved by
# the device time of the copies (the larger of the two).
"""

from __future__ import annotations

import math
from collections import defaultdict

import attrs

from npusim.engine import KernelRecord, RunResult
from npusim.engine.host import Launch, RecordEvent, Synchronize, WaitEvent
from npusim.engine.run import Trace
from npusim.runtime.compile import HostProgram


def fill_replays(result: RunResult, program: HostProgram) -> RunResult:
    """Give each replayed kernel its twin's block spans, moved to the replay's start,
    and at instruction level its twin's instructions (as a copy, Trace.copies): the
    twin ran alone on an idle device, as the replay does."""
    trace = result.trace
    if trace.level == "kernel":
        return result
    reuse = {(c.owner.node, c.owner.index): c.reuse.key for c in program.calls
             if isinstance(c, Launch) and c.reuse is not None and c.owner is not None}
    spans = defaultdict(list)
    for s in trace.block_spans:
        spans[s[5]].append(s)
    twins: dict[tuple, KernelRecord] = {}
    new_spans, copies = list(trace.block_spans), dict(trace.copies)
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
            if trace.level == "instr":
                copies[r.id] = (twin.id, d)
    return attrs.evolve(result, trace=attrs.evolve(trace, block_spans=tuple(new_spans), copies=copies))


def replicate_trace(part: RunResult, program: HostProgram, pattern: set[str],
                    replicas: dict[int, list[KernelRecord]], after: set[int], delta: float,
                    window: tuple[float, float], renames: list[dict[str, str]]) -> Trace:
    """`part`'s trace with the pattern layer's spans repeated once per copy and what
    follows them moved. `pattern`: the nodes of the pattern layer; `replicas`: pattern
    kernel id -> its copies' records, in copy order; `after`: ids of the simulated
    kernels launched after the pattern layer; `delta`: the device time one layer adds;
    `window`: the device interval (start, end] whose link samples one layer repeats;
    `renames`: per copy, in copy order, node name -> the node at its place in that
    copy (the events a copy records and waits for are named after them)."""
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
        """The names of a launch's (a kernel's or a transfer step's) copies, in copy order."""
        c = calls[i]
        owner = getattr(c, "owner", None)
        if owner is not None and (owner.node, owner.index) in by_place:
            return [r.name for r in replicas[by_place[(owner.node, owner.index)]]]
        return None

    def stream_name(i: int, name: str, j: int) -> str:
        """The name of call i's stream span in copy j (1..n)."""
        names, c = launch_names(i), calls[i]
        if names:
            return names[j - 1]
        if isinstance(c, (RecordEvent, WaitEvent)) and name.endswith(c.name):  # "record X", "wait X"
            return name[:len(name) - len(c.name)] + renames[j - 1].get(c.name, c.name)
        return name

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
        own = list(zip(idx, on_stream.get(f"stream {stream}", ())))
        # the stream's order: what it ran up to the pattern layer's end, the copies, then the rest moved
        order = [span for i, span in own if place_of(i) != "after"]
        order += [(track, stream_name(i, name, j), start + j * delta, end + j * delta)
                  for j in range(1, n + 1) for i, (track, name, start, end) in own if place_of(i) == "layer"]
        order += [(track, name, start + n * delta, end + n * delta)
                  for i, (track, name, start, end) in own if place_of(i) == "after"]
        spans += _one_at_a_time(order)
    block_spans = []
    for core, kname, b, start, end, kid in trace.block_spans:
        if kid in after:
            block_spans.append((core, kname, b, start + n * delta, end + n * delta, kid))
            continue
        block_spans.append((core, kname, b, start, end, kid))
        block_spans += [(core, r.name, b, start + j * delta, end + j * delta, r.id)
                        for j, r in enumerate(replicas.get(kid, ()), 1)]
    intervals = tuple(iv if iv[5] not in after else (*iv[:3], iv[3] + n * delta, iv[4] + n * delta, iv[5])
                      for iv in trace.intervals)

    def moved(kid: int) -> float:
        return n * delta if kid in after else 0.0

    # instructions: a copy names its source (never another copy) and the shift
    copies = {kid: (source, d + moved(kid) - moved(source)) for kid, (source, d) in trace.copies.items()}
    if trace.level == "instr":
        for kid, reps in replicas.items():
            source, d = copies.get(kid, (kid, 0.0))
            copies.update((r.id, (source, d + j * delta)) for j, r in enumerate(reps, 1))
    lo, hi = window
    counters = {}
    for link, samples in trace.counters.items():
        out = [(c, v) for c, v in samples if c <= hi]
        window_samples = [(c, v) for c, v in samples if lo < c <= hi]
        out += [(c + j * delta, v) for j in range(1, n + 1) for c, v in window_samples]
        out += [(c + n * delta, v) for c, v in samples if c > hi]
        counters[link] = tuple(sorted(out, key=lambda s: s[0]))
    return Trace(trace.level, intervals, tuple(block_spans), tuple(spans), counters, copies)


def _one_at_a_time(spans: list[tuple]) -> list[tuple]:
    """A stream's spans (track, name, start, end) in its order, each starting no earlier
    than the one before it ends: a copied layer's first wait began, in the pattern, when
    the layer before it (which ran differently) ended, not when the copy before it did."""
    out, free = [], -math.inf
    for track, name, start, end in spans:
        start = max(start, free)
        free = max(end, start)
        out.append((track, name, start, free))
    return out
