"""`npusim op` on hardware values drawn by hypothesis (issue 35): any numeric field of
the config, or an entry of its tables, overridden with `--set` at values from tiny to
1e18, 0, negatives, nan/inf and non-numbers, alone or two at once. Every draw ends
with a result (exit 0) or one clean error line (exit 2) within a deadline: no
traceback, no hang, no signal. What a value breaks is refused where it enters, at the
config's bounds (npusim/hw/config.py, npusim/hw/checks.py)."""

from __future__ import annotations

import typing

import attrs
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from kernels import deadline
from test_hwconfig import config_fields

from npusim.cli import main
from npusim.hw import load_hw

HW = load_hw()
RAW = attrs.asdict(HW)


def _at(key: str):
    value = RAW
    for part in key.split("."):
        value = value[part]
    return value


def numeric_keys() -> list[tuple[str, float]]:
    """(key path, shipped value) of every number in the config: its fields (as
    test_hwconfig.config_fields lists them), and each entry of its tables
    (aiv.vector_cycles_per_repeat.exp, aic.mmad_fractals.fp16.k0)."""
    out = []
    for path, f in config_fields():
        table = typing.get_origin(f.type) is dict
        if (typing.get_args(f.type)[1] if table else f.type) not in (int, float):
            continue
        if ".*." in path:  # a field of the records in a table
            head, tail = path.split(".*.")
            keys = [f"{head}.{k}.{tail}" for k in _at(head)]
        else:
            keys = [f"{path}.{k}" for k in _at(path)] if table else [path]
        out += [(key, _at(key)) for key in keys]
    return out


KEYS = numeric_keys()
# the two tiny ops every draw runs one of: a vector kernel and a cube kernel
OPS = (("rms_norm", "shape=8,64"), ("matmul", "m=64", "n=128", "k=256"))
# values as a user may type them: the bounds' neighbourhoods, extremes, not finite, not numbers
LITERALS = ("0", "-0", "-1", "1", "2", "3", "31", "32", "64", "4096", "4097", "65536", "65537", "1e9", "4294967296",
            "4294967297", "1099511627776", "1e12", "1e15", "9007199254740993", "1e18", "1e19", "1e30", "1e-9",
            "1e-10", "1e-300", "0.5", ".nan", ".inf", "-.inf", "nan", "x", "[1, 2]", "{a: 1}", "true", "''", "1,2")


def value_for(shipped: float) -> st.SearchStrategy[str]:
    """A value for a field whose shipped value is `shipped`: a literal, any integer or
    float, or the shipped value scaled by a power of two (the what-ifs a user tries)."""

    def scaled(j: int) -> str:
        x = shipped * 2.0 ** j
        return str(int(x)) if isinstance(shipped, int) and x.is_integer() else repr(x)

    literal, wide = st.sampled_from(LITERALS), st.integers(-40, 64).map(scaled)
    return st.one_of(literal, literal, wide, wide, st.integers(-(2 ** 64), 2 ** 64).map(str),
                     st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.integers(-3, 3).map(scaled))  # mostly accepted: the runs go through


@st.composite
def overrides(draw) -> dict[str, str]:
    """One or two fields, each with a value drawn for it."""
    picked = dict([draw(st.sampled_from(KEYS))] + ([draw(st.sampled_from(KEYS))] if draw(st.booleans()) else []))
    return {key: draw(value_for(shipped)) for key, shipped in picked.items()}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(op=st.sampled_from(OPS), sets=overrides())
# issue 35's: an OverflowError past 2^53 in the pipe walk, numpy's MemoryError building the L2,
# a ZeroDivisionError once a host cost drowned the kernel's time, a TypeError from a tiling
# chooser with no fractal-wide tile
@example(op=OPS[0], sets={"dma.startup_cycles": "1e18"})
@example(op=OPS[1], sets={"l2.l2_bytes": "1e18"})
@example(op=OPS[0], sets={"runtime.graph_launch_us": "1e18"})
@example(op=OPS[1], sets={"aic.mmad_fractals.fp16.n0": "512"})
def test_any_hardware_value_ends_with_a_result_or_one_line(op, sets, capsys):
    argv = ["op", *op, *(x for key, value in sets.items() for x in ("--set", f"{key}={value}")), "--no-cache"]
    with deadline(20):
        code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, f"{argv}: {err}"
    assert code in (0, 2), f"{argv}: exit {code}: {err}"
    if code == 0:
        assert out.startswith(f"{op[0]} on "), f"{argv}: {out}"
        event("ran")
    else:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("npusim: error: "), f"{argv}: {err}"
        event("refused")


def test_keys_cover_every_number_of_the_config():
    """The draws reach every numeric field of every section, and each entry of both tables."""
    keys = dict(KEYS)
    assert {"chip.freq_hz", "aic.l1_bytes", "sync.flag_ids", "l2.l2_bytes", "hbm.bw_efficiency", "dma.startup_cycles",
            "topology.node_count", "runtime.kernel_compile_us"} <= keys.keys()
    assert {f"aiv.vector_cycles_per_repeat.{op}" for op in HW.aiv.vector_cycles_per_repeat} <= keys.keys()
    assert {f"aic.mmad_fractals.{t}.{d}" for t in HW.aic.mmad_fractals for d in ("m0", "n0", "k0")} <= keys.keys()
    assert keys["dma.startup_cycles"] == HW.dma.startup_cycles
