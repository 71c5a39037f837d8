"""The L2: a memory-side cache shared by all cores (LRU, write-back, write-allocate).

Counted in lines (hw.l2.line_bytes). Tracking every line of a 192 MiB cache one
by one would cost a dict entry per line and a Python step per line touched, so
the cache holds *extents*: runs of consecutive lines last touched together. An
access splits the extents it overlaps, counts the overlapped lines as hits, and
records itself as the newest extent. Eviction takes the least recently used
extent first, trimming it from its low end when only part must go (lines of one
access are taken as touched in address order). Evicted dirty lines are the
write-back traffic to HBM.

Each extent remembers its *owner* (who touched it: one GM tensor as seen by one
core of one kernel) and the
*fill* event of the read that brought it in. An access continuing the owner's
own extent (a stream) extends it instead of adding one, which keeps the cache
small; data of other owners never merges, so a neighbour in memory does not look
recent. A hit on lines whose fill is still in flight waits for that fill (the
data is not there yet): blocks reading the same cold data all wait for HBM.

Assumptions: fully associative (no set conflicts); a write allocates its lines
without reading HBM (whole-line writes); a stream extended by its owner takes the
newest stamp as a whole (its older lines still leave first, from the low end).
"""

from __future__ import annotations

import bisect
import heapq

# An access longer than capacity / _CHUNKS_PER_CAPACITY lines is applied in pieces,
# so that its own front part can evict lines before its back part looks them up
# (true LRU order inside one huge transfer). Smaller accesses are applied at once.
_CHUNKS_PER_CAPACITY = 16

# Extent fields: [end line (exclusive), dirty, stamp, owner, fill event or None,
# first line the fill brings (lines below it had arrived before)]
_END, _DIRTY, _STAMP, _OWNER, _FILL, _FILL_FROM = range(6)


class L2Cache:
    def __init__(self, capacity_lines: int):
        self.capacity = capacity_lines
        self.used = 0
        self.extents: dict[int, list] = {}  # start line -> extent
        self.starts: list[int] = []  # sorted keys of `extents`
        self.lru: list[tuple[int, int]] = []  # heap of (stamp, start); stale entries skipped
        self.stamp = 0
        self.chunk = max(1, capacity_lines // _CHUNKS_PER_CAPACITY)

    def access(self, first: int, end: int, write: bool, owner=None, fill=None):
        """Touch lines [first, end). `fill`: the event that fires when a read's missing
        lines have arrived. Returns (hit lines, dirty lines written back, fills to wait for)."""
        waits: list = []
        if end - first <= self.chunk:
            return (*self._access(first, end, write, owner, fill, waits), waits)
        hits = written_back = 0
        for lo in range(first, end, self.chunk):
            h, wb = self._access(lo, min(end, lo + self.chunk), write, owner, fill, waits)
            hits += h
            written_back += wb
        return hits, written_back, waits

    def _access(self, first: int, end: int, write: bool, owner, fill, waits: list) -> tuple[int, int]:
        self.stamp += 1
        starts, extents = self.starts, self.extents
        i = bisect.bisect_right(starts, first) - 1
        if i >= 0:
            below = extents[starts[i]]
            if (below[_END] == first and below[_OWNER] == owner and below[_DIRTY] == write
                    and (below[_FILL] is None or below[_FILL].triggered or fill is None)
                    and (i + 1 == len(starts) or starts[i + 1] >= end)):
                # Fast path: the owner's stream continues into lines nobody holds. An
                # extent waits on one fill at most: the new one, for the new lines.
                below[_END], below[_STAMP] = end, self.stamp
                if fill is not None:
                    below[_FILL], below[_FILL_FROM] = fill, first
                heapq.heappush(self.lru, (self.stamp, starts[i]))
                self.used += end - first
                return 0, self._evict()
            if below[_END] <= first:
                i += 1
        else:
            i = 0
        hits = 0
        pieces = []  # overlapped (lo, hi, dirty, fill) pieces, re-stamped as this access
        while i < len(starts) and starts[i] < end:
            s = starts[i]
            e, dirty, stamp, own, ext_fill, fill_from = extents[s]
            lo, hi = max(s, first), min(e, end)
            hits += hi - lo
            pending = ext_fill is not None and not ext_fill.triggered and hi > fill_from
            if pending and ext_fill not in waits:
                waits.append(ext_fill)
            pieces.append((lo, hi, dirty or write, ext_fill if pending else None, max(lo, fill_from)))
            del extents[s]
            del starts[i]
            self.used -= e - s
            if s < lo:  # the part below keeps its age
                self._insert(s, lo, dirty, stamp, own, ext_fill, fill_from)
                i += 1
            if hi < e:  # the part above keeps its age
                self._insert(hi, e, dirty, stamp, own, ext_fill, fill_from)
                i += 1
        # The access becomes the newest data: gaps arrive with this access's fill and
        # are dirty if written; overlapped pieces keep their dirtiness and pending fill.
        cursor = first
        for lo, hi, dirty, ext_fill, fill_from in pieces + [(end, end, write, fill, end)]:
            if cursor < lo:
                self._insert(cursor, lo, write, self.stamp, owner, fill, cursor)
            if lo < hi:
                self._insert(lo, hi, dirty, self.stamp, owner, ext_fill, fill_from)
            cursor = hi
        return hits, self._evict()

    def _insert(self, s: int, e: int, dirty: bool, stamp: int, owner, fill, fill_from: int) -> None:
        self.extents[s] = [e, dirty, stamp, owner, fill, fill_from]
        bisect.insort(self.starts, s)
        heapq.heappush(self.lru, (stamp, s))
        self.used += e - s
        if len(self.lru) > 4 * len(self.extents) + 1024:  # drop stale entries now and then
            self.lru = [(ext[_STAMP], k) for k, ext in self.extents.items()]
            heapq.heapify(self.lru)

    def _evict(self) -> int:
        written_back = 0
        while self.used > self.capacity:
            stamp, s = heapq.heappop(self.lru)
            ext = self.extents.get(s)
            if ext is None or ext[_STAMP] != stamp:
                continue  # stale heap entry
            e = ext[_END]
            drop = min(e - s, self.used - self.capacity)
            idx = bisect.bisect_left(self.starts, s)
            del self.extents[s]
            if drop < e - s:  # trim the low end; the extent keeps its place in `starts`
                self.starts[idx] = s + drop
                self.extents[s + drop] = ext
                heapq.heappush(self.lru, (stamp, s + drop))
            else:
                del self.starts[idx]
            self.used -= drop
            if ext[_DIRTY]:
                written_back += drop
        return written_back

    def dirty_lines(self) -> int:
        return sum(ext[_END] - s for s, ext in self.extents.items() if ext[_DIRTY])
