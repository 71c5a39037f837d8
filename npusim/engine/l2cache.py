"""The L2: a memory-side cache shared by all cores (LRU, write-back, write-allocate).

Counted in lines (hw.l2.line_bytes). Tracking every line of a 192 MiB cache one
by one would cost a dict entry per line and a Python step per line touched, so
the cache holds *extents*: runs of consecutive lines last touched by the same
access. An access splits the extents it overlaps, counts the overlapped lines as
hits, and records itself as the newest extent. Eviction takes the least recently
used extent first, trimming it from its low end when only part must go (lines of
one access are taken as touched in address order). Evicted dirty lines are the
write-back traffic to HBM.

Assumptions: no associativity conflicts (fully associative); a write allocates its
lines without reading HBM (whole-line writes).
"""

from __future__ import annotations

import bisect
import heapq


class L2Cache:
    def __init__(self, capacity_lines: int):
        self.capacity = capacity_lines
        self.used = 0
        # start line -> [end line (exclusive), dirty, stamp]
        self.extents: dict[int, list] = {}
        self.starts: list[int] = []  # sorted keys of `extents`
        self.lru: list[tuple[int, int]] = []  # heap of (stamp, start); stale entries skipped
        self.stamp = 0

    def access(self, first: int, end: int, write: bool) -> tuple[int, int]:
        """Touch lines [first, end). Returns (hit lines, dirty lines written back to HBM)."""
        self.stamp += 1
        hits = 0
        starts, extents = self.starts, self.extents
        i = bisect.bisect_right(starts, first) - 1
        if i >= 0:
            below = extents[starts[i]]
            if below[0] == first and below[1] == write and (i + 1 == len(starts) or starts[i + 1] >= end):
                # Fast path: a stream continuing where it left off, into lines nobody holds.
                below[0], below[2] = end, self.stamp
                heapq.heappush(self.lru, (self.stamp, starts[i]))
                self.used += end - first
                return 0, self._evict()
        if i < 0 or extents[starts[i]][0] <= first:
            i += 1
        pieces_dirty = []  # overlapped (start, end, dirty) pieces, re-stamped as one access
        while i < len(starts) and starts[i] < end:
            s = starts[i]
            e, dirty, stamp = extents[s]
            lo, hi = max(s, first), min(e, end)
            hits += hi - lo
            pieces_dirty.append((lo, hi, dirty))
            del extents[s]
            del starts[i]
            self.used -= e - s
            if s < lo:  # the part below keeps its age
                self._insert(s, lo, dirty, stamp)
                i += 1
            if hi < e:  # the part above keeps its age
                self._insert(hi, e, dirty, stamp)
                i += 1
        # The access itself becomes the newest data: gaps are clean unless written,
        # overlapped pieces keep their dirtiness (or become dirty if written).
        runs: list[list] = []  # [lo, hi, dirty], adjacent runs of equal dirtiness merged
        cursor = first
        for lo, hi, dirty in pieces_dirty + [(end, end, write)]:
            for a, b, d in ((cursor, lo, write), (lo, hi, dirty or write)):
                if a < b:
                    if runs and runs[-1][2] == d:
                        runs[-1][1] = b
                    else:
                        runs.append([a, b, d])
            cursor = hi
        for lo, hi, dirty in runs:
            self._insert(lo, hi, dirty, self.stamp)
        self._merge_with_previous(first)
        return hits, self._evict()

    def _merge_with_previous(self, first: int) -> None:
        """Streaming makes each access start where an earlier one ended: join the two
        when their dirtiness agrees, so a stream stays one extent and the cache stays
        small. # assumption: the joined extent takes the newer stamp; eviction trims it
        from the low end, so within a stream the older lines still leave first.
        """
        i = bisect.bisect_left(self.starts, first)
        if i == 0:
            return
        below = self.starts[i - 1]
        prev = self.extents[below]
        cur = self.extents[first]
        if prev[0] == first and prev[1] == cur[1]:
            del self.extents[first]
            del self.starts[i]
            prev[0], prev[2] = cur[0], self.stamp
            heapq.heappush(self.lru, (self.stamp, below))

    def _insert(self, s: int, e: int, dirty: bool, stamp: int) -> None:
        self.extents[s] = [e, dirty, stamp]
        bisect.insort(self.starts, s)
        heapq.heappush(self.lru, (stamp, s))
        self.used += e - s
        if len(self.lru) > 4 * len(self.extents) + 1024:  # drop stale entries now and then
            self.lru = [(ext[2], k) for k, ext in self.extents.items()]
            heapq.heapify(self.lru)

    def _evict(self) -> int:
        written_back = 0
        while self.used > self.capacity:
            stamp, s = heapq.heappop(self.lru)
            ext = self.extents.get(s)
            if ext is None or ext[2] != stamp:
                continue  # stale heap entry
            e, dirty, _ = ext
            drop = min(e - s, self.used - self.capacity)
            idx = bisect.bisect_left(self.starts, s)
            del self.extents[s]
            if drop < e - s:  # trim the low end; the extent keeps its place in `starts`
                self.starts[idx] = s + drop
                self.extents[s + drop] = [e, dirty, stamp]
                heapq.heappush(self.lru, (stamp, s + drop))
            else:
                del self.starts[idx]
            self.used -= drop
            if dirty:
                written_back += drop
        return written_back

    def dirty_lines(self) -> int:
        return sum(e - s for s, (e, dirty, _) in self.extents.items() if dirty)
