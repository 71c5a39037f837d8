"""The L2: a memory-side cache shared by all cores (set-associative, LRU, write-back,
write-allocate), counted in lines of hw.l2.line_bytes.

State is held in flat numpy arrays of sets x ways slots (tag, last use, dirty,
pending fill), and one access handles all the lines of a transfer (every segment
of a strided copy, every block of a group). A slot's tag is its line number divided
by the number of sets (with the set, it names the line; -1: empty); tags and fill
indices are 32-bit (_l2.c says why), so lines go up to 2^31 x sets - 1: with
512-byte lines and 24,576 sets, 2^31 x 12 MiB of addresses. Last uses are 32-bit
values whose order within a set is the LRU order: when the clock outgrows them,
each set's are replaced by their ranks (`use_max`: the largest value kept; tests
make it small to re-rank often).

- The set of a line is its address modulo the sets, rotated by a hash of the
  higher address bits (real L2s hash the index so that power-of-two strides do
  not pile onto a few sets); a contiguous run still spreads evenly over the sets.
- Within one access, lines are used in the order given (a transfer gives them in
  address order): a later line is more recent. An access longer than the number of sets is applied in pieces of that
  size, so its own front part can evict lines before its back part looks them up.
- A read that misses records the event of its fill (the HBM flow bringing the
  line); a later access that hits a line whose fill is still in flight must wait
  for it - blocks reading the same cold data all wait for HBM.

Assumptions: a write allocates its lines without reading HBM (whole-line writes);
within one piece, hits and misses are decided against the state at its start;
per set, the r-th miss of a piece takes the r-th least recently used way (the
lowest way first among equals), and past `ways` misses only the last `ways` stay
(the earlier ones are evicted by the later ones: written back if written).

The line walk itself (lookups, LRU victims, write-backs, the fills hits wait
for) runs in C (_l2.c): a transfer touches up to tens of thousands of lines, and
per line it is a few comparisons - at array speed in numpy it was still half of a
K3 decode step's simulation time, and a replayed kernel's footprint larger than
the cache took seconds. The state stays in numpy arrays here.
"""

from __future__ import annotations

import numpy as np

from npusim.engine._l2 import Core

# Odd multiplier of the set-index rotation (hashes the line's high bits).
_ROTATE = 40503
# Fill index meaning "no fill pending" (write-allocated lines, lines long arrived).
_ARRIVED = 0


class L2Cache:
    def __init__(self, capacity_lines: int, ways: int, use_max: int = (1 << 31) - 1):
        # A capacity that is not a whole number of sets gives its extra lines to the
        # ways (a small test L2 becomes fully associative rather than smaller).
        self.sets = max(1, capacity_lines // ways)
        self.ways = max(1, capacity_lines // self.sets)
        size = self.sets * self.ways  # slot = set * ways + way
        self.tags = np.full(size, -1, np.int32)  # line // sets
        self.last_use = np.zeros(size, np.int32)  # its order within a set is the LRU order
        self.dirty = np.zeros(size, bool)
        self.fill = np.full(size, _ARRIVED, np.int32)  # index into self.fills
        self.fills: list = [None]  # per fill index: its event, None once it has fired
        self._core = Core(self.tags, self.last_use, self.dirty.view(np.uint8), self.fill, self.sets, self.ways,
                          _ROTATE, use_max)

    @property
    def clock(self) -> int:
        """Lines used so far (line i of an access is used at the clock before it + 1 + i)."""
        return self._core.clock

    def _arrived(self, fill_id: int) -> None:
        self.fills[fill_id] = None  # nobody needs the event any more
        self._core.arrived(fill_id)

    def set_of(self, lines: np.ndarray) -> np.ndarray:
        return (lines + (lines // self.sets * _ROTATE) % self.sets) % self.sets

    def access(self, lines: np.ndarray, write: bool, new_fill=None, missed: bool = False, shift: int = 0):
        """Touch `lines` + `shift` (line numbers, each once; a contiguous int64 array).
        `new_fill()` makes the event of the fill bringing the missed lines of a read; it
        is called only if some line misses. Returns (lines that hit, write-back mask or
        None if there is none: this line's miss evicted a dirty line, fills to wait for
        (oldest first), the fill event made or None, and if `missed` the positions in
        `lines` of the lines that missed, else None)."""
        fill_id = len(self.fills) if new_fill is not None else _ARRIVED
        hits, wb, waits, at, any_miss = self._core.access(lines, write, fill_id, missed, shift)
        fill, waits = self.after_access(any_miss and new_fill is not None, new_fill, waits)
        return (hits, None if wb is None else np.frombuffer(wb, bool), waits, fill,
                None if at is None else np.frombuffer(at, np.int64))

    def after_access(self, filling: bool, new_fill, waits: list) -> tuple:
        """After the walk of an access (here or in memory.py's C transfer start): the event of
        its fill, made by new_fill() if `filling` (a read that missed; its fill id is the
        one the walk was given, len(fills)), or None; and the events of the fill ids it
        waits for."""
        fill = None
        if filling:
            fill_id = len(self.fills)
            fill = new_fill()
            self.fills.append(fill)
            fill.callbacks.append(lambda _ev, i=fill_id: self._arrived(i))
        if waits:
            waits = [self.fills[f] for f in waits]
        return fill, waits

    def find(self, lines: np.ndarray) -> np.ndarray:
        """The slot holding each line (distinct line numbers), -1 where it is not cached;
        looks only (no use is recorded)."""
        return np.frombuffer(self._core.find(np.ascontiguousarray(lines, np.int64)), np.int64)

    def dirty_lines(self) -> int:
        return int(((self.tags >= 0) & self.dirty).sum())
