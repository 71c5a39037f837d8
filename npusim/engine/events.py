"""Cheap events for the device's hot paths, in SimPy's own event order.

A K3 decode step schedules about 200,000 events: a DMA transfer's start after its
start-up, the link timers of the flow model, a transfer's end, an L2 fill's
arrival, a flag a pipe waits for. SimPy's Event and Timeout carry what a general
simulation needs (an environment, a pending value, failure and defusing); these
need none of it. A Signal is what Environment.step and Process._resume read of an
event (`callbacks`, `_ok`, `_value`) and nothing else, and it is put into the
environment's queue exactly as SimPy puts its own events (now + delay, NORMAL
priority, the next id of the same counter), so the order of everything that
happens - and with it every result - is the same as with SimPy's events.

Environment.run() without `until` (the engine's only use) steps through the queue
in one loop, as SimPy's step() does one event at a time.
"""

from __future__ import annotations

import gc
from heapq import heappop, heappush

import simpy
from simpy.core import NORMAL


class Signal:
    """An event that a process may yield or that callbacks may hang on; fire() puts
    it into the queue (it is processed, its callbacks called, in SimPy's order)."""

    __slots__ = ("env", "callbacks", "_ok", "_value")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.callbacks: list | None = []
        self._ok = True  # a Signal never fails
        self._value = None

    def fire(self, value=None) -> None:
        """Schedule it now with `value`, as Event.succeed(value) would."""
        self._value = value
        env = self.env
        heappush(env._queue, (env._now, NORMAL, next(env._eid), self))


def after(env: simpy.Environment, delay: float) -> Signal:
    """A Signal that fires `delay` cycles from now, where a Timeout made now would (a
    process yields it to sleep that long)."""
    sig = Signal(env)
    heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), sig))
    return sig


def at_delay(env: simpy.Environment, delay: float, callback) -> None:
    """Call callback(signal) `delay` cycles from now, where a Timeout made now would fire."""
    after(env, delay).callbacks.append(callback)


# Allocations between two collections of the youngest garbage-collector generation
# while the queue runs (CPython's default: 700). A step makes millions of short-lived
# events, tuples and closures, few of them in reference cycles; collecting every 700
# walked them over and over, and every tenth collection the older ones too: about a
# tenth of a K3 decode step. It costs a few MiB of peak memory (measured by
# benchmarks/bench_step.py).
_GC_YOUNG_ALLOCATIONS = 50_000


class Environment(simpy.Environment):
    """SimPy's environment with run() (no `until`) as one loop over the queue."""

    def run(self, until=None):
        if until is not None:
            return super().run(until)
        young, *older = gc.get_threshold()
        if young:  # 0: the collector is off, and stays off
            gc.set_threshold(max(young, _GC_YOUNG_ALLOCATIONS), *older)
        try:
            self._run_queue()
        finally:
            gc.set_threshold(young, *older)
        return None

    def _run_queue(self) -> None:
        queue = self._queue
        while queue:
            self._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                # as Environment.step: a process that failed ends the run with a copy of its error
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc
