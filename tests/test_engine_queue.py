"""The event queue in C (npusim/engine/_queue.c) pops in SimPy's order: by time, then
priority, then the order scheduled - the order of SimPy's heap of (time, priority,
id, event) tuples - for ints, floats and ints too large for a double to hold; and its
loop, Signals, after and at_delay run processes as SimPy's own events do."""

from __future__ import annotations

import heapq
from itertools import count

import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from npusim.engine._queue import Queue
from npusim.engine.events import Environment, Signal, after, at_delay

TIMES = st.one_of(
    st.integers(0, 50),
    st.floats(0, 50, allow_nan=False).map(lambda x: round(x, 1)),  # ties between ints and floats
    st.integers(2**53 - 3, 2**53 + 3),  # beyond 2^53 a double cannot tell them apart
    st.just(float(2**53)),
)


@given(st.lists(st.tuples(TIMES, st.sampled_from([0, 1])), max_size=60))
def test_pops_in_simpys_order(entries):
    q, heap, ids = Queue(), [], count()
    for i, (time, priority) in enumerate(entries):
        q.push(time, priority, i)
        heapq.heappush(heap, (time, priority, next(ids), i))
    popped = [q.pop() for _ in range(len(q))]
    expected = [(time, i) for time, _, _, i in (heapq.heappop(heap) for _ in range(len(heap)))]
    assert [(repr(t), i) for t, i in popped] == [(repr(t), i) for t, i in expected]  # the time objects too


class Loud(float):
    """A float whose comparisons are Python code: they push onto the queue being sifted."""

    queue: Queue | None = None
    calls = 0

    def __lt__(self, other):
        Loud.calls += 1
        Loud.queue.push(0, 0, "pushed while sifting")
        return float.__lt__(self, other)

    __gt__ = __le__ = __ge__ = __lt__


@given(st.lists(st.tuples(st.one_of(TIMES, TIMES.map(Loud)), st.sampled_from([0, 1])), max_size=60))
def test_a_float_subclass_is_ordered_as_its_float_without_its_own_comparisons(entries):
    """A float subclass tied with an int beyond 2^53 was compared by its own __lt__/__gt__ -
    Python code run in the middle of a sift, which could push onto the queue there (an
    entry lost or held twice). It is ordered as the float it is, by float's comparison."""
    q, heap, ids = Queue(), [], count()
    Loud.queue, Loud.calls = q, 0
    for i, (time, priority) in enumerate(entries):
        q.push(time, priority, i)
        heapq.heappush(heap, (float(time) if isinstance(time, Loud) else time, priority, next(ids), i))
    popped = [q.pop() for _ in range(len(q))]
    expected = [(time, i) for time, _, _, i in (heapq.heappop(heap) for _ in range(len(heap)))]
    assert Loud.calls == 0
    assert [(repr(t), i) for t, i in popped] == [(repr(t), i) for t, i in expected]


def test_a_time_that_is_not_a_number_is_refused():
    q = Queue()
    for bad in (float("nan"), "1", None):
        try:
            q.push(bad, 1, object())
        except (ValueError, TypeError) as e:
            assert "event queue" in str(e)
        else:
            raise AssertionError(f"{bad!r} was queued")



def test_a_delay_before_now_is_refused_as_simpy_refuses_it():
    """after / at_delay with a negative delay scheduled the event before now, and the clock ran
    back; SimPy's Timeout raises ValueError, and so do they (for NaN too, which SimPy lets
    through), the queue left as it was."""
    env = Environment()
    for bad in (-1, -1e-9, float("nan")):
        if bad < 0:
            with pytest.raises(ValueError, match="Negative delay"):
                simpy.Environment().timeout(bad)
        with pytest.raises(ValueError, match="never scheduled before now"):
            after(env, bad)
        with pytest.raises(ValueError, match="never scheduled before now"):
            at_delay(env, bad, lambda _: None)
    env.run()
    assert env.now == 0

DELAYS = st.one_of(st.integers(0, 20), st.floats(0, 20, allow_nan=False).map(lambda x: round(x, 1)),
                   st.sampled_from([2**53 + 1, float(2**53)]))
STEPS = st.lists(st.tuples(st.sampled_from(["after", "timeout", "at_delay", "fire"]), DELAYS), max_size=8)


def _log_of(env, processes, engine: bool) -> list:
    """Run `processes` (per process, its steps) on `env`: with npusim's cheap events in C
    (engine) or with SimPy's own; what happened, in the order it happened."""
    log = []

    def process(p, steps):
        for k, (kind, delay) in enumerate(steps):
            if kind in ("after", "timeout"):
                value = yield (after(env, delay) if engine and kind == "after" else env.timeout(delay))
            elif kind == "at_delay":
                def called(_event, p=p, k=k):
                    log.append((repr(env.now), p, k, "called"))
                if engine:
                    at_delay(env, delay, called)
                else:
                    env.timeout(delay).callbacks.append(called)
                value = None
            else:
                event = Signal(env) if engine else env.event()
                if engine:
                    event.fire((p, k))
                else:
                    event.succeed((p, k))
                value = yield event
            log.append((repr(env.now), p, k, value))

    for p, steps in enumerate(processes):
        env.process(process(p, steps))
    env.run()
    return log


@given(st.lists(STEPS, min_size=1, max_size=5))
def test_the_c_loop_runs_events_as_simpy_does(processes):
    """The engine's environment (its queue and loop in C, Signals, after, at_delay) and
    SimPy's own (Timeouts, Events, callbacks): every process step and callback happens
    at the same time, in the same order, with the same value, for ints, floats and ints
    beyond 2^53."""
    assert _log_of(Environment(), processes, True) == _log_of(simpy.Environment(), processes, False)
