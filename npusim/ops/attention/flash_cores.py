"""FlashAttention: the AIC (cube) and AIV (vector) sides of a block, instruction by
instruction, and how a block reads K and V from the cache."""

from __future__ import annotations

import attrs
from attrs import frozen

from npusim.isa.instructions import l0b_block_bytes
from npusim.isa.program import Copy, CrossSetFlag, CrossWaitFlag, Mmad, SetFlag, VecOp, WaitFlag, moving, offset, shift
from npusim.ops.build import cdiv
from npusim.ops.kv_cache import KvCache
from npusim.ops.layout import gm_copy
from npusim.ops.attention.common import FIX, GM, L0A, L0B, L0C, L1, M, MTE1, MTE2, MTE3, STAT, _table_read, UB, V
from npusim.ops.attention.flash_tiling import (
    _FaGeometry, _K, _O_READY, _P, _P_READY, _Q, _S_FREE, _S_READY, _Step, _Tile, _V,
)
from npusim.ops.attention.online_softmax import Rows, online_softmax, per_row


@frozen
class _KvRead:
    """How a block's cube loads a step of K or V from the cache into L1 (dense [keys, head_dim]).

    per_layer: one segment per step. contiguous: a token's K and V sit side by side in
    one row, but the cube uses K two steps before V and L1 has no room to hold V that
    long (its K, V and P buffers are already ping-ponged), so a kernel author loads
    them separately, each a strided read of one head_dim piece per row (256 of 512
    bytes at head_dim 128 fp16); the rows' other half is in L2 by the time it is
    wanted. paged: one segment per block the step touches, at the physical block the
    table names (addresses are data, so the block's program is its own: a concrete
    sequence and head, no loops)."""

    cache: KvCache
    k: object = 0  # per_layer / contiguous: GM address of token 0 of the block's K head (int or Affine)
    v: object = 0
    seq: int = 0  # paged: the block's sequence and KV head
    head: int = 0

    def load(self, which: str, k0, kt: int, dst: int) -> list:
        """The loads of keys k0 .. k0+kt-1 of K or V, one segment a token (tokens back to
        back in GM are one DMA segment to the engine), landing in L1 as the cube's
        fractal blocks: K as B = K^T [head_dim, keys] (its tokens are B's columns), V
        as B [keys, head_dim]."""
        c = self.cache
        piece = c.layout.head_dim * c.layout.elem_bytes
        land = f"{'dn' if which == 'k' else 'nd'}2nz_b{8 * c.layout.elem_bytes}"
        if c.layout.head_dim % 16:  # no room for the fractals' padding: loaded as before, not described
            return self._unpadded(which, k0, kt, dst, piece)
        if c.layout.layout == "paged":
            assert k0.__class__ is int, "paged steps are not looped: their blocks are data"
            out, off = [], 0
            for a, n in c.runs(which, self.seq, self.head, k0, kt):
                # a run of V is a slice of the rows of V's fractal blocks, one of K its columns from the
                # (off / piece)-th: a conversion of its own only for all of V, or K from a block's start
                whole = n == kt if which == "v" else (off // piece) % 16 == 0
                part = land if whole else "nz_rows"
                out.append(Copy(GM, L1, a, dst + off, piece, n, piece, piece, part))
                off += n * piece
            return out
        pitch = c.token_pitch()
        return [Copy(GM, L1, offset(self.k if which == "k" else self.v, k0, pitch), dst, piece, kt, pitch, piece,
                     land)]

    def _unpadded(self, which: str, k0, kt: int, dst: int, piece: int) -> list:
        c = self.cache
        if c.layout.layout == "paged":
            out, off = [], 0
            for a, n in c.runs(which, self.seq, self.head, k0, kt):
                out.append(Copy(GM, L1, a, dst + off, n * piece, convert="nz_unpadded"))
                off += n * piece
            return out
        pitch = c.token_pitch()
        load = gm_copy(GM, L1, offset(self.k if which == "k" else self.v, k0, pitch), dst, piece, kt, pitch, piece)
        return [attrs.evolve(load, convert="nz_unpadded")]

    def start(self, g: _FaGeometry) -> list:
        """Paged: the sequence's block-table entries, once per block."""
        if self.cache.layout.layout != "paged":
            return []
        return _table_read(self.cache, self.seq, 0, self.cache.max_blocks - 1, L1, g.l1["table"])


class _Cube:
    """The AIC side of a block: loads Q, K, V (MTE2), Q K^T and P V on the cube
    (MTE1 feeds L0A/L0B, M multiplies into L0C), FixPipe writes S and the partial O
    to the block's workspace and tells the AIVs; P comes back from them."""

    def __init__(self, g: _FaGeometry, q, kv: _KvRead, w):
        self.g, self.q, self.kv, self.w = g, q, kv, w
        self.out: list = []
        self.mm = 0  # Mmads issued: L0A/L0B pair mm % 2
        self.cc = 0  # L0C tiles used: c_l0[cc % 2]

    def load_q(self, tile: _Tile) -> None:
        g = self.g
        d, e, i = g.p.head_dim, g.e, tile.tp
        # one row a segment, back to back (one DMA segment to the engine), landing as fractal
        # blocks; rows that are not whole fractals (head_dim % 16) one run, not described
        src, rows = offset(self.q, tile.q0, d * e), tile.rows
        load = (Copy(GM, L1, src, g.l1["q"][i], d * e, rows, d * e, d * e, f"nd2nz_b{8 * e}") if d % 16 == 0
                else Copy(GM, L1, src, g.l1["q"][i], rows * d * e, convert="nz_unpadded"))
        self.out += [WaitFlag(MTE1, MTE2, _Q + i), load, SetFlag(MTE2, MTE1, _Q + i)]

    def load_kv(self, st: _Step, which: str) -> None:
        i, fid = st.sp, _K if which == "k" else _V
        self.out += [WaitFlag(MTE1, MTE2, fid + i), *self.kv.load(which, st.k0, st.kt, self.g.l1[which][i]),
                     SetFlag(MTE2, MTE1, fid + i)]

    def qk(self, st: _Step, reuse: bool) -> None:
        """S = Q K^T, one Mmad and FixPipe per sub-tile of keys; then S_READY. reuse: the
        workspace slot held S of two steps back: wait until the AIVs have loaded it."""
        g, out = self.g, self.out
        d, e, rows, nb, sp, tp = g.p.head_dim, g.e, st.tile.rows, st.nb, st.sp, st.tile.tp
        for u in range(st.nsub):
            x, c = self.mm % 2, self.cc % 2
            self.mm += 1
            self.cc += 1
            out.append(WaitFlag(M, MTE1, x))
            if u == 0:
                out.append(WaitFlag(MTE2, MTE1, _K + sp))
                if st.first:
                    out.append(WaitFlag(MTE2, MTE1, _Q + tp))
            out += [Copy(L1, L0A, g.l1["q"][tp], g.l0["a"][x], rows * d * e),
                    Copy(L1, L0B, g.l1["k"][sp] + u * nb * d * e, g.l0["b"][x], nb * d * e),
                    SetFlag(MTE1, M, x)]
            if u == st.nsub - 1:
                out.append(SetFlag(MTE1, MTE2, _K + sp))
                if st.last:
                    out.append(SetFlag(MTE1, MTE2, _Q + tp))
            s_at = shift(self.w, g.ws["s"][sp] + u * rows * nb * 4)
            out += [WaitFlag(MTE1, M, x), WaitFlag(FIX, M, c),
                    Mmad(rows, nb, d, g.p.dtype, g.l0["a"][x], g.l0["b"][x], g.l0["c"][c]),
                    SetFlag(M, MTE1, x), SetFlag(M, FIX, c), WaitFlag(M, FIX, c)]
            if u == 0 and reuse:
                out.append(CrossWaitFlag(FIX, _S_FREE))
            out += [Copy(L0C, GM, g.l0["c"][c], s_at, rows * nb * 4, convert="fix_fp32"), SetFlag(FIX, M, c)]
        out.append(CrossSetFlag(FIX, _S_READY))

    def load_p(self, st: _Step) -> None:
        g = self.g
        rows, i = st.tile.rows, st.sp
        p_at = shift(self.w, g.ws["p"][i])
        # P [sub-tiles][rows][keys], one row a segment, back to back; each sub-tile lands as
        # its own fractal blocks (the rows of a group: `:rows`)
        self.out += [CrossWaitFlag(MTE2, _P_READY), WaitFlag(MTE1, MTE2, _P + i),
                     Copy(GM, L1, p_at, g.l1["p"][i], st.nb * g.e, rows * st.nsub, st.nb * g.e, st.nb * g.e,
                          f"nd2nz_b{8 * g.e}:{rows}"),
                     SetFlag(MTE2, MTE1, _P + i)]

    def pv(self, st: _Step) -> None:
        """O_part = P V accumulated over the sub-tiles in one L0C tile; FixPipe; O_READY."""
        g, out = self.g, self.out
        d, e, rows, nb, sp = g.p.head_dim, g.e, st.tile.rows, st.nb, st.sp
        c = self.cc % 2
        self.cc += 1
        for u in range(st.nsub):
            x = self.mm % 2
            self.mm += 1
            out.append(WaitFlag(M, MTE1, x))
            if u == 0:
                out += [WaitFlag(MTE2, MTE1, _P + sp), WaitFlag(MTE2, MTE1, _V + sp)]
            out += [Copy(L1, L0A, g.l1["p"][sp] + u * rows * nb * e, g.l0["a"][x], rows * nb * e),
                    self._v_slice(st, u, g.l0["b"][x]), SetFlag(MTE1, M, x)]
            if u == st.nsub - 1:
                out += [SetFlag(MTE1, MTE2, _P + sp), SetFlag(MTE1, MTE2, _V + sp)]
            out += [WaitFlag(MTE1, M, x)]
            if u == 0:
                out.append(WaitFlag(FIX, M, c))
            out += [Mmad(rows, d, nb, g.p.dtype, g.l0["a"][x], g.l0["b"][x], g.l0["c"][c], accumulate=u > 0),
                    SetFlag(M, MTE1, x)]
        o_at = shift(self.w, g.ws["o"][sp])
        out += [SetFlag(M, FIX, c), WaitFlag(M, FIX, c), Copy(L0C, GM, g.l0["c"][c], o_at, rows * d * 4,
                                                              convert="fix_fp32"),
                SetFlag(FIX, M, c), CrossSetFlag(FIX, _O_READY)]

    def _v_slice(self, st: _Step, u: int, dst: int) -> Copy:
        """MTE1: V's sub-tile u into L0B - rows u*nb.. of each 16-column block of V [keys,
        head_dim] in L1, one segment a block (its bytes: nb * head_dim elements). Where
        the blocks are not whole (head_dim not a multiple of 16) or the step's keys do
        not fill its sub-tiles, one run of those bytes, its data not described."""
        g = self.g
        d, e, nb = g.p.head_dim, g.e, st.nb
        src = g.l1["v"][st.sp]
        if d % 16 or st.nsub * nb != st.kt:
            return Copy(L1, L0B, src + u * nb * d * e, dst, nb * d * e, convert="nz_rows")
        blk = 16 * e
        return Copy(L1, L0B, src + u * nb * blk, dst, nb * blk, d // 16, st.kt * blk, l0b_block_bytes(nb, e))

    def prologue(self) -> list:
        return ([SetFlag(MTE1, MTE2, i) for i in range(8)] + [SetFlag(M, MTE1, i) for i in (0, 1)]
                + [SetFlag(FIX, M, i) for i in (0, 1)])

    def epilogue(self) -> list:
        return ([WaitFlag(MTE1, MTE2, i) for i in range(8)] + [WaitFlag(M, MTE1, i) for i in (0, 1)]
                + [WaitFlag(FIX, M, i) for i in (0, 1)])


class _Vec:
    """The AIV side of a block (one program, `sub` = 0 or 1 picks the half of the
    rows): online softmax of each S tile in row chunks (MTE2 loads chunk i+1 while V
    works on chunk i and MTE3 stores P of chunk i-1), rescale-accumulate of the
    partial O, and at the end of a q tile O / row sum, cast, store."""

    def __init__(self, g: _FaGeometry, o, w):
        self.g, self.o, self.w = g, o, w
        self.out: list = []
        self.ch = 0  # chunks processed: s_ub / p_ub [ch % 2]

    def _rows(self, tile: _Tile) -> tuple[int, int]:
        """(rows of this AIV, first row of sub 1): an odd tile overlaps one row, computed twice."""
        r = cdiv(tile.rows, 2)
        return r, tile.rows - r

    def softmax(self, st: _Step) -> None:
        g, out = self.g, self.out
        e, rows, nb, nsub, sp, tp = g.e, st.tile.rows, st.nb, st.nsub, st.sp, st.tile.tp
        r, sub1 = self._rows(st.tile)
        kp = nsub * nb
        dt = g.p.dtype
        for c in range(cdiv(r, g.rc)):
            rcc = min(g.rc, r - c * g.rc)
            x = self.ch % 2
            self.ch += 1
            row0 = c * g.rc
            s_at = moving(shift(self.w, g.ws["s"][sp] + row0 * nb * 4), "sub", sub1 * nb * 4)
            p_at = moving(shift(self.w, g.ws["p"][sp] + row0 * nb * e), "sub", sub1 * nb * e)
            if c == 0:
                out.append(CrossWaitFlag(MTE2, _S_READY))
            out += [WaitFlag(V, MTE2, x),
                    Copy(GM, UB, s_at, g.ub["s"][x], rcc * nb * 4, nsub, rows * nb * 4, rcc * nb * 4)]
            if c == cdiv(r, g.rc) - 1:  # the cube may overwrite this S slot
                out.append(CrossSetFlag(MTE2, _S_FREE))
            out += [SetFlag(MTE2, V, x), WaitFlag(MTE2, V, x), WaitFlag(MTE3, V, x)]
            n, so = rcc * kp, row0 * STAT
            s, m, l_, a, red = g.ub["s"][x], g.ub["m"][tp] + so, g.ub["l"][tp] + so, g.ub["alpha"][sp] + so, g.ub["red"]
            ns = rcc * STAT // 4
            if st.masked:  # mask bits: key index (a ramp in UB) > the row's limit; hidden scores -> -inf
                out += [VecOp("compare", n, "fp32", g.ub["mask"], (s,), "uint8", cdiv(n, 8), 0),
                        VecOp("select", n, "fp32", s, (s,), flops_per_elem=0)]
            out += online_softmax(n, ns, s, m, l_, a, red, g.ub["p"][x], dt,
                                  Rows(rcc, nsub, nb, g.p.head_dim ** -0.5))
            out += [SetFlag(V, MTE2, x), SetFlag(V, MTE3, x), WaitFlag(V, MTE3, x),
                    Copy(UB, GM, g.ub["p"][x], p_at, rcc * nb * e, nsub, rcc * nb * e, rows * nb * e),
                    SetFlag(MTE3, V, x)]
        out.append(CrossSetFlag(MTE3, _P_READY))

    def update(self, st: _Step) -> None:
        """O = O * alpha + O_part (O starts at 0)."""
        g = self.g
        d = g.p.head_dim
        r, sub1 = self._rows(st.tile)
        n = r * d
        o_at = moving(shift(self.w, g.ws["o"][st.sp]), "sub", sub1 * d * 4)
        acc, part = g.ub["oacc"], g.ub["opart"]
        self.out += [CrossWaitFlag(MTE2, _O_READY), WaitFlag(V, MTE2, 2),
                     Copy(GM, UB, o_at, part, n * 4), SetFlag(MTE2, V, 2), WaitFlag(MTE2, V, 2)]
        alpha = g.ub["alpha"][st.sp]
        self.out += [VecOp("mul", n, "fp32", acc, (acc, alpha), pitches=per_row(r, d)),
                     VecOp("add", n, "fp32", acc, (acc, part)), SetFlag(V, MTE2, 2)]

    def reset(self, tp: int, n: int) -> list:
        """Statistics set tp back to max -inf, sum 0 (the next tile but one uses it)."""
        ns = n * STAT // 4
        return [VecOp("dup", ns, "fp32", self.g.ub["m"][tp], flops_per_elem=0, scalar=-float("inf")),
                VecOp("dup", ns, "fp32", self.g.ub["l"][tp], flops_per_elem=0, scalar=0.0)]

    def finish(self, tile: _Tile) -> None:
        """O / row sum, cast, store this AIV's rows of the q tile; O back to 0."""
        g = self.g
        d, e = g.p.head_dim, g.e
        r, sub1 = self._rows(tile)
        n = r * d
        o_at = moving(offset(self.o, tile.q0, d * e), "sub", sub1 * d * e)
        self.out += [VecOp("div", n, "fp32", g.ub["oacc"], (g.ub["oacc"], g.ub["l"][tile.tp]), pitches=per_row(r, d)),
                     WaitFlag(MTE3, V, 2),
                     VecOp("cast", n, "fp32", g.ub["oout"], (g.ub["oacc"],), g.p.dtype, flops_per_elem=0),
                     SetFlag(V, MTE3, 2), *self.reset(tile.tp, r),
                     VecOp("dup", cdiv(g.qt, 2) * d, "fp32", g.ub["oacc"], flops_per_elem=0, scalar=0.0),
                     WaitFlag(V, MTE3, 2), Copy(UB, GM, g.ub["oout"], o_at, n * e), SetFlag(MTE3, V, 2)]

    def prologue(self) -> list:
        r = cdiv(self.g.qt, 2)
        return ([SetFlag(V, MTE2, i) for i in range(3)] + [SetFlag(MTE3, V, i) for i in range(3)]
                + self.reset(0, r) + self.reset(1, r)
                + [VecOp("dup", r * self.g.p.head_dim, "fp32", self.g.ub["oacc"], flops_per_elem=0, scalar=0.0)])

    def epilogue(self) -> list:
        return [WaitFlag(V, MTE2, i) for i in range(3)] + [WaitFlag(MTE3, V, i) for i in range(3)]
