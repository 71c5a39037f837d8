"""FlashAttention: the AIC (cube) and AIV (vector) sides of a block, instruction by
instruction, and how a block reads K and V from the cache."""

from __future__ import annotations


from attrs import frozen

from npusim.isa.instructions import l0b_block_bytes
from npusim.isa.program import (
    Affine, Copy, CrossSetFlag, CrossWaitFlag, Mmad, VecOp, moving, offset, set_flag, shift, wait_flag,
)
from npusim.ops.build import align_up, cdiv
from npusim.ops.kv_cache import KvCache
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
    table names (addresses are data: no loops; the runs of blocks of one structure share
    a template whose every such address is a variable of its own, flash._RunPrograms)."""

    cache: KvCache
    k: object = 0  # per_layer / contiguous: GM address of token 0 of the block's K head (int or Affine)
    v: object = 0
    seq: int = 0  # paged: the block's sequence and KV head
    head: int = 0
    # paged, a template's: its loads so far, (which, k0, kt, run) each, the run's address the
    # variable page_var(i) of its index i (bound by page_values); None: addresses as they are
    pages: list | None = None

    def load(self, which: str, k0, kt: int, dst: int) -> list:
        """The loads of keys k0 .. k0+kt-1 of K or V, one segment a token (tokens back to
        back in GM are one DMA segment to the engine), landing in L1 as the cube's
        fractal blocks: K as B = K^T [head_dim, keys] (its tokens are B's columns), V
        as B [keys, head_dim]."""
        c = self.cache
        piece = c.layout.head_dim * c.layout.elem_bytes
        land = f"{'dn' if which == 'k' else 'nd'}2nz_b{8 * c.layout.elem_bytes}"
        if c.layout.layout == "paged":
            assert k0.__class__ is int, "paged steps are not looped: their blocks are data"
            out, first = [], 0
            for a, n in self._page_runs(which, k0, kt):
                if which == "v":  # rows first.. of V's fractal blocks (a tile of kt rows), from that row of block 0
                    at, part = dst + first * 16 * c.layout.elem_bytes, land if n == kt else f"{land}@{kt}"
                else:  # columns first.. of K^T's: a conversion of its own from a block's start only
                    at, part = dst + first * piece, land if first % 16 == 0 else "nz_rows"
                out.append(Copy(GM, L1, a, at, piece, n, piece, piece, part))
                first += n
            return out
        pitch = c.token_pitch()
        # the dst stride: a token's piece padded to the L1 alignment, as the DMA lands it in fractals
        return [Copy(GM, L1, offset(self.k if which == "k" else self.v, k0, pitch), dst, piece, kt, pitch,
                     align_up(piece, 32), land)]

    def _page_runs(self, which: str, k0: int, kt: int) -> list[tuple]:
        """Paged: keys k0 .. k0+kt-1 as (GM address, tokens) runs (KvCache.runs); a
        template's addresses are variables, their loads kept in `pages`."""
        runs = self.cache.runs(which, self.seq, self.head, k0, kt)
        if self.pages is None:
            return runs
        out = []
        for j, (_, n) in enumerate(runs):
            out.append((Affine(0, ((page_var(len(self.pages)), 1),)), n))
            self.pages.append((which, k0, kt, j))
        return out

    def page_values(self, pages: list) -> dict[str, int]:
        """A template's paged variables (its `pages`, and TABLE_VAR) bound to this block's
        sequence and head: the addresses its own build would have read."""
        values = {TABLE_VAR: self.cache.table_addr(self.seq, 0)}
        runs: dict[tuple, list] = {}  # a step's K or V is loaded by several q tiles
        for i, (which, k0, kt, j) in enumerate(pages):
            load = (which, k0, kt)
            if load not in runs:
                runs[load] = self.cache.runs(which, self.seq, self.head, k0, kt)
            values[page_var(i)] = runs[load][j][0]
        return values

    def start(self, g: _FaGeometry) -> list:
        """Paged: the sequence's block-table entries, once per block."""
        if self.cache.layout.layout != "paged":
            return []
        reads = _table_read(self.cache, self.seq, 0, self.cache.max_blocks - 1, L1, g.l1["table"])
        if self.pages is not None:  # a template's: the sequence's row of the table a variable too
            reads[0] = reads[0].moved(Affine(0, ((TABLE_VAR, 1),)), reads[0].dst_addr)
        return reads


# A template's variables for the paged addresses it reads (_KvRead.pages): the block table
# row's, and each block load's; "@" starts no loop variable of a lowering (flash._BASES too)
TABLE_VAR = "@table"


def page_var(i: int) -> str:
    return f"@page{i}"


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
        # blocks (a head_dim that is not whole blocks: the last one padded, _fa_geometry)
        src, rows = offset(self.q, tile.q0, d * e), tile.rows
        load = Copy(GM, L1, src, g.l1["q"][i], d * e, rows, d * e, align_up(d * e, 32), f"nd2nz_b{8 * e}")
        self.out += [wait_flag(MTE1, MTE2, _Q + i), load, set_flag(MTE2, MTE1, _Q + i)]

    def load_kv(self, st: _Step, which: str) -> None:
        i, fid = st.sp, _K if which == "k" else _V
        self.out += [wait_flag(MTE1, MTE2, fid + i), *self.kv.load(which, st.k0, st.kt, self.g.l1[which][i]),
                     set_flag(MTE2, MTE1, fid + i)]

    def qk(self, st: _Step, reuse: bool) -> None:
        """S = Q K^T, one L0C tile and FixPipe per sub-tile of keys, summed there over the
        head_dim chunks (one Mmad each: the chunk's Q and K^T slices in L0A / L0B); then
        S_READY. reuse: the workspace slot held S of two steps back: wait until the AIVs
        have loaded it."""
        g, out = self.g, self.out
        e, rows, nb, sp, tp = g.e, st.tile.rows, st.nb, st.sp, st.tile.tp
        chunks = g.chunks()
        for u in range(st.nsub):
            c = self.cc % 2
            self.cc += 1
            for j, (c0, cols) in enumerate(chunks):
                x = self.mm % 2
                self.mm += 1
                out.append(wait_flag(M, MTE1, x))
                if u == 0 and j == 0:
                    out.append(wait_flag(MTE2, MTE1, _K + sp))
                    if st.first:
                        out.append(wait_flag(MTE2, MTE1, _Q + tp))
                # the chunk's 16-column blocks of Q (whole fractal blocks), back to back in L1
                out += [Copy(L1, L0A, g.l1["q"][tp] + rows * c0 * e, g.l0["a"][x], rows * align_up(cols, 16) * e),
                        self._k_slice(st, u, c0, cols, g.l0["b"][x]), set_flag(MTE1, M, x)]
                if u == st.nsub - 1 and j == len(chunks) - 1:
                    out.append(set_flag(MTE1, MTE2, _K + sp))
                    if st.last:
                        out.append(set_flag(MTE1, MTE2, _Q + tp))
                out.append(wait_flag(MTE1, M, x))
                if j == 0:
                    out.append(wait_flag(FIX, M, c))
                out += [Mmad(rows, nb, cols, g.p.dtype, g.l0["a"][x], g.l0["b"][x], g.l0["c"][c], accumulate=j > 0),
                        set_flag(M, MTE1, x)]
            s_at = shift(self.w, g.ws["s"][sp] + u * rows * nb * 4)
            out += [set_flag(M, FIX, c), wait_flag(M, FIX, c)]
            if u == 0 and reuse:
                out.append(CrossWaitFlag(FIX, _S_FREE))
            out += [Copy(L0C, GM, g.l0["c"][c], s_at, rows * nb * 4, convert="fix_fp32"), set_flag(FIX, M, c)]
        out.append(CrossSetFlag(FIX, _S_READY))

    def load_p(self, st: _Step) -> None:
        g = self.g
        rows, i = st.tile.rows, st.sp
        p_at = shift(self.w, g.ws["p"][i])
        # P [sub-tiles][rows][keys], one row a segment, back to back; each sub-tile lands as
        # its own fractal blocks (the rows of a group: `:rows`)
        self.out += [CrossWaitFlag(MTE2, _P_READY), wait_flag(MTE1, MTE2, _P + i),
                     Copy(GM, L1, p_at, g.l1["p"][i], st.nb * g.e, rows * st.nsub, st.nb * g.e, st.nb * g.e,
                          f"nd2nz_b{8 * g.e}:{rows}"),
                     set_flag(MTE2, MTE1, _P + i)]

    def pv(self, st: _Step) -> None:
        """O_part = P V, a head_dim column chunk at a time: each chunk accumulated over the
        sub-tiles in one L0C tile and FixPipe'd to its columns of the workspace's O
        (P's sub-tiles go to L0A again for every chunk); then O_READY."""
        g, out = self.g, self.out
        d, e, rows, nb, sp = g.p.head_dim, g.e, st.tile.rows, st.nb, st.sp
        chunks = g.chunks()
        o_at = shift(self.w, g.ws["o"][sp])
        for j, (c0, cols) in enumerate(chunks):
            c = self.cc % 2
            self.cc += 1
            for u in range(st.nsub):
                x = self.mm % 2
                self.mm += 1
                out.append(wait_flag(M, MTE1, x))
                if u == 0 and j == 0:
                    out += [wait_flag(MTE2, MTE1, _P + sp), wait_flag(MTE2, MTE1, _V + sp)]
                out += [Copy(L1, L0A, g.l1["p"][sp] + u * rows * nb * e, g.l0["a"][x], rows * nb * e),
                        self._v_slice(st, u, c0, cols, g.l0["b"][x]), set_flag(MTE1, M, x)]
                if u == st.nsub - 1 and j == len(chunks) - 1:
                    out += [set_flag(MTE1, MTE2, _P + sp), set_flag(MTE1, MTE2, _V + sp)]
                out += [wait_flag(MTE1, M, x)]
                if u == 0:
                    out.append(wait_flag(FIX, M, c))
                out += [Mmad(rows, cols, self.sub_keys(st, u), g.p.dtype, g.l0["a"][x], g.l0["b"][x], g.l0["c"][c],
                             accumulate=u > 0),
                        set_flag(M, MTE1, x)]
            # L0C rows are whole 16-column fractals: a chunk that is not (or one of several:
            # O's rows are head_dim wide), one row a segment
            o = (Copy(L0C, GM, g.l0["c"][c], o_at, rows * d * 4, convert="fix_fp32") if cols == d and d % 16 == 0
                 else Copy(L0C, GM, g.l0["c"][c], shift(o_at, c0 * 4), cols * 4, rows, align_up(cols, 16) * 4, d * 4,
                           "fix_fp32"))
            out += [set_flag(M, FIX, c), wait_flag(M, FIX, c), o, set_flag(FIX, M, c)]
        out.append(CrossSetFlag(FIX, _O_READY))

    def _k_slice(self, st: _Step, u: int, c0: int, cols: int, dst: int) -> Copy:
        """MTE1: K's sub-tile u, head_dim rows c0 .. c0+cols, into L0B as B = K^T [cols, nb]:
        from each of its nb / 16 blocks of 16 keys (head_dim rows each) the chunk's rows.
        The whole head: one run; else, or where a block's rows are not whole 512-byte
        L0B units (head_dim not a multiple of 16), one segment a block, each on its boundary."""
        g = self.g
        d, e, nb = g.p.head_dim, g.e, st.nb
        src = g.l1["k"][st.sp] + u * nb * d * e + c0 * 16 * e
        if cols == d and l0b_block_bytes(d, e) == d * 16 * e:
            return Copy(L1, L0B, src, dst, nb * d * e)
        return Copy(L1, L0B, src, dst, cols * 16 * e, nb // 16, d * 16 * e, l0b_block_bytes(cols, e))

    def _v_slice(self, st: _Step, u: int, c0: int, cols: int, dst: int) -> Copy:
        """MTE1: V's sub-tile u, head_dim columns c0 .. c0+cols, into L0B - rows u*nb.. of
        each of the chunk's 16-column blocks of V [keys, head_dim] in L1 (the step's kt
        rows a block; the last block's padding columns too), one segment a block: the
        sub-tile's keys (sub_keys: the last sub-tile of a short step has fewer than nb),
        landing as B [keys, cols] for an Mmad of that depth."""
        g = self.g
        e, nb = g.e, st.nb
        blk, keys = 16 * e, self.sub_keys(st, u)
        src = g.l1["v"][st.sp] + c0 // 16 * st.kt * blk
        return Copy(L1, L0B, src + u * nb * blk, dst, keys * blk, cdiv(cols, 16), st.kt * blk,
                    l0b_block_bytes(keys, e))

    def sub_keys(self, st: _Step, u: int) -> int:
        """Keys in sub-tile u of a step: nb, but fewer in the last sub-tile of a short step
        (P V multiplies those; the padding keys' P is 0 and their V rows are not loaded)."""
        return min(st.nb, st.kt - u * st.nb)

    def prologue(self) -> list:
        return ([set_flag(MTE1, MTE2, i) for i in range(8)] + [set_flag(M, MTE1, i) for i in (0, 1)]
                + [set_flag(FIX, M, i) for i in (0, 1)])

    def epilogue(self) -> list:
        return ([wait_flag(MTE1, MTE2, i) for i in range(8)] + [wait_flag(M, MTE1, i) for i in (0, 1)]
                + [wait_flag(FIX, M, i) for i in (0, 1)])


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
            out += [wait_flag(V, MTE2, x),
                    Copy(GM, UB, s_at, g.ub["s"][x], rcc * nb * 4, nsub, rows * nb * 4, rcc * nb * 4)]
            if c == cdiv(r, g.rc) - 1:  # the cube may overwrite this S slot
                out.append(CrossSetFlag(MTE2, _S_FREE))
            out += [set_flag(MTE2, V, x), wait_flag(MTE2, V, x), wait_flag(MTE3, V, x)]
            n, so = rcc * kp, row0 * STAT
            s, m, l_, a, red = g.ub["s"][x], g.ub["m"][tp] + so, g.ub["l"][tp] + so, g.ub["alpha"][sp] + so, g.ub["red"]
            ns = rcc * STAT // 4
            if st.masked:
                out += self.mask(st, row0, rcc, sub1, s)
            out += online_softmax(n, ns, s, m, l_, a, red, g.ub["p"][x], dt,
                                  Rows(rcc, nsub, nb, g.p.head_dim ** -0.5))
            out += [set_flag(V, MTE2, x), set_flag(V, MTE3, x), wait_flag(V, MTE3, x),
                    Copy(UB, GM, g.ub["p"][x], p_at, rcc * nb * e, nsub, rcc * nb * e, rows * nb * e),
                    set_flag(MTE3, V, x)]
        out.append(CrossSetFlag(MTE3, _P_READY))

    def mask(self, st: _Step, row0: int, rcc: int, sub1: int, s) -> list:
        """Hide the scores of keys a row may not see (past its causal limit, or a sub-tile's
        padding past the step's keys): each row's limit, as a key index in the step, into
        `red` (one STAT block a row, as the statistics: the ramp's row index plus the limit
        of the chunk's first row, which the scalar unit computes from the tile, the step
        and `sub`); mask bits = key index (the ramp) <= the row's limit; hidden scores ->
        -inf. Without causality every row's limit is the step's last key."""
        g = self.g
        p, nb, nsub, red, ramp = g.p, st.nb, st.nsub, g.ub["red"], g.ub["ramp"]
        n, ns, blk = rcc * nsub * nb, rcc * STAT // 4, STAT // 4
        assert st.k0.__class__ is int, "masked steps are not looped"
        if g.period:  # causal, GQA-packed rows: query (row % period), its index held in UB (row_query)
            rows = moving(offset(g.ub["row_query"], st.tile.q0, STAT), "sub", sub1 * STAT)
            limit = VecOp("adds", ns, "fp32", red, (shift(rows, row0 * STAT),), scalar=p.seq_kv - g.period - st.k0)
        elif p.causal:  # row q sees keys <= q + seq_kv - seq_q; the chunk's rows are q0 + sub * sub1 + row0 + i
            first = moving(shift(st.tile.q0, row0 + p.seq_kv - p.seq_q - st.k0), "sub", sub1)
            limit = VecOp("adds", ns, "fp32", red, (ramp,), scalar=first, pitches=((rcc, STAT, 4), (blk, 4, 0)))
        else:  # keys past the step's are the padding of its last sub-tile
            limit = VecOp("dup", ns, "fp32", red, flops_per_elem=0, scalar=float(st.kt - 1))
        keys = ((nsub, 0, nb * 4, 0), (rcc, 0, 0, STAT), (nb, 0, 4, 0))  # S is [nsub][rcc][nb]: key u * nb + j
        return [limit, VecOp("compare", n, "fp32", g.ub["mask"], (ramp, red), "uint8", cdiv(n, 8), 0, pitches=keys),
                VecOp("select", n, "fp32", s, (s, g.ub["mask"]), flops_per_elem=0, scalar=-float("inf"))]

    def ramp(self) -> list:
        """The ramp 0, 1, 2, ... of key and row indices the masks compare, built once, as
        Ascend C's ArithProgression does: the first 32-byte block, then doubling by Adds
        (aligned). # assumption: the first block (ArithProgression's 8 scalar SetValues;
        the IR has no scalar write to UB) costs two Duplicates and a ReduceSum: row i sums
        8 of [0 x 8, 1 x 8] from element i."""
        g = self.g
        at, red, size = g.ub["ramp"], g.ub["red"], self.ramp_len()
        out = [VecOp("dup", 8, "fp32", red, flops_per_elem=0, scalar=0.0),
               VecOp("dup", 8, "fp32", red + 32, flops_per_elem=0, scalar=1.0),
               VecOp("reduce_sum", 64, "fp32", at, (red,), out_n=8, pitches=((8, 4, 4), (8, 0, 4)))]
        have = 8
        while have < size:
            m = min(have, size - have)
            out.append(VecOp("adds", m, "fp32", at + have * 4, (at,), scalar=float(have)))
            have += m
        if "row_query" in g.ub:  # packed rows: query i % period of each head, one STAT block a row
            heads, period = align_up(g.p.seq_q, g.period) // g.period, g.period
            out.append(VecOp("copy", heads * period * STAT // 4, "fp32", g.ub["row_query"], (at,), flops_per_elem=0,
                             pitches=((heads, period * STAT, 0), (period, STAT, 4), (STAT // 4, 4, 0))))
        return out

    def ramp_len(self) -> int:
        """Indices the masks read: the keys of a step, the rows of a chunk, the queries of a
        packed head (whole 32-byte blocks)."""
        return align_up(max(self.g.kt, self.g.rc, self.g.period), 8)

    def update(self, st: _Step) -> None:
        """O = O * alpha + O_part (O starts at 0)."""
        g = self.g
        d = g.p.head_dim
        r, sub1 = self._rows(st.tile)
        n = r * d
        o_at = moving(shift(self.w, g.ws["o"][st.sp]), "sub", sub1 * d * 4)
        acc, part = g.ub["oacc"], g.ub["opart"]
        self.out += [CrossWaitFlag(MTE2, _O_READY), wait_flag(V, MTE2, 2),
                     Copy(GM, UB, o_at, part, n * 4), set_flag(MTE2, V, 2), wait_flag(MTE2, V, 2)]
        alpha = g.ub["alpha"][st.sp]
        self.out += [VecOp("mul", n, "fp32", acc, (acc, alpha), pitches=per_row(r, d)),
                     VecOp("add", n, "fp32", acc, (acc, part)), set_flag(V, MTE2, 2)]

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
                     wait_flag(MTE3, V, 2),
                     VecOp("cast", n, "fp32", g.ub["oout"], (g.ub["oacc"],), g.p.dtype, flops_per_elem=0),
                     set_flag(V, MTE3, 2), *self.reset(tile.tp, r),
                     VecOp("dup", cdiv(g.qt, 2) * d, "fp32", g.ub["oacc"], flops_per_elem=0, scalar=0.0),
                     wait_flag(V, MTE3, 2), Copy(UB, GM, g.ub["oout"], o_at, n * e), set_flag(MTE3, V, 2)]

    def prologue(self, masked: bool = False) -> list:
        """Flags, statistics, O = 0; and the index ramp if some step is masked."""
        r = cdiv(self.g.qt, 2)
        return ([set_flag(V, MTE2, i) for i in range(3)] + [set_flag(MTE3, V, i) for i in range(3)]
                + (self.ramp() if masked else []) + self.reset(0, r) + self.reset(1, r)
                + [VecOp("dup", r * self.g.p.head_dim, "fp32", self.g.ub["oacc"], flops_per_elem=0, scalar=0.0)])

    def epilogue(self) -> list:
        return [wait_flag(V, MTE2, i) for i in range(3)] + [wait_flag(MTE3, V, i) for i in range(3)]
