"""npusim.engine.flows.Link on its own (a bare engine Environment): max-min fair
sharing (water-filling) with per-flow caps, weighted flows, late arrivals, and
completions rounded up to whole cycles."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npusim.engine.cycles import whole_cycles
from npusim.engine.events import Environment

from flows_reference import ReferenceLink
from kernels import deadline
from npusim.engine.flows import Link


def run_flows(capacity: float, flows: list[tuple], link_type=Link) -> tuple[list, Link]:
    """Start each (start cycle, bytes, cap, weight) flow on one link; return when each
    ended, and the link (for its rate samples)."""
    env = Environment()
    link = link_type(env, "L", capacity)
    ends: list = [None] * len(flows)

    def start(i, at, nbytes, cap, weight):
        yield env.timeout(at)
        link.add(nbytes, cap, lambda: ends.__setitem__(i, env.now), weight)

    for i, flow in enumerate(flows):
        env.process(start(i, *flow))
    env.run()
    assert link.active == 0
    return ends, link


def test_water_filling_gives_a_capped_flow_its_cap_and_the_rest_to_others():
    capacity, small, large, span = 150, 30, 110, 1000
    rest = (capacity - small) / 2  # what the two large-cap flows share
    assert small < rest < large
    ends, link = run_flows(capacity, [(0, small * span, small, 1),
                                      (0, rest * span, large, 1),
                                      (0, rest * span, large, 1)])
    assert ends == [span, span, span]
    assert dict(link.samples) == {0: pytest.approx(capacity), span: 0}  # last rate at each time


def test_caps_above_the_fair_share_split_the_link_equally():
    capacity, nbytes = 100, 5000
    ends, _ = run_flows(capacity, [(0, nbytes, math.inf, 1), (0, nbytes, 80, 1)])
    assert ends == [2 * nbytes / capacity] * 2


def test_a_lone_uncapped_flow_takes_the_whole_link_and_a_capped_one_its_cap():
    capacity, nbytes, cap = 100, 4096, 30
    ends, _ = run_flows(capacity, [(0, nbytes, math.inf, 1)])
    assert ends == [math.ceil(nbytes / capacity)]  # completions are whole cycles
    ends, link = run_flows(capacity, [(0, nbytes, cap, 1)])
    assert ends == [math.ceil(nbytes / cap)]
    assert max(rate for _, rate in link.samples) == cap


def test_a_weighted_flow_counts_as_that_many_flows():
    capacity, nbytes, w = 120, 6000, 3
    ends, _ = run_flows(capacity, [(0, nbytes, math.inf, w), (0, nbytes, math.inf, 1)])
    # four flows of nbytes at capacity / 4 each
    assert ends == [4 * nbytes / capacity] * 2


def test_a_late_flow_shares_then_the_first_finishes_and_it_runs_alone():
    capacity, nbytes, delay = 100, 40000, 100
    ends, _ = run_flows(capacity, [(0, nbytes, math.inf, 1), (delay, nbytes, math.inf, 1)])
    first = delay + (nbytes - capacity * delay) / (capacity / 2)
    second = first + (nbytes - (first - delay) * capacity / 2) / capacity
    assert ends == [first, second] == [pytest.approx(2 * nbytes / capacity - delay), 2 * nbytes / capacity]


def test_a_flow_ending_just_after_a_whole_cycle_does_not_hang_the_link():
    capacity, nbytes = 57077.620882230454, 2111872  # ends at cycle 37.00000047930297
    assert 0 < nbytes / capacity - 37 < 5e-7
    with deadline(0.5):
        ends, _ = run_flows(capacity, [(0, nbytes, math.inf, 1)])
    assert ends == [whole_cycles(nbytes / capacity)]  # 37: the 5e-7 is float noise by policy


@pytest.mark.parametrize("bytes_per_s", [1.0, 1e3])
def test_a_very_slow_link_still_moves_time_forward(bytes_per_s):
    """At 1 B/s (a what-if `--set l2.bw_bytes_per_s=1`) the clock reaches ~1e12 cycles,
    where the float clock cannot move by the last fraction of a cycle a flow has left:
    the flow must end at the cycle the timer found, not wait forever for that fraction."""
    capacity = bytes_per_s / 1.8e9  # bytes per cycle at a 1.8 GHz clock
    with deadline(2):
        ends, _ = run_flows(capacity, [(1, 256, 110.0, 1), (2, 1000, 86.0, 1)])
    # alone for one cycle, then sharing until the first ends, then the second alone
    first = 2 + (256 - capacity) / (capacity / 2)
    second = first + (1000 - (first - 2) * capacity / 2) / capacity
    assert ends == [pytest.approx(first, rel=1e-9, abs=1), pytest.approx(second, rel=1e-9, abs=1)]


@pytest.mark.parametrize("capacity", [1e-20, 1e30])
def test_extreme_rates_end_every_flow(capacity):
    with deadline(2):
        ends, link = run_flows(capacity, [(0, 1e6, 110.0, 1), (3, 5e5, 64.0, 1), (7, 12345, 110.0, 1)])
    assert all(e is not None and math.isfinite(e) for e in ends)


@given(whole=st.integers(0, 2**52), fraction=st.one_of(st.floats(0, 1, exclude_max=True), st.floats(0, 2e-6),
                                                      st.floats(1 - 2e-6, 1, exclude_max=True)))
def test_whole_cycles_is_the_ceiling_of_the_value_rounded_to_six_decimals(whole, fraction):
    """whole_cycles skips round() where it cannot matter: it must agree with the rule."""
    for x in (whole + fraction, math.nextafter(whole + fraction, 0), math.nextafter(whole + fraction, math.inf)):
        assert whole_cycles(x) == math.ceil(round(x, 6))


_flow = st.tuples(st.integers(0, 400), st.one_of(st.integers(1, 10**6), st.floats(0.5, 1e6)),
                  st.sampled_from([math.inf, 30, 64.0, 86.0, 110.0, 1e-3]), st.integers(1, 24))


@given(capacity=st.one_of(st.floats(1e-3, 1e5), st.sampled_from([150, 57077.620882230454, 1e30])),
       flows=st.lists(_flow, min_size=1, max_size=12))
def test_the_c_flow_model_is_its_python_statement_to_the_bit(capacity, flows):
    """Link's arithmetic runs in C (_flows.c): every end time, and every rate sample with
    the cycle it was taken at, equals what the Python statement of the model
    (tests/flows_reference.py) gives, exactly - types too (whole cycles are ints)."""
    with deadline(5):
        ends, link = run_flows(capacity, flows)
        expect, reference = run_flows(capacity, flows, ReferenceLink)
    assert [(e, type(e)) for e in ends] == [(e, type(e)) for e in expect]
    assert [(t, type(t), u) for t, u in link.samples] == [(t, type(t), u) for t, u in reference.samples]