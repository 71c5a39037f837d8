"""The values of a quantised graph's weights, made from the FP weights as an offline
checkpoint converter makes them (the quantize pass only says which tensors are
quantised: npusim.passes.quantize).

For every int8 weight W [n, k] a matmul reads with per-channel scales (and every
int8 expert weight [E, n, k] a grouped matmul reads, expert by expert):
- W is first rounded to the model dtype (the FP16 checkpoint);
- when the matmul's activation is quantised with SmoothQuant factors, W's columns
  are multiplied by s (W * s[None, :]) and the quantise kernel's `smooth` operand
  holds 1 / s;
- scale[o] = max_j |W[o, j]| / 127 (an expert's: scale[e, o] over W[e, o, j];
  MIN_AMAX guards an all-zero row), and the stored weight is W / scale[:, None],
  rounded to int8 (rint, clipped) in a device run; a reference run keeps the
  quotient unrounded, so the quantised graph run as "reference" computes what the
  FP graph computes.

SmoothQuant's factors (one per input channel of an activation, shared by every
matmul reading it): s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), X_j from a
calibration run, W_j over the rows of all those matmuls' weights. The calibration
runs are reference runs of the same graph (same weights, factors 1) on other
inputs: CALIBRATION_RUNS draws of host inputs and KV cache, from seeds
CALIBRATION_SEED_OFFSET + seed + i, so the factors are never fitted to the inputs
they are then judged on. A decode step has only `batch` new tokens: a channel's
maximum over a handful of them is a poor estimate (a channel that happened to be
small gets a small s, and a later token large in it then dominates its row's
scale), so the maxima are taken over all the calibration runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from npusim.graph.ir import Graph, Node
from npusim.ops.quant import INT8_MAX, MIN_AMAX

# Calibration inputs come from seed + this + i (any value other than 0 gives inputs
# the evaluation does not see).
CALIBRATION_SEED_OFFSET = 1000
# Calibration runs (assumed: enough tokens for stable per-channel maxima on the
# small graphs the numpy runs take; see the module docstring).
CALIBRATION_RUNS = 16


def is_quantized(graph: Graph) -> bool:
    return any(t.kind == "weight" and t.dtype == "int8" for t in graph.tensors.values())


# The input each kind of node reading an int8 weight with per-channel scales reads it as.
WEIGHT_INPUT = {"matmul": "b", "grouped_matmul": "weight"}


def _int8_weight_readers(graph: Graph) -> list[Node]:
    """The matmuls and grouped matmuls reading an int8 weight with its scales."""
    return [n for n in graph.nodes if n.op_type in WEIGHT_INPUT and "scale" in n.inputs
            and graph.tensors[n.inputs[WEIGHT_INPUT[n.op_type]]].dtype == "int8"]


def _int8_matmuls(graph: Graph) -> list[Node]:
    """The dense ones: a SmoothQuant activation is only ever a matmul's."""
    return [n for n in _int8_weight_readers(graph) if n.op_type == "matmul"]


def quantized_weights(graph: Graph, weights: Mapping[str, np.ndarray], mode: str,
                      calibrate: Callable[[dict[str, np.ndarray], int], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`weights` with every int8 weight, its scales and the smoothing factors made
    from the FP values the int8 weights hold in `weights`. `calibrate(weights, i)`
    runs the graph on calibration draw i and returns every tensor's value (used only
    when a quantise op smooths and `mode` is "device")."""
    out = dict(weights)
    readers = _int8_weight_readers(graph)
    fp = {_weight(n): _as_dtype(np.asarray(weights[_weight(n)], np.float32), graph.workload.dtype)
          for n in readers}
    smooth = _smoothing(graph, fp, weights, mode, calibrate)
    for n in readers:
        w = _weight(n)
        rows = fp[w].reshape(_rows_shape(n))
        q = n.inputs.get("a")
        if q in smooth:
            rows = rows * smooth[q][None, :]
        scale = (np.maximum(np.max(np.abs(rows), axis=-1), MIN_AMAX) / INT8_MAX).astype(np.float32)
        out[w] = rows / scale[..., None]
        out[n.inputs["scale"]] = scale
    for qn in graph.nodes:
        if qn.op_type == "quantize_per_token" and qn.args.smooth:
            out[qn.inputs["smooth"]] = (1.0 / smooth[qn.outputs["y"]]).astype(np.float32)
    return out


def _smoothing(graph: Graph, fp: dict[str, np.ndarray], weights, mode: str, calibrate) -> dict[str, np.ndarray]:
    """int8 activation -> SmoothQuant factors s [k] (1 in a reference run: there the
    migration changes nothing, as nothing is rounded)."""
    smoothing = [n for n in graph.nodes if n.op_type == "quantize_per_token" and n.args.smooth]
    if not smoothing:
        return {}
    if mode != "device":
        return {n.outputs["y"]: np.ones(n.args.hidden, np.float32) for n in smoothing}
    x_max = {n.name: np.zeros(n.args.hidden, np.float32) for n in smoothing}
    for i in range(CALIBRATION_RUNS):
        values = calibrate(dict(weights), i)
        for n in smoothing:
            x_max[n.name] = np.maximum(x_max[n.name], np.abs(values[n.inputs["x"]].reshape(-1, n.args.hidden)).max(0))
    out = {}
    for n in smoothing:
        x = x_max[n.name]
        readers = [m for m in _int8_matmuls(graph) if m.inputs["a"] == n.outputs["y"]]
        w = np.concatenate([np.abs(fp[m.inputs["b"]].reshape(m.args.n, m.args.k)) for m in readers]).max(axis=0)
        a = n.args.smooth_alpha
        s = np.maximum(x, MIN_AMAX) ** a / np.maximum(w, MIN_AMAX) ** (1 - a)
        out[n.outputs["y"]] = s.astype(np.float32)
    return out


def _weight(n: Node) -> str:
    return n.inputs[WEIGHT_INPUT[n.op_type]]


def _rows_shape(n: Node) -> tuple[int, ...]:
    """A weight's shape with its output channels as rows: [n, k], or [E, n, k] for experts."""
    experts = (len(n.args.group_sizes),) if n.op_type == "grouped_matmul" else ()
    return (*experts, n.args.n, n.args.k)


def _as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    from npusim.graph.execute import round_to

    return round_to(x, dtype)


__all__ = ["CALIBRATION_SEED_OFFSET", "WEIGHT_INPUT", "is_quantized", "quantized_weights"]
