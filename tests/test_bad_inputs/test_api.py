"""The public Python API checks its arguments at the boundary: a wrong type is a
TypeError, a wrong value a ConfigError, and the message names the argument - not an
AttributeError, IndexError or bare TypeError from deep inside, and never a string
iterated per character."""

from __future__ import annotations

import pytest
from cli_check import one_line_error

from npusim.errors import ConfigError
from npusim.graph.build import build_decoder
from npusim.hw import load_hw
from npusim.passes import apply, pass_names
from npusim.runtime.decoder import compare, run_decoder, step
from npusim.workload import load_workload

W = "k3-tiny"

RUN_DECODER = {
    # argument: (keyword arguments, expected exception, the argument the message names)
    "overrides list": (dict(overrides=["chip.aic_count=4"]), TypeError, "overrides"),
    "overrides string": (dict(overrides="chip.aic_count=4"), TypeError, "overrides"),
    "overrides with a non-string key": (dict(overrides={1: 2}), TypeError, "overrides"),
    "hw None": (dict(hw=None), TypeError, "hw"),
    "hw int": (dict(hw=3), TypeError, "hw"),
    "hw dict": (dict(hw={"chip": {}}), TypeError, "hw"),
    "workload None": (dict(workload=None), TypeError, "workload"),
    "workload int": (dict(workload=7), TypeError, "workload"),
    "workload dict": (dict(workload={"layers": 2}), TypeError, "workload"),
    "context float": (dict(context=64.0), TypeError, "context"),
    "context string": (dict(context="64"), TypeError, "context"),
    "context bool": (dict(context=True), TypeError, "context"),
    "context with a float": (dict(context=[64, 32.0]), TypeError, "context"),
    "context dict": (dict(context={"a": 1}), TypeError, "context"),
    "batch float": (dict(batch=2.0), TypeError, "batch"),
    "batch string": (dict(batch="2"), TypeError, "batch"),
    "batch bool": (dict(batch=True), TypeError, "batch"),
    "batch None": (dict(batch=None), TypeError, "batch"),
    "batch zero": (dict(batch=0), ConfigError, "batch"),
    "batch 100M": (dict(batch=100_000_000), ConfigError, "batch"),
    "phase misspelt": (dict(phase="decoding"), ConfigError, "phase"),
    "phase None": (dict(phase=None), ConfigError, "phase"),
    "passes None": (dict(passes=None), TypeError, "passes"),
    "passes int": (dict(passes=3), TypeError, "passes"),
    "passes with a non-string": (dict(passes=["fusion", 3]), TypeError, "passes"),
    "passes misspelt": (dict(passes="optimised"), ConfigError, "passes"),
    "passes empty string": (dict(passes=""), ConfigError, "passes"),
    "passes unknown in a list": (dict(passes=["fusion", "fussion"]), ConfigError, "passes"),
    "memo string": (dict(memo="yes"), TypeError, "memo"),
    "unknown pass option": (dict(fusion="on"), ConfigError, "option"),
    "overrides out of range": (dict(overrides={"l2.bw_bytes_per_s": float("inf")}), ConfigError,
                               "l2.bw_bytes_per_s"),
    "overrides unknown key": (dict(overrides={"hbm.bw": 1}), ConfigError, "hbm.bw"),
}


@pytest.mark.parametrize("case", sorted(RUN_DECODER))
def test_run_decoder_checks_its_arguments(case):
    kwargs, exc, names = RUN_DECODER[case]
    kwargs = dict(workload=W, hw="ascend910b2", phase="decode", batch=1, context=16, passes="baseline") | kwargs
    one_line_error(lambda: run_decoder(**kwargs), exc, names)


COMPARE = {
    "no pipelines": (dict(pipelines=()), ConfigError, "pipelines"),
    "pipelines a string": (dict(pipelines="optimized"), TypeError, "pipelines"),
    "pipelines None": (dict(pipelines=None), TypeError, "pipelines"),
    "pipelines a set": (dict(pipelines={"baseline"}), TypeError, "pipelines"),
    "a pipeline None": (dict(pipelines=["baseline", None]), TypeError, "passes"),
    "a pipeline unknown": (dict(pipelines=["baseline", "nosuch"]), ConfigError, "passes"),
    "overrides list": (dict(overrides=[1]), TypeError, "overrides"),
    "hw None": (dict(hw=None), TypeError, "hw"),
    "context float": (dict(context=16.0), TypeError, "context"),
}


@pytest.mark.parametrize("case", sorted(COMPARE))
def test_compare_checks_its_arguments(case):
    kwargs, exc, names = COMPARE[case]
    kwargs = dict(workload=W, hw="ascend910b2", batch=1, context=16) | kwargs
    one_line_error(lambda: compare(**kwargs), exc, names)


STEP = {
    "context float": (dict(context=64.0), TypeError, "context"),
    "passes None": (dict(passes=None), TypeError, "passes"),
    "workload None": (dict(workload=None), TypeError, "workload"),
    "batch float": (dict(batch=1.5), TypeError, "batch"),
}


@pytest.mark.parametrize("case", sorted(STEP))
def test_step_checks_its_arguments(case):
    kwargs, exc, names = STEP[case]
    one_line_error(lambda: step(**(dict(workload=W) | kwargs)), exc, names)


@pytest.fixture(scope="module")
def graph():
    return build_decoder(W, "decode", 1, 16)


@pytest.mark.parametrize("passes, exc, names", [
    (None, TypeError, "passes"), (3, TypeError, "passes"), ([None], TypeError, "passes"),
    ("o", ConfigError, "passes"), ("optimized,nosuch", ConfigError, "passes"), (",", ConfigError, "passes"),
], ids=repr)
def test_apply_and_pass_names_check_passes(graph, passes, exc, names):
    one_line_error(lambda: pass_names(passes), exc, names)
    one_line_error(lambda: apply(graph, passes), exc, names)


def test_apply_checks_the_graph():
    one_line_error(lambda: apply("k3-tiny", "optimized"), TypeError, "graph")


def test_a_string_is_never_iterated_per_character():
    """'optimized' where a list of pipelines belongs used to give "unknown pass 'o'"."""
    msg = one_line_error(lambda: compare(W, pipelines="optimized", batch=1, context=16), TypeError, "pipelines")
    assert "'o'" not in msg


@pytest.mark.parametrize("args, exc, names", [
    ((None,), TypeError, "hw"), ((3,), TypeError, "hw"),
    (("ascend910b2", [("chip.aic_count", 3)]), TypeError, "overrides"),
    (("ascend910b2", {1: 3}), TypeError, "overrides"),
    (("ascend910b2", {"chip.aic_count": [1]}), ConfigError, "chip.aic_count"),
], ids=repr)
def test_load_hw_checks_its_arguments(args, exc, names):
    one_line_error(lambda: load_hw(*args), exc, names)


@pytest.mark.parametrize("args, exc, names", [
    ((None,), TypeError, "workload"), ((3.5,), TypeError, "workload"),
    (("k3-tiny", ["layers=2"]), TypeError, "overrides"),
    (("k3-tiny", {"layers": [2]}), ConfigError, "layers"),
    (("k3-tiny", {1: 2}), TypeError, r"overrides: expected field names \(strings\) as keys, got 1$"),
    (("k3-tiny", {None: 2}), TypeError, r"overrides: .* got None$"),  # said "unknown key 'on'"
], ids=repr)
def test_load_workload_checks_its_arguments(args, exc, names):
    one_line_error(lambda: load_workload(*args), exc, names)


@pytest.mark.parametrize("kwargs, names", [
    (dict(batch=2.5), "batch"), (dict(lengths="64"), "lengths"), (dict(lengths=64.0), "lengths"),
    (dict(phase="train"), "phase"), (dict(batch=1 << 20), "batch"),
], ids=repr)
def test_build_decoder_checks_its_arguments(kwargs, names):
    one_line_error(lambda: build_decoder(**(dict(workload=W, phase="decode", batch=1) | kwargs)), ConfigError, names)


def test_the_readmes_api_paths_work_in_a_fresh_interpreter():
    """The package imports its parts on first use: `npusim.ops.lower`, `npusim.hw.derived`
    and the other subpackages the README names resolve without importing them first."""
    import subprocess
    import sys

    code = ("import npusim\n"
            "hw = npusim.load_hw()\n"
            "assert npusim.hw.derived.derive(hw).l2_bw_bytes_per_s > 0\n"
            "assert npusim.ops.lower('rms_norm', {'shape': (8, 64)}, hw).kernels\n"
            "assert callable(npusim.sweep.sweep) and callable(npusim.report.summary)\n"
            "try:\n    npusim.no_such_part\nexcept AttributeError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "module 'npusim' has no attribute 'no_such_part'"


SERVE_LOADS = {
    # load: (the requests, expected exception, what the message says)
    "empty": ((), ConfigError, r"^requests: no requests \(expected at least one Request\)$"),
    "nan arrival": (("nan", 10, 4), ConfigError, r"^requests\[0\]: arrival_s: expected a time from 0 to 1e\+09 s, "
                                                 r"got nan$"),
    "negative arrival": ((-5.0, 10, 4), ConfigError, r"^requests\[0\]: arrival_s: expected a time from 0"),
    "no prompt": ((0.0, 0, 4), ConfigError, r"^requests\[0\]: prompt_tokens: expected a whole token count from 1"),
    "no output": ((0.0, 10, 0), ConfigError, r"^requests\[0\]: output_tokens: expected a whole token count from 1"),
    "float output": ((0.0, 10, 4.0), ConfigError, r"^requests\[0\]: output_tokens: expected a whole token count"),
    "a tuple, not a Request": ([(0.0, 10, 4)], TypeError, r"^requests\[0\]: expected a Request, got \(0\.0, 10, 4\)$"),
    "a string": ("abc", TypeError, r"^requests: expected a sequence of Request, got 'abc'$"),
}


@pytest.mark.parametrize("case", SERVE_LOADS)
def test_serve_checks_its_requests(case):
    """serve()'s load, before a step is run: a nan arrival was never reached and the serving
    loop waited for it forever; an empty load was min() of an empty sequence."""
    from kernels import deadline
    from npusim.serving import Request, StepCost, load_service, serve

    load, exc, expect = SERVE_LOADS[case]
    if isinstance(load, tuple) and len(load) == 3:
        load = (Request(0, float(load[0]), load[1], load[2]),)
    svc = load_service("vllm-continuous")
    cost = StepCost(W, "ascend910b2", svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch)
    with deadline(60):
        one_line_error(lambda: serve(load, svc, cost, 2, "shortest-queue"), exc, expect)



@pytest.mark.parametrize("pd, expect", [((0, 2), r"^--pd 0:2 \(prefill cards\): expected a whole number of cards from "
                                                 r"1 to 4096, got 0$"),
                                        ((2, 1.0), r"^--pd 2:1\.0 \(decode cards\): expected a whole number of cards")])
def test_serve_checks_each_side_of_a_split(pd, expect):
    """serve(pd=(0, 2)) said '--cards: ... got 0' (the prefill side's cluster of none)."""
    from npusim.serving import StepCost, load_service, serve, synthetic

    svc = load_service("vllm-continuous")
    cost = StepCost(W, "ascend910b2", svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch)
    one_line_error(lambda: serve(synthetic(3, 0, rate=10), svc, cost, pd=pd), ConfigError, expect)


def test_serve_names_the_pd_router():
    """serve(pd=..., pd_router='x') said '--router x: unknown router'."""
    from npusim.serving import StepCost, load_service, serve, synthetic

    svc = load_service("vllm-continuous")
    cost = StepCost(W, "ascend910b2", svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch)
    one_line_error(lambda: serve(synthetic(3, 0, rate=10), svc, cost, pd=(1, 1), pd_router="x"), ConfigError,
                   r"^--pd-router x: unknown router \(expected one of kv-local, least-loaded, round-robin, "
                   r"shortest-queue\)$")
