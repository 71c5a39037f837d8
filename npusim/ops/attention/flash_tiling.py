"""FlashAttention: tiling, local buffers (geometry), the steps of a q tile and how
q tiles are split over blocks."""

from __future__ import annotations

import attrs
from attrs import frozen, validators

from npusim.errors import ConfigError, ProgramError
from npusim.hw import HwConfig
from npusim.hw.derived import mmad_fractal
from npusim.isa.instructions import l0b_block_bytes
from npusim.isa.program import DTYPE_BYTES
from npusim.ops.build import Buffers, align_up, cdiv
from npusim.ops.registry import param
from npusim.ops.attention.common import AttentionParams, L0A, L0B, L0C, L1, STAT, _table_bytes, UB
from npusim.ops.attention.online_softmax import F32


# ================================================================ FlashAttention


@frozen
class FlashAttentionTiling:
    q_tile: int = param(0, "query rows per block step (the cube's M; each AIV takes half); 0 = auto",
                        validator=validators.ge(0))
    kv_tile: int = param(0, "keys per step: one cross-core round trip (S, P, partial O through GM); 0 = auto",
                         validator=validators.ge(0))
    sub_tile: int = param(0, "keys per Mmad / L0C tile inside a step (divides kv_tile); 0 = auto",
                          validator=validators.ge(0))
    d_chunk: int = param(0, "head_dim columns per cube pass (a multiple of 16; >= head_dim = the whole head): "
                            "Q K^T accumulates in L0C over head_dim chunks, P V makes O a column chunk at a "
                            "time; 0 = auto (the whole head where it fits L0, else the widest chunk that fits "
                            "with the tiles chosen)",
                         validator=validators.ge(0))
    vec_rows: int = param(0, "rows per AIV chunk of a step (ping-pong in UB); 0 = most that fit",
                          validator=validators.ge(0))
    q_splits: int = param(0, "parts the q tiles of each leftover head are split into; 0 = balance the cores",
                          validator=validators.ge(0))


# Cross-core flag ids (MIX): AIC -> AIVs, AIVs -> AIC.
_S_READY, _O_READY, _P_READY, _S_FREE = 0, 1, 2, 3
# AIC flag ids MTE2 <-> MTE1: each L1 buffer pair (ping, pong).
_Q, _K, _V, _P = 0, 2, 4, 6


@frozen
class _Tile:
    q0: object  # first query row of the tile (int, or an Affine moving with a loop: isa.program.offset)
    rows: int
    tp: int  # tile parity: which Q buffer and statistics set


@frozen
class _Step:
    tile: _Tile
    k0: object  # first key (int or Affine)
    kt: int  # keys loaded
    nsub: int  # Mmad sub-tiles
    nb: int  # keys per sub-tile (all equal; nsub * nb >= kt, padding masked)
    masked: bool
    first: bool  # first step of its tile
    last: bool
    sp: int  # step parity: which K/V/P L1 buffers and workspace slots


@frozen
class _FaGeometry:
    """Shapes, buffers and addresses shared by every block of a FlashAttention kernel."""

    p: AttentionParams
    t: FlashAttentionTiling
    e: int
    qt: int
    kt: int
    nb: int
    dc: int  # head_dim columns per cube pass (d_chunk): the whole head, padded to fractal blocks, if unsplit
    rc: int  # AIV rows per chunk
    aic: tuple  # AIC buffers
    aiv: tuple  # AIV buffers
    l1: dict
    l0: dict
    ub: dict
    ws_bytes: int  # workspace per block
    ws: dict  # workspace offsets: S/P/O slot of parity sp
    # 0: row i of q is query i; else (causal only) rows are GQA-packed (flash.lower_flash_attention):
    # query head after query head of `period` queries each, row i being query i % period
    period: int = 0

    def step_shape(self, kt: int) -> tuple[int, int]:
        """(sub-tiles, keys per sub-tile) of a step loading kt keys."""
        nsub = cdiv(kt, self.nb)
        return nsub, min(self.nb, align_up(cdiv(kt, nsub), 16))

    def chunks(self) -> list[tuple[int, int]]:
        """(first column, columns) of each head_dim chunk: [(0, head_dim)] unsplit; the
        last chunk takes what is left (its fractal blocks padded as the whole head's)."""
        d = self.p.head_dim
        return [(c0, min(self.dc, d - c0)) for c0 in range(0, d, self.dc)]


def _fa_geometry(p: AttentionParams, t: FlashAttentionTiling, hw: HwConfig, period: int = 0,
                 op_name: str = "flash_attention") -> _FaGeometry:
    """Allocate every local buffer (L0 first: it is what a large head_dim runs out of
    unless tiling.d_chunk splits the head there; L1 and UB hold it whole).
    period: see _FaGeometry (a causal packed kernel keeps each row's query index in UB).
    op_name: the op its errors name ('op NAME: ...'; see flash.lower_flash_attention)."""
    f = mmad_fractal(hw, p.dtype)
    for name, v in (("q_tile", t.q_tile), ("kv_tile", t.kv_tile), ("sub_tile", t.sub_tile)):
        if v % 16 or not v:
            raise ProgramError(f"op {op_name}: tiling {name}={v} is not a positive multiple of 16")
    if t.kv_tile % t.sub_tile:
        raise ProgramError(f"op {op_name}: tiling sub_tile={t.sub_tile} does not divide kv_tile={t.kv_tile}")
    e, d = DTYPE_BYTES[p.dtype], p.head_dim
    qt = min(t.q_tile, align_up(p.seq_q, f.m0))
    nb = min(t.sub_tile, align_up(p.seq_kv, 16))
    kt = min(t.kv_tile, align_up(p.seq_kv, nb))  # whole sub-tiles: a short step's padding stays inside
    dc = _chunk_cols(p, t.d_chunk, op_name)
    cube = Buffers(hw, op_name)
    l0 = _l0_buffers(cube, p, qt, nb, dc)
    # L1 holds the whole head (Q and V as whole 16-column fractal blocks, dp columns)
    dp = align_up(d, 16)
    l1 = {
        "q": [cube.alloc(f"q_l1_{i}", L1, qt * dp * e) for i in (0, 1)],
        # (a key's piece of K takes its DMA's 32-byte-aligned share: verify's reach of the load)
        "k": [cube.alloc(f"k_l1_{i}", L1, kt * align_up(d * e, 32)) for i in (0, 1)],
        "v": [cube.alloc(f"v_l1_{i}", L1, kt * dp * e) for i in (0, 1)],
        "p": [cube.alloc(f"p_l1_{i}", L1, qt * kt * e) for i in (0, 1)],
    }
    if _table_bytes(p, p.seq_kv):
        l1["table"] = cube.alloc("block_table", L1, _table_bytes(p, p.seq_kv))
    r = cdiv(qt, 2)  # rows per AIV

    def vec_buffers(rc: int) -> tuple[Buffers, dict]:
        vec = Buffers(hw, op_name)
        ub = {
            "s": [vec.alloc(f"s_ub_{i}", UB, rc * kt * 4) for i in (0, 1)],
            "p": [vec.alloc(f"p_ub_{i}", UB, rc * kt * e) for i in (0, 1)],
            "oacc": vec.alloc("o_acc", UB, r * d * 4),
            "opart": vec.alloc("o_part", UB, r * d * 4),
            "oout": vec.alloc("o_out", UB, r * d * e),
            "m": [vec.alloc(f"row_max_{i}", UB, r * STAT) for i in (0, 1)],
            "l": [vec.alloc(f"row_sum_{i}", UB, r * STAT) for i in (0, 1)],
            "alpha": [vec.alloc(f"rescale_{i}", UB, r * STAT) for i in (0, 1)],
            "red": vec.alloc("reduce", UB, r * STAT),
            "ramp": vec.alloc("key_ramp", UB, align_up(max(kt, rc, period), 8) * 4),  # 0, 1, 2, ...: indices
            "mask": vec.alloc("mask_bits", UB, rc * cdiv(kt, 8)),
        }
        if period:  # each packed row's query index, one STAT block a row
            ub["row_query"] = vec.alloc("row_query", UB, align_up(p.seq_q, period) * STAT)
        return vec, ub

    if t.vec_rows:
        if t.vec_rows > r:  # it would run as r: the tiling printed would not be the one run
            raise ProgramError(f"op {op_name}: tiling vec_rows={t.vec_rows} exceeds the rows each AIV takes "
                               f"of a q tile (half of it: {r} of q_tile {qt})")
        rc = t.vec_rows
    else:  # the most rows per chunk that fit, then chunks of equal size
        rc = next((n for n in range(r, 1, -1) if _fits(lambda: vec_buffers(n))), 1)
        rc = cdiv(r, cdiv(r, rc))
    vec, ub = vec_buffers(rc)
    s_b, p_b, o_b = qt * kt * 4, qt * kt * e, qt * d * 4
    ws = {"s": (0, s_b), "p": (2 * s_b, 2 * s_b + p_b), "o": (2 * s_b + 2 * p_b, 2 * s_b + 2 * p_b + o_b)}
    ws_bytes = align_up(2 * (s_b + p_b + o_b), 512)
    return _FaGeometry(p, t, e, qt, kt, nb, dc, rc, tuple(cube.buffers), tuple(vec.buffers), l1, l0, ub, ws_bytes,
                       ws, period)


def _chunk_cols(p: AttentionParams, d_chunk: int, op_name: str) -> int:
    """The head_dim columns of a cube pass for tiling.d_chunk: the whole head (padded to
    fractal blocks) when it is 0 or not narrower than the head, else d_chunk, which
    must be whole 16-column fractal blocks (a chunk's Q and V slices are whole blocks
    in L1, and K^T's whole rows of its key blocks)."""
    d = p.head_dim
    if not d_chunk or d_chunk >= d:
        return align_up(d, 16)
    if d_chunk % 16:
        raise ProgramError(f"op {op_name}: tiling d_chunk={d_chunk} is not a multiple of 16 "
                           f"(nor >= head_dim={d})")
    return d_chunk


def _l0_buffers(cube: Buffers, p: AttentionParams, qt: int, nb: int, dc: int) -> dict:
    """The L0 tiles (ping-pong) of q tile rows qt, nb keys a sub-tile and head_dim chunks
    of dc columns. Q and V [.., head_dim] sit as whole 16-column fractal blocks (dc
    columns: a chunk's, or the whole head padded; the last block's padding unused);
    K^T [head_dim, keys] as blocks of 16 keys of a chunk's head_dim rows, each on an
    L0B boundary in L0B (the cube reads B by blocks). L0C holds S [qt, nb] (summed over
    the chunks) or a column chunk of O [qt, dc]."""
    e = DTYPE_BYTES[p.dtype]
    rows_k = min(dc, p.head_dim)  # K^T rows of the widest chunk (the whole head: unpadded)
    return {
        "a": [cube.alloc(f"a_l0_{i}", L0A, qt * max(dc, nb) * e) for i in (0, 1)],
        "b": [cube.alloc(f"b_l0_{i}", L0B, max(dc * nb * e, nb // 16 * l0b_block_bytes(rows_k, e))) for i in (0, 1)],
        "c": [cube.alloc(f"c_l0_{i}", L0C, qt * max(nb, dc) * 4) for i in (0, 1)],
    }


def _fits(build) -> bool:
    try:
        build()
        return True
    except ProgramError:
        return False


def _l0_fits(p: AttentionParams, hw: HwConfig, qt: int, nb: int, dc: int) -> bool:
    """Whether the L0 tiles of q_tile qt, sub_tile nb (as the geometry caps them by the
    sequence lengths) and head_dim chunks of dc columns fit."""
    qt, nb = min(qt, align_up(p.seq_q, mmad_fractal(hw, p.dtype).m0)), min(nb, align_up(p.seq_kv, 16))
    return _fits(lambda: _l0_buffers(Buffers(hw, "flash_attention"), p, qt, nb, dc))


def _widest_chunk(p: AttentionParams, hw: HwConfig, qt: int, nb: int) -> int:
    """d_chunk: the widest head_dim chunk whose L0 tiles fit with q tile qt and sub-tile
    nb: the whole head if it fits, else the head cut into 2, 3, ... near-equal chunks
    of whole fractal blocks (the narrowest, one block, if nothing fits: the geometry
    then names the buffer). Each further chunk costs Mmad start-ups and, in P V, a
    reload of P into L0A; L1 and UB hold the whole head either way."""
    dp = align_up(p.head_dim, 16)
    # (at most CHUNKS_MAX chunks: a head that needs more does not fit L1 or UB anyway, and
    # a head_dim of 2^31 listed 2^27 widths before its tensors were refused)
    widths = dict.fromkeys(align_up(cdiv(dp, n), 16) for n in range(1, min(dp // 16, CHUNKS_MAX) + 1))
    return next((w for w in widths if _l0_fits(p, hw, qt, nb, w)), 16)


# the most head_dim chunks _widest_chunk tries (4096 chunks of one fractal block: a head of 65,536)
CHUNKS_MAX = 4096
# choose_flash_tiling's candidates, largest first
Q_TILES, KV_TILES, SUB_TILES = (128, 64, 32, 16), (256, 128, 64, 32), (128, 64, 32, 16)


def _candidates(given: FlashAttentionTiling):
    """(q_tile, kv_tile, sub_tile) of the fields not `given`, largest first."""
    for qt in (given.q_tile,) if given.q_tile else Q_TILES:
        for kt in (given.kv_tile,) if given.kv_tile else KV_TILES:
            for nb in (given.sub_tile,) if given.sub_tile else SUB_TILES:
                if nb <= kt and kt % nb == 0:
                    yield qt, kt, nb


def choose_flash_tiling(p: AttentionParams, hw: HwConfig, given: FlashAttentionTiling = FlashAttentionTiling(),
                        period: int = 0, op_name: str = "flash_attention") -> FlashAttentionTiling:
    """The tiles (of those not `given`) whose buffers fit twice over (ping-pong) in L1,
    L0 and UB. A head whose L0 tiles fit whole at the largest tiles (head_dim <= 128),
    or a given d_chunk: the largest tiles that fit, q_tile 128 x kv_tile 256 for
    head_dim <= 128 (_largest). A larger head is split over head_dim in L0 (the widest
    chunk that fits), so that L1 and UB, which hold it whole, set the tiles rather than
    L0; of the tiles that then fit, the least GM traffic (_least_traffic). A head too
    large for even the smallest tiles raises the error naming the buffer (and op_name)."""
    whole = align_up(p.head_dim, 16)
    if given.d_chunk or _l0_fits(p, hw, given.q_tile or Q_TILES[0], given.sub_tile or SUB_TILES[0], whole):
        return _largest(p, hw, attrs.evolve(given, d_chunk=given.d_chunk or whole), period, op_name)
    return _least_traffic(p, hw, given, period, op_name)


def _no_tiling(given: FlashAttentionTiling, op_name: str) -> ProgramError:
    return ProgramError(f"op {op_name}: tiling sub_tile={given.sub_tile} does not divide "
                        f"kv_tile={given.kv_tile}")


def _largest(p: AttentionParams, hw: HwConfig, given: FlashAttentionTiling, period: int,
             op_name: str) -> FlashAttentionTiling:
    """The first tiles (largest q_tile, then kv_tile, then sub_tile) that fit, d_chunk given."""
    err = None
    for qt, kt, nb in _candidates(given):
        t = attrs.evolve(given, q_tile=qt, kv_tile=kt, sub_tile=nb)
        try:
            _fa_geometry(p, t, hw, period, op_name)
            return t
        except ProgramError as e:
            err = e
    raise err or _no_tiling(given, op_name)


def _least_traffic(p: AttentionParams, hw: HwConfig, given: FlashAttentionTiling, period: int,
                   op_name: str) -> FlashAttentionTiling:
    """A split head's tiles, each with its widest fitting head_dim chunk: of those that
    fit, the ones whose AIVs take a step's rows in one UB chunk (a q tile larger than
    that adds vector instructions, and their start-ups, to every step: UB holds the
    whole head's O twice, so a large head leaves little room for scores), then the
    least _pair_bytes; on a tie the wider chunk (fewer O chunks, each FixPipe'd one row
    a segment), then the larger tiles."""
    best, err = None, None
    for qt, kt, nb in _candidates(given):
        t = attrs.evolve(given, q_tile=qt, kv_tile=kt, sub_tile=nb, d_chunk=_widest_chunk(p, hw, qt, nb))
        try:
            g = _fa_geometry(p, t, hw, period, op_name)
        except ProgramError as e:
            err = e
            continue
        key = (g.rc < cdiv(g.qt, 2), _pair_bytes(g), -g.dc)
        if best is None or key < best[0]:
            best = (key, t)
    if best is None:
        raise err or _no_tiling(given, op_name)
    return best[1]


def _pair_bytes(g: _FaGeometry) -> float:
    """GM bytes per (query, key) pair that depend on the tiles: K and V read again for
    every q tile (head_dim elements each per key, shared by the tile's rows) and the
    partial O of every step (head_dim fp32 a row, FixPipe'd by the cube and read back by
    the AIVs, shared by the step's keys). # assumption: these set a large head's time
    (the cube's MTE2, its FixPipe and the AIVs' MTE2 move them); S and P cost every
    tiling the same per pair"""
    d = g.p.head_dim
    return 2 * d * g.e / g.qt + 2 * d * F32 / g.kt


def _tile_keys(g: _FaGeometry, t: int) -> tuple[int, int, int, int]:
    """(rows, query of its first row, key offset, keys it reads) of q tile t: keys past
    the causal limit of its last row are not read."""
    p = g.p
    q0 = t * g.qt
    rows = min(g.qt, p.seq_q - q0)
    if g.period:  # GQA-packed rows: query (q0 + i) % period of its head
        queries = [(q0 + i) % g.period for i in range(rows)]
        first, last, off = min(queries), max(queries), p.seq_kv - g.period
    else:
        first, last, off = q0, q0 + rows - 1, p.seq_kv - p.seq_q
    return rows, first, off, min(p.seq_kv, last + 1 + off) if p.causal else p.seq_kv


def _tile_steps(g: _FaGeometry, t: int) -> tuple[int, list[tuple[int, int, bool]]]:
    """(rows, [(first key, keys, masked)]) of q tile t: keys past the causal limit of
    its last row are skipped; a step is masked if some key in it is hidden from some row
    (or its sub-tiles pad past the keys)."""
    p = g.p
    rows, first, off, kv_end = _tile_keys(g, t)
    steps = []
    for k0 in range(0, kv_end, g.kt):
        kt = min(g.kt, kv_end - k0)
        nsub, nb = g.step_shape(kt)
        masked = (p.causal and k0 + kt - 1 > first + off) or nsub * nb > kt
        steps.append((k0, kt, masked))
    return rows, steps


# The most key steps (a q tile's step of kv_tile keys, over every q tile of every head) a
# FlashAttention kernel may have: the engine takes 15 to 300 us each (whole heads alike
# on every core least: K3's causal prefill of 32 x 4096 at 16 heads, 139,264 steps, 2 s
# on 2 cores; heads split into parts most: a causal prefill of 65,536 tokens on 8 heads,
# 526,336 steps, 155 s), so 2^22 is minutes (131,072 tokens on 8 heads); one head of
# 1,000,000 tokens is 30 million (hours, and minutes to list its steps first).
STEPS_MAX = 1 << 22


def check_steps(g: _FaGeometry, n_tiles: int, op_name: str) -> None:
    """Refuse, in one line, a kernel of more than STEPS_MAX key steps, before its q tiles'
    steps are listed (the listing alone takes minutes past it)."""
    p = g.p
    steps = p.batch * p.heads * sum(cdiv(_tile_keys(g, t)[3], g.kt) for t in range(n_tiles))
    if steps > STEPS_MAX:
        shape = f"batch={p.batch} x heads={p.heads} x seq_q={p.seq_q} x seq_kv={p.seq_kv}" + " causal" * p.causal
        raise ConfigError(f"op {op_name}: {shape} is {steps} key steps of {g.qt} queries x {g.kt} keys, more "
                          f"than the {STEPS_MAX} (2^22) npusim simulates (minutes)")


def _partition(work: list[int], parts: int, contiguous: bool) -> list[list[int]]:
    """Split q tiles 0..n-1 into `parts` non-empty sets of near-equal work: contiguous
    ranges when every tile costs the same, else longest-first onto the least loaded."""
    n = len(work)
    parts = min(parts, n)
    if contiguous:
        size = cdiv(n, parts)
        return [list(range(s, min(n, s + size))) for s in range(0, n, size)]
    load = [0] * parts
    sets: list[list[int]] = [[] for _ in range(parts)]
    for t in sorted(range(n), key=lambda t: (-work[t], t)):
        i = min(range(parts), key=lambda i: (load[i], i))
        load[i] += work[t]
        sets[i].append(t)
    return [sorted(s) for s in sets]


def _splits(heads: int, cores: int, work: list[int], contiguous: bool) -> int:
    """Parts to split each of `heads` leftover heads into so the blocks fill the cores:
    least (waves x heaviest part), fewer parts on a tie (each part re-reads K and V)."""
    best = None
    for parts in range(1, min(len(work), 4 * cores) + 1):
        sets = _partition(work, parts, contiguous)
        cost = cdiv(heads * len(sets), cores) * (max(sum(work[t] for t in s) for s in sets) + 1)
        if best is None or cost < best[0]:
            best = (cost, len(sets))
    return best[1]
