"""Device memory of a step: where every graph tensor lives, what it adds up to,
and the check that it fits.

GM is laid out as  weights | KV caches | activations | kernel workspace, each
region starting on an L2 line. Weights and KV caches are static. Activations
(with host inputs and outputs) are one pool at the memory plan's offsets, or,
without a plan, what an eager framework's allocator does: each tensor its own
allocation (rounded to gm_align_bytes: the L2 line) made when its producer runs and freed
after its last reader, first fit in address order; the region is the
allocator's high-water mark, holes and all. The workspace region holds what the
kernels ask for beyond their operands (FlashAttention's partial results, split
softmax statistics, ...), one region per stream, reused from kernel to kernel.
"""

from __future__ import annotations

from attrs import frozen

from npusim.errors import NpusimError
from npusim.graph.ir import Graph
from npusim.graph.lifetimes import align, lifetimes
from npusim.ops.registry import GM_BASE, gm_align_bytes

def size(n: float) -> str:
    """Bytes in the binary unit that keeps 1-4 digits before the point."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


class OutOfMemoryError(NpusimError):
    """Weights + KV cache + activations + workspace exceed the device memory."""

    def __init__(self, message: str, breakdown: MemoryBreakdown | None = None):
        super().__init__(message)
        self.breakdown = breakdown


@frozen
class MemoryBreakdown:
    weights_bytes: int
    kv_bytes: int
    activation_bytes: int  # the memory plan's pool, or the eager allocator's high-water mark
    workspace_bytes: int
    capacity_bytes: int  # the device's HBM

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.activation_bytes + self.workspace_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def line(self) -> str:
        return (f"weights {size(self.weights_bytes)} + KV cache {size(self.kv_bytes)} + activations "
                f"{size(self.activation_bytes)} + workspace {size(self.workspace_bytes)} = "
                f"{size(self.total_bytes)} of {size(self.capacity_bytes)}")


def _region(graph: Graph, kinds: tuple[str, ...], start: int) -> tuple[dict[str, int], int]:
    """Tensors of `kinds`, each its own line-aligned allocation from `start`, in graph order."""
    at, out = start, {}
    for name, spec in graph.tensors.items():
        if spec.kind in kinds:
            out[name] = at
            at += align(spec.nbytes, gm_align_bytes())
    return out, at


@frozen
class Placement:
    """GM address of every graph tensor, and where the workspace region starts."""

    addresses: dict[str, int]
    workspace_base: int
    breakdown: MemoryBreakdown  # workspace_bytes still 0: known once the kernels are lowered


def eager_allocation(graph: Graph) -> tuple[dict[str, int], int]:
    """(offset of each activation, high-water mark) of allocate-when-produced,
    free-after-last-use, first fit: the baseline without a memory plan."""
    life = lifetimes(graph)
    by_start: dict[int, list[str]] = {}
    by_end: dict[int, list[str]] = {}
    for t, (a, b) in life.items():
        by_start.setdefault(a, []).append(t)
        by_end.setdefault(b, []).append(t)
    holes: list[list[int]] = []  # [offset, size], sorted by offset
    offsets, top = {}, 0
    for i in range(len(graph.nodes) + 1):
        for t in by_start.get(i, ()):
            nbytes = align(graph.tensors[t].nbytes, gm_align_bytes())
            hole = next((h for h in holes if h[1] >= nbytes), None)
            if hole is None:
                offsets[t], top = top, top + nbytes
            else:
                offsets[t] = hole[0]
                hole[0] += nbytes
                hole[1] -= nbytes
        freed = [[offsets[t], align(graph.tensors[t].nbytes, gm_align_bytes())] for t in by_end.get(i, ())]
        if freed:
            holes = _merged(h for h in holes + freed if h[1] > 0)
    return offsets, top


def _merged(holes) -> list[list[int]]:
    out: list[list[int]] = []
    for off, size in sorted(holes):
        if out and out[-1][0] + out[-1][1] == off:
            out[-1][1] += size
        else:
            out.append([off, size])
    return out


def place(graph: Graph, capacity_bytes: int) -> Placement:
    weights, at = _region(graph, ("weight",), GM_BASE)
    kv, at2 = _region(graph, ("kv",), at)
    plan = graph.memory_plan
    offsets, pool = eager_allocation(graph) if plan is None else (plan.offsets, plan.pool_bytes)
    acts = {t: at2 + off for t, off in offsets.items()}
    act_bytes = align(pool, gm_align_bytes())
    breakdown = MemoryBreakdown(at - GM_BASE, at2 - at, act_bytes, 0, capacity_bytes)
    return Placement(weights | kv | acts, at2 + act_bytes, breakdown)


__all__ = ["MemoryBreakdown", "OutOfMemoryError", "Placement", "eager_allocation", "place", "size"]
