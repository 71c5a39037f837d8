"""Which blocks of a kernel may run as one group (see engine.device): the GM
transfers a block's streams make, and the rules under which identical blocks touch
the L2 and round to bursts alike."""

from __future__ import annotations

import math

import numpy as np

from npusim.engine.compile import GmCopy, LoopEntry
from npusim.engine.memory import burst_cost
from npusim.hw import HwConfig
from npusim.isa.program import Affine, Kernel


def gm_accesses(stream: tuple, counts: dict[str, int]):
    """(block step, first byte, end byte, write, fixed, entry, loop counts) of every GM
    transfer in a stream, over all values of the other variables in scope (`counts`
    gives each one's range); fixed: the address moves with the block only."""
    for e in stream:
        if e.__class__ is LoopEntry:
            yield from gm_accesses(e.body, {**counts, e.var: e.count})
        elif e.__class__ is GmCopy:
            gm_addr, nbytes, segments, stride = e.gm_addr, e.nbytes, e.segments, e.stride
            base, terms = (gm_addr.base, dict(gm_addr.terms)) if isinstance(gm_addr, Affine) else (gm_addr, {})
            moves = [step * (counts.get(var, 1) - 1) for var, step in terms.items() if var != "block"]
            lo = base + sum(m for m in moves if m < 0)
            hi = base + sum(m for m in moves if m > 0) + (segments - 1) * stride + nbytes
            yield terms.get("block", 0), lo, hi, e.write, not any(moves), e, counts


class Diverged(Exception):
    """The members of a group came apart (they read different numbers of lines from
    HBM in one transfer): raised out of the simulation at once, since nothing after
    that point is what one block at a time would give; args: the kernel's run id (its
    launch's place on the device) and the group's first block."""


# Lines per block the exact disjointness test of groupable enumerates at most.
_DISJOINT_LINES = 1 << 16


class Grouping:
    """How blocks of one program may run grouped: the GM reads they make, as rows of
    (block step, first byte, end byte) at block 0, and the regions (block step, first
    byte, end byte, write) of the tensors whose lines they share (see groupable)."""

    __slots__ = ("reads", "shared")

    def __init__(self, reads: np.ndarray, shared: tuple):
        self.reads, self.shared = reads, shared


def groupable(accesses: list[tuple], kernel: Kernel, hw: HwConfig, block: int, members: int) -> Grouping | None:
    """Do blocks running these accesses (placed at `block`, the first block running
    the program) behave alike, so that one can stand for several (up to `members`)?
    Every transfer rounds to bursts alike in every block, and per GM tensor of the
    kernel (all of GM if it declares none), with one common block step:
    - the blocks touch separate L2 lines (their regions of the tensor lie a whole
      line apart, or, counted line by line, no two blocks touch one line);
    - or they share lines only within a transfer: every block touches the same
      bytes (step 0) or one fixed region of its own (every access to the tensor
      the same bytes, whatever the loops), so the first to touch a shared line
      misses it and the others wait for its fill, as one by one. Such blocks are
      grouped only if the lines they share they read, the L2 holds them and the
      group holds all of them (Device._sharing), and their kernel is alone on the
      device (Device._grouping).
    None: blocks reading lines another block reaches in another transfer would hit
    or miss differently, and are not grouped."""
    burst = hw.dma.burst_bytes
    if not all(_rounds_alike(a, burst) for a in accesses):
        return None
    tensors: dict = {}
    for a in accesses:
        step, lo = a[0], a[1] + a[0] * block
        owner = next((t.name for t in kernel.gm if t.addr <= lo < t.addr + t.nbytes), None)
        tensors.setdefault(owner, []).append(a)
    line = hw.l2.line_bytes
    shared = []
    for group in tensors.values():
        steps = {a[0] for a in group}
        if len(steps) != 1:
            return None
        step = steps.pop()
        spread = -(-max(a[2] for a in group) // line) * line - min(a[1] for a in group) // line * line
        if step and step % line == 0 and spread <= abs(step):
            continue
        if all(a[4] for a in group) and len({(a[1], a[2]) for a in group}) == 1:
            shared.append((step, group[0][1], group[0][2], any(a[3] for a in group)))
        elif step == 0 or not _apart(group, step, members, line):
            return None
    reads = np.array([a[:3] for a in accesses if not a[3]], np.int64).reshape(-1, 3)
    return Grouping(reads, tuple(shared))


def _rounds_alike(access: tuple, burst: int) -> bool:
    """Does a transfer round to bursts the same in every block? Blocks a whole number
    of bursts apart do; otherwise every block's offset within a burst must cost alike
    (and the loops move it by whole bursts)."""
    step, lo, _, _, _, e, _ = access
    if step % burst == 0:
        return True
    a = e.gm_addr
    if any(s % burst for var, s in (a.terms if isinstance(a, Affine) else ()) if var != "block"):
        return False
    starts = {(lo + m * step) % burst for m in range(burst // math.gcd(step, burst))}
    return len({burst_cost(x, e.nbytes, e.segments, e.stride, burst) for x in starts}) == 1


def _apart(group: list[tuple], step: int, members: int, line: int) -> bool:
    """Do `members` consecutive blocks, `step` bytes apart, touch disjoint L2 lines in
    these accesses? Counted line by line over every loop iteration (False when that
    is more than _DISJOINT_LINES lines a block, or pieces of one access)."""
    lines = np.empty(0, np.int64)
    for *_, e, counts in group:
        firsts = _piece_starts(e, counts)
        touched = None if firsts is None else _lines_of(firsts, e.nbytes, line)
        if touched is None:
            return False
        lines = _union(lines, touched)
        if len(lines) > _DISJOINT_LINES:
            return False
    if step % line:  # blocks a fraction of a line apart share lines at their edges
        return False
    return not _copies_meet(lines, step // line, members)


def _piece_starts(e: GmCopy, counts: dict[str, int]) -> np.ndarray | None:
    """First byte of every piece a transfer moves at block 0 (each segment of each
    iteration of the loops in `counts`, in no order); None when that is more than
    _DISJOINT_LINES pieces."""
    a = e.gm_addr
    terms = [(var, s) for var, s in (a.terms if isinstance(a, Affine) else ()) if var != "block"]
    iterations = [max(counts.get(var, 1), 0) for var, _ in terms]  # as len(range(count))
    if math.prod(iterations) * e.segments > _DISJOINT_LINES:
        return None
    starts = np.array([a.base if isinstance(a, Affine) else a], np.int64)
    for (_, s), n in zip(terms, iterations):
        starts = np.add.outer(starts, s * np.arange(n, dtype=np.int64)).ravel()
    return np.add.outer(starts, e.stride * np.arange(e.segments, dtype=np.int64)).ravel()


def _lines_of(firsts: np.ndarray, nbytes: int, line: int) -> np.ndarray | None:
    """The distinct lines, sorted, that pieces [first, first + nbytes) touch; None when
    that is more than _DISJOINT_LINES lines. A piece of no bytes touches the line its
    first byte lies in unless that starts a line (as range(first // line, ...) does)."""
    firsts = np.sort(firsts)
    lo, hi = firsts // line, -(-(firsts + nbytes) // line)
    # every piece has nbytes, so the ends come in the order of the starts: start each
    # piece no earlier than the one before ends, and the pieces left are disjoint, in order
    lo[1:] = np.maximum(lo[1:], hi[:-1])
    sizes = np.maximum(hi - lo, 0)
    total = int(sizes.sum())
    if total > _DISJOINT_LINES:
        return None
    return np.repeat(lo - (np.cumsum(sizes) - sizes), sizes) + np.arange(total, dtype=np.int64)


def _copies_meet(lines: np.ndarray, shift: int, members: int) -> bool:
    """Do copies of these lines (distinct, sorted), moved by 0, shift, ...,
    (members - 1) * shift, share a line? They do iff two of the lines (one line, when
    shift is 0) lie k * |shift| apart for some 0 < k < members."""
    if not len(lines) or members < 2:
        return False
    if shift == 0:
        return True
    apart = abs(shift)
    last = min(members - 1, (lines[-1] - lines[0]) // apart)
    return any(_found(lines, lines + k * apart).any() for k in range(1, last + 1))


def _union(lines: np.ndarray, more: np.ndarray) -> np.ndarray:
    """Two sets of lines (each distinct, sorted) as one, sorted: only the lines of
    `more` missing from `lines` are inserted (cheaper than a sort of both, as a
    block's accesses mostly add few lines to many)."""
    if not len(lines):
        return more
    at = np.searchsorted(lines, more)
    new = ~_found(lines, more, at)
    return np.insert(lines, at[new], more[new])


def _found(lines: np.ndarray, values: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
    """Which values (each) are among these lines (distinct, sorted, at least one);
    `at`: where np.searchsorted puts the values, if known."""
    at = np.searchsorted(lines, values) if at is None else at
    return lines[np.minimum(at, len(lines) - 1)] == values
