"""The pipe's walk and process in C (npusim/engine/_pipe.c) against the Python it
replaced, a SimPy process (tests/pipe_reference.py): whole runs with an instruction
trace must agree in every kernel record and counter, trace interval, block span and
link sample - value and type (the C walk keeps Python's ints and floats). Covers
flags without GM traffic, single and double buffering, a group of identical blocks,
lowered operators (loops, split-K, causal flash attention, the KV cache write) and a
k3-tiny decode step."""

from __future__ import annotations

import math
from functools import lru_cache

import attrs
import pipe_reference
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernels import (GM, GM_A, GM_B, MTE2, MTE3, UB, M, V, aiv_kernel, mix_kernel, pipeline_kernel, simulate_on_device,
                     whole_run)

from npusim.engine import device
from npusim.hw import load_hw
from npusim.isa import (Copy, CrossSetFlag, CrossWaitFlag, GmTensor, Loop, Mmad, PipeBarrier, Scalar, SetFlag, VecOp,
                        WaitFlag, addr)

HW = load_hw("ascend910b2")

OPS = [
    ("matmul", {"m": "128", "n": "256", "k": "512"}),
    ("matmul", {"m": "16", "n": "256", "k": "8192"}),  # split-K
    ("flash_attention", {"seq_q": "256", "seq_kv": "256", "heads": "2", "kv_heads": "2", "causal": "true"}),
    ("decode_attention", {"batch": "2", "context": "512"}),
    ("rms_norm", {"shape": "8,4096"}),
    ("kv_cache_write", {"batch": "2", "context": "256", "layers": "2"}),
]


def _walked_and_reference(monkeypatch, simulate, written=whole_run) -> tuple[str, str]:
    """What simulate() gives (written out by `written`) with the C walk and with the Python."""
    walked = written(simulate())
    with monkeypatch.context() as m:
        m.setattr(device, "start_pipe", pipe_reference.start_pipe)
        reference = written(simulate())
    return walked, reference


def test_flags_between_fixed_cost_instructions_walk_as_in_python(monkeypatch):
    body = [Loop("i", 5, (VecOp("add", 1000, dst=0, srcs=(0,)), SetFlag(V, MTE3, 0), WaitFlag(V, MTE3, 0),
                          VecOp("exp", 300, dst=0, srcs=(0,))))]
    kernel = aiv_kernel(HW, body)
    walked, reference = _walked_and_reference(monkeypatch, lambda: simulate_on_device(kernel, HW))
    assert "WaitFlag" in walked and walked == reference


@pytest.mark.parametrize("double", [False, True])
def test_a_pipeline_walks_as_in_python(monkeypatch, double):
    kernel = pipeline_kernel(HW, 4096, 6, double)
    walked, reference = _walked_and_reference(monkeypatch, lambda: simulate_on_device(kernel, HW))
    assert walked == reference


def test_a_group_of_identical_blocks_walks_as_in_python(monkeypatch):
    kernel = pipeline_kernel(HW, 8192, 4, True, block_dim=48, block_step=4 * 8192)
    walked, reference = _walked_and_reference(monkeypatch, lambda: simulate_on_device(kernel, HW))
    assert walked == reference


@pytest.mark.parametrize("op_type, params", OPS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(OPS)])
def test_lowered_operators_walk_as_in_python(monkeypatch, op_type, params):
    from npusim.ops import lower, simulate_op

    op = lower(op_type, params, HW)
    walked, reference = _walked_and_reference(monkeypatch, lambda: simulate_op(op, HW, trace="instr").run)
    assert walked == reference


def test_a_k3_tiny_decode_step_walks_as_in_python(monkeypatch):
    from npusim.runtime.decoder import run_decoder

    walked, reference = _walked_and_reference(
        monkeypatch, lambda: run_decoder("k3-tiny", HW, "decode", 2, 64, "optimized", trace="instr").result)
    assert walked == reference


def test_a_kernel_on_a_bare_device_keeps_whole_cycles_as_ints(monkeypatch):
    """Started at cycle 0 with no host in front, the clocks stay ints through fixed
    costs, flags and transfers (the links end flows on whole cycles): the C walk
    must keep them ints, as Python did."""
    from npusim.engine.device import Device
    from npusim.engine.events import Environment
    from npusim.engine.stats import Tracer

    def simulate():
        env = Environment()
        tracer = Tracer("instr")
        done = Device(env, HW, tracer).run_kernel(pipeline_kernel(HW, 4096, 4, True, block_dim=2, block_step=16384))
        env.run()
        return done.value, tracer.intervals, tracer.block_spans

    walked, reference = _walked_and_reference(monkeypatch, simulate, repr)
    # int clocks, through a transfer: 54 + dma.startup_cycles + ceil(4096 / the port's bytes
    # a cycle) (one 4 KiB segment: its segment time does not bind)
    end = 54 + HW.dma.startup_cycles + math.ceil(4096 / HW.aiv.gm_read_bytes_per_cycle)
    assert f"'GM->UB', 54, {end}," in walked
    assert walked == reference


@pytest.mark.parametrize("op_type, params", [("matmul", {"m": "8192", "n": "768", "k": "256"}),
                                             ("add", {"shape": "16384,1024"}),
                                             ("rms_norm", {"shape": "4096,4096"})])
def test_marks_are_taken_as_in_python(monkeypatch, op_type, params):
    """Fast-forward's marks (pipe.mark; engine.fastforward): every pipe's clock and counters as
    each iteration of the repeat loop ends, value and type, as the Python takes them; and a
    marked run is the run unmarked."""
    from npusim.engine import Launch, Synchronize, run
    from npusim.engine.fastforward_rewrite import repeat_path
    from npusim.ops import lower

    kernel = lower(op_type, params, HW).kernels[0]
    var = repeat_path(kernel.program(kernel.core_type, 0).body)[1].var  # (of any count)

    def marked(var):
        devices = []

        def setup(d):
            d.mark_var = var
            devices.append(d)
        r = run([Launch(kernel, 0), Synchronize()], HW, "kernel", on_device=setup)
        return r.kernels[0].stats, [(cr.name, cr.kind.value, pipe, marks) for cr, pipe, marks in devices[-1].pipe_marks]

    walked, reference = _walked_and_reference(monkeypatch, lambda: marked(var), repr)
    plain, none = marked(None)
    assert walked == reference and "[(" in walked and not none
    assert walked.startswith(f"({plain!r}, ")  # the stats: as unmarked


# ------------------------------------------------------------------ random programs

@lru_cache(maxsize=None)
def hw_with(outstanding: int, l2_bytes: int | None):
    return load_hw("ascend910b2", overrides={"dma.outstanding": outstanding,
                                             **({"l2.l2_bytes": l2_bytes} if l2_bytes else {})})


@st.composite
def random_programs(draw):
    """An AIV (or MIX) program of random shape: a copy-in -> vector -> copy-out pipeline
    (single or double buffered, strided or misaligned GM segments, a group of blocks or
    not), fixed-cost work before it, in a loop or not, a barrier, and cross-core flags
    to an AIC; on a DMA queue of 1 to 4 copies, and the shipped L2 or one of 16 KiB (where
    reads miss, wait for each other's fills and evict dirty lines). (kernel, hw); test_engine_l2
    runs them too."""
    tile = draw(st.sampled_from([512, 992, 4096]))
    segments = draw(st.integers(1, 3))
    gm_stride = draw(st.sampled_from([None, tile + 32]))
    offset = draw(st.sampled_from([0, 32]))  # a misaligned GM start pays the burst rule
    iters = draw(st.integers(1, 3))
    double = draw(st.booleans())
    op = draw(st.sampled_from(["add", "exp"]))
    block_dim = draw(st.integers(1, 3))
    span = iters * (2 if double else 1) * segments * (gm_stride or tile)
    block_step = draw(st.sampled_from([0, span]))
    slots = 2 if double else 1

    def stage(slot: int) -> list:
        size = segments * tile
        gm_steps = {"j": slots * segments * (gm_stride or tile), "block": block_step}
        at = slot * segments * (gm_stride or tile)
        return [WaitFlag(MTE3, MTE2, slot),
                Copy(GM, UB, addr(GM_A + offset + at, **gm_steps), slot * size, tile, segments, gm_stride, tile),
                SetFlag(MTE2, V, slot), WaitFlag(MTE2, V, slot),
                VecOp(op, size // 2, dst=(2 + slot) * size, srcs=(slot * size,)),
                SetFlag(V, MTE3, slot), WaitFlag(V, MTE3, slot),
                Copy(UB, GM, (2 + slot) * size, addr(GM_B + offset + at, **gm_steps), tile, segments, tile,
                     gm_stride),
                SetFlag(MTE3, MTE2, slot)]

    fixed = draw(st.lists(st.one_of(st.builds(VecOp, st.sampled_from(["add", "exp", "mul"]), st.integers(16, 4096)),
                                     st.builds(Scalar, st.integers(1, 300))), max_size=3))
    body = [SetFlag(MTE3, MTE2, s) for s in range(slots)]
    body += [Loop("j", iters, [x for s in range(slots) for x in stage(s)])]
    body += [WaitFlag(MTE3, MTE2, s) for s in range(slots)]
    repeat = draw(st.integers(1, 3))
    body = ([Loop("r", repeat, fixed)] if repeat > 1 and fixed else fixed) + body
    if draw(st.booleans()):
        body.append(PipeBarrier())
    hw = hw_with(draw(st.integers(1, 4)), draw(st.sampled_from([None, 1 << 14])))
    extent = (block_dim - 1) * block_step + span + offset
    gm = [GmTensor("src", GM_A, extent), GmTensor("dst", GM_B, extent)]
    if draw(st.booleans()):  # the AIVs tell their AIC once their pipeline is through
        kernel = mix_kernel(hw, [CrossWaitFlag(M, 1), Mmad(16, 16, 16)], body + [CrossSetFlag(V, 1)], block_dim)
        kernel = attrs.evolve(kernel, gm=gm)
    else:
        kernel = aiv_kernel(hw, body, block_dim, gm=gm)
    return kernel, hw


# (monkeypatch's changes are undone within each example)
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(random_programs())
def test_random_programs_walk_as_in_python(monkeypatch, program):
    """The C walk and its Python statement (tests/pipe_reference.py) on random programs:
    every kernel record, counter and trace interval agrees, value and type."""
    kernel, hw = program
    walked, reference = _walked_and_reference(monkeypatch, lambda: simulate_on_device(kernel, hw))
    assert walked == reference
