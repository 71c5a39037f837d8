"""Run a graph with numpy on small shapes: the functional check of a pass.

Two modes, from the same starting values (weights, host inputs and KV cache as
the device stores them, i.e. rounded to their dtype):

- "device": every tensor an op writes is stored in its dtype (fp16 / bf16),
  while the op itself computes in fp32 - matmuls accumulate in fp32 (the cube's
  L0C), norms and softmax work in fp32 (as the vector kernels do).
  # assumption: an elementwise fp16 op rounds once, at its output; the vector
  # unit's per-instruction fp16 rounding inside silu / rope is not modelled.
- "reference": nothing is rounded after the start: all intermediates stay fp32.

Either way every float result is checked against the fp16 range before it is
stored: a tensor where |x| > 65504 (or inf / nan) anywhere is listed in
`Execution.overflow` - an fp16 device would have saturated there (QK^T scores
are the classic case). A passes' check compares device and reference outputs
with `cosine`.

Weights are random but deterministic: each from its own generator seeded by
(seed, CRC32 of its name), scaled by the role its first consumer gives it (a
norm's gamma near 1, a Linear weight N(0, 1/fan_in), ...), so a graph's values do
not depend on node order. A workload with outlier channels (Workload.outlier_channels)
gets them planted in its decoder layers' norm gains. Quantised weights (int8, scales,
SmoothQuant factors) are made from those FP values by npusim.graph.quant_values.
A weight a pass derived (`Graph.derived`: a fused QKV weight) is the concatenation
of its originals' values, each generated from its own name as in the graph before
the pass, so fused and unfused graphs compute the same.

Op semantics are each op's numpy reference (OpSpec.reference, beside its lowering
in npusim.ops; npusim.ops.reference says what one sees): each op reads its inputs as the contiguous
buffers of the graph tensors, viewed with the shapes its parameters give, except
that batch matmuls and FlashAttention read (and write) BSND tensors head by head.
A KV cache is state: kv_cache_write updates it in place, writing sequence b's new
tokens so that they end at its own length (graph.lengths) when position is -1,
at `position` otherwise; the caches after the step are returned.

KV layouts (npusim.kvcache.KvLayout): the graph holds the layout's physical
tensors - per_layer a K and a V tensor per layer; contiguous one [batch, layers,
kv_heads, context, row] tensor for all layers (row: K, then V, then zero padding);
paged per-layer K and V pools [blocks, kv_heads, block_tokens, head_dim] and a block
table [batch, blocks per sequence] of physical block ids. kv_cache_write,
decode_attention and flash_attention read and write them through the logical view
[batch, kv_heads, context, head_dim] of one layer's K and V (the paged view follows
the block table's values). `random_kv` fills every layout with the same logical
values (those of the per-layer graph's "L{layer}.k_cache" / "L{layer}.v_cache"), so
a graph whose layout a pass changed computes what the per-layer graph computes;
`logical_kv` unpacks a layout's tensors back to those per-layer arrays.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
from attrs import frozen

from npusim.graph.build import host_inputs
from npusim.graph.ir import Graph, GraphError, Node, TensorSpec
from npusim.graph.quant_values import CALIBRATION_SEED_OFFSET, is_quantized, quantized_weights
from npusim.kvcache import CACHE_TENSORS, KvLayout
from npusim.ops import CACHE_OPS
from npusim.ops.reference import RefContext
from npusim.ops.registry import spec as op_spec

MODES = ("device", "reference")
FP16_MAX = 65504.0


@frozen
class Execution:
    """What a numpy run of a graph produced."""

    mode: str
    outputs: dict[str, np.ndarray]  # every graph output
    kv: dict[str, np.ndarray]  # every KV-cache tensor after the step (block tables included); see logical_kv
    overflow: tuple[str, ...]  # tensors with |x| > 65504 (or inf / nan) somewhere, in execution order
    max_abs: dict[str, float]  # largest |x| of every float tensor a node wrote (before storing)
    values: dict[str, np.ndarray]  # every tensor's value (only with keep=True)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays, flattened, in float64 (1.0 for two zero arrays)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    return float(a @ b / (na * nb)) if na and nb else 0.0


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Values as `dtype` stores them, returned as float32 (int32 as int32)."""
    if dtype == "int32":
        return np.asarray(x).astype(np.int32)
    x = np.asarray(x, dtype=np.float32)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":  # round to nearest even on the upper 16 bits
        u = x.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return np.where(np.isnan(x), x, u.view(np.float32))
    if dtype == "int8":
        return np.clip(np.rint(x), -128, 127).astype(np.float32)
    return x


# ================================================================ starting values


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def random_weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """A value for every weight tensor, float32, scaled by its role. A derived weight
    (graph.derived) is its originals' values concatenated along axis 0: each original
    generated from its own name and scaled by the role the derived weight's consumer
    gives it (the role the original had before the pass: a matmul's b, a bias)."""
    out = {}
    for spec in graph.of_kind("weight"):
        role, p = _role(graph, spec.name)
        if spec.name in graph.derived:
            names = graph.derived[spec.name]
            shapes = _original_shapes(graph, spec, names, p)
            out[spec.name] = np.concatenate([_weight(seed, n, s, role, p) for n, s in zip(names, shapes)], axis=0)
        else:
            out[spec.name] = _weight(seed, spec.name, spec.shape, role, p)
        if role == "gamma" and re.fullmatch(r"L\d+\..+", spec.name):  # a layer's norm (the builder's names)
            out[spec.name] = _plant_outliers(graph.workload, out[spec.name])
    return out


def _plant_outliers(w, gamma: np.ndarray) -> np.ndarray:
    """A decoder layer's norm gamma with the workload's outlier channels
    (Workload.outlier_channels) multiplied by outlier_scale, so that the normed
    activations the layer's projections read carry outliers there.
    # assumption: only the layers' norms (attention and FFN); the final norm, which
    # feeds the LM head, keeps its gains (logits that 3 channels dominate would
    # measure those channels, not the model)."""
    channels = list(getattr(w, "outlier_channels", ()))
    if channels and gamma.shape[-1] == w.hidden_size:
        gamma = gamma.copy()
        gamma[..., channels] *= w.outlier_scale
    return gamma


def _weight(seed: int, name: str, shape: tuple[int, ...], role: str, p) -> np.ndarray:
    z = _rng(seed, name).standard_normal(shape).astype(np.float32)
    if role == "gamma":
        return 1.0 + 0.1 * z
    if role in ("beta", "bias", "scale"):
        return 0.1 * z
    if role == "b":  # a matmul's weight: N(0, 1/fan_in) keeps activations near unit size
        return z / np.sqrt(p.k)
    if role != "table":  # embedding rows stay N(0, 1)
        return z / np.sqrt(shape[-1])
    return z


def _original_shapes(graph: Graph, spec: TensorSpec, names: tuple[str, ...], p) -> list[tuple[int, ...]]:
    """Shapes of the weights a derived weight concatenates (they are no longer graph
    tensors): the workload's, else the consumer matmul's n_parts, else equal parts."""
    known = graph.workload.weight_shapes() if hasattr(graph.workload, "weight_shapes") else {}
    rest = tuple(spec.shape[1:])
    if all(n in known for n in names) and sum(known[n][0] for n in names) == spec.shape[0]:
        shapes = [tuple(known[n]) for n in names]  # (a tensor-parallel shard's are not the workload's)
    elif len(getattr(p, "n_parts", ())) == len(names):
        shapes = [(w, *rest) for w in p.n_parts]
    elif spec.shape[0] % len(names) == 0:
        shapes = [(spec.shape[0] // len(names), *rest)] * len(names)
    else:
        shapes = []
    if sum(s[0] for s in shapes) != spec.shape[0] or any(tuple(s[1:]) != rest for s in shapes):
        raise GraphError(f"derived weight '{spec.name}' {spec.shape}: cannot tell the shapes of "
                         f"{', '.join(names)} (they must concatenate to it along axis 0)")
    return shapes


def _role(graph: Graph, tensor: str) -> tuple[str, Any]:
    for n in graph.consumers(tensor):
        for local, t in n.inputs.items():
            if t == tensor:
                return local, n.args
    return "", None


def random_kv(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """The KV caches before the step, in the graph's layout. Logically, per layer, a
    K and a V [batch, kv_heads, context, head_dim]: in decode N(0, 1) at the positions
    before each sequence's new token, zeros after; in prefill zeros. Each layer's K
    and V are generated from the per-layer graph's names "L{layer}.k_cache" /
    "L{layer}.v_cache" (a per_layer cache: from its own tensor names) and packed into
    the layout's tensors: the contiguous tensor's row padding stays 0, the paged pools
    are filled through a block table holding KvLayout's scattered block order (and
    returned too). KV tensors no cache node maps stay zero."""
    out = {spec.name: np.zeros(spec.shape, dtype=np.float32) for spec in graph.of_kind("kv")}
    for c in _caches(graph):
        if c.layout.layout == "paged":
            out[c.tensors["block_table"]] = c.layout.block_table()
        phys = {local: out[t] for local, t in c.tensors.items()}
        k, v = (_start_cache(graph, name, c.layout.shape, seed) for name in c.names())
        out |= {c.tensors[local]: x for local, x in _pack(c.layout, phys, k, v).items()}
    return out


def packed_kv(graph: Graph, logical: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's KV tensors holding `logical` (per-layer caches by the per-layer
    graph's names, as logical_kv gives them, [batch, kv_heads, n, head_dim] with n up
    to the graph's context; zeros after): how a later decode step, built at a longer
    context, starts from the caches an earlier step left."""
    out = {spec.name: np.zeros(spec.shape, dtype=np.float32) for spec in graph.of_kind("kv")}
    for c in _caches(graph):
        if c.layout.layout == "paged":
            out[c.tensors["block_table"]] = c.layout.block_table()
        phys = {local: out[t] for local, t in c.tensors.items()}
        k, v = (np.zeros(c.layout.shape, np.float32) for _ in range(2))
        for dst, name in zip((k, v), c.names()):
            x = np.asarray(logical[name])
            dst[:, :, :x.shape[2]] = x
        out |= {c.tensors[local]: x for local, x in _pack(c.layout, phys, k, v).items()}
    return out


def _start_cache(graph: Graph, name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """One layer's K or V before the step (logical [batch, kv_heads, context, head_dim]).
    Drawn position by position up to the longest sequence only, so a graph whose
    shapes are padded (a shape bucket) starts from the same cache."""
    z = np.zeros(shape, dtype=np.float32)
    if graph.phase != "decode":
        return z
    b, h, _, d = shape
    n = max(graph.lengths)
    z[:, :, :n] = _rng(seed, name).standard_normal((b, h, n, d)).astype(np.float32)
    old = np.arange(shape[2])[None, :] < np.array(graph.lengths)[:, None] - 1  # [batch, context]
    return z * old[:, None, :, None]


def _pack(layout: KvLayout, phys, k, v) -> dict[str, np.ndarray]:
    try:
        return layout.pack(phys, k, v)
    except ValueError as e:
        raise GraphError(str(e)) from None


def logical_kv(graph: Graph, kv: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-layer caches that `kv` (a layout's tensors by graph name, as
    Execution.kv or random_kv give them) holds: "L{layer}.k_cache" / "L{layer}.v_cache"
    -> [batch, kv_heads, longest length, head_dim] (a per_layer cache: its own names;
    positions a shape bucket pads on are left out), so caches of graphs in
    different layouts and shapes compare directly."""
    out = {}
    n = max(graph.lengths)
    for c in _caches(graph):
        phys = {local: np.asarray(kv[t]) for local, t in c.tensors.items()}
        out |= {name: x[:, :, :n] for name, x in zip(c.names(), c.layout.unpack(phys))}
    return out


# ================================================================ KV-cache layouts


@frozen
class _Cache:
    """One layer's KV cache in a graph: its layout (npusim.kvcache.KvLayout) and the
    graph tensors holding it, by the op's GM names (k_cache, v_cache, kv_cache, block_table)."""

    layout: KvLayout
    tensors: dict  # GM name -> graph tensor name

    def names(self) -> tuple[str, str]:
        """Names of the logical K and V: the per-layer graph's."""
        if self.layout.layout == "per_layer":
            return self.tensors["k_cache"], self.tensors["v_cache"]
        return f"L{self.layout.layer}.k_cache", f"L{self.layout.layer}.v_cache"


def _caches(graph: Graph) -> list[_Cache]:
    """Every (layer, layout tensors) KV cache the graph's cache ops touch, once each;
    two ops giving one set of tensors different geometries is an error."""
    seen: dict[tuple, _Cache] = {}
    for n in graph.nodes:
        if n.op_type not in CACHE_OPS:
            continue
        layout = n.args.kv_cache()
        if layout.layout == "per_layer":  # its tensors are the layer's: the layer parameter plays no part
            layout = attrs.evolve(layout, layers=1, layer=0)
        c = _Cache(layout, {k: t for k, t in (n.inputs | n.outputs).items() if k in CACHE_TENSORS})
        key = (layout.layer, tuple(sorted(c.tensors.items())))
        if key in seen and seen[key] != c:
            raise GraphError(f"node '{n.name}': its KV cache {dict(c.tensors)} has another geometry than an "
                             "earlier node's")
        seen[key] = c
    return list(seen.values())


# ================================================================ the run


def execute(graph: Graph, mode: str = "device", seed: int = 0, weights: Mapping[str, np.ndarray] | None = None,
            inputs: Mapping[str, np.ndarray] | None = None, kv: Mapping[str, np.ndarray] | None = None,
            keep: bool = False) -> Execution:
    """Run `graph` node by node. Missing weights / inputs / KV caches come from
    random_weights / host_inputs / random_kv with `seed`; keep=True also returns
    every tensor's value."""
    if mode not in MODES:
        raise ValueError(f"execute: mode must be one of {', '.join(MODES)}, got {mode!r}")
    weights = {**random_weights(graph, seed), **(weights or {})}
    if is_quantized(graph):  # int8 weights, scales, smoothing from the FP values (calibrated on other inputs)
        calib = seed + CALIBRATION_SEED_OFFSET
        weights = quantized_weights(graph, weights, mode, lambda w, i: execute(
            graph, "reference", seed, w, host_inputs(graph, seed=calib + i), random_kv(graph, calib + i),
            keep=True).values)
    inputs = {**host_inputs(graph, seed=seed), **(inputs or {})}
    kv = {**random_kv(graph, seed), **(kv or {})}
    values: dict[str, np.ndarray] = {}
    for source in (weights, inputs, kv):
        for name, x in source.items():
            if name in graph.tensors:
                spec = graph.tensors[name]
                # a reference run keeps quantised weights unrounded (npusim.graph.quant_values)
                dtype = spec.dtype if mode == "device" or spec.dtype != "int8" else "fp32"
                values[name] = round_to(np.asarray(x).reshape(spec.shape), dtype)
    def store(x: np.ndarray, dtype: str) -> np.ndarray:
        return round_to(x, dtype if mode == "device" or dtype == "int32" else "fp32")

    ctx = RefContext(graph.lengths, graph.phase, store)
    overflow, max_abs = [], {}
    for node in graph.nodes:
        fn = op_spec(node.op_type).reference
        if fn is None:
            raise GraphError(f"node '{node.name}': no numpy semantics for op type '{node.op_type}'")
        specs = {local: graph.tensors[t] for local, t in (node.inputs | node.outputs).items()}
        ins = {local: _need(values, t, node) for local, t in node.inputs.items()}
        # state written in place (a KV cache) is seen by the op at its current value
        ins |= {local: _need(values, t, node) for local, t in node.outputs.items() if specs[local].kind == "kv"}
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # overflow is flagged below
            try:
                results = fn(node.args, ins, specs, ctx)
            except (KeyError, ValueError) as e:
                why = f"no operand {e}" if isinstance(e, KeyError) else e
                raise GraphError(f"node '{node.name}' ({node.op_type}): {why}") from None
        for local, t in node.outputs.items():
            spec = graph.tensors[t]
            y = np.asarray(results[local])
            if spec.dtype != "int32":
                y = y.astype(np.float32)
                with np.errstate(invalid="ignore"):
                    m = float(np.max(np.abs(y))) if y.size else 0.0
                max_abs[t] = m
                # an fp32 tensor (a W8A8 matmul's accumulator) cannot saturate at the fp16 limit
                if not np.isfinite(m) or (m > FP16_MAX and spec.dtype != "fp32"):
                    overflow.append(t)
            values[t] = store(y.reshape(spec.shape), spec.dtype)
    return Execution(
        mode=mode,
        outputs={t: values[t] for t in graph.outputs},
        kv={t: values[t] for t in _kv_state(graph) if t in values},
        overflow=tuple(dict.fromkeys(overflow)),
        max_abs=max_abs,
        values=dict(values) if keep else {},
    )


def _kv_state(graph: Graph) -> list[str]:
    """The KV-cache tensors (kind kv) and the block tables the cache ops read."""
    tables = [t for n in graph.nodes if n.op_type in CACHE_OPS for k, t in n.inputs.items() if k == "block_table"]
    return list(dict.fromkeys([s.name for s in graph.of_kind("kv")] + tables))


def _need(values: dict, tensor: str, node: Node) -> np.ndarray:
    if tensor not in values:
        raise GraphError(f"node '{node.name}' reads '{tensor}', which has no value (not an input, weight, "
                         "KV cache or earlier output)")
    return values[tensor]
