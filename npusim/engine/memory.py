"""GM traffic: the 64-byte burst rule, the L2 cache and the HBM/L2 links.

A GM transfer of `segments` pieces of `nbytes` (start addresses `stride` apart):
- each segment costs its bytes rounded out to aligned bursts (dma.burst_bytes);
  the extra bytes are counted as wasted and segments with an unaligned start or
  end as misaligned;
- the lines it touches go through the L2 (hits, misses, evictions);
- the moved bytes flow on the L2 link, capped by the core's port rate; for a read,
  the missed lines (whole lines) flow on the HBM link too, uncapped (HBM -> L2
  does not cross the core's port). The transfer ends when both flows have ended
  and any line it hit that another transfer is still filling has arrived.
  # assumption: hit and miss parts of one transfer proceed in parallel; the
  # slower link sets the transfer's time.
- dirty lines its accesses evict are written back to HBM as a background flow:
  it takes its share of HBM bandwidth but nobody waits for it.

Transfers repeat their shapes (a tile loop, the members of a group), so the line
pattern of each shape is computed once and then shifted to the transfer's address.

A transfer runs in C (_l2.c, Mover): the burst rounding, the line pattern
(_lines_of), the L2 walk and its flows; _finish states the rest of a transfer after
its walk (fill events, write-backs, the HBM flow, waiting for fills), and does it
for a group (two or more members); for one member the C does it, step for step
(tests/test_engine_transfer.py holds whole runs to _finish doing it all). The
stats hold the Python numbers the Python made (its int and float arithmetic).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import simpy

from npusim.engine._l2 import Mover, TransferStats, burst_cost
from npusim.engine.events import Signal
from npusim.engine.flows import Link
from npusim.engine.l2cache import L2Cache
from npusim.hw import HwConfig

__all__ = ["MemorySystem", "TransferStats", "burst_cost"]  # burst_cost: the burst rule, in C (grouping reads it)


class MemorySystem:
    def __init__(self, env: simpy.Environment, hw: HwConfig, record: bool = True):
        self.env = env
        self.hw = hw
        self.hbm = Link(env, "HBM", hw.hbm_bytes_per_cycle, record)
        self.l2_link = Link(env, "L2", hw.l2_bytes_per_cycle, record)
        self.l2 = L2Cache(hw.l2.l2_bytes // hw.l2.line_bytes, hw.l2.ways)
        self.line = hw.l2.line_bytes
        self.burst = hw.dma.burst_bytes
        # True: a group whose members read different numbers of lines from HBM ends its run
        # (`uneven`, below); False (a run that may approximate: engine.run's exact=False): it
        # keeps together, each member's transfer ending when the slowest member's fill does.
        # assumption: (exact=False) members kept in step after such a transfer cost what they
        # would one by one, within the fast path's error (benchmarks/bench_fastforward.py)
        self.exact_groups = True
        self.kept_together = 0  # transfers of such groups kept together (exact_groups False)
        self._patterns: dict = {}  # per transfer shape: its line pattern (see _lines_of)
        # transfer(addrs, nbytes, segments, stride, write, cap, on_done) -> TransferStats: start
        # a GM read (write=False) or write now, one per address in `addrs` (the identical blocks
        # of a group, see device.py); on_done() fires when they have all moved. Burst rounding is
        # the same for every address of a group (they differ by whole lines). The stats say
        # `uneven` if the members of a group read different numbers of lines from HBM: one by
        # one they would not have kept together, so the group's timing is not theirs (the
        # device runs it again; never when exact_groups is False). In C (see the module doc),
        # with _finish for a group's.
        self.transfer = Mover(self.l2._core, self.line, self.burst, self._patterns, self._lines_of,
                              self.l2_link.add, self.l2.fills, self._finish, env, Signal, self.hbm.add,
                              _nothing).transfer

    def _new_fill(self) -> Signal:
        return Signal(self.env)

    def _finish(self, st: TransferStats, member: np.ndarray, wb, waits: list, missed, any_miss: bool, w: int,
                moved: int, cap: float, on_done: Callable[[], None], write: bool) -> TransferStats:
        """The rest of a transfer the C start left (see the module doc), from what its L2
        walk found: the write-back mask `wb` and the positions of the missed lines `missed`
        (bytes, or None), the fill ids it waits for, whether any line missed."""
        line = self.line
        # A read that misses gets a fill event: it fires when the missed lines have arrived.
        fill, waits = self.l2.after_access(any_miss and not write, self._new_fill, waits)
        if missed is not None:
            missed = np.frombuffer(missed, np.int64)
        if wb is not None:
            self._write_back(st, np.frombuffer(wb, bool), member, w)
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
            came_apart = w > 1 and fills[0][1] != w
            st.uneven = came_apart and self.exact_groups
            self.kept_together += came_apart and not self.exact_groups
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

    def touch(self, start: int, nbytes: int, write: bool) -> None:
        """Put [start, start + nbytes) through the L2 as one access with no timing and no
        traffic: the cache state a replayed kernel (device.Reuse) leaves behind.
        # assumption: the lines it evicts would have been written back while the
        # original ran; their bytes are already in the replayed kernel's counters.
        A range longer than touch_lines() is walked from its last touch_lines() lines:
        the L2 ends the same (see there), and a replay of a kernel larger than the L2
        walks a bounded number of lines (a K3 prefill's 1-2 GiB tensors: 6 s of 45)."""
        if nbytes > 0:
            end = start + nbytes
            keep = self.touch_lines()
            if (end - 1) // self.line - start // self.line >= keep:
                start = ((end - 1) // self.line - keep + 1) * self.line
            self.l2.access(_lines([start], end - start, 1, 0, self.line)[0], write)

    def touch_lines(self) -> int:
        """The most lines of a contiguous range whose walk leaves the L2 as the whole range's
        does: 2 (ways + 1) sets. Each aligned run of `sets` lines maps onto every set once
        (L2Cache.set_of), so the first (ways + 1) sets of them evict every line a set held
        before (a line of the rest among them: it comes back fresh, as in the whole walk,
        where the earlier lines evicted it), and the last (ways + 1) sets then fill every
        set with its last `ways` lines of the range, in order, fresh (dirty if a write,
        arrived) - what the whole walk leaves. Only the clock differs (fewer lines used),
        and last uses are compared within a set only, all of them set by these lines."""
        return 2 * (self.l2.ways + 1) * self.l2.sets

    def _write_back(self, st: TransferStats, wb: np.ndarray, member: np.ndarray, w: int) -> None:
        """Dirty lines evicted by a transfer (mask `wb` over its lines) go to HBM: one
        background flow per member, members writing back alike merged into one."""
        line = self.line
        if w == 1:
            per_member = [(int(np.count_nonzero(wb)), 1)]
        else:
            counts = np.bincount(member[wb], minlength=w)
            if (counts == counts[0]).all():  # the usual case: every member alike
                per_member = [(counts[0], w)]
            else:
                per_member = zip(*np.unique(counts[counts > 0], return_counts=True))
        for lines_wb, members in per_member:
            st.hbm_write += int(lines_wb) * line * int(members)
            self.hbm.add(int(lines_wb) * line, math.inf, _nothing, int(members))

    def _lines_of(self, addrs: list[int], nbytes: int, segments: int, stride: int):
        """The L2 lines of a transfer relative to the line of its first byte, the member of
        each and the shared count (see _lines), and that line. Relative to it they depend
        only on the shape and on where each member starts within a line and relative to
        the first one, so each pattern is computed once (and shifted by the L2 walk)."""
        line = self.line
        first, within = divmod(addrs[0], line)
        if len(addrs) == 1:
            key = (within, nbytes, segments, stride)
        else:
            key = (within, nbytes, segments, stride, *[a - addrs[0] for a in addrs])
        pattern = self._patterns.get(key)
        if pattern is None:
            offsets, member, shared = _lines([a - addrs[0] + within for a in addrs], nbytes, segments, stride, line)
            pattern = self._patterns[key] = (offsets, member, shared)
        return (*pattern, first)


def _member_fills(missed: np.ndarray, member: np.ndarray, w: int, line: int) -> list[tuple[float, int]]:
    """(bytes, members) of the HBM reads of a group's members: each member the missed
    lines (positions `missed`) it touches first (members with the same count share one
    weighted flow; members that miss nothing have none)."""
    counts = np.bincount(member[missed], minlength=w)
    sizes, members = np.unique(counts[counts > 0], return_counts=True)
    return [(float(c * line), int(m)) for c, m in zip(sizes, members)]


def _nothing() -> None:
    """Completion of a background write-back: nobody waits for it."""


def _lines(addrs: list[int], nbytes: int, segments: int, stride: int, line: int):
    """The L2 lines a transfer touches (ascending, each once), per line which member
    (index into `addrs`) touched it first, and how many (line, member) pairs there are
    beyond the first member of each line (0 unless members share lines)."""
    if segments == 1 and len(addrs) == 1:
        first = addrs[0] // line
        lines = np.arange(first, -(-(addrs[0] + nbytes) // line), dtype=np.int64)
        return lines, np.zeros(len(lines), np.int64), 0
    starts = (np.asarray(addrs, np.int64)[:, None] + np.arange(segments, dtype=np.int64) * stride).ravel()
    first = starts // line
    count = -(-(starts + nbytes) // line) - first
    if (count == count[0]).all() and (np.diff(np.sort(first)) >= count[0]).all():
        # every segment covers the same number of lines and none shares a line
        lines = (first[:, None] + np.arange(count[0], dtype=np.int64)).ravel()
        return lines, np.repeat(np.arange(len(addrs)), segments * int(count[0])), 0
    total = int(count.sum())
    offsets = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
    lines = np.repeat(first, count) + offsets
    members = np.repeat(np.repeat(np.arange(len(addrs)), segments), count)
    shared = 0
    if len(lines) > 1 and not (lines[1:] > lines[:-1]).all():
        if len(addrs) > 1:
            pairs = np.sort(lines * len(addrs) + members)  # (line, member), counted once each
            shared = 1 + int(np.count_nonzero(pairs[1:] != pairs[:-1]))
        lines, idx = np.unique(lines, return_index=True)  # segments closer than a line share lines
        members = members[idx]
        shared = max(0, shared - len(lines))
    return lines, members, shared
