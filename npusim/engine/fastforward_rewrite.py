"""Reading and rewriting a kernel's programs for the fast-forward (engine.fastforward prices a
kernel from runs of these rewritten kernels; engine.fastforward_blocks shares the walkers):
which loop of a block program repeats, what a wave of it moves and executes, the kernel cut
short.

- A kernel's *repeat loop* (repeat_path, repeat_loops): in every block program, the loop that
  executes the most instructions (count x its body's) among the top-level loops and the loops
  they wrap alone (a Loop whose body is one Loop), the first on ties: a GEMM's loop over rows
  of tiles, not a partial row's loop over tiles. Every program must have one, all with the
  same loop variable (the same loop of the lowering in every block); a MIX kernel's AIC and
  AIV programs of a block must have the same (variable, count) (their cross-core flags pair
  up per iteration). Each iteration of every block together is a *wave*.
- A *truncated* kernel (truncated): every block's repeat loop cut by the same number of
  iterations. It has the whole head and tail of the kernel: the nests before and after the
  loop, the uneven last wave, the drain. A marked run's truncation also renames the loop's
  variable (fastforward.FF_MARKED), in its body's addresses too, so that no other loop's
  ends are taken for the waves' ends; blocks that shared a program share its truncation.
- readdressed: the one walker that rewrites every Affine address of a program (the renaming
  above; fastforward_blocks' rebasing of renumbered blocks), over the fields record_fields
  says may hold one (the table fastforward_blocks.alike reads the address fields from too).
- What the measurement reads from the programs: the GM bytes a wave moves (wave_gm_bytes, a
  bound on the new L2 lines it brings in), the instructions a kernel executes
  (static_instructions), the cores a wave of blocks fills (cores_of).
- What both fast-forward paths share: a kernel's core types (kinds) and programs of one
  type (programs), and ByKernel, a cache of values by kernel identity.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import attrs

from npusim.engine.compile import count_instructions
from npusim.isa.program import Affine, CoreType, Copy, Kernel, Loop, Mem

T = TypeVar("T")


def kinds(kernel: Kernel) -> list[CoreType]:
    """The core types a kernel's blocks run on: a MIX block's AIC and AIV programs, else its own type's."""
    return [CoreType.AIC, CoreType.AIV] if kernel.core_type is CoreType.MIX else [kernel.core_type]


def cores_of(kernel: Kernel, hw) -> int:
    """The cores one wave of the kernel's blocks fills: AIV cores for an AIV kernel, else
    AIC cores (a MIX block holds an AIC and its AIVs)."""
    return hw.aiv_count if kernel.core_type is CoreType.AIV else hw.chip.aic_count


class ByKernel:
    """Values computed from kernels, by identity, for the last `most` kernels a value was
    computed for, the oldest dropped first (a step asks once per launch, and walking a
    FlashAttention kernel's 500 unrolled programs takes a fraction of a second); entries
    hold their kernel, so an id stays its own."""

    def __init__(self, most: int = 256) -> None:
        self.most = most
        self.entries: dict[int, tuple[Kernel, object]] = {}

    def get(self, kernel: Kernel, compute: Callable[[Kernel], T]) -> T:
        """compute(kernel), computed once while the kernel's entry is kept."""
        hit = self.entries.get(id(kernel))
        if hit is not None and hit[0] is kernel:
            return hit[1]
        value = compute(kernel)
        self.entries[id(kernel)] = (kernel, value)
        if len(self.entries) > self.most:
            self.entries.pop(next(iter(self.entries)))
        return value


# ---------------------------------------------------------------- the repeat loop


def repeat_path(body: tuple) -> tuple[tuple[int, ...], Loop] | None:
    """(index path, loop) of a program body's repeat loop (see the module doc), or None."""
    best, most = None, 0
    for i, entry in enumerate(body):
        path, loop = (i,), entry
        while loop.__class__ is Loop:
            work = loop.count * count_instructions(loop.body)
            if loop.count > 1 and work > most:  # (a loop of one iteration wraps what repeats)
                best, most = (path, loop), work
            if len(loop.body) != 1:
                break
            path, loop = path + (0,), loop.body[0]
    return best


def programs(kernel: Kernel, kind: CoreType) -> tuple:
    """The kernel's tuple of programs of one core type (one for every block, or one per block)."""
    return kernel.aic if kind is CoreType.AIC else kernel.aiv


def repeat_loops(kernel: Kernel, min_count: int = 0) -> dict | None:
    """Per core type, per distinct program (by position in the kernel's tuple): (path,
    loop) of its repeat loop; None if a program has none or one of fewer than `min_count`
    iterations (nothing worth skipping), they are not the same loop variable, or a MIX
    block's two disagree."""
    out = {}
    for kind in kinds(kernel):
        found = []
        for p in programs(kernel, kind):
            f = repeat_path(p.body)
            if f is None or f[1].count < min_count or (found and f[1].var != found[0][1].var):
                return None
            found.append(f)
        if not found:
            return None
        out[kind] = found
    if kernel.core_type is CoreType.MIX:
        for b in range(kernel.block_dim):
            a = out[CoreType.AIC][0 if len(kernel.aic) == 1 else b][1]
            v = out[CoreType.AIV][0 if len(kernel.aiv) == 1 else b][1]
            if (a.var, a.count) != (v.var, v.count):
                return None
    return out


# ---------------------------------------------------------------- what the programs move and execute


def gm_bytes(body: tuple) -> int:
    """GM bytes the copies of a program body move, loops multiplied out."""
    n = 0
    for item in body:
        if item.__class__ is Loop:
            n += item.count * gm_bytes(item.body)
        elif item.__class__ is Copy and Mem.GM in (item.src, item.dst):
            n += item.nbytes * item.segments
    return n


def wave_gm_bytes(kernel: Kernel) -> int:
    """GM bytes one wave moves (one iteration of every block's repeat loop): an upper bound
    of the new lines it brings into the L2. (A MIX block's AIV program is counted once,
    not once per AIV: a smaller bound, so a MIX kernel may be simulated in full where
    it need not be, never the other way.)"""
    total = 0
    for kind, found in repeat_loops(kernel).items():
        per = [gm_bytes(loop.body) for _, loop in found]
        shared = len(programs(kernel, kind)) == 1  # one program for every block
        total += sum(per[0 if shared else b] for b in range(kernel.block_dim))
    return total


def static_instructions(kernel: Kernel, aivs: int) -> int:
    """The instructions a kernel executes, as the device counts them: each block's programs,
    a MIX block's AIV program once per AIV (`aivs` of them)."""
    n = 0
    counted: dict[int, int] = {}  # id(program) -> its instructions (blocks share programs)
    for kind in kinds(kernel):
        per = aivs if kind is CoreType.AIV and kernel.core_type is CoreType.MIX else 1
        for b in range(kernel.block_dim):
            program = kernel.program(kind, b)
            if id(program) not in counted:
                counted[id(program)] = count_instructions(program.body)
            n += per * counted[id(program)]
    return n


# ---------------------------------------------------------------- rewriting


def readdressed(value, move: Callable[[Affine], Affine], memo: dict | None = None):
    """`value` (a Program, an instruction, a body, a field's value) with move(a) in place of
    every Affine address a in it: generic over every attrs record's fields that may hold one
    (record_fields(cls).walked) and tuples (Loop bodies included). Unchanged parts are the
    same objects; `memo`: results by identity of what was readdressed (programs that share
    parts share their results)."""
    cls = value.__class__
    if cls is Affine:
        return move(value)
    if cls is tuple:
        new = tuple([readdressed(v, move, memo) for v in value])
        return value if all(a is b for a, b in zip(new, value)) else new
    if not attrs.has(cls):
        return value
    fields = record_fields(cls).walked
    if not fields:  # a flag, a barrier: nothing to move
        return value
    if memo is None:
        memo = {}
    hit = memo.get(id(value))
    if hit is None or hit[0] is not value:
        changes = {}
        for name in fields:
            old = getattr(value, name)
            new = readdressed(old, move, memo)
            if new is not old:
                changes[name] = new
        hit = memo[id(value)] = (value, attrs.evolve(value, **changes) if changes else value)
    return hit[1]


# Field types that never hold an Affine (plain values, buffers, tensors, a VecOp's pitches):
# readdressed skips such fields; a field of any other type is walked.
_PLAIN_TYPES = frozenset({"int", "str", "bool", "float", "Mem", "Pipe", "CoreType", "int | None", "str | None",
                          "Pipe | None", "tuple[Buffer, ...]", "tuple[GmTensor, ...]", "tuple[tuple[int, ...], ...]"})


@attrs.frozen
class RecordFields:
    """The fields of an attrs class as the walkers over ISA records read them, from their types
    (record_fields): readdressed walks those that may hold an Affine, fastforward_blocks.alike
    compares every field and lets those that hold addresses differ. Every address field may
    hold an Affine; so may fields that hold one inside something else (a Loop's or Program's
    body, a Kernel's programs) and VecOp.scalar (an Affine scalar, not an address)."""

    every: tuple[tuple[str, bool], ...]  # (name, holds addresses: typed with program.Addr) of each field, in order
    walked: tuple[str, ...]  # the fields that may hold an Affine (not of a _PLAIN_TYPES type), in order


@functools.cache
def record_fields(cls: type) -> RecordFields:
    """The fields of an attrs class, by what they may hold (see RecordFields)."""
    fields = attrs.fields(cls)
    return RecordFields(tuple((f.name, "Addr" in str(f.type)) for f in fields),
                        tuple(f.name for f in fields if str(f.type) not in _PLAIN_TYPES))


def _renamed(items: tuple, old: str, new: str) -> tuple:
    """`items` with loop variable `old` called `new` in every address (see readdressed); a
    ValueError if a loop among them is over `old` too (its addresses would be renamed)."""
    def over(body) -> bool:
        return any(it.__class__ is Loop and (it.var == old or over(it.body)) for it in body)

    if over(items):
        raise ValueError(f"fast-forward: a loop inside the repeat loop over {old} is over {old} too")

    def move(a: Affine) -> Affine:
        return Affine(a.base, tuple((new if x == old else x, s) for x, s in a.terms)) \
            if any(x == old for x, _ in a.terms) else a
    return readdressed(tuple(items), move)


def _with_count(body: tuple, path: tuple[int, ...], count: int, var: str | None = None) -> tuple:
    """`body` with the loop at `path` running `count` times (and over `var`, if given: its
    variable renamed, in its body's addresses too)."""
    i, rest = path[0], path[1:]
    loop = body[i]
    if rest:
        new = attrs.evolve(loop, body=_with_count(loop.body, rest, count, var))
    elif var is None:
        new = attrs.evolve(loop, count=count)
    else:
        new = Loop(var, count, _renamed(loop.body, loop.var, var))
    return body[:i] + (new,) + body[i + 1:]


def truncated(kernel: Kernel, drop: int, var: str | None = None) -> Kernel:
    """The kernel with every block's repeat loop `drop` iterations shorter (and over `var`,
    if given: see _with_count). Blocks that shared a program share its truncation."""
    kw = {}
    for kind, found in repeat_loops(kernel).items():
        progs = programs(kernel, kind)
        made: dict[int, object] = {}
        for p, (path, loop) in zip(progs, found):
            if id(p) not in made:
                made[id(p)] = attrs.evolve(p, body=_with_count(p.body, path, loop.count - drop, var))
        kw["aic" if kind is CoreType.AIC else "aiv"] = tuple(made[id(p)] for p in progs)
    return attrs.evolve(kernel, **kw)


__all__ = ["ByKernel", "RecordFields", "cores_of", "gm_bytes", "kinds", "programs", "readdressed", "record_fields",
           "repeat_loops", "repeat_path", "static_instructions", "truncated", "wave_gm_bytes"]
