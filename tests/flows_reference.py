"""The flow model as plain Python: what npusim.engine.flows computed before its
arithmetic moved to C (npusim/engine/_flows.c), kept as the statement the C code is
checked against (tests/test_engine_flows.py), operation for operation."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import simpy

from npusim.engine.cycles import whole_cycles
from npusim.engine.events import at_delay

# A flow counts as finished when what it still has to move would take less than
# this many cycles: completion times are rounded by whole_cycles(), which may land
# a hair (< 1e-6 cycle) before the exact end, and the clocks carry float rounding.
_DONE_SLACK_CYCLES = 1e-6


class _CapClass:
    __slots__ = ("cap", "rate", "clock", "heap", "count")

    def __init__(self, cap: float):
        self.cap = cap
        self.rate = 0.0
        self.clock = 0.0  # bytes received by each flow of this class so far
        self.heap: list = []  # (finish clock, seq, weight, on_done)
        self.count = 0  # flows in the class, weighted


class ReferenceLink:
    """npusim.engine.flows.Link, in Python."""

    def __init__(self, env: simpy.Environment, name: str, bytes_per_cycle: float, record: bool = True):
        self.env = env
        self.name = name
        self.capacity = bytes_per_cycle
        self.classes: dict[float, _CapClass] = {}
        self._order: list[_CapClass] = []  # classes by ascending cap
        self._t = 0.0
        self._seq = 0
        self._timer_at = math.inf
        self.record = record
        self.samples: list[tuple[float, float]] = []  # (cycle, bytes per cycle in use)

    # ---- public

    def add(self, nbytes: float, cap: float, on_done: Callable[[], None], weight: int = 1) -> None:
        """Start a flow of `nbytes` capped at `cap` bytes/cycle; call on_done when it ends."""
        self._advance()
        cls = self.classes.get(cap)
        if cls is None:
            cls = self.classes[cap] = _CapClass(cap)
            self._order = sorted(self.classes.values(), key=lambda c: c.cap)
        self._seq += 1
        heapq.heappush(cls.heap, (cls.clock + nbytes, self._seq, weight, on_done))
        cls.count += weight
        self._reschedule()

    @property
    def active(self) -> int:
        return sum(c.count for c in self._order)

    # ---- internals

    def _advance(self) -> None:
        dt = self.env.now - self._t
        if dt > 0:
            for cls in self._order:
                if cls.count:
                    cls.clock += cls.rate * dt
        self._t = self.env.now

    def _reschedule(self) -> None:
        """Share the link out again (water-filling over cap classes, smallest cap first)
        and set the timer to the next completion."""
        remaining = self.capacity
        order = self._order
        n = 0
        for cls in order:  # loops, not sum() of a generator: this runs on every flow start and end
            n += cls.count
        used = 0.0
        nxt = math.inf
        for cls in order:
            count = cls.count
            if not count:
                continue
            fair = remaining / n
            rate = cls.rate = cls.cap if cls.cap <= fair else fair
            remaining -= rate * count
            used += rate * count
            n -= count
            dt = (cls.heap[0][0] - cls.clock) / rate
            if dt < nxt:
                nxt = dt
        env = self.env
        if self.record:
            self.samples.append((env.now, used))
        if nxt is math.inf:
            self._timer_at = math.inf
            return
        when = whole_cycles(env.now + max(nxt, 0.0))
        if when == self._timer_at:
            return
        at_delay(env, when - env.now, lambda _ev, when=when: self._on_timer(when))
        self._timer_at = when  # once it is set: if it could not be, the next reschedule sets one

    def _ends_this_cycle(self, nbytes: float, rate: float) -> bool:
        """Would `nbytes` at `rate` end at the current cycle, as _reschedule rounds it?
        (Then no later timer could see it end: the flow is done now.)"""
        return whole_cycles(self.env.now + nbytes / rate) <= self.env.now

    def _on_timer(self, when: float) -> None:
        if when != self._timer_at:
            return  # superseded by a later reschedule
        self._timer_at = math.inf
        self._advance()
        finished = []
        for cls in self._order:
            heap = cls.heap
            done_at = cls.clock + cls.rate * _DONE_SLACK_CYCLES
            while heap and (heap[0][0] <= done_at or self._ends_this_cycle(heap[0][0] - cls.clock, cls.rate)):
                _, _, weight, on_done = heapq.heappop(heap)
                cls.count -= weight
                finished.append(on_done)
            if not cls.count:
                cls.clock = 0.0  # keep the clocks small; the class is empty
        self._reschedule()
        for on_done in finished:
            on_done()
