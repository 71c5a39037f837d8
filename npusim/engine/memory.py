"""GM traffic: the 64-byte burst rule, the L2 cache and the HBM/L2 links.

A GM transfer of `segments` pieces of `nbytes` (start addresses `stride` apart):
- each segment costs its bytes rounded out to aligned bursts (dma.burst_bytes);
  the extra bytes are counted as wasted and segments with an unaligned start or
  end as misaligned;
- the lines it touches go through the L2 (hits, misses, evictions);
- the moved bytes then flow on the L2 link and, for a read, the bytes that miss
  flow on the HBM link too, both capped by the
  core's port rate. The transfer ends when both flows have ended.
  # assumption: hit and miss parts of one transfer proceed in parallel; the
  # slower link sets the transfer's time.
- dirty lines its accesses evict are written back to HBM as a background flow:
  it takes its share of HBM bandwidth but nobody waits for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from npusim.engine.flows import Link
from npusim.engine.l2cache import L2Cache
from npusim.hw import HwConfig


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

    __slots__ = ("moved", "wasted", "misaligned", "hit_bytes", "miss_bytes", "hbm_read", "hbm_write")

    def __init__(self):
        self.moved = self.wasted = self.misaligned = 0
        self.hit_bytes = self.miss_bytes = 0.0
        self.hbm_read = self.hbm_write = 0.0


class MemorySystem:
    def __init__(self, env: simpy.Environment, hw: HwConfig, record: bool = True):
        self.env = env
        self.hw = hw
        self.hbm = Link(env, "HBM", hw.hbm_bytes_per_cycle, record)
        self.l2_link = Link(env, "L2", hw.l2_bytes_per_cycle, record)
        self.l2 = L2Cache(hw.l2.l2_bytes // hw.l2.line_bytes)
        self.line = hw.l2.line_bytes
        self.burst = hw.dma.burst_bytes

    def transfer(
        self, addrs: list[int], nbytes: int, segments: int, stride: int, write: bool, cap: float,
        on_done: Callable[[], None],
    ) -> TransferStats:
        """Start a GM read (write=False) or write now, one per address in `addrs` (the
        identical blocks of a group, see device.py); on_done() fires when they have
        moved. Burst rounding is the same for every address of a group (the group's
        addresses differ by whole bursts); each address goes through the L2 itself,
        and the group's flows share its hits and write-backs equally."""
        if stride == nbytes:  # back-to-back segments are one contiguous segment
            nbytes, segments = nbytes * segments, 1
        w = len(addrs)
        st = TransferStats()
        moved, misaligned = burst_cost(addrs[0], nbytes, segments, stride, self.burst)
        st.moved, st.misaligned = moved * w, misaligned * w
        st.wasted = (moved - nbytes * segments) * w

        line = self.line
        hit_lines = total_lines = 0
        write_backs: dict[int, int] = {}  # lines written back by one member -> members
        contiguous = segments == 1 or stride - nbytes < line
        for addr in addrs:
            wb = 0
            if contiguous:
                first, end = addr // line, -(-(addr + (segments - 1) * stride + nbytes) // line)
                h, wb = self.l2.access(first, end, write)
                hit_lines += h
                total_lines += end - first
            else:  # segments far apart touch separate lines
                for i in range(segments):
                    a = addr + i * stride
                    first, end = a // line, -(-(a + nbytes) // line)
                    h, w_ = self.l2.access(first, end, write)
                    hit_lines += h
                    wb += w_
                    total_lines += end - first
            if wb:
                write_backs[wb] = write_backs.get(wb, 0) + 1
        st.hit_bytes = st.moved * hit_lines / total_lines
        st.miss_bytes = st.moved - st.hit_bytes
        st.hbm_read = 0.0 if write else st.miss_bytes
        for lines, members in write_backs.items():
            st.hbm_write += lines * line * members
            self.hbm.add(lines * line, math.inf, _nothing, members)

        pending = [1]

        def one_done() -> None:
            pending[0] -= 1
            if not pending[0]:
                on_done()

        self.l2_link.add(moved, cap, one_done, w)
        if st.hbm_read > 0:
            pending[0] += 1
            self.hbm.add(st.hbm_read / w, cap, one_done, w)
        return st


def _nothing() -> None:
    """Completion of a background write-back: nobody waits for it."""
