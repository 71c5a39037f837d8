"""Attention: FlashAttention as one MIX kernel, flash-decoding on the vector cores,
and the unfused 5-kernel chain it replaces.

Tensors are BNSD: q [batch, heads, seq_q, head_dim], k and v [batch, kv_heads,
seq_kv, head_dim], o like q; fp16 by default. Query head h reads K/V head
h // (heads // kv_heads) (GQA; kv_heads == heads is plain multi-head attention).
Causal masks are aligned to the end of the keys: query i sees keys <= i + seq_kv - seq_q.

FlashAttention and flash-decoding read K and V from a KV cache in any of
kv_cache_write's layouts (`kv_layout`: per_layer, contiguous, paged), through the
same `KvCache` addresses and GM tensor names (per_layer "k_cache" / "v_cache",
contiguous "kv_cache", paged "k_cache" / "v_cache" / "block_table"), so a graph binds
the writer's and the readers' names to the same tensors. The layout changes what a
K/V load is: one segment per run of tokens (per_layer), rows carrying K and V side
by side (contiguous), one segment per block in scattered order plus the block-table
read (paged).

Broadcast of a per-row statistic (the running max, sum or rescale factor) is one
vector instruction over the whole tile: the statistics sit in UB as 32-byte
blocks per row (what Brcb produces), and the binary op reads them with a zero
repeat stride. # assumption: no per-row instruction or scalar round trip
"""

from __future__ import annotations

import math

import attrs
import numpy as np
from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import (
    DTYPE_BYTES, Affine, Copy, CoreType, CrossSetFlag, CrossWaitFlag, GmTensor, Kernel, Loop, Mem, Mmad, Pipe,
    Program, SetFlag, VecOp, WaitFlag, addr, shift,
)
from npusim.ops.build import Buffers, align_up, cdiv, pingpong
from npusim.kvcache import KV_LAYOUTS, KvLayout
from npusim.ops.kv_cache import KvCache, kv_row_align_bytes, kv_row_bytes
from npusim.ops.layout import gm_copy
from npusim.ops.reference import attention, batches_to, bsnd_to_batches, group_heads
from npusim.ops.registry import OPS, GmArena, Lowered, TensorInfo, lower, param, register
from npusim.ops.vector import UB_BLOCK
from npusim.ops.vector_kernels import Stream, streaming_kernel

_pos = validators.gt(0)
_DTYPES = validators.in_(("fp16", "bf16"))
MTE1, MTE2, MTE3, FIX, M, V = Pipe.MTE1, Pipe.MTE2, Pipe.MTE3, Pipe.FIX, Pipe.M, Pipe.V
GM, L1, L0A, L0B, L0C, UB = Mem.GM, Mem.L1, Mem.L0A, Mem.L0B, Mem.L0C, Mem.UB
STAT = 32  # UB bytes of one row's statistic: one 32-byte block (8 fp32), as Brcb lays it out


def _divides_heads(inst, attribute, value) -> None:
    if value > inst.heads or inst.heads % value:
        raise ValueError(f"kv_heads={value} must divide heads={inst.heads}")


def _below_layers(inst, attribute, value) -> None:
    if value >= inst.layers:
        raise ValueError(f"'layer' {value} must be < layers {inst.layers}")


# The KV-cache fields of the readers (as kv_cache_write's layout, layers, layer, block_tokens).
_KV_LAYOUT_HELP = "KV cache layout read: per_layer | contiguous | paged (as kv_cache_write writes it)"
_LAYERS_HELP = "decoder layers the cache holds (the contiguous layout keeps all of them in one tensor)"
_LAYER_HELP = "the layer read (its slice of the contiguous cache)"
_BLOCK_HELP = "tokens per block of the paged layout"


@frozen
class AttentionParams:
    batch: int = param(1, "sequences", validator=_pos)
    heads: int = param(32, "query heads", validator=_pos)
    kv_heads: int = param(32, "K/V heads; fewer than heads is GQA (each serves heads // kv_heads query heads)",
                          validator=[_pos, _divides_heads])
    head_dim: int = param(128, "elements per head", validator=_pos)
    seq_q: int = param(4096, "query length", validator=_pos)
    seq_kv: int = param(4096, "key/value length", validator=_pos)
    causal: bool = param(False, "query i sees only keys <= i + seq_kv - seq_q")
    dtype: str = param("fp16", "dtype of q, k, v and o", validator=_DTYPES)

    def __attrs_post_init__(self):
        if self.causal and self.seq_q > self.seq_kv:
            raise ValueError(f"causal attention needs seq_q ({self.seq_q}) <= seq_kv ({self.seq_kv})")

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def visible_pairs(self) -> int:
        """(query, key) pairs the mask lets through, per head."""
        if not self.causal:
            return self.seq_q * self.seq_kv
        off = self.seq_kv - self.seq_q
        return sum(min(self.seq_kv, i + off + 1) for i in range(self.seq_q))


@frozen
class FlashAttentionParams(AttentionParams):
    """AttentionParams plus where K and V come from: a KV cache of seq_kv tokens per sequence."""

    kv_layout: str = param("per_layer", _KV_LAYOUT_HELP, validator=validators.in_(KV_LAYOUTS))
    layers: int = param(1, _LAYERS_HELP, validator=_pos)
    layer: int = param(0, _LAYER_HELP, validator=[validators.ge(0), _below_layers])
    block_tokens: int = param(128, _BLOCK_HELP, validator=_pos)

    def kv_cache(self, row_align_bytes: int | None = None) -> KvLayout:
        """The cache read (one layer's view of it)."""
        return KvLayout(self.kv_layout, self.batch, self.kv_heads, self.seq_kv, self.head_dim, self.dtype,
                        self.layers, self.layer, self.block_tokens, row_align_bytes)


def _io(p: AttentionParams) -> tuple[list[TensorInfo], list[TensorInfo]]:
    qs = (p.batch, p.heads, p.seq_q, p.head_dim)
    ks = (p.batch, p.kv_heads, p.seq_kv, p.head_dim)
    return ([TensorInfo("q", qs, p.dtype), TensorInfo("k", ks, p.dtype), TensorInfo("v", ks, p.dtype)],
            [TensorInfo("o", qs, p.dtype)])


def _kv_inputs(cache: KvCache) -> list[TensorInfo]:
    """The cache bytes an attention kernel must read, as profiling lists them: whole
    per_layer tensors; the layer's slice of the contiguous cache (K and V of every
    token, without the row padding); the tokens of the paged pools and the block
    table. (The roofline counts every listed byte as read.)"""
    p = cache.layout
    tokens = (p.batch, p.kv_heads, p.context, p.head_dim)
    if p.layout == "per_layer":
        return [TensorInfo("k_cache", tokens, p.dtype), TensorInfo("v_cache", tokens, p.dtype)]
    if p.layout == "contiguous":
        return [TensorInfo("kv_cache_layer", (p.batch, p.kv_heads, p.context, 2 * p.head_dim), p.dtype)]
    return [TensorInfo("k_cache_blocks", tokens, p.dtype), TensorInfo("v_cache_blocks", tokens, p.dtype),
            TensorInfo("block_table", (p.batch, cache.max_blocks), "int32")]


def _kv_cache(p, hw: HwConfig, gm: GmArena, op: str) -> KvCache:
    """The KvCache a reader with params p (kv_layout, layers, layer, block_tokens) sees."""
    e = DTYPE_BYTES[p.dtype]
    if p.kv_layout != "per_layer" and (p.head_dim * e) % UB_BLOCK:
        raise ProgramError(f"op {op}: head_dim={p.head_dim} makes a head {p.head_dim * e} bytes, not a multiple "
                           f"of {UB_BLOCK}: the {p.kv_layout} layout's pieces would be misaligned in local memory")
    return KvCache(p.kv_cache(kv_row_align_bytes(hw)), gm)


def _table_read(cache: KvCache, b: int, first: int, last: int, mem: Mem, dst: int) -> list:
    """Paged: the block-table entries first..last of sequence b, read once at the start of
    a block (one small transfer), then handed to the scalar unit, which turns them into
    the addresses of the block loads before MTE2 may issue them.
    # assumption: the scalar unit's table lookups cost the transfer and the hand-off only"""
    n = last - first + 1
    return [Copy(GM, mem, cache.table.addr + (b * cache.max_blocks + first) * 4, dst, n * 4),
            SetFlag(MTE2, Pipe.S, 0), WaitFlag(MTE2, Pipe.S, 0), SetFlag(Pipe.S, MTE2, 0), WaitFlag(Pipe.S, MTE2, 0)]


def _table_bytes(p, context: int) -> int:
    """Local bytes for a whole sequence's block-table entries (paged; 0 otherwise)."""
    return cdiv(context, p.block_tokens) * 4 if p.kv_layout == "paged" else 0


# ================================================================ FlashAttention


@frozen
class FlashAttentionTiling:
    q_tile: int = param(0, "query rows per block step (the cube's M; each AIV takes half); 0 = auto",
                        validator=validators.ge(0))
    kv_tile: int = param(0, "keys per step: one cross-core round trip (S, P, partial O through GM); 0 = auto",
                         validator=validators.ge(0))
    sub_tile: int = param(0, "keys per Mmad / L0C tile inside a step (divides kv_tile); 0 = auto",
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
class _Lin:
    """c + sum(coef * var): an index that moves with loop variables."""

    c: int
    terms: tuple = ()

    def plus(self, var: str, coef: int) -> _Lin:
        return _Lin(self.c, self.terms + ((var, coef),))


def _at(base, idx: _Lin, scale: int):
    """GM address base (int or Affine in `block`) + idx * scale."""
    b, terms = (base, {}) if isinstance(base, int) else (base.base, dict(base.terms))
    for var, k in idx.terms:
        terms[var] = terms.get(var, 0) + k * scale
    return addr(b + idx.c * scale, **terms)


def _sub(a, step: int):
    """Address a moved by `step` per AIV of the block (the `sub` variable)."""
    if not step:
        return a
    base, terms = (a, ()) if isinstance(a, int) else (a.base, a.terms)
    return Affine(base, terms + (("sub", step),))


@frozen
class _Tile:
    q0: _Lin  # first query row of the tile
    rows: int
    tp: int  # tile parity: which Q buffer and statistics set


@frozen
class _Step:
    tile: _Tile
    k0: _Lin  # first key
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
    rc: int  # AIV rows per chunk
    aic: tuple  # AIC buffers
    aiv: tuple  # AIV buffers
    l1: dict
    l0: dict
    ub: dict
    ws_bytes: int  # workspace per block
    ws: dict  # workspace offsets: S/P/O slot of parity sp

    def step_shape(self, kt: int) -> tuple[int, int]:
        """(sub-tiles, keys per sub-tile) of a step loading kt keys."""
        nsub = cdiv(kt, self.nb)
        return nsub, min(self.nb, align_up(cdiv(kt, nsub), 16))


def _fa_geometry(p: AttentionParams, t: FlashAttentionTiling, hw: HwConfig) -> _FaGeometry:
    """Allocate every local buffer (L0 first: it is what a large head_dim runs out of)."""
    f = hw.aic.mmad_fractals[p.dtype]
    for name, v in (("q_tile", t.q_tile), ("kv_tile", t.kv_tile), ("sub_tile", t.sub_tile)):
        if v % 16 or not v:
            raise ProgramError(f"op flash_attention: tiling {name}={v} is not a positive multiple of 16")
    if t.kv_tile % t.sub_tile:
        raise ProgramError(f"op flash_attention: tiling sub_tile={t.sub_tile} does not divide kv_tile={t.kv_tile}")
    e, d = DTYPE_BYTES[p.dtype], p.head_dim
    qt = min(t.q_tile, align_up(p.seq_q, f.m0))
    nb = min(t.sub_tile, align_up(p.seq_kv, 16))
    kt = min(t.kv_tile, align_up(p.seq_kv, nb))  # whole sub-tiles: a short step's padding stays inside
    cube = Buffers(hw, "flash_attention")
    l0 = {
        "a": [cube.alloc(f"a_l0_{i}", L0A, qt * max(d, nb) * e) for i in (0, 1)],
        "b": [cube.alloc(f"b_l0_{i}", L0B, d * nb * e) for i in (0, 1)],
        "c": [cube.alloc(f"c_l0_{i}", L0C, qt * max(nb, d) * 4) for i in (0, 1)],
    }
    l1 = {
        "q": [cube.alloc(f"q_l1_{i}", L1, qt * d * e) for i in (0, 1)],
        "k": [cube.alloc(f"k_l1_{i}", L1, kt * d * e) for i in (0, 1)],
        "v": [cube.alloc(f"v_l1_{i}", L1, kt * d * e) for i in (0, 1)],
        "p": [cube.alloc(f"p_l1_{i}", L1, qt * kt * e) for i in (0, 1)],
    }
    if _table_bytes(p, p.seq_kv):
        l1["table"] = cube.alloc("block_table", L1, _table_bytes(p, p.seq_kv))
    r = cdiv(qt, 2)  # rows per AIV

    def vec_buffers(rc: int) -> tuple[Buffers, dict]:
        vec = Buffers(hw, "flash_attention")
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
            "ramp": vec.alloc("key_ramp", UB, kt * 4),
            "mask": vec.alloc("mask_bits", UB, rc * cdiv(kt, 8)),
        }
        return vec, ub

    if t.vec_rows:
        rc = min(t.vec_rows, r)
    else:  # the most rows per chunk that fit, then chunks of equal size
        rc = next((n for n in range(r, 1, -1) if _fits(lambda: vec_buffers(n))), 1)
        rc = cdiv(r, cdiv(r, rc))
    vec, ub = vec_buffers(rc)
    s_b, p_b, o_b = qt * kt * 4, qt * kt * e, qt * d * 4
    ws = {"s": (0, s_b), "p": (2 * s_b, 2 * s_b + p_b), "o": (2 * s_b + 2 * p_b, 2 * s_b + 2 * p_b + o_b)}
    ws_bytes = align_up(2 * (s_b + p_b + o_b), 512)
    return _FaGeometry(p, t, e, qt, kt, nb, rc, tuple(cube.buffers), tuple(vec.buffers), l1, l0, ub, ws_bytes, ws)


def _fits(build) -> bool:
    try:
        build()
        return True
    except ProgramError:
        return False


def choose_flash_tiling(p: AttentionParams, hw: HwConfig,
                        given: FlashAttentionTiling = FlashAttentionTiling()) -> FlashAttentionTiling:
    """The largest tiles (of those not `given`) whose buffers fit twice over (ping-pong)
    in L1, L0 and UB: q_tile 128 x kv_tile 256 for head_dim <= 128, smaller for larger
    heads. A head too large for even the smallest tiles raises the error naming the buffer."""
    err = None
    for qt in (given.q_tile,) if given.q_tile else (128, 64, 32, 16):
        for kt in (given.kv_tile,) if given.kv_tile else (256, 128, 64, 32):
            for nb in (given.sub_tile,) if given.sub_tile else (128, 64, 32, 16):
                if nb > kt or kt % nb:
                    continue
                t = attrs.evolve(given, q_tile=qt, kv_tile=kt, sub_tile=nb)
                try:
                    _fa_geometry(p, t, hw)
                    return t
                except ProgramError as e:
                    err = e
    if err is None:
        raise ProgramError(
            f"op flash_attention: tiling sub_tile={given.sub_tile} does not divide kv_tile={given.kv_tile}")
    raise err


def _tile_steps(g: _FaGeometry, t: int) -> tuple[int, list[tuple[int, int, bool]]]:
    """(rows, [(first key, keys, masked)]) of q tile t: keys past the causal limit of
    its last row are skipped; a step is masked if some key in it is hidden from some row
    (or its sub-tiles pad past the keys)."""
    p = g.p
    q0 = t * g.qt
    rows = min(g.qt, p.seq_q - q0)
    off = p.seq_kv - p.seq_q
    kv_end = min(p.seq_kv, q0 + rows + off) if p.causal else p.seq_kv
    steps = []
    for k0 in range(0, kv_end, g.kt):
        kt = min(g.kt, kv_end - k0)
        nsub, nb = g.step_shape(kt)
        masked = (p.causal and k0 + kt - 1 > q0 + off) or nsub * nb > kt
        steps.append((k0, kt, masked))
    return rows, steps


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

    def load(self, which: str, k0: _Lin, kt: int, dst: int) -> list:
        c = self.cache
        piece = c.layout.head_dim * c.layout.elem_bytes
        if c.layout.layout == "paged":
            assert not k0.terms, "paged steps are not looped: their blocks are data"
            out, off = [], 0
            for a, n in c.runs(which, self.seq, self.head, k0.c, kt):
                out.append(Copy(GM, L1, a, dst + off, n * piece))
                off += n * piece
            return out
        pitch = c.token_pitch()
        return [gm_copy(GM, L1, _at(self.k if which == "k" else self.v, k0, pitch), dst, piece, kt, pitch, piece)]

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
        self.out += [WaitFlag(MTE1, MTE2, _Q + i),
                     Copy(GM, L1, _at(self.q, tile.q0, d * e), g.l1["q"][i], tile.rows * d * e),
                     SetFlag(MTE2, MTE1, _Q + i)]

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
            out += [Copy(L0C, GM, g.l0["c"][c], s_at, rows * nb * 4), SetFlag(FIX, M, c)]
        out.append(CrossSetFlag(FIX, _S_READY))

    def load_p(self, st: _Step) -> None:
        g = self.g
        rows, i = st.tile.rows, st.sp
        p_at = shift(self.w, g.ws["p"][i])
        self.out += [CrossWaitFlag(MTE2, _P_READY), WaitFlag(MTE1, MTE2, _P + i),
                     Copy(GM, L1, p_at, g.l1["p"][i], rows * st.nsub * st.nb * g.e),
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
                    Copy(L1, L0B, g.l1["v"][sp] + u * nb * d * e, g.l0["b"][x], nb * d * e),
                    SetFlag(MTE1, M, x)]
            if u == st.nsub - 1:
                out += [SetFlag(MTE1, MTE2, _P + sp), SetFlag(MTE1, MTE2, _V + sp)]
            out += [WaitFlag(MTE1, M, x)]
            if u == 0:
                out.append(WaitFlag(FIX, M, c))
            out += [Mmad(rows, d, nb, g.p.dtype, g.l0["a"][x], g.l0["b"][x], g.l0["c"][c], accumulate=u > 0),
                    SetFlag(M, MTE1, x)]
        o_at = shift(self.w, g.ws["o"][sp])
        out += [SetFlag(M, FIX, c), WaitFlag(M, FIX, c), Copy(L0C, GM, g.l0["c"][c], o_at, rows * d * 4),
                SetFlag(FIX, M, c), CrossSetFlag(FIX, _O_READY)]

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
            s_at = _sub(shift(self.w, g.ws["s"][sp] + row0 * nb * 4), sub1 * nb * 4)
            p_at = _sub(shift(self.w, g.ws["p"][sp] + row0 * nb * e), sub1 * nb * e)
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
            # m_new = max(m, tile max); alpha = exp((m - m_new) * scale) (m starts at -inf: alpha 0)
            out += [VecOp("reduce_max", n, "fp32", red, (s,), out_n=ns),
                    VecOp("max", ns, "fp32", red, (red, m)), VecOp("sub", ns, "fp32", a, (m, red)),
                    VecOp("muls", ns, "fp32", a, (a,)), VecOp("exp", ns, "fp32", a, (a,)),
                    VecOp("copy", ns, "fp32", m, (red,), flops_per_elem=0)]
            # P = exp((S - m_new) * scale), row sums l = l * alpha + sum, cast to the cube's dtype
            out += [VecOp("sub", n, "fp32", s, (s,)), VecOp("muls", n, "fp32", s, (s,)),
                    VecOp("exp", n, "fp32", s, (s,)), VecOp("reduce_sum", n, "fp32", red, (s,), out_n=ns),
                    VecOp("mul", ns, "fp32", l_, (l_, a)), VecOp("add", ns, "fp32", l_, (l_, red))]
            out += [VecOp("cast", n, "fp32", g.ub["p"][x], (s,), dt, flops_per_elem=0),
                    SetFlag(V, MTE2, x), SetFlag(V, MTE3, x), WaitFlag(V, MTE3, x),
                    Copy(UB, GM, g.ub["p"][x], p_at, rcc * nb * e, nsub, rcc * nb * e, rows * nb * e),
                    SetFlag(MTE3, V, x)]
        out.append(CrossSetFlag(MTE3, _P_READY))

    def update(self, st: _Step) -> None:
        """O = O * alpha + O_part (O starts at 0)."""
        g = self.g
        d = g.p.head_dim
        r, sub1 = self._rows(st.tile)
        n = r * d
        o_at = _sub(shift(self.w, g.ws["o"][st.sp]), sub1 * d * 4)
        acc, part = g.ub["oacc"], g.ub["opart"]
        self.out += [CrossWaitFlag(MTE2, _O_READY), WaitFlag(V, MTE2, 2),
                     Copy(GM, UB, o_at, part, n * 4), SetFlag(MTE2, V, 2), WaitFlag(MTE2, V, 2)]
        self.out += [VecOp("mul", n, "fp32", acc, (acc,)), VecOp("add", n, "fp32", acc, (acc, part)),
                     SetFlag(V, MTE2, 2)]

    def reset(self, tp: int, n: int) -> list:
        """Statistics set tp back to max -inf, sum 0 (the next tile but one uses it)."""
        ns = n * STAT // 4
        return [VecOp("dup", ns, "fp32", self.g.ub["m"][tp], flops_per_elem=0),
                VecOp("dup", ns, "fp32", self.g.ub["l"][tp], flops_per_elem=0)]

    def finish(self, tile: _Tile) -> None:
        """O / row sum, cast, store this AIV's rows of the q tile; O back to 0."""
        g = self.g
        d, e = g.p.head_dim, g.e
        r, sub1 = self._rows(tile)
        n = r * d
        o_at = _sub(_at(self.o, tile.q0, d * e), sub1 * d * e)
        self.out += [VecOp("div", n, "fp32", g.ub["oacc"], (g.ub["oacc"],)), WaitFlag(MTE3, V, 2),
                     VecOp("cast", n, "fp32", g.ub["oout"], (g.ub["oacc"],), g.p.dtype, flops_per_elem=0),
                     SetFlag(V, MTE3, 2), *self.reset(tile.tp, r),
                     VecOp("dup", cdiv(g.qt, 2) * d, "fp32", g.ub["oacc"], flops_per_elem=0),
                     WaitFlag(V, MTE3, 2), Copy(UB, GM, g.ub["oout"], o_at, n * e), SetFlag(MTE3, V, 2)]

    def prologue(self) -> list:
        r = cdiv(self.g.qt, 2)
        return ([SetFlag(V, MTE2, i) for i in range(3)] + [SetFlag(MTE3, V, i) for i in range(3)]
                + self.reset(0, r) + self.reset(1, r)
                + [VecOp("dup", r * self.g.p.head_dim, "fp32", self.g.ub["oacc"], flops_per_elem=0)])

    def epilogue(self) -> list:
        return [WaitFlag(V, MTE2, i) for i in range(3)] + [WaitFlag(MTE3, V, i) for i in range(3)]


def _fa_programs(g: _FaGeometry, tiles: list[int], specs: list, q, kv: _KvRead, o, w,
                 loops: bool = True) -> tuple[Program, Program]:
    """The AIC and AIV programs of a block working through q tiles `tiles` of one head.

    Slot s: the cube computes Q K^T of step s+2 and P V of step s; the AIVs do the
    softmax of step s+1 and the rescale-accumulate of step s (and finish a tile
    after its last step). The cube running two steps ahead keeps both sides busy:
    the chain P(s) -> P V -> Q K^T -> S -> softmax has two steps to complete. The
    pipeline runs on across q tiles. Slots that look alike become a Loop (two per
    iteration: ping and pong); in a non-causal head whole tiles look alike and loop
    (unless loops=False: steps whose addresses are data, as a paged cache's)."""
    cube, vec = _Cube(g, q, kv, w), _Vec(g, o, w)
    cube.out, vec.out = cube.prologue() + kv.start(g), vec.prologue()
    nsteps = [len(specs[t][1]) for t in tiles]
    start = [0]
    for n in nsteps:
        start.append(start[-1] + n)

    def step(i: int, j: int, lin=None) -> _Step | None:
        """Step j of block tile i (None past the last); lin(i) gives the tile's first row."""
        while i < len(tiles) and j >= nsteps[i]:
            j -= nsteps[i]
            i += 1
        if i >= len(tiles):
            return None
        rows, steps = specs[tiles[i]]
        k0, kt, masked = steps[j]
        nsub, nb = g.step_shape(kt)
        tile = _Tile(lin(i) if lin else _Lin(tiles[i] * g.qt), rows, i % 2)
        return _Step(tile, _Lin(k0), kt, nsub, nb, masked, j == 0, j == len(steps) - 1, (start[i] + j) % 2)

    def ahead(st: _Step) -> None:
        """Q K^T of st (its tile's Q first, if st opens the tile)."""
        if st.first:
            cube.load_q(st.tile)
        cube.load_kv(st, "k")
        cube.qk(st, reuse=True)

    def slot(s: _Step, s1: _Step | None, s2: _Step | None) -> None:
        if s2 is not None:
            ahead(s2)
        cube.load_kv(s, "v")
        cube.load_p(s)
        cube.pv(s)
        if s1 is not None:
            vec.softmax(s1)
        vec.update(s)
        if s.last:
            vec.finish(s.tile)

    def looped(var: str, count: int, body) -> None:
        """Emit body() once as the body of Loop(var, count) on both cores; every
        buffer rotation must come back to where it started."""
        before = (cube.mm % 2, cube.cc % 2, vec.ch % 2)
        saved = cube.out, vec.out
        cube.out, vec.out = [], []
        body()
        assert before == (cube.mm % 2, cube.cc % 2, vec.ch % 2), "loop body must rotate buffers evenly"
        (c_out, v_out), (cube.out, vec.out) = (cube.out, vec.out), saved
        cube.out.append(Loop(var, count, c_out))
        vec.out.append(Loop(var, count, v_out))

    def moved(st: _Step | None) -> _Step | None:
        return None if st is None else attrs.evolve(st, k0=st.k0.plus("j", 2 * g.kt))

    def emit_tile(i: int, lin=None) -> None:
        n = nsteps[i]
        steps = [step(i, j, lin) for j in range(n + 2)]  # and two past the tile's end
        run = 0  # slots 0 .. run-1 look alike: their s+1 and s+2 are in this tile, unmasked, not its last
        while loops and run <= n - 4 and not steps[run + 1].masked and not steps[run + 2].masked:
            run += 1
        if run >= 2:
            looped("j", run // 2, lambda: [slot(*(moved(steps[x + i]) for i in range(3))) for x in (0, 1)])
        for j in range(run // 2 * 2, n):
            slot(steps[j], steps[j + 1], steps[j + 2])

    first = step(0, 0)
    cube.load_q(first.tile)
    cube.load_kv(first, "k")
    cube.qk(first, reuse=False)
    second = step(0, 1)
    if second is not None:
        if second.first:
            cube.load_q(second.tile)
        cube.load_kv(second, "k")
        cube.qk(second, reuse=False)
    vec.softmax(first)
    # tiles 0 .. same-1 are alike (consecutive, same rows and steps): pairs of them loop, as long
    # as the two tiles after a pair (which its last slots look into) are alike too
    same = 1
    while (same < len(tiles) and tiles[same] == tiles[0] + same and specs[tiles[same]] == specs[tiles[0]]):
        same += 1
    pairs = max(0, (same - 2) // 2) if loops else 0
    if pairs >= 1:
        lin = lambda i: _Lin((tiles[0] + i) * g.qt, (("tt", 2 * g.qt),))  # noqa: E731
        looped("tt", pairs, lambda: [emit_tile(i, lin) for i in (0, 1)])
    for i in range(2 * pairs, len(tiles)):
        emit_tile(i)
    cube.out += [CrossWaitFlag(FIX, _S_FREE)] * min(2, start[-1])  # the last two slots' releases
    return (Program(cube.out + cube.epilogue(), g.aic), Program(vec.out + vec.epilogue(), g.aiv))


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


def reference_flash_attention(p: FlashAttentionParams, x, specs, ctx) -> dict:
    """q (BSND or [b*h, s, d]) over the layer's cache (kv_layout); causal aligned to the
    end of the keys, and in decode each sequence's padding keys hidden. Scores and
    softmax in fp32 (in UB, never stored); P stored in q's dtype for the cube."""
    q = bsnd_to_batches(x["q"], specs["q"], p.batch * p.heads, p.seq_q, p.head_dim)
    k, v = (group_heads(t, p.group).reshape(-1, p.seq_kv, p.head_dim) for t in p.kv_cache().unpack(x))
    keys = np.arange(p.seq_kv)
    visible = np.ones((p.batch, p.heads, p.seq_q, p.seq_kv), dtype=bool)
    if p.causal:
        visible &= keys[None, :] <= np.arange(p.seq_q)[:, None] + p.seq_kv - p.seq_q
    if ctx.phase == "decode":  # each sequence's padding keys
        visible &= keys[None, None, None, :] < np.array(ctx.lengths)[:, None, None, None]
    o = attention(q.reshape(p.batch, p.heads, p.seq_q, p.head_dim), k.reshape(p.batch, p.heads, p.seq_kv, -1),
                  v.reshape(p.batch, p.heads, p.seq_kv, -1), visible, lambda a: ctx.store(a, specs["q"].dtype))
    return {"o": batches_to(o.reshape(-1, p.seq_q, p.head_dim), specs["o"])}


@register("flash_attention", FlashAttentionParams, FlashAttentionTiling, reference=reference_flash_attention,
          ins=("q",), outs=("o",), kv="read")
def lower_flash_attention(p: FlashAttentionParams, hw: HwConfig, gm: GmArena,
                          tiling: FlashAttentionTiling | None) -> Lowered:
    """FlashAttention: Q K^T, scale, mask, online softmax and P V in one MIX kernel.

    A block (1 AIC + 2 AIVs) takes q tiles of one head. For each step of keys
    (kv_tile) the AIC loads K, computes S = Q K^T (Mmad per sub_tile into L0C) and
    FixPipes it to the block's workspace; the AIVs (half the rows each) scale,
    mask, update the running max and sum, write P = exp(S - max) back (fp16) and
    signal; the AIC loads P and V, computes P V and FixPipes the partial O, which
    the AIVs rescale-accumulate in UB. At the end of a q tile the AIVs divide by
    the row sums and store O. The cube computes Q K^T two steps ahead of P V, so
    cube and vector cores overlap; the workspace per block holds two of each (S,
    P, partial O) and the AIVs tell the cube when they have read an S slot. It is
    sized per block (the program knows its block, not its core) and stays in L2.
    Scores never reach GM as an S x S tensor. Causal: key steps wholly past a tile's last row are skipped,
    the diagonal steps are masked. GQA: K/V head h // group is read by the blocks
    of each of its query heads (the L2 keeps it).

    Blocks: every core first takes whole heads (block b = head b, in waves); the
    heads left over are split into q-tile sets of equal work (longest-first when
    causal) so the last wave fills the cores too.

    K and V come from the KV cache in kv_layout (seq_kv = its capacity, `layer` of
    `layers`); see _KvRead for what each layout's loads are."""
    t = tiling or FlashAttentionTiling()
    if not (t.q_tile and t.kv_tile and t.sub_tile):
        t = choose_flash_tiling(p, hw, t)
    g = _fa_geometry(p, t, hw)
    e, d, grp = g.e, p.head_dim, p.group
    bkv = p.batch * p.kv_heads
    hs = p.seq_q * d * e
    Q = gm.tensor("q", p.batch * p.heads * hs)
    cache = _kv_cache(p, hw, gm, "flash_attention")
    O = gm.tensor("o", p.batch * p.heads * hs)
    paged = p.kv_layout == "paged"
    n_tiles = cdiv(p.seq_q, g.qt)
    specs = [_tile_steps(g, i) for i in range(n_tiles)]
    work = [len(s[1]) + 1 for s in specs]
    uniform = len(set(work)) == 1

    cores = hw.chip.aic_count
    units = p.batch * p.heads  # (gi, bk) in order gi * bkv + bk: query head bk * grp + gi
    whole = units // cores * cores
    left = units - whole
    parts = []
    if left:
        n_parts = min(t.q_splits, n_tiles) if t.q_splits else _splits(left, cores, work, uniform)
        parts = _partition(work, n_parts, uniform)
    # block -> (kind, unit): kind -1 = the whole head, else the index of a part
    blocks = [(-1, u) for u in range(whole)] + [(i, u) for i in range(len(parts)) for u in range(whole, units)]
    W = gm.tensor("workspace", len(blocks) * g.ws_bytes)
    wb = Affine(W.addr, (("block", g.ws_bytes),))

    def kv_head(which: str, bk: int) -> int:
        """GM address of token 0 of K or V head bk (= batch * kv_heads + head)."""
        return cache.token_addr(which, *divmod(bk, p.kv_heads), 0)

    def kv_affine(bk: int, n: int) -> bool:
        """KV heads bk .. bk+n equally spaced (a run of blocks can share a program)."""
        return all(kv_head(w, bk + n) - kv_head(w, bk) == n * (kv_head(w, bk + 1) - kv_head(w, bk)) for w in "kv")

    aic, aiv = [], []
    b = 0
    while b < len(blocks):  # runs of blocks: same kind, same gi, consecutive and equally spaced bk
        kind, u = blocks[b]
        gi, bk = divmod(u, bkv)
        end = b + 1
        while not paged and end < len(blocks) and blocks[end][0] == kind and blocks[end][1] == u + end - b \
                and blocks[end][1] // bkv == gi and kv_affine(bk, end - b):
            end += 1

        def at(tensor, per_head: int, head: int, heads_per_block: int):
            """The head's base at block b, moving by heads_per_block heads per block."""
            step = per_head * heads_per_block
            return Affine(tensor.addr + head * per_head - b * step, (("block", step),))

        qh = bk * grp + gi
        if paged:
            kv = _KvRead(cache, seq=bk // p.kv_heads, head=bk % p.kv_heads)
        else:  # the run's KV heads, one step apart per block
            steps = [kv_head(w, bk + 1) - kv_head(w, bk) if end - b > 1 else 0 for w in "kv"]
            kv = _KvRead(cache, *(Affine(kv_head(w, bk) - b * s, (("block", s),)) for w, s in zip("kv", steps)))
        progs = _fa_programs(g, list(range(n_tiles)) if kind < 0 else parts[kind], specs,
                             at(Q, hs, qh, grp), kv, at(O, hs, qh, grp), wb, loops=not paged)
        aic += [progs[0]] * (end - b)
        aiv += [progs[1]] * (end - b)
        b = end
    if all(x is aic[0] for x in aic):  # every block runs one program: verify checks it once
        aic, aiv = aic[:1], aiv[:1]
    kernel = Kernel("flash_attention", CoreType.MIX, len(blocks), aic=aic, aiv=aiv, gm=[Q, *cache.tensors, O, W],
                    workspace_bytes=W.nbytes, op_type="flash_attention")
    ins, outs = _io(p)
    ins = [ins[0], *_kv_inputs(cache)]
    return Lowered(
        op_type="flash_attention", params=p, tiling=t, kernels=[kernel],
        flops=4.0 * p.batch * p.heads * d * p.visible_pairs(),
        min_gm_bytes=float(sum(x.nbytes for x in ins + outs)),
        unit="cube", inputs=ins, outputs=outs, workspace_bytes=W.nbytes,
    )


# ================================================================ the unfused chain


class _Renamed(GmArena):
    """A view of an arena under other names: a lowering called from here asks for "a"
    and gets this op's "q", so every tensor of the chain is allocated once."""

    def __init__(self, parent: GmArena, names: dict[str, str]):
        self.parent, self.names = parent, names
        self.bound, self.tensors = parent.bound, parent.tensors

    @property
    def next(self) -> int:
        return self.parent.next

    def tensor(self, name: str, nbytes: int) -> GmTensor:
        return self.parent.tensor(self.names.get(name, name), nbytes)


def _rows_quantum(hw: HwConfig, row_bytes: int) -> int:
    """Rows per core in multiples of this, so each core's run starts on an L2 line."""
    return hw.l2.line_bytes // math.gcd(row_bytes, hw.l2.line_bytes)


def _mask_kernel(p: AttentionParams, hw: HwConfig, scores: GmTensor) -> Kernel:
    """Masked fill of the scores in place: hidden keys -> -inf. The mask is built in
    UB (compare of a key-index ramp with each row's limit) and applied by Select.
    # assumption: no [seq_q, seq_kv] mask tensor is read (HF's additive mask would add
    # its bytes); a non-causal chain still runs the kernel (a padding mask)."""
    e = DTYPE_BYTES[p.dtype]
    row = p.seq_kv * e
    pitch = align_up(row, 32)

    def compute(nr, ub_in, ub_out, tmp, consts):
        n = nr * pitch // e
        return [VecOp("compare", n, p.dtype, tmp, (ub_in[0],), "uint8", cdiv(n, 8), 0),
                VecOp("select", n, p.dtype, ub_out[0], (ub_in[0],), flops_per_elem=0)]

    s = Stream(scores, row, 0, 0, pitch if pitch != row else 0)
    return streaming_kernel("attn_mask", "masked_fill", hw, p.batch * p.heads * p.seq_q, [s], [s], compute,
                            tmp_row_bytes=align_up(cdiv(pitch // e, 8), 32), quantum=_rows_quantum(hw, row))


def reference_attention_unfused(p: AttentionParams, x, specs, ctx) -> dict:
    """softmax(q k^T / sqrt(d) + causal mask) v over BNSD q, k, v; the chain stores the
    scores and the probabilities in the op's dtype."""
    q = x["q"].reshape(p.batch, p.heads, p.seq_q, p.head_dim)
    k, v = (group_heads(x[n].reshape(p.batch, p.kv_heads, p.seq_kv, p.head_dim), p.group) for n in "kv")
    visible = np.ones((p.seq_q, p.seq_kv), dtype=bool)
    if p.causal:
        visible = np.arange(p.seq_kv)[None, :] <= np.arange(p.seq_q)[:, None] + p.seq_kv - p.seq_q
    return {"o": attention(q, k, v, visible, lambda a: ctx.store(a, p.dtype))}


@register("attention_unfused", AttentionParams, reference=reference_attention_unfused, ins=("q", "k", "v"),
          outs=("o",))
def lower_attention_unfused(p: AttentionParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Attention as five kernels: BatchMatMul Q K^T -> Scale -> Mask -> Softmax -> BatchMatMul P V.

    The S x S scores live in GM: QK^T writes them (fp16), Scale and Mask rewrite
    them in place, Softmax writes the probabilities to a second S x S tensor that
    the PV matmul reads. Under GQA the query heads of a group are stacked as the
    matmul's M (q of heads g*j..g*j+g-1 is contiguous), so K and V are read per KV
    head. Every kernel the chain calls allocates through one arena: q, k, v, the
    scores, the probabilities and o exist once."""
    e, grp = DTYPE_BYTES[p.dtype], p.group
    bkv = p.batch * p.kv_heads
    rows = p.batch * p.heads * p.seq_q
    S = gm.tensor("scores", rows * p.seq_kv * e)
    P = gm.tensor("probs", rows * p.seq_kv * e)
    mm = dict(batch=bkv, m=grp * p.seq_q, dtype=p.dtype, out_dtype=p.dtype)
    qk = lower("batch_matmul", dict(mm, n=p.seq_kv, k=p.head_dim, trans_b=True), hw,
               gm=_Renamed(gm, {"a": "q", "b": "k", "c": "scores"}))
    scale = lower("scale", dict(shape=(rows, p.seq_kv), dtype=p.dtype, scale=1.0 / math.sqrt(p.head_dim)), hw,
                  gm=_Renamed(gm, {"x": "scores", "y": "scores"}))
    if "softmax" in OPS:
        softmax = lower("softmax", dict(shape=(rows, p.seq_kv), dtype=p.dtype), hw,
                        gm=_Renamed(gm, {"x": "scores", "y": "probs"})).kernels
    else:  # pragma: no cover - the vector ops module registers softmax
        raise ProgramError("op attention_unfused: needs the 'softmax' op")
    pv = lower("batch_matmul", dict(mm, n=p.head_dim, k=p.seq_kv), hw,
               gm=_Renamed(gm, {"a": "probs", "b": "v", "c": "o"}))
    kernels = [*qk.kernels, *scale.kernels, _mask_kernel(p, hw, S), *softmax, *pv.kernels]
    ins, outs = _io(p)
    sxs = S.nbytes
    # the chain's least traffic: q, k, S written; S read and written by scale and mask; S read,
    # P written; P, v read, o written
    return Lowered(
        op_type="attention_unfused", params=p, tiling=None, kernels=kernels,
        flops=4.0 * p.batch * p.heads * p.head_dim * p.seq_q * p.seq_kv,
        min_gm_bytes=float(sum(x.nbytes for x in ins + outs) + 7 * sxs + P.nbytes),
        unit="cube", inputs=ins, outputs=outs,
    )


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
    for s in range(1, max(1, p.context // (2 * kc)) + 1):
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

    The KV cache is read in kv_layout (`layer` of `layers`): per_layer, a tile of K and
    one of V are one segment each; contiguous, one DMA brings a tile's K and V together
    (one segment per tile: its rows hold both, and the vector ops read K and V out of
    the rows with their repeat stride) - a kernel author would not split it into two
    strided half-row reads; paged, one segment per block of K and of V, at the
    physical blocks the block table names (read once per block of the kernel), so the
    tiles are not looped."""
    t = tiling or choose_decode_tiling(p, hw)
    kc = t.kv_tile or choose_decode_tiling(p, hw).kv_tile
    buf, ub = _decode_buffers(p, kc, hw)
    e, d, grp = DTYPE_BYTES[p.dtype], p.head_dim, p.group
    units = p.batch * p.kv_heads
    chunk = align_up(cdiv(p.context, t.splits or choose_decode_tiling(p, hw).splits), kc)
    splits = cdiv(p.context, chunk)
    Q = gm.tensor("q", p.batch * p.heads * d * e)
    cache = _kv_cache(p, hw, gm, "decode_attention")
    O = gm.tensor("o", p.batch * p.heads * d * e)
    paged, together = p.kv_layout == "paged", p.kv_layout == "contiguous"
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
        ops += [VecOp("reduce_max", n, "fp32", ub["red"], (ub["s"],), out_n=ns),
                VecOp("max", ns, "fp32", ub["red"], (ub["red"], ub["m"])),
                VecOp("sub", ns, "fp32", ub["alpha"], (ub["m"], ub["red"])),
                VecOp("muls", ns, "fp32", ub["alpha"], (ub["alpha"],)),
                VecOp("exp", ns, "fp32", ub["alpha"], (ub["alpha"],)),
                VecOp("copy", ns, "fp32", ub["m"], (ub["red"],), flops_per_elem=0),
                VecOp("sub", n, "fp32", ub["s"], (ub["s"],)), VecOp("muls", n, "fp32", ub["s"], (ub["s"],)),
                VecOp("exp", n, "fp32", ub["s"], (ub["s"],)),
                VecOp("reduce_sum", n, "fp32", ub["red"], (ub["s"],), out_n=ns),
                VecOp("mul", ns, "fp32", ub["l"], (ub["l"], ub["alpha"])),
                VecOp("add", ns, "fp32", ub["l"], (ub["l"], ub["red"])),
                VecOp("cast", n, "fp32", ub["p"], (ub["s"],), p.dtype, flops_per_elem=0)]
        for h in range(grp):  # o_h = o_h * alpha_h + sum over keys of p_h,key * v_key
            o_h = ub["o"] + h * d * 4
            ops += [VecOp("mul", nk * d, p.dtype, ub["prod"], (ub["v"][0],)),
                    VecOp("add", nk * d, p.dtype, ub["opv"], (ub["prod"],), "fp32", d),
                    VecOp("mul", d, "fp32", o_h, (o_h,)),  # x alpha_h (broadcast)
                    VecOp("add", d, "fp32", o_h, (o_h, ub["opv"]))]
        return ops

    def with_buffers(ops: list, x: int) -> list:
        """tile_ops written for buffer set 0, moved to set x."""
        moves = {ub["k"][0]: ub["k"][x], ub["v"][0]: ub["v"][x]}
        return [attrs.evolve(o, srcs=tuple(moves.get(s, s) for s in o.srcs)) for o in ops]

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
        tokens = _Lin(pos, (("j", j_tokens),) if j_tokens else ())
        if together:  # the rows carry K and V: one segment
            return [Copy(GM, UB, _at(kv["k"], tokens, pitch), ub["k"][x], nk * pitch)]
        return [Copy(GM, UB, _at(kv[w], tokens, pitch), ub[w][x], nk * d * e) for w in "kv"]

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
                SetFlag(V, MTE2, 0), SetFlag(V, MTE2, 1),
                Copy(GM, UB, moving(Q.addr + u * grp * d * e, grp * d * e), ub["q"], grp * d * e),
                SetFlag(MTE2, V, 2),
                VecOp("dup", grp * STAT // 4, "fp32", ub["m"], flops_per_elem=0),
                VecOp("dup", grp * STAT // 4, "fp32", ub["l"], flops_per_elem=0),
                VecOp("dup", grp * d, "fp32", ub["o"], flops_per_elem=0),
                WaitFlag(MTE2, V, 2)]

        def tile(nk: int, first: int, in_loop: bool):
            def make(x: int, j_off: int) -> list:
                pos = c0 + first + j_off * nk
                return [WaitFlag(V, MTE2, x), *loads(kv, b, h, x, pos, nk, 2 * nk if in_loop else 0),
                        SetFlag(MTE2, V, x), WaitFlag(MTE2, V, x),
                        *with_buffers(tile_ops(nk), x), SetFlag(V, MTE2, x)]
            return make

        if paged:  # every tile its own blocks: unrolled
            for j in range(full):
                body += tile(kc, 0, False)(j % 2, j)
        else:
            body += pingpong("j", full, tile(kc, 0, True))
        if tail:
            body += tile(tail, full * kc, False)(full % 2, 0)
        part = u * grp * splits + sp  # partials [query head, split, ...]: the combine reads a head's in one row
        body += [SetFlag(V, MTE3, 0), WaitFlag(V, MTE3, 0),
                 Copy(UB, GM, ub["o"], moving(Wo.addr + part * d * 4, grp * splits * d * 4), d * 4, grp, d * 4,
                      splits * d * 4),
                 Copy(UB, GM, ub["m"], moving(Ws.addr + part * STAT, grp * splits * STAT), STAT, grp, STAT,
                      splits * STAT),
                 WaitFlag(V, MTE2, 0), WaitFlag(V, MTE2, 1)]
        return Program(body, buf.buffers)

    # Block order: the splits of a few units at a time (split 0 of units u .. u+g-1, then
    # split 1, ...): a run of a split's blocks moves by one unit per block in every
    # address (q, K, V, the partials) and shares one Program - with splits = 1, every
    # block does. g is the units whose q and partials fill whole L2 lines, so blocks that
    # share a line still run side by side, as in the unit-major order (block u * splits
    # + sp) this replaces, and the L2 sees the same reuse. A run also ends where the KV
    # heads are not equally spaced (contiguous: the other layers sit between two
    # sequences). Paged: addresses are data (the block table), one program per block.
    line = hw.l2.line_bytes
    per_unit = (grp * d * e, grp * splits * d * 4, grp * splits * STAT)  # q, partial_o, partial_stats
    g = 1 if paged else math.lcm(*(line // math.gcd(line, n) for n in per_unit))
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

    quanta = [_rows_quantum(hw, b) for b in (o_row, s_row, out_row)]
    quantum = math.lcm(*quanta) if rows >= 4 * math.lcm(*quanta) * hw.aiv_count else 1
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
