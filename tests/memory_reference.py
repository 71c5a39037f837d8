"""A GM transfer's start in Python, as it ran before it moved to C (npusim/engine/_l2.c,
Mover): the statement the C start is held to (tests/test_engine_transfer.py swaps it in
for every MemorySystem's transfer and compares whole runs, value and type). The L2
walk, the line patterns, the write-backs and the links are the engine's own."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

from npusim.engine.memory import _member_fills


def burst_cost(addr: int, nbytes: int, segments: int, stride: int, burst: int) -> tuple[int, int]:
    """(bytes moved after rounding every segment out to bursts, misaligned segments)."""
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
    """Start a GM read (write=False) or write now, one per address in `addrs` (the
    identical blocks of a group, see device.py); on_done() fires when they have
    all moved. Burst rounding is the same for every address of a group (they
    differ by whole lines). The stats say `uneven` if the members of a group read
    different numbers of lines from HBM: one by one they would not have kept
    together, so the group's timing is not theirs (the device runs it again)."""
    w = len(addrs)
    st = TransferStats()
    moved, misaligned = burst_cost(addrs[0], nbytes, segments, stride, self.burst)
    st.moved, st.misaligned = moved * w, misaligned * w
    st.wasted = (moved - nbytes * segments) * w

    line = self.line
    lines, member, shared, first = self._lines_of(addrs, nbytes, segments, stride)
    # A read that misses gets a fill event: it fires when the missed lines have arrived.
    hit_lines, wb, waits, fill, missed = self.l2.access(lines, write, None if write else self._new_fill,
                                                        w > 1 and not write, first)
    total_lines = len(lines)
    if shared:  # members sharing a line: all but the first to touch it find it in the L2
        st.hit_bytes = st.moved * (hit_lines + shared) / (total_lines + shared)
    else:
        st.hit_bytes = st.moved * hit_lines / total_lines
    st.miss_bytes = st.moved - st.hit_bytes
    # A read miss fills whole lines from HBM.
    st.hbm_read = 0.0 if write else float((total_lines - hit_lines) * line)
    if wb is not None:
        self._write_back(st, wb, member, w)
    if not waits and not st.hbm_read:  # a write, or a read that hits throughout: the L2 flow is all
        self.l2_link.add(moved, cap, on_done, w)
        return st

    pending = [1 + len(waits)]

    def one_done(_event=None) -> None:
        pending[0] -= 1
        if not pending[0]:
            on_done()

    for ev in waits:  # lines another transfer is still bringing in
        ev.callbacks.append(one_done)
    self.l2_link.add(moved, cap, one_done, w)
    if st.hbm_read > 0:
        # HBM -> L2 does not cross the core's port. Each member reads the lines it is
        # the first to touch; members alike read alike (one flow of weight w). With
        # shared lines the first toucher reads them and the others hit them while
        # they are being filled, so they wait for its flow, as one by one they would.
        fills = [(st.hbm_read, 1)] if missed is None else _member_fills(missed, member, w, line)
        st.uneven = w > 1 and fills[0][1] != w
        fills_left = [len(fills)]
        pending[0] += len(fills)

        def filled() -> None:
            fills_left[0] -= 1
            if not fills_left[0]:  # the group's lines have all arrived
                fill.fire()
            one_done()

        for nbytes_each, members in fills:
            self.hbm.add(nbytes_each, math.inf, filled, members)
    elif fill is not None:
        fill.fire()
    return st


class Mover:
    """Stands in for _l2.Mover: its transfer is the Python above, on the MemorySystem
    whose bound methods it is given."""

    def __init__(self, core, line, burst, patterns, lines_of, l2_add, fills, finish):
        self.transfer = partial(transfer, lines_of.__self__)
