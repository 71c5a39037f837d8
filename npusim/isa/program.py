"""The lowered-program IR: frozen instruction records for the pipes of an AI core.

A block program is what one core runs: a body of instructions and first-class
loops, plus the local buffers it declares. Addresses are plain ints or `Affine`
expressions of the loop variables and of the reserved variables `block` (block
index) and `sub` (AIV index inside a MIX block), so one small program describes
every block and every iteration (Ascend C's `xGm[blockIdx * len + i * tile]`).

Pipes: MTE2 (GM -> L1/L0A/L0B/UB), MTE1 (L1 -> L0A/L0B/BT), M (cube), FIX
(L0C -> GM/L1, L1 -> FB), MTE3 (UB/L1 -> GM), V (vector), S (scalar).
"""

from __future__ import annotations

import math

import enum
import functools
import operator
from typing import Union

import attrs
from attrs import field, frozen


class _Named(enum.Enum):
    """An enum that prints as its value (MTE2, not <Pipe.MTE2: 'MTE2'>). Hashed by
    identity (each member is one object; Enum's own hash is a Python call, and the
    engine and verify() look pipes and memories up in dicts hundreds of thousands of
    times a step)."""

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return self.value


class Pipe(_Named):
    MTE2 = "MTE2"
    MTE1 = "MTE1"
    MTE3 = "MTE3"
    FIX = "FIX"
    M = "M"
    V = "V"
    S = "S"


class Mem(_Named):
    GM = "GM"
    L1 = "L1"
    L0A = "L0A"
    L0B = "L0B"
    L0C = "L0C"
    UB = "UB"
    BT = "BT"
    FB = "FB"


class CoreType(_Named):
    AIC = "AIC"
    AIV = "AIV"
    MIX = "MIX"  # one AIC and aiv_per_aic AIVs per block


# Which pipes and local buffers each physical core has.
CORE_PIPES = {
    CoreType.AIC: (Pipe.MTE2, Pipe.MTE1, Pipe.M, Pipe.FIX, Pipe.MTE3, Pipe.S),
    CoreType.AIV: (Pipe.MTE2, Pipe.V, Pipe.MTE3, Pipe.S),
}
CORE_MEMS = {
    CoreType.AIC: (Mem.L1, Mem.L0A, Mem.L0B, Mem.L0C, Mem.BT, Mem.FB),
    CoreType.AIV: (Mem.UB,),
}

# The pipe that executes a copy, by (src, dst). Paths not listed do not exist.
COPY_PIPE = {
    (Mem.GM, Mem.L1): Pipe.MTE2,
    (Mem.GM, Mem.L0A): Pipe.MTE2,
    (Mem.GM, Mem.L0B): Pipe.MTE2,
    (Mem.GM, Mem.UB): Pipe.MTE2,
    (Mem.L1, Mem.L0A): Pipe.MTE1,
    (Mem.L1, Mem.L0B): Pipe.MTE1,
    (Mem.L1, Mem.BT): Pipe.MTE1,
    (Mem.L0C, Mem.GM): Pipe.FIX,
    (Mem.L0C, Mem.L1): Pipe.FIX,
    (Mem.L1, Mem.FB): Pipe.FIX,
    (Mem.UB, Mem.GM): Pipe.MTE3,
    (Mem.L1, Mem.GM): Pipe.MTE3,
}

# Start-address alignment of each local buffer, in bytes (Ascend C docs).
ALIGN_BYTES = {Mem.UB: 32, Mem.L1: 32, Mem.L0A: 512, Mem.L0B: 512, Mem.L0C: 64, Mem.BT: 64, Mem.FB: 64}

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8}

RESERVED_VARS = ("block", "sub")


def record(cls: type) -> type:
    """attrs.frozen, and pickled as cls(*field values) rather than in attrs' own form (the
    class, then a dict of the fields): an op's entry in the disk cache, which holds its
    lowered programs (thousands of records), takes 60% of the bytes and is written and
    read back in 55% of the time (matmul 4096^3)."""
    cls = frozen(cls)
    names = [a.name for a in attrs.fields(cls)]
    values = operator.attrgetter(*names) if len(names) > 1 else lambda r: tuple(getattr(r, n) for n in names)
    cls.__reduce__ = lambda r: (cls, values(r))
    return cls


@record
class Affine:
    """base + sum(step * var): an address that moves with loop and block indices."""

    base: int
    terms: tuple[tuple[str, int], ...] = ()

    def at(self, vars: dict[str, int]) -> int:
        a = self.base
        for var, step in self.terms:
            a += step * vars[var]
        return a

    def __repr__(self) -> str:
        base, terms = self.base, self.terms
        if base.__class__ is not int or terms.__class__ is not tuple or not all(
                t.__class__ is tuple and len(t) == 2 for t in terms):  # malformed: verify() names what
            return f"Affine({base!r}, {terms!r})"
        return "+".join([hex(base)] + [f"{s}*{v}" for v, s in terms])


Addr = Union[int, Affine]


def addr(base: int, **steps: int) -> Addr:
    """addr(0x1000, block=4096, i=256) -> Affine; with no steps, the plain int."""
    terms = tuple((v, s) for v, s in steps.items() if s)
    return Affine(base, terms) if terms else base


def shift(a: Addr, delta: int) -> Addr:
    """An address (int or Affine) moved by `delta` bytes."""
    return a + delta if a.__class__ is int else Affine(a.base + delta, a.terms)


def moving(a: Addr, var: str, step: int) -> Addr:
    """An address (int or Affine) that also moves by `step` bytes per unit of `var` (0: a itself)."""
    if not step:
        return a
    base, terms = (a, ()) if a.__class__ is int else (a.base, a.terms)
    return Affine(base, terms + ((var, step),))


def off_line_share(a: Addr, segments: int, stride: int, line: int) -> float:
    """The share of a copy's segments whose GM start `a` is not on an L2 line, over every
    value of the loop variables and block index it moves with: the starts are base +
    multiples of d = gcd(line, each step, the segment stride), so none is on a line if
    base is not a multiple of d, else one in line / d is.
    # assumption: the loops run long enough for the starts to spread over those residues"""
    base, steps = (a, ()) if a.__class__ is int else (a.base, [s for _, s in a.terms])
    d = line
    for s in (*steps, stride) if segments > 1 else steps:
        d = math.gcd(d, s)
    return 1.0 if base % d else 1.0 - d / line


def offset(base: Addr, index: Addr, scale: int) -> Addr:
    """base + index * scale, both moving with loop variables (an index is an Addr too:
    c + sum(coef * var)); a variable in both gets the sum of its steps."""
    b, terms = (base, {}) if base.__class__ is int else (base.base, dict(base.terms))
    c, steps = (index, ()) if index.__class__ is int else (index.base, index.terms)
    for var, k in steps:
        terms[var] = terms.get(var, 0) + k * scale
    return addr(b + c * scale, **terms)


def bound(a: Addr, values: dict[str, int]) -> Addr:
    """`a` with the vars in `values` replaced by their values (the others left to move):
    a plain int when no var is left, as addr() gives it; `a` itself when it reads none."""
    if a.__class__ is int:
        return a
    base, terms = a.base, []
    for var, step in a.terms:
        value = values.get(var)
        if value is None:
            terms.append((var, step))
        else:
            base += step * value
    if len(terms) == len(a.terms):
        return a
    return Affine(base, tuple(terms)) if terms else base


def at(a: Addr, vars: dict[str, int]) -> int:
    return a if a.__class__ is int else a.at(vars)


# ---------------------------------------------------------------- instructions


@record
class Copy:
    """Move `nbytes` per segment, `segments` times, from src to dst.

    Segment i reads [src_addr + i*src_stride, +nbytes) and writes
    [dst_addr + i*dst_stride, +nbytes); strides default to nbytes (contiguous).
    GM segments pay the burst rule and a per-segment start-up.

    `convert` (isa.instructions.CONVERSIONS; "" = bytes as they are) is what the copy
    does to the data on the way, for the functional interpreter: "nd2nz_b16" (MTE2
    lays ND rows of 16-bit elements out as 16-column fractal blocks), "fix_fp16"
    (FixPipe converts the fp32 accumulator). It does not change the copy's cost."""

    src: Mem
    dst: Mem
    src_addr: Addr
    dst_addr: Addr
    nbytes: int
    segments: int = 1
    src_stride: int | None = None
    dst_stride: int | None = None
    convert: str = ""

    @property
    def pipe(self) -> Pipe:
        return COPY_PIPE[(self.src, self.dst)]

    @property
    def total_bytes(self) -> int:
        return self.nbytes * self.segments

    def stride(self, mem: Mem) -> int:
        s = self.src_stride if mem is self.src else self.dst_stride
        return self.nbytes if s is None else s

    def moved(self, src_addr: Addr, dst_addr: Addr) -> Copy:
        """This copy between other addresses (attrs.evolve's result, built directly:
        lowerings move tens of thousands of instructions)."""
        return Copy(self.src, self.dst, src_addr, dst_addr, self.nbytes, self.segments, self.src_stride,
                    self.dst_stride, self.convert)


@record
class Mmad:
    """C[m, n] (+)= A[m, k] @ B[k, n] on the cube, A in L0A, B in L0B, C in L0C (fp32 acc).

    `accumulate`: add into C (True) or overwrite it (False); or an index (an Addr over
    the loop vars) that is 0 where the tile's first K slice starts C afresh and
    accumulates elsewhere (Ascend C's cmatrixInitVal, decided per iteration)."""

    m: int
    n: int
    k: int
    dtype: str = "fp16"
    a_addr: Addr = 0
    b_addr: Addr = 0
    c_addr: Addr = 0
    accumulate: bool | Addr = False
    pipe = Pipe.M

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@record
class VecOp:
    """A vector instruction over `n` elements in UB; `out_n` elements written (default n).

    The scalar operand of Muls, Adds, Duplicate, Select (isa.instructions.VECTOR_OPS):
    `scalar`, an immediate (a number, or an Affine of the loop variables, `block` and
    `sub` that the scalar unit computes, e.g. a row's causal limit), or `scalar_src`, the
    UB address of an fp32 value the scalar unit has read back (GetValue). `pitches`:
    where the elements of a strided elementwise instruction sit (Ascend C's repeat
    strides): levels, outermost first, each (count, dst pitch, src 0 pitch, src 1
    pitch, ...) in bytes, the innermost run n / (product of counts) contiguous
    elements; a pitch of 0 repeats that operand's run (a broadcast); () = every
    operand contiguous. None of the three changes the cost;
    the functional interpreter needs them."""

    op: str
    n: int
    dtype: str = "fp16"
    dst: Addr = 0
    srcs: tuple[Addr, ...] = ()
    out_dtype: str | None = None
    out_n: int | None = None
    flops_per_elem: int = 1
    scalar: float | Affine | None = None
    scalar_src: Addr | None = None
    pitches: tuple[tuple[int, ...], ...] = ()
    pipe = Pipe.V

    def moved(self, dst: Addr, srcs: tuple[Addr, ...]) -> VecOp:
        """This instruction on other operands (see Copy.moved)."""
        return VecOp(self.op, self.n, self.dtype, dst, srcs, self.out_dtype, self.out_n, self.flops_per_elem,
                     self.scalar, self.scalar_src, self.pitches)


@record
class Scalar:
    """Scalar work on the S pipe (address arithmetic, loop control), in cycles."""

    cycles: int
    pipe = Pipe.S


@record
class SetFlag:
    """Issued on `src`; lets the `dst` pipe's matching WaitFlag proceed (counting)."""

    src: Pipe
    dst: Pipe
    id: int = 0

    @property
    def pipe(self) -> Pipe:
        return self.src


@record
class WaitFlag:
    """Issued on `dst`; blocks it until `src` has set the flag, then consumes it."""

    src: Pipe
    dst: Pipe
    id: int = 0

    @property
    def pipe(self) -> Pipe:
        return self.dst


# Flags are values: each (src, dst, id) is built once and shared by these constructors
# (a K3 prefill's flash kernel issues some 300,000 of them: building each anew took a
# fifth of its lowering).
set_flag = functools.cache(SetFlag)
wait_flag = functools.cache(WaitFlag)


@record
class PipeBarrier:
    """pipe=None (PIPE_ALL): every pipe of the core waits until all have drained to here.
    With a pipe: a barrier inside that pipe only (orders its memory accesses)."""

    pipe: Pipe | None = None


@record
class SyncAll:
    """Every core of the kernel waits here until all have arrived."""


@record
class CrossSetFlag:
    """MIX kernels: issued on `pipe`; AIC -> each AIV of its block, or AIV -> its AIC."""

    pipe: Pipe
    id: int = 0


@record
class CrossWaitFlag:
    """MIX kernels: block `pipe` until the other side of the block has set `id`.
    An AIC waits for every AIV of its block; an AIV waits for its AIC."""

    pipe: Pipe
    id: int = 0


Instr = Union[Copy, Mmad, VecOp, Scalar, SetFlag, WaitFlag, PipeBarrier, SyncAll, CrossSetFlag, CrossWaitFlag]


@record
class Loop:
    """`body` run `count` times with `var` = 0..count-1 (usable in Affine addresses)."""

    var: str
    count: int
    body: tuple = field(converter=tuple)


@record
class Buffer:
    """A local buffer a program declares (Ascend C's pipe.InitBuffer): live all program long."""

    name: str
    mem: Mem
    addr: int
    nbytes: int


@record
class Program:
    """What one core of a block runs."""

    body: tuple = field(converter=tuple)
    buffers: tuple[Buffer, ...] = field(default=(), converter=tuple)


@record
class GmTensor:
    """A GM allocation the kernel reads or writes (an argument or its workspace)."""

    name: str
    addr: int
    nbytes: int


@record
class Kernel:
    """A launchable kernel.

    `aic` / `aiv` hold one Program shared by every block (addresses may use `block`)
    or one Program per block. AIC kernels use `aic`, AIV kernels `aiv`, MIX kernels
    both: each MIX block runs `aic` on one cube core and `aiv` on aiv_per_aic vector
    cores (with `sub` = 0, 1, ...)."""

    name: str
    core_type: CoreType
    block_dim: int
    aic: tuple[Program, ...] = field(default=(), converter=tuple)
    aiv: tuple[Program, ...] = field(default=(), converter=tuple)
    gm: tuple[GmTensor, ...] = field(default=(), converter=tuple)
    workspace_bytes: int = 0
    op_type: str = ""

    def program(self, core: CoreType, block: int) -> Program | None:
        progs = self.aic if core is CoreType.AIC else self.aiv
        if not progs:
            return None
        return progs[0] if len(progs) == 1 else progs[block]

    def blocks_running(self, core: CoreType, program: Program) -> int:
        """How many blocks run this Program object on `core` (see program)."""
        progs = self.aic if core is CoreType.AIC else self.aiv
        return self.block_dim if len(progs) == 1 else sum(p is program for p in progs)
