"""The L2: a memory-side cache shared by all cores (set-associative, LRU, write-back,
write-allocate), counted in lines of hw.l2.line_bytes.

State is held in flat numpy arrays of sets x ways slots (tag, last use, dirty,
pending fill),
and one access handles all the lines of a transfer (every segment of a strided
copy, every block of a group) with a few array operations, so the cost of a
transfer grows with its lines at array speed, not at Python speed.

- The set of a line is its address modulo the sets, rotated by a hash of the
  higher address bits (real L2s hash the index so that power-of-two strides do
  not pile onto a few sets); a contiguous run still spreads evenly over the sets.
- Within one access, lines are used in address order: a later line is more
  recent. An access longer than the number of sets is applied in pieces of that
  size, so its own front part can evict lines before its back part looks them up.
- A read that misses records the event of its fill (the HBM flow bringing the
  line); a later access that hits a line whose fill is still in flight must wait
  for it - blocks reading the same cold data all wait for HBM.

Assumptions: a write allocates its lines without reading HBM (whole-line writes);
within one piece, hits and misses are decided against the state at its start.
"""

from __future__ import annotations

import numpy as np

# Odd multiplier of the set-index rotation (hashes the line's high bits).
_ROTATE = 40503


class L2Cache:
    def __init__(self, capacity_lines: int, ways: int):
        # A capacity that is not a whole number of sets gives its extra lines to the
        # ways (a small test L2 becomes fully associative rather than smaller).
        self.sets = max(1, capacity_lines // ways)
        self.ways = max(1, capacity_lines // self.sets)
        # Flat arrays, slot = set * ways + way: flat gathers and scatters are the
        # cheapest numpy has, and every access is a few of them.
        size = self.sets * self.ways
        self.tags = np.full(size, -1, np.int64)
        self.last_use = np.zeros(size, np.int64)
        self.dirty = np.zeros(size, bool)
        self.fill = np.full(size, -1, np.int64)  # index into self.fills; -1: arrived
        self.fills: list = []
        self.filled = np.ones(1024, bool)  # per fill index: has its event fired?
        self.clock = 0
        self._ways = np.arange(self.ways, dtype=np.int64)

    def _arrived(self, fill_id: int) -> None:
        self.filled[fill_id] = True
        self.fills[fill_id] = None  # nobody needs the event any more

    def set_of(self, lines: np.ndarray) -> np.ndarray:
        return (lines + (lines // self.sets * _ROTATE) % self.sets) % self.sets

    def access(self, lines: np.ndarray, write: bool, fill=None):
        """Touch `lines` (int64 line numbers, ascending, each once). Returns (hit mask,
        write-back mask: this line's miss evicted a dirty line, fills to wait for)."""
        fill_id = -1
        if fill is not None:
            fill_id = len(self.fills)
            self.fills.append(fill)
            if fill_id >= len(self.filled):
                self.filled = np.concatenate([self.filled, np.ones(len(self.filled), bool)])
            self.filled[fill_id] = False
            fill.callbacks.append(lambda _ev, i=fill_id: self._arrived(i))
        waits: list = []
        if len(lines) <= self.sets:
            hit, wb = self._piece(lines, write, fill_id, waits)
            return hit, wb, waits
        hit = np.empty(len(lines), bool)
        wb = np.empty(len(lines), bool)
        for lo in range(0, len(lines), self.sets):
            sl = slice(lo, lo + self.sets)
            hit[sl], wb[sl] = self._piece(lines[sl], write, fill_id, waits)
        return hit, wb, waits

    def _piece(self, lines: np.ndarray, write: bool, fill_id: int, waits: list):
        n = len(lines)
        first_use = self.clock + 1
        self.clock += n
        rows = (self.set_of(lines) * self.ways)[:, None] + self._ways  # each line's set, as slots
        match = self.tags.take(rows) == lines[:, None]
        hit = np.logical_or.reduce(match, axis=1)
        wb = np.zeros(n, bool)
        if hit.any():
            at = np.flatnonzero(hit)
            slots = rows[at, match[at].argmax(axis=1)]
            self.last_use.put(slots, first_use + at)
            if write:
                self.dirty.put(slots, True)
            pending = self.fill.take(slots)
            pending = pending[pending >= 0]
            pending = pending[~self.filled[pending]]
            if pending.size:
                for f in np.unique(pending).tolist():
                    if self.fills[f] not in waits:
                        waits.append(self.fills[f])
            if at.size == n:
                return hit, wb
            miss = np.flatnonzero(~hit)
            ml, mrows, mu = lines[miss], rows[miss], first_use + miss
        else:
            miss, ml, mrows, mu = None, lines, rows, first_use + np.arange(n)
        first_slot = mrows[:, 0]  # set * ways: identifies the set
        order = np.argsort(first_slot, kind="stable")
        sorted_sets = first_slot[order]
        if len(ml) < 2 or (sorted_sets[1:] != sorted_sets[:-1]).all():
            # Every missing line has a set of its own: it takes that set's LRU way.
            victims = first_slot + self.last_use.take(mrows).argmin(axis=1)
            wb_miss = (self.tags.take(victims) >= 0) & self.dirty.take(victims)
        else:
            victims, ml, mu, wb_miss = self._crowded(ml, mu, order, sorted_sets, write)
        if miss is None:
            wb = wb_miss
        else:
            wb[miss] = wb_miss
        self.tags.put(victims, ml)
        self.last_use.put(victims, mu)
        self.dirty.put(victims, write)
        self.fill.put(victims, fill_id)
        return hit, wb

    def _crowded(self, ml, mu, order, sorted_sets, write: bool):
        """Misses of one piece that share sets: the r-th miss of a set takes its r-th
        least recently used way; past `ways` misses, only the last `ways` stay (the
        earlier ones are evicted by the later ones, written back if dirty)."""
        ml, mu = ml[order], mu[order]
        uniq, first, counts = np.unique(sorted_sets, return_index=True, return_counts=True)
        per_miss = np.repeat(counts, counts)
        rank = np.arange(len(sorted_sets)) - np.repeat(first, counts)
        lru = np.argsort(self.last_use.take(uniq[:, None] + self._ways), axis=1, kind="stable")
        keep = rank >= per_miss - self.ways
        slot = (rank - np.maximum(per_miss - self.ways, 0))[keep]
        row = np.repeat(np.arange(len(uniq)), counts)[keep]
        victims = uniq[row] + lru[row, slot]
        wb_sorted = np.zeros(len(sorted_sets), bool)
        wb_sorted[np.flatnonzero(keep)] = (self.tags.take(victims) >= 0) & self.dirty.take(victims)
        if write:
            wb_sorted[~keep] = True
        wb_miss = np.empty(len(sorted_sets), bool)
        wb_miss[order] = wb_sorted
        return victims, ml[keep], mu[keep], wb_miss

    def dirty_lines(self) -> int:
        return int(((self.tags >= 0) & self.dirty).sum())
