"""Shared pieces of the ops' numpy references (each op's reference lives in its own
module, registered with its lowering; npusim.graph.execute runs them).

A reference is `fn(p, x, specs, ctx) -> {local output: array}`:
- p: the op's parameter record;
- x: local operand name -> float32 array (int32 for ids), the contiguous buffer of
  the graph tensor (a KV cache operand at its current value);
- specs: local name -> the graph tensor's TensorSpec (shape, dtype, format);
- ctx: what a reference may need beyond its operands - `lengths` (each sequence's
  own length), `phase` ("decode" / "prefill") and `store(x, dtype)` (the storing
  rounding of the run's mode: fp32 in the reference mode).
References compute in fp32, as the kernels' accumulators and vector units do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from attrs import frozen


@frozen
class RefContext:
    """What a reference may read beyond its operands (see the module docstring)."""

    lengths: tuple[int, ...]
    phase: str
    store: Callable[[np.ndarray, str], np.ndarray]


def bsnd_to_batches(x: np.ndarray, spec, batch: int, rows: int, cols: int) -> np.ndarray:
    """An operand as [batch, rows, cols]; a BSND tensor is read head-major ([b, n, s, d])."""
    if spec.format == "BSND":
        x = x.reshape(spec.shape).transpose(0, 2, 1, 3)
    return x.reshape(batch, rows, cols)


def batches_to(x: np.ndarray, spec) -> np.ndarray:
    """A head-major result into its tensor: a BSND tensor is written through strides."""
    if spec.format == "BSND":
        b, s, n, d = spec.shape
        return x.reshape(b, n, s, d).transpose(0, 2, 1, 3)
    return x.reshape(spec.shape)


def softmax_rows(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (rows that are all -inf give nan, as the kernel would)."""
    s = s - np.max(s, axis=-1, keepdims=True)
    e = np.exp(s)
    return e / np.sum(e, axis=-1, keepdims=True)


def silu(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v / (1.0 + np.exp(-v))


def gelu(v: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (what the vector kernel computes)."""
    c = np.sqrt(2.0 / np.pi)
    return 0.5 * v * (1.0 + np.tanh(c * (v + 0.044715 * v ** 3)))


def eltwise(fn: Callable[..., np.ndarray], *names: str) -> Callable:
    """A reference of an elementwise op: y = fn(p, *operands, flattened)."""
    return lambda p, x, specs, ctx: {"y": fn(p, *(x[n].reshape(-1) for n in names))}


def gated(act: Callable[[np.ndarray], np.ndarray]) -> Callable:
    """A reference of a gated activation: x [.., 2h] -> act(x[.., :h]) * x[.., h:]."""

    def ref(p, x, specs, ctx):
        v = x["x"].reshape(-1, p.shape[-1])
        h = p.shape[-1] // 2
        return {"y": act(v[:, :h]) * v[:, h:]}

    return ref


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, store_probs: Callable) -> np.ndarray:
    """softmax(q k^T / sqrt(d) where visible, else -inf) v over [.., s, d] operands:
    scores and softmax in fp32 (never stored); P through store_probs (cast for the cube)."""
    s = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
    s = np.where(visible, s, -np.inf)
    return store_probs(softmax_rows(s)) @ v


def group_heads(t: np.ndarray, group: int) -> np.ndarray:
    """K or V [batch, kv_heads, ...] repeated for each query head of a GQA group."""
    return np.repeat(t, group, axis=1)


__all__: Sequence[str] = ["RefContext", "attention", "batches_to", "bsnd_to_batches", "eltwise", "gated", "gelu",
                          "group_heads", "silu", "softmax_rows"]
