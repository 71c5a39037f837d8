"""A GM transfer in C (npusim/engine/_l2.c, Mover) against the Python it
replaced (tests/memory_reference.py): the burst rounding on random shapes, and whole
runs with an instruction trace - every kernel record and counter, trace interval and
link sample, value and type - on the shipped L2 and on a 1 MiB one, where reads miss,
wait for each other's fills and evict dirty lines that go back to HBM."""

from __future__ import annotations

import re

import memory_reference
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernels import pipeline_kernel, simulate_on_device, whole_run

from npusim.engine import memory
from npusim.engine.memory import burst_cost
from npusim.hw import load_hw

HW = load_hw("ascend910b2")
SMALL_L2 = load_hw("ascend910b2", overrides={"l2.l2_bytes": 1 << 20})

OPS = [
    ("matmul", {"m": "256", "n": "512", "k": "1024"}),
    ("flash_attention", {"seq_q": "256", "seq_kv": "512", "heads": "2", "kv_heads": "1", "causal": "true"}),
    ("decode_attention", {"batch": "2", "context": "512", "kv_layout": "paged"}),
    ("kv_cache_write", {"batch": "2", "context": "256", "layers": "2"}),
    ("trans_data", {"shape": "300,520"}),
    ("copy", {"n": "3000001"}),
]


@given(st.integers(0, 1 << 40), st.integers(1, 5000), st.integers(1, 300), st.integers(0, 20000),
       st.sampled_from([32, 64, 128, 512]))
def test_burst_rounding_is_the_python_rule(addr, nbytes, segments, stride, burst):
    assert burst_cost(addr, nbytes, segments, stride, burst) == memory_reference.burst_cost(
        addr, nbytes, segments, stride, burst)


def _started_and_reference(monkeypatch, simulate, finished: list | None = None) -> tuple[str, str]:
    """The run with the C transfer and with the Python one; `finished` gets how many of
    the Python run's transfers memory.py's _finish finished (a write-back, a miss, a
    wait): the C does those of one member itself, and is held to it here."""
    started = whole_run(simulate())
    with monkeypatch.context() as m:
        finish = memory.MemorySystem._finish
        count = [0]

        def counted(self, *args):
            count[0] += 1
            return finish(self, *args)

        m.setattr(memory.MemorySystem, "_finish", counted)
        m.setattr(memory, "Mover", memory_reference.Mover)
        reference = whole_run(simulate())
    if finished is not None:
        finished.append(count[0])
    return started, reference


@pytest.mark.parametrize("hw", [HW, SMALL_L2], ids=["l2", "small-l2"])
def test_a_group_of_pipelines_transfers_as_in_python(monkeypatch, hw):
    kernel = pipeline_kernel(hw, 8192, 4, True, block_dim=48, block_step=4 * 8192)
    started, reference = _started_and_reference(monkeypatch, lambda: simulate_on_device(kernel, hw))
    assert started == reference


@pytest.mark.parametrize("hw", [HW, SMALL_L2], ids=["l2", "small-l2"])
@pytest.mark.parametrize("op_type, params", OPS, ids=[o for o, _ in OPS])
def test_lowered_operators_transfer_as_in_python(monkeypatch, hw, op_type, params):
    from npusim.ops import lower, simulate_op

    op = lower(op_type, params, hw)
    finished: list = []
    started, reference = _started_and_reference(monkeypatch, lambda: simulate_op(op, hw, trace="instr").run,
                                                finished)
    assert finished[0] > 0  # some transfers needed finishing (a first read misses)
    assert started == reference


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_a_k3_tiny_step_on_a_small_l2_transfers_as_in_python(monkeypatch, phase):
    from npusim.runtime.decoder import run_decoder

    finished: list = []
    started, reference = _started_and_reference(
        monkeypatch, lambda: run_decoder("k3-tiny", SMALL_L2, phase, 2, 128, "optimized", trace="instr").result,
        finished)
    assert finished[0] > 0 and re.search(r"hbm_write_bytes=[1-9]", started)  # dirty lines went back to HBM
    assert started == reference
