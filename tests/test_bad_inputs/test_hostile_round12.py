"""Bad-input catalogue, round 12's hostile sweep of `npusim op`, `hw`, `compare`,
`validate`, `cache` and the Python API. Each case is one line naming the op, flag, file
or key and what was expected; nothing runs and nothing is written."""

from __future__ import annotations

import pytest

from cli_check import fails_cleanly

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
