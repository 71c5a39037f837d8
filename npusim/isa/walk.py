"""The concrete walk of a program: its instructions in program order, loops unrolled,
each with the values of the loop vars (and `block`, `sub`) it runs with.

verify() walks a program symbolically (a loop var as its range, never unrolled);
the functional interpreter needs every iteration's addresses, so it walks this way.
Both read the same records; this walk is small on the shapes the interpreter takes
(isa.interpret refuses programs that unroll past its step limit).
"""

from __future__ import annotations

from collections.abc import Iterator

from npusim.errors import NpusimError, ProgramError
from npusim.isa.program import (
    Copy, CrossSetFlag, CrossWaitFlag, Loop, Mmad, Pipe, PipeBarrier, Scalar, SetFlag, SyncAll, VecOp, WaitFlag,
)


class TooLarge(NpusimError):
    """A program that unrolls past the interpreter's limit: refused, not wrong."""


def unroll(body: tuple, vars: dict[str, int], limit: int) -> Iterator[tuple[object, dict[str, int]]]:
    """(instruction, vars) of every instruction `body` runs, in program order; at most
    `limit` of them, else a one-line TooLarge naming the limit."""
    count = 0
    for instr, scope in _unrolled(body, vars):
        count += 1
        if count > limit:
            raise TooLarge(f"program runs more than {limit} instructions once unrolled: too large to interpret "
                               "(validate --kernels takes small shapes)")
        yield instr, scope


def _unrolled(body: tuple, scope: dict[str, int]) -> Iterator[tuple[object, dict[str, int]]]:
    """unroll's walk, one iteration at a time (a loop of 2^30 trips is not laid out before
    its first instruction runs); a loop that runs no instruction (loops of nothing) is
    skipped whole, however many trips it has."""
    for instr in body:
        if instr.__class__ is Loop:
            if executes(instr.body):
                for value in range(instr.count):
                    yield from _unrolled(instr.body, {**scope, instr.var: value})
        else:
            yield instr, scope


def runs(body: tuple) -> int:
    """How many instructions `body` runs once unrolled, counted without unrolling it: a
    loop's trips times its body's (a loop of nothing runs none)."""
    return sum(item.count * runs(item.body) if item.__class__ is Loop else 1 for item in body)


def executes(body: tuple) -> bool:
    """Does `body` hold an instruction other than loops?"""
    return any(item.__class__ is not Loop or executes(item.body) for item in body)


def pipes_of(instr, core_pipes: tuple[Pipe, ...]) -> tuple[Pipe, ...]:
    """The pipes an instruction occupies on a core with `core_pipes`: one, or every pipe
    for PipeBarrier(ALL) and SyncAll (they wait for all of them)."""
    cls = instr.__class__
    if cls is SetFlag:
        return (instr.src,)
    if cls is WaitFlag:
        return (instr.dst,)
    if cls is SyncAll or (cls is PipeBarrier and instr.pipe is None):
        return core_pipes
    if cls in (Copy, Mmad, VecOp, Scalar, PipeBarrier, CrossSetFlag, CrossWaitFlag):
        return (instr.pipe,)  # a copy's own pipe, the unit's (Mmad: M, VecOp: V, Scalar: S), the one named
    raise ProgramError(f"not an instruction: {instr!r}")
