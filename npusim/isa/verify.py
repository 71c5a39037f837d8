"""verify(kernel, hw): reject a lowered kernel the hardware could not run.

The engine trusts what it runs, so this is where a lowering bug becomes one
readable line instead of a wrong number or a hang. Checked, against the config:

- the kernel's shape: block_dim (1 to MAX_BLOCK_DIM), one shared program or one per block, the
  programs its core type needs;
- every field of the type the engine takes: a count, size, id or stride an int
  (not a bool, a float or a numpy int), a memory a Mem, a pipe a Pipe, an Affine
  an int base and (var, step) terms (_FIELDS);
- every buffer: its core has that memory, it fits, it is aligned, no two overlap;
- every instruction: its pipe exists on the core, its operands fall inside one
  declared buffer (or GM tensor) for *every* block, sub-core and loop iteration
  and are aligned (verify_addresses.py), GM ones inside the GM the device has
  (hw.checks.gm_named_bytes), Mmad and vector dtypes/ops are ones the config knows;
- synchronisation: flag ids in range, SetFlag/WaitFlag counts balance per
  program, cross-core flags balance between the AIC and AIV sides of a MIX block,
  SyncAll only when every block can be resident at once.

Loops are walked once, never unrolled: each loop var is carried as its range
[0, count-1] and each instruction as a multiplicity (the product of the counts of
its enclosing loops). An Affine address is linear, so its extremes sit at the
corners of those ranges. A shared program is checked once with `block` over
[0, block_dim-1]; a per-block program with `block` fixed; a MIX AIV program once
per sub-core with `sub` fixed, so an error can name the sub-core at fault.

An instruction whose addresses are all plain ints reads no var, so its check
depends only on itself, its core and its program's buffers: one that passed is not
checked again on a core of that kind with those buffers (the per-block programs of
a kernel repeat most of their local instructions). A failing one is met first
where it would be met anyway, so the error is the same line.

Likewise a Program object met again on a core of the kind it passed on (a MIX
AIV program, once per sub-core; a program some blocks share, in runs apart) is not
walked again: only the checks that read `block` or `sub` - the accesses whose
addresses move with them, listed by its first walk in walk order - are run with
the new site's ranges, and its flag counts are the first walk's. Every other check
reads neither, so it passes again; the first of the listed ones to fail is the
first the walk would have failed at.

And a program like the last one walked on its core - the same buffers object, the
same loops (var and count), every other instruction the same object but some Copy,
Mmad or VecOp - is checked as that one's walk again, the differing instructions in
full (verify_alike.py: check_like, and check_listed, which runs a listed check again).
"""

from __future__ import annotations

import itertools
import operator
from collections import Counter
from collections.abc import Callable

import attrs

from npusim.errors import ProgramError
from npusim.hw.checks import STEP_CYCLES_MAX, gm_named_bytes
from npusim.hw.config import HwConfig
from npusim.isa.program import (
    ALIGN_BYTES, CORE_MEMS, CORE_PIPES, COPY_PIPE, DTYPE_BYTES, RESERVED_VARS, Affine, Buffer, Copy, CoreType,
    CrossSetFlag, CrossWaitFlag, GmTensor, Kernel, Loop, Mem, Mmad, Pipe, PipeBarrier, Program, Scalar, SetFlag,
    SyncAll, VecOp, WaitFlag,
)
from npusim.isa.instructions import CONVERSIONS, parse_convert, vec_spans
from npusim.isa.verify_addresses import ADDRESSES, a_type, check_access, check_index, hex_range, names
from npusim.isa.verify_alike import check_like, check_listed

# L0C accumulates in fp32 (int32 for int8 inputs: the same width).
ACC_DTYPE = "fp32"
# The most times a loop's body may run in one program (its trips times its enclosing
# loops'): the largest lowered program (a GEMM block of K3's prefill of 32 x 4096 tokens)
# executes ~7.7e5 instructions, and the engine walks about a million a second, so a body
# run 2^30 times is at least ~20 minutes of one core's program; beyond, a loop count is a
# slip (2^62 trips of Scalar(0) ran forever), refused before the run.
MAX_BODY_RUNS = 1 << 30
# The deepest loop nest a program may hold: lowerings nest 4 or 5 deep; verify() and the
# engine walk a nest by recursion, and 400 loops in one another were a RecursionError.
MAX_LOOP_DEPTH = 64

# The most blocks a kernel may launch: Ascend C's blockDim is 1 to 65535. The engine runs
# every block (a launch of 65535 one-instruction blocks takes under a second); a block_dim
# of 2^63 ran forever.
MAX_BLOCK_DIM = 65535

Scope = dict[str, tuple[int, int]]  # var -> (lowest, highest) value in this part of the walk
Path = tuple[int, ...]  # index path of an instruction in the body: (3, 1) is body[3].body[1]


def verify(kernel: Kernel, hw: HwConfig) -> Kernel:
    """Check `kernel` against `hw`; return it unchanged, or raise one-line ProgramError."""
    gm_end = gm_named_bytes(hw)
    _check_shape(kernel, gm_end)
    capacity = _mem_capacity(hw)
    capacity[Mem.GM] = gm_end
    walks = {}
    passed: dict[tuple, set] = {}  # (core, program buffers) -> var-free instructions that passed
    sites = list(_sites(kernel, hw))
    # (core, id(program)) -> its first walk on that core, for the programs met on more than one site
    first: dict[tuple, _Walk | None] = {}
    for key, n in Counter((site.core, id(_program(kernel, site))) for site, _ in sites).items():
        if n > 1:
            first[key] = None
    last: dict[CoreType, _Walk] = {}  # per core, the last program walked (in full or like another)
    for site, indices in sites:
        walk = _check_program(kernel, hw, capacity, site, passed, first, last)
        for index in indices:  # blocks sharing one Program object are checked once
            walks[(site.core, index, site.sub)] = walk
    if kernel.core_type is CoreType.MIX:
        _check_cross_balance(kernel, hw, walks)
    return kernel


# ------------------------------------------------------------------ kernel shape


def _check_shape(kernel: Kernel, gm_end: int) -> None:
    """block_dim in range; GmTensors inside [0, gm_end); the program tuples the core type
    needs, each of length 1 or block_dim."""
    where = f"kernel {kernel.name!r}"
    ct = kernel.core_type
    if ct.__class__ is not CoreType:
        raise ProgramError(f"{where}: core_type {ct!r} is {a_type(ct)}, expected a CoreType "
                           f"({', '.join(c.value for c in CoreType)})")
    for name in ("block_dim", "workspace_bytes"):
        value = getattr(kernel, name)
        if value.__class__ is not int:
            raise ProgramError(f"{where}: {name} {value!r} is {a_type(value)}, expected an int")
    if not 1 <= kernel.block_dim <= MAX_BLOCK_DIM:
        raise ProgramError(f"{where}: block_dim {kernel.block_dim} must be 1 to {MAX_BLOCK_DIM} (Ascend C's blockDim)")
    if kernel.workspace_bytes < 0:
        raise ProgramError(f"{where}: workspace_bytes {kernel.workspace_bytes} must be >= 0")
    for i, t in enumerate(kernel.gm):
        if t.__class__ is not GmTensor:
            raise ProgramError(f"{where}: gm[{i}] is {a_type(t)}, expected a GmTensor")
        for name in ("addr", "nbytes"):
            value = getattr(t, name)
            if value.__class__ is not int:
                raise ProgramError(f"{where}: GmTensor {t.name!r}: {name} {value!r} is {a_type(value)}, "
                                   "expected an int")
        if t.addr < 0 or t.nbytes < 1:
            raise ProgramError(f"{where}: GmTensor {t.name!r}: addr {t.addr} must be >= 0 and nbytes {t.nbytes} >= 1")
        if t.addr + t.nbytes > gm_end:
            raise ProgramError(f"{where}: GmTensor {t.name!r} {hex_range(t)} reaches past {gm_end:#x}, the GM "
                               "addresses the simulated device has (its L2 model's tags name)")
    wanted = {"aic": ct in (CoreType.AIC, CoreType.MIX), "aiv": ct in (CoreType.AIV, CoreType.MIX)}
    for side, progs in (("aic", kernel.aic), ("aiv", kernel.aiv)):
        if wanted[side] and not progs:
            raise ProgramError(f"{where}: {ct.value} kernel has no {side} program")
        if not wanted[side] and progs:
            raise ProgramError(f"{where}: {ct.value} kernel has {len(progs)} {side} program(s), expected none")
        if progs and len(progs) not in (1, kernel.block_dim):
            raise ProgramError(
                f"{where}: {len(progs)} {side} programs for block_dim {kernel.block_dim}: "
                f"expected 1 (shared by all blocks) or {kernel.block_dim} (one per block)"
            )
        for i, p in enumerate(progs):
            if not isinstance(p, Program):
                raise ProgramError(f"{where}: {side}[{i}] is a {type(p).__name__}, expected a Program")


def _mem_capacity(hw: HwConfig) -> dict[Mem, int]:
    """Bytes of each local memory, from the config (what-if runs change them)."""
    return {
        Mem.L1: hw.aic.l1_bytes,
        Mem.L0A: hw.aic.l0a_bytes,
        Mem.L0B: hw.aic.l0b_bytes,
        Mem.L0C: hw.aic.l0c_bytes,
        Mem.BT: hw.aic.bt_bytes,
        Mem.FB: hw.aic.fb_bytes,
        Mem.UB: hw.aiv.ub_bytes,
    }


@attrs.frozen
class _Site:
    """One core's view of one program: which program, on which core, for which blocks."""

    core: CoreType  # the physical core: AIC or AIV
    index: int  # position in kernel.aic / kernel.aiv
    sub: int  # the AIV's index in a MIX block (0 otherwise)
    label: str  # "kernel 'k', block 3, AIV sub 1": the head of every error line
    scope: Scope  # ranges of the reserved vars `block` and `sub`


def _sites(kernel: Kernel, hw: HwConfig):
    """Every (program, core, blocks, sub-core) combination to check, each once, with the
    program indices it stands for: a run of consecutive blocks sharing one Program
    object is one site whose `block` ranges over the run."""
    mix = kernel.core_type is CoreType.MIX
    for core, progs in ((CoreType.AIC, kernel.aic), (CoreType.AIV, kernel.aiv)):
        subs = range(hw.chip.aiv_per_aic) if mix and core is CoreType.AIV else range(1)
        index = 0
        while index < len(progs):
            last = index
            while last + 1 < len(progs) and progs[last + 1] is progs[index]:
                last += 1
            if len(progs) == 1:
                where, blocks = "all blocks", (0, kernel.block_dim - 1)
            else:
                where = f"block {index}" if last == index else f"blocks {index}..{last}"
                blocks = (index, last)
            for sub in subs:
                name = f"AIV sub {sub}" if mix and core is CoreType.AIV else core.value
                label = f"kernel {kernel.name!r}, {where}, {name}"
                yield _Site(core, index, sub, label, {"block": blocks, "sub": (sub, sub)}), range(index, last + 1)
            index = last + 1


# ------------------------------------------------------------------ one program


@attrs.define
class _Walk:
    """The state of one walk over one program: its context and what it has counted."""

    kernel: Kernel
    hw: HwConfig
    site: _Site
    buffers: dict[Mem, tuple[Buffer, ...]] = attrs.Factory(dict)  # sorted by address
    passed: set = attrs.Factory(set)  # var-free instructions checked with these buffers on this core
    sets: Counter = attrs.Factory(Counter)  # (src, dst, id) -> SetFlags issued
    waits: Counter = attrs.Factory(Counter)  # (src, dst, id) -> WaitFlags issued
    first_flag: dict = attrs.Factory(dict)  # (src, dst, id) -> (path, instr) of its first use
    cross_sets: Counter = attrs.Factory(Counter)  # id -> CrossSetFlags issued
    cross_waits: Counter = attrs.Factory(Counter)  # id -> CrossWaitFlags issued
    first_cross: dict = attrs.Factory(dict)  # (is_set, id) -> (path, instr) of its first use
    # hw.sync.flag_ids, read on the first flag checked (once: a cached step's config
    # records each read with a Python call)
    flag_ids: int | None = None
    # the accesses whose addresses read `block` or `sub`, in walk order: check_access's
    # arguments but `w`; None: not listed (a walk repeated on another site: _check_again)
    site_checks: list | None = None
    program: Program | None = None  # the program walked (None: a walk repeated on another site)
    # GM addresses are in [0, gm_end) (hw.checks.gm_named_bytes); no stride or address step
    # reaches that far either
    gm_end: int = 0

    def fail(self, msg: str, path: Path | None = None, instr=None):
        """Raise the one-line error: kernel, block, core, instruction, what was expected."""
        at = "" if path is None else f" instr {'.'.join(map(str, path))} {_short(instr)}:"
        raise ProgramError(f"{self.site.label}:{at} {msg}")

    def need_pipe(self, pipe: Pipe, path: Path, instr) -> None:
        """The core this program runs on must have `pipe`."""
        have = CORE_PIPES[self.site.core]
        if pipe not in have:
            core = self.site.core.value
            self.fail(f"pipe {pipe!r} does not exist on {core} (has {names(have)})", path, instr)


def _program(kernel: Kernel, site: _Site) -> Program:
    """The program `site` runs."""
    return (kernel.aic if site.core is CoreType.AIC else kernel.aiv)[site.index]


def _check_program(kernel: Kernel, hw: HwConfig, capacity: dict[Mem, int], site: _Site,
                   passed: dict[tuple, set], first: dict[tuple, _Walk | None], last: dict[CoreType, _Walk]) -> _Walk:
    """Check one program as it runs on `site`; return the walk with its flag counts.
    `passed`: the var-free instructions already checked, by core and buffers; `first`:
    the first walk of each program object met on several sites of a core, None until
    walked; `last`: the last program walked on each core (see the module doc)."""
    program = _program(kernel, site)
    key = (site.core, id(program))
    seen = first.get(key)
    if seen is not None:
        return _check_again(seen, site)
    w = check_like(last[site.core], program, site, _check_instr) if site.core in last else None
    if w is None:
        w = _Walk(kernel, hw, site, passed=passed.setdefault((site.core, program.buffers), set()), site_checks=[],
                  program=program, gm_end=capacity[Mem.GM])
        w.buffers = _check_buffers(w, program.buffers, capacity)
        _walk(w, program.body, (), site.scope, 1)
        _check_flag_balance(w)
    last[site.core] = w
    if key in first:
        first[key] = w
    return w


def _check_again(seen: _Walk, site: _Site) -> _Walk:
    """The walk of `seen`'s program on another site of its core: its checks that read
    `block` or `sub` run again with this site's ranges, the rest is `seen`'s."""
    w = attrs.evolve(seen, site=site, site_checks=None, program=None)
    done: set = set()
    for entry in seen.site_checks:
        check_listed(w, entry, done)
    return w


def _check_buffers(w: _Walk, buffers: tuple[Buffer, ...], capacity: dict[Mem, int]) -> dict[Mem, tuple[Buffer, ...]]:
    """Each buffer is in a memory of its core, aligned, inside its capacity; none overlap.

    Returns the buffers of each memory sorted by address, for the access checks."""
    core = w.site.core
    by_mem: dict[Mem, list[Buffer]] = {}
    for i, b in enumerate(buffers):
        if b.__class__ is not Buffer:
            w.fail(f"buffers[{i}] is {a_type(b)}, expected a Buffer")
        for name, cls in (("mem", Mem), ("addr", int), ("nbytes", int)):
            value = getattr(b, name)
            if value.__class__ is not cls:
                w.fail(f"buffer {b.name!r}: {name} {value!r} is {a_type(value)}, expected a{'n' * (cls is int)} "
                       f"{cls.__name__}")
        if b.mem not in CORE_MEMS[core]:
            w.fail(f"buffer {b.name!r} in {b.mem!r}: {core.value} has no {b.mem!r} (has {names(CORE_MEMS[core])})")
        if b.nbytes < 1 or b.addr < 0:
            w.fail(f"buffer {b.name!r} in {b.mem!r}: addr {b.addr} must be >= 0 and nbytes {b.nbytes} >= 1")
        align = ALIGN_BYTES[b.mem]
        if b.addr % align:
            w.fail(f"buffer {b.name!r} in {b.mem!r}: addr {b.addr:#x} is not {align}-byte aligned")
        end, cap = b.addr + b.nbytes, capacity[b.mem]
        if end > cap:
            w.fail(f"buffer {b.name!r} [{b.addr:#x}, {end:#x}) needs {end} bytes of {b.mem!r} "
                   f"but {core.value} has {cap}")
        by_mem.setdefault(b.mem, []).append(b)
    for mem, bufs in by_mem.items():
        bufs.sort(key=lambda b: b.addr)
        # sorted by address, the first overlap is always between neighbours
        for a, b in itertools.pairwise(bufs):
            if b.addr < a.addr + a.nbytes:
                w.fail(f"buffers {a.name!r} {hex_range(a)} and {b.name!r} {hex_range(b)} overlap in {mem!r}")
    return {mem: tuple(bufs) for mem, bufs in by_mem.items()}


def _walk(w: _Walk, body: tuple, prefix: Path, scope: Scope, mult: int) -> None:
    """Check each instruction of `body`, which runs `mult` times, with vars in `scope`.
    A flag whose (src, dst, id) was met before is only counted, here (_check_flag: it
    passes alike; most of a program's instructions are such flags)."""
    first_flag = w.first_flag
    for i, instr in enumerate(body):
        cls = instr.__class__
        if cls is SetFlag or cls is WaitFlag:
            key = (instr.src, instr.dst, instr.id)
            if key in first_flag:
                (w.sets if cls is SetFlag else w.waits)[key] += mult
                continue
        _check_instr(w, instr, prefix + (i,), scope, mult)


def _check_instr(w: _Walk, instr, path: Path, scope: Scope, mult: int) -> None:
    """Check one instruction (a loop with its body) of a body that runs `mult` times, unless
    it reads no var and passed before (see the module doc)."""
    cls = instr.__class__
    addresses = ADDRESSES.get(cls)
    free = addresses is not None and _ONLY_INTS(map(type, addresses(instr)))
    if free:
        try:
            if instr in w.passed:
                return
        except TypeError:  # a field that cannot be hashed (a list): the field checks below name it
            free = False
    check = _CHECKS.get(cls)
    if check is None:
        kinds = ", ".join(c.__name__ for c in _CHECKS if c is not Loop)
        w.fail(f"not an instruction (expected Loop or one of {kinds})", path, instr)
    _check_fields(w, instr, path)
    check(w, instr, path, scope, mult)
    if free:
        w.passed.add(instr)


def _check_loop(w: _Walk, loop: Loop, path: Path, scope: Scope, mult: int) -> None:
    """count >= 1 and a fresh var; the body runs count times more, with var in [0, count-1]."""
    if loop.count < 1:
        w.fail(f"loop count {loop.count} must be >= 1", path, loop)
    if loop.var in RESERVED_VARS:
        w.fail(f"loop var {loop.var!r} is reserved ({', '.join(RESERVED_VARS)})", path, loop)
    if loop.var in scope:
        w.fail(f"loop var {loop.var!r} shadows an enclosing loop's var", path, loop)
    if len(path) > MAX_LOOP_DEPTH:
        w.fail(f"loops nested {len(path)} deep, more than the {MAX_LOOP_DEPTH} a program may nest", path, loop)
    if mult * loop.count > MAX_BODY_RUNS and _executes(loop.body):
        w.fail(f"its body runs {mult * loop.count:.3g} times (loop trips multiplied), more than the 2^30 "
               "npusim simulates in a program (at about a million instructions a second)", path, loop)
    _walk(w, loop.body, path, {**scope, loop.var: (0, loop.count - 1)}, mult * loop.count)


def _executes(body: tuple) -> bool:
    """Does `body` hold an instruction other than loops (that run nothing but loops)?"""
    return any(item.__class__ is not Loop or _executes(item.body) for item in body)


# ------------------------------------------------------------------ instructions


def _check_copy(w: _Walk, c: Copy, path: Path, scope: Scope, mult: int) -> None:
    """A copy path that exists, on a pipe of this core, both ends inside declared memory."""
    if c.nbytes < 1 or c.segments < 1:
        w.fail(f"nbytes {c.nbytes} and segments {c.segments} must be >= 1", path, c)
    pipe = COPY_PIPE.get((c.src, c.dst))
    if pipe is None:
        w.fail(f"no copy path {c.src!r} -> {c.dst!r} (not in COPY_PIPE)", path, c)
    w.need_pipe(pipe, path, c)
    if c.convert and parse_convert(c.convert) is None:
        w.fail(f"convert {c.convert!r} is not a conversion of isa.instructions.CONVERSIONS ('' or one of "
               f"{', '.join(k for k in CONVERSIONS if k)}, optionally with '@R' or ':R', R >= 1)", path, c)
    check_access(w, c, path, scope, "src", c.src, c.src_addr, c.nbytes, c.segments, c.src_stride)
    check_access(w, c, path, scope, "dst", c.dst, c.dst_addr, c.nbytes, c.segments, c.dst_stride)


def _check_mmad(w: _Walk, mm: Mmad, path: Path, scope: Scope, mult: int) -> None:
    """A cube dtype the config has fractals for; A, B, C inside L0A, L0B, L0C buffers."""
    if min(mm.m, mm.n, mm.k) < 1:
        w.fail(f"m {mm.m}, n {mm.n}, k {mm.k} must all be >= 1", path, mm)
    w.need_pipe(Pipe.M, path, mm)
    fractals = w.hw.aic.mmad_fractals
    if mm.dtype not in fractals or mm.dtype not in DTYPE_BYTES:
        w.fail(f"Mmad dtype {mm.dtype!r} has no cube fractal (have {', '.join(fractals)})", path, mm)
    elem = DTYPE_BYTES[mm.dtype]
    if mm.accumulate.__class__ is Affine:
        check_index(w, mm, path, scope, "accumulate", mm.accumulate)
    check_access(w, mm, path, scope, "A", Mem.L0A, mm.a_addr, mm.m * mm.k * elem)
    check_access(w, mm, path, scope, "B", Mem.L0B, mm.b_addr, mm.k * mm.n * elem)
    check_access(w, mm, path, scope, "C", Mem.L0C, mm.c_addr, mm.m * mm.n * DTYPE_BYTES[ACC_DTYPE])


def _check_vec(w: _Walk, v: VecOp, path: Path, scope: Scope, mult: int) -> None:
    """A vector op and dtypes the config knows; dst and every src inside UB buffers."""
    if v.n < 1 or (v.out_n is not None and v.out_n < 1):
        w.fail(f"n {v.n} and out_n {v.out_n} must be >= 1", path, v)
    if v.flops_per_elem < 0:
        w.fail(f"flops_per_elem {v.flops_per_elem} must be >= 0", path, v)
    w.need_pipe(Pipe.V, path, v)
    ops = w.hw.aiv.vector_cycles_per_repeat
    if v.op not in ops:
        w.fail(f"vector op {v.op!r} has no cost in the config (have {', '.join(ops)})", path, v)
    for dt in (v.dtype, v.out_dtype):
        if dt is not None and dt not in DTYPE_BYTES:
            w.fail(f"dtype {dt!r} is not one of {', '.join(DTYPE_BYTES)}", path, v)
    if v.pitches:
        _check_pitches(w, v, path)
    dst_bytes, src_bytes = vec_spans(v)  # (a strided instruction: to its farthest element)
    check_access(w, v, path, scope, "dst", Mem.UB, v.dst, dst_bytes)
    for i, src in enumerate(v.srcs):
        check_access(w, v, path, scope, f"src {i}", Mem.UB, src, src_bytes[i])
    if v.scalar_src is not None:  # the fp32 value the scalar unit reads back
        check_access(w, v, path, scope, "scalar_src", Mem.UB, v.scalar_src, 4, align=4)
    if v.scalar.__class__ is Affine:
        check_index(w, v, path, scope, "scalar", v.scalar)


def _check_pitches(w: _Walk, v: VecOp, path: Path) -> None:
    """Each level of VecOp.pitches a tuple of ints: a count >= 1, then a pitch >= 0 per operand
    it places (dst, then each src); n whole runs of the levels' counts."""
    runs = 1
    for level in v.pitches:
        if level.__class__ is not tuple or len(level) < 2 or any(x.__class__ is not int for x in level):
            w.fail(f"pitches level {level!r}: expected a tuple of ints (count, dst pitch, a pitch per source)",
                   path, v)
        if level[0] < 1 or min(level[1:]) < 0:
            w.fail(f"pitches level {level!r}: the count must be >= 1 and each pitch >= 0", path, v)
        runs *= level[0]
    if v.n % runs:
        w.fail(f"n {v.n} is not whole runs of the pitches' {runs} (the product of their counts)", path, v)


def _check_scalar(w: _Walk, s: Scalar, path: Path, scope: Scope, mult: int) -> None:
    """Cycles from 0 to STEP_CYCLES_MAX (not NaN) on the S pipe."""
    if not 0 <= s.cycles <= STEP_CYCLES_MAX:
        w.fail(f"cycles {s.cycles} must be >= 0 and at most 2^40 (hw.checks.STEP_CYCLES_MAX: the longest one "
               "step of a kernel may take)", path, s)
    w.need_pipe(Pipe.S, path, s)


def _check_flag(w: _Walk, f: SetFlag | WaitFlag, path: Path, scope: Scope, mult: int) -> None:
    """Two different pipes of this core, an id in range; counted for the balance check.
    Checked at the first use of its (src, dst, id) in the program: a later use of the
    same three passes or fails alike (a program uses each flag hundreds of times)."""
    key = (f.src, f.dst, f.id)
    if key not in w.first_flag:
        if f.src is f.dst:
            w.fail(f"src and dst are both {f.src!r}: a flag orders two different pipes", path, f)
        w.need_pipe(f.src, path, f)
        w.need_pipe(f.dst, path, f)
        _check_flag_id(w, f.id, path, f)
        w.first_flag[key] = (path, f)
    (w.sets if f.__class__ is SetFlag else w.waits)[key] += mult


def _check_barrier(w: _Walk, b: PipeBarrier, path: Path, scope: Scope, mult: int) -> None:
    """PIPE_ALL, or a pipe of this core."""
    if b.pipe is not None:
        w.need_pipe(b.pipe, path, b)


def _check_sync_all(w: _Walk, s: SyncAll, path: Path, scope: Scope, mult: int) -> None:
    """Every block must be resident at once, or the first wave waits for the second forever."""
    k, chip = w.kernel, w.hw.chip
    if k.core_type is CoreType.AIV:
        resident, kind = w.hw.aiv_count, "AIV"
    else:  # an AIC or MIX block holds one cube core
        resident, kind = chip.aic_count, "AIC"
    if k.block_dim > resident:
        w.fail(f"SyncAll with block_dim {k.block_dim} > {resident} {kind} cores resident at once: "
               "would deadlock", path, s)


def _check_cross(w: _Walk, f: CrossSetFlag | CrossWaitFlag, path: Path, scope: Scope, mult: int) -> None:
    """Only in MIX kernels, on a pipe of this core, an id in range; counted for the balance check."""
    ct = w.kernel.core_type
    if ct is not CoreType.MIX:
        w.fail(f"cross-core flag in a {ct.value} kernel: only MIX kernels pair an AIC with AIVs", path, f)
    w.need_pipe(f.pipe, path, f)
    _check_flag_id(w, f.id, path, f)
    is_set = f.__class__ is CrossSetFlag
    (w.cross_sets if is_set else w.cross_waits)[f.id] += mult
    w.first_cross.setdefault((is_set, f.id), (path, f))


def _check_flag_id(w: _Walk, flag_id: int, path: Path, instr) -> None:
    """Flag ids are 0 .. hw.sync.flag_ids-1."""
    n = w.flag_ids
    if n is None:
        n = w.flag_ids = w.hw.sync.flag_ids
    if not 0 <= flag_id < n:
        w.fail(f"flag id {flag_id} outside [0, {n})", path, instr)


_CHECKS: dict[type, Callable] = {
    Loop: _check_loop,
    Copy: _check_copy,
    Mmad: _check_mmad,
    VecOp: _check_vec,
    Scalar: _check_scalar,
    SetFlag: _check_flag,
    WaitFlag: _check_flag,
    PipeBarrier: _check_barrier,
    SyncAll: _check_sync_all,
    CrossSetFlag: _check_cross,
    CrossWaitFlag: _check_cross,
}


# The fields of each instruction whose type the checks rely on: (name, the classes it may
# be, what the error says is expected). A count, size, id or stride is an int: not a bool
# (True is 1 to Python, never a size), not a float (the engine indexes with it), not a numpy
# int (the engine takes Python ints); addresses are checked where they are read
# (verify_addresses._span). Checked with the instruction, so once per instruction object
# met (an instruction equal to one that passed is not checked again: see the module doc).
_NONE = type(None)
_INT, _COUNT = ({int}, "an int"), ({int, _NONE}, "an int or None")
def _fields(fields: tuple) -> tuple:
    """(a getter of the fields' values as a tuple, (name, allowed classes, expected) per field,
    the type tuples that passed)."""
    names = [name for name, _ in fields]
    get = (lambda r: ()) if not names else (lambda r, n=names[0]: (getattr(r, n),)) if len(names) == 1 else (
        operator.attrgetter(*names))
    return get, tuple((name, frozenset(types), expected) for name, (types, expected) in fields), set()


_FIELDS: dict[type, tuple] = {
    cls: _fields(fields)
    for cls, fields in {
        Loop: (("var", ({str}, "a str")), ("count", _INT)),
        Copy: (("src", ({Mem}, "a Mem")), ("dst", ({Mem}, "a Mem")), ("nbytes", _INT), ("segments", _INT),
               ("src_stride", _COUNT), ("dst_stride", _COUNT), ("convert", ({str}, "a str"))),
        Mmad: (("m", _INT), ("n", _INT), ("k", _INT), ("dtype", ({str}, "a str")),
               ("accumulate", ({bool, int, Affine}, "a bool, an int or an Affine"))),
        VecOp: (("op", ({str}, "a str")), ("n", _INT), ("dtype", ({str}, "a str")),
                ("srcs", ({tuple}, "a tuple of addresses")), ("out_dtype", ({str, _NONE}, "a str or None")),
                ("out_n", _COUNT), ("flops_per_elem", _INT),
                ("scalar", ({int, float, Affine, _NONE}, "a number, an Affine or None")),
                ("scalar_src", ({int, Affine, _NONE}, "an int, an Affine or None")),
                ("pitches", ({tuple}, "a tuple of levels"))),
        Scalar: (("cycles", ({int, float}, "a number of cycles")),),
        SetFlag: (("src", ({Pipe}, "a Pipe")), ("dst", ({Pipe}, "a Pipe")), ("id", _INT)),
        WaitFlag: (("src", ({Pipe}, "a Pipe")), ("dst", ({Pipe}, "a Pipe")), ("id", _INT)),
        PipeBarrier: (("pipe", ({Pipe, _NONE}, "a Pipe or None (PIPE_ALL)")),),
        SyncAll: (),
        CrossSetFlag: (("pipe", ({Pipe}, "a Pipe")), ("id", _INT)),
        CrossWaitFlag: (("pipe", ({Pipe}, "a Pipe")), ("id", _INT)),
    }.items()
}


def _check_fields(w: _Walk, instr, path: Path) -> None:
    """Each field of _FIELDS[its class] is of a type it may be. The types of an instruction's
    fields that passed are kept (a handful per class), so most instructions are one lookup."""
    cls = instr.__class__
    get, fields, passed = _FIELDS[cls]
    types = tuple(map(type, get(instr)))
    if types in passed:
        return
    for (name, allowed, expected), t in zip(fields, types):
        if t not in allowed:
            value = getattr(instr, name)
            w.fail(f"{name} {value!r} is {a_type(value)}, expected {expected}", path, instr)
    passed.add(types)


# Of the types of an instruction's addresses (verify_addresses.ADDRESSES): every one a plain
# int (no Affine, no bool), so it reads no var (see the module doc)
_ONLY_INTS = {int}.issuperset


# ------------------------------------------------------------------ flag balance


def _check_flag_balance(w: _Walk) -> None:
    """Per (src, dst, id), sets x trips == waits x trips, or some wait never returns
    (or a flag is left set for the next kernel)."""
    for key, (path, instr) in w.first_flag.items():
        sets, waits = w.sets[key], w.waits[key]
        if sets != waits:
            src, dst, flag_id = key
            w.fail(f"flag {src!r}->{dst!r} id {flag_id} cannot balance: {sets} sets vs {waits} waits "
                   "(loop trips counted)", path, instr)


def _check_cross_balance(kernel: Kernel, hw: HwConfig, walks: dict) -> None:
    """In each MIX block, AIC sets of an id == each AIV's waits of it and each AIV's sets ==
    AIC waits (an AIC set reaches every AIV; an AIC wait needs every AIV's set)."""
    shared = len(kernel.aic) == 1 and len(kernel.aiv) == 1
    for b in range(1 if shared else kernel.block_dim):
        block = "" if shared else f" in block {b}"
        cube = walks[(CoreType.AIC, 0 if len(kernel.aic) == 1 else b, 0)]
        for sub in range(hw.chip.aiv_per_aic):
            vec = walks[(CoreType.AIV, 0 if len(kernel.aiv) == 1 else b, sub)]
            _check_cross_direction(cube, vec, "AIC", f"AIV sub {sub}", block)
            _check_cross_direction(vec, cube, f"AIV sub {sub}", "AIC", block)


def _check_cross_direction(sender: _Walk, receiver: _Walk, src: str, dst: str, block: str) -> None:
    """Per id, the cross sets `sender` issues == the cross waits `receiver` issues.

    The error names the first instruction involved: the sender's set, else the receiver's wait."""
    for flag_id in sorted(set(sender.cross_sets) | set(receiver.cross_waits)):
        sets, waits = sender.cross_sets[flag_id], receiver.cross_waits[flag_id]
        if sets != waits:
            at, site = sender, sender.first_cross.get((True, flag_id))
            if site is None:
                at, site = receiver, receiver.first_cross[(False, flag_id)]
            at.fail(f"cross flag id {flag_id} {src} -> {dst}{block} cannot balance: "
                    f"{src} sets {sets} vs {dst} waits {waits} (loop trips counted)", *site)


# ------------------------------------------------------------------ formatting


def _short(instr) -> str:
    """A one-line repr: a Loop without its body; other records with non-default fields only."""
    if instr.__class__ is Loop:
        return f"Loop({instr.var!r}, count={instr.count})"
    if not attrs.has(instr.__class__):
        return repr(instr)
    fields = attrs.fields(instr.__class__)
    shown = [f"{f.name}={getattr(instr, f.name)!r}" for f in fields if getattr(instr, f.name) != f.default]
    return f"{instr.__class__.__name__}({', '.join(shown)})"
