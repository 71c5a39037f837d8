"""Closed-form instruction costs (Mmad, vector ops, MTE1) and pipelining: a
double-buffered copy-in / compute / copy-out loop runs at its slowest stage, a
single-buffered one at the sum of its stages."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from kernels import (
    L0A,
    L0B,
    L1,
    ceil_div,
    aic_kernel,
    aiv_kernel,
    intervals,
    pipeline_kernel,
)
from npusim.engine import simulate
from npusim.hw import load_hw
from npusim.isa import DTYPE_BYTES, Copy, Mmad, VecOp

HW = load_hw("ascend910b2")


def only(result, core, pipe):
    (iv,) = intervals(result, core, pipe)
    return iv


# ------------------------------------------------------------------ cube


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "int8"])
@pytest.mark.parametrize("m, n, k", [(16, 16, 16), (33, 47, 70), (1, 64, 256), (128, 96, 32)])
def test_mmad_cycles_are_startup_plus_fractals(dtype, m, n, k):
    f = HW.aic.mmad_fractals[dtype]
    r = simulate(aic_kernel(HW, [Mmad(m, n, k, dtype)]), HW)
    _, _, name, start, end, _ = only(r, "AIC0", "M")
    assert name == "Mmad"
    assert end - start == HW.aic.mmad_startup_cycles + ceil_div(m, f.m0) * ceil_div(n, f.n0) * ceil_div(k, f.k0)
    s = r.kernels[0].stats
    assert s.flops == 2 * m * n * k
    assert s.busy_cycles["AIC.M"] == end - start


def test_int8_fractal_is_wider_than_fp16():
    """Same shape, int8 has n0 = 32: half the fractals along n."""
    m, n, k = 64, 128, 64
    fp16 = only(simulate(aic_kernel(HW, [Mmad(m, n, k, "fp16")]), HW), "AIC0", "M")
    int8 = only(simulate(aic_kernel(HW, [Mmad(m, n, k, "int8")]), HW), "AIC0", "M")
    startup = HW.aic.mmad_startup_cycles
    f16, f8 = HW.aic.mmad_fractals["fp16"], HW.aic.mmad_fractals["int8"]
    assert (fp16[4] - fp16[3] - startup) * f16.n0 == (int8[4] - int8[3] - startup) * f8.n0


def test_mmad_fractal_override_changes_cost():
    hw = load_hw("ascend910b2", overrides={"aic.mmad_fractals.fp16.m0": 8, "aic.mmad_startup_cycles": 0})
    r = simulate(aic_kernel(hw, [Mmad(64, 64, 64, "fp16")]), hw)
    _, _, _, start, end, _ = only(r, "AIC0", "M")
    f = hw.aic.mmad_fractals["fp16"]
    assert end - start == (64 // f.m0) * (64 // f.n0) * (64 // f.k0)


def test_back_to_back_mmads_serialise_on_the_m_pipe():
    r = simulate(aic_kernel(HW, [Mmad(64, 64, 64), Mmad(64, 64, 64, accumulate=True)]), HW)
    a, b = intervals(r, "AIC0", "M")
    assert b[3] == a[4]
    assert b[4] - b[3] == a[4] - a[3]


@pytest.mark.parametrize("dst, rate_field", [(L0A, "mte1_l0a_bytes_per_cycle"), (L0B, "mte1_l0b_bytes_per_cycle")])
def test_mte1_copy_is_startup_plus_bytes_over_rate(dst, rate_field):
    nbytes = 40960
    r = simulate(aic_kernel(HW, [Copy(L1, dst, 0, 0, nbytes)]), HW)
    _, _, name, start, end, _ = only(r, "AIC0", "MTE1")
    assert name == f"L1->{dst.value}"
    assert end - start == HW.aic.mte1_startup_cycles + ceil_div(nbytes, getattr(HW.aic, rate_field))


# ------------------------------------------------------------------ vector


def vec_cycles(hw, op: str, n: int, dtype: str, out_dtype: str | None = None) -> int:
    elem = max(DTYPE_BYTES[dtype], DTYPE_BYTES[out_dtype or dtype])
    repeats = ceil_div(n * elem, hw.aiv.vector_repeat_bytes)
    return math.ceil(hw.aiv.vector_startup_cycles + repeats * hw.aiv.vector_cycles_per_repeat[op])  # whole cycles


@pytest.mark.parametrize("op, n, dtype, out_dtype", [
    ("add", 1000, "fp16", None),
    ("add", 128, "fp16", None),     # exactly one repeat
    ("add", 129, "fp16", None),     # one element over: two repeats
    ("exp", 1000, "fp16", None),
    ("add", 1000, "fp32", None),    # fp32: twice the repeats of fp16
    ("cast", 1000, "fp16", "fp32"),  # counted at the wider dtype
    ("cast", 1000, "fp32", "fp16"),
    ("div", 4096, "fp16", None),
])
def test_vector_op_cycles(op, n, dtype, out_dtype):
    r = simulate(aiv_kernel(HW, [VecOp(op, n, dtype, dst=0, srcs=(32768,), out_dtype=out_dtype)]), HW)
    _, _, name, start, end, _ = only(r, "AIV0", "V")
    assert name == op
    assert end - start == vec_cycles(HW, op, n, dtype, out_dtype)


# the rounding tests below want the factor's part alone in the fraction: a whole start-up
# (the shipped one is fitted, fractional) and, for exp, a factor whose repeats are whole
WHOLE_STARTUP = {"aiv.vector_startup_cycles": 68.0, "aiv.vector_cycles_per_repeat.exp": 4.0}


def test_exp_costs_its_factor_times_add():
    hw = load_hw("ascend910b2", overrides=WHOLE_STARTUP)
    n = 8192
    add = only(simulate(aiv_kernel(hw, [VecOp("add", n, dst=0)]), hw), "AIV0", "V")
    exp = only(simulate(aiv_kernel(hw, [VecOp("exp", n, dst=0)]), hw), "AIV0", "V")
    startup = hw.aiv.vector_startup_cycles
    f = hw.aiv.vector_cycles_per_repeat
    assert f["exp"] > f["add"]
    assert (exp[4] - exp[3] - startup) * f["add"] == (add[4] - add[3] - startup) * f["exp"]


def test_fractional_cost_factor_rounds_up_once_per_instruction():
    hw = load_hw("ascend910b2", overrides={**WHOLE_STARTUP, "aiv.vector_cycles_per_repeat.add": 1.5})
    n = 7 * hw.aiv.vector_repeat_bytes // 2  # 7 repeats of fp16
    r = simulate(aiv_kernel(hw, [VecOp("add", n, dst=0)]), hw)
    _, _, _, start, end, _ = only(r, "AIV0", "V")
    assert end - start == hw.aiv.vector_startup_cycles + math.ceil(7 * Fraction("1.5"))


# ------------------------------------------------------------------ double buffering

TILE = 32768  # bytes of fp16 per tile


def stage_cycles(hw, tile: int, op: str) -> tuple[int, int, int]:
    """(copy-in, vector op, copy-out) cycles of one tile, alone on the chip: a copy is
    one segment, so it pays the DMA start-up once and its segment time (one
    burst-rounded tile per dma.vector_segment_cycles) overlaps the data without binding."""
    assert -(-tile // hw.dma.burst_bytes) * hw.dma.burst_bytes / hw.dma.vector_segment_cycles > max(
        hw.aiv.gm_read_bytes_per_cycle, hw.aiv.gm_write_bytes_per_cycle)
    dma = hw.dma.startup_cycles
    t_in = dma + ceil_div(tile, min(hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle))
    t_v = vec_cycles(hw, op, tile // 2, "fp16")
    t_out = dma + ceil_div(tile, hw.aiv.gm_write_bytes_per_cycle)
    return t_in, t_v, t_out


def per_iteration(hw, double: bool, op: str, iters: int = 16) -> float:
    """Steady-state cycles per tile: the difference between 2*iters and iters tiles."""
    short = simulate(pipeline_kernel(hw, TILE, iters, double, op), hw).kernels[0].cycles
    long = simulate(pipeline_kernel(hw, TILE, 2 * iters, double, op), hw).kernels[0].cycles
    return (long - short) / iters


# the closed form of stage_cycles: every copy pays its DMA start-up (no queue of copies,
# dma.outstanding 1: tests/test_engine_dma_queue.py has the queue); a vector instruction's
# start-up short enough (the unfitted 8 cycles) that copy-out, the slowest stage of an
# add, is at least the other two stages' sum
SERIAL_COPIES = {"dma.outstanding": 1, "aiv.vector_startup_cycles": 8}


@pytest.mark.parametrize("op, over, bound", [
    ("add", {}, "MTE3"),                                      # copy-out (64 B/cycle) is the slowest stage
    ("exp", {"aiv.vector_cycles_per_repeat.exp": 12}, "V"),   # a costly vector op is
])
def test_double_buffering_runs_at_the_slowest_stage(op, over, bound):
    hw = load_hw("ascend910b2", overrides=SERIAL_COPIES | over)
    stages = stage_cycles(hw, TILE, op)
    assert ("MTE2", "V", "MTE3")[stages.index(max(stages))] == bound
    # with two slots the slowest stage can only hide the others if it is at least their sum
    assert max(stages) >= sum(stages) - max(stages)
    assert per_iteration(hw, True, op) == pytest.approx(max(stages), rel=0.03)
    assert per_iteration(hw, False, op) == pytest.approx(sum(stages), rel=0.03)


def test_double_buffering_timeline_overlaps_copy_in_with_copy_out():
    r = simulate(pipeline_kernel(HW, TILE, 8, True), HW)
    ins = intervals(r, "AIV0", "MTE2", "GM->UB")
    outs = intervals(r, "AIV0", "MTE3", "UB->GM")
    assert len(ins) == len(outs) == 8
    # the copy-in of tile j+1 starts before the copy-out of tile j ends
    assert all(ins[j + 1][3] < outs[j][4] for j in range(7))
    single = simulate(pipeline_kernel(HW, TILE, 8, False), HW)
    ins = intervals(single, "AIV0", "MTE2", "GM->UB")
    outs = intervals(single, "AIV0", "MTE3", "UB->GM")
    assert all(ins[j + 1][3] >= outs[j][4] for j in range(7))
    assert r.kernels[0].cycles < single.kernels[0].cycles


def test_fractional_cost_factor_has_no_float_overshoot():
    factor, repeats = "1.1", 50
    hw = load_hw("ascend910b2", overrides={**WHOLE_STARTUP, "aiv.vector_cycles_per_repeat.add": float(factor)})
    exact = Fraction(factor) * repeats  # in exact arithmetic: a whole number of cycles
    assert exact.denominator == 1
    n = repeats * hw.aiv.vector_repeat_bytes // 2  # fp16
    r = simulate(aiv_kernel(hw, [VecOp("add", n, dst=0)]), hw)
    _, _, _, start, end, _ = only(r, "AIV0", "V")
    assert end - start == hw.aiv.vector_startup_cycles + exact


def test_a_run_of_fixed_cost_instructions_counts_as_its_instructions():
    """Consecutive fixed-cost instructions run as one step of their pipe
    (compile.FixedRun): the pipe ends, is busy and counts flops and local bytes as
    the instructions do one by one, at either trace level, and an instruction
    trace still shows each one."""
    from npusim.engine.compile import FixedRun, compile_program
    from npusim.isa import CoreType, Loop

    ops = [VecOp("add", 4096, dst=0), VecOp("exp", 1000, dst=0), VecOp("mul", 3000, dst=0, flops_per_elem=2)]
    kernel = aiv_kernel(HW, [Loop("i", 3, tuple(ops))])
    ((_, stream, _),) = compile_program(kernel.aiv[0], CoreType.AIV, HW)
    (entry,) = stream[0].body
    assert isinstance(entry, FixedRun) and len(entry.entries) == len(ops)
    detailed, plain = simulate(kernel, HW), simulate(kernel, HW, trace="kernel")
    ivs = intervals(detailed, "AIV0", "V")
    assert [iv[2] for iv in ivs] == ["add", "exp", "mul"] * 3
    assert all(b[3] == a[4] for a, b in zip(ivs, ivs[1:]))  # back to back, each its own cost
    for r in (detailed, plain):
        s = r.kernels[0].stats
        assert s.busy_cycles["AIV.V"] == sum(iv[4] - iv[3] for iv in ivs)
        assert s.flops == 3 * (4096 + 1000 + 2 * 3000)
        assert s.instructions == 9
