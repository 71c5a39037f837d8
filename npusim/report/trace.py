"""Chrome Trace Event JSON (opens in Perfetto and chrome://tracing).

Processes: one per core (threads = pipes), one for the host, one per stream, one
for kernel spans; `C` counter tracks for the bandwidth in use on each link.
Times are µs.
"""

from __future__ import annotations

import json
from pathlib import Path

from npusim.engine import RunResult

_PIPES = ("MTE2", "MTE1", "M", "FIX", "MTE3", "V", "S")


def chrome_trace(result: RunResult) -> dict:
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
    host = pid("host")
    for track, name, start, end in result.trace.host_spans:
        p = host if track == "host" else pid(track)
        events.append({"name": name, "cat": "host" if p == host else "stream", "ph": "X", "ts": us(start),
                       "dur": us(end - start), "pid": p, "tid": 0, "args": {}})
    kp = pid("kernels")
    for k in result.kernels:
        events.append({"name": k.name, "cat": "kernel", "ph": "X", "ts": us(k.start), "dur": us(k.cycles),
                       "pid": kp, "tid": k.stream, "args": {"type": k.op_type, "block_dim": k.block_dim,
                                                            "core_type": k.core_type}})
    for core, kernel, block, start, end, kid in result.trace.block_spans:
        events.append({"name": f"{kernel} block {block}", "cat": "block", "ph": "X", "ts": us(start),
                       "dur": us(end - start), "pid": pid(core), "tid": 0, "args": {}})
    for core, pipe, name, start, end, kid in result.trace.intervals:
        events.append({"name": name, "cat": pipe, "ph": "X", "ts": us(start), "dur": us(end - start),
                       "pid": pid(core), "tid": _PIPES.index(pipe) + 1, "args": {"kernel": names.get(kid, kid)}})
    for core, p in pids.items():
        if core.startswith(("AIC", "AIV")):
            for i, pipe in enumerate(_PIPES):
                events.append({"name": "thread_name", "ph": "M", "pid": p, "tid": i + 1, "args": {"name": pipe}})
    cp = pid("bandwidth")
    for link, samples in result.trace.counters.items():
        for cycle, rate in samples:
            events.append({"name": f"{link} GB/s", "ph": "C", "ts": us(cycle), "pid": cp, "tid": 0,
                           "args": {"GB/s": rate * hw.chip.freq_hz / 1e9}})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_chrome_trace(result: RunResult, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(result)))
    return path
