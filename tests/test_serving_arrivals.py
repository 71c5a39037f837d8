"""Arrival processes, length distributions and trace replay (npusim.serving.arrivals)."""

import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.serving.arrivals import Ramp, arrival_times, lengths, load_trace, synthetic


def gaps(process, n=20000, seed=3, **kw):
    return np.diff(arrival_times(process, n, np.random.default_rng(seed), **kw), prepend=0.0)


def test_poisson_rate_and_seed():
    g = gaps("poisson", rate=8.0)
    assert 1 / g.mean() == pytest.approx(8.0, rel=0.03)
    assert np.std(g) / np.mean(g) == pytest.approx(1.0, rel=0.05)  # exponential gaps
    a = synthetic(500, seed=7, rate=8.0)
    assert a == synthetic(500, seed=7, rate=8.0)
    assert a != synthetic(500, seed=8, rate=8.0)


def test_gamma_cv_and_constant():
    g = gaps("gamma", rate=5.0, cv=2.0)
    assert 1 / g.mean() == pytest.approx(5.0, rel=0.05)
    assert np.std(g) / np.mean(g) == pytest.approx(2.0, rel=0.07)
    assert np.allclose(gaps("constant", n=100, rate=4.0), 0.25)


def test_ramp_rises_then_holds():
    t = arrival_times("ramp", 6000, np.random.default_rng(0), ramp=Ramp(10, 10, 30, 50))
    per_stage = np.histogram(t, bins=[0, 30, 60, 90, 120, 150, 180])[0] / 30
    assert per_stage[:5] == pytest.approx([10, 20, 30, 40, 50], rel=0.15)
    assert per_stage[5] == pytest.approx(50, rel=0.15)  # capped at max


def test_length_distributions():
    rng = np.random.default_rng(1)
    mix = lengths("mix", 20000, rng)
    fractions = [(mix < 128).mean(), ((mix >= 128) & (mix <= 1024)).mean(), (mix > 1024).mean()]
    assert fractions == pytest.approx([0.10, 0.60, 0.30], abs=0.015)
    u = lengths("uniform:10,20", 5000, rng)
    assert u.min() == 10 and u.max() == 20
    assert np.median(lengths("lognormal:300,0.5", 20000, rng)) == pytest.approx(300, rel=0.05)
    assert set(lengths("fixed:7", 10, rng)) == {7}


def test_empirical_lengths(tmp_path):
    f = tmp_path / "lens.txt"
    f.write_text("5\n9\n")
    assert set(lengths(f"file:{f}", 200, np.random.default_rng(0))) == {5, 9}
    f.write_text("5\n-3\n")
    with pytest.raises(ConfigError, match="value 2"):
        lengths(f"file:{f}", 10, np.random.default_rng(0))


@pytest.mark.parametrize("spec", ["uniform:5", "fixed:0", "lognormal:a,b", "zipf:3", "uniform:9,2"])
def test_bad_length_spec(spec):
    with pytest.raises(ConfigError, match="--prompt-lengths"):
        lengths(spec, 10, np.random.default_rng(0))


@pytest.mark.parametrize("rate", [0, -1, float("nan")])
def test_bad_rate(rate):
    with pytest.raises(ConfigError, match="--rate"):
        arrival_times("poisson", 10, np.random.default_rng(0), rate=rate)


def test_trace_csv_and_jsonl(tmp_path):
    c = tmp_path / "t.csv"
    c.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,20,6\n")
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in load_trace(c)] == [(0.0, 10, 5), (0.5, 20, 6)]
    j = tmp_path / "t.jsonl"
    j.write_text('{"arrival_s": 0.1, "prompt_tokens": 3, "output_tokens": 4}\n')
    assert load_trace(j)[0].prompt_tokens == 3


def test_a_negative_zero_arrival_is_zero(tmp_path):
    """arrival_s -0 was kept as -0.0: the requests CSV said '-0.000000'."""
    import math

    c = tmp_path / "t.csv"
    c.write_text("arrival_s,prompt_tokens,output_tokens\n-0,10,5\n")
    j = tmp_path / "t.jsonl"
    j.write_text('{"arrival_s": -0.0, "prompt_tokens": 3, "output_tokens": 4}\n')
    for f in (c, j):
        assert math.copysign(1.0, load_trace(f)[0].arrival_s) == 1.0


@pytest.mark.parametrize("text, match", [
    ("arrival_s,prompt_tokens\n0,1\n", "row 1: missing column 'output_tokens'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,1,2\n1,-4,2\n", "row 3: column 'prompt_tokens': expected a count >= 1"),
    # said "expected a positive value", where 0 is one
    ("arrival_s,prompt_tokens,output_tokens\n-5,1,2\n", "row 2: column 'arrival_s': expected a time >= 0, got -5"),
    ("arrival_s,prompt_tokens,output_tokens\n2,1,2\n1,4,2\n", "row 3: column 'arrival_s': arrivals must be sorted"),
    ("arrival_s,prompt_tokens,output_tokens\n0,x,2\n", "row 2: column 'prompt_tokens': expected an integer"),
    ("arrival_s,prompt_tokens,output_tokens\n0,3,\n", "row 2: missing column 'output_tokens'"),
])
def test_bad_trace(tmp_path, text, match):
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match) as e:
        load_trace(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_bad_jsonl(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 4}\n{"arrival_s": 1, "prompt_tokens": 3}\n')
    with pytest.raises(ConfigError, match="line 2: missing column 'output_tokens'"):
        load_trace(f)
