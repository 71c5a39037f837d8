"""Bad-input catalogue, round 12's hostile sweep of `npusim op`, `hw`, `compare`,
`validate`, `cache` and the Python API. Each case is one line naming the op, flag, file
or key and what was expected; nothing runs and nothing is written."""

from __future__ import annotations

import pytest

from cli_check import fails_cleanly, one_line_error
from kernels import deadline

from npusim.errors import ConfigError, ProgramError
from npusim.hw import load_hw
from npusim.ops import lower, simulate_op
from npusim.ops.attention.common import page_loads

# ---- op: decode attention on the cube

# A GQA or bf16 decode runs as FlashAttention's MIX kernel; its errors said
# 'op flash_attention: ...', an op the user had not asked for.
CUBE_DECODES = [
    (["decode_attention", "dtype=bf16", "--set", "aiv.ub_bytes=1024"],
     r"^npusim: error: op decode_attention \(run as flash_attention on the cube\): tiling does not fit UB: .* UB "
     r"\(1024 bytes, aiv.ub_bytes\)$"),
    (["decode_attention", "heads=64", "kv_heads=32", "head_dim=65536", "batch=1", "context=64"],
     r"^npusim: error: op decode_attention \(run as flash_attention on the cube\): tiling does not fit L1"),
]


@pytest.mark.parametrize(("argv", "expect"), CUBE_DECODES, ids=[" ".join(a) for a, _ in CUBE_DECODES])
def test_a_decode_on_the_cube_names_the_op_asked_for(argv, expect, capsys):
    fails_cleanly(["op", *argv, "--no-cache"], capsys, expect)


def test_the_flash_lowering_builds_its_messages_with_the_op_name_given():
    """Decode on the cube rewrote FlashAttention's message text (str.replace); the op name
    is now given to the lowering, whose every message starts with it."""
    from npusim.ops.attention import FlashAttentionParams
    from npusim.ops.attention.flash import lower_flash_attention
    from npusim.ops.registry import GmArena

    params = FlashAttentionParams(batch=1, heads=8, kv_heads=8, head_dim=128, seq_q=4, seq_kv=64)
    for overrides, expect in (({"aiv.ub_bytes": 1024}, r"tiling does not fit UB"),
                              ({"chip.aiv_per_aic": 1}, r"its MIX kernel splits each q tile's rows between 2 AIVs")):
        one_line_error(lambda: lower_flash_attention(params, load_hw("ascend910b2", overrides), GmArena(), None,
                                                     op_name="decode_attention (run as flash_attention on the cube)"),
                       ProgramError, r"^op decode_attention \(run as flash_attention on the cube\): " + expect)


# ---- op: a paged KV cache of tiny blocks

# Paged reads are unrolled, one load per block a tile touches: decode of 8 x 32 heads x
# 8192 tokens in blocks of one token was 4 million loads (two minutes, 4 GB) before a word;
# longer contexts ran out of memory.
PAGED = [
    (["decode_attention", "kv_layout=paged", "block_tokens=1", "context=4097"],
     r"op decode_attention: batch=8 x kv_heads=32 x context=4097 read in blocks of block_tokens=1 is 2097664 block "
     r"loads of K and V, more than the 2097152 \(2\^21\) npusim simulates \(about a minute\)$"),
    (["flash_attention", "kv_layout=paged", "block_tokens=3"],
     r"op flash_attention: batch=1 x heads=32 x seq_q=4096 x seq_kv=4096 read in blocks of block_tokens=3 is "
     r"2818048 block loads of K and V, more than the 2097152"),
    (["decode_attention", "kv_layout=paged", "block_tokens=1", "context=8192", "dtype=bf16"],
     r"op decode_attention \(run as flash_attention on the cube\): batch=8 x heads=32 x seq_q=1 x seq_kv=8192 read "
     r"in blocks of block_tokens=1 is 4194304 block loads"),
]


@pytest.mark.parametrize(("argv", "expect"), PAGED, ids=[" ".join(a) for a, _ in PAGED])
def test_a_paged_read_of_too_many_blocks_is_one_line(argv, expect, capsys):
    with deadline(30):
        fails_cleanly(["op", *argv, "--no-cache"], capsys, expect, seconds=10)


@pytest.mark.parametrize("block_tokens", [1, 3, 64, 100, 128, 5000])
@pytest.mark.parametrize("step", [16, 64, 128, 256])
@pytest.mark.parametrize("keys", [1, 127, 1000, 4096])
def test_page_loads_count_the_blocks_each_step_touches(keys, step, block_tokens):
    assert page_loads(keys, step, block_tokens) == sum(
        (k0 + min(step, keys - k0) - 1) // block_tokens - k0 // block_tokens + 1 for k0 in range(0, keys, step))


def test_page_loads_are_the_loads_a_paged_decode_issues(monkeypatch):
    """The bound counts what the lowering builds: one segment per run KvCache.runs gives."""
    from npusim.hw import load_hw
    from npusim.ops import lower
    from npusim.ops.kv_cache import KvCache

    runs, seen = KvCache.runs, []
    monkeypatch.setattr(KvCache, "runs", lambda self, *a: seen.append(len(r := runs(self, *a))) or r)
    p = dict(batch=2, heads=2, kv_heads=2, context=1000, kv_layout="paged", block_tokens=3)
    low = lower("decode_attention", p, load_hw())
    assert sum(seen) == 2 * 2 * 2 * page_loads(1000, low.tiling.kv_tile, 3)


# ---- the Python API: lower and simulate_op

# The CLI's text was checked, a Python value not: m=1.0 was an AttributeError in the
# lowering, True ran as 1, scale nan / inf and cap inf were lowered and simulated.
API_PARAMS = [
    ("matmul", dict(m=1.0), None, r"^op matmul: parameter 'm' expects an int, got 1\.0$"),
    ("matmul", dict(m=True), None, r"^op matmul: parameter 'm' expects an int, got True$"),
    ("matmul", {}, dict(base_m=16.0), r"^op matmul: parameter 'base_m' expects an int, got 16\.0$"),
    ("add", dict(shape=(True, 4096)), None,
     r"^op add: parameter 'shape' expects a tuple of ints \(e\.g\. \(8, 4096\)\), got \(True, 4096\)$"),
    ("scale", dict(scale=float("nan")), None, r"^op scale: parameter 'scale' expects a finite number, got nan$"),
    ("scale", dict(scale=10 ** 400), None, r"^op scale: parameter 'scale' expects a finite number, got 1000"),
    ("exp", dict(base=float("inf")), None, r"^op exp: parameter 'base' expects a finite number, got inf$"),
    ("logit_softcap", dict(cap=float("inf")), None, r"^op logit_softcap: parameter 'cap' expects a finite number"),
    ("scale", dict(scale=False), None, r"^op scale: parameter 'scale' expects a finite number, got False$"),
]


@pytest.mark.parametrize(("op", "params", "tiling", "expect"), API_PARAMS, ids=repr)
def test_lower_checks_python_values_as_the_cli_checks_text(op, params, tiling, expect):
    one_line_error(lambda: lower(op, params, load_hw(), tiling), ConfigError, expect)


def test_lower_takes_python_values_of_the_fields_type():
    """What it took before and still does: ints for int fields (numpy's too), ints for floats."""
    import numpy as np

    hw = load_hw()
    assert lower("matmul", dict(m=np.int64(64)), hw).params.m == 64
    assert lower("scale", dict(scale=2), hw).params.scale == 2
    assert lower("matmul", dict(m=64), hw, dict(base_m=np.int32(16))).tiling.base_m == 16


# They were AttributeErrors ('NoneType' object has no attribute 'hbm') or 'int' object is not iterable.
API_ARGUMENTS = [
    (lambda hw: lower("add", {}, None), r"^lower add: hw: expected an HwConfig \(npusim.load_hw\(name\)\), got None$"),
    (lambda hw: lower("add", {}, "ascend910b2"), r"^lower add: hw: .* got 'ascend910b2'$"),
    (lambda hw: lower("add", 5, hw), r"^lower add: params: expected a mapping of field names to values or its "
                                     r"record \(EltwiseParams\), got 5$"),
    (lambda hw: lower("matmul", {}, hw, 5), r"^lower matmul: tiling: .* \(MatmulTiling\), got 5$"),
    (lambda hw: simulate_op(None, hw), r"^simulate_op: lowered: expected what npusim.ops.lower returns \(a Lowered\), "
                                       r"got None$"),
    (lambda hw: simulate_op(lower("add", {}, hw), None), r"^simulate_op: hw: expected an HwConfig"),
]


@pytest.mark.parametrize(("call", "expect"), API_ARGUMENTS, ids=[e for _, e in API_ARGUMENTS])
def test_lower_and_simulate_op_check_their_arguments(call, expect):
    hw = load_hw()
    one_line_error(lambda: call(hw), TypeError, expect)


# A Lowered simulated on another config than the one it was lowered for returned a
# number: kernels tiled for 48 vector cores, a 192 KB UB or 512-byte lines ran as they were.
OTHER_HW = [
    ({"chip.aic_count": 20}, r"differs in chip.aic_count \(24, then 20\)"),
    ({"aiv.ub_bytes": 131072}, r"differs in aiv.ub_bytes \(196608, then 131072\)"),
    ({"l2.line_bytes": 256}, r"differs in l2.line_bytes \(512, then 256\)"),
]


@pytest.mark.parametrize(("overrides", "expect"), OTHER_HW, ids=[e for _, e in OTHER_HW])
def test_simulate_op_refuses_a_lowering_for_another_config(overrides, expect):
    lowered = lower("add", {}, load_hw("ascend910b2"))
    one_line_error(lambda: simulate_op(lowered, load_hw("ascend910b2", overrides)), ConfigError,
                   r"^simulate_op: op add was lowered for hw 'ascend910b2' and is simulated on 'ascend910b2', which "
                   + expect + ": lower it with the hw it runs on$")


def test_simulate_op_takes_an_equal_config_and_a_lowering_built_by_hand():
    import attrs

    lowered = lower("add", {}, load_hw("ascend910b2"))
    same = simulate_op(lowered, load_hw("ascend910b2"), trace="kernel")  # loaded again: equal, not the same object
    assert simulate_op(attrs.evolve(lowered, hw=None), load_hw("ascend910b2", {"chip.aic_count": 20}),
                       trace="kernel").cycles > 0 and same.cycles > 0
