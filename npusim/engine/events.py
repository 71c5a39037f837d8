"""The engine's SimPy environment, and cheap events for the device's hot paths, in
SimPy's own event order.

A K3 decode step schedules about 200,000 events: a DMA transfer's start after its
start-up, the link timers of the flow model, a transfer's end, an L2 fill's
arrival, a flag a pipe waits for. SimPy's Event and Timeout carry what a general
simulation needs (an environment, a pending value, failure and defusing); these
need none of it. A Signal (Signal(env), made in C) is what the queue's loop and
Process._resume read of an event (`env`, `callbacks`, `_ok`, `_value`) and nothing
else; sig.fire(value) schedules it now, after(env, delay) makes one that fires
`delay` from now and at_delay(env, delay, callback) one that calls callback. It is
scheduled exactly as SimPy schedules its own events (now +
delay, NORMAL priority, after everything scheduled before it), so the order of
everything that happens - and with it every result - is the same as with SimPy's
events.

The environment keeps its queue in C (_queue.c): the same order as SimPy's heap of
(time, priority, id, event) tuples, compared without building or comparing tuples,
and run() (without `until`, the engine's only use) processes it in one C loop, as
SimPy's step() does one event at a time. schedule(), step() and peek() use that
queue, so SimPy's own events and processes run on it unchanged.
"""

from __future__ import annotations

import simpy
from simpy.core import NORMAL, EmptySchedule, Infinity

from npusim.collector import fewer_collections
from npusim.engine._queue import Queue, Signal, after, at_delay

__all__ = ["Environment", "Signal", "after", "at_delay"]


class Environment(simpy.Environment):
    """SimPy's environment on the C queue; run() without `until` is one C loop."""

    def __init__(self, initial_time: float = 0):
        super().__init__(initial_time)
        self._queue = Queue()

    def schedule(self, event, priority=NORMAL, delay=0) -> None:
        self._queue.push(self._now + delay, priority, event)

    def peek(self):
        return self._queue.peek() if len(self._queue) else Infinity

    def step(self) -> None:
        """One event, as SimPy's step (run(until) steps with it)."""
        if not len(self._queue):
            raise EmptySchedule
        self._now, event = self._queue.pop()
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        _raise_if_failed(event)

    def run(self, until=None):
        if until is not None:
            return super().run(until)
        with fewer_collections():
            while (failed := self._queue.run(self)) is not None:
                _raise_if_failed(failed)
        return None


def _raise_if_failed(event) -> None:
    """As SimPy's step: a failed event nobody defused (a process that raised) ends the
    run with a copy of its error."""
    if not event._ok and not hasattr(event, "_defused"):
        exc = type(event._value)(*event._value.args)
        exc.__cause__ = event._value
        raise exc
