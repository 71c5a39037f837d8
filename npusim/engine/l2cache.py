"""The L2: a memory-side cache shared by all cores (set-associative, LRU, write-back,
write-allocate), counted in lines of hw.l2.line_bytes.

State is held in flat numpy arrays of sets x ways slots (tag, last use, dirty,
pending fill), and one access handles all the lines of a transfer (every segment
of a strided copy, every block of a group) with a few array operations, so the
cost of a transfer grows with its lines at array speed, not at Python speed.

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

Speed (none of this changes a result; tests compare with the rules written out
line by line): an access pays a fixed numpy cost per array operation, so the
common cases take few of them.
- Most accesses re-read resident lines (a tile read again by the next block, a
  workspace written then read back). Comparing a line with every way of its set
  is the expensive part, so a direct-mapped *hint* table remembers, per line
  number modulo its size, the slot where that line was last found or placed. A
  hint is trusted only when the slot's tag is that very line (a line is in at
  most one slot); a stale or colliding hint sends the line to the full search.
- The full search gathers whole sets as rows of (sets, ways) views; an access
  that hits nowhere skips the per-line bookkeeping of hits.
- Misses that all fall in different sets (always so for ascending lines within
  one rotation block) take their set's LRU way directly; only misses sharing a
  set need the sort of the crowded case.
"""

from __future__ import annotations

import numpy as np

# Odd multiplier of the set-index rotation (hashes the line's high bits).
_ROTATE = 40503
# Hint table entries per cache slot (rounded up to a power of two): enough that a
# working set as large as the cache rarely collides in it; 4 bytes per entry.
_HINTS_PER_SLOT = 2
# numpy bools are one byte each: eight of them make a 64-bit word.
_BOOLS_PER_WORD = 8
# Fill index meaning "no fill pending" (write-allocated lines, lines long arrived).
_ARRIVED = 0


class L2Cache:
    def __init__(self, capacity_lines: int, ways: int):
        # A capacity that is not a whole number of sets gives its extra lines to the
        # ways (a small test L2 becomes fully associative rather than smaller).
        self.sets = max(1, capacity_lines // ways)
        self.ways = max(1, capacity_lines // self.sets)
        # Flat arrays, slot = set * ways + way: flat gathers and scatters are the
        # cheapest numpy has, and every access is a few of them. A set's ways are
        # one row of the (sets, ways) views: gathering whole rows by set is a copy
        # of contiguous memory, much cheaper than gathering its slots one by one.
        size = self.sets * self.ways
        self.tags = np.full(size, -1, np.int64)
        self.last_use = np.zeros(size, np.int64)
        self._tag_rows = self.tags.reshape(self.sets, self.ways)
        self._use_rows = self.last_use.reshape(self.sets, self.ways)
        self.dirty = np.zeros(size, bool)
        self.fill = np.full(size, _ARRIVED, np.int64)  # index into self.fills
        self.fills: list = [None]  # per fill index: its event, None once it has fired
        self.filled = np.ones(1024, bool)  # per fill index: has its event fired?
        self.in_flight = 0  # fills whose event has not fired yet
        self.clock = 0
        self._new_fill = self._fill_event = None  # the fill of the access in progress (see access)
        self._missed = None  # where the access in progress lists its missed lines (see access)
        self._fill_id = _ARRIVED
        self._steps = np.arange(self.sets, dtype=np.int64)  # 0, 1, ...: a piece's lines in order
        self._marks = np.zeros(self.sets, np.int64)  # scratch: which line of a piece last marked each set
        hints = 1 << int(_HINTS_PER_SLOT * size - 1).bit_length()
        self._hint_mask = hints - 1
        self._hint = np.zeros(hints, np.int32 if size < 2**31 else np.int64)

    def _arrived(self, fill_id: int) -> None:
        self.filled[fill_id] = True
        self.fills[fill_id] = None  # nobody needs the event any more
        self.in_flight -= 1

    def set_of(self, lines: np.ndarray) -> np.ndarray:
        return (lines + (lines // self.sets * _ROTATE) % self.sets) % self.sets

    def access(self, lines: np.ndarray, write: bool, new_fill=None, ascending: bool = True,
               missed: list | None = None):
        """Touch `lines` (int64 line numbers, each once; `ascending` if in ascending
        order, which lets a short run find its sets without sorting). `new_fill()`
        makes the event of the fill bringing the missed lines of a read; it is called
        only if some line misses. Returns (lines that hit, write-back mask or None if
        there is none: this line's miss evicted a dirty line, fills to wait for, the
        fill event made or None). `missed`: if a list, the positions (in `lines`) of
        the lines that missed are appended to it, as arrays."""
        self._new_fill, self._fill_event, self._fill_id = new_fill, None, _ARRIVED
        self._missed = missed
        waits: list = []
        if len(lines) <= self.sets:
            hits, wb = self._piece(lines, write, waits, ascending, 0)
            return hits, wb, waits, self._fill_event
        hits, wb = 0, None
        for lo in range(0, len(lines), self.sets):
            piece_hits, piece_wb = self._piece(lines[lo:lo + self.sets], write, waits, ascending, lo)
            hits += piece_hits
            if piece_wb is not None:
                if wb is None:
                    wb = np.zeros(len(lines), bool)
                wb[lo:lo + self.sets] = piece_wb
        return hits, wb, waits, self._fill_event

    def _miss_fill_id(self) -> int:
        """The fill index the missed lines of the current access get (made on first use)."""
        if self._new_fill is not None and self._fill_event is None:
            self._fill_event = self._new_fill()
            self._fill_id = self._register(self._fill_event)
        return self._fill_id

    def _register(self, fill) -> int:
        """Give a fill event an index; it is marked arrived when the event fires."""
        fill_id = len(self.fills)
        self.fills.append(fill)
        if fill_id >= len(self.filled):
            self.filled = np.concatenate([self.filled, np.ones(len(self.filled), bool)])
        self.filled[fill_id] = False
        self.in_flight += 1
        fill.callbacks.append(lambda _ev, i=fill_id: self._arrived(i))
        return fill_id

    def _piece(self, lines: np.ndarray, write: bool, waits: list, ascending: bool, at: int):
        """One piece of an access (see access), its first line at position `at` of the
        access: (lines that hit, write-back mask or None)."""
        n = len(lines)
        uses = self._steps[:n] + (self.clock + 1)  # line i is used at uses[i]
        self.clock += n
        hint_at = lines & self._hint_mask
        slots = self._hint[hint_at]
        known = self.tags[slots] == lines  # hinted slot holds the line: a hit there
        n_known = int(np.count_nonzero(known))
        if n_known == n:
            self._hits(slots, uses, write, waits)
            return n, None
        # The other lines: compare with every way of their set.
        unknown = np.flatnonzero(~known) if n_known else None
        look = lines if unknown is None else lines[unknown]
        set_ids, distinct = self._sets_of(look, ascending)
        match = self._tag_rows.take(set_ids, axis=0) == look[:, None]  # line x way of its set
        if unknown is None and not match.any():  # all miss: no hits to record
            hits, miss_at, ml, mu = 0, None, lines, uses
        else:
            found = self._any_way(match)
            if unknown is None:
                unknown = self._steps[:n]
            found_at = unknown[found]
            found_slots = set_ids[found] * self.ways + match[found].argmax(axis=1)
            self._hint[hint_at[found_at]] = found_slots
            known_at = np.flatnonzero(known)
            self._hits(np.concatenate([slots[known_at], found_slots]), uses[np.concatenate([known_at, found_at])],
                       write, waits)
            hits = n_known + len(found_at)
            if hits == n:
                return n, None
            lost = ~found
            miss_at = unknown[lost]
            ml, mu, set_ids = look[lost], uses[miss_at], set_ids[lost]
        if self._missed is not None:
            self._missed.append(at + (self._steps[:n] if miss_at is None else miss_at))
        victims, ml, mu, wb_miss = self._victims(ml, mu, set_ids, distinct, write)
        self.tags[victims] = ml
        self.last_use[victims] = mu
        self.dirty[victims] = write
        self.fill[victims] = self._miss_fill_id()
        self._hint[hint_at if ml is lines else ml & self._hint_mask] = victims  # every line missed, in order
        if not wb_miss.any():
            return hits, None
        if miss_at is None:
            return hits, wb_miss
        wb = np.zeros(n, bool)
        wb[miss_at] = wb_miss
        return hits, wb

    def _any_way(self, match: np.ndarray) -> np.ndarray:
        """Per row of a (lines, ways) bool matrix: is any element set? A row of 8k
        ways is k 64-bit words, and OR-ing word columns is much cheaper than numpy's
        reduction along a short axis."""
        words = self.ways // _BOOLS_PER_WORD
        if self.ways % _BOOLS_PER_WORD or not words:
            return np.logical_or.reduce(match, axis=1)
        packed = match.view(np.uint64)
        acc = packed[:, 0]
        for j in range(1, words):
            acc = acc | packed[:, j]
        return acc != 0

    def _sets_of(self, lines: np.ndarray, ascending: bool) -> tuple[np.ndarray, bool]:
        """(set of each line, True if they are known to be all different). Ascending
        lines within one block of `sets` consecutive line numbers share one rotation:
        their sets are a rotated run, all different."""
        sets = self.sets
        if ascending:
            first, last = int(lines[0]), int(lines[-1])
            block = first // sets
            if last // sets == block:
                if last - first == len(lines) - 1:  # a contiguous run: its sets count up from the first, wrapping
                    start = (first + block * _ROTATE % sets) % sets
                    ids = self._steps[:len(lines)] + start
                    if start + len(lines) > sets:
                        ids[sets - start:] -= sets
                    return ids, True
                return (lines + block * _ROTATE % sets) % sets, True
        return self.set_of(lines), False

    def _victims(self, ml, mu, set_ids, distinct: bool, write: bool):
        """Where the missing lines `ml` (used at `mu`, in sets `set_ids`) go. Returns
        (slots, the lines that stay and their uses, write-back mask of ml)."""
        if not distinct and len(ml) > 1:
            # Each line marks its set with its index: a set marked over by another
            # line of the piece is shared (cheaper than sorting to find out).
            at = self._steps[:len(ml)]
            self._marks[set_ids] = at
            if not (self._marks[set_ids] == at).all():
                return self._crowded(ml, mu, set_ids, write)
        # Every missing line has a set of its own: it takes that set's LRU way.
        victims = set_ids * self.ways + self._use_rows.take(set_ids, axis=0).argmin(axis=1)
        # An empty slot is never dirty, so a dirty victim holds a line to write back.
        return victims, ml, mu, self.dirty[victims]

    def _hits(self, slots: np.ndarray, uses: np.ndarray, write: bool, waits: list) -> None:
        """Hit lines at `slots` become used at `uses` (dirty if written); the fills
        still bringing any of them are added to `waits`, oldest first."""
        self.last_use[slots] = uses
        if write:
            self.dirty[slots] = True
        if not self.in_flight:
            return
        fills = self.fill[slots]
        arrived = self.filled[fills]
        if arrived.all():
            return
        pending = fills[~arrived]
        first = pending[0]
        # usually one fill brings them all: skip the sort of np.unique then
        ids = [int(first)] if (pending == first).all() else np.unique(pending).tolist()
        for f in ids:
            if self.fills[f] not in waits:
                waits.append(self.fills[f])

    def _crowded(self, ml, mu, set_ids, write: bool):
        """Misses of one piece that share sets: the r-th miss of a set takes its r-th
        least recently used way; past `ways` misses, only the last `ways` stay (the
        earlier ones are evicted by the later ones, written back if dirty)."""
        order = np.argsort(set_ids, kind="stable")
        sorted_sets = set_ids[order]
        ml, mu = ml[order], mu[order]
        uniq, first, counts = np.unique(sorted_sets, return_index=True, return_counts=True)
        per_miss = np.repeat(counts, counts)
        rank = np.arange(len(sorted_sets)) - np.repeat(first, counts)
        lru = np.argsort(self._use_rows.take(uniq, axis=0), axis=1, kind="stable")
        keep = rank >= per_miss - self.ways
        slot = (rank - np.maximum(per_miss - self.ways, 0))[keep]
        row = np.repeat(np.arange(len(uniq)), counts)[keep]
        victims = uniq[row] * self.ways + lru[row, slot]
        wb_sorted = np.zeros(len(sorted_sets), bool)
        wb_sorted[np.flatnonzero(keep)] = self.dirty[victims]  # an empty slot is never dirty
        if write:
            wb_sorted[~keep] = True
        wb_miss = np.empty(len(sorted_sets), bool)
        wb_miss[order] = wb_sorted
        return victims, ml[keep], mu[keep], wb_miss

    def find(self, lines: np.ndarray) -> np.ndarray:
        """The slot holding each line (distinct line numbers), -1 where it is not cached;
        looks only (no use is recorded)."""
        slots = np.full(len(lines), -1, np.int64)
        hinted = self._hint[lines & self._hint_mask]
        known = self.tags[hinted] == lines
        slots[known] = hinted[known]
        rest = np.flatnonzero(~known)
        if len(rest):
            sets = self.set_of(lines[rest])
            match = self._tag_rows.take(sets, axis=0) == lines[rest][:, None]
            found = self._any_way(match)
            slots[rest[found]] = sets[found] * self.ways + match[found].argmax(axis=1)
        return slots

    def dirty_lines(self) -> int:
        return int(((self.tags >= 0) & self.dirty).sum())
