"""Shape buckets for dynamic lengths: pad each step to one of a few lengths.

A serving runtime sees a new context (or prompt) length at almost every step.
Compiled for its exact length, every new length is a new shape and its first run
compiles each distinct kernel again (runtime.kernel_compile_us on the host);
padded to a bucket (512, 1024, 2048, 4096, ... by default), only a few shapes
ever exist, at the cost of computing on and reading the padding (masked). The
pass rebuilds the graph at the bucket's length; `margin` tokens of headroom
(a sequence must fit with `margin` more tokens) keep a decode from changing
bucket at every step near a boundary.

`first_run_compile_us` and `padding` say what each side of the trade costs.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from npusim.errors import ConfigError
from npusim.graph.build import build_decoder
from npusim.graph.ir import Graph

DEFAULT_BUCKETS = (512, 1024, 2048, 4096)


def bucket_of(length: int, buckets: Sequence[int] = DEFAULT_BUCKETS, margin: int = 0) -> int:
    """The smallest bucket holding length + margin; past the largest, the next multiple of it."""
    need = length + margin
    for b in sorted(buckets):
        if need <= b:
            return b
    top = max(buckets)
    return -(-need // top) * top


def out_of_order(buckets: Sequence[int]) -> tuple[int, int] | None:
    """The first (length, the one after it) of `buckets` that does not strictly increase;
    None if they all do. Bucket lists given out of order or with a repeat are refused
    where they are read (--buckets, a service's buckets): the pass would sort them and
    keep the repeat, so such a list is a typo, not a choice."""
    return next(((a, b) for a, b in zip(buckets, buckets[1:]) if b <= a), None)


def pad_to_bucket(graph: Graph, buckets: Sequence[int] = DEFAULT_BUCKETS, margin: int = 0) -> Graph:
    """The graph rebuilt with its shapes at the bucket of its longest sequence (at
    most the workload's max context). It must be the first pass: it rebuilds."""
    if graph.applied:
        raise ConfigError(f"buckets: must be the first pass (the graph already had {', '.join(graph.applied)})")
    if not buckets or any(int(b) < 1 for b in buckets) or margin < 0:
        raise ConfigError(f"buckets: expected positive bucket lengths and margin >= 0, got {tuple(buckets)}, {margin}")
    w = graph.workload
    capacity = min(bucket_of(max(graph.lengths), buckets, margin), w.max_context_tokens)
    g = build_decoder(w, graph.phase, graph.batch, graph.lengths, capacity=max(capacity, max(graph.lengths)),
                      new_tokens=graph.new_tokens or None, tp=graph.tp, sp=graph.sp, ep=graph.ep)
    return attrs.evolve(g, applied=("buckets",))


def padding(graph: Graph) -> float:
    """Fraction of the token positions the shapes hold that are padding."""
    return 1.0 - sum(graph.lengths) / (graph.batch * graph.context)


def distinct_kernels(graph: Graph) -> int:
    """Distinct (op type, parameters) among the nodes: what a new shape compiles."""
    return len({n.op_key() for n in graph.nodes})


def first_run_compile_us(graph: Graph, hw) -> float:
    """Host time the first run of this shape spends compiling its kernels."""
    return distinct_kernels(graph) * hw.runtime.kernel_compile_us


def compiles_over(lengths: Sequence[int], buckets: Sequence[int] | None = DEFAULT_BUCKETS, margin: int = 0) -> int:
    """How many shapes a run over these successive lengths compiles: one per distinct
    length without buckets (None), one per distinct bucket with them."""
    if buckets is None:
        return len(set(lengths))
    return len({bucket_of(n, buckets, margin) for n in lengths})


__all__ = ["DEFAULT_BUCKETS", "bucket_of", "compiles_over", "distinct_kernels", "first_run_compile_us", "out_of_order",
           "pad_to_bucket", "padding"]
