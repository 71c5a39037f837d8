"""Decode attention (flash-decoding) on the vector cores."""

from __future__ import annotations

import functools

import attrs
import numpy as np
from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import (
    DTYPE_BYTES, Copy, CoreType, Kernel, Program, VecOp, addr, moving, offset, set_flag, wait_flag,
)
from npusim.kvcache import KV_LAYOUTS, KvLayout
from npusim.ops.build import Buffers, align_up, cdiv, line_quantum, pingpong
from npusim.ops.kv_cache import kv_row_bytes
from npusim.ops.reference import attention, group_heads
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector import UB_BLOCK
from npusim.ops.vector_kernels import Stream, streaming_kernel
from npusim.ops.attention.common import (
    check_page_loads, FlashAttentionParams, _below_layers, _BLOCK_HELP, _divides_heads, _DTYPES, GM, _kv_cache,
    _kv_inputs, _KV_LAYOUT_HELP, _LAYER_HELP, _LAYERS_HELP, MTE2, MTE3, page_loads, _pos, STAT, _table_bytes,
    _table_read, UB, V,
)
from npusim.ops.attention.online_softmax import online_softmax


# ================================================================ decode (flash-decoding)


@frozen
class DecodeAttentionParams:
    batch: int = param(8, "sequences, one new token each", validator=_pos)
    heads: int = param(32, "query heads", validator=_pos)
    kv_heads: int = param(32, "K/V heads; fewer than heads is GQA", validator=[_pos, _divides_heads])
    head_dim: int = param(128, "elements per head", validator=_pos)
    context: int = param(4096, "cached tokens the new token attends to (itself included)", validator=_pos)
    dtype: str = param("fp16", "dtype of q, the KV cache and o", validator=_DTYPES)
    kv_layout: str = param("per_layer", _KV_LAYOUT_HELP, validator=validators.in_(KV_LAYOUTS))
    layers: int = param(1, _LAYERS_HELP, validator=_pos)
    layer: int = param(0, _LAYER_HELP, validator=[validators.ge(0), _below_layers])
    block_tokens: int = param(128, _BLOCK_HELP, validator=_pos)

    def kv_cache(self, row_align_bytes: int | None = None) -> KvLayout:
        """The cache read (one layer's view of it)."""
        return KvLayout(self.kv_layout, self.batch, self.kv_heads, self.context, self.head_dim, self.dtype,
                        self.layers, self.layer, self.block_tokens, row_align_bytes)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


@frozen
class DecodeAttentionTiling:
    kv_tile: int = param(0, "keys per UB tile (K and V tiles ping-pong); 0 = most that fit", validator=validators.ge(0))
    splits: int = param(0, "pieces the context of each (batch, kv head) is cut into, one per block; 0 = fill the AIVs",
                        validator=validators.ge(0))


def _decode_buffers(p: DecodeAttentionParams, kc: int, hw: HwConfig) -> tuple[Buffers, dict]:
    """UB of a decode block. contiguous: one buffer of [keys, row] per ping/pong, K at
    the start of each row and V after it (one DMA fills both)."""
    e, d, grp = DTYPE_BYTES[p.dtype], p.head_dim, p.group
    buf = Buffers(hw, "decode_attention")
    if p.kv_layout == "contiguous":
        kv = [buf.alloc(f"kv_ub_{i}", UB, kc * kv_row_bytes(d, p.dtype, hw)) for i in (0, 1)]
        ub = {"k": kv, "v": [a + d * e for a in kv]}
    else:
        ub = {"k": [buf.alloc(f"k_ub_{i}", UB, kc * d * e) for i in (0, 1)],
              "v": [buf.alloc(f"v_ub_{i}", UB, kc * d * e) for i in (0, 1)]}
    ub |= {
        "prod": buf.alloc("products", UB, kc * d * e),
        "q": buf.alloc("q", UB, grp * d * e),
        "s": buf.alloc("scores", UB, grp * kc * 4),
        "p": buf.alloc("probs", UB, grp * kc * e),
        "o": buf.alloc("o_acc", UB, grp * d * 4),
        "opv": buf.alloc("o_tile", UB, d * 4),
        "m": buf.alloc("row_max", UB, grp * STAT),
        "l": buf.alloc("row_sum", UB, grp * STAT),
        "alpha": buf.alloc("rescale", UB, grp * STAT),
        "red": buf.alloc("reduce", UB, grp * STAT),
    }
    if _table_bytes(p, p.context):
        ub["table"] = buf.alloc("block_table", UB, _table_bytes(p, p.context))
    return buf, ub


def choose_decode_tiling(p: DecodeAttentionParams, hw: HwConfig) -> DecodeAttentionTiling:
    """The largest K/V tile that fits UB twice over; splits so that (batch x kv heads x
    splits) blocks fill the AIVs in whole waves, each split at least two tiles long."""
    err = None
    kc = None
    for cand in (512, 256, 128, 64, 32, 16):
        try:
            _decode_buffers(p, cand, hw)
            kc = cand
            break
        except ProgramError as x:
            err = x
    if kc is None:
        raise err
    units, cores = p.batch * p.kv_heads, hw.aiv_count
    best = None
    # assumption: past 4 x cores splits the cost does not fall (more waves of shorter chunks;
    # checked over contexts up to 2^20 and 1 to 1024 units): the bound keeps a context of
    # 2^40 from looping 2^30 times before its tensors are refused
    for s in range(1, min(max(1, p.context // (2 * kc)), 4 * cores) + 1):
        chunk = align_up(cdiv(p.context, s), kc)
        n = cdiv(p.context, chunk)
        cost = cdiv(units * n, cores) * (chunk + 2 * kc)  # a block also loads q, stores its partial
        if best is None or cost < best[0]:
            best = (cost, n)
    return DecodeAttentionTiling(kv_tile=kc, splits=best[1])


def reference_decode_attention(p: DecodeAttentionParams, x, specs, ctx) -> dict:
    """One new token per sequence: q and o [batch, heads, head_dim] (token-major with
    seq 1, the same bytes as BSND), over the first ctx.lengths[b] keys of sequence
    b's cache (its new token sits at position L - 1: build.py's decode convention).
    Scores and softmax in fp32; P stored in q's dtype before P V, as the kernel casts it."""
    q = x["q"].reshape(p.batch, p.heads, 1, p.head_dim)
    k, v = (group_heads(t, p.group) for t in p.kv_cache().unpack(x))  # [batch, heads, context, head_dim]
    visible = np.arange(p.context)[None, :] < np.array(ctx.lengths)[:, None]  # [batch, context]
    o = attention(q, k, v, visible[:, None, None, :], lambda a: ctx.store(a, specs["q"].dtype))
    return {"o": o.reshape(p.batch, p.heads, p.head_dim)}


def on_cube(p: DecodeAttentionParams) -> bool:
    """Whether decode attention runs on the cube (see lower_decode_attention)."""
    return p.group > 1 or p.dtype != "fp16"


def _decode_on_cube(p: DecodeAttentionParams, hw: HwConfig, gm: GmArena) -> Lowered:
    """Decode attention as FlashAttention over [batch, kv_heads, group, head_dim] queries:
    q's heads of one KV head are consecutive ([batch, heads, head_dim]), so they are a
    group x head_dim tile of rows, and every KV head is read once for its whole group."""
    from npusim.ops.attention.flash import lower_flash_attention  # here: flash imports decode's helpers' module

    packed = FlashAttentionParams(batch=p.batch, heads=p.kv_heads, kv_heads=p.kv_heads, head_dim=p.head_dim,
                                  seq_q=p.group, seq_kv=p.context, causal=False, dtype=p.dtype,
                                  kv_layout=p.kv_layout, layers=p.layers, layer=p.layer, block_tokens=p.block_tokens)
    # its errors name the op the user asked for, not the kernel it runs as
    low = lower_flash_attention(packed, hw, gm, None, op_name="decode_attention (run as flash_attention on the cube)")
    kernels = [attrs.evolve(k, name="decode_attention", op_type="decode_attention") for k in low.kernels]
    qs = (p.batch, p.heads, 1, p.head_dim)  # as the vector kernel lists them
    return attrs.evolve(low, op_type="decode_attention", params=p, kernels=kernels,
                        inputs=[TensorInfo("q", qs, p.dtype), *low.inputs[1:]], outputs=[TensorInfo("o", qs, p.dtype)])


@register("decode_attention", DecodeAttentionParams, DecodeAttentionTiling, reference=reference_decode_attention,
          ins=("q",), outs=("o",), kv="read")
def lower_decode_attention(p: DecodeAttentionParams, hw: HwConfig, gm: GmArena,
                           tiling: DecodeAttentionTiling | None) -> Lowered:
    """Decode attention: one new token per sequence over its KV cache (flash-decoding).

    Each (batch, kv head) has its context cut into `splits` pieces, one AIV block
    each: the block streams K and V tiles through UB (ping-pong) and keeps a running
    max, sum and output for the group's query heads; its partial (o, max, sum) goes
    to a workspace; a second AIV kernel combines the partials of every head
    (rescale by exp(max_i - max), sum, divide) and writes o.

    Why the vector cores: a decode step is a GEMV per head - 2 FLOPs per cached
    element read, `group` times over under GQA - so it is bound by HBM, not by
    arithmetic. The 48 AIVs have twice the cores (and GM ports) of the 24 AICs, and
    doing it on the AIVs avoids the cube <-> vector round trip through GM that a MIX
    kernel would need for every tile (S out, P back, partial O out). The vector cost
    per cached byte grows with the group: past about 4-6 query heads per KV head
    (kv_heads << heads) the dot products, not HBM, would set the pace and the cube,
    with the group's heads as M, would be the better engine.

    That is CANN's rule on the 910B (its incremental attention takes the all-vector
    kernel only for one query head per KV head in fp16; hicann/ops-transformer
    incre_flash_attention tiling_check.cpp), and npusim's (on_cube): with a group, or
    in bf16, the op is FlashAttention's MIX kernel with each KV head's group of query
    heads as the rows of one Q tile (_decode_on_cube).

    The KV cache is read in kv_layout (`layer` of `layers`): per_layer, a tile of K and
    one of V are one segment each; contiguous, one DMA brings a tile's K and V together
    (one segment per tile: its rows hold both, and the vector ops read K and V out of
    the rows with their repeat stride) - a kernel author would not split it into two
    strided half-row reads; paged, one segment per block of K and of V, at the
    physical blocks the block table names (read once per block of the kernel), so the
    tiles are not looped."""
    if on_cube(p):
        return _decode_on_cube(p, hw, gm)
    auto = None if tiling and tiling.kv_tile and tiling.splits else choose_decode_tiling(p, hw)
    t = tiling or auto
    kc = t.kv_tile or auto.kv_tile
    buf, ub = _decode_buffers(p, kc, hw)
    buffers = tuple(buf.buffers)  # one object for every program: verify checks alike programs as one (verify_alike)
    e, d, grp = DTYPE_BYTES[p.dtype], p.head_dim, p.group
    units = p.batch * p.kv_heads
    if t.splits > cdiv(p.context, kc):  # a split is at least one tile: more would run fewer, as printed
        raise ProgramError(f"op decode_attention: tiling splits={t.splits} exceeds the {cdiv(p.context, kc)} "
                           f"kv_tile={kc} tiles of context={p.context}")
    chunk = align_up(cdiv(p.context, t.splits or auto.splits), kc)
    splits = cdiv(p.context, chunk)
    Q = gm.tensor("q", p.batch * p.heads * d * e)
    if (p.head_dim * DTYPE_BYTES[p.dtype]) % UB_BLOCK:  # every layout: the kernels' UB rows are whole heads
        raise ProgramError(f"op decode_attention: head_dim={p.head_dim} makes a head "
                           f"{p.head_dim * DTYPE_BYTES[p.dtype]} bytes, not a multiple of {UB_BLOCK} (UB operand "
                           "alignment)")
    cache = _kv_cache(p, hw, gm, "decode_attention")
    O = gm.tensor("o", p.batch * p.heads * d * e)
    paged, together = p.kv_layout == "paged", p.kv_layout == "contiguous"
    if paged:  # every split's tiles start kc keys apart
        check_page_loads("decode_attention", f"batch={p.batch} x kv_heads={p.kv_heads} x context={p.context}",
                         2 * units * page_loads(p.context, kc, p.block_tokens), p.block_tokens)
    pitch = cache.token_pitch()
    Wo = gm.tensor("partial_o", units * grp * splits * d * 4)
    Ws = gm.tensor("partial_stats", units * grp * splits * STAT)

    def tile_ops(nk: int) -> list:
        """Scores of the group's heads for nk keys, online softmax, P V into the accumulators."""
        n, ns = grp * nk, grp * STAT // 4
        ops = []
        for h in range(grp):  # q_h . k for every key: multiply (q_h broadcast), reduce over head_dim
            ops += [VecOp("mul", nk * d, p.dtype, ub["prod"], (ub["k"][0],)),
                    VecOp("reduce_sum", nk * d, p.dtype, ub["s"] + h * kc * 4, (ub["prod"],), "fp32", nk)]
        ops += online_softmax(n, ns, ub["s"], ub["m"], ub["l"], ub["alpha"], ub["red"], ub["p"], p.dtype)
        for h in range(grp):  # o_h = o_h * alpha_h + sum over keys of p_h,key * v_key
            o_h = ub["o"] + h * d * 4
            ops += [VecOp("mul", nk * d, p.dtype, ub["prod"], (ub["v"][0],)),
                    VecOp("add", nk * d, p.dtype, ub["opv"], (ub["prod"],), "fp32", d),
                    VecOp("mul", d, "fp32", o_h, (o_h,)),  # x alpha_h (broadcast)
                    VecOp("add", d, "fp32", o_h, (o_h, ub["opv"]))]
        return ops

    @functools.cache
    def tile_work(nk: int, x: int) -> tuple:
        """tile_ops(nk) on buffer set x: the same instructions in every tile of that size
        (built once per kernel; a paged cache has a program per block)."""
        moves = {ub["k"][0]: ub["k"][x], ub["v"][0]: ub["v"][x]}
        return tuple(o.moved(o.dst, tuple(moves.get(s, s) for s in o.srcs)) for o in tile_ops(nk))

    def loads(kv: dict, b: int, h: int, x: int, pos: int, nk: int, j_tokens: int) -> list:
        """MTE2 copies of tile (pos, nk keys) of KV head (b, h) into buffer set x; the
        tile moves by j_tokens per iteration of loop j (0: not in a loop). kv: the GM
        address (int or Affine in `block`) of token 0 of the block's K and V head."""
        if paged:
            out = []
            for which in "kv":
                off = 0
                for a, n in cache.runs(which, b, h, pos, nk):
                    out.append(Copy(GM, UB, a, ub[which][x] + off, n * d * e))
                    off += n * d * e
            return out
        tokens = moving(pos, "j", j_tokens)
        if together:  # the rows carry K and V: one segment
            return [Copy(GM, UB, offset(kv["k"], tokens, pitch), ub["k"][x], nk * pitch)]
        return [Copy(GM, UB, offset(kv[w], tokens, pitch), ub[w][x], nk * d * e) for w in "kv"]

    def kv_head(which: str, u: int) -> int:
        """GM address of token 0 of K or V of unit u (= batch * kv_heads + head)."""
        return cache.token_addr(which, *divmod(u, p.kv_heads), 0)

    def program(u: int, sp: int, blk: int, n: int) -> Program:
        """The program of split sp of units u .. u+n-1, run by blocks blk .. blk+n-1: every
        address is unit u's at block blk and moves by one unit per block."""
        b, h = divmod(u, p.kv_heads)

        def moving(a: int, per_unit: int):
            """Address a (of unit u) moving by per_unit bytes per block of the run."""
            return addr(a - blk * per_unit, block=per_unit) if n > 1 else a

        kv = {w: moving(kv_head(w, u), kv_head(w, u + 1) - kv_head(w, u) if n > 1 else 0) for w in "kv"}
        c0 = sp * chunk
        n_keys = min(chunk, p.context - c0)
        full, tail = divmod(n_keys, kc)
        head = _table_read(cache, b, c0 // p.block_tokens, (c0 + n_keys - 1) // p.block_tokens, UB,
                           ub["table"]) if paged else []
        body = head + [
                set_flag(V, MTE2, 0), set_flag(V, MTE2, 1),
                Copy(GM, UB, moving(Q.addr + u * grp * d * e, grp * d * e), ub["q"], grp * d * e),
                set_flag(MTE2, V, 2),
                VecOp("dup", grp * STAT // 4, "fp32", ub["m"], flops_per_elem=0),
                VecOp("dup", grp * STAT // 4, "fp32", ub["l"], flops_per_elem=0),
                VecOp("dup", grp * d, "fp32", ub["o"], flops_per_elem=0),
                wait_flag(MTE2, V, 2)]

        def tile(nk: int, first: int, in_loop: bool):
            def make(x: int, j_off: int) -> list:
                pos = c0 + first + j_off * nk
                return [wait_flag(V, MTE2, x), *loads(kv, b, h, x, pos, nk, 2 * nk if in_loop else 0),
                        set_flag(MTE2, V, x), wait_flag(MTE2, V, x),
                        *tile_work(nk, x), set_flag(V, MTE2, x)]
            return make

        if paged:  # every tile its own blocks: unrolled
            for j in range(full):
                body += tile(kc, 0, False)(j % 2, j)
        else:
            body += pingpong("j", full, tile(kc, 0, True))
        if tail:
            body += tile(tail, full * kc, False)(full % 2, 0)
        part = u * grp * splits + sp  # partials [query head, split, ...]: the combine reads a head's in one row
        body += [set_flag(V, MTE3, 0), wait_flag(V, MTE3, 0),
                 Copy(UB, GM, ub["o"], moving(Wo.addr + part * d * 4, grp * splits * d * 4), d * 4, grp, d * 4,
                      splits * d * 4),
                 Copy(UB, GM, ub["m"], moving(Ws.addr + part * STAT, grp * splits * STAT), STAT, grp, STAT,
                      splits * STAT),
                 wait_flag(V, MTE2, 0), wait_flag(V, MTE2, 1)]
        return Program(body, buffers)

    # Block order: the splits of a few units at a time (split 0 of units u .. u+g-1, then
    # split 1, ...): a run of a split's blocks moves by one unit per block in every
    # address (q, K, V, the partials) and shares one Program - with splits = 1, every
    # block does. g is the units whose q and partials fill whole L2 lines, so blocks that
    # share a line still run side by side, as in the unit-major order (block u * splits
    # + sp) this replaces, and the L2 sees the same reuse. A run also ends where the KV
    # heads are not equally spaced (contiguous: the other layers sit between two
    # sequences). Paged: addresses are data (the block table), one program per block.
    per_unit = (grp * d * e, grp * splits * d * 4, grp * splits * STAT)  # q, partial_o, partial_stats
    g = 1 if paged else line_quantum(hw, *per_unit)
    order = [(u, sp) for u0 in range(0, units, g) for sp in range(splits) for u in range(u0, min(units, u0 + g))]
    progs: list[Program] = []
    while len(progs) < len(order):
        u, sp = order[len(progs)]
        n = 1
        while not paged and len(progs) + n < len(order) and order[len(progs) + n] == (u + n, sp) and all(
                kv_head(w, u + n) - kv_head(w, u) == n * (kv_head(w, u + 1) - kv_head(w, u)) for w in "kv"):
            n += 1
        progs += [program(u, sp, len(progs), n)] * n
    if all(x is progs[0] for x in progs):  # every block runs one program: verified and compiled once
        progs = progs[:1]
    k1 = Kernel("decode_attention", CoreType.AIV, len(order), aiv=progs, gm=[Q, *cache.tensors, O, Wo, Ws],
                op_type="decode_attention")

    rows = p.batch * p.heads
    o_row, s_row, out_row = splits * d * 4, splits * STAT, d * e
    out_pitch = align_up(out_row, 32)

    def combine(nr, ub_in, ub_out, tmp, consts):
        """max over the splits, weights exp(m_i - max), o = sum(w_i o_i) / sum(w_i l_i)."""
        n, ns, nd = nr * splits * d, nr * splits * STAT // 4, nr * out_pitch // e
        w, tot = tmp[0], tmp[1]
        return [VecOp("reduce_max", ns, "fp32", tot, (ub_in[1],), out_n=nr * 8),
                VecOp("sub", ns, "fp32", w, (ub_in[1],)), VecOp("exp", ns, "fp32", w, (w,)),
                VecOp("mul", ns, "fp32", w, (w, ub_in[1])),
                VecOp("reduce_sum", ns, "fp32", tot, (w,), out_n=nr * 8),
                VecOp("mul", n, "fp32", ub_in[0], (ub_in[0],)),
                VecOp("add", n, "fp32", ub_in[0], (ub_in[0],), out_n=nr * d),
                VecOp("div", nr * d, "fp32", ub_in[0], (ub_in[0],)),
                VecOp("cast", nd, "fp32", ub_out[0], (ub_in[0],), p.dtype, flops_per_elem=0)]

    quantum = line_quantum(hw, o_row, s_row, out_row)
    quantum = quantum if rows >= 4 * quantum * hw.aiv_count else 1
    k2 = streaming_kernel(
        "decode_attention_combine", "decode_attention_combine", hw, rows,
        [Stream(Wo, o_row), Stream(Ws, s_row)],
        [Stream(O, out_row, 0, 0, out_pitch if out_pitch != out_row else 0)],
        combine, tmp_row_bytes=[s_row, STAT], quantum=quantum)
    qs = (p.batch, p.heads, 1, d)
    ins = [TensorInfo("q", qs, p.dtype), *_kv_inputs(cache)]
    outs = [TensorInfo("o", qs, p.dtype)]
    return Lowered(
        op_type="decode_attention", params=p, tiling=attrs.evolve(t, kv_tile=kc, splits=splits),
        kernels=[k1, k2], flops=4.0 * p.batch * p.heads * p.context * d,
        min_gm_bytes=float(sum(x.nbytes for x in ins + outs)), unit="vector", inputs=ins, outputs=outs,
        workspace_bytes=Wo.nbytes + Ws.nbytes,
    )
