"""Property-based tests over every registered operator (npusim.ops.OPS): parameters
drawn by hypothesis from each op's own parameter record (odd, prime and very large
sizes, every dtype and format name), checking that

- lowering succeeds, or stops with a one-line ProgramError / ConfigError (the op
  refusing a shape it cannot take, named) - never any other exception;
- every kernel passes verify();
- the simulated time is at least the op's roofline.

The example budget is small in CI (a few examples per op, derandomized so every run
draws the same ones); benchmarks/bench_properties.py runs it with a larger one via
NPUSIM_HYPOTHESIS_EXAMPLES. Ops whose drawn shape moves more than SIM_BYTES (or
does more than SIM_FLOPS) are lowered and verified but not simulated, so CI time
stays bounded; the benchmark raises both limits with NPUSIM_HYPOTHESIS_SIM_BYTES.
"""

from __future__ import annotations

import os
import re

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.errors import ConfigError, ProgramError
from npusim.hw import load_hw
from npusim.isa.verify import verify
from npusim.ops import OPS, lower, simulate_op

HW = load_hw("ascend910b2")
EXAMPLES = int(os.environ.get("NPUSIM_HYPOTHESIS_EXAMPLES", "10"))
SIM_BYTES = float(os.environ.get("NPUSIM_HYPOTHESIS_SIM_BYTES", str(8 * 2**20)))
SIM_FLOPS = SIM_BYTES * 2**10  # a matmul this size simulates in about the time a stream of SIM_BYTES does

# Sizes worth trying: 1, odd, prime, powers of two and their neighbours, and model widths.
SMALL = (1, 2, 3, 5, 7, 8, 13, 16, 31, 64, 97, 128)
WIDE = (127, 1000, 1009, 4096, 4099, 8191, 12000, 16411, 18944, 37888, 65521, 151936, 262147)
# Every string any op's parameters take (dtypes, formats, KV layouts); a string an op
# does not accept must come back as a one-line ConfigError.
STRINGS = ("fp16", "bf16", "fp32", "int8", "int32", "ND", "NZ", "per_layer", "contiguous", "paged", "")
WIDE_FIELDS = {"n", "k", "hidden", "vocab"}  # int fields that are a row width: drawn large too


def _int(name: str, default: int) -> st.SearchStrategy:
    if default < 0:  # a sentinel (position -1: append after the context)
        return st.one_of(st.just(default), st.sampled_from(SMALL))
    pool = SMALL + (WIDE if name in WIDE_FIELDS else ()) + (default, default + 1, 2 * default - 1)
    return st.sampled_from(sorted({v for v in pool if v >= 0}))


def _shape(default: tuple) -> st.SearchStrategy:
    """As many dims as the default; the last one (the row: what UB tiling is about) wide."""
    if not default:
        return st.just(default)
    lead = [st.sampled_from(SMALL) for _ in default[:-1]]
    return st.tuples(*lead, st.sampled_from(SMALL + WIDE))


def _accepted(cls: type, f: attrs.Attribute, values) -> list:
    """The values the field's own validator takes (the op's other fields at their defaults)."""
    base = cls()
    ok = []
    for v in values:
        try:
            attrs.evolve(base, **{f.name: v})
        except (TypeError, ValueError):
            continue
        ok.append(v)
    return ok


def _field(cls: type, f: attrs.Attribute) -> st.SearchStrategy:
    d = f.default
    if isinstance(d, bool):
        return st.booleans()
    if isinstance(d, int):
        return _int(f.name, d)
    if isinstance(d, float):
        return st.sampled_from((d, 0.125, 1.0, 50.0))
    if isinstance(d, str):
        return st.sampled_from(_accepted(cls, f, sorted({d, *STRINGS})))
    if isinstance(d, tuple):
        return _shape(d) if f.name == "shape" else st.just(d)
    return st.just(d)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _params(draw, op: str) -> dict:
    """Each field from its own strategy, in order; fields whose legal range depends on an
    earlier one are drawn inside it (the op's documented constraints), so fewer draws
    are spent on shapes the op rightly refuses: kv_heads divides heads, layer < layers,
    position + new_tokens <= context."""
    cls = OPS[op].params
    out: dict = {}
    for f in attrs.fields(cls):
        if f.name == "kv_heads" and "heads" in out:
            out[f.name] = draw(st.sampled_from(_divisors(out["heads"])))
        elif f.name == "layer" and "layers" in out:
            out[f.name] = draw(st.integers(0, max(0, out["layers"] - 1)))
        elif f.name == "position" and "context" in out and "new_tokens" in out:
            room = out["context"] - out["new_tokens"]
            out[f.name] = draw(st.just(f.default) if room < 0 else st.one_of(st.just(f.default),
                                                                              st.integers(0, room)))
        else:
            out[f.name] = draw(_field(cls, f))
    return out


def params_of(op: str) -> st.SearchStrategy:
    return _params(op)


REFUSALS: dict[str, int] = {}  # message (numbers dropped) -> times seen: what the benchmark prints


def check(op: str, params: dict) -> str:
    """The properties for one drawn parameter set; returns what happened (for the benchmark)."""
    try:
        lowered = lower(op, params, HW)
    except (ProgramError, ConfigError) as err:
        assert "\n" not in str(err) and str(err), f"{op} {params}: not one line: {err!r}"
        key = re.sub(r"[-+]?\d[\d.e+x]*", "N", str(err))[:160]
        REFUSALS[key] = REFUSALS.get(key, 0) + 1
        return "refused"
    if not lowered.kernels:  # a collective that only moves bytes (send_recv): its steps are transfers
        from npusim.ops.collectives.lower import launch_order

        assert launch_order(lowered), f"{op} {params}: no kernels and no transfer steps"
        return "transfers"
    if lowered.min_gm_bytes > SIM_BYTES or lowered.flops > SIM_FLOPS:
        for k in lowered.kernels:
            verify(k, HW)
        return "verified"
    report = simulate_op(lowered, HW, trace="kernel")  # verifies every kernel first
    assert report.seconds >= report.roofline.time_s, f"{op} {params}: beats its roofline"
    return "simulated"


@pytest.mark.parametrize("op", sorted(OPS))
def test_op_tiles_any_legal_shape(op):
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(params_of(op))
    def prop(params):
        check(op, params)

    prop()
