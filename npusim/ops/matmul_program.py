"""MatMul on the cube: the program of a core - the loop nest over its output tiles,
the L1 / L0 ping-pong and the FixPipe writes (npusim.ops.matmul_tiling chooses the
tiling, npusim.ops.matmul lowers)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from attrs import frozen

from npusim.isa.program import ALIGN_BYTES, Copy, Loop, Mem, Mmad, Pipe, SetFlag, WaitFlag, addr, shift
from npusim.ops.build import align_up, cdiv, pingpong

if TYPE_CHECKING:
    from npusim.ops.matmul import MatmulParams, MatmulTiling


# Flag ids of the matmul pipeline (each (src, dst) pipe pair has its own 0..7).
_CHUNK = (0, 1)  # L1 chunk ping / pong: MTE2 <-> MTE1
_SLICE = (0, 1)  # L0A/L0B slice ping / pong: MTE1 <-> M
_PANEL = 2  # resident A panel: MTE2 <-> MTE1
_TILE_EXTRA = 3  # bias / scales of a tile: MTE2 <-> MTE1 / FIX
_L0C = 0  # accumulator: M <-> FIX


def _b_dtype(p: MatmulParams) -> str:
    return p.weight_dtype or p.dtype


def _part_starts(p: MatmulParams) -> list[tuple[int, int]]:
    """(first column, width) of each part of C; one part (all of C) when n_parts is empty."""
    widths = p.n_parts or (p.n,)
    return [(sum(widths[:i]), w) for i, w in enumerate(widths)]


def _pieces(parts: list[tuple[int, int]], c: int, bn: int) -> tuple[tuple[int, int, int], ...]:
    """The FixPipe writes of the tile of columns [c, c + bn): (part, first column in
    the tile, columns) per part the tile overlaps."""
    return tuple((i, max(c, s) - c, min(c + bn, s + w) - max(c, s))
                 for i, (s, w) in enumerate(parts) if s < c + bn and c < s + w)


class _Layout:
    """How a logical [rows, cols] operand sits in GM. Tile offsets are multiples of 16,
    so an element's address is linear in its row and column in every layout:
    base + r * dr + c * dc. A [nr, nc] tile is `segments` runs of `seg` bytes."""

    def __init__(self, tensor, rows: int, cols: int, elem: int, fmt: str, transposed: bool = False):
        self.base, self.e, self.fmt, self.t = tensor.addr, elem, fmt, transposed
        rows_pad = align_up(rows, 16)
        if fmt == "NZ":  # 16-wide column blocks, each holding all (padded) rows contiguously
            self.dr, self.dc = 16 * elem, rows_pad * elem
        elif transposed:  # stored [cols, rows]
            self.dr, self.dc = elem, rows * elem
        else:
            self.dr, self.dc = cols * elem, elem
        self.batch_bytes = _stored_bytes(rows, cols, elem, fmt)

    def moved(self, nbytes: int) -> _Layout:
        """The same layout starting nbytes further into GM: one group's rows of a
        grouped operand, or one expert's weight."""
        out = copy.copy(self)
        out.base += nbytes
        return out

    def pieces(self, nr: int, nc: int) -> tuple[int, int, int]:
        """(segment bytes, segments, stride) of a [nr, nc] tile."""
        if self.fmt == "NZ":
            return nr * 16 * self.e, cdiv(nc, 16), 16 * self.dc
        if self.t:
            return nr * self.e, nc, self.dc
        return nc * self.e, nr, self.dr

    def l1_bytes(self, nr: int, nc: int) -> int:
        """L1 a [nr, nc] tile takes: it lands in fractal layout, each segment's share
        padded to the L1 alignment."""
        seg, nseg, _ = self.pieces(nr, nc)
        return nseg * align_up(seg, ALIGN_BYTES[Mem.L1])

    def copy(self, at: tuple[int, int, int], nr: int, nc: int, steps: dict[str, tuple[int, int]], dst: int) -> Copy:
        """GM -> L1 copy of the tile at `at` = (batch, row, col); steps: loop var -> (rows,
        cols) it moves by (`bb` moves by a whole batch)."""
        seg, nseg, stride = self.pieces(nr, nc)
        return Copy(Mem.GM, Mem.L1, self._gm(at, steps), dst, seg, nseg, stride, align_up(seg, ALIGN_BYTES[Mem.L1]),
                    self.landing())

    def landing(self) -> str:
        """What the GM -> L1 DMA does to a tile (isa.instructions.CONVERSIONS): an ND tile
        is laid out as 16-column fractal blocks (a transposed one from its columns); an
        NZ tile is already in blocks."""
        if self.fmt == "NZ":
            return ""
        return f"{'dn' if self.t else 'nd'}2nz_b{8 * self.e}"

    def _gm(self, at: tuple[int, int, int], steps: dict[str, tuple[int, int]]):
        b0, r0, c0 = at
        return addr(self.base + b0 * self.batch_bytes + r0 * self.dr + c0 * self.dc,
                    **{v: (dr * self.dr + dc * self.dc if v != "bb" else self.batch_bytes)
                       for v, (dr, dc) in steps.items()})

    def store(self, src: int, at: tuple[int, int, int], nr: int, nc: int, steps: dict[str, tuple[int, int]],
              src_row_bytes: int, convert: str = "") -> Copy:
        """FixPipe L0C -> GM of the tile at `at` = (batch, row, col); `convert`: the
        FixPipe conversion (isa.instructions.CONVERSIONS)."""
        seg, nseg, stride = self.pieces(nr, nc)
        return Copy(Mem.L0C, Mem.GM, src, self._gm(at, steps), seg, nseg, src_row_bytes, stride, convert)


@frozen
class _Plan:
    """Everything one tile loop nest needs, shared by all cores."""

    p: MatmulParams
    t: MatmulTiling
    la: _Layout
    lb: _Layout
    parts: tuple  # (first column, width) of each part of C
    lc: tuple  # the _Layout of each part
    kc: int  # K per L1 chunk
    k_piece: int  # K per split-K piece
    a_l1: tuple
    b_l1: tuple
    extra_l1: int | None
    a_l0: tuple
    b_l0: tuple
    c_l0: int
    bt: int | None
    fb: int | None
    bias: object
    scale: object
    block_cols: int = 0  # columns of B and C a block's tiles sit to the right of block 0's (one program for all)
    bias_elem: int = 4  # bytes of a bias element in GM: fp32, or a grouped matmul's fp16/bf16 (widened into BT)


def _stored_bytes(rows: int, cols: int, elem: int, fmt: str) -> int:
    """GM bytes of one operand: NZ pads both dimensions to whole 16 x 16 fractals."""
    if fmt == "NZ":
        return align_up(rows, 16) * align_up(cols, 16) * elem
    return rows * cols * elem


def _prologue(t: MatmulTiling) -> list:
    """Every buffer starts free: consumers pre-set the 'free' flags producers wait on."""
    out = [SetFlag(Pipe.MTE1, Pipe.MTE2, i) for i in _CHUNK[: 2 if t.l1_double else 1]]
    out += [SetFlag(Pipe.M, Pipe.MTE1, i) for i in _SLICE[: 2 if t.l0_double else 1]]
    return out + [SetFlag(Pipe.FIX, Pipe.M, _L0C), SetFlag(Pipe.MTE1, Pipe.MTE2, _PANEL),
                  SetFlag(Pipe.MTE1, Pipe.MTE2, _TILE_EXTRA)]


def _epilogue(t: MatmulTiling) -> list:
    """Drain: take back every 'free' flag so sets and waits balance."""
    out = [WaitFlag(Pipe.MTE1, Pipe.MTE2, i) for i in _CHUNK[: 2 if t.l1_double else 1]]
    out += [WaitFlag(Pipe.M, Pipe.MTE1, i) for i in _SLICE[: 2 if t.l0_double else 1]]
    return out + [WaitFlag(Pipe.FIX, Pipe.M, _L0C), WaitFlag(Pipe.MTE1, Pipe.MTE2, _PANEL),
                  WaitFlag(Pipe.MTE1, Pipe.MTE2, _TILE_EXTRA)]


def _box(plan: _Plan, start, extent, dims) -> list:
    """Loop nests over one box of work units (batch, m tile, n tile, k piece); the
    last m or n tile, when smaller, gets its own nest."""
    p, t = plan.p, plan.t
    (b0, m0, n0, s0), (nb, nm, nn, ns) = start, extent
    _, m_tiles, n_tiles, split_k = dims
    out = []
    for m_lo, m_cnt, bm in _edges(m0, nm, m_tiles, p.m, t.base_m):
        for n_lo, n_cnt, bn in _edges(n0, nn, n_tiles, p.n, t.base_n):
            for s_lo, s_cnt, kl in _edges(s0, ns, split_k, p.k, plan.k_piece):
                out += _nest(plan, (b0, m_lo, n_lo, s_lo), (nb, m_cnt, n_cnt, s_cnt), bm, bn, kl)
    return out


def _edges(lo: int, count: int, tiles: int, total: int, size: int) -> list[tuple[int, int, int]]:
    """(first, count, tile size) runs of [lo, lo+count): a smaller last tile stands alone."""
    tail = total - (tiles - 1) * size
    if tail == size or lo + count < tiles:
        return [(lo, count, size)]
    head = [(lo, count - 1, size)] if count > 1 else []
    return head + [(tiles - 1, 1, tail)]


def _nest(plan: _Plan, start, extent, bm: int, bn: int, k_len: int) -> list:
    """The loop nest bb / kp / mi / ni over tiles of one size, each tile streaming its K.
    The ni loop is one run per part of C (a tile straddling a part boundary on its own)."""
    p, t, la, lb = plan.p, plan.t, plan.la, plan.lb
    b0, m0, n0, s0 = start
    nb, nm, nn, ns = extent
    r0, k0 = m0 * t.base_m, s0 * plan.k_piece
    e, eb = la.e, lb.e
    chunks, tail = divmod(k_len, plan.kc)
    a_moves = {"bb": (0, 0), "mi": (t.base_m, 0), "kp": (0, plan.k_piece)}
    b_moves = {"bb": (0, 0), "ni": (0, t.base_n), "kp": (plan.k_piece, 0), "block": (0, plan.block_cols)}
    c_moves = {"bb": (0, 0), "mi": (t.base_m, 0), "ni": (0, t.base_n), "block": (0, plan.block_cols)}

    def slices(kk: int, a_src, b_src, first) -> list:
        """MTE1 feeds the base_k slices of an L1 chunk to L0A/L0B; M multiplies each.
        In L1 the chunk is in fractal layout: A slice s is contiguous, B slice s is
        one run of s_k x 16 per 16-wide column block. `first`: the chunk's index in
        the tile's K (an Addr of the loop vars): its first Mmad starts L0C afresh where
        that is 0."""
        out = []
        for s in range(cdiv(kk, t.base_k)):
            q = s % len(plan.a_l0)
            sk = min(t.base_k, kk - s * t.base_k)
            out += [
                WaitFlag(Pipe.M, Pipe.MTE1, _SLICE[q]),
                # whole 16-column fractal blocks of A (bm x 16 each, row-major inside): a last
                # slice of K that ends mid-block moves that block whole, padding columns too
                # (the cube reads L0A by fractals; bm x sk bytes would cut the block's rows)
                Copy(Mem.L1, Mem.L0A, shift(a_src, s * t.base_k * bm * e), plan.a_l0[q], bm * align_up(sk, 16) * e),
                Copy(Mem.L1, Mem.L0B, shift(b_src, s * t.base_k * 16 * eb), plan.b_l0[q], sk * 16 * eb,
                     cdiv(bn, 16), align_up(kk * 16 * eb, ALIGN_BYTES[Mem.L1]),
                     align_up(sk * 16 * eb, ALIGN_BYTES[Mem.L0B])),
                SetFlag(Pipe.MTE1, Pipe.M, _SLICE[q]),
                WaitFlag(Pipe.MTE1, Pipe.M, _SLICE[q]),
                Mmad(bm, bn, sk, p.dtype, plan.a_l0[q], plan.b_l0[q], plan.c_l0,
                     accumulate=True if s else (first if first.__class__ is not int else first != 0)),
                SetFlag(Pipe.M, Pipe.MTE1, _SLICE[q]),
            ]
        return out

    def chunk(c0: int, kk: int, first_k: int, in_loop: bool):
        def make(pp: int, j_off: int) -> list:
            i = pp % len(plan.b_l1)
            k_at = first_k + j_off * plan.kc
            j = {"j": (0, 2 * plan.kc)} if in_loop else {}
            jb = {"j": (2 * plan.kc, 0)} if in_loop else {}
            loads = [lb.copy((b0, k0 + k_at, c0), kk, bn, {**b_moves, **jb}, plan.b_l1[i])]
            if t.a_resident:  # the panel holds all of K: this chunk's part of it
                a_src = addr(plan.a_l1[0] + k_at * bm * e, **({"j": 2 * plan.kc * bm * e} if in_loop else {}))
            else:
                a_src = plan.a_l1[i]
                loads.insert(0, la.copy((b0, r0, k0 + k_at), bm, kk, {**a_moves, **j}, a_src))
            index = addr(j_off, j=2) if in_loop else first_k // plan.kc  # the chunk's index in the tile's K
            return [WaitFlag(Pipe.MTE1, Pipe.MTE2, _CHUNK[i]), *loads, SetFlag(Pipe.MTE2, Pipe.MTE1, _CHUNK[i]),
                    WaitFlag(Pipe.MTE2, Pipe.MTE1, _CHUNK[i]), *slices(kk, a_src, plan.b_l1[i], index),
                    SetFlag(Pipe.MTE1, Pipe.MTE2, _CHUNK[i])]
        return make

    # the FixPipe conversion of C's tiles (a split-K piece adds into C atomically); none (not
    # interpretable yet) where FixPipe also applies a bias or dequant scales
    add = "add_" if plan.k_piece < p.k else ""
    acc = "s32_" if p.dtype == "int8" else ""  # an int8 Mmad's accumulators are int32
    fix = f"fix_{add}{acc}{p.out_dtype}" if plan.bt is None and plan.fb is None else ""

    def tile(c0: int, pieces) -> list:
        """One output tile at column c0: stream its K into L0C, then one FixPipe write
        per part it overlaps."""
        out: list = [WaitFlag(Pipe.FIX, Pipe.M, _L0C)]
        if plan.extra_l1 is not None:  # this tile's bias and/or dequant scales
            # bias and scales (fp32) are two GM tensors: one copy each, side by side in L1 (32-byte aligned)
            srcs = [(x, be) for x, be in ((plan.bias, plan.bias_elem), (plan.scale, 4)) if x is not None]
            slot = align_up(bn * 4, 32)
            out += [WaitFlag(Pipe.MTE1, Pipe.MTE2, _TILE_EXTRA)]
            out += [Copy(Mem.GM, Mem.L1, addr(src.addr + c0 * be, ni=t.base_n * be, block=plan.block_cols * be),
                         plan.extra_l1 + i * slot, bn * be) for i, (src, be) in enumerate(srcs)]
            out += [SetFlag(Pipe.MTE2, Pipe.MTE1, _TILE_EXTRA), WaitFlag(Pipe.MTE2, Pipe.MTE1, _TILE_EXTRA)]
            if plan.bt is not None:  # MTE1 widens a 2-byte bias to fp32 on the way; it moves the L1 bytes
                out.append(Copy(Mem.L1, Mem.BT, plan.extra_l1, plan.bt, bn * plan.bias_elem))
            if plan.fb is not None:
                out.append(Copy(Mem.L1, Mem.FB, plan.extra_l1 + (slot if plan.bt is not None else 0), plan.fb, bn * 4))
            out.append(SetFlag(Pipe.MTE1, Pipe.MTE2, _TILE_EXTRA))
        out += pingpong("j", chunks, chunk(c0, plan.kc, 0, True))
        if tail:
            out += chunk(c0, tail, chunks * plan.kc, False)(chunks % 2, 0)
        out += [SetFlag(Pipe.M, Pipe.FIX, _L0C), WaitFlag(Pipe.M, Pipe.FIX, _L0C)]
        for part, off, cols in pieces:
            # L0C holds the tile in 16-column fractals: a write starting mid-fractal
            # reads from that fractal's start (the address), skipping the columns before
            out.append(plan.lc[part].store(plan.c_l0 + off // 16 * 16 * 4, (b0, r0, c0 + off - plan.parts[part][0]),
                                           bm, cols, c_moves, align_up(bn, 16) * 4, fix))
        return out + [SetFlag(Pipe.FIX, Pipe.M, _L0C)]

    m_body: list = [Loop("ni", cnt, tile((n0 + j) * t.base_n, pieces))
                    for j, cnt, pieces in _part_runs(plan, n0, nn, bn)]
    if t.a_resident:
        panel = la.copy((b0, r0, k0), bm, k_len, a_moves, plan.a_l1[0])
        m_body = [WaitFlag(Pipe.MTE1, Pipe.MTE2, _PANEL), panel, SetFlag(Pipe.MTE2, Pipe.MTE1, _PANEL),
                  WaitFlag(Pipe.MTE2, Pipe.MTE1, _PANEL), *m_body, SetFlag(Pipe.MTE1, Pipe.MTE2, _PANEL)]
    return [Loop("bb", nb, [Loop("kp", ns, [Loop("mi", nm, m_body)])])]


def _part_runs(plan: _Plan, n0: int, nn: int, bn: int) -> list[tuple[int, int, tuple]]:
    """(first tile from n0, count, FixPipe writes) runs of the N tiles n0..n0+nn-1:
    tiles inside one part make a run (their writes move by base_n), a tile straddling
    a part boundary stands alone."""
    base_n = plan.t.base_n
    if len(plan.parts) == 1:
        return [(0, nn, ((0, 0, bn),))]
    runs: list[list] = []
    for j in range(nn):
        pieces = _pieces(list(plan.parts), (n0 + j) * base_n, bn)
        if runs and len(pieces) == 1 and runs[-1][2] == pieces:
            runs[-1][1] += 1
        else:
            runs.append([j, 1, pieces])
    return [tuple(r) for r in runs]

