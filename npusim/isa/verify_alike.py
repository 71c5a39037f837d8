"""verify(): a program checked as another's walk again (npusim/isa/verify.py walks each
program once per site, by verify_walk.py; for a program it has walked already, or one
like the last walked on its core, it runs these instead of a walk).

A program like the last one walked on its core (check_like) - the same buffers object,
the same loops (var and count), every other instruction the same object but some Copy,
Mmad or VecOp (the runs of a FlashAttention kernel: one template, their GM addresses
bound apart) - is checked as that one's walk again: its listed checks with the new
site's ranges, and the differing instructions in full, merged in walk order (so the
first to fail is again the first the walk would have failed at); its flag counts are
that walk's (its flags are the same objects at the same places, in the same loops).
Anything else that differs, or an instruction merely equal, is walked in full.

A listed check (check_listed) is an access whose address reads `block` or `sub`, as
check_access listed it on the walk (w.site_checks), run again with another site's
ranges: for a program met again on its core too (verify's _check_again).
"""

from __future__ import annotations

import heapq
from operator import itemgetter
from typing import TYPE_CHECKING

import attrs

from npusim.isa.program import Loop, Program
from npusim.isa.verify_addresses import check_access
from npusim.isa.verify_walk import ADDRESS_FIELDS, check_instr

if TYPE_CHECKING:
    from npusim.isa.verify_walk import Path, Scope, Site, Walk


def check_listed(w: Walk, entry: tuple, done: set) -> None:
    """A listed access (check_access's arguments but `w`) again, with w's site's ranges;
    listed for w in turn if w lists. An access equal to one that passed on this site with
    the same ranges of its vars passes alike (the check reads nothing else): `done` holds
    those that passed."""
    instr, path, scope, role, mem, a, nbytes, segments, stride, align = entry
    scope = {**scope, **w.site.scope}
    key = (mem, a, nbytes, segments, stride, align, *[scope[var] for var, _ in a.terms])
    if key not in done:
        check_access(w, instr, path, scope, role, mem, a, nbytes, segments, stride, align)
        done.add(key)
    elif w.site_checks is not None:
        w.site_checks.append((instr, path, scope, role, mem, a, nbytes, segments, stride, align))


def check_like(ref: Walk, program: Program, site: Site) -> Walk | None:
    """The walk of `program` on `site` as `ref`'s again, if the program is like ref's (see
    the module doc): ref's checks that read `block` or `sub` with this site's ranges, but
    those of the instructions that differ, which are checked in full (verify_walk's
    check_instr); None if not alike."""
    differ: list = []
    if program.buffers is not ref.program.buffers or not _alike(ref.program.body, program.body, (), site.scope, 1,
                                                                differ):
        return None
    w = attrs.evolve(ref, site=site, site_checks=[], program=program)
    redone = {path for _, path, _, _ in differ}
    again = ((c[1], True, c) for c in ref.site_checks if c[1] not in redone)
    done: set = set()
    for _, listed, entry in heapq.merge(again, ((d[1], False, d) for d in differ), key=itemgetter(0)):
        if listed:
            check_listed(w, entry, done)
        else:
            check_instr(w, *entry)
    return w


def _alike(ref: tuple, body: tuple, prefix: Path, scope: Scope, mult: int, differ: list) -> bool:
    """Whether `body` is `ref` but for some Copy, Mmad or VecOp: the same length, loops of
    the same var and count, the same objects elsewhere. Appends each differing instruction
    to `differ` as check_instr takes it (path, scope and runs as the walk has them)."""
    if len(ref) != len(body):
        return False
    for i, (a, b) in enumerate(zip(ref, body)):
        if a is b:
            continue
        cls = b.__class__
        if a.__class__ is not cls:
            return False
        if cls is Loop:
            if not (_same(a.var, b.var) and _same(a.count, b.count)):
                return False
            inner = {**scope, b.var: (0, b.count - 1)}
            if not _alike(a.body, b.body, prefix + (i,), inner, mult * b.count, differ):
                return False
        elif cls in ADDRESS_FIELDS:
            differ.append((b, prefix + (i,), scope, mult))
        else:
            return False
    return True


def _same(x, y) -> bool:
    """Equal and of one type (a loop's count 2 and 2.0 check differently)."""
    return x.__class__ is y.__class__ and x == y


__all__ = ["check_like", "check_listed"]
