"""Chrome Trace Event JSON (opens in Perfetto and chrome://tracing).

Processes: one per core (threads = pipes), one for the host, one per stream, one
for kernel spans (a thread per stream); `C` counter tracks for the bandwidth in
use on each link (at kernel level averaged over KERNEL_LEVEL_COUNTER_US windows;
device memory in use, for a decoder step); flow arrows
from each host launch to its kernel's start and, at instruction level, from the
pipe that set a flag to the WaitFlag it released. Times are µs.

At instruction level a kernel the layer memo did not simulate (a replicated layer's,
a replayed one: RunResult.trace.copies) has its kernel and block spans but not its
instructions again: they are its source's moved in time, and its spans' args say
which kernel's to read (`instructions`); --no-memo simulates and traces every kernel.
"""

from __future__ import annotations

import json
from pathlib import Path

from npusim.engine import RunResult
from npusim.outputs import write_text

_PIPES = ("MTE2", "MTE1", "M", "FIX", "MTE3", "V", "S")
# A kernel-level trace shows each link's bandwidth averaged over windows of this
# many µs (a K3 decode step changes its flows ~700,000 times: every sample would
# make a trace of ~75 MB); block and instruction levels keep every change.
KERNEL_LEVEL_COUNTER_US = 1.0


def chrome_trace(result: RunResult, memory: list[tuple[float, float]] | None = None) -> dict:
    """The trace of a run; `memory`: (cycle, bytes in use) steps for a memory counter."""
    hw = result.hw
    us = hw.us
    events: list[dict] = []
    pids: dict[str, int] = {}

    def pid(name: str) -> int:
        if name not in pids:
            pids[name] = len(pids) + 1
            events.append({"name": "process_name", "ph": "M", "pid": pids[name], "tid": 0, "args": {"name": name}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pids[name], "tid": 0,
                           "args": {"sort_index": pids[name]}})
        return pids[name]

    names = {k.id: k.name for k in result.kernels}
    copied = {kid: {"instructions": f"as {names.get(source, source)}, {us(shift):.3f} us later (memoised)"}
              for kid, (source, shift) in result.trace.copies.items()}
    host = pid("host")
    for track, name, start, end in result.trace.host_spans:
        p = host if track == "host" else pid(track)
        events.append({"name": name, "cat": "host" if p == host else "stream", "ph": "X", "ts": us(start),
                       "dur": us(end - start), "pid": p, "tid": 0, "args": {}})
    kp = pid("kernels")
    for k in result.kernels:
        owner = {} if k.owner is None else {"node": k.owner.node, "layer": k.owner.layer}
        events.append({"name": k.name, "cat": "kernel", "ph": "X", "ts": us(k.start), "dur": us(k.cycles),
                       "pid": kp, "tid": k.stream, "args": {"type": k.op_type, "block_dim": k.block_dim,
                                                            "core_type": k.core_type, **owner,
                                                            **copied.get(k.id, {})}})
    for core, kernel, block, start, end, kid in result.trace.block_spans:
        events.append({"name": f"{kernel} block {block}", "cat": "block", "ph": "X", "ts": us(start),
                       "dur": us(end - start), "pid": pid(core), "tid": 0, "args": copied.get(kid, {})})
    for core, pipe, name, start, end, kid in result.trace.intervals:
        events.append({"name": name, "cat": pipe, "ph": "X", "ts": us(start), "dur": us(end - start),
                       "pid": pid(core), "tid": _PIPES.index(pipe) + 1, "args": {"kernel": names.get(kid, kid)}})
    for core, p in pids.items():
        if core.startswith(("AIC", "AIV")):
            for i, pipe in enumerate(_PIPES):
                events.append({"name": "thread_name", "ph": "M", "pid": p, "tid": i + 1, "args": {"name": pipe}})
    cp = pid("bandwidth")
    width = hw.cycles(KERNEL_LEVEL_COUNTER_US * 1e-6) if result.trace.level == "kernel" else 0.0
    for link, samples in result.trace.counters.items():
        for cycle, rate in (_averaged(samples, width) if width else samples):
            events.append({"name": f"{link} GB/s", "ph": "C", "ts": us(cycle), "pid": cp, "tid": 0,
                           "args": {"GB/s": rate * hw.chip.freq_hz / 1e9}})
    if memory:
        mp = pid("device memory")
        events += [{"name": "memory in use GiB", "ph": "C", "ts": us(c), "pid": mp, "tid": 0,
                    "args": {"GiB": b / 2**30}} for c, b in memory]
    events += _launch_flows(result, host, kp)
    events += _flag_flows(result, pids)
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def _averaged(samples, width: float) -> list[tuple[float, float]]:
    """Step samples (cycle, rate from then on) as the mean rate over each window of
    `width` cycles (bytes moved in the window / width; the last window ends at the
    last sample), a sample where it changes."""
    out: list[tuple[float, float]] = []
    window, moved = None, 0.0

    def close(w: float, amount: float, span: float = width) -> None:
        rate = amount / span if span > 0 else 0.0
        if not out or out[-1][1] != rate:
            out.append((w * width, rate))

    for (c, r), (nxt, _) in zip(samples, samples[1:]):
        while c < nxt:
            w = c // width
            if window is not None and w != window:
                close(window, moved)
                if w > window + 1:  # windows in between moved nothing
                    close(window + 1, 0.0)
                moved = 0.0
            window = w
            upto = min(nxt, (w + 1) * width)
            moved += r * (upto - c)
            c = upto
    if window is not None:  # the last window ends with the samples
        close(window, moved, samples[-1][0] - window * width)
    if samples:
        out.append((samples[-1][0], samples[-1][1]))
    return out


def _flow(fid: int, cat: str, src: tuple, dst: tuple) -> list[dict]:
    """A flow arrow from (ts, pid, tid) to (ts, pid, tid); binds to the enclosing slices."""
    return [{"name": cat, "cat": cat, "ph": "s", "id": fid, "ts": src[0], "pid": src[1], "tid": src[2]},
            {"name": cat, "cat": cat, "ph": "f", "bp": "e", "id": fid, "ts": dst[0], "pid": dst[1], "tid": dst[2]}]


def _launch_flows(result: RunResult, host: int, kp: int) -> list[dict]:
    us = result.hw.us
    launched = {name[len("launch "):]: end for track, name, start, end in result.trace.host_spans
                if track == "host" and name.startswith("launch ")}
    out = []
    for k in result.kernels:
        if k.name in launched:  # the arrow leaves the launch span just before it ends
            end = launched[k.name]
            out += _flow(len(out) // 2 + 1, "launch", (us(end) - 1e-3, host, 0), (us(k.start), kp, k.stream))
    return out


def _flag_flows(result: RunResult, pids: dict[str, int]) -> list[dict]:
    """WaitFlag stalls (instruction level) back to the pipe whose SetFlag ended them."""
    us, latency = result.hw.us, result.hw.sync.flag_latency_cycles
    out, base = [], 1 << 20  # flow ids apart from the launch arrows'
    for core, pipe, name, start, end, kid in result.trace.intervals:
        if not name.startswith("WaitFlag "):
            continue
        src = name.split()[1].split("->")[0]
        if src in _PIPES:
            set_at = us(end - latency)
            out += _flow(base + len(out) // 2, "flag", (set_at, pids[core], _PIPES.index(src) + 1),
                         (us(end), pids[core], _PIPES.index(pipe) + 1))
    return out


def write_chrome_trace(result: RunResult, path: str | Path, memory: list[tuple[float, float]] | None = None,
                       metadata: dict | None = None) -> Path:
    """The trace into `path` (atomically); `metadata` (provenance) goes into the
    trace's `otherData`, which Perfetto and chrome://tracing show as metadata."""
    return write_trace(chrome_trace(result, memory), path, metadata)


def write_trace(trace: dict, path: str | Path, metadata: dict | None = None) -> Path:
    """A built trace into `path` (atomically), `metadata` merged into its `otherData`."""
    if metadata:
        trace = trace | {"otherData": trace.get("otherData", {}) | metadata}
    return write_text(path, json.dumps(trace))
