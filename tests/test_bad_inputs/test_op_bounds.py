"""Bad-input catalogue, `npusim op` parameters past what the engine simulates (issue 35):
a collective's buffer, a matmul's work, an op's tensors larger than the device's HBM.
Each is one line naming the parameter, its value and the bound, before anything is
simulated (they were a 32-bit tag ValueError, half a minute without a word, a run
without end); the largest accepted values lower."""

from __future__ import annotations

import pytest
from cli_check import fails_cleanly
from kernels import deadline

from npusim.errors import ProgramError
from npusim.hw import load_hw
from npusim.ops import lower
from npusim.ops.collectives.lower import ELEMENTS_MAX
from npusim.ops.matmul import WORK_MAX

BAD_OPS = [
    (["all_reduce", "elements=500000000000000000"],
     r"op all_reduce: 'elements' must be <= 4294967296: 500000000000000000$"),
    (["all_gather", "elements=4294967304"], r"op all_gather: 'elements' must be <= 4294967296: 4294967304$"),
    (["all_reduce", "bytes=1000000000000000000"],
     r"op all_reduce: bytes 1000000000000000000 is more than the 8589934592 of 4294967296 fp16 elements a "
     r"collective may have$"),
    (["reduce_scatter", "bytes=1KiB..64GiB", "dtype=fp32"],
     r"op reduce_scatter: bytes 68719476736 is more than the 17179869184 of 4294967296 fp32 elements"),
    # devices=0 divided the buffer by zero before the op's parameter was checked (a ZeroDivisionError)
    (["all_reduce", "devices=0"], r"op all_reduce: 'devices' must be > 1: 0$"),
    (["send_recv", "devices=0", "bytes=1KiB"], r"op send_recv: 'devices' must be > 1: 0$"),
    (["all_reduce", "bytes=1KiB", "dtype=int4"], r"op all_reduce: 'dtype' must be in \('fp16', 'bf16', 'fp32'\) "
                                                 r"\(got 'int4'\)$"),
    (["matmul", "m=2200000", "n=4096", "k=4096"],
     r"op matmul: m=2200000 x n=4096 x k=4096 is 4400128 tiles x K chunks of 128 x 256 x 256, more than the "
     r"4194304 \(2\^22\) npusim simulates \(about a minute\)$"),
    (["matmul", "m=1", "n=16777216", "k=1048576"], r"op matmul: m=1 x n=16777216 x k=1048576 is 268435456 tiles"),
    (["matmul", "m=65536", "n=4096", "k=4096", "tiling.base_m=16", "tiling.base_n=16"],
     r"op matmul: .* is 16777216 tiles x K chunks of 16 x 16 x 256, more than the 4194304"),
    # a W8A16 matmul whose ND weight the vector cores antiquantise (not transposed) had no bound: hours
    (["matmul", "m=100000", "n=100000", "k=100000", "weight_dtype=int8"],
     r"op matmul: m=100000 x n=100000 x k=100000 is 119552942 tiles x K chunks of 128 x 256 x 256, more than the "
     r"4194304 \(2\^22\)"),
    # a grouped matmul's units took no bound: one group of 100000 rows ran for hours
    (["grouped_matmul", "group_sizes=100000", "n=100000", "k=100000"],
     r"op grouped_matmul: group_sizes of 100000 rows x n=100000 x k=100000 is 119552942 tiles x K chunks of "
     r"128 x 256 x 256, more than the 4194304 \(2\^22\)"),
    (["batch_matmul", "batch=3000", "m=1000", "n=4096", "k=4096"],
     r"op batch_matmul: batch=3000 x m=1000 x n=4096 x k=4096 is 6144000 tiles x K chunks"),
    (["add", "shape=1000000000000000"],
     r"op add: its tensors take at least 2000000000000000 bytes of GM \(tensor 'x1': 2000000000000000\), more than "
     r"hbm.hbm_bytes 68719476736$"),
    (["matmul", "m=64", "n=64", "k=64", "--set", "hbm.hbm_bytes=4096"],
     r"op matmul: its tensors take at least \d+ bytes of GM \(tensor '\w+': \d+\), more than hbm.hbm_bytes 4096$"),
    # refused when the tensor is allocated: the lowering built programs for 2^31 sequences first (minutes)
    # the tiling choices looped over the size first: 2^30 splits, 2^27 head_dim chunks (minutes)
    (["decode_attention", "context=1099511627776"],
     r"op decode_attention: its tensors take at least \d+ bytes of GM \(tensor 'k_cache': \d+\), more than"),
    # a FlashAttention of one head of 1,000,000 tokens listed its 30 million key steps (minutes), then ran for hours
    (["flash_attention", "seq_q=1000000", "seq_kv=1000000", "heads=1", "kv_heads=1"],
     r"op flash_attention: batch=1 x heads=1 x seq_q=1000000 x seq_kv=1000000 is 30525391 key steps of 128 queries "
     r"x 256 keys, more than the 4194304 \(2\^22\) npusim simulates \(minutes\)$"),
    (["flash_attention", "head_dim=2147483648"], r"op flash_attention: tiling does not fit L1"),
    # a UB that leaves the W8A16 multi-scale kernel no room to quantise A in: range() with a step of 0 (a ValueError)
    (["matmul", "m=4", "n=256", "k=256", "weight_dtype=int8", "--set", "aiv.ub_bytes=4096"],
     r"op matmul: the multi-scale kernel's quantisation of A needs 512 bytes of UB beside the 3904 its other buffers "
     r"take, more than the 4096 it has$"),
    (["decode_attention", "batch=2147483648"],
     r"op decode_attention: its tensors take at least \d+ bytes of GM \(tensor 'q': \d+\), more than hbm.hbm_bytes"),
    # the vocab's split walked every integer up to shape[-1] looking for divisors (no end in sight)
    (["argmax", "shape=2,1000000000000"],
     r"op argmax: its tensors take at least 4000000000000 bytes of GM \(tensor 'logits': 4000000000000\)"),
    (["top_k", "shape=99999999999999999999999"], r"op top_k: its tensors take at least \d+ bytes of GM"),
    (["argmax", "shape=1,1000000007"],
     r"op argmax: shape\[-1\]=1000000007 has no divisor that makes a chunk fit UB"),
    (["top_k", "shape=1,1000000007"], r"op top_k: shape\[-1\]=1000000007 has no divisor that makes a chunk fit UB"),
]


@pytest.mark.parametrize(("argv", "expect"), BAD_OPS, ids=[" ".join(a) for a, _ in BAD_OPS])
def test_op_past_its_bound_is_one_line(argv, expect, capsys):
    with deadline(30):
        fails_cleanly(["op", *argv, "--no-cache"], capsys, expect, seconds=10)


def test_the_largest_accepted_ops_lower():
    """At the bounds: a matmul of WORK_MAX units (m=2097152 x 4096 x 4096 on the 910B2's
    tiles, about a minute to simulate) and a collective of ELEMENTS_MAX elements lower (in
    fp32 too: input, output and the received chunks fit in 64 GiB of HBM)."""
    hw = load_hw()
    assert WORK_MAX == 2097152 // 128 * (4096 // 256) * (4096 // 256)
    lower("matmul", dict(m=2097152, n=4096, k=4096), hw)
    for dtype in ("fp16", "fp32"):
        lower("all_reduce", dict(elements=ELEMENTS_MAX, dtype=dtype), hw)



def test_a_transpose_of_billions_of_short_rows_is_refused_at_once():
    """The tiling tries tile heights in ascending order until one outgrows UB (listed
    lazily: [2^31, 2] spent over a minute listing 2^26 heights before the first), and a
    tiling of more than TILES_MAX tiles is refused before any is built (minutes)."""
    with deadline(30), pytest.raises(ProgramError, match=r"op transpose of \(2147483648, 2\): \d+ tiles of .* more "
                                                         r"than the 524288 \(2\^19\) npusim simulates"):
        lower("transpose", dict(shape=(2 ** 31, 2)), load_hw())


def test_vocab_divisors_as_the_walk_found_them():
    from npusim.ops.sampling import _divisors

    for n in [*range(1, 400), 32000, 64000, 128256, 151936, 256000, 1 << 20, 2 * 999983]:
        assert _divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


SMALL_MEMORIES = [  # a local memory set too small for an op's buffers: the message names the key that sets it
    (["flash_attention", "--set", "aiv.ub_bytes=1024"],
     r"op flash_attention: tiling does not fit UB: .* UB \(1024 bytes, aiv.ub_bytes\)$"),
    (["embedding", "--set", "aiv.ub_bytes=1024"], r"op embedding: .* does not fit UB \(1024 bytes, aiv.ub_bytes\)$"),
    # it named head_dim alone: not the dtype, nor the bytes a tile needs against the UB's
    (["kv_cache_write", "--set", "aiv.ub_bytes=1024"],
     r"^npusim: error: op kv_cache_write: one token of one head of head_dim=128 in dtype=fp16 \(its K and V in and "
     r"their row out, twice over: 2048 bytes, and 3072 reserved\) does not fit UB \(1024 bytes, aiv.ub_bytes\)$"),
    (["kv_cache_write", "head_dim=16384", "dtype=fp32", "batch=1", "context=64", "--set", "aiv.ub_bytes=262144"],
     r"head_dim=16384 in dtype=fp32 \(.*: 524288 bytes, and 3072 reserved\) does not fit UB \(262144 bytes"),
    (["argmax", "shape=2,64000", "--set", "aiv.ub_bytes=64"],
     r"op argmax: .* fit UB \(64 bytes, aiv.ub_bytes\) at \d+ bytes per element$"),
    (["transpose", "shape=64,64", "--set", "aiv.ub_bytes=64"],
     r"transpose: .* fits UB \(64 bytes, aiv.ub_bytes\) in and out"),
]


@pytest.mark.parametrize(("argv", "expect"), SMALL_MEMORIES, ids=[" ".join(a) for a, _ in SMALL_MEMORIES])
def test_a_local_memory_too_small_names_its_key(argv, expect, capsys):
    fails_cleanly(["op", *argv, "--no-cache"], capsys, expect)
