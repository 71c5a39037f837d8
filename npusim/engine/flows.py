"""Shared bandwidth links with a flow model.

Every transfer in flight on a link is a flow. When a flow starts or ends, the
rates of all flows are recomputed by max-min fair sharing (water-filling): each
flow gets an equal share of the link, except that no flow exceeds its own cap (its
core's port rate), and what a capped flow leaves is shared by the others. The next
completion is then scheduled as one SimPy timeout. No per-byte or per-burst
events.

Flows with the same cap always get the same rate, so each cap class keeps a
"virtual clock": the bytes one flow of that class has received since the class
was created. A flow finishes when its class clock reaches its start value plus its
bytes, which makes every start and end O(log n) instead of O(n).

Completions are rounded up to whole cycles (the engine's time unit). A flow whose
rest would end within the current whole cycle is finished by the timer that
found it: at a very slow rate the clock reaches values where a fraction of a
cycle no longer changes it (floats), and waiting for that fraction would never
move time forward.

The arithmetic and the timers run in C (_flows.c: a K3 prefill starts and ends
over a million flows, and in Python the sharing was a sixth of its simulation),
with the same operations in the same order, so the same results;
tests/flows_reference.py states it in Python and the tests hold the two to each
other.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from npusim.engine._flows import Flows
from npusim.engine.cycles import whole_cycles
from npusim.engine.events import at_delay


class Link:
    """A bandwidth-limited link (HBM, L2, PCIe) shared by all transfers in flight.

    add(nbytes, cap, on_done, weight=1) starts a flow of `nbytes` capped at `cap`
    bytes/cycle (standing for `weight` alike flows); on_done() is called when it ends.
    It is the C Flows' start: the arithmetic and the link's timer (one per reschedule,
    set with events.at_delay) run without a Python frame."""

    def __init__(self, env: simpy.Environment, name: str, bytes_per_cycle: float, record: bool = True):
        self.env = env
        self.name = name
        self.capacity = bytes_per_cycle
        self.samples: list[tuple[float, float]] = []  # (cycle, bytes per cycle in use)
        self._flows = Flows(bytes_per_cycle, self.samples if record else None, whole_cycles, env, at_delay)
        self.add: Callable[..., None] = self._flows.start

    @property
    def active(self) -> int:
        return self._flows.active
