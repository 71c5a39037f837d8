"""The functional interpreter: run a lowered kernel on real data.

GM is a byte array holding the kernel's tensors at their addresses; each core of
the kernel gets its own local memories (L1, L0A/B/C, BT, FB or UB), filled with 0xFF
bytes so a read of data nobody wrote is a NaN that shows in the result. Every
instruction does what isa.instructions says it does, on those bytes.

Order: each core's program is split into one in-order stream per pipe (as the engine
runs it). The interpreter repeatedly runs, on each core, the earliest (in program
order) pipe head that may proceed: a WaitFlag once its flag is set, a cross-core
wait once the other side has set it, PipeBarrier(ALL) once every pipe of the core
has reached it, SyncAll once every core has. That is one interleaving a correct
program allows; a program whose result depends on the interleaving is wrong
anyway. When no core can move and some stream is not done, the program deadlocks:
a one-line error names the core, pipe and instruction waiting.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from attrs import define, field

from npusim.errors import DeadlockError, NpusimError, ProgramError
from npusim.hw.config import HwConfig
from npusim.isa.instructions import (
    ACC_DTYPES, FRACTAL_COLS, UNDESCRIBED_OPS, VECTOR_OPS, l0b_block_bytes, parse_convert,
)
from npusim.isa.program import (
    CORE_MEMS, CORE_PIPES, DTYPE_BYTES, Copy, CoreType, CrossSetFlag, CrossWaitFlag, Kernel, Mem, Mmad, Pipe,
    PipeBarrier, SetFlag, SyncAll, VecOp, WaitFlag, at,
)
from npusim.isa.verify import mem_capacity, verify
from npusim.isa.verify_walk import short
from npusim.isa.values import decode, encode
from npusim.isa.walk import TooLarge, pipes_of, runs, unroll

POISON = 0xFF  # the byte fresh local memory holds: fp16 / fp32 / bf16 NaN
# The most instructions one core's program may run once unrolled: numpy works per
# instruction, about 20 us each, so this is about a second per core at worst.
STEP_LIMIT = 50_000
# The most instructions all cores of one kernel may run once unrolled: at about 20 us each,
# some 40 s. Each core's program is held to STEP_LIMIT, but a kernel of thousands of blocks
# (as many as LOCAL_BYTES_MAX allows) each within it ran for hours; counted from the loop
# trips (walk.runs) and refused before anything is unrolled.
TOTAL_STEP_LIMIT = 1 << 21
# The most local memory the interpreter allocates for one kernel (every core's whole L1,
# L0A/B/C, BT, FB or UB): about 900 AIV cores of the 910B, 20 x its 48; a kernel of 65535
# blocks asked for 12 GB.
LOCAL_BYTES_MAX = 1 << 28 << 2


class NotInterpretable(ProgramError):
    """The IR lacks what an instruction's semantics need (an operand, a scalar, a
    conversion): the kernel cannot be checked yet - not a wrong kernel."""


class Gm:
    """Device memory as one byte array from `base`: the GM tensors of a kernel."""

    def __init__(self, base: int, nbytes: int):
        self.base = base
        self.data = np.zeros(nbytes, dtype=np.uint8)

    def write(self, addr: int, raw: np.ndarray) -> None:
        self.data[addr - self.base: addr - self.base + raw.size] = raw

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        return self.data[addr - self.base: addr - self.base + nbytes].copy()


@define
class _Step:
    index: int  # position in the core's program order
    instr: object
    vars: dict


@define
class _Core:
    label: str
    kind: CoreType
    block: int
    sub: int
    mems: dict
    queues: dict  # Pipe -> list of _Step
    pos: dict = field(factory=dict)  # Pipe -> next index in its queue
    flags: Counter = field(factory=Counter)  # (src, dst, id) -> sets not yet consumed
    cross: Counter = field(factory=Counter)  # (from sub, id) -> cross sets received, not consumed

    def head(self, pipe: Pipe):
        q, i = self.queues[pipe], self.pos[pipe]
        return q[i] if i < len(q) else None

    def done(self) -> bool:
        return all(self.pos[p] >= len(q) for p, q in self.queues.items())


def run_kernel(kernel: Kernel, hw: HwConfig, gm: Gm, step_limit: int = STEP_LIMIT) -> None:
    """Run every core of `kernel` on `gm` (changed in place); a one-line ProgramError
    (or DeadlockError) naming kernel, core and instruction if it cannot. The kernel is
    verify()'d first: the interpreter runs what the device could run, no other."""
    verify(kernel, hw)
    if not isinstance(gm, Gm):
        raise ProgramError(f"kernel {kernel.name!r}: gm is {type(gm).__name__!r}, expected an interpret.Gm")
    local = sum(mem_capacity(hw)[m] for kind in _sides(kernel) for m in CORE_MEMS[kind]
                for _ in range(_subs(kernel, hw) if kind is CoreType.AIV else 1)) * kernel.block_dim
    if local > LOCAL_BYTES_MAX:
        raise TooLarge(f"kernel {kernel.name!r}: its {kernel.block_dim} blocks hold {local} bytes of local memory, "
                       f"more than the {LOCAL_BYTES_MAX} the interpreter allocates (validate --kernels takes "
                       "small shapes)")
    _check_total_steps(kernel, hw, step_limit)
    cores = _cores(kernel, hw, step_limit)
    by_block: dict[int, list[_Core]] = {}
    for c in cores:
        by_block.setdefault(c.block, []).append(c)
    while True:
        moved = False
        for core in cores:
            while _advance(core, cores, by_block[core.block], gm, kernel):
                moved = True
        if all(c.done() for c in cores):
            return
        if not moved:
            raise DeadlockError(_deadlock(kernel, cores))


def _check_total_steps(kernel: Kernel, hw: HwConfig, step_limit: int) -> None:
    """All cores together run at most TOTAL_STEP_LIMIT instructions, or a one-line TooLarge.
    (A program past `step_limit` is left to unroll, which names it.)"""
    counts: dict[int, int] = {}  # id(program) -> the instructions it runs
    total = cores = 0
    for kind in _sides(kernel):
        for block in range(kernel.block_dim):
            program = kernel.program(kind, block)
            n = counts.get(id(program))
            if n is None:
                n = counts[id(program)] = runs(program.body)
                if n > step_limit:
                    return
            subs = _subs(kernel, hw) if kind is CoreType.AIV else 1
            total += n * subs
            cores += subs
    if total > TOTAL_STEP_LIMIT:
        raise TooLarge(f"kernel {kernel.name!r}: its {cores} cores run {total} instructions once unrolled, more than "
                       f"the {TOTAL_STEP_LIMIT} the interpreter runs of one kernel (validate --kernels takes small "
                       "shapes)")


def _sides(kernel: Kernel) -> list[CoreType]:
    """The physical cores of one block of `kernel`, by kind."""
    return {CoreType.AIC: [CoreType.AIC], CoreType.AIV: [CoreType.AIV],
            CoreType.MIX: [CoreType.AIC, CoreType.AIV]}[kernel.core_type]


def _subs(kernel: Kernel, hw: HwConfig) -> int:
    """AIVs per block: aiv_per_aic in a MIX kernel, else one."""
    return hw.chip.aiv_per_aic if kernel.core_type is CoreType.MIX else 1


def _cores(kernel: Kernel, hw: HwConfig, limit: int) -> list[_Core]:
    sizes = mem_capacity(hw)  # each local memory whole, as the config sizes it
    subs = _subs(kernel, hw)
    sides = _sides(kernel)
    cores = []
    for block in range(kernel.block_dim):
        for kind in sides:
            program = kernel.program(kind, block)
            for sub in range(subs if kind is CoreType.AIV else 1):
                name = f"kernel {kernel.name!r} block {block} {kind.value}" + (
                    f" sub {sub}" if kernel.core_type is CoreType.MIX and kind is CoreType.AIV else "")
                pipes = CORE_PIPES[kind]
                queues = {p: [] for p in pipes}
                try:
                    for index, (instr, vars) in enumerate(unroll(program.body, {"block": block, "sub": sub}, limit)):
                        step = _Step(index, instr, vars)
                        for p in pipes_of(instr, pipes):
                            if p not in queues:
                                raise ProgramError(f"pipe {p!r} does not exist on {kind.value}")
                            queues[p].append(step)
                except NpusimError as e:  # a pipe it lacks (ProgramError), too many instructions (TooLarge)
                    raise type(e)(f"{name}: {e}") from None
                mems = {m: np.full(sizes[m], POISON, dtype=np.uint8) for m in CORE_MEMS[kind]}
                cores.append(_Core(name, kind, block, sub, mems, queues, {p: 0 for p in pipes}))
    return cores


def _advance(core: _Core, cores: list[_Core], block: list[_Core], gm: Gm, kernel: Kernel) -> bool:
    """Run the earliest runnable pipe head of `core`; False if none can run."""
    step = None
    for pipe in core.queues:
        head = core.head(pipe)
        if head is not None and (step is None or head.index < step.index) and _ready(core, head, cores, block):
            step = head
    if step is None:
        return False
    if step.instr.__class__ is SyncAll:  # every core is at it: all pass together
        for c in cores:
            for p in c.queues:
                c.pos[p] += 1
        return True
    try:
        _execute(core, step, block, gm)
    except ProgramError as e:
        raise type(e)(f"{core.label}: instr {step.index} {short(step.instr)}: {e}") from None
    for p in pipes_of(step.instr, CORE_PIPES[core.kind]):
        core.pos[p] += 1
    return True


def _ready(core: _Core, step: _Step, cores: list[_Core], block: list[_Core]) -> bool:
    instr = step.instr
    cls = instr.__class__
    if cls is WaitFlag:
        return core.flags[(instr.src, instr.dst, instr.id)] > 0
    if cls is CrossWaitFlag:
        if core.kind is CoreType.AIV:
            return core.cross[(-1, instr.id)] > 0
        return all(core.cross[(c.sub, instr.id)] > 0 for c in block if c.kind is CoreType.AIV)
    if cls is PipeBarrier and instr.pipe is None:
        return _at_all_pipes(core, step)
    if cls is SyncAll:
        return all(_at_all_pipes(c, None) for c in cores)
    return True


def _at_all_pipes(core: _Core, step: _Step | None) -> bool:
    """Every pipe's head is `step` (None: the same SyncAll)."""
    heads = [core.head(p) for p in core.queues]
    if step is None:
        return heads[0] is not None and heads[0].instr.__class__ is SyncAll and all(h is heads[0] for h in heads)
    return all(h is step for h in heads)


def _execute(core: _Core, step: _Step, block: list[_Core], gm: Gm) -> None:
    instr, vars = step.instr, step.vars
    cls = instr.__class__
    if cls is Copy:
        _copy(core, instr, vars, gm)
    elif cls is Mmad:
        _mmad(core, instr, vars)
    elif cls is VecOp:
        _vec(core, instr, vars)
    elif cls is SetFlag:
        core.flags[(instr.src, instr.dst, instr.id)] += 1
    elif cls is WaitFlag:
        core.flags[(instr.src, instr.dst, instr.id)] -= 1
    elif cls is CrossSetFlag:
        if core.kind is CoreType.AIC:
            for c in block:
                if c.kind is CoreType.AIV:
                    c.cross[(-1, instr.id)] += 1
        else:
            next(c for c in block if c.kind is CoreType.AIC).cross[(core.sub, instr.id)] += 1
    elif cls is CrossWaitFlag:
        if core.kind is CoreType.AIV:
            core.cross[(-1, instr.id)] -= 1
        else:
            for c in block:
                if c.kind is CoreType.AIV:
                    core.cross[(c.sub, instr.id)] -= 1
    # Scalar, PipeBarrier, SyncAll: ordering only


# ------------------------------------------------------------------ memory access


def _space(core: _Core, mem: Mem, gm: Gm | None) -> tuple[np.ndarray, int]:
    """(byte array, address of its first byte) of `mem` on this core."""
    if mem is Mem.GM:
        return gm.data, gm.base
    if mem not in core.mems:
        raise ProgramError(f"{core.kind.value} has no {mem.value}")
    return core.mems[mem], 0


def _index(space: tuple[np.ndarray, int], mem: Mem, offsets: np.ndarray) -> np.ndarray:
    """Byte offsets (addresses) -> indices into the array, checked to fall inside it."""
    data, base = space
    idx = offsets - base
    if idx.size and (idx.min() < 0 or idx.max() >= data.size):
        lo, hi = int(offsets.min()), int(offsets.max()) + 1
        raise ProgramError(f"{mem.value} access [{lo:#x}, {hi:#x}) outside the memory "
                           f"[{base:#x}, {base + data.size:#x})")
    return idx


def _segments(addr: int, nbytes: int, segments: int, stride: int) -> np.ndarray:
    return (addr + np.arange(segments, dtype=np.int64)[:, None] * stride + np.arange(nbytes, dtype=np.int64)[None, :])


def _elements(offsets: np.ndarray, elem: int) -> np.ndarray:
    """Element byte offsets -> the byte offsets of every byte of each element."""
    return offsets[..., None] + np.arange(elem, dtype=np.int64)


def _read(core: _Core, mem: Mem, offsets: np.ndarray, gm: Gm | None = None) -> np.ndarray:
    space = _space(core, mem, gm)
    return space[0][_index(space, mem, offsets)]


def _write(core: _Core, mem: Mem, offsets: np.ndarray, raw: np.ndarray, gm: Gm | None = None) -> None:
    space = _space(core, mem, gm)
    space[0][_index(space, mem, offsets)] = raw


# ------------------------------------------------------------------ instructions


# FixPipe's conversions: the accumulator dtype each reads from L0C
FIXPIPE = {"fix": "fp32", "fix_add": "fp32", "fix_s32": "int32"}


def _copy(core: _Core, c: Copy, vars: dict, gm: Gm) -> None:
    parsed = parse_convert(c.convert)
    if parsed is None:
        raise NotInterpretable(f"copy conversion {c.convert!r} is not in isa.instructions.CONVERSIONS")
    conv, tile_rows, group = parsed
    if conv.kind == "undescribed":
        raise NotInterpretable(f"copy conversion {c.convert!r}: {conv.help}")
    src, dst = at(c.src_addr, vars), at(c.dst_addr, vars)
    if c.src is Mem.L0C and conv.kind not in FIXPIPE:
        raise NotInterpretable("a copy out of L0C without its FixPipe conversion (Copy.convert): the accumulator's "
                           "dtype and what FixPipe applies are not in the IR")
    if conv.kind == "bytes":
        raw = _read(core, c.src, _segments(src, c.nbytes, c.segments, c.stride(c.src)), gm)
        _write(core, c.dst, _segments(dst, c.nbytes, c.segments, c.stride(c.dst)), raw, gm)
        return
    e = DTYPE_BYTES[conv.dtype]
    if c.nbytes % e:
        raise ProgramError(f"{c.convert}: segment of {c.nbytes} bytes is not whole {e}-byte elements")
    n = c.nbytes // e
    if conv.kind in FIXPIPE:
        acc = decode(_read(core, c.src, _segments(src, n * 4, c.segments, c.stride(c.src)), gm), FIXPIPE[conv.kind])
        at_dst = _segments(dst, c.nbytes, c.segments, c.stride(c.dst))
        if conv.kind == "fix_add":  # atomic: the partial sum added to what C holds
            acc = acc + decode(_read(core, c.dst, at_dst, gm), conv.dtype).reshape(acc.shape)
        _write(core, c.dst, at_dst, encode(acc, conv.dtype).reshape(at_dst.shape), gm)
        return
    raw = _read(core, c.src, _segments(src, c.nbytes, c.segments, c.stride(c.src)), gm)
    i = np.arange(c.segments, dtype=np.int64)[:, None]
    j = np.arange(n, dtype=np.int64)[None, :]
    if conv.kind == "nd2nz":  # segment i = row i, element j = column j
        rows, r, col = c.segments, i, j
    else:  # dn2nz: segment i = column i, element j = row j
        rows, r, col = n, j, i
    tile = 0
    if tile_rows:  # rows of an NZ tile of R rows, from the row dst is at
        if conv.kind != "nd2nz" or group:
            raise NotInterpretable(f"{c.convert}: '@R' is for rows (nd2nz) of one tile")
        rows = tile_rows
    if group:  # groups of R rows (segments), each its own NZ tile, back to back
        if conv.kind != "nd2nz" or c.segments % group:
            raise NotInterpretable(f"{c.convert}: {c.segments} segments are not whole groups of {group} rows")
        rows = group
        tile, r = (r // rows) * rows * (-(-n // FRACTAL_COLS) * FRACTAL_COLS), r % rows
    off = dst + (tile + (col // FRACTAL_COLS) * rows * FRACTAL_COLS + r * FRACTAL_COLS + col % FRACTAL_COLS) * e
    _write(core, c.dst, _elements(off, e), raw.reshape(c.segments, n, e), gm)


def _mmad(core: _Core, mm: Mmad, vars: dict) -> None:
    e, acc = DTYPE_BYTES[mm.dtype], ACC_DTYPES.get(mm.dtype)
    if acc is None:
        raise NotInterpretable(f"Mmad dtype {mm.dtype!r} has no accumulator dtype in isa.instructions.ACC_DTYPES")
    f = FRACTAL_COLS
    r = np.arange(mm.m, dtype=np.int64)[:, None]
    k = np.arange(mm.k, dtype=np.int64)[None, :]
    a_off = at(mm.a_addr, vars) + ((k // f) * mm.m * f + r * f + k % f) * e
    kk = np.arange(mm.k, dtype=np.int64)[:, None]
    n = np.arange(mm.n, dtype=np.int64)[None, :]
    b_off = at(mm.b_addr, vars) + (n // f) * l0b_block_bytes(mm.k, e) + (kk * f + n % f) * e
    width = -(-mm.n // f) * f
    c_off = at(mm.c_addr, vars) + (r * width + n) * DTYPE_BYTES[acc]
    a = decode(_read(core, Mem.L0A, _elements(a_off, e)).reshape(-1), mm.dtype).reshape(mm.m, mm.k)
    b = decode(_read(core, Mem.L0B, _elements(b_off, e)).reshape(-1), mm.dtype).reshape(mm.k, mm.n)
    exact = acc == "int32"  # int8 x int8 sums are exact in float64
    with np.errstate(invalid="ignore", over="ignore"):  # poison (NaN) read from unwritten L0 stays NaN
        c = a.astype(np.float64) @ b.astype(np.float64) if exact else a @ b
    accumulate = mm.accumulate if mm.accumulate.__class__ is bool else at(mm.accumulate, vars) != 0
    if accumulate:
        old = decode(_read(core, Mem.L0C, _elements(c_off, DTYPE_BYTES[acc])).reshape(-1), acc)
        c = c + old.reshape(c.shape)
    _write(core, Mem.L0C, _elements(c_off, DTYPE_BYTES[acc]), encode(c, acc).reshape(mm.m, mm.n, -1))


def _vec(core: _Core, v: VecOp, vars: dict) -> None:
    kind = VECTOR_OPS.get(v.op)
    if kind is None:
        why = UNDESCRIBED_OPS.get(v.op, "it has no semantics in isa.instructions.VECTOR_OPS")
        raise NotInterpretable(f"vector op {v.op!r}: {why}")
    if len(v.srcs) != kind.arity:
        raise NotInterpretable(f"vector op {v.op!r} names {len(v.srcs)} source(s); it reads {kind.arity} "
                           "(isa.instructions.VECTOR_OPS): an operand is missing from the IR")
    e, out_dtype = DTYPE_BYTES[v.dtype], v.out_dtype or v.dtype
    if v.pitches and kind.reduce:
        _reduce_rows(core, v, kind, vars)
        return
    data = v.srcs[:-1] if kind.mask_in else v.srcs
    srcs = [decode(_read(core, Mem.UB, _elements(_placed(v, at(s, vars), e, 1 + i), e)).reshape(-1), v.dtype)
            for i, s in enumerate(data)]
    if kind.mask_in:  # n bits from bit 0 of the mask's first byte
        bits = _read(core, Mem.UB, _segments(at(v.srcs[-1], vars), -(-v.n // 8), 1, 0)).reshape(-1)
        srcs.append(np.unpackbits(bits, bitorder="little")[:v.n].astype(bool))
    scalar = None
    if kind.scalar:
        if v.scalar is not None:  # an immediate, or one the scalar unit computes from the loop vars (an Affine)
            k = v.scalar if isinstance(v.scalar, (int, float)) else at(v.scalar, vars)
            scalar = np.float32(k) if v.dtype in ("fp16", "bf16", "fp32") else int(k)
        elif v.scalar_src is not None:
            scalar = decode(_read(core, Mem.UB, _segments(at(v.scalar_src, vars), 4, 1, 0)).reshape(-1), "fp32")[0]
        else:
            raise NotInterpretable(f"vector op {v.op!r} takes a scalar operand and the IR has none "
                               "(VecOp.scalar / scalar_src)")
    out_n = v.n if v.out_n is None else v.out_n
    if kind.bits_out:  # one bit an element, in the order the pitches enumerate them, contiguous at dst
        if out_n != -(-v.n // 8) or (v.out_dtype or v.dtype) != "uint8":
            raise NotInterpretable(f"{v.op} of {v.n} elements writes a mask of {-(-v.n // 8)} uint8 bytes, "
                                   f"not out_n={out_n} {v.out_dtype}")
        with np.errstate(invalid="ignore"):
            bits = np.asarray(kind.fn(srcs, scalar), dtype=bool)
        raw = np.packbits(bits, bitorder="little")
        _write(core, Mem.UB, _segments(at(v.dst, vars), raw.size, 1, 0), raw.reshape(1, -1))
        return
    if kind.reduce:
        if v.n % out_n:
            raise ProgramError(f"{v.op} of {v.n} elements into {out_n}: not whole groups")
        srcs = [s.reshape(out_n, v.n // out_n) for s in srcs]
    elif out_n != v.n:
        raise NotInterpretable(f"elementwise {v.op} writes out_n={out_n} of its n={v.n} elements: not interpretable")
    if kind.arity == 0:
        result = np.full(out_n, scalar, dtype=np.float32)
    else:
        result = kind.fn(srcs, scalar)
    raw = encode(np.asarray(result, dtype=np.float32 if out_dtype in ("fp16", "bf16", "fp32") else np.int64),
                 out_dtype)
    eo = DTYPE_BYTES[out_dtype]
    if v.pitches:
        _write(core, Mem.UB, _elements(_placed(v, at(v.dst, vars), eo, 0), eo), raw.reshape(-1, eo))
    else:
        _write(core, Mem.UB, _segments(at(v.dst, vars), raw.size, 1, 0), raw.reshape(1, -1))


def _reduce_rows(core: _Core, v: VecOp, kind, vars: dict) -> None:
    """A reduction with pitches: pitches[0] counts its rows (dst pitch: where each row's
    result goes), the rest of the levels and the run are the row's elements; each result
    fills out_n / rows consecutive elements (Brcb's block of one value)."""
    rows, pitch = v.pitches[0][0], v.pitches[0][1]
    out_n = v.n if v.out_n is None else v.out_n
    out_dtype = v.out_dtype or v.dtype
    e, eo = DTYPE_BYTES[v.dtype], DTYPE_BYTES[out_dtype]
    if out_n % rows or (out_n // rows) * eo > pitch:
        raise NotInterpretable(f"{v.op}: {out_n} outputs do not fill {rows} rows of {pitch} bytes")
    src = decode(_read(core, Mem.UB, _elements(_placed(v, at(v.srcs[0], vars), e, 1), e)).reshape(-1), v.dtype)
    result = np.repeat(kind.fn([src.reshape(rows, -1)], None), out_n // rows)
    fill = np.arange(out_n // rows, dtype=np.int64)
    off = at(v.dst, vars) + np.arange(rows, dtype=np.int64)[:, None] * pitch + fill[None, :] * eo
    _write(core, Mem.UB, _elements(off.reshape(-1), eo), encode(result.astype(np.float32), out_dtype).reshape(-1, eo))


def _placed(v: VecOp, addr: int, elem: int, operand: int) -> np.ndarray:
    """Byte offsets of the n elements of operand `operand` (0 dst, 1.. the srcs) of `v`:
    contiguous, or as VecOp.pitches lays them out."""
    if not v.pitches:
        return addr + np.arange(v.n, dtype=np.int64) * elem
    counts = [level[0] for level in v.pitches]
    if any(len(level) != 2 + len(v.srcs) for level in v.pitches):
        raise NotInterpretable(f"{v.op}: each level of pitches needs (count, dst pitch, a pitch per source)")
    runs = int(np.prod(counts))
    if v.n % runs:
        raise NotInterpretable(f"{v.op}: n={v.n} is not whole runs of the pitches' {runs} rows")
    off = np.full(1, addr, dtype=np.int64)
    for level in v.pitches:
        off = (off[:, None] + np.arange(level[0], dtype=np.int64)[None, :] * level[1 + operand]).reshape(-1)
    return (off[:, None] + np.arange(v.n // runs, dtype=np.int64)[None, :] * elem).reshape(-1)


# ------------------------------------------------------------------ messages


def _deadlock(kernel: Kernel, cores: list[_Core]) -> str:
    """The first core and pipe that wait, and on what."""
    for core in cores:
        for pipe in core.queues:
            step = core.head(pipe)
            if step is not None:
                return (f"kernel {kernel.name!r}: deadlock: {core.label} pipe {pipe.value} waits at instr "
                        f"{step.index} {short(step.instr)} and no core can proceed")
    return f"kernel {kernel.name!r}: deadlock"


__all__ = ["LOCAL_BYTES_MAX", "Gm", "NotInterpretable", "POISON", "STEP_LIMIT", "run_kernel"]
