"""MatMul and BatchMatMul on the cube (AIC).

C[b] = A[b] @ B[b] (+ bias), A [m, k], B [k, n] (or [n, k] with trans_b), C [m, n].

The output is cut into base_m x base_n tiles; the tiles (x split_k pieces of K)
are dealt to the cores as contiguous runs in (batch, m, n) order. For one tile a
core streams K in L1 chunks of step_k x base_k (MTE2: GM -> L1, ping-pong), feeds
base_k slices to L0A/L0B (MTE1, ping-pong) for Mmad into L0C, and FixPipe writes
the finished tile to GM (fp32 -> out dtype). With split_k, every piece adds its
partial sum into C with an atomic FixPipe write, after a vector kernel has zeroed C.

Layouts: ND (row-major) operands arrive by strided DMA, one segment per row of a
tile (the DMA converts to the cube's fractal layout on the way); NZ operands are
already in 16 x 16 fractals, so a tile is one segment per 16-wide column block. An
ND operand whose rows the DMA does not convert (not a multiple of 256 bytes, as
CANN's MatMulV3 decides) is converted to NZ by the vector cores first, in one MIX
kernel (npusim.ops.matmul_nd2nz).
W8A16 (weight_dtype=int8): B moves as int8, MTE1 widens it to fp16 into L0B, and
FixPipe applies per-channel scales it loads into FB. W8A8 (dtype=int8: A and B
int8, quantised by npusim.ops.quant): the cube multiplies at its int8 fractal
(hw aic.mmad_fractals.int8: its shape is its rate, MACs per cycle), L0C holds
int32, FixPipe applies the weight's per-channel scales and writes fp32 (the
per-token scales of A are applied after, by token_dequant). dtype=fp32: A and B
fp32 (4-byte elements in GM, L1, L0A and L0B) at the cube's fp32 fractal
(aic.mmad_fractals.fp32: 16 x 16 x 8, half the fp16 MACs per cycle); base_k is
128 bytes deep for every dtype (slice_depth), so an fp32 or int8 slice holds the bytes an fp16 one does.

n_parts splits C by columns into separate GM tensors c0, c1, ... (a fused QKV
projection writes q, k and v without a split kernel): a tile's FixPipe write goes
to the part its columns fall in, and a tile straddling a part boundary is written
as one FixPipe copy per part.

The tiling (base tiles, K split) a call does not give is chosen by
npusim.ops.matmul_tiling.
"""

from __future__ import annotations

import itertools
import math

import attrs
import numpy as np
from attrs import frozen, validators

from npusim.errors import ConfigError, ProgramError
from npusim.hw import HwConfig
from npusim.hw.derived import mmad_fractal
from npusim.isa.program import DTYPE_BYTES, CoreType, GmTensor, Kernel, Mem, Program, SyncAll, VecOp
from npusim.ops.build import Buffers, align_up, boxes, cdiv, line_quantum
from npusim.ops.matmul_antiquant import antiquant_applies, lower_antiquant
from npusim.ops.matmul_msd import lower_msd, msd_applies
from npusim.ops.matmul_msd_splitk import lower_msd_splitk, msd_splitk_applies
from npusim.ops.matmul_nd2nz import conversion_program, nd2nz_operands
from npusim.ops.matmul_program import (
    _b_dtype, _box, _epilogue, _Layout, _part_starts, _Plan, _prologue, _stored_bytes,
)
from npusim.ops.matmul_tiling import STEP_K, choose_tiling
from npusim.ops.reference import batches_to, bsnd_to_batches
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector_kernels import Stream, fill_kernel, streaming_kernel

_FORMATS = ("ND", "NZ")
# The input dtypes the cube multiplies (each needs its aic.mmad_fractals entry); int8 is W8A8.
CUBE_DTYPES = ("fp16", "bf16", "fp32", "int8")
_pos = validators.gt(0)
# The most work units (tiles x L1 chunks of K) one matmul may have: the engine takes 10 to
# 20 us each (K3's gate_up at 24 prompts of 4096 tokens, 811,008 units, 14 s on 2 cores),
# so 2^22 is about a minute (m=2097152 x n=4096 x k=4096 on the 910B2's tiles has this
# many). Serving prices prefills of max_batch prompts at the longest bucket: 2^20 refused
# K3's gate_up at 32 x 4096 (1,081,344 units), ending the README's K3 serve after minutes.
WORK_MAX = 1 << 22


def _n_parts_validator(instance, attribute, value) -> None:
    """Empty, or positive column widths that add up to n."""
    if value and (not all(isinstance(w, int) and w > 0 for w in value) or sum(value) != instance.n):
        raise ValueError(f"'{attribute.name}' must be positive column widths summing to n={instance.n}, "
                         f"got {value!r}")


@frozen
class MatmulParams:
    m: int = param(1024, "rows of A and C", validator=_pos)
    n: int = param(1024, "columns of B and C", validator=_pos)
    k: int = param(1024, "reduction length", validator=_pos)
    dtype: str = param("fp16", "dtype of A (and of B unless weight_dtype); int8 = W8A8 (B int8 with "
                       "per-channel scales; the quantize pass writes C in fp32); fp32 = A and B fp32 at the "
                       "cube's fp32 fractal", validator=validators.in_(CUBE_DTYPES))
    out_dtype: str = param("fp16", "dtype of C", validator=validators.in_(("fp16", "bf16", "fp32")))
    bias: bool = param(False, "add an fp32 bias row to C")
    trans_b: bool = param(False, "B stored as [n, k] (a Linear weight) instead of [k, n]")
    format_a: str = param("ND", "layout of A in GM: ND or NZ (16x16 fractals)", validator=validators.in_(_FORMATS))
    format_b: str = param("ND", "layout of B in GM: ND or NZ", validator=validators.in_(_FORMATS))
    weight_dtype: str = param("", "dtype of B in GM: empty = dtype; int8 = W8A16 with per-channel scales",
                              validator=validators.in_(("", "fp16", "bf16", "int8")))
    n_parts: tuple[int, ...] = param((), "column widths of C's parts, written as GM tensors c0, c1, ... "
                                     "(e.g. q,k,v of a fused QKV); empty = one tensor c",
                                     converter=tuple, validator=_n_parts_validator)
    token_scale: bool = param(False, "W8A8 only: A's per-token scales come with the call (CANN's "
                              "QuantBatchMatmulV3 pertoken_scale), so CANN dequantises C on the vector cores "
                              "and picks its tile for that (npusim.ops.matmul_qbmm); # assumption: that "
                              "epilogue hides behind the cube and is not lowered")

    def __attrs_post_init__(self):
        if self.dtype == "int8" and (self.weight_dtype not in ("", "int8") or self.bias):
            raise ValueError("dtype=int8 (W8A8) takes an int8 weight (weight_dtype empty or int8) and no bias "
                             "(token_dequant adds it after the per-token scales)")
        if self.token_scale and self.dtype != "int8":
            raise ValueError("token_scale is W8A8's (dtype=int8): per-token scales of an int8 A")
        if self.dtype == "fp32" and self.weight_dtype:
            raise ValueError("dtype=fp32 takes an fp32 weight (weight_dtype empty): the cube multiplies fp32 "
                             "by fp32 only")
        if self.weight_dtype in ("fp16", "bf16") and self.weight_dtype != self.dtype:
            raise ValueError(f"weight_dtype={self.weight_dtype} with dtype={self.dtype}: the cube multiplies A and "
                             f"B of one dtype (weight_dtype empty, {self.dtype}, or int8 for W8A16)")


@frozen
class BatchMatmulParams(MatmulParams):
    batch: int = param(1, "independent matmuls of the same shape", validator=_pos)


@frozen
class MatmulTiling:
    base_m: int = param(128, "L0 tile rows (multiple of 16)", validator=_pos)
    base_n: int = param(256, "L0 tile columns (multiple of 16)", validator=_pos)
    base_k: int = param(64, "L0 slice depth (multiple of the dtype's fractal k0: 16; 8 for fp32)", validator=_pos)
    step_k: int = param(STEP_K, "base_k slices per L1 chunk", validator=_pos)
    split_k: int = param(1, "pieces K is split into across cores (partials added atomically)", validator=_pos)
    a_resident: bool = param(False, "keep a tile row's whole A panel in L1 for all its N tiles")
    l1_double: bool = param(True, "ping-pong L1 chunks (loads overlap compute)")
    l0_double: bool = param(True, "ping-pong L0A/L0B slices (MTE1 overlaps Mmad)")
    block_dim: int = param(0, "cores used; 0 = every AIC", validator=validators.ge(0))


def reference_matmul(p: MatmulParams, x, specs, ctx) -> dict:
    """C = A B (+ bias) in fp32; with n_parts, C's columns in order as outputs c0, c1, ...
    each [m, n_parts[i]] (a fused QKV projection writing q, k and v). An int8 B
    (W8A16, W8A8) is multiplied as its integers, then each column by its scale (FixPipe)."""
    a = x["a"].reshape(p.m, p.k)
    b = x["b"].reshape(p.n, p.k).T if p.trans_b else x["b"].reshape(p.k, p.n)
    if p.dtype == "int8":  # int8 x int8 accumulates exactly in int32: float64 holds it exactly
        c = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    else:
        c = a @ b  # float32 inputs, float32 accumulation
    if _b_dtype(p) == "int8":
        c = c * x["scale"].reshape(p.n)
    if p.bias:
        c = c + x["bias"].reshape(p.n)
    if not p.n_parts:
        return {"c": c}
    edges = np.cumsum((0,) + tuple(p.n_parts))
    return {f"c{i}": c[:, lo:hi] for i, (lo, hi) in enumerate(itertools.pairwise(edges))}


def reference_batch_matmul(p: BatchMatmulParams, x, specs, ctx) -> dict:
    """C[b] = A[b] B[b] (+ bias) in fp32; BSND operands are read and written head by head."""
    a = bsnd_to_batches(x["a"], specs["a"], p.batch, p.m, p.k)
    if p.trans_b:
        b = bsnd_to_batches(x["b"], specs["b"], p.batch, p.n, p.k).transpose(0, 2, 1)
    else:
        b = bsnd_to_batches(x["b"], specs["b"], p.batch, p.k, p.n)
    c = a @ b
    if p.bias:
        c = c + x["bias"].reshape(p.n)
    return {"c": batches_to(c, specs["c"])}


_OPERANDS = dict(ins=("a", "b", "bias", "scale"), outs=("c", "c*"))


@register("matmul", MatmulParams, MatmulTiling, choose_tiling, reference=reference_matmul, **_OPERANDS)
def lower_matmul(p: MatmulParams, hw: HwConfig, gm: GmArena, tiling: MatmulTiling | None) -> Lowered:
    """Matrix multiply on the cube: C = A @ B (+ bias)."""
    return _lower(p, hw, gm, tiling, "matmul")


@register("batch_matmul", BatchMatmulParams, MatmulTiling, choose_tiling, reference=reference_batch_matmul,
          **_OPERANDS)
def lower_batch_matmul(p: BatchMatmulParams, hw: HwConfig, gm: GmArena, tiling: MatmulTiling | None) -> Lowered:
    """Batched matrix multiply on the cube: C[b] = A[b] @ B[b]."""
    return _lower(p, hw, gm, tiling, "batch_matmul")


def _lower(p: MatmulParams, hw: HwConfig, gm: GmArena, t: MatmulTiling | None, op: str) -> Lowered:
    if msd_splitk_applies(p):  # the same past K = 13696 or N = 32000: its split-K kernel
        return lower_msd_splitk(p, hw, gm, t)
    if msd_applies(p):  # W8A16 at decode sizes: the 910B's multi-scale kernel
        return lower_msd(p, hw, gm, t)
    if antiquant_applies(p):  # other W8A16 with an ND [k, n] weight: the AIVs antiquantise it first
        return lower_antiquant(p, hw, gm, t)
    t = t or choose_tiling(p, hw)
    batch = getattr(p, "batch", 1)
    cores = check_tiling(t, p.dtype, hw, op)
    e, eb, eo = DTYPE_BYTES[p.dtype], DTYPE_BYTES[_b_dtype(p)], DTYPE_BYTES[p.out_dtype]
    w8 = _b_dtype(p) == "int8"
    if p.format_a == "NZ" and t.base_k % 16:  # (fp32's k0 is 8) a K slice must start one of A's 16-wide NZ blocks
        raise ProgramError(f"op {op}: tiling base_k={t.base_k} is not a multiple of 16, the column blocks of an NZ A")
    if t.split_k > cdiv(p.k, t.base_k):  # a piece is at least one base_k slice
        raise ProgramError(f"op {op}: tiling split_k={t.split_k} exceeds the {cdiv(p.k, t.base_k)} base_k={t.base_k} "
                           f"slices of k={p.k}")
    k_piece = align_up(cdiv(p.k, t.split_k), t.base_k)
    split_k = cdiv(p.k, k_piece)
    check_work(p, t, k_piece, split_k, op)

    A = gm.tensor("a", batch * _stored_bytes(p.m, p.k, e, p.format_a))
    B = gm.tensor("b", batch * _stored_bytes(p.k, p.n, eb, p.format_b))
    parts = _part_starts(p)
    names = [f"c{i}" for i in range(len(parts))] if p.n_parts else ["c"]
    Cs = [gm.tensor(name, batch * p.m * w * eo) for name, (_, w) in zip(names, parts)]
    bias = gm.tensor("bias", p.n * 4) if p.bias else None
    scale = gm.tensor("scale", p.n * 4) if w8 else None

    # an operand whose rows MTE2 cannot convert is converted by the vector cores first, into a workspace
    nz_a, nz_b = nd2nz_operands(p)
    nz_bytes = (_stored_bytes(p.m, p.k, e, "NZ") if nz_a else 0, _stored_bytes(p.k, p.n, eb, "NZ") if nz_b else 0)
    W = gm.tensor("workspace", sum(nz_bytes)) if any(nz_bytes) else None
    wa = GmTensor("a_nz", W.addr, nz_bytes[0]) if nz_a else None
    wb = GmTensor("b_nz", W.addr + nz_bytes[0], nz_bytes[1]) if nz_b else None
    la = _Layout(wa, p.m, p.k, e, "NZ") if nz_a else _Layout(A, p.m, p.k, e, p.format_a)
    lb = _Layout(wb, p.k, p.n, eb, "NZ") if nz_b else _Layout(B, p.k, p.n, eb, p.format_b, p.trans_b)
    lc = tuple(_Layout(C, p.m, w, eo, "ND") for C, (_, w) in zip(Cs, parts))
    plan, buf = alloc_plan(p, t, hw, op, la, lb, lc, tuple(parts), k_piece, bias, scale)

    m_tiles, n_tiles = cdiv(p.m, t.base_m), cdiv(p.n, t.base_n)
    dims = (batch, m_tiles, n_tiles, split_k)
    units = batch * m_tiles * n_tiles * split_k
    per_core = cdiv(units, cores)
    programs = []
    # One row of tiles cut into equal runs (a decode GEMM): every block whose run is
    # whole-sized and inside one part of C runs one program, its addresses moving with
    # the block index, so the engine may run those blocks as one group.
    shared = None
    if dims[:2] == (1, 1) and split_k == 1 and len(parts) == 1:
        whole = n_tiles if p.n % t.base_n == 0 else n_tiles - 1  # a narrower last tile has its own nest
        if whole // per_core > 1:
            shared = Program(_prologue(t) + _box(attrs.evolve(plan, block_cols=per_core * t.base_n), (0, 0, 0, 0),
                                                 (1, 1, per_core, 1), dims) + _epilogue(t), buf.buffers)
    for core in range(cdiv(units, per_core)):
        if shared is not None and (core + 1) * per_core <= whole:
            programs.append(shared)
            continue
        body = []
        for start, extent in boxes(core * per_core, min(units, (core + 1) * per_core), dims):
            body += _box(plan, start, extent, dims)
        programs.append(Program(_prologue(t) + body + _epilogue(t), buf.buffers))
    tensors = [x for x in (A, B, *Cs, bias, scale, W) if x is not None]
    kernels = []
    if split_k > 1:  # partial sums are added into C: every part must start at zero
        kernels.append(fill_kernel(f"{op}_zero_c", hw, Cs[0], 0.0, p.out_dtype) if len(Cs) == 1
                       else _zero_parts(f"{op}_zero_c", hw, Cs, p.out_dtype))
    if W is None:
        kernels.append(Kernel(op, CoreType.AIC, len(programs), aic=programs, gm=tensors, op_type=op))
    else:  # one MIX kernel: the vector cores convert, SyncAll, the cubes multiply
        converted = [(A, wa, p.m, p.k)] * nz_a + [(B, wb, p.k, p.n)] * nz_b
        synced = {id(x): Program([SyncAll(), *x.body], x.buffers) for x in programs}  # shared programs stay shared
        kernels.append(Kernel(op, CoreType.MIX, len(programs), aic=[synced[id(x)] for x in programs],
                              aiv=[conversion_program(hw, converted, p.dtype, b, len(programs))
                                   for b in range(len(programs))],
                              gm=tensors, workspace_bytes=W.nbytes, op_type=op))
    lead = (batch,) if batch > 1 else ()
    ins = [TensorInfo("a", lead + (p.m, p.k), p.dtype, p.format_a),
           TensorInfo("b", lead + ((p.n, p.k) if p.trans_b else (p.k, p.n)), _b_dtype(p), p.format_b)]
    if p.bias:
        ins.append(TensorInfo("bias", (p.n,), "fp32"))
    if w8:
        ins.append(TensorInfo("scale", (p.n,), "fp32"))
    outs = [TensorInfo(name, lead + (p.m, w), p.out_dtype) for name, (_, w) in zip(names, parts)]
    return Lowered(
        op_type=op, params=p, tiling=attrs.evolve(t, split_k=split_k, block_dim=len(programs)), kernels=kernels,
        flops=2.0 * batch * p.m * p.n * p.k,
        min_gm_bytes=sum(x.nbytes for x in ins) + sum(x.nbytes for x in outs),
        unit="cube", inputs=ins, outputs=outs, workspace_bytes=W.nbytes if W is not None else 0,
    )


def check_work(p: MatmulParams, t: MatmulTiling, k_piece: int, split_k: int, op: str) -> None:
    """Refuse, in one line, a matmul whose tiles x L1 chunks of K exceed WORK_MAX (the
    engine's time grows with them, and nothing is printed until the end)."""
    batch = getattr(p, "batch", 1)
    work = batch * cdiv(p.m, t.base_m) * cdiv(p.n, t.base_n) * split_k * cdiv(k_piece, t.base_k * t.step_k)
    refuse_work(work, (f"batch={batch} x " if batch > 1 else "") + f"m={p.m} x n={p.n} x k={p.k}", t, op)


def refuse_work(work: int, shape: str, t: MatmulTiling, op: str) -> None:
    """Refuse, in one line naming `shape`, `work` tiles x L1 chunks of K past WORK_MAX."""
    if work > WORK_MAX:
        raise ConfigError(f"op {op}: {shape} is {work} tiles x K chunks of {t.base_m} x {t.base_n} x "
                          f"{t.base_k * t.step_k}, more than the {WORK_MAX} (2^22) npusim simulates (about a minute)")


def check_tiling(t: MatmulTiling, dtype: str, hw: HwConfig, op: str) -> int:
    """Refuse a tiling off the cube's fractal grid or wider than the chip, in one line;
    returns the cores its work is dealt to."""
    f = mmad_fractal(hw, dtype)
    for name, v, q in (("base_m", t.base_m, f.m0), ("base_n", t.base_n, f.n0), ("base_k", t.base_k, f.k0)):
        if v % q:
            raise ProgramError(f"op {op}: tiling {name}={v} is not a multiple of the {dtype} fractal ({q})")
    cores = t.block_dim or hw.chip.aic_count
    if cores > hw.chip.aic_count:
        raise ProgramError(f"op {op}: tiling block_dim={cores} exceeds the {hw.chip.aic_count} AIC cores")
    return cores


def alloc_plan(p: MatmulParams, t: MatmulTiling, hw: HwConfig, op: str, la: _Layout, lb: _Layout, lc: tuple,
               parts: tuple, k_piece: int, bias: GmTensor | None, scale: GmTensor | None,
               bias_elem: int = 4) -> tuple[_Plan, Buffers]:
    """A core's local buffers for tiles of up to t.base_m x t.base_n over p.k (L1
    chunks or the resident A panel, L0A/L0B slices, the L0C accumulator, BT/FB) and
    the plan of the tile loop nests that use them. Buffers stops on a tile that does
    not fit. bias_elem: bytes of a bias element in GM (4: fp32; a 2-byte bias is widened into BT)."""
    e = la.e
    w8 = scale is not None
    kc = t.base_k * t.step_k
    buf = Buffers(hw, op)
    l1_sets = 2 if t.l1_double else 1
    l0_sets = 2 if t.l0_double else 1
    a_l1 = (buf.alloc("a_panel", Mem.L1, la.l1_bytes(t.base_m, align_up(p.k, t.base_k))),) if t.a_resident else tuple(
        buf.alloc(f"a_chunk{i}", Mem.L1, la.l1_bytes(t.base_m, kc)) for i in range(l1_sets))
    b_l1 = tuple(buf.alloc(f"b_chunk{i}", Mem.L1, lb.l1_bytes(kc, t.base_n)) for i in range(l1_sets))
    extra = align_up(t.base_n * 4, 32) * (int(p.bias) + int(w8))  # bias, scales: each 32-byte aligned in L1
    plan = _Plan(
        p=p, t=t, kc=kc, k_piece=k_piece, bias=bias, scale=scale, la=la, lb=lb, parts=parts, lc=lc,
        a_l1=a_l1, b_l1=b_l1, extra_l1=buf.alloc("bias_scale", Mem.L1, extra) if extra else None,
        a_l0=tuple(buf.alloc(f"a_slice{i}", Mem.L0A, t.base_m * t.base_k * e) for i in range(l0_sets)),
        b_l0=tuple(buf.alloc(f"b_slice{i}", Mem.L0B, t.base_k * t.base_n * e) for i in range(l0_sets)),
        c_l0=buf.alloc("acc", Mem.L0C, t.base_m * t.base_n * 4),
        bt=buf.alloc("bias", Mem.BT, t.base_n * 4) if p.bias else None,
        fb=buf.alloc("scale", Mem.FB, t.base_n * 4) if w8 else None,
        bias_elem=bias_elem,
    )
    return plan, buf


def _zero_parts(name: str, hw: HwConfig, tensors: list[GmTensor], dtype: str) -> Kernel:
    """One vector kernel zeroing every part of C (fill_kernel for several tensors): a
    row is the same fraction of each part (gcd of their sizes), so each core zeroes
    its share of every part in the same pass and one launch serves them all."""
    e = DTYPE_BYTES[dtype]
    rows = math.gcd(*(t.nbytes // e for t in tensors))
    row_bytes = [t.nbytes // rows for t in tensors]
    quantum = line_quantum(hw, *row_bytes)
    quantum = quantum if rows >= 4 * quantum * hw.aiv_count else 1  # each core's share starts on an L2 line

    def compute(nr, ub_in, ub_out, tmp, consts):
        return [VecOp("dup", nr * b // e, dtype, ub, flops_per_elem=0, scalar=0.0) for b, ub in zip(row_bytes, ub_out)]

    return streaming_kernel(name, "fill", hw, rows, [], [Stream(t, b) for t, b in zip(tensors, row_bytes)], compute,
                            quantum=quantum)


