"""Device memory of a step: where every graph tensor lives, what it adds up to,
and the check that it fits.

GM is laid out as  weights | KV caches | activations | kernel workspace, each
region starting on an L2 line. Weights and KV caches are static. Activations
(with host inputs and outputs) are one pool at the memory plan's offsets, or,
without a plan, one allocation per tensor. The workspace region holds what the
kernels ask for beyond their operands (FlashAttention's partial results, split
softmax statistics, ...), one region per stream, reused from kernel to kernel.
"""

from __future__ import annotations

from attrs import frozen

from npusim.errors import NpusimError
from npusim.graph.ir import Graph
from npusim.ops.registry import GM_ALIGN_BYTES, GM_BASE
from npusim.passes.memplan import PLANNED_KINDS, align

GIB = 1 << 30


def size(n: float) -> str:
    """Bytes in the binary unit that keeps 1-4 digits before the point."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


class OutOfMemoryError(NpusimError):
    """Weights + KV cache + activations + workspace exceed the device memory."""


@frozen
class MemoryBreakdown:
    weights_bytes: int
    kv_bytes: int
    activation_bytes: int  # the pool (planned) or the sum of separate allocations
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
            at += align(spec.nbytes, GM_ALIGN_BYTES)
    return out, at


@frozen
class Placement:
    """GM address of every graph tensor, and where the workspace region starts."""

    addresses: dict[str, int]
    workspace_base: int
    breakdown: MemoryBreakdown  # workspace_bytes still 0: known once the kernels are lowered


def place(graph: Graph, capacity_bytes: int) -> Placement:
    weights, at = _region(graph, ("weight",), GM_BASE)
    kv, at2 = _region(graph, ("kv",), at)
    plan = graph.memory_plan
    if plan is None:
        acts, end = _region(graph, PLANNED_KINDS, at2)
        act_bytes = end - at2
    else:
        acts = {t: at2 + off for t, off in plan.offsets.items()}
        act_bytes = align(plan.pool_bytes, GM_ALIGN_BYTES)
    breakdown = MemoryBreakdown(at - GM_BASE, at2 - at, act_bytes, 0, capacity_bytes)
    return Placement(weights | kv | acts, at2 + act_bytes, breakdown)


__all__ = ["MemoryBreakdown", "OutOfMemoryError", "Placement", "place", "size"]
