"""validate --kernels: the lowered programs run on numpy data by the functional
interpreter agree with each op's reference, and a lowering with a planted bug (a
swapped tile offset, a dropped K slice, a skipped vector instruction) fails, named."""

import attrs
import numpy as np
import pytest

from npusim.cli import main
from npusim.errors import ProgramError
from npusim.hw import load_hw
from npusim.isa.interpret import Gm, run_kernel
from npusim.isa.program import Buffer, Copy, CoreType, GmTensor, Kernel, Mem, Pipe, Program, Scalar, SetFlag, VecOp, \
    WaitFlag, shift
from npusim.isa.values import decode, encode
from npusim.ops import layout, lower, matmul_program, rowwise, swiglu_tiles
from npusim.ops.attention import flash_cores
from npusim.passes.validate_kernels import check_op, check_step

HW = load_hw("ascend910b2")
# k3-tiny's shapes: the fused QKV projection (NZ weight, three outputs) in decode, a prefill down_proj
QKV = dict(m=2, n=512, k=256, trans_b=True, format_b="NZ", n_parts=(256, 128, 128))
DOWN = dict(m=128, n=256, k=512, trans_b=True, format_b="NZ")
SMALL = dict(m=64, n=96, k=128)  # ND A and B: both land through the DMA's ND -> NZ conversion


# split K: a zero-fill kernel, then each K piece's partial sum added into C by FixPipe's atomic add
SPLIT_K = dict(m=16, n=256, k=8192)


@pytest.mark.parametrize("params", [QKV, DOWN, SMALL, dict(m=40, n=80, k=1008, trans_b=True), SPLIT_K])
def test_matmul_lowering_matches_its_reference(params):
    c = check_op("matmul", params, HW)
    assert c.status == "pass", c.row()
    assert c.max_rel < 2 ** -9  # fp16 output: within a few roundings (split K: one a piece), not at the edge


@pytest.mark.parametrize("params", [dict(m=40, n=80, k=1000, trans_b=True), dict(m=40, n=80, k=1000, format_a="NZ"),
                                    dict(m=33, n=80, k=1000, dtype="fp32", out_dtype="fp32")])
def test_matmul_with_k_not_a_multiple_of_16(params):
    """Found by this check: the last K slice's L1 -> L0A copy moved bm * sk elements, not
    whole 16-column fractal blocks, so half of the last block's rows never reached L0A.
    It moves whole blocks now (bm * align16(sk)), as the cube reads them."""
    c = check_op("matmul", params, HW)
    assert c.status == "pass", c.row()


def test_the_last_k_slice_moves_whole_fractal_blocks_to_l0a():
    """k=1000: the last slice holds 1000 % 64 = 40 columns of K, 2.5 fractal blocks; MTE1
    moves 3 blocks of the tile's rows."""
    from npusim.isa.program import Mem
    from npusim.isa.walk import unroll

    low = lower("matmul", dict(m=40, n=80, k=1000, trans_b=True), HW)
    body = low.kernels[-1].program(CoreType.AIC, 0).body
    sizes = {c.nbytes for c, _ in unroll(body, {"block": 0, "sub": 0}, 10 ** 5)
             if isinstance(c, Copy) and c.dst is Mem.L0A}
    assert sizes == {40 * 64 * 2, 40 * 48 * 2}, sizes  # the one tile's 40 rows: whole slices, and the last


@pytest.mark.parametrize("op, params", [
    ("rms_norm", dict(shape=(128, 256))), ("add_rms_norm", dict(shape=(2, 256))), ("swiglu", dict(shape=(128, 1024))),
    ("rope", dict(shape=(128, 4, 64))), ("add", dict(shape=(128, 256))), ("gelu", dict(shape=(64, 256))),
    ("swiglu", dict(shape=(4, 1024), dtype="bf16")), ("rms_norm", dict(shape=(4, 256), dtype="fp32")),
    # softmax over a middle dim: all rows in UB (odd and even row counts), and rows in chunks
    ("softmax", dict(shape=(4, 7, 40), dim=1)), ("softmax", dict(shape=(3, 8, 5, 3), dim=1, dtype="bf16")),
    ("softmax", dict(shape=(9, 6), dim=0, dtype="fp32")), ("softmax", dict(shape=(2, 3000, 20), dim=1)),
    # several a packed into a tile (each instruction repeats per a)
    ("softmax", dict(shape=(200, 7, 2), dim=1, dtype="bf16")), ("softmax", dict(shape=(100, 9, 5), dim=1, dtype="fp32")),
])
def test_vector_kernels_match_their_references(op, params):
    c = check_op(op, params, HW)
    assert c.status == "pass", c.row()


@pytest.mark.parametrize("layout, tokens, position", [("contiguous", 1, -1), ("contiguous", 64, 0),
                                                      ("per_layer", 40, 0), ("paged", 40, 100)])
def test_kv_cache_write_puts_every_token_where_the_reference_does(layout, tokens, position):
    c = check_op("kv_cache_write", dict(batch=2, kv_heads=2, head_dim=64, new_tokens=tokens, context=256,
                                        layers=2, layer=1, position=position, layout=layout), HW)
    assert c.status == "pass" and c.max_abs == 0, c.row()


@pytest.mark.parametrize("vocab", [1000, 5000])
def test_embedding_gathers_every_row_where_the_reference_does(vocab, monkeypatch):
    """4,100 tokens on a 16 KiB UB: 85 tokens a core in tiles of 14 rows, which the lowering
    vouches alike (built from three), and with 1,000 rows some cores' tokens wrap around
    the table (those are built tile by tile)."""
    vouched = []
    real = layout.tile_pipeline

    def counting(tiles, direct=False, period=1, alike=0):
        vouched.append(min(alike, len(tiles)) // 2 >= 3)
        return real(tiles, direct, period, alike)

    monkeypatch.setattr(layout, "tile_pipeline", counting)
    hw = load_hw("ascend910b2", {"aiv.ub_bytes": 16384})
    c = check_op("embedding", dict(tokens=4100, vocab=vocab, hidden=256), hw)
    assert c.status == "pass" and c.max_abs == 0, c.row()
    assert any(vouched) and (vocab > 4100 or not all(vouched))


def test_kv_cache_tiles_vouched_alike_lower_as_if_each_were_built(monkeypatch):
    """K3's prefill of 32 x 4096 tokens writes tiles of 64 tokens of one head: a sequence's
    token run is 16 such tiles, which the lowering builds three of."""
    params = dict(batch=32, kv_heads=16, head_dim=128, new_tokens=4096, context=4096, layout="contiguous")
    vouched = lower("kv_cache_write", params, HW).kernels[0]
    real = layout.tile_pipeline
    monkeypatch.setattr(layout, "tile_pipeline", lambda tiles, direct=False, period=1, alike=0:
                        real(tiles, direct, period, 0))
    built = lower("kv_cache_write", params, HW).kernels[0]
    assert [p.body for p in vouched.aiv] == [p.body for p in built.aiv]


FLASH = dict(batch=2, heads=4, kv_heads=2, head_dim=64, seq_q=64, seq_kv=64, kv_layout="contiguous", layers=2)


@pytest.mark.parametrize("op, params", [
    ("decode_attention", dict(batch=2, heads=4, kv_heads=2, head_dim=64, context=64, kv_layout="contiguous",
                              layers=2, layer=1)),  # k3-tiny decode: GQA packed onto the cube (MIX)
    ("flash_attention", FLASH),
    # two key steps of two sub-tiles each (online softmax rescaling), 20 rows per AIV
    ("flash_attention", dict(batch=1, heads=2, kv_heads=2, head_dim=64, seq_q=40, seq_kv=512)),
])
def test_attention_kernels_match_their_references(op, params):
    c = check_op(op, params, HW)
    assert c.status == "pass", c.row()


@pytest.mark.parametrize("params", [
    dict(FLASH, causal=True),  # k3-tiny prefill: one step per tile, its diagonal masked
    dict(FLASH, causal=True, kv_layout="paged"),
    # 40 queries at the end of 512 keys: the last step masked, the earlier ones whole
    dict(batch=1, heads=2, kv_heads=2, head_dim=64, seq_q=40, seq_kv=512, causal=True),
    # 300 keys: short last steps (their last sub-tile's V rows and P V depth: the keys it has)
    dict(batch=1, heads=2, kv_heads=2, head_dim=64, seq_q=300, seq_kv=300, causal=True),
    dict(batch=1, heads=2, kv_heads=1, head_dim=64, seq_q=40, seq_kv=40),  # padding keys masked, not causal
    # GQA-packed (a mixed step's short prompt, speculative tokens): row i is query i % seq_q of its head
    dict(batch=2, heads=4, kv_heads=2, head_dim=64, seq_q=16, seq_kv=64, causal=True),
    dict(batch=1, heads=8, kv_heads=2, head_dim=64, seq_q=7, seq_kv=100, causal=True, kv_layout="paged"),
    # a paged cache's runs of V land as rows of V's fractal blocks (pages of 48 tokens: runs inside a step)
    dict(batch=2, heads=4, kv_heads=2, head_dim=128, seq_q=64, seq_kv=1000, causal=True, kv_layout="paged",
         block_tokens=48),
    # head_dim not whole 16-column fractals (only per-layer caches allow it): Q and V padded in L1
    dict(batch=1, heads=4, kv_heads=2, head_dim=40, seq_q=100, seq_kv=300, causal=True, kv_layout="per_layer"),
    dict(batch=2, heads=4, kv_heads=2, head_dim=72, seq_q=16, seq_kv=64, causal=True, kv_layout="per_layer",
         dtype="bf16"),
])
def test_masked_and_uneven_attention_matches_its_reference(params):
    """Causal or padded steps: the mask is built by the program (an index ramp once, then
    per masked chunk each row's limit, compare, select); short steps, packed GQA rows and
    a head_dim that is not whole fractals are described too."""
    c = check_op("flash_attention", params, HW)
    assert c.status == "pass", c.row()


@pytest.mark.parametrize("bug", ["limit off by one", "sub 1 given sub 0's rows", "no mask"])
def test_a_wrong_causal_mask_fails_named(monkeypatch, bug):
    mask = flash_cores._Vec.mask

    def planted(self, st, row0, rcc, sub1, s):
        if bug == "no mask":
            return []
        out = mask(self, st, row0, rcc, 0 if bug.startswith("sub") else sub1, s)
        if bug == "limit off by one":
            out[0] = attrs.evolve(out[0], scalar=shift(out[0].scalar, 1))
        return out

    monkeypatch.setattr(flash_cores._Vec, "mask", planted)
    c = check_op("flash_attention", dict(FLASH, causal=True), HW)
    assert c.failed and "off by" in c.reason, c.row()


def test_packed_rows_see_what_their_own_query_sees(monkeypatch):
    """Packed GQA rows limited as if they were queries in order (the lowering's old
    assumption: head gi's rows skip (group - 1 - gi) * seq_q keys they see) fail."""
    from npusim.ops.attention import flash

    lower_flash = flash._lower_flash
    monkeypatch.setattr(flash, "_lower_flash", lambda *a, period=0, **kw: lower_flash(*a, **kw))
    c = check_op("flash_attention", dict(batch=2, heads=4, kv_heads=2, head_dim=64, seq_q=16, seq_kv=64, causal=True),
                 HW)
    assert c.failed and "off by" in c.reason, c.row()


def test_k3_tiny_steps_pass_and_say_what_was_not_checked():
    r = check_step("k3-tiny", "optimized", hw=HW)
    text = r.table()
    print("\n" + text)
    assert r.passed and "FAIL" not in text
    ops = {c.op for c in r.checks if c.status == "pass"}
    assert {"matmul", "rms_norm", "add_rms_norm", "swiglu", "rope", "kv_cache_write", "add", "decode_attention",
            "flash_attention"} <= ops  # causal prefill attention too
    assert all(c.reason for c in r.checks if c.status == "not checked")
    assert "rule qkv_proj" in text and "fusion:" in text and "layout:" in text  # which passes and rules fired


# ------------------------------------------------------------------ planted bugs


def test_a_swapped_tile_offset_fails_named(monkeypatch):
    store = matmul_program._Layout.store

    def swapped(self, src, at, *rest):  # the C tile written at (column, row) instead of (row, column)
        return store(self, src, (at[0], at[2], at[1]), *rest)

    monkeypatch.setattr(matmul_program._Layout, "store", swapped)
    c = check_op("matmul", dict(m=256, n=512, k=64), HW)  # 2 x 11 tiles: (0, 48) lands at (48, 0)
    assert c.failed and c.op == "matmul", c.row()


def test_a_dropped_k_slice_fails_named(monkeypatch):
    made = matmul_program.Mmad

    def mmad(m, n, k, dtype, a, b, c, accumulate):  # every odd K slice (the pong L0A buffer) skipped
        return Scalar(1) if a != 0 else made(m, n, k, dtype, a, b, c, accumulate=accumulate)

    monkeypatch.setattr(matmul_program, "Mmad", mmad)
    c = check_op("matmul", SMALL, HW)
    assert c.failed and c.op == "matmul" and "off by" in c.reason, c.row()


def test_a_skipped_vector_instruction_fails_named(monkeypatch):
    ops = rowwise._rms_ops
    monkeypatch.setattr(rowwise, "_rms_ops", lambda *a: [i for i in ops(*a) if getattr(i, "op", "") != "rsqrt"])
    c = check_op("rms_norm", dict(shape=(8, 256)), HW)
    assert c.failed and c.op == "rms_norm", c.row()


def test_a_middle_row_left_out_of_the_sums_fails_softmax_over_a_dim(monkeypatch):
    """The halving tree must fold the middle row of an odd row count: without it the
    column sums miss a row and the softmax over a middle dim is wrong. (Left out of the
    maxima it changes nothing: softmax does not depend on the value subtracted.)"""
    from npusim.ops import softmax_axis

    tree = softmax_axis._tree

    def no_fold(op, rows, q, src, scratch, na=1, slab=0):
        ops = tree(op, rows, q, src, scratch, na, slab)
        return [i for i in ops if not (op == "add" and i.n == q * na and rows > 1)]

    params = dict(shape=(96, 7, 24), dim=1)  # two a packed in a tile
    assert check_op("softmax", params, HW).status == "pass"
    monkeypatch.setattr(softmax_axis, "_tree", no_fold)
    c = check_op("softmax", params, HW)
    assert c.status == "FAIL" and "output 'y' off" in c.row(), c.row()


def test_a_dropped_softmax_scale_fails_attention_named(monkeypatch):
    softmax = flash_cores.online_softmax

    def unscaled(n, *rest):  # the scores' Muls by 1/sqrt(head_dim) left out
        return [i for i in softmax(n, *rest) if not (i.op == "muls" and i.n == n)]

    monkeypatch.setattr(flash_cores, "online_softmax", unscaled)
    c = check_op("flash_attention", FLASH, HW)
    assert c.failed and c.op == "flash_attention", c.row()


def test_a_dropped_cross_core_flag_fails_named(monkeypatch):
    """The AIVs would wait forever: verify(), which the interpreter runs first, counts the
    flags (a deadlock of flags that balance is the interpreter's: tests/test_kernel_hostile.py)."""
    made = flash_cores.CrossSetFlag  # the cube never tells the AIVs that S is ready
    monkeypatch.setattr(flash_cores, "CrossSetFlag", lambda pipe, id: Scalar(1) if id == 0 else made(pipe, id))
    c = check_op("flash_attention", FLASH, HW)
    assert c.failed and c.op == "flash_attention" and "cross flag id 0 AIC -> AIV sub 0 in block 0 cannot balance: " \
        "AIC sets 0 vs AIV sub 0 waits 1" in c.reason, c.row()


def test_a_planted_bug_fails_the_step_and_the_command(monkeypatch, capsys):
    plain = swiglu_tiles.vop

    def without_exp(op, *args, **kw):  # SwiGlu's exp(x) becomes x + 0
        return plain("adds", *args, **{**kw, "scalar": 0.0}) if op == "exp" else plain(op, *args, **kw)

    monkeypatch.setattr(swiglu_tiles, "vop", without_exp)
    assert main(["validate", "--kernels", "--workload", "k3-tiny", "--phase", "decode"]) == 1
    out = capsys.readouterr().out
    assert "swiglu" in next(line for line in out.splitlines() if "FAIL" in line)
    assert out.rstrip().endswith("FAILED")


# ------------------------------------------------------------------ the command line


def test_op_check_passes_and_refuses_what_it_cannot_take(capsys):
    assert main(["op", "matmul", "m=64", "n=96", "k=128", "--check"]) == 0
    assert "PASSED" in capsys.readouterr().out
    assert main(["op", "matmul", "m=4096", "n=4096", "k=4096", "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than the" in err and "elements" in err
    assert main(["op", "no_such_op", "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown op type 'no_such_op'" in err


# ------------------------------------------------------------------ the interpreter itself


def _vector_add(flags: bool) -> tuple[Kernel, Gm, int]:
    """An AIV kernel y = x1 + x2 over 64 fp16, with (or without) the flags between its pipes."""
    base, n = 1 << 20, 64
    x1, x2, y = (GmTensor(name, base + i * 256, n * 2) for i, name in enumerate(("x1", "x2", "y")))
    wait = [WaitFlag(Pipe.MTE2, Pipe.V, 0)]
    sync = [SetFlag(Pipe.MTE2, Pipe.V, 0), *wait] if flags else wait
    body = [Copy(Mem.GM, Mem.UB, x1.addr, 0, n * 2), Copy(Mem.GM, Mem.UB, x2.addr, 256, n * 2), *sync,
            VecOp("add", n, "fp16", 512, (0, 256)), SetFlag(Pipe.V, Pipe.MTE3, 0), WaitFlag(Pipe.V, Pipe.MTE3, 0),
            Copy(Mem.UB, Mem.GM, 512, y.addr, n * 2)]
    gm = Gm(base, 3 * 256)
    gm.write(x1.addr, encode(np.arange(n, dtype=np.float32), "fp16"))
    gm.write(x2.addr, encode(np.full(n, 0.5, dtype=np.float32), "fp16"))
    program = Program(body, [Buffer("ub", Mem.UB, 0, 1024)])
    return Kernel("vadd", CoreType.AIV, 1, aiv=[program], gm=[x1, x2, y]), gm, y.addr


def test_the_interpreter_runs_a_hand_written_kernel():
    k, gm, y = _vector_add(flags=True)
    run_kernel(k, HW, gm)
    assert np.array_equal(decode(gm.read(y, 128), "fp16"), np.arange(64) + 0.5)


def test_a_wait_nobody_sets_fails_named():
    """verify(), which the interpreter runs first, counts the flags; a deadlock of flags that
    balance is the interpreter's to find (tests/test_kernel_hostile.py)."""
    k, gm, _ = _vector_add(flags=False)
    with pytest.raises(ProgramError, match=r"^kernel 'vadd', all blocks, AIV: instr 2 WaitFlag\(src=MTE2, dst=V\): "
                                           r"flag MTE2->V id 0 cannot balance: 0 sets vs 1 waits"):
        run_kernel(k, HW, gm)
