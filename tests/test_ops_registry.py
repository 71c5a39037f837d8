"""The operator descriptors: every registered op is complete, and the tables passes
and the executor use are derived from the descriptors."""

import re
import subprocess
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest

from npusim import ops
from npusim.graph import build_decoder
from npusim.ops import OPS
from npusim.ops.reference import RefContext
from npusim.ops.registry import OP_MODULES, Operands, lower, ops_where
from npusim.passes import memplan
from npusim.workload import load_workload

TINY = load_workload("k3-tiny")


@pytest.mark.parametrize("op_type", sorted(OPS))
def test_every_op_has_a_reference_and_operands(op_type):
    s = OPS[op_type]
    assert callable(s.reference), f"{op_type} has no numpy reference"
    assert isinstance(s.operands, Operands) and s.operands.ins and (s.operands.outs or s.operands.kv == "write")
    assert attrs.has(s.params)


def test_pass_tables_are_derived_from_the_descriptors():
    assert set(memplan.IN_PLACE_OPS) == {op for op, s in OPS.items() if s.in_place}
    assert set(ops.KV_READERS) == {op for op, s in OPS.items() if s.operands.kv == "read"}
    assert set(ops.CACHE_OPS) == {op for op, s in OPS.items() if s.operands.kv}
    assert {"flash_attention", "decode_attention"} <= set(ops.KV_READERS) and ops.KV_WRITERS == ("kv_cache_write",)
    # an op turned in-place in its descriptor shows up in the derived table
    old = OPS["rope"]
    try:
        OPS["rope"] = attrs.evolve(old, in_place=True)
        assert "rope" in ops_where(lambda s: s.in_place)
    finally:
        OPS["rope"] = old


def test_every_module_that_registers_an_op_is_one_spec_imports():
    root = Path(ops.__file__).parent
    registering = {p.relative_to(root).parts[0].removesuffix(".py") for p in root.rglob("*.py")
                   if re.search(r"^from npusim\.ops\.registry import .*\bregister\b", p.read_text(), re.M)}
    assert registering == set(OP_MODULES)


def test_looking_up_an_op_type_imports_only_the_op_modules_up_to_its_own():
    code = ("import sys; from npusim.ops.registry import spec; spec('matmul'); "
            "print(sorted(m for m in sys.modules if m.startswith('npusim.ops.attention')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_nodes_carry_typed_params():
    g = build_decoder(TINY, "decode", 2, 16)
    qk = g.node("L0.qk")
    assert qk.args.trans_b is True and qk.args.batch == qk.params["batch"]
    assert qk.args is qk.args  # built once
    assert lower(qk.op_type, qk.args, _hw()).op_type == "batch_matmul"


def _hw():
    from npusim.hw import load_hw

    return load_hw("ascend910b2")


def _ctx():
    return RefContext((1,), "prefill", lambda x, dtype: np.asarray(x, dtype=np.float32))


def test_gelu_reference_is_the_tanh_approximation():
    x = np.linspace(-6, 6, 97, dtype=np.float32)
    p = OPS["gelu"].params(shape=(97,))
    y = OPS["gelu"].reference(p, {"x": x}, {}, _ctx())["y"]
    want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)
    assert y[0] == pytest.approx(0, abs=1e-6) and y[-1] == pytest.approx(6, rel=1e-6)


def test_layer_norm_reference_normalises_each_row():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype(np.float32) * 3 + 1
    gamma, beta = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    p = OPS["layer_norm"].params(shape=(4, 64), eps=1e-5)
    y = OPS["layer_norm"].reference(p, {"x": x, "gamma": gamma, "beta": beta}, {}, _ctx())["y"]
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5) * gamma + beta, rtol=1e-4, atol=1e-5)
    z = (y - beta) / gamma  # each row back to mean 0, variance 1
    np.testing.assert_allclose(z.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(z.var(-1), 1, rtol=1e-3)


def test_top_k_reference_draws_from_the_top_k():
    logits = np.array([[0.0, 5.0, 1.0, 4.0, -2.0]], dtype=np.float32)
    p = OPS["top_k"].params(shape=(1, 5), k=2)
    race = lambda noise: int(OPS["top_k"].reference(p, {"logits": logits, "noise": np.array(noise, np.float32)},
                                                     {}, _ctx())["token"][0])
    assert race([1.0, 1.0]) == 1  # equal noise: the larger logit wins
    assert race([100.0, 0.01]) == 3  # a tiny draw for the second candidate wins the race
