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
not depend on node order.

Op semantics follow npusim.ops: each op reads its inputs as the contiguous
buffers of the graph tensors, viewed with the shapes its parameters give, except
that batch matmuls and FlashAttention read (and write) BSND tensors head by head.
A KV cache is state: kv_cache_write updates it in place, writing sequence b's new
tokens so that they end at its own length (graph.lengths) when position is -1,
at `position` otherwise; the caches after the step are returned.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from attrs import frozen

from npusim.graph.build import host_inputs, node_params
from npusim.graph.ir import Graph, GraphError, Node, TensorSpec

MODES = ("device", "reference")
FP16_MAX = 65504.0


@frozen
class Execution:
    """What a numpy run of a graph produced."""

    mode: str
    outputs: dict[str, np.ndarray]  # every graph output
    kv: dict[str, np.ndarray]  # every KV-cache tensor after the step
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
    """A value for every weight tensor, float32, scaled by its role."""
    out = {}
    for spec in graph.of_kind("weight"):
        z = _rng(seed, spec.name).standard_normal(spec.shape).astype(np.float32)
        role, p = _role(graph, spec.name)
        if role == "gamma":
            z = 1.0 + 0.1 * z
        elif role in ("beta", "bias", "scale"):
            z = 0.1 * z
        elif role == "b":  # a matmul's weight: N(0, 1/fan_in) keeps activations near unit size
            z = z / np.sqrt(p.k)
        elif role != "table":  # embedding rows stay N(0, 1)
            z = z / np.sqrt(spec.shape[-1])
        out[spec.name] = z
    return out


def _role(graph: Graph, tensor: str) -> tuple[str, Any]:
    for n in graph.consumers(tensor):
        for local, t in n.inputs.items():
            if t == tensor:
                return local, node_params(n)
    return "", None


def random_kv(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """The KV caches before the step. Decode: N(0, 1) at the positions before each
    sequence's new token (a [batch, kv_heads, context, head_dim] cache), zeros
    after; prefill: zeros."""
    out = {}
    for spec in graph.of_kind("kv"):
        z = np.zeros(spec.shape, dtype=np.float32)
        if graph.phase == "decode" and len(spec.shape) == 4:
            z = _rng(seed, spec.name).standard_normal(spec.shape).astype(np.float32)
            old = np.arange(spec.shape[2])[None, :] < np.array(graph.lengths)[:, None] - 1  # [batch, context]
            z *= old[:, None, :, None]
        out[spec.name] = z
    return out


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
        kv={s.name: values[s.name] for s in graph.of_kind("kv")},
        overflow=tuple(dict.fromkeys(overflow)),
        max_abs=max_abs,
        values=dict(values) if keep else {},
    )


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
    a = x["a"].reshape(p.m, p.k)
    b = x["b"].reshape(p.n, p.k).T if p.trans_b else x["b"].reshape(p.k, p.n)
    c = a @ b  # float32 inputs, float32 accumulation
    if p.bias:
        c = c + x["bias"].reshape(p.n)
    return {"c": c}


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
    if p.layout != "per_layer":
        raise GraphError(f"kv_cache_write: the executor models the per_layer layout, got '{p.layout}'")
    lengths = run.graph.lengths
    out = {}
    for which in ("k", "v"):
        new = x[which].reshape(p.batch, p.new_tokens, p.kv_heads, p.head_dim)
        cache = x[f"{which}_cache"].reshape(p.batch, p.kv_heads, p.context, p.head_dim).copy()
        for b in range(p.batch):
            start = lengths[b] - p.new_tokens if p.position < 0 else p.position
            keep = min(p.new_tokens, p.context - start)
            cache[b, :, start:start + keep] = new[b, :keep].transpose(1, 0, 2)
        out[f"{which}_cache"] = cache
    return out


def _flash_attention(p, x, specs, run):
    q = _bsnd_to_batches(x["q"], specs["q"], p.batch * p.heads, p.seq_q, p.head_dim)
    k = x["k"].reshape(p.batch, p.kv_heads, p.seq_kv, p.head_dim)
    v = x["v"].reshape(p.batch, p.kv_heads, p.seq_kv, p.head_dim)
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
