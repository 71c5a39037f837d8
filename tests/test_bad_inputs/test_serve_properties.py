"""`npusim serve` under drawn arguments (hypothesis): arrivals, rates, lengths, SLOs,
seeds and service fields at and beyond their accepted extremes. Every draw ends with a
result (exit 0) or one clean error line (exit 2) - no traceback, no hang, no signal."""

from __future__ import annotations

import contextlib
import io

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from npusim.cli import main
from kernels import deadline

# a number as a user may type it: ordinary, extreme, not finite, or not a number at all
NUMBERS = st.one_of(st.integers(-3, 2**25).map(str),
                    st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr),
                    st.sampled_from(["1e-300", "1e300", "0", "-0", "nan", "inf", "1e30", "0.5", "", "x"]))




def value(*usual: str):
    """One of the usual values of a flag (most draws, so that many runs go through), or any number."""
    return st.one_of(*[st.sampled_from(usual)] * 6, NUMBERS)


@st.composite
def lengths(draw) -> str:
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal"]))
    n = {"fixed": 1, "uniform": 2, "lognormal": 2}[kind]
    return f"{kind}:" + ",".join(draw(value("1", "16", "100", "3000", "0.5", "1.5")) for _ in range(n))


SERVICE_FIELDS = st.sampled_from([
    "scheduler.scan_period_ms", "scheduler.max_batch", "scheduler.timeout_ms", "host.tokenize_us",
    "host.postprocess_us_per_token", "host.step_overhead_us", "host.pool_threads", "buckets",
    "scheduler.block_tokens", "scheduler.token_budget",
])


@st.composite
def serve_argv(draw) -> list[str]:
    # a few requests, or a count to refuse (a valid large one is a long run, not a defect)
    requests = st.one_of(*[st.sampled_from(["1", "4", "8"])] * 6,
                         st.sampled_from(["0", "-1", "1e9", "2000000", "x", "nan", "4.5"]))
    argv = ["serve", "--workload", "k3-tiny", "--requests", draw(requests)]
    arrival = draw(st.sampled_from(["poisson", "gamma", "constant", "ramp"]))
    argv += ["--arrival", arrival]
    if arrival == "ramp":
        argv += ["--ramp", ",".join(draw(value("1", "0", "2", "10", "1e-16")) for _ in range(4))]
    else:
        argv += ["--rate", draw(value("1", "5", "100", "1e-16", "1e9"))]
    if arrival == "gamma" and draw(st.booleans()):
        argv += ["--cv", draw(value("0.5", "1", "4", "1e-200"))]
    if draw(st.booleans()):
        argv += ["--prompt-lengths", draw(lengths())]
    if draw(st.booleans()):
        argv += ["--output-lengths", draw(lengths())]
    if draw(st.booleans()):
        argv += ["--seed", draw(value("0", "7", "-1", str(2**64)))]
    if draw(st.booleans()):
        argv += ["--slo", f"{draw(st.sampled_from(['ttft_ms', 'tpot_ms', 'e2e_ms', 'timeout_ms']))}="
                          f"{draw(value('100', '1', '1e9', '0'))}"]
    for _ in range(draw(st.integers(0, 2))):
        argv += ["--service-set", f"{draw(SERVICE_FIELDS)}={draw(value('1', '4', '100', '1e-300', '.inf'))}"]
    return argv


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=serve_argv())
def test_every_drawn_serve_ends_with_a_result_or_one_clean_line(argv, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "serve-properties-cache"  # warm across draws: the steps repeat
    out, err = io.StringIO(), io.StringIO()
    with deadline(120), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([*argv, "--cache-dir", str(cache), "--no-progress"])
        except SystemExit as e:  # argparse's own: its usage line, then the error
            code = e.code
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    if code == 2:
        assert "Traceback" not in err.getvalue(), (argv, lines)
        assert lines and lines[-1].startswith(("npusim: error: ", "npusim serve: error: ")), (argv, lines)
        assert len(lines) == 1 or len(lines) <= 3 and lines[0].startswith("usage:"), (argv, lines)
    else:
        assert code == 0, (argv, code, lines)
        assert "requests" in out.getvalue(), argv
    event(f"exit {code}")
