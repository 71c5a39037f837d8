"""Which activations are alive when: the analysis the memory plan (passes.memplan)
and the runtime's eager allocator (runtime.memory) both need.

A pooled tensor (an activation, host input or output) lives from the node that
first writes it (a host input: from the start) to the last node that reads it (a
graph output: to the end); nodes of a side stream run beside the main stream
from the node before them (the fork) to the node after them (the join), so what
any node of that window touches lives over the whole window.
"""

from __future__ import annotations

from npusim.graph.ir import Graph

PLANNED_KINDS = ("activation", "input", "output")


def align(n: int, to: int) -> int:
    """n rounded up to a multiple of `to`."""
    return -(-n // to) * to


def lifetimes(graph: Graph) -> dict[str, tuple[int, int]]:
    """Pooled tensor -> (first node index alive, last node index alive), inclusive."""
    end = len(graph.nodes)
    life: dict[str, list[int]] = {t: [0, 0] for t in graph.inputs}
    for i, n in enumerate(graph.nodes):
        for t in n.outputs.values():
            if graph.tensors[t].kind in PLANNED_KINDS:
                life.setdefault(t, [i, i])
        for t in n.inputs.values():
            if t in life:
                life[t][1] = i
    for t in graph.outputs:
        if t in life:
            life[t][1] = end
    for lo, hi in _concurrent_windows(graph):
        for n in graph.nodes[lo:hi + 1]:
            for t in (*n.inputs.values(), *n.outputs.values()):
                if t in life:
                    life[t] = [min(life[t][0], lo), max(life[t][1], hi)]
    return {t: (a, b) for t, (a, b) in life.items()}


def _concurrent_windows(graph: Graph) -> list[tuple[int, int]]:
    """(fork, join) node indices around each run of side-stream nodes."""
    streams = graph.schedule.streams if graph.schedule is not None else {}
    windows, start = [], None
    for i, n in enumerate(graph.nodes):
        side = streams.get(n.name, 0) != 0
        if side and start is None:
            start = i
        elif not side and start is not None:
            windows.append((max(start - 1, 0), i))
            start = None
    if start is not None:
        windows.append((max(start - 1, 0), len(graph.nodes)))
    return windows


__all__ = ["PLANNED_KINDS", "align", "lifetimes"]
