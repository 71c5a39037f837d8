"""verify(): small valid kernels of each core type pass; each rule rejects a minimal bad kernel
with one line naming the kernel, block, core, instruction and what was expected."""

from __future__ import annotations

import re
import time

import pytest

from npusim.errors import ProgramError
from npusim.hw import load_hw
from npusim.isa import (
    Buffer,
    Copy,
    CoreType,
    CrossSetFlag,
    CrossWaitFlag,
    GmTensor,
    Kernel,
    Loop,
    Mem,
    Mmad,
    Pipe,
    PipeBarrier,
    Program,
    Scalar,
    SetFlag,
    SyncAll,
    VecOp,
    WaitFlag,
    addr,
    verify,
)

HW = load_hw("ascend910b2")
GM, L1, L0A, L0B, L0C, UB = Mem.GM, Mem.L1, Mem.L0A, Mem.L0B, Mem.L0C, Mem.UB
MTE1, MTE2, MTE3, FIX, M, V, S = Pipe.MTE1, Pipe.MTE2, Pipe.MTE3, Pipe.FIX, Pipe.M, Pipe.V, Pipe.S


# ------------------------------------------------------------------ valid kernels


def vector_add(block_dim: int = 8, pairs: int = 4, tile: int = 2048) -> Kernel:
    """z = x + y, fp16, double-buffered: each loop trip does a ping tile then a pong tile.

    MTE3->MTE2 flags say a ping/pong slot is free again (primed before the loop,
    drained after it), MTE2->V says its inputs are in, V->MTE3 its output is ready."""
    per_block = 2 * pairs * tile
    total = block_dim * per_block
    x, y, z = 0x100000, 0x100000 + total, 0x100000 + 2 * total
    bx, by, bz = 0, 2 * tile, 4 * tile  # UB: two slots of `tile` per operand
    body = [SetFlag(MTE3, MTE2, 0), SetFlag(MTE3, MTE2, 1)]
    trip = []
    for s in (0, 1):
        gm = dict(block=per_block, j=2 * tile)
        trip += [
            WaitFlag(MTE3, MTE2, s),
            Copy(GM, UB, addr(x + s * tile, **gm), bx + s * tile, tile),
            Copy(GM, UB, addr(y + s * tile, **gm), by + s * tile, tile),
            SetFlag(MTE2, V, s),
            WaitFlag(MTE2, V, s),
            VecOp("add", tile // 2, dst=bz + s * tile, srcs=(bx + s * tile, by + s * tile)),
            SetFlag(V, MTE3, s),
            WaitFlag(V, MTE3, s),
            Copy(UB, GM, bz + s * tile, addr(z + s * tile, **gm), tile),
            SetFlag(MTE3, MTE2, s),
        ]
    body += [Scalar(10), Loop("j", pairs, trip), WaitFlag(MTE3, MTE2, 0), WaitFlag(MTE3, MTE2, 1)]
    buffers = [Buffer("x", UB, bx, 2 * tile), Buffer("y", UB, by, 2 * tile), Buffer("z", UB, bz, 2 * tile)]
    gm = [GmTensor("x", x, total), GmTensor("y", y, total), GmTensor("z", z, total)]
    return Kernel("vector_add", CoreType.AIV, block_dim, aiv=[Program(body, buffers)], gm=gm, op_type="Add")


# A matmul tile: C[64, 64] fp32 of each block = A[block rows, K] @ B[K, 64], K in chunks of 128.
MT, NT, KT, KCHUNKS = 64, 64, 128, 2
A_TILE, B_TILE, C_TILE = MT * KT * 2, KT * NT * 2, MT * NT * 4
A_GM, B_GM, C_GM = 0x1000000, 0x2000000, 0x3000000
K_BYTES = KT * KCHUNKS * 2  # one row of A in GM
CUBE_BUFFERS = [
    Buffer("a_l1", L1, 0, A_TILE),
    Buffer("b_l1", L1, A_TILE, B_TILE),
    Buffer("a", L0A, 0, A_TILE),
    Buffer("b", L0B, 0, B_TILE),
    Buffer("c", L0C, 0, C_TILE),
]


def cube_chunk(kk: str) -> list:
    """One K chunk: GM -> L1 (A strided by rows), L1 -> L0A/L0B, Mmad, then free L1/L0 for the next."""
    return [
        Copy(GM, L1, addr(A_GM, block=MT * K_BYTES, **{kk: KT * 2}), 0, KT * 2, segments=MT, src_stride=K_BYTES),
        Copy(GM, L1, addr(B_GM, **{kk: B_TILE}), A_TILE, B_TILE),
        SetFlag(MTE2, MTE1, 0),
        WaitFlag(MTE2, MTE1, 0),
        Copy(L1, L0A, 0, 0, A_TILE),
        Copy(L1, L0B, A_TILE, 0, B_TILE),
        SetFlag(MTE1, M, 0),
        WaitFlag(MTE1, M, 0),
        Mmad(MT, NT, KT, a_addr=0, b_addr=0, c_addr=0, accumulate=True),
        SetFlag(M, MTE2, 0),
        WaitFlag(M, MTE2, 0),
    ]


def matmul(block_dim: int = 4) -> Kernel:
    """C = A @ B on the cube: GM -> L1 -> L0A/L0B, Mmad into L0C over a K loop, FixPipe L0C -> GM."""
    body = [
        Loop("kk", KCHUNKS, cube_chunk("kk")),
        SetFlag(M, FIX, 0),
        WaitFlag(M, FIX, 0),
        Copy(L0C, GM, 0, addr(C_GM, block=C_TILE), C_TILE),
        PipeBarrier(),
    ]
    gm = [
        GmTensor("a", A_GM, block_dim * MT * K_BYTES),
        GmTensor("b", B_GM, KCHUNKS * B_TILE),
        GmTensor("c", C_GM, block_dim * C_TILE),
    ]
    return Kernel("matmul", CoreType.AIC, block_dim, aic=[Program(body, CUBE_BUFFERS)], gm=gm, op_type="MatMul")


def matmul_relu(block_dim: int = 2, tiles: int = 3) -> Kernel:
    """MIX: the AIC computes C tiles into a GM workspace and cross-flags id 0 to its AIVs; each AIV
    applies relu to its half of the tile (`sub`) and cross-flags id 1 back when the slot is free."""
    ws, out = 0x4000000, 0x5000000
    half = C_TILE // HW.chip.aiv_per_aic
    per_block = tiles * C_TILE
    cube = [
        Loop("t", tiles, [
            Loop("kk", KCHUNKS, cube_chunk("kk")),
            SetFlag(M, FIX, 0),
            WaitFlag(M, FIX, 0),
            Copy(L0C, GM, 0, addr(ws, block=C_TILE), C_TILE),
            CrossSetFlag(FIX, 0),
            CrossWaitFlag(FIX, 1),
        ])
    ]
    vec = [
        Loop("t", tiles, [
            CrossWaitFlag(MTE2, 0),
            Copy(GM, UB, addr(ws, block=C_TILE, sub=half), 0, half),
            SetFlag(MTE2, V, 0),
            WaitFlag(MTE2, V, 0),
            VecOp("relu", half // 4, dtype="fp32", dst=half, srcs=(0,)),
            CrossSetFlag(V, 1),
            SetFlag(V, MTE3, 0),
            WaitFlag(V, MTE3, 0),
            Copy(UB, GM, half, addr(out, block=per_block, t=C_TILE, sub=half), half),
            PipeBarrier(),
        ])
    ]
    gm = [
        GmTensor("a", A_GM, block_dim * MT * K_BYTES),
        GmTensor("b", B_GM, KCHUNKS * B_TILE),
        GmTensor("workspace", ws, block_dim * C_TILE),
        GmTensor("out", out, block_dim * per_block),
    ]
    return Kernel(
        "matmul_relu", CoreType.MIX, block_dim,
        aic=[Program(cube, CUBE_BUFFERS)],
        aiv=[Program(vec, [Buffer("in", UB, 0, half), Buffer("out", UB, half, half)])],
        gm=gm,
    )


@pytest.mark.parametrize("kernel", [vector_add(), matmul(), matmul_relu()], ids=lambda k: k.name)
def test_valid_kernel_passes_unchanged(kernel):
    assert verify(kernel, HW) is kernel


def test_valid_per_block_programs_and_sync_all_at_residency():
    """One program per block, with `block` fixed; SyncAll with every AIV resident is fine."""
    progs = [Program([Copy(GM, UB, 64 * b, 0, 64), SyncAll()], [Buffer("ub", UB, 0, 64)]) for b in range(HW.aiv_count)]
    k = Kernel("per_block", CoreType.AIV, HW.aiv_count, aiv=progs)
    assert verify(k, HW) is k


def test_mmad_operand_bytes_follow_dtype():
    """A[64, 256] is 32 KiB in fp16 (past the 16 KiB 'a' buffer) but 16 KiB in int8."""
    assert verify(aic([Mmad(MT, 16, 2 * KT, dtype="int8")]), HW)
    with pytest.raises(ProgramError, match=r"A L0A \[0x0, 0x8000\)"):
        verify(aic([Mmad(MT, 16, 2 * KT, dtype="fp16")]), HW)


def test_flags_balance_across_loops_of_different_counts():
    body = [Loop("i", 4, [SetFlag(MTE2, V, 3)]), Loop("j", 2, [WaitFlag(MTE2, V, 3), WaitFlag(MTE2, V, 3)])]
    assert verify(aiv(body), HW)


def test_verify_is_fast_on_long_loops():
    """A few hundred instructions under loops of a million trips: walked once, not unrolled."""
    k = vector_add(block_dim=HW.aiv_count, pairs=1)
    trip = k.aiv[0].body[3].body * 15  # 300 instructions, still balanced
    body = [*k.aiv[0].body[:3], Loop("o", 1000, [Loop("j", 1000, trip)]), *k.aiv[0].body[4:]]
    big = Kernel("big", CoreType.AIV, HW.aiv_count, aiv=[Program(body, k.aiv[0].buffers)])  # GM unbounded
    best = min(_timed(lambda: verify(big, HW)) for _ in range(5))
    assert best < 0.010


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


# ------------------------------------------------------------------ rejections

UB_BUF = (Buffer("ub", UB, 0, 4096),)


def aiv(body, buffers=UB_BUF, block_dim: int = 1, gm=()) -> Kernel:
    return Kernel("bad", CoreType.AIV, block_dim, aiv=[Program(body, buffers)], gm=gm)


def aic(body, buffers=CUBE_BUFFERS, block_dim: int = 1) -> Kernel:
    return Kernel("bad", CoreType.AIC, block_dim, aic=[Program(body, buffers)])


def mix(cube, vec, block_dim: int = 1) -> Kernel:
    return Kernel("bad", CoreType.MIX, block_dim, aic=[Program(cube, CUBE_BUFFERS)], aiv=[Program(vec, UB_BUF)])


def test_error_is_one_line_naming_kernel_block_core_and_instruction():
    k = aiv([Scalar(1), Loop("i", 4, [Scalar(1), VecOp("add", 1024, dst=addr(0, i=2048))])])
    with pytest.raises(ProgramError) as e:
        verify(k, HW)
    assert str(e.value) == (
        "kernel 'bad', all blocks, AIV: instr 1.1 VecOp(op='add', n=1024, dst=0x0+2048*i): "
        "dst UB [0x0, 0x2000) over all blocks and iterations is not inside one declared UB buffer "
        "(have 'ub' [0x0, 0x1000))"
    )


UB_END = HW.aiv.ub_bytes + 32
L0A_END = HW.aic.l0a_bytes + 512

BUFFER_CASES = {
    "mem the core lacks": (
        aiv([], [Buffer("w", L1, 0, 1024)]),
        r"^kernel 'bad', all blocks, AIV: buffer 'w' in L1: AIV has no L1 \(has UB\)$",
    ),
    "UB capacity": (
        aiv([], [Buffer("big", UB, 0, UB_END)]),
        rf"buffer 'big' \[0x0, {UB_END:#x}\) needs {UB_END} bytes of UB but AIV has {HW.aiv.ub_bytes}$",
    ),
    "L0A capacity": (
        aic([], [Buffer("a", L0A, 512, HW.aic.l0a_bytes)]),
        rf"AIC: buffer 'a' .* needs {L0A_END} bytes of L0A but AIC has {HW.aic.l0a_bytes}$",
    ),
    "overlap": (
        aiv([], [Buffer("b", UB, 512, 1024), Buffer("c", UB, 2048, 32), Buffer("a", UB, 0, 1024)]),
        r"buffers 'a' \[0x0, 0x400\) and 'b' \[0x200, 0x600\) overlap in UB$",
    ),
    "misaligned": (
        aic([], [Buffer("a", L0A, 256, 512)]),
        r"buffer 'a' in L0A: addr 0x100 is not 512-byte aligned$",
    ),
}


@pytest.mark.parametrize("kernel, match", BUFFER_CASES.values(), ids=BUFFER_CASES.keys())
def test_bad_buffer(kernel, match):
    with pytest.raises(ProgramError, match=match):
        verify(kernel, HW)


TWO_UB = (Buffer("x", UB, 0, 2048), Buffer("y", UB, 2048, 2048))
ACCESS_CASES = {
    "loop var past the buffer": (
        aiv([Loop("i", 4, [VecOp("add", 1024, dst=addr(0, i=2048))])]),
        r"instr 0\.0 VecOp\(.*\): dst UB \[0x0, 0x2000\) .* not inside one declared UB buffer \(have 'ub' \[0x0, 0x1000\)\)",
    ),
    "block var past the buffer": (
        aiv([VecOp("add", 512, dst=addr(0, block=1024))], block_dim=5),
        r"all blocks, AIV: instr 0 .*dst UB \[0x0, 0x1400\) .*not inside",
    ),
    "spans two buffers": (
        aiv([VecOp("add", 1024, dst=0, srcs=(1024,))], TWO_UB),
        r"src 0 UB \[0x400, 0xc00\) .*not inside one declared UB buffer \(have 'x' \[0x0, 0x800\), 'y' \[0x800, 0x1000\)\)",
    ),
    "no buffer declared": (
        aiv([VecOp("add", 16, dst=0)], ()),
        r"dst UB \[0x0, 0x20\) .*\(have none declared\)",
    ),
    "cast writes out_dtype bytes": (
        aiv([VecOp("cast", 1024, dst=0, srcs=(2048,), out_dtype="fp32")], TWO_UB),
        r"dst UB \[0x0, 0x1000\) .*not inside",
    ),
    "reduce writes out_n elements": (
        aiv([VecOp("reduce_sum", 16, dst=4064, srcs=(0,), out_n=32)]),
        r"dst UB \[0xfe0, 0x1020\)",
    ),
    "per-block program names its block": (
        Kernel("bad", CoreType.AIV, 2, aiv=[Program([Copy(GM, UB, 0, 0, 64)], UB_BUF),
                                            Program([Copy(GM, UB, 0, 4096, 64)], UB_BUF)]),
        r"^kernel 'bad', block 1, AIV: instr 0 Copy\(.*\): dst UB \[0x1000, 0x1040\)",
    ),
    "MIX names the AIV sub-core": (
        mix([], [Copy(GM, UB, 0, addr(0, sub=4096), 64)]),
        r"^kernel 'bad', all blocks, AIV sub 1: instr 0 .*dst UB \[0x1000, 0x1040\)",
    ),
    "misaligned base": (
        aiv([Copy(GM, UB, 0, 16, 64)]),
        r"instr 0 Copy\(.*\): dst UB address 16: base 16 is not a multiple of 32 \(UB alignment\)",
    ),
    "misaligned step": (
        aiv([Loop("i", 2, [Copy(GM, UB, 0, addr(0, i=48), 32)])]),
        r"instr 0\.0 .*dst UB address 0x0\+48\*i: step of 'i' 48 is not a multiple of 32",
    ),
    "misaligned segment stride": (
        aiv([Copy(GM, UB, 0, 0, 40, segments=2)]),
        r"dst UB address 0: segment stride 40 is not a multiple of 32",
    ),
    "misaligned L0A operand": (
        aic([Mmad(16, 16, 16, a_addr=256)]),
        r"instr 0 Mmad\(.*a_addr=256\): A L0A address 256: base 256 is not a multiple of 512",
    ),
    "Mmad A = m*k*elem": (
        aic([Mmad(MT, 16, 2 * KT)]),
        r"A L0A \[0x0, 0x8000\) .*not inside one declared L0A buffer \(have 'a' \[0x0, 0x4000\)\)",
    ),
    "Mmad B = k*n*elem": (
        aic([Mmad(16, 2 * NT, KT)]),
        r"B L0B \[0x0, 0x8000\) .*not inside",
    ),
    "Mmad C = m*n*4": (
        aic([Mmad(MT, 2 * NT, 16)]),
        r"C L0C \[0x0, 0x8000\) .*not inside one declared L0C buffer",
    ),
    "Mmad int8 B moving with block": (  # B = 256*16*1 bytes; last block starts at 29*512
        aic([Mmad(MT, 16, 2 * KT, dtype="int8", b_addr=addr(0, block=512))], block_dim=30),
        r"B L0B \[0x0, 0x4a00\)",
    ),
    "Mmad dtype without fractal": (
        aic([Mmad(16, 16, 16, dtype="int16")]),
        r"Mmad dtype 'int16' has no cube fractal \(have fp16, bf16, int8, fp32\)",
    ),
    "vector op without cost": (
        aiv([VecOp("frobnicate", 16)]),
        r"instr 0 VecOp\(op='frobnicate', n=16\): vector op 'frobnicate' has no cost in the config",
    ),
    "vector dtype": (
        aiv([VecOp("add", 16, dtype="fp8")]),
        r"dtype 'fp8' is not one of fp16, bf16",
    ),
    "vector out_dtype": (
        aiv([VecOp("cast", 16, out_dtype="fp64")]),
        r"dtype 'fp64' is not one of",
    ),
    "copy path": (
        aiv([Copy(UB, L1, 0, 0, 32)]),
        r"instr 0 Copy\(.*\): no copy path UB -> L1 \(not in COPY_PIPE\)",
    ),
    "GM to GM": (
        aiv([Copy(GM, GM, 0, 64, 32)]),
        r"no copy path GM -> GM",
    ),
    "GM outside tensors, with segments": (
        aiv([Copy(GM, UB, 0x1000, 0, 1024, segments=4, src_stride=2560)], gm=[GmTensor("x", 0x1000, 8192)]),
        r"src GM \[0x1000, 0x3200\) .*outside every GmTensor \(have 'x' \[0x1000, 0x3000\)\)",
    ),
    "GM outside tensors, by block": (
        aiv([Copy(UB, GM, 0, addr(0, block=1024), 1024)], block_dim=3, gm=[GmTensor("y", 0, 2048)]),
        r"dst GM \[0x0, 0xc00\) .*outside every GmTensor",
    ),
    "address of another type": (
        aiv([VecOp("add", 16, dst=0, srcs=(32.0,))]),
        r"src 0 address 32\.0 is a float, expected an int or Affine",
    ),
    "var not in scope": (
        aiv([Loop("i", 2, []), VecOp("add", 16, dst=addr(0, i=32))]),
        r"instr 1 .*dst address 0x0\+32\*i uses var 'i', not in scope \(have block, sub\)",
    ),
}


@pytest.mark.parametrize("kernel, match", ACCESS_CASES.values(), ids=ACCESS_CASES.keys())
def test_bad_access(kernel, match):
    with pytest.raises(ProgramError, match=match):
        verify(kernel, HW)


PIPE_CASES = {
    "Mmad on AIV": (aiv([Mmad(16, 16, 16)]), r"AIV: instr 0 Mmad\(.*\): pipe M does not exist on AIV \(has MTE2, V, MTE3, S\)"),
    "VecOp on AIC": (aic([VecOp("add", 16)]), r"AIC: instr 0 VecOp\(.*\): pipe V does not exist on AIC"),
    "FixPipe on AIV": (aiv([Copy(L0C, GM, 0, 0, 64)]), r"pipe FIX does not exist on AIV"),
    "L1 copy on AIV": (aiv([Copy(GM, L1, 0, 0, 64)]), r"instr 0 Copy\(.*\): dst in L1: AIV has no L1 \(has UB\)"),
    "UB copy on AIC": (aic([Copy(UB, GM, 0, 0, 64)]), r"src in UB: AIC has no UB"),
    "SetFlag src == dst": (aiv([SetFlag(V, V)]), r"instr 0 SetFlag\(src=V, dst=V\): src and dst are both V"),
    "WaitFlag pipe the core lacks": (aiv([WaitFlag(M, V)]), r"WaitFlag\(src=M, dst=V\): pipe M does not exist on AIV"),
    "SetFlag pipe the core lacks": (aic([SetFlag(MTE2, V)]), r"pipe V does not exist on AIC"),
    "PipeBarrier pipe the core lacks": (aiv([PipeBarrier(MTE1)]), r"PipeBarrier\(pipe=MTE1\): pipe MTE1 does not exist on AIV"),
    "flag id too big": (
        aiv([SetFlag(MTE2, V, HW.sync.flag_ids)]),
        rf"flag id {HW.sync.flag_ids} outside \[0, {HW.sync.flag_ids}\)",
    ),
    "flag id negative": (aiv([WaitFlag(MTE2, V, -1)]), r"flag id -1 outside \[0, 8\)"),
    # a flag is checked at the first use of its (src, dst, id): the error names that one
    "bad flag used twice": (aiv([Scalar(1), WaitFlag(MTE2, V, 9), SetFlag(MTE2, V, 9)]),
                            r"instr 1 WaitFlag\(.*\): flag id 9 outside"),
    "cross flag id": (mix([CrossSetFlag(FIX, 9)], []), r"AIC: instr 0 CrossSetFlag\(pipe=FIX, id=9\): flag id 9 outside"),
    "cross flag outside MIX": (aiv([CrossSetFlag(MTE3)]), r"cross-core flag in a AIV kernel: only MIX kernels"),
    "cross flag pipe": (mix([], [CrossWaitFlag(FIX)]), r"AIV sub 0: instr 0 CrossWaitFlag\(pipe=FIX\): pipe FIX does not exist on AIV"),
}


@pytest.mark.parametrize("kernel, match", PIPE_CASES.values(), ids=PIPE_CASES.keys())
def test_bad_pipe_or_flag(kernel, match):
    with pytest.raises(ProgramError, match=match):
        verify(kernel, HW)


BALANCE_CASES = {
    "sets in a loop, one wait": (
        aiv([Loop("i", 4, [SetFlag(MTE2, V, 1)]), WaitFlag(MTE2, V, 1)]),
        r"^kernel 'bad', all blocks, AIV: instr 0\.0 SetFlag\(src=MTE2, dst=V, id=1\): "
        r"flag MTE2->V id 1 cannot balance: 4 sets vs 1 waits",
    ),
    "wait nobody sets": (
        aic([WaitFlag(MTE1, M, 2), SetFlag(M, MTE1, 2)]),
        r"instr 0 WaitFlag\(src=MTE1, dst=M, id=2\): flag MTE1->M id 2 cannot balance: 0 sets vs 1 waits",
    ),
    "nested loop trips multiply": (
        aiv([Loop("i", 3, [Loop("j", 5, [SetFlag(V, MTE3)])]), Loop("k", 14, [WaitFlag(V, MTE3)])]),
        r"flag V->MTE3 id 0 cannot balance: 15 sets vs 14 waits",
    ),
    "cross AIC -> AIV": (
        mix([Loop("t", 3, [CrossSetFlag(FIX, 0)])], [Loop("t", 2, [CrossWaitFlag(MTE2, 0)])]),
        r"^kernel 'bad', all blocks, AIC: instr 0\.0 CrossSetFlag\(pipe=FIX\): "
        r"cross flag id 0 AIC -> AIV sub 0 cannot balance: AIC sets 3 vs AIV sub 0 waits 2",
    ),
    "cross AIV -> AIC, nobody waits": (
        mix([], [CrossSetFlag(MTE3, 1)]),
        r"^kernel 'bad', all blocks, AIV sub 0: instr 0 CrossSetFlag\(pipe=MTE3, id=1\): "
        r"cross flag id 1 AIV sub 0 -> AIC cannot balance: AIV sub 0 sets 1 vs AIC waits 0",
    ),
    "cross AIC waits, nobody sets": (
        mix([CrossWaitFlag(MTE2, 2)], []),
        r"AIC: instr 0 CrossWaitFlag\(pipe=MTE2, id=2\): cross flag id 2 AIV sub 0 -> AIC cannot balance: "
        r"AIV sub 0 sets 0 vs AIC waits 1",
    ),
    "cross per block": (
        Kernel("bad", CoreType.MIX, 2, aic=[Program([CrossSetFlag(FIX)], CUBE_BUFFERS)],
               aiv=[Program([CrossWaitFlag(MTE2)]), Program([])]),
        r"cross flag id 0 AIC -> AIV sub 0 in block 1 cannot balance: AIC sets 1 vs AIV sub 0 waits 0",
    ),
}


@pytest.mark.parametrize("kernel, match", BALANCE_CASES.values(), ids=BALANCE_CASES.keys())
def test_unbalanced_flags(kernel, match):
    with pytest.raises(ProgramError, match=match):
        verify(kernel, HW)


@pytest.mark.parametrize(
    "core, resident",
    [(CoreType.AIC, HW.chip.aic_count), (CoreType.AIV, HW.aiv_count), (CoreType.MIX, HW.chip.aic_count)],
    ids=lambda x: getattr(x, "value", x),
)
def test_sync_all_beyond_resident_cores_deadlocks(core, resident):
    body = [Scalar(1), SyncAll()]
    progs = dict(aic=[Program(body)] if core is not CoreType.AIV else [],
                 aiv=[Program(body)] if core is not CoreType.AIC else [])
    ok = Kernel("sync", core, resident, **progs)
    assert verify(ok, HW) is ok
    kind = "AIV" if core is CoreType.AIV else "AIC"
    with pytest.raises(ProgramError, match=rf"instr 1 SyncAll\(\): SyncAll with block_dim {resident + 1} > "
                                           rf"{resident} {kind} cores resident at once: would deadlock"):
        verify(Kernel("sync", core, resident + 1, **progs), HW)


P = Program([])
KERNEL_CASES = {
    "block_dim 0": (Kernel("bad", CoreType.AIV, 0, aiv=[P]), r"^kernel 'bad': block_dim 0 must be 1 to 65535 \(Ascend C's blockDim\)$"),
    "tuple length": (
        Kernel("bad", CoreType.AIV, 3, aiv=[P, P]),
        r"^kernel 'bad': 2 aiv programs for block_dim 3: expected 1 \(shared by all blocks\) or 3 \(one per block\)$",
    ),
    "AIC without aic": (Kernel("bad", CoreType.AIC, 1), r"^kernel 'bad': AIC kernel has no aic program$"),
    "AIC with aiv": (
        Kernel("bad", CoreType.AIC, 1, aic=[P], aiv=[P]),
        r"^kernel 'bad': AIC kernel has 1 aiv program\(s\), expected none$",
    ),
    "AIV with aic": (Kernel("bad", CoreType.AIV, 1, aic=[P], aiv=[P]), r"AIV kernel has 1 aic program\(s\), expected none"),
    "MIX without aiv": (Kernel("bad", CoreType.MIX, 1, aic=[P]), r"MIX kernel has no aiv program"),
    "MIX without aic": (Kernel("bad", CoreType.MIX, 1, aiv=[P]), r"MIX kernel has no aic program"),
    "not a Program": (Kernel("bad", CoreType.AIV, 1, aiv=[(Scalar(1),)]), r"aiv\[0\] is a tuple, expected a Program"),
    "loop count": (aiv([Scalar(1), Loop("i", 0, [])]), r"instr 1 Loop\('i', count=0\): loop count 0 must be >= 1"),
    "copy nbytes": (aiv([Copy(GM, UB, 0, 0, 0)]), r"instr 0 Copy\(.*nbytes=0\): nbytes 0 and segments 1 must be >= 1"),
    "copy segments": (aiv([Copy(GM, UB, 0, 0, 32, segments=0)]), r"nbytes 32 and segments 0 must be >= 1"),
    "mmad k": (aic([Mmad(16, 16, 0)]), r"Mmad\(m=16, n=16, k=0\): m 16, n 16, k 0 must all be >= 1"),
    "vecop n": (aiv([VecOp("add", 0)]), r"VecOp\(op='add', n=0\): n 0 and out_n None must be >= 1"),
    "vecop out_n": (aiv([VecOp("reduce_sum", 16, out_n=0)]), r"n 16 and out_n 0 must be >= 1"),
    "scalar cycles": (aiv([Scalar(-1)]), r"instr 0 Scalar\(cycles=-1\): cycles -1 must be >= 0"),
    "loop var shadows": (
        aiv([Loop("i", 2, [Scalar(1), Loop("i", 3, [])])]),
        r"instr 0\.1 Loop\('i', count=3\): loop var 'i' shadows an enclosing loop's var",
    ),
    "loop var reserved": (aiv([Loop("block", 2, [])]), r"instr 0 Loop\('block', count=2\): loop var 'block' is reserved \(block, sub\)"),
    "loop var sub": (aiv([Loop("sub", 2, [])]), r"loop var 'sub' is reserved"),
    "not an instruction": (aiv([Loop("i", 2, ["nop"])]), r"instr 0\.0 'nop': not an instruction \(expected Loop or one of Copy, Mmad"),
    # 2^62 trips of Scalar(0) ran forever
    "loop runs forever": (aiv([Loop("i", 1 << 62, [Scalar(0)])]),
                          r"instr 0 Loop\('i', count=4611686018427387904\): its body runs 4\.61e\+18 times"),
    "nested loops run forever": (aiv([Loop("i", 1 << 16, [Loop("j", 1 << 15, [Scalar(1)])])]),
                                 r"instr 0\.0 Loop\('j', count=32768\): its body runs 2\.15e\+09 times"),
}


@pytest.mark.parametrize("kernel, match", KERNEL_CASES.values(), ids=KERNEL_CASES.keys())
def test_bad_shape_or_count(kernel, match):
    with pytest.raises(ProgramError, match=match):
        verify(kernel, HW)


def test_error_is_a_single_line():
    for kernel, _ in [*BUFFER_CASES.values(), *ACCESS_CASES.values(), *KERNEL_CASES.values()]:
        with pytest.raises(ProgramError) as e:
            verify(kernel, HW)
        assert "\n" not in str(e.value) and re.match(r"kernel 'bad'", str(e.value))


# ------------------------------------------------------------------ checked once


def test_an_instruction_that_passed_is_checked_again_under_other_buffers():
    """verify() skips a var-free instruction it already passed on the same core with the
    same buffers; the same instruction in a block whose buffer is too small still fails."""
    op = VecOp("add", 1024, "fp16", 0, (0,))
    ok = Program([op], (Buffer("x", UB, 0, 4096),))
    small = Program([op], (Buffer("x", UB, 0, 1024),))
    verify(Kernel("k", CoreType.AIV, 2, aiv=[ok, ok]), HW)
    with pytest.raises(ProgramError, match=r"^kernel 'k', block 1, AIV: instr 0 VecOp.*not inside one declared"):
        verify(Kernel("k", CoreType.AIV, 2, aiv=[ok, small]), HW)


def test_a_numpy_address_equal_to_a_passed_int_still_fails():
    np = pytest.importorskip("numpy")
    buffers = (Buffer("x", UB, 0, 4096),)
    first, second = VecOp("add", 8, "fp16", 64, (0,)), VecOp("add", 8, "fp16", np.int64(64), (0,))
    assert first == second  # equal, so only the address's type tells them apart
    with pytest.raises(ProgramError, match=r"block 1, AIV: instr 0 .*is an int64, expected an int or Affine"):
        verify(Kernel("k", CoreType.AIV, 2, aiv=[Program([first], buffers), Program([second], buffers)]), HW)


def test_loops_up_to_the_bound_or_of_nothing_but_loops_pass():
    """The bound on a body's runs (MAX_BODY_RUNS) leaves a body run exactly that often, and a
    loop nest that executes no instruction (the engine walks it at once), alone."""
    from npusim.isa.verify_walk import MAX_BODY_RUNS

    verify(aiv([Loop("i", MAX_BODY_RUNS, [Scalar(1)])]), HW)
    verify(aiv([Loop("i", 1 << 62, [Loop("j", 1 << 62, [])])]), HW)
