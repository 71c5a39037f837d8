"""verify(): where an instruction's operands land (npusim/isa/verify_walk.py walks a
program and calls check_access for each address an instruction reads or writes).

An address is an int or an Affine of the loop vars in scope; over every value of
those vars (the corners of their ranges: the form is linear) and every segment, the
access lands inside one declared buffer of its memory, on a memory its core has,
aligned - or, for GM, inside one of the kernel's GmTensors when it declares any.
`w` is the walk of one program on one site: its fail(), site, buffers (per
memory, sorted by address) and kernel. a_type, hex_range and names format the
verify modules' messages.
"""

from __future__ import annotations

import bisect
import operator
from typing import TYPE_CHECKING

from npusim.isa.program import ALIGN_BYTES, CORE_MEMS, RESERVED_VARS, Addr, Affine, Mem

if TYPE_CHECKING:
    from npusim.isa.verify_walk import Path, Scope, Walk


def check_access(
    w: Walk, instr, path: Path, scope: Scope, role: str, mem: Mem, a: Addr,
    nbytes: int, segments: int = 1, stride: int | None = None, align: int | None = None,
) -> None:
    """Every value of `a` (and every segment) lands inside one buffer of `mem`, aligned (to
    `align` bytes; None: the memory's ALIGN_BYTES); for GM, inside one of the kernel's
    GmTensors when it declares any. An access whose address reads `block` or `sub` is
    listed in w.site_checks, if it lists them (verify's module doc)."""
    lo, hi, site_bound = _span(w, instr, path, scope, role, a)
    if site_bound and w.site_checks is not None:
        w.site_checks.append((instr, path, scope, role, mem, a, nbytes, segments, stride, align))
    step = nbytes if stride is None else stride
    if not -w.gm_end < step < w.gm_end:  # the engine takes it even for one segment
        w.fail(f"{role} stride {step} is longer than any memory of the device (its GM: {w.gm_end:#x} bytes)",
               path, instr)
    reach = (segments - 1) * step  # offset of the last segment from the first
    start, end = lo + min(0, reach), hi + max(0, reach) + nbytes
    if mem is Mem.GM:
        _check_gm(w, instr, path, role, start, end)
    else:
        _check_local(w, instr, path, role, mem, a, start, end, segments, step, align or ALIGN_BYTES[mem])


def check_index(w: Walk, instr, path: Path, scope: Scope, role: str, a: Affine) -> None:
    """An Affine that is no address (a VecOp's scalar, a Mmad's accumulate index): a well
    formed one, of vars in scope."""
    _span(w, instr, path, scope, role, a)


def _span(w: Walk, instr, path: Path, scope: Scope, role: str, a: Addr) -> tuple[int, int, bool]:
    """Lowest and highest value of `a` over its vars' ranges (a linear form: the corners),
    and whether it reads `block` or `sub`."""
    if a.__class__ is int:
        return a, a, False
    if a.__class__ is not Affine:  # e.g. a numpy int: program.at() would fail on it in the engine
        w.fail(f"{role} address {a!r} is {a_type(a)}, expected an int or Affine", path, instr)
    lo = hi = a.base
    if lo.__class__ is not int:
        w.fail(f"{role} address {a!r}: base {lo!r} is {a_type(lo)}, expected an int", path, instr)
    if a.terms.__class__ is not tuple:
        w.fail(f"{role} address {a!r}: terms {a.terms!r} is {a_type(a.terms)}, expected a tuple of (var, step) pairs",
               path, instr)
    site_bound = False
    try:
        pairs = [(var, step) for var, step in a.terms]
    except (TypeError, ValueError):  # a term that is not a pair
        pairs = None
    if pairs is None or any(step.__class__ is not int for _, step in pairs):
        bad = next(t for t in a.terms if t.__class__ is not tuple or len(t) != 2 or t[1].__class__ is not int)
        w.fail(f"{role} address {a!r}: term {bad!r} is not a (var, step) pair of a str and an int", path, instr)
    end = w.gm_end
    for var, step in pairs:
        if not -end < step < end:  # the engine takes it even where its var moves nothing (a loop of one)
            w.fail(f"{role} address {a!r}: step {step} of {var!r} is longer than any memory of the device (its "
                   f"GM: {end:#x} bytes)", path, instr)
        r = scope.get(var)
        if r is None:
            w.fail(f"{role} address {a!r} uses var {var!r}, not in scope (have {', '.join(scope)})", path, instr)
        lo += step * (r[0] if step > 0 else r[1])
        hi += step * (r[1] if step > 0 else r[0])
        site_bound = site_bound or var in RESERVED_VARS
    return lo, hi, site_bound


def _check_local(
    w: Walk, instr, path: Path, role: str, mem: Mem, a: Addr, start: int, end: int, segments: int, stride: int,
    align: int,
) -> None:
    """A local access: a memory of this core, aligned base/steps/stride, inside ONE buffer."""
    core = w.site.core
    if mem not in CORE_MEMS[core]:
        w.fail(f"{role} in {mem!r}: {core.value} has no {mem!r} (has {names(CORE_MEMS[core])})", path, instr)
    if a.__class__ is int:
        misaligned = a % align
    else:
        misaligned = a.base % align or any(s % align for _, s in a.terms)
    if misaligned or (segments > 1 and stride % align):
        _fail_alignment(w, instr, path, role, mem, a, segments, stride, align)
    # the buffers of a memory are sorted by address and disjoint: only the last one
    # starting at or before `start` can hold the access
    bufs = w.buffers.get(mem, ())
    i = bisect.bisect_right(bufs, start, key=_ADDR) - 1
    if i < 0 or end > bufs[i].addr + bufs[i].nbytes:
        have = ", ".join(f"{b.name!r} {hex_range(b)}" for b in bufs) or "none declared"
        w.fail(f"{role} {mem!r} [{start:#x}, {end:#x}) over all blocks and iterations is not inside one "
               f"declared {mem!r} buffer (have {have})", path, instr)


_ADDR = operator.attrgetter("addr")


def _fail_alignment(w: Walk, instr, path: Path, role: str, mem: Mem, a: Addr, segments: int, stride: int,
                    align: int) -> None:
    """The error of a misaligned local access: its first part (base, a step, the
    segment stride) that is not a multiple of the memory's alignment."""
    parts = [("base", a)] if a.__class__ is int else [("base", a.base)] + [(f"step of {v!r}", s) for v, s in a.terms]
    if segments > 1:
        parts.append(("segment stride", stride))
    what, value = next((what, value) for what, value in parts if value % align)
    why = f"{mem!r} alignment" if align == ALIGN_BYTES[mem] else f"its {align}-byte element"
    w.fail(f"{role} {mem!r} address {a!r}: {what} {value} is not a multiple of {align} ({why})", path, instr)


def _check_gm(w: Walk, instr, path: Path, role: str, start: int, end: int) -> None:
    """A GM access lands inside the GM the device has, and inside one declared GmTensor when
    the kernel declares some."""
    if start < 0 or end > w.gm_end:
        w.fail(f"{role} GM [{start:#x}, {end:#x}) over all blocks and iterations is outside [0x0, {w.gm_end:#x}), "
               "the GM addresses the simulated device has (its L2 model's tags name)", path, instr)
    gm = w.kernel.gm
    if gm and not any(t.addr <= start and end <= t.addr + t.nbytes for t in gm):
        have = ", ".join(f"{t.name!r} {hex_range(t)}" for t in gm)
        w.fail(f"{role} GM [{start:#x}, {end:#x}) over all blocks and iterations is outside every "
               f"GmTensor (have {have})", path, instr)


# ------------------------------------------------------------------ formatting


def a_type(value) -> str:
    """'an int', 'a float': the type of a value, for messages."""
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def hex_range(x) -> str:
    """[addr, end) of a Buffer or GmTensor, in hex."""
    return f"[{x.addr:#x}, {x.addr + x.nbytes:#x})"


def names(items) -> str:
    """'MTE2, V, MTE3, S': the pipes or memories a core has, for messages."""
    return ", ".join(repr(i) for i in items)


__all__ = ["a_type", "check_access", "check_index", "hex_range", "names"]
