"""W8A16 matmul at decode sizes as the 910B runs it: multi-scale dequantisation (MSD).

For M up to MSD_MAX_M with K and N multiples of MSD_ALIGN (per-channel scales, ND
weight), hicann/ops-nn's WeightQuantBatchMatmulV2 host tiling picks this template
before the one that dequantises the weight (op_host: its msd tiling's limits; the
kernel weight_quant_batch_matmul_v2_msd_multicore.h). It is one MIX kernel, one
AIC to two AIVs, and never widens the weight:

1. the vector cores split each row x of A into two int8 parts, with a = max|x| and
   c = INT8_MAX: A1 = rint(x c / a) and A2 = rint((x c / a - A1) c), into a GM
   workspace [2m, k] (A1 rows, then A2 rows), and keep each row's factors a / c and
   a / c^2: x = (a / c)(A1 + A2 / c) to within a / (2 c^2);
2. after a SyncAll (every cube needs every row), the cube multiplies [A1; A2] by the
   int8 weight it reads itself, int8 x int8 into int32 (npusim.ops.matmul's int8
   tiles, K not split), FixPipe writing fp32 [2m, n] to the workspace;
3. each block's vector cores, told by their cube, combine that cube's columns:
   y = (C1 a / c + C2 a / c^2) * scale (+ bias), in the output dtype.

# assumption: CANN scales the second part by 2c; here its first part is rounded to
# fp16 on the way to int8 (the vector unit's cast path), which can leave a residual a
# little over 0.5 and 2c would then overflow int8, so the residual is scaled by c.
# assumption: an antiquant offset (rowsum(x) * offset in the combine) is not modelled:
# the op has no offset operand (calibrate.cube_rows says so for measured rows).
"""

from __future__ import annotations

import attrs

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import (
    DTYPE_BYTES, Copy, CoreType, CrossSetFlag, CrossWaitFlag, GmTensor, Kernel, Loop, Mem, Pipe, Program, SetFlag,
    SyncAll, WaitFlag, addr,
)
from npusim.ops.build import Buffers, align_up, boxes, cdiv
from npusim.ops.matmul_program import _box, _epilogue, _Layout, _prologue
from npusim.ops.quant import INT8_MAX, MIN_AMAX
from npusim.ops.registry import GmArena, Lowered, TensorInfo
from npusim.ops.vector import UB_BLOCK, cast, scalar_read, vop

# The template's limits (op_host weight_quant_batch_matmul_v2 msd tiling: MSD_M_LIMIT,
# and K and N multiples of 32)
MSD_MAX_M, MSD_ALIGN = 64, 32
_DONE = 0  # cross-core flag: the cube's columns of C are in the workspace
# UB bytes per element of A a vector core quantises at once: x in (at most fp32), its
# fp32 copy, the first part back in fp32, an fp16 step of the cast path, the two int8 parts
_PRE_BYTES = 4 + 4 + 4 + 2 + 1 + 1
# A row's two factors, each in its own 32-byte block (vector operands start on one)
_FACTORS = 2 * UB_BLOCK


def msd_applies(p) -> bool:
    """Whether CANN runs this W8A16 matmul as the MSD template (module doc)."""
    return (p.weight_dtype == "int8" and p.dtype in ("fp16", "bf16") and p.m <= MSD_MAX_M
            and p.k % MSD_ALIGN == 0 and p.n % MSD_ALIGN == 0 and not p.n_parts
            and p.format_a == p.format_b == "ND" and not hasattr(p, "batch"))


def lower_msd(p, hw: HwConfig, gm: GmArena, tiling) -> Lowered:
    """The MIX kernel of the module doc: `tiling` (or the chooser's) tiles the cube's int8
    matmul of both parts, [2m, k] x [k, n], in one tile row with K not split; block b's
    cube takes a run of N tiles, its two vector cores a share of A's rows, then its columns."""
    from npusim.ops.matmul import MatmulParams, alloc_plan, check_tiling
    from npusim.ops.matmul_tiling import choose_tiling

    m, n, k, e, eo = p.m, p.n, p.k, DTYPE_BYTES[p.dtype], DTYPE_BYTES[p.out_dtype]
    cube = MatmulParams(m=2 * m, n=n, k=k, dtype="int8", out_dtype="fp32", trans_b=p.trans_b)
    t = tiling or choose_tiling(cube, hw)
    if t.base_m < 2 * m:
        raise ProgramError(f"op matmul: tiling base_m={t.base_m} does not hold both int8 parts of A's {m} rows "
                           f"(the multi-scale W8A16 kernel multiplies {2 * m} rows in one tile row)")
    n_tiles = cdiv(n, t.base_n)
    cores = min(check_tiling(t, "int8", hw, "matmul"), n_tiles)
    per_core = cdiv(n_tiles, cores)
    blocks = cdiv(n_tiles, per_core)
    t = attrs.evolve(t, split_k=1, block_dim=blocks, a_resident=False)

    A, B, Y = gm.tensor("a", m * k * e), gm.tensor("b", k * n), gm.tensor("c", m * n * eo)
    scale = gm.tensor("scale", n * 4)
    bias = gm.tensor("bias", n * 4) if p.bias else None
    ws_a, ws_f = 2 * m * k, m * _FACTORS  # the int8 parts; a row's two factors
    W = gm.tensor("workspace", ws_a + ws_f + 2 * m * n * 4)
    parts = GmTensor("msd_parts", W.addr, ws_a)
    factors, acc = W.addr + ws_a, GmTensor("msd_acc", W.addr + ws_a + ws_f, 2 * m * n * 4)

    la = _Layout(parts, 2 * m, k, 1, "ND")
    lb = _Layout(B, k, n, 1, "ND", p.trans_b)
    plan, buf = alloc_plan(cube, t, hw, "matmul", la, lb, (_Layout(acc, 2 * m, n, 4, "ND"),), ((0, n),), k,
                           None, None)
    dims = (1, 1, n_tiles, 1)
    aic, aiv = [], []
    rows_per_aiv = cdiv(m, 2 * blocks)
    for b in range(blocks):
        body = [x for start, extent in boxes(b * per_core, min(n_tiles, (b + 1) * per_core), dims)
                for x in _box(plan, start, extent, dims)]
        aic.append(Program([SyncAll(), *_prologue(t), *body, *_epilogue(t), CrossSetFlag(Pipe.FIX, _DONE)],
                           buf.buffers))
        lo = min(m, 2 * b * rows_per_aiv)
        cols = (b * per_core * t.base_n, min(n, (b + 1) * per_core * t.base_n))
        aiv.append(_vector_program(p, hw, A, factors, parts, acc, scale, bias, Y,
                                   (lo, min(m, lo + 2 * rows_per_aiv)), cols))
    return lowered_mix(p, t, aic, aiv, (A, B, Y, scale, bias, W))


def lowered_mix(p, t, aic: list[Program], aiv: list[Program], gm: tuple) -> Lowered:
    """A W8A16 multi-scale matmul as one MIX kernel of these blocks' programs; `gm`: its
    tensors (a, b, c, scale, bias or None, workspace)."""
    m, n, k, workspace = p.m, p.n, p.k, gm[-1]
    kernel = Kernel("matmul", CoreType.MIX, len(aic), aic=aic, aiv=aiv, gm=[x for x in gm if x],
                    workspace_bytes=workspace.nbytes, op_type="matmul")
    ins = [TensorInfo("a", (m, k), p.dtype),
           TensorInfo("b", (n, k) if p.trans_b else (k, n), "int8"), TensorInfo("scale", (n,), "fp32")]
    ins += [TensorInfo("bias", (n,), "fp32")] if p.bias else []
    outs = [TensorInfo("c", (m, n), p.out_dtype)]
    return Lowered(op_type="matmul", params=p, tiling=t, kernels=[kernel], flops=2.0 * m * n * k,
                   min_gm_bytes=sum(x.nbytes for x in ins) + sum(x.nbytes for x in outs),
                   unit="cube", inputs=ins, outputs=outs, workspace_bytes=workspace.nbytes)


def _split(rows: tuple[int, int]) -> tuple[int, int, int]:
    """(first row, rows each of the block's two vector cores takes, where sub 1 starts
    past sub 0's first): an odd count overlaps one row, computed by both."""
    lo, hi = rows
    each = cdiv(hi - lo, 2)
    return lo, each, hi - lo - each


def _row_at(share: tuple[int, int, int]):
    """at(base, row_bytes): the address, at `base` of row 0, of the row a vector core of
    the block is at in its `share` of rows (_split), as the loop var r and `sub` move it."""
    first, _, sub1 = share
    return lambda base, row_bytes: addr(base + first * row_bytes, r=row_bytes, sub=sub1 * row_bytes)


def _vector_program(p, hw: HwConfig, A, factors: int, parts, acc, scale, bias, Y, rows, cols) -> Program:
    """One block's vector cores: quantise their rows of A into the two int8 parts, SyncAll,
    then (once their cube has written its columns of C) combine those columns into Y."""
    m, k, e, eo = p.m, p.k, DTYPE_BYTES[p.dtype], DTYPE_BYTES[p.out_dtype]
    c0, width = cols[0], cols[1] - cols[0]
    buf = Buffers(hw, "matmul")
    fac = buf.alloc("factors", Mem.UB, _FACTORS)
    post = {name: buf.alloc(name, Mem.UB, align_up(width * 4, UB_BLOCK)) for name in ("c1", "c2", "scale", "bias")
            if name != "bias" or bias is not None}
    out = buf.alloc("y", Mem.UB, align_up(width * eo, UB_BLOCK))
    # what the factors, the row maximum and the six buffers' alignment leave
    room = hw.aiv.ub_bytes - buf.next.get(Mem.UB, 0) - 8 * UB_BLOCK
    chunk = min(k, room // _PRE_BYTES // MSD_ALIGN * MSD_ALIGN)
    if chunk < MSD_ALIGN:  # (a ValueError from range() with a step of 0)
        raise ProgramError(f"op matmul: the multi-scale kernel's quantisation of A needs {MSD_ALIGN * _PRE_BYTES} "
                           f"bytes of UB beside the {hw.aiv.ub_bytes - room} its other buffers take, more than the "
                           f"{hw.aiv.ub_bytes} it has")
    pre = {name: buf.alloc(name, Mem.UB, align_up(chunk * size, UB_BLOCK))
           for name, size in (("x", e), ("w", 4), ("t", 4), ("h", 2), ("q1", 1), ("q2", 1))}
    st = buf.alloc("amax", Mem.UB, 2 * UB_BLOCK)

    body: list = []
    share = _split(rows)
    if share[1]:
        body.append(Loop("r", share[1], _quantise_row(p, A, parts, factors, _row_at(share), chunk, pre, st, fac)))
    body += [SyncAll(), CrossWaitFlag(Pipe.MTE2, _DONE)]
    loads = [Copy(Mem.GM, Mem.UB, scale.addr + c0 * 4, post["scale"], width * 4)]
    if bias is not None:
        loads.append(Copy(Mem.GM, Mem.UB, bias.addr + c0 * 4, post["bias"], width * 4))
    body += loads + _after(Pipe.MTE2, Pipe.V)
    share = _split((0, m))
    at = _row_at(share)
    n = width
    combine = [
        *_after(Pipe.V, Pipe.MTE2),
        Copy(Mem.GM, Mem.UB, at(acc.addr + c0 * 4, p.n * 4), post["c1"], n * 4),
        Copy(Mem.GM, Mem.UB, at(acc.addr + m * p.n * 4 + c0 * 4, p.n * 4), post["c2"], n * 4),
        Copy(Mem.GM, Mem.UB, at(factors, _FACTORS), fac, _FACTORS),
        *_after(Pipe.MTE2, Pipe.V), *scalar_read(),
        vop("muls", n, "fp32", post["c1"], post["c1"], scalar_src=fac),
        vop("muls", n, "fp32", post["c2"], post["c2"], scalar_src=fac + UB_BLOCK),
        vop("add", n, "fp32", post["c1"], post["c1"], post["c2"]),
        vop("mul", n, "fp32", post["c1"], post["c1"], post["scale"]),
        *([vop("add", n, "fp32", post["c1"], post["c1"], post["bias"])] if bias is not None else []),
        *_after(Pipe.MTE3, Pipe.V),
        cast(n, "fp32", p.out_dtype, out, post["c1"]),
        *_after(Pipe.V, Pipe.MTE3),
        Copy(Mem.UB, Mem.GM, out, at(Y.addr + c0 * eo, p.n * eo), n * eo),
    ]
    body.append(Loop("r", share[1], combine))
    return Program(body + _after(Pipe.MTE3, Pipe.V), buf.buffers)


def _after(src: Pipe, dst: Pipe) -> list:
    """`dst` waits until `src` is done with what it issued before (a set and its wait)."""
    return [SetFlag(src, dst, 0), WaitFlag(src, dst, 0)]


def _quantise_row(p, A, parts, factors: int, at, chunk: int, ub: dict, st: int, fac: int) -> list:
    """One row of A (`at`: _row_at's, for this core's rows) into its two int8 parts and its
    two factors (_quantise over the row's K)."""
    m, k, e = p.m, p.k, DTYPE_BYTES[p.dtype]
    return _quantise(p.dtype, k, chunk, ub, st, fac,
                     lambda j, n: [Copy(Mem.GM, Mem.UB, at(A.addr + j * e, k * e), ub["x"], n * e)],
                     lambda i, j: at(parts.addr + i * m * k + j, k), at(factors, _FACTORS))


def _quantise(dtype: str, k: int, chunk: int, ub: dict, st: int, fac: int, load_x, part_at, fac_at) -> list:
    """k elements of a row of A into its two int8 parts and its two factors: its largest
    magnitude over them in chunks, then each chunk scaled, rounded, and its residual scaled
    and rounded. load_x(j, n): the copies of elements j..j+n into ub["x"]; part_at(i, j):
    where part i's element j goes in GM; fac_at: where the factors go."""
    spans = [(j, min(chunk, k - j)) for j in range(0, k, chunk)]

    def load(j: int, n: int) -> list:
        return [*_after(Pipe.V, Pipe.MTE2), *load_x(j, n), *_after(Pipe.MTE2, Pipe.V),
                cast(n, dtype, "fp32", ub["w"], ub["x"])]

    out: list = []
    for i, (j, n) in enumerate(spans):  # pass 1: a = max |x| (+ MIN_AMAX, a guard on an all-zero row)
        out += load(j, n) + [vop("abs", n, "fp32", ub["w"], ub["w"]),
                             vop("reduce_max", n, "fp32", st + (UB_BLOCK if i else 0), ub["w"], out_n=1)]
        if i:
            out.append(vop("max", 1, "fp32", st, st, st + UB_BLOCK))
    out += [vop("adds", 1, "fp32", st, st, scalar=MIN_AMAX),
            vop("dup", 1, "fp32", st + UB_BLOCK, scalar=float(INT8_MAX)),
            vop("div", 1, "fp32", st + UB_BLOCK, st + UB_BLOCK, st),  # c / a, read back by the scalar unit
            *_after(Pipe.MTE3, Pipe.V),
            vop("muls", 1, "fp32", fac, st, scalar=1.0 / INT8_MAX),  # a / c
            vop("muls", 1, "fp32", fac + UB_BLOCK, st, scalar=1.0 / INT8_MAX ** 2),  # a / c^2
            *_after(Pipe.V, Pipe.MTE3), Copy(Mem.UB, Mem.GM, fac, fac_at, _FACTORS), *scalar_read()]
    for j, n in spans:  # pass 2: the parts (one chunk: the row pass 1 loaded, cast again as abs overwrote it)
        out += (load(j, n) if len(spans) > 1 else [cast(n, dtype, "fp32", ub["w"], ub["x"])]) + [
            vop("muls", n, "fp32", ub["w"], ub["w"], scalar_src=st + UB_BLOCK),  # x c / a
            *_after(Pipe.MTE3, Pipe.V),
            cast(n, "fp32", "fp16", ub["h"], ub["w"]), cast(n, "fp16", "int8", ub["q1"], ub["h"]),
            cast(n, "int8", "fp16", ub["h"], ub["q1"]), cast(n, "fp16", "fp32", ub["t"], ub["h"]),
            vop("sub", n, "fp32", ub["w"], ub["w"], ub["t"]),
            vop("muls", n, "fp32", ub["w"], ub["w"], scalar=float(INT8_MAX)),
            cast(n, "fp32", "fp16", ub["h"], ub["w"]), cast(n, "fp16", "int8", ub["q2"], ub["h"]),
            *_after(Pipe.V, Pipe.MTE3),
            Copy(Mem.UB, Mem.GM, ub["q1"], part_at(0, j), n), Copy(Mem.UB, Mem.GM, ub["q2"], part_at(1, j), n)]
    return out


__all__ = ["MSD_ALIGN", "MSD_MAX_M", "lower_msd", "msd_applies"]
