"""A GM transfer's start in Python (npusim/engine/_l2.c, Mover, runs it in C): the
statement the C transfer is held to (tests/test_engine_transfer.py swaps it in for every
MemorySystem's transfer and compares whole runs, value and type). The burst rule is
the Python that ran before; the L2 walk, the line patterns, the rest of a transfer
(memory.py's _finish) and the links are the engine's own."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial


def burst_cost(addr: int, nbytes: int, segments: int, stride: int, burst: int) -> tuple[int, int]:
    """(bytes moved after rounding every segment out to bursts, misaligned segments)."""
    if nbytes < 0 or segments < 0:
        raise ValueError(f"burst_cost: {segments} segments of {nbytes} bytes, expected each >= 0")
    # The rounding of a segment depends only on its start address modulo the burst;
    # those residues repeat with period burst / gcd(stride, burst).
    period = burst // math.gcd(stride % burst or burst, burst)
    moved = misaligned = 0
    for i in range(min(period, segments)):
        a = addr + i * stride
        lo = a - a % burst
        hi = -(-(a + nbytes) // burst) * burst
        reps = len(range(i, segments, period))
        moved += (hi - lo) * reps
        if a % burst or (a + nbytes) % burst:
            misaligned += reps
    return moved, misaligned


class TransferStats:
    """What a transfer did; added into its kernel's counters by the caller."""

    __slots__ = ("moved", "wasted", "misaligned", "hit_bytes", "miss_bytes", "hbm_read", "hbm_write", "uneven")

    def __init__(self):
        self.moved = self.wasted = self.misaligned = 0
        self.hit_bytes = self.miss_bytes = 0.0
        self.hbm_read = self.hbm_write = 0.0
        self.uneven = False  # a group's members missed different numbers of lines (see transfer)


def transfer(
    self, addrs: list[int], nbytes: int, segments: int, stride: int, write: bool, cap: float,
    on_done: Callable[[], None],
) -> TransferStats:
    """MemorySystem.transfer's start, in Python: the burst rounding, the line pattern, the
    L2 walk and the stats, then the L2 flow of a transfer that leaves nothing behind, or
    memory.py's _finish for the rest."""
    if nbytes < 1 or segments < 1:  # a copy moves at least a byte (verify() refuses a Copy of none)
        raise ValueError(f"transfer: {segments} segments of {nbytes} bytes, expected each >= 1")
    w = len(addrs)
    st = TransferStats()
    moved, misaligned = burst_cost(addrs[0], nbytes, segments, stride, self.burst)
    st.moved, st.misaligned = moved * w, misaligned * w
    st.wasted = (moved - nbytes * segments) * w
    lines, member, shared, first = self._lines_of(addrs, nbytes, segments, stride)
    fill_id = 0 if write else len(self.l2.fills)
    hit_lines, wb, waits, missed, any_miss = self.l2._core.access(lines, write, fill_id, w > 1 and not write, first)
    total_lines = len(lines)
    # members sharing a line: all but the first to touch it find it in the L2
    st.hit_bytes = st.moved * (hit_lines + shared) / (total_lines + shared)
    st.miss_bytes = st.moved - st.hit_bytes
    st.hbm_read = 0.0 if write else float((total_lines - hit_lines) * self.line)  # a read miss fills whole lines
    if wb is None and not waits and not st.hbm_read:  # the L2 flow is all
        self.l2_link.add(moved, cap, on_done, w)
        return st
    return self._finish(st, member, wb, waits, missed, any_miss, w, moved, cap, on_done, write)


class Mover:
    """Stands in for _l2.Mover: its transfer is the Python above, on the MemorySystem
    whose bound methods it is given."""

    def __init__(self, core, line, burst, patterns, lines_of, l2_add, fills, finish, *finish_one):
        self.transfer = partial(transfer, lines_of.__self__)
