"""Memory planning: one static pool for the step's activations, offsets reused
by tensors whose lifetimes do not overlap.

Without a plan the runtime allocates as an eager framework does: each tensor its
own allocation when its producer runs, freed after its last reader, first fit
(npusim.runtime.memory.eager_allocation) - holes and rounding included. With
a plan, offline:
- a tensor lives from the node that first writes it (a host input: from the
  start) to the last node that reads it (a graph output: to the end); nodes of
  a side stream run beside the main stream from the node before them (the fork)
  to the node after them (the join), so what any node of that window touches
  lives over the whole window;
- an elementwise op may write its output over an input that dies at that node
  and has the same size (in place), so the two share one buffer;
- buffers are placed greedily, largest first, at the lowest offset where they
  overlap no placed buffer that is alive at the same time; offsets are aligned
  to the DMA burst (hw.dma.burst_bytes: a buffer starts on a burst, the seed
  articles' rule for GM addresses and the issue's "64 B aligned offsets").
Weights and KV caches are not in the pool: they persist across steps.
"""

from __future__ import annotations

import attrs
from attrs import frozen

from npusim.graph.ir import Graph
from npusim.graph.lifetimes import align, lifetimes
from npusim.hw import HwConfig
from npusim.ops import IN_PLACE_OPS  # ops whose descriptor says their output may take an input's buffer
from npusim.ops.registry import default_hw


@frozen
class MemoryPlan:
    """Where each pooled tensor lives (byte offset in the pool) and what it saved."""

    offsets: dict[str, int]
    pool_bytes: int  # the pool's size: the peak of the planned tensors
    separate_bytes: int  # what the same tensors take as separate allocations held all step (no reuse at all)
    in_place: tuple[tuple[str, str], ...]  # (output, input whose buffer it takes)


def _in_place_pairs(graph: Graph, life: dict[str, tuple[int, int]]) -> dict[str, str]:
    """output -> the input whose buffer it takes."""
    pairs: dict[str, str] = {}
    taken: set[str] = set()
    for i, n in enumerate(graph.nodes):
        if n.op_type not in IN_PLACE_OPS:
            continue
        (out,) = n.outputs.values()
        for t in n.inputs.values():
            spec = graph.tensors[t]
            if (t in life and life[t][1] == i and t not in taken and t not in graph.inputs
                    and spec.nbytes == graph.tensors[out].nbytes and spec.kind == "activation"):
                pairs[out] = t
                taken.add(t)
                break
    return pairs


def plan_memory(graph: Graph, hw: HwConfig | None = None) -> Graph:
    """The graph with a MemoryPlan for its activations, inputs and outputs, offsets
    aligned to the DMA burst of `hw` (the default config's without one)."""
    to = (hw or default_hw()).dma.burst_bytes
    life = lifetimes(graph)
    pairs = _in_place_pairs(graph, life)

    def root(t: str) -> str:
        while t in pairs:
            t = pairs[t]
        return t

    buffers: dict[str, list] = {}  # root tensor -> [size, first, last, members]
    for t, (a, b) in life.items():
        r = root(t)
        size = align(graph.tensors[t].nbytes, to)
        buf = buffers.setdefault(r, [size, a, b, []])
        buf[0], buf[1], buf[2] = max(buf[0], size), min(buf[1], a), max(buf[2], b)
        buf[3].append(t)
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets: dict[str, int] = {}
    order = sorted(buffers.items(), key=lambda kv: (-kv[1][0], kv[1][1], kv[0]))
    for r, (size, a, b, members) in order:
        busy = sorted((o, o + s) for o, s, pa, pb in placed if pa <= b and a <= pb)
        at = 0
        for lo, hi in busy:
            if at + size <= lo:
                break
            at = max(at, align(hi, to))
        placed.append((at, size, a, b))
        for t in members:
            offsets[t] = at
    pool = max((o + s for o, s, _, _ in placed), default=0)
    separate = sum(align(graph.tensors[t].nbytes, to) for t in life)
    plan = MemoryPlan(dict(sorted(offsets.items())), pool, separate, tuple(sorted(pairs.items())))
    return attrs.evolve(graph, memory_plan=plan, applied=(*graph.applied, "memplan"))


__all__ = ["IN_PLACE_OPS", "MemoryPlan", "align", "lifetimes", "plan_memory"]
