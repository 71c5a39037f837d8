"""Shared check of a Chrome trace: the Trace Event format and nesting on every track."""

from __future__ import annotations

import json
from collections import defaultdict


def check_trace(trace: dict) -> None:
    """The trace-event format: required fields, µs numbers, X events on one track
    nest (each is disjoint from or inside the one before it), and every flow arrow
    has one start and one end."""
    json.dumps(trace, allow_nan=False)
    tracks = defaultdict(list)
    flows = defaultdict(list)
    for e in trace["traceEvents"]:
        assert {"name", "ph", "pid"} <= set(e), e
        if e["ph"] == "X":
            assert {"cat", "ts", "dur", "tid", "args"} <= set(e), e
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index") and "args" in e
        elif e["ph"] == "C":
            assert "ts" in e and all(isinstance(v, (int, float)) for v in e["args"].values())
        elif e["ph"] in ("s", "f"):
            assert {"id", "ts", "tid"} <= set(e)
            flows[(e["cat"], e["id"])].append(e["ph"])
        else:
            raise AssertionError(f"unexpected phase {e['ph']}")
    eps = 1e-6
    for spans in tracks.values():
        open_ends: list[float] = []
        for start, end in sorted(spans, key=lambda x: (x[0], -x[1])):
            while open_ends and open_ends[-1] <= start + eps:
                open_ends.pop()
            if open_ends:
                assert end <= open_ends[-1] + eps, "events on one track must nest"
            open_ends.append(end)
    for key, phases in flows.items():
        assert sorted(phases) == ["f", "s"], f"flow {key}: {phases}"
