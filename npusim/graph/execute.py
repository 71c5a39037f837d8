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
not depend on node order. A weight a pass derived (`Graph.derived`: a fused QKV
weight) is the concatenation of its originals' values, each generated from its own
name as in the graph before the pass, so fused and unfused graphs compute the same.

Op semantics follow npusim.ops: each op reads its inputs as the contiguous
buffers of the graph tensors, viewed with the shapes its parameters give, except
that batch matmuls and FlashAttention read (and write) BSND tensors head by head.
A KV cache is state: kv_cache_write updates it in place, writing sequence b's new
tokens so that they end at its own length (graph.lengths) when position is -1,
at `position` otherwise; the caches after the step are returned.

KV layouts (npusim.ops.layout.KvCache): the graph holds the layout's physical
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

import itertools
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np
from attrs import frozen

from npusim.graph.build import host_inputs, node_params
from npusim.graph.ir import Graph, GraphError, Node, TensorSpec
from npusim.ops.layout import KV_CACHE_NAMES, KV_READERS, physical_block

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
    return out


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
    if all(n in known for n in names):
        shapes = [tuple(known[n]) for n in names]
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
                return local, node_params(n)
    return "", None


def random_kv(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """The KV caches before the step, in the graph's layout. Logically, per layer, a
    K and a V [batch, kv_heads, context, head_dim]: in decode N(0, 1) at the positions
    before each sequence's new token, zeros after; in prefill zeros. Each layer's K
    and V are generated from the per-layer graph's names "L{layer}.k_cache" /
    "L{layer}.v_cache" (a per_layer cache: from its own tensor names) and packed into
    the layout's tensors: the contiguous tensor's row padding stays 0, the paged pools
    are filled through a block table holding KvCache's scattered block order (and
    returned too). KV tensors no cache node maps stay zero."""
    out = {spec.name: np.zeros(spec.shape, dtype=np.float32) for spec in graph.of_kind("kv")}
    for c in _caches(graph):
        if c.layout == "paged":
            out[c.tensors["block_table"]] = c.block_table()
        phys = {local: out[t] for local, t in c.tensors.items()}
        k, v = (_start_cache(graph, name, c.shape, seed) for name in c.names())
        out |= {c.tensors[local]: x for local, x in c.pack(phys, k, v).items()}
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
        out |= {name: x[:, :, :n] for name, x in zip(c.names(), c.unpack(phys))}
    return out


# ================================================================ KV-cache layouts

# op type -> its layout parameter
CACHE_OPS = {"kv_cache_write": "layout"} | {op: "kv_layout" for op in KV_READERS}
CACHE_TENSORS = tuple(dict.fromkeys(name for names in KV_CACHE_NAMES.values() for name in names))


@frozen
class _Cache:
    """One layer's KV cache as an op sees it: layout, geometry and (in a graph) the
    tensors holding it, by the op's local names (k_cache, v_cache, kv_cache, block_table)."""

    layout: str
    batch: int
    kv_heads: int
    context: int
    head_dim: int
    layers: int
    layer: int
    block_tokens: int
    tensors: dict  # local name -> graph tensor name

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The logical shape of one layer's K (or V)."""
        return self.batch, self.kv_heads, self.context, self.head_dim

    @property
    def max_blocks(self) -> int:
        return -(-self.context // self.block_tokens)

    def names(self) -> tuple[str, str]:
        """Names of the logical K and V: the per-layer graph's."""
        if self.layout == "per_layer":
            return self.tensors["k_cache"], self.tensors["v_cache"]
        return f"L{self.layer}.k_cache", f"L{self.layer}.v_cache"

    def block_table(self) -> np.ndarray:
        """Physical block of each sequence's logical blocks: KvCache's order."""
        n = self.batch * self.max_blocks
        return np.array([[physical_block(b, j, self.max_blocks, n) for j in range(self.max_blocks)]
                         for b in range(self.batch)], dtype=np.int32)

    def _paged_index(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pool block [batch, context], slot in the block [context]) of every logical token."""
        pos = np.arange(self.context)
        table = np.asarray(table).reshape(self.batch, self.max_blocks).astype(np.int64)
        return table[:, pos // self.block_tokens], pos % self.block_tokens

    def _rows(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x).reshape(self.batch, self.layers, self.kv_heads, self.context, -1)

    def _pool(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x).reshape(-1, self.kv_heads, self.block_tokens, self.head_dim)

    def unpack(self, phys: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Logical K, V [batch, kv_heads, context, head_dim] from the layout's tensors."""
        d = self.head_dim
        if self.layout == "per_layer":
            return tuple(np.asarray(phys[t]).reshape(self.shape) for t in ("k_cache", "v_cache"))
        if self.layout == "contiguous":
            rows = self._rows(phys["kv_cache"])[:, self.layer]
            return rows[..., :d], rows[..., d:2 * d]
        blk, slot = self._paged_index(phys["block_table"])
        # advanced indices around a slice: the result is [batch, context, kv_heads, head_dim]
        return tuple(self._pool(phys[t])[blk, :, slot, :].transpose(0, 2, 1, 3) for t in ("k_cache", "v_cache"))

    def pack(self, phys: Mapping[str, np.ndarray], k: np.ndarray, v: np.ndarray) -> dict[str, np.ndarray]:
        """The layout's cache tensors (copies of `phys`, by local name) holding logical
        K and V; bytes outside this layer's tokens (other layers, row padding, unused
        block slots) keep their values. The block table is read, not written."""
        d = self.head_dim
        if self.layout == "per_layer":
            return {"k_cache": k.reshape(self.shape).copy(), "v_cache": v.reshape(self.shape).copy()}
        if self.layout == "contiguous":
            rows = self._rows(phys["kv_cache"]).copy()
            rows[:, self.layer, ..., :d], rows[:, self.layer, ..., d:2 * d] = k, v
            return {"kv_cache": rows}
        blk, slot = self._paged_index(phys["block_table"])
        out = {}
        for local, x in (("k_cache", k), ("v_cache", v)):
            pool = self._pool(phys[local]).copy()
            if len(pool) < self.batch * self.max_blocks:
                raise GraphError(f"paged KV cache: a pool of {len(pool)} blocks, "
                                 f"{self.batch * self.max_blocks} needed")
            pool[blk, :, slot, :] = np.asarray(x).reshape(self.shape).transpose(0, 2, 1, 3)
            out[local] = pool
        return out


def _cache_of(p, tensors: Mapping[str, str]) -> _Cache:
    """The cache a kv_cache_write / decode_attention / flash_attention with params p sees."""
    layout = getattr(p, "layout", None) or p.kv_layout
    context = getattr(p, "context", None) or p.seq_kv
    return _Cache(layout, p.batch, p.kv_heads, context, p.head_dim, p.layers, p.layer, p.block_tokens,
                  {k: t for k, t in tensors.items() if k in CACHE_TENSORS})


def _caches(graph: Graph) -> list[_Cache]:
    """Every (layer, layout tensors) KV cache the graph's cache ops touch, once each;
    two ops giving one set of tensors different geometries is an error."""
    seen: dict[tuple, _Cache] = {}
    for n in graph.nodes:
        if n.op_type not in CACHE_OPS:
            continue
        c = _cache_of(node_params(n), n.inputs | n.outputs)
        if c.layout == "per_layer":  # its tensors are the layer's: the layer parameter plays no part
            c = attrs.evolve(c, layers=1, layer=0)
        key = (c.layer, tuple(sorted(c.tensors.items())))
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
    inputs = {**host_inputs(graph, seed=seed), **(inputs or {})}
    kv = {**random_kv(graph, seed), **(kv or {})}
    values: dict[str, np.ndarray] = {}
    for source in (weights, inputs, kv):
        for name, x in source.items():
            if name in graph.tensors:
                spec = graph.tensors[name]
                values[name] = round_to(np.asarray(x).reshape(spec.shape), spec.dtype)
    def store(x: np.ndarray, dtype: str) -> np.ndarray:
        return round_to(x, dtype if mode == "device" or dtype == "int32" else "fp32")

    run = _Run(graph, store)
    overflow, max_abs = [], {}
    for node in graph.nodes:
        fn = SEMANTICS.get(node.op_type)
        if fn is None:
            raise GraphError(f"node '{node.name}': no numpy semantics for op type '{node.op_type}'")
        specs = {local: graph.tensors[t] for local, t in (node.inputs | node.outputs).items()}
        ins = {local: _need(values, t, node) for local, t in node.inputs.items()}
        # state written in place (a KV cache) is seen by the op at its current value
        ins |= {local: _need(values, t, node) for local, t in node.outputs.items() if specs[local].kind == "kv"}
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # overflow is flagged below
            results = fn(node_params(node), ins, specs, run)
        for local, t in node.outputs.items():
            spec = graph.tensors[t]
            y = np.asarray(results[local])
            if spec.dtype != "int32":
                y = y.astype(np.float32)
                with np.errstate(invalid="ignore"):
                    m = float(np.max(np.abs(y))) if y.size else 0.0
                max_abs[t] = m
                if not np.isfinite(m) or m > FP16_MAX:
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


class _Run:
    """What an op's semantics may need beyond its operands."""

    def __init__(self, graph: Graph, store: Callable[[np.ndarray, str], np.ndarray]):
        self.graph = graph
        self.store = store  # storage rounding of this mode (identity to fp32 in reference)


# ================================================================ op semantics
# fn(params, inputs: local name -> array, specs: local name -> TensorSpec, run) -> {local output: array}


def _bsnd_to_batches(x: np.ndarray, spec: TensorSpec, batch: int, rows: int, cols: int) -> np.ndarray:
    """An operand as [batch, rows, cols]; a BSND tensor is read head-major ([b, n, s, d])."""
    if spec.format == "BSND":
        x = x.reshape(spec.shape).transpose(0, 2, 1, 3)
    return x.reshape(batch, rows, cols)


def _batches_to(x: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A head-major result into its tensor: a BSND tensor is written through strides."""
    if spec.format == "BSND":
        b, s, n, d = spec.shape
        return x.reshape(b, n, s, d).transpose(0, 2, 1, 3)
    return x.reshape(spec.shape)


def _matmul(p, x, specs, run):
    """C = A B (+ bias); with n_parts, C's columns in order as outputs c0, c1, ...
    each [m, n_parts[i]] (a fused QKV projection writing q, k and v)."""
    a = x["a"].reshape(p.m, p.k)
    b = x["b"].reshape(p.n, p.k).T if p.trans_b else x["b"].reshape(p.k, p.n)
    c = a @ b  # float32 inputs, float32 accumulation
    if p.bias:
        c = c + x["bias"].reshape(p.n)
    parts = tuple(getattr(p, "n_parts", ()))
    if not parts:
        return {"c": c}
    if sum(parts) != p.n:
        raise GraphError(f"matmul: n_parts {parts} do not add up to n={p.n}")
    edges = np.cumsum((0,) + parts)
    return {f"c{i}": c[:, lo:hi] for i, (lo, hi) in enumerate(itertools.pairwise(edges))}


def _batch_matmul(p, x, specs, run):
    a = _bsnd_to_batches(x["a"], specs["a"], p.batch, p.m, p.k)
    if p.trans_b:
        b = _bsnd_to_batches(x["b"], specs["b"], p.batch, p.n, p.k).transpose(0, 2, 1)
    else:
        b = _bsnd_to_batches(x["b"], specs["b"], p.batch, p.k, p.n)
    c = a @ b
    if p.bias:
        c = c + x["bias"].reshape(p.n)
    return {"c": _batches_to(c, specs["c"])}


def _rms(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    h = gamma.size
    x = x.reshape(-1, h)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma.reshape(h)


def _rms_norm(p, x, specs, run):
    return {"y": _rms(x["x"], x["gamma"], p.eps)}


def _add_rms_norm(p, x, specs, run):
    s = x["x"] + x["residual"]
    # the device normalises the stored sum (what the unfused add would have written)
    return {"x_sum": s, "y": _rms(run.store(s, specs["x_sum"].dtype), x["gamma"], p.eps)}


def _layer_norm(p, x, specs, run):
    h = x["gamma"].size
    v = x["x"].reshape(-1, h)
    v = v - v.mean(axis=-1, keepdims=True)
    y = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + p.eps)
    return {"y": y * x["gamma"].reshape(h) + x["beta"].reshape(h)}


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    s = s - np.max(s, axis=-1, keepdims=True)
    e = np.exp(s)
    return e / np.sum(e, axis=-1, keepdims=True)


def _softmax(p, x, specs, run):
    return {"y": _softmax_rows(x["x"].reshape(-1, p.shape[-1]))}


def _silu(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v / (1.0 + np.exp(-v))


def _swiglu(p, x, specs, run):
    v = x["x"].reshape(-1, p.shape[-1])
    h = p.shape[-1] // 2
    return {"y": _silu(v[:, :h]) * v[:, h:]}


def _gelu(v: np.ndarray) -> np.ndarray:
    c = np.sqrt(2.0 / np.pi)
    return 0.5 * v * (1.0 + np.tanh(c * (v + 0.044715 * v ** 3)))


def _rope(p, x, specs, run):
    tokens, heads, d = p.shape
    v = x["x"].reshape(tokens, heads, d)
    cos = x["cos"].reshape(tokens, 1, d)
    sin = x["sin"].reshape(tokens, 1, d)
    rot = np.concatenate([-v[..., d // 2:], v[..., :d // 2]], axis=-1)  # rotate_half
    return {"y": v * cos + rot * sin}


def _embedding(p, x, specs, run):
    ids = x["ids"].reshape(p.tokens).astype(np.int64)
    if ids.min() < 0 or ids.max() >= p.vocab:
        raise GraphError(f"embedding: id {ids.max() if ids.max() >= p.vocab else ids.min()} out of range "
                         f"[0, {p.vocab})")
    return {"y": x["table"].reshape(p.vocab, p.hidden)[ids]}


def _kv_cache_write(p, x, specs, run):
    """New K and V ([batch, new_tokens, kv_heads, head_dim]) into the layer's logical
    cache, packed back into the layout's tensors (the block table passes through)."""
    lengths = run.graph.lengths
    cache = _op_cache(p, x)
    logical = []
    for which, old in zip("kv", cache.unpack(x)):
        new = x[which].reshape(p.batch, p.new_tokens, p.kv_heads, p.head_dim)
        old = old.copy()
        for b in range(p.batch):
            start = lengths[b] - p.new_tokens if p.position < 0 else p.position
            keep = min(p.new_tokens, p.context - start)
            old[b, :, start:start + keep] = new[b, :keep].transpose(1, 0, 2)
        logical.append(old)
    out = cache.pack(x, *logical)
    return out | ({"block_table": x["block_table"]} if "block_table" in x else {})


def _op_cache(p, x: Mapping[str, np.ndarray]) -> _Cache:
    """The cache an op's semantics see: its tensors are its operands, by local name."""
    return _cache_of(p, {local: local for local in x})


def _flash_attention(p, x, specs, run):
    q = _bsnd_to_batches(x["q"], specs["q"], p.batch * p.heads, p.seq_q, p.head_dim)
    k, v = _op_cache(p, x).unpack(x)
    k = np.repeat(k, p.group, axis=1).reshape(-1, p.seq_kv, p.head_dim)
    v = np.repeat(v, p.group, axis=1).reshape(-1, p.seq_kv, p.head_dim)
    s = (q @ k.transpose(0, 2, 1)) / np.sqrt(p.head_dim)  # fp32 in UB: never stored
    s = s.reshape(p.batch, p.heads, p.seq_q, p.seq_kv)
    keys = np.arange(p.seq_kv)
    visible = np.ones(s.shape, dtype=bool)
    if p.causal:
        visible &= keys[None, :] <= np.arange(p.seq_q)[:, None] + p.seq_kv - p.seq_q
    if run.graph.phase == "decode":  # each sequence's padding keys
        visible &= keys[None, None, None, :] < np.array(run.graph.lengths)[:, None, None, None]
    s = np.where(visible, s, -np.inf)
    probs = run.store(_softmax_rows(s), specs["q"].dtype)  # P goes to the cube in fp16
    o = probs.reshape(-1, p.seq_q, p.seq_kv) @ v
    return {"o": _batches_to(o, specs["o"])}


def _decode_attention(p, x, specs, run):
    """One new token per sequence: q and o [batch, heads, head_dim] (token-major with
    seq 1, the same bytes as BSND), over the first graph.lengths[b] keys of sequence
    b's cache (its new token sits at position L - 1: build.py's decode convention).
    Scores and softmax in fp32; P stored in q's dtype before P V, as the kernel casts it."""
    q = x["q"].reshape(p.batch, p.heads, 1, p.head_dim)
    k, v = (np.repeat(t, p.group, axis=1) for t in _op_cache(p, x).unpack(x))  # [batch, heads, context, head_dim]
    s = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(p.head_dim)  # [batch, heads, 1, context]
    visible = np.arange(p.context)[None, :] < np.array(run.graph.lengths)[:, None]  # [batch, context]
    s = np.where(visible[:, None, None, :], s, -np.inf)
    probs = run.store(_softmax_rows(s), specs["q"].dtype)
    return {"o": (probs @ v).reshape(p.batch, p.heads, p.head_dim)}


def _argmax(p, x, specs, run):
    return {"index": np.argmax(x["logits"].reshape(-1, p.shape[-1]), axis=-1).astype(np.int32)}


def _eltwise(fn: Callable[..., np.ndarray], *names: str):
    return lambda p, x, specs, run: {"y": fn(p, *(x[n].reshape(-1) for n in names))}


SEMANTICS: dict[str, Callable] = {
    "matmul": _matmul,
    "batch_matmul": _batch_matmul,
    "rms_norm": _rms_norm,
    "add_rms_norm": _add_rms_norm,
    "layer_norm": _layer_norm,
    "softmax": _softmax,
    "rope": _rope,
    "embedding": _embedding,
    "kv_cache_write": _kv_cache_write,
    "flash_attention": _flash_attention,
    "decode_attention": _decode_attention,
    "argmax": _argmax,
    "swiglu": _swiglu,
    "add": _eltwise(lambda p, a, b: a + b, "x1", "x2"),
    "mul": _eltwise(lambda p, a, b: a * b, "x1", "x2"),
    "scale": _eltwise(lambda p, a: a * np.float32(p.scale), "x"),
    "scale_add": _eltwise(lambda p, a, r: a * np.float32(p.scale) + r, "x", "r"),
    "relu": _eltwise(lambda p, a: np.maximum(a, 0), "x"),
    "silu": _eltwise(lambda p, a: _silu(a), "x"),
    "gelu": _eltwise(lambda p, a: _gelu(a), "x"),
    # a cast's rounding is the storing of its output; layout changes keep the values
    "cast": _eltwise(lambda p, a: a, "x"),
    "copy": _eltwise(lambda p, a: a, "x"),
    "trans_data": _eltwise(lambda p, a: a, "x"),
}
