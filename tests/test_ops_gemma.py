"""Gemma's elementwise ops, each added as one module: geglu (gated GELU) and
logit_softcap (y = cap * tanh(x / cap)). Each lowers to kernels that pass verify(),
never beats its roofline, costs what its instruction sequence says, and its numpy
reference matches a direct formula."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import NpusimError
from npusim.graph import Graph, Node, TensorSpec, execute
from npusim.hw import load_hw
from npusim.isa.program import VecOp
from npusim.ops import IN_PLACE_OPS, OPS, lower, simulate_op
from npusim.ops.reference import RefContext
from npusim.workload import load_workload

HW = load_hw("ascend910b2")
CTX = RefContext((1,), "prefill", lambda x, dtype: np.asarray(x, dtype=np.float32))


def _vec_ops(lowered) -> list[str]:
    out = []

    def walk(items):
        for it in items:
            if isinstance(it, VecOp):
                out.append(it.op)
            elif hasattr(it, "body"):
                walk(it.body)

    for k in lowered.kernels:
        for prog in k.aiv:
            walk(prog.body)
    return out


@pytest.mark.parametrize("op,params", [
    ("geglu", {"shape": (1, 32)}), ("geglu", {"shape": (7, 2000)}), ("geglu", {"shape": (8, 16896)}),
    ("geglu", {"shape": (8, 16896), "dtype": "bf16"}),
    ("logit_softcap", {"shape": (1,)}), ("logit_softcap", {"shape": (8, 256000)}),
    ("logit_softcap", {"shape": (3, 1000), "dtype": "bf16", "cap": 50.0}),
])
def test_lowers_verifies_and_never_beats_its_roofline(op, params):
    lowered = lower(op, params, HW)
    report = simulate_op(lowered, HW, trace="kernel")  # runs verify() on every kernel
    assert report.seconds >= report.roofline.time_s
    assert report.stats.gm_bytes >= lowered.min_gm_bytes == sum(t.nbytes for t in (*lowered.inputs,
                                                                                      *lowered.outputs))


def test_geglu_is_swiglu_with_gelu_in_place_of_silu():
    shape = (8, 16896)
    geglu, swiglu, gelu = (lower(op, {"shape": s}, HW) for op, s in
                           (("geglu", shape), ("swiglu", shape), ("gelu", (8, 8448))))
    assert geglu.outputs[0].shape == (8, 8448)
    assert geglu.flops == gelu.flops + 8 * 8448  # the activation's, plus one multiply per output
    ops = _vec_ops(geglu)
    # more multiplies per exp than SwiGLU (the two kernels list different numbers of tiles:
    # swiglu tiles as CANN's SwiGlu kernel does, npusim.ops.swiglu_tiles)
    sw = _vec_ops(swiglu)
    assert "exp" in ops and "div" in ops and ops.count("mul") / ops.count("exp") > sw.count("mul") / sw.count("exp")
    # both read the two halves of the input and write one output: same bytes moved
    a, b = simulate_op(geglu, HW), simulate_op(swiglu, HW)
    assert a.stats.gm_bytes == b.stats.gm_bytes and a.seconds > b.seconds  # GELU costs more than SiLU
    with pytest.raises(NpusimError, match="geglu: shape.-1.=7 must be even"):
        lower("geglu", {"shape": (2, 7)}, HW)


def test_softcap_costs_its_tanh_from_the_config():
    p = {"shape": (64, 65536)}
    base = simulate_op(lower("logit_softcap", p, HW), HW)
    costly = load_hw("ascend910b2", {"aiv.vector_cycles_per_repeat.tanh": 40})
    slow = simulate_op(lower("logit_softcap", p, costly), costly)
    assert _vec_ops(lower("logit_softcap", p, HW)).count("tanh") >= 1
    assert slow.seconds > base.seconds
    assert "logit_softcap" in IN_PLACE_OPS


def test_references_match_the_formulas():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 64)) * 3).astype(np.float32)
    c = np.sqrt(2 / np.pi)
    gelu = lambda v: 0.5 * v * (1 + np.tanh(c * (v + 0.044715 * v ** 3)))  # noqa: E731
    y = OPS["geglu"].reference(OPS["geglu"].params(shape=(4, 64)), {"x": x}, {}, CTX)["y"]
    np.testing.assert_allclose(y, gelu(x[:, :32]) * x[:, 32:], rtol=1e-5, atol=1e-6)
    big = (rng.standard_normal(1000) * 100).astype(np.float32)
    p = OPS["logit_softcap"].params(shape=(1000,), cap=30.0)
    y = OPS["logit_softcap"].reference(p, {"x": big}, {}, CTX)["y"]
    np.testing.assert_allclose(y, 30 * np.tanh(big / 30), rtol=1e-5, atol=1e-5)
    assert np.abs(y).max() <= 30 and np.abs(y).max() > 29  # capped, and the large ones close to the cap
    small = np.float32([0.01, -0.02])
    np.testing.assert_allclose(OPS["logit_softcap"].reference(p, {"x": small}, {}, CTX)["y"], small, rtol=1e-5)


def test_executor_runs_them_in_a_graph():
    """A two-node graph: geglu, then a soft cap of its output, executed by the numpy executor."""
    t = {"x": TensorSpec("x", (2, 16), "fp16", kind="input"), "h": TensorSpec("h", (2, 8), "fp16"),
         "y": TensorSpec("y", (2, 8), "fp16", kind="output")}
    nodes = [Node("act", "geglu", {"shape": (2, 16)}, {"x": "x"}, {"y": "h"}),
             Node("cap", "logit_softcap", {"shape": (2, 8), "cap": 0.5}, {"x": "h"}, {"y": "y"})]
    g = Graph(t, nodes, ("x",), ("y",), "prefill", 1, (2,), load_workload("k3-tiny")).check()
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(2, 16)
    out = execute(g, "reference", inputs={"x": x}).outputs["y"]
    c = np.sqrt(2 / np.pi)
    h = 0.5 * x[:, :8] * (1 + np.tanh(c * (x[:, :8] + 0.044715 * x[:, :8] ** 3))) * x[:, 8:]
    np.testing.assert_allclose(out, 0.5 * np.tanh(h / 0.5), rtol=1e-3, atol=1e-3)
