"""The walk of one program on one site, and the checks of each instruction it meets
(npusim/isa/verify.py runs it for each program of a kernel, and checks what spans
programs: the kernel's shape, buffers, flag balance).

Loops are walked once, never unrolled: each loop var is carried as its range
[0, count-1] and each instruction as a multiplicity (the product of the counts of
its enclosing loops). An Affine address is linear, so its extremes sit at the
corners of those ranges (verify_addresses.py). Per instruction: its fields of the
types the engine takes (_FIELDS), its pipe on the core, its operands inside the
declared buffers, its dtypes and ops known to the config, its flag ids in range; a
loop's count and var, its nesting (MAX_LOOP_DEPTH) and how often its body runs
(MAX_BODY_RUNS). SetFlag/WaitFlag counts are kept on the walk for verify's balance
check.

An instruction whose addresses are all plain ints reads no var, so its check
depends only on itself, its core and its program's buffers: one that passed is not
checked again on a core of that kind with those buffers (the per-block programs of
a kernel repeat most of their local instructions). A failing one is met first
where it would be met anyway, so the error is the same line.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable

import attrs

from npusim.errors import ProgramError
from npusim.hw.checks import STEP_CYCLES_MAX
from npusim.hw.config import HwConfig
from npusim.isa.instructions import CONVERSIONS, parse_convert, vec_spans
from npusim.isa.program import (
    CORE_PIPES, COPY_PIPE, DTYPE_BYTES, RESERVED_VARS, Affine, Buffer, Copy, CoreType, CrossSetFlag, CrossWaitFlag,
    Kernel, Loop, Mem, Mmad, Pipe, PipeBarrier, Program, Scalar, SetFlag, SyncAll, VecOp, WaitFlag,
)
from npusim.isa.verify_addresses import a_type, check_access, check_index, names
from npusim.isa.walk import executes


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

Scope = dict[str, tuple[int, int]]  # var -> (lowest, highest) value in this part of the walk
Path = tuple[int, ...]  # index path of an instruction in the body: (3, 1) is body[3].body[1]


@attrs.frozen
class Site:
    """One core's view of one program: which program, on which core, for which blocks."""

    core: CoreType  # the physical core: AIC or AIV
    index: int  # position in kernel.aic / kernel.aiv
    sub: int  # the AIV's index in a MIX block (0 otherwise)
    label: str  # "kernel 'k', block 3, AIV sub 1": the head of every error line
    scope: Scope  # ranges of the reserved vars `block` and `sub`


@attrs.define
class Walk:
    """The state of one walk over one program: its context and what it has counted."""

    kernel: Kernel
    hw: HwConfig
    site: Site
    buffers: dict[Mem, tuple[Buffer, ...]] = attrs.Factory(dict)  # sorted by address
    # the var-free instructions checked with these buffers on this core: (their fields'
    # types, their fields' values)
    passed: set = attrs.Factory(set)
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
    # arguments but `w`; None: not listed (a walk repeated on another site: verify's _check_again)
    site_checks: list | None = None
    program: Program | None = None  # the program walked (None: a walk repeated on another site)
    # GM addresses are in [0, gm_end) (hw.checks.gm_named_bytes); no stride or address step
    # reaches that far either
    gm_end: int = 0

    def fail(self, msg: str, path: Path | None = None, instr=None):
        """Raise the one-line error: kernel, block, core, instruction, what was expected."""
        at = "" if path is None else f" instr {'.'.join(map(str, path))} {short(instr)}:"
        raise ProgramError(f"{self.site.label}:{at} {msg}")

    def need_pipe(self, pipe: Pipe, path: Path, instr) -> None:
        """The core this program runs on must have `pipe`."""
        have = CORE_PIPES[self.site.core]
        if pipe not in have:
            core = self.site.core.value
            self.fail(f"pipe {pipe!r} does not exist on {core} (has {names(have)})", path, instr)


def walk_body(w: Walk, body: tuple, prefix: Path, scope: Scope, mult: int) -> None:
    """Check each instruction of `body`, which runs `mult` times, with vars in `scope`.
    A flag whose (src, dst, id) was met before is only counted, here (_check_flag: it
    passes alike; most of a program's instructions are such flags) - if its id is an int:
    1.0 or True equal 1 but are no flag id (check_instr names them)."""
    first_flag = w.first_flag
    for i, instr in enumerate(body):
        cls = instr.__class__
        if cls is SetFlag or cls is WaitFlag:
            key = (instr.src, instr.dst, instr.id)
            if key in first_flag and key[2].__class__ is int:
                (w.sets if cls is SetFlag else w.waits)[key] += mult
                continue
        check_instr(w, instr, prefix + (i,), scope, mult)


def check_instr(w: Walk, instr, path: Path, scope: Scope, mult: int) -> None:
    """Check one instruction (a loop with its body) of a body that runs `mult` times, unless
    it reads no var and one of the same values, of the same types, passed before (see the
    module doc)."""
    cls = instr.__class__
    kind = _KINDS.get(cls)
    if kind is None:
        kinds = ", ".join(c.__name__ for c in _CHECKS if c is not Loop)
        w.fail(f"not an instruction (expected Loop or one of {kinds})", path, instr)
    values = kind.values(instr)
    types = tuple(map(type, values))
    free = kind.seen.get(types)
    if free is None:
        free = _check_fields(w, instr, path, kind, types)
    if free and (cls is not VecOp or _vec_var_free(instr)):
        # its fields' values and types (a Python tuple's hash and ==, not the record's):
        # Copy(nbytes=64.0) equals Copy(nbytes=64) but is no instruction that passed
        key = (types, values)
        if key in w.passed:
            return
        kind.check(w, instr, path, scope, mult)
        w.passed.add(key)
    else:
        kind.check(w, instr, path, scope, mult)


def _check_loop(w: Walk, loop: Loop, path: Path, scope: Scope, mult: int) -> None:
    """count >= 1 and a fresh var; the body runs count times more, with var in [0, count-1]."""
    if loop.count < 1:
        w.fail(f"loop count {loop.count} must be >= 1", path, loop)
    if loop.var in RESERVED_VARS:
        w.fail(f"loop var {loop.var!r} is reserved ({', '.join(RESERVED_VARS)})", path, loop)
    if loop.var in scope:
        w.fail(f"loop var {loop.var!r} shadows an enclosing loop's var", path, loop)
    if len(path) > MAX_LOOP_DEPTH:
        w.fail(f"loops nested {len(path)} deep, more than the {MAX_LOOP_DEPTH} a program may nest", path, loop)
    if mult * loop.count > MAX_BODY_RUNS and executes(loop.body):
        w.fail(f"its body runs {mult * loop.count:.3g} times (loop trips multiplied), more than the 2^30 "
               "npusim simulates in a program (at about a million instructions a second)", path, loop)
    walk_body(w, loop.body, path, {**scope, loop.var: (0, loop.count - 1)}, mult * loop.count)


# ------------------------------------------------------------------ instructions


def _check_copy(w: Walk, c: Copy, path: Path, scope: Scope, mult: int) -> None:
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


def _check_mmad(w: Walk, mm: Mmad, path: Path, scope: Scope, mult: int) -> None:
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


def _check_vec(w: Walk, v: VecOp, path: Path, scope: Scope, mult: int) -> None:
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


def _check_pitches(w: Walk, v: VecOp, path: Path) -> None:
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


def _check_scalar(w: Walk, s: Scalar, path: Path, scope: Scope, mult: int) -> None:
    """Cycles from 0 to STEP_CYCLES_MAX (not NaN) on the S pipe."""
    if not 0 <= s.cycles <= STEP_CYCLES_MAX:
        w.fail(f"cycles {s.cycles} must be >= 0 and at most 2^40 (hw.checks.STEP_CYCLES_MAX: the longest one "
               "step of a kernel may take)", path, s)
    w.need_pipe(Pipe.S, path, s)


def _check_flag(w: Walk, f: SetFlag | WaitFlag, path: Path, scope: Scope, mult: int) -> None:
    """Two different pipes of this core, an id in range; counted for the balance check.
    Checked at the first use of its (src, dst, id) in the program: a later use of the
    same three (its fields' types checked) passes or fails alike (a program uses each
    flag hundreds of times)."""
    key = (f.src, f.dst, f.id)
    if key not in w.first_flag:
        if f.src is f.dst:
            w.fail(f"src and dst are both {f.src!r}: a flag orders two different pipes", path, f)
        w.need_pipe(f.src, path, f)
        w.need_pipe(f.dst, path, f)
        _check_flag_id(w, f.id, path, f)
        w.first_flag[key] = (path, f)
    (w.sets if f.__class__ is SetFlag else w.waits)[key] += mult


def _check_barrier(w: Walk, b: PipeBarrier, path: Path, scope: Scope, mult: int) -> None:
    """PIPE_ALL, or a pipe of this core."""
    if b.pipe is not None:
        w.need_pipe(b.pipe, path, b)


def _check_sync_all(w: Walk, s: SyncAll, path: Path, scope: Scope, mult: int) -> None:
    """Every block must be resident at once, or the first wave waits for the second forever."""
    k, chip = w.kernel, w.hw.chip
    if k.core_type is CoreType.AIV:
        resident, kind = w.hw.aiv_count, "AIV"
    else:  # an AIC or MIX block holds one cube core
        resident, kind = chip.aic_count, "AIC"
    if k.block_dim > resident:
        w.fail(f"SyncAll with block_dim {k.block_dim} > {resident} {kind} cores resident at once: "
               "would deadlock", path, s)


def _check_cross(w: Walk, f: CrossSetFlag | CrossWaitFlag, path: Path, scope: Scope, mult: int) -> None:
    """Only in MIX kernels, on a pipe of this core, an id in range; counted for the balance check."""
    ct = w.kernel.core_type
    if ct is not CoreType.MIX:
        w.fail(f"cross-core flag in a {ct.value} kernel: only MIX kernels pair an AIC with AIVs", path, f)
    w.need_pipe(f.pipe, path, f)
    _check_flag_id(w, f.id, path, f)
    is_set = f.__class__ is CrossSetFlag
    (w.cross_sets if is_set else w.cross_waits)[f.id] += mult
    w.first_cross.setdefault((is_set, f.id), (path, f))


def _check_flag_id(w: Walk, flag_id: int, path: Path, instr) -> None:
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
# (verify_addresses._span).
_NONE = type(None)
_INT, _COUNT = ({int}, "an int"), ({int, _NONE}, "an int or None")
_FIELDS: dict[type, tuple] = {
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
}
# The instructions with addresses, and of each address field (VecOp.srcs aside: a tuple of
# them) the types that read no var: an instruction whose addresses are all of these reads
# none, so its check depends on itself, its core and its buffers only (see the module doc)
ADDRESS_FIELDS: dict[type, tuple] = {
    Copy: (("src_addr", {int}), ("dst_addr", {int})),
    Mmad: (("a_addr", {int}), ("b_addr", {int}), ("c_addr", {int}), ("accumulate", {bool, int})),
    VecOp: (("dst", {int}), ("scalar", {int, float, _NONE}), ("scalar_src", {int, _NONE})),
}


@attrs.frozen
class _Kind:
    """What check_instr needs of one instruction class, built once from _FIELDS, ADDRESS_FIELDS
    and _CHECKS."""

    check: Callable  # _CHECKS[cls]
    values: Callable  # instr -> the tuple of all its fields' values, in attrs order
    fields: tuple  # (index in values, name, allowed classes, what is expected) per _FIELDS entry
    var_free: tuple  # (index in values, the classes that read no var) per ADDRESS_FIELDS entry
    # the tuples of field types met that passed the field checks -> whether they read no var
    # (a handful per class, so most instructions are one lookup)
    seen: dict = attrs.Factory(dict)


def _kind(cls: type) -> _Kind:
    names = [f.name for f in attrs.fields(cls)]
    values = (lambda r: ()) if not names else (lambda r, n=names[0]: (getattr(r, n),)) if len(names) == 1 else (
        operator.attrgetter(*names))
    fields = tuple((names.index(name), name, frozenset(types), expected) for name, (types, expected) in _FIELDS[cls])
    var_free = tuple((names.index(name), frozenset(types)) for name, types in ADDRESS_FIELDS.get(cls, ()))
    return _Kind(_CHECKS[cls], values, fields, var_free)


_KINDS: dict[type, _Kind] = {cls: _kind(cls) for cls in _CHECKS}


def _check_fields(w: Walk, instr, path: Path, kind: _Kind, types: tuple) -> bool:
    """Each field of _FIELDS[its class] is of a type it may be (`types`: the types of all its
    fields); whether its addresses read no var, as far as its fields' types tell."""
    for i, name, allowed, expected in kind.fields:
        if types[i] not in allowed:
            value = getattr(instr, name)
            w.fail(f"{name} {value!r} is {a_type(value)}, expected {expected}", path, instr)
    free = bool(kind.var_free) and all(types[i] in classes for i, classes in kind.var_free)
    kind.seen[types] = free
    return free


def _vec_var_free(v: VecOp) -> bool:
    """Of a VecOp whose other fields read no var: every src a plain int, and every pitches
    level a tuple of ints (its value is then its meaning: 64.0 is not taken for 64)."""
    return _ONLY_INTS(map(type, v.srcs)) and all(
        level.__class__ is tuple and _ONLY_INTS(map(type, level)) for level in v.pitches)


_ONLY_INTS = {int}.issuperset


# ------------------------------------------------------------------ formatting


def short(instr) -> str:
    """A one-line repr: a Loop without its body; other records with non-default fields only."""
    if instr.__class__ is Loop:
        return f"Loop({instr.var!r}, count={instr.count})"
    if not attrs.has(instr.__class__):
        return repr(instr)
    fields = attrs.fields(instr.__class__)
    shown = [f"{f.name}={getattr(instr, f.name)!r}" for f in fields if getattr(instr, f.name) != f.default]
    return f"{instr.__class__.__name__}({', '.join(shown)})"


__all__ = ["MAX_BODY_RUNS", "MAX_LOOP_DEPTH", "Path", "Scope", "Site", "Walk", "check_instr", "short",
           "walk_body"]
