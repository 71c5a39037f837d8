"""Plots: every plot is written as PNG and SVG and is not blank; the numbers they
draw (memory in use, waterfall steps, roofline dots) are right; the CLI writes them."""

import itertools

import matplotlib.image
import pytest

import npusim
from npusim.cli import main
from npusim.hw import load_hw
from npusim.hw.derived import derive
from npusim.ops import lower, simulate_op
from npusim.report import plots
from npusim.report.step import activation_spans, memory_in_use

STEP = {"batch": 2, "context": 64}


@pytest.fixture(scope="module")
def optimized():
    return npusim.run_decoder("k3-tiny", "ascend910b2", passes="optimized", **STEP)


@pytest.fixture(scope="module")
def baseline():
    return npusim.run_decoder("k3-tiny", "ascend910b2", passes="baseline", **STEP)


@pytest.fixture(scope="module")
def comparison():
    return npusim.compare("k3-tiny", "ascend910b2", **STEP)


@pytest.fixture(scope="module")
def op_report():
    hw = load_hw("ascend910b2")
    return simulate_op(lower("matmul", {"m": 256, "n": 256, "k": 256}, hw), hw, trace="instr")


def assert_not_blank(paths, name):
    """NAME.png and NAME.svg written; the PNG has more than one colour, the SVG draws paths."""
    assert sorted(p.name for p in paths) == [f"{name}.png", f"{name}.svg"]
    png, svg = sorted(paths)
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.var() > 0
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and "<path" in text


@pytest.mark.parametrize("name", ["roofline", "hotspots", "memory", "run_timeline"])
def test_run_plots(name, optimized, tmp_path):
    paths = getattr(plots, name)(optimized, tmp_path)
    assert_not_blank(paths, "timeline" if name == "run_timeline" else name)


def test_memory_plot_without_a_plan(baseline, tmp_path):
    assert_not_blank(plots.memory(baseline, tmp_path), "memory")


@pytest.mark.parametrize("name", ["roofline", "timeline"])
def test_op_plots(name, op_report, tmp_path):
    source = op_report.run if name == "timeline" else op_report
    assert_not_blank(getattr(plots, name)(source, tmp_path), name)


@pytest.mark.parametrize("name", ["before_after", "waterfall"])
def test_comparison_plots(name, comparison, tmp_path):
    assert_not_blank(getattr(plots, name)(comparison, tmp_path), name)


def test_sweep_curves(tmp_path):
    rows = [{"a": a, "b": b, "latency_us": 10.0 * a + i, "tokens_per_s": 1e3 / (10 * a + i), "status": "ok"}
            for a in (1, 2, 3) for i, b in enumerate(("x", "y"))]  # b: a parameter that is a word
    rows.append({"a": 4, "b": "x", "latency_us": None, "tokens_per_s": None, "status": "OutOfMemoryError: ..."})
    assert_not_blank(plots.sweep_curves(rows, ["a", "b"], tmp_path, title="test"), "sweep")


def test_the_same_plot_twice_is_the_same_bytes(optimized, tmp_path):
    """Same input, same output: the SVG held the time it was written (dc:date) and ids
    salted with a random uuid, so no two runs gave the same file."""
    first, second = plots.hotspots(optimized, tmp_path / "a"), plots.hotspots(optimized, tmp_path / "b")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    assert "<dc:date>" not in first[1].read_text()


def test_timeline_needs_an_instruction_trace(optimized, tmp_path):
    with pytest.raises(ValueError, match="needs a run traced at level 'instr', got 'kernel'"):
        plots.timeline(optimized.result, tmp_path)


def test_timeline_shows_a_few_cores_of_each_type(op_report):
    cores = {iv[0] for iv in op_report.run.trace.intervals}
    assert len(cores) > plots.TIMELINE_CORES_PER_TYPE
    assert plots._pick_cores(cores, 2) == ["AIC0", "AIC1"]
    assert plots._pick_cores(["AIV10", "AIC3", "AIV2", "AIC1", "AIV1"], 2) == ["AIC1", "AIC3", "AIV1", "AIV2"]


def test_roofline_dots_stay_under_the_ceilings(baseline, optimized):
    """Nothing beats its roofline: no kernel above the cube peak, none moving GM bytes faster than the L2."""
    d = derive(baseline.hw)
    for run in (baseline, optimized):
        points = plots.roofline_points(run)
        assert points and {t for t, _, _ in points} <= {k.op_type for k in run.result.kernels}
        for _, intensity, flops_per_s in points:
            assert flops_per_s <= d.cube_peak_flops_per_s["fp16"]
            assert flops_per_s / intensity <= d.l2_bw_bytes_per_s  # GM bytes per second


def test_memory_in_use_counts_each_activation_while_alive(baseline):
    """Without a plan: weights + KV + workspace all step, activations while alive -
    never more than all of them at once, at least the largest one."""
    times, live, total, static = memory_in_use(baseline)
    m = baseline.memory
    assert static == {"weights": m.weights_bytes, "KV cache": m.kv_bytes, "workspace": m.workspace_bytes}
    assert times == sorted(times) and times[0] == 0.0 and times[-1] == pytest.approx(baseline.latency_us)
    assert all(t == sum(static.values()) + v for t, v in zip(total, live))
    largest = max(t.nbytes for t in baseline.graph.tensors.values() if t.kind == "activation")
    assert largest <= max(live) <= m.activation_bytes
    before_end = [v for t, v in zip(times, live) if t < times[-1]][-1]
    assert before_end >= sum(baseline.graph.tensors[t].nbytes for t in baseline.graph.outputs)  # outputs live to the end
    assert live[-1] == 0  # and are freed with everything else when the step ends


def test_memory_in_use_with_a_plan_holds_the_pool(optimized):
    _, _, total, static = memory_in_use(optimized)
    assert static["activation pool (memory plan)"] == optimized.memory.activation_bytes
    assert set(total) == {optimized.memory.total_bytes}


def test_memoised_layers_have_their_own_activations(tmp_path):
    """k3-tiny's 2 layers are never memoised; k3 at a short context is: the layers
    the memo replicates (2 .. 30) count their own activations, not layer 1's again."""
    run = npusim.run_decoder("k3", "ascend910b2", passes="optimized", batch=1, context=16)
    assert run.memo
    spans = activation_spans(run)
    layers = {n.layer for n in run.graph.nodes if n.layer is not None}
    per_layer = [t for t, s in run.graph.tensors.items() if s.kind == "activation" and t.startswith("L5.")]
    assert len(layers) == 32 and per_layer
    # every activation of the graph has a span, including layer 5's, which the memo did not simulate
    assert len(spans) == sum(1 for s in run.graph.tensors.values() if s.kind in ("activation", "input", "output"))


def test_waterfall_goes_from_baseline_to_optimized(comparison):
    steps = plots.waterfall_steps(comparison)
    assert steps[0] == ("baseline", 0.0, comparison.runs["baseline"].latency_us)
    assert steps[-1] == ("optimized", 0.0, comparison.runs["optimized"].latency_us)
    assert [label for label, _, _ in steps[1:-1]] == [f"+ {p}" for p in comparison.steps]
    for (_, _, before), (_, lo, _) in itertools.pairwise(steps[:-1]):
        assert lo == before  # each pass starts where the previous one ended


def test_cli_writes_every_plot(tmp_path, capsys):
    args = ["--workload", "k3-tiny", "--batch", "2", "--context", "64"]
    assert main(["run", *args, "--plot", str(tmp_path / "run")]) == 0
    assert main(["op", "matmul", "m=128", "n=128", "k=128", "--plot", str(tmp_path / "op")]) == 0
    assert main(["compare", *args, "--plot", str(tmp_path / "compare")]) == 0
    out = capsys.readouterr().out
    assert "plots in " in out
    expected = {"run": ["roofline", "hotspots", "memory", "timeline"], "op": ["roofline", "timeline"],
                "compare": ["before_after", "waterfall"]}
    for sub, names in expected.items():
        for name in names:
            assert_not_blank([tmp_path / sub / f"{name}.png", tmp_path / sub / f"{name}.svg"], name)
