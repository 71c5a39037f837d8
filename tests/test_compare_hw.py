"""`npusim compare` of anything with anything (issue 36): two configs (--hw A B), what-ifs
(--variant), two fusion-rules files, two pipelines not starting at the baseline; the
per-kernel table of the largest changes with each kernel's bound; the line saying when
overlap hides a change; prefill's default batch of one prompt; bad input in one line.

The pipelines here leave out the fusion pass where the test is not about it: these
tests are about compare, and stay independent of the fusion rules' format."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from npusim.cli import build_parser, main
from npusim.engine.device import KernelRecord
from npusim.engine.stats import KernelStats
from npusim.report.ab import KernelChange, critical_path, hidden

ROOT = Path(__file__).resolve().parents[1]
NO_FUSION = "layout,sync,launch"  # one stream: nothing overlaps
HALF_HBM = "base: ascend910b2\nname: half-hbm\nhbm:\n  peak_bw_bytes_per_s: 8.0e11\n"


@pytest.fixture
def wide(tmp_path) -> str:
    """k3-tiny with a 32,768-token vocabulary: its LM head GEMV reads 16 MiB of weights,
    an HBM-bound kernel (the rest of k3-tiny is bound by its kernel starts)."""
    text = (ROOT / "workloads" / "k3-tiny.yaml").read_text()
    text = re.sub(r"^name: k3-tiny", "name: k3-wide-head", text, flags=re.M)
    text, n = re.subn(r"^vocab_size: \d+", "vocab_size: 32768", text, flags=re.M)
    assert n == 1
    path = tmp_path / "wide.yaml"
    path.write_text(text)
    return str(path)


def _rows(out: str) -> dict[str, list[str]]:
    """The totals table: row label -> its cells."""
    return {line[2:24].strip(): line[24:].split() for line in out.splitlines()
            if line.startswith("  ") and len(line) > 24 and line[2:24].strip()}


def _kernel_rows(out: str) -> list[list[str]]:
    """The per-kernel table's rows: [kernel, count, A us, B us, B - A us of all, bound...]."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:5] == ["kernel", "count", "A", "us", "B"])
    rows = []
    for line in lines[start + 1:]:
        if line.startswith(("  ...", "  only in", "  no kernel's")):
            break
        rows.append(line.split())
    return rows


def _num(cell: str) -> float | None:
    return None if cell == "-" else float(cell.replace(",", ""))


# ---- two configs


def test_halving_hbm_bandwidth_slows_the_hbm_bound_kernel_and_the_table_says_so(wide, tmp_path, capsys):
    half = tmp_path / "half.yaml"
    half.write_text(HALF_HBM)
    out_json = tmp_path / "ab.json"
    argv = ["compare", "--hw", "ascend910b2", str(half), "--workload", wide, "--batch", "1", "--context", "64",
            "--passes", NO_FUSION, "--json", str(out_json)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    title, _, header = out.splitlines()[:3]
    assert title.startswith("k3-wide-head decode: batch 1 x context 64, passes: layout, sync, launch")
    assert "ascend910b2" not in title  # the configs are the columns
    assert header.split() == ["ascend910b2", "half"]
    rows = _rows(out)
    a, b = (_num(v) for v in rows["latency (us)"])
    assert b > a
    assert rows["kernels"][0] == rows["kernels"][1]
    assert "A = ascend910b2, B = half" in out
    top = _kernel_rows(out)[0]  # the largest change first
    assert top[0] == "lm_head" and top[1] == "1" and top[5] == "HBM"
    ka, kb, delta = (_num(v) for v in top[2:5])
    assert kb > ka + 5
    assert delta == pytest.approx(kb - ka, abs=0.011)
    totals = next(line for line in out.splitlines() if line.startswith("  only in A:"))
    assert _num(re.search(r"latency \+([\d,.]+) us$", totals).group(1)) == pytest.approx(b - a, abs=0.01)

    data = json.loads(out_json.read_text())
    assert set(data["runs"]) == {"ascend910b2", "half"} and data["steps"] == {}
    assert data["sides"]["half"]["hw"] == str(half) and data["sides"]["half"]["hw_name"] == "half-hbm"
    assert data["sides"]["ascend910b2"]["hw_config_sha256"] != data["sides"]["half"]["hw_config_sha256"]
    head = next(k for k in data["ab"]["kernels"] if k["name"] == "lm_head")
    assert head["a_bound"] == head["b_bound"] == "HBM" and head["delta_us"] == pytest.approx(kb - ka, abs=0.011)
    # half the bandwidth: the HBM-bound kernel's run (its task less the kernel start) nearly doubles
    ran = [head[f"{side}_us"] - next(o["start_cost_us"] for o in data["runs"][name]["ops"] if o["name"] == "lm_head")
           for side, name in (("a", "ascend910b2"), ("b", "half"))]
    assert 1.6 * ran[0] < ran[1] <= 2.05 * ran[0]
    assert data["ab"]["latency_delta_us"] == pytest.approx(data["runs"]["half"]["latency_us"]
                                                           - data["runs"]["ascend910b2"]["latency_us"])
    assert data["provenance"]["command"] == ["npusim", *argv]


def test_a_variant_is_the_same_as_the_config_it_makes(wide, tmp_path, capsys):
    """--variant KEY=VALUE against the unmodified config gives what --hw with a file of that
    value gives; two --variant groups compare one against the other."""
    half = tmp_path / "half.yaml"
    half.write_text(HALF_HBM)
    step = ["--workload", wide, "--batch", "1", "--context", "64", "--passes", NO_FUSION]
    assert main(["compare", "--hw", "ascend910b2", str(half), *step]) == 0
    by_file = _rows(capsys.readouterr().out)["latency (us)"]
    assert main(["compare", "--variant", "hbm.peak_bw_bytes_per_s=8e11", *step]) == 0
    out = capsys.readouterr().out
    assert out.startswith("k3-wide-head decode on ascend910b2: batch 1")  # what-ifs of one config: its name
    assert out.splitlines()[2].split() == ["unmodified", "hbm.peak_bw_bytes_per_s=8e11"]
    assert _rows(out)["latency (us)"] == by_file
    assert main(["compare", "--variant", "hbm.peak_bw_bytes_per_s=8e11", "--variant",
                 "hbm.peak_bw_bytes_per_s=1.6e12", *step]) == 0
    out = capsys.readouterr().out
    assert _rows(out)["latency (us)"] == by_file[::-1]
    assert _kernel_rows(out)[0][0] == "lm_head" and _num(_kernel_rows(out)[0][4]) < 0


def test_a_trace_per_side_carries_that_sides_config(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["compare", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--passes", NO_FUSION,
                 "--variant", "hbm.peak_bw_bytes_per_s=8e11", "--trace", str(trace)]) == 0
    assert f"traces: {tmp_path / 't.A.json'}, {tmp_path / 't.B.json'}" in capsys.readouterr().out
    meta = {s: json.loads((tmp_path / f"t.{s}.json").read_text())["otherData"] for s in "AB"}
    assert meta["A"]["side"] == "unmodified" and meta["A"]["hw_config"]["hbm"]["peak_bw_bytes_per_s"] == 1.6e12
    assert meta["B"]["overrides"] == {"hbm.peak_bw_bytes_per_s": "8e11"}
    assert meta["B"]["hw_config"]["hbm"]["peak_bw_bytes_per_s"] == 8e11


def test_fusion_rules_files_are_passed_through_as_paths(monkeypatch, tmp_path, capsys):
    """--fusion-rules A B runs one pipeline with each file, its path as given (the rules'
    format is the fusion pass's business): what reaches run_decoder is the path."""
    import npusim.runtime.decoder as decoder

    seen, real = [], decoder.run_decoder

    def spy(workload, hw, phase, batch, context, passes, **options):
        seen.append((passes, options.pop("fusion_rules", None)))
        return real(workload, hw, phase, batch, context, NO_FUSION, **options)  # the rules' effect is not tested here

    monkeypatch.setattr(decoder, "run_decoder", spy)
    a, b = tmp_path / "mine.yaml", tmp_path / "theirs.yaml"
    a.write_text("any: format\n")
    b.write_text("other: format\n")
    assert main(["compare", "--fusion-rules", str(a), str(b), "--workload", "k3-tiny", "--batch", "2",
                 "--context", "64", "--passes", "fusion"]) == 0
    assert seen == [("fusion", str(a)), ("fusion", str(b))]
    assert capsys.readouterr().out.splitlines()[2].split() == ["mine", "theirs"]


# ---- pipelines: the gain list after the baseline only


def test_like_kernels_of_the_layers_are_one_row(capsys):
    """k3-tiny's two layers run the same kernels: on another config each changes alike, and
    one row holds both layers' (its count 2, its change both of theirs)."""
    assert main(["compare", "--workload", "k3-tiny", "--batch", "2", "--context", "64",
                 "--hw", "ascend910b2", "ascend910b4"]) == 0
    rows = _kernel_rows(capsys.readouterr().out)
    assert len(rows) == 10 and all(r[0].startswith("L0..L1.") and r[1] == "2" for r in rows[:5])
    assert all(_num(r[4]) == pytest.approx(int(r[1]) * (_num(r[3]) - _num(r[2])), abs=0.02) for r in rows)


def test_the_gain_of_each_pass_is_listed_only_after_the_baseline(tmp_path, capsys):
    tiny = ["--workload", "k3-tiny", "--batch", "2", "--context", "64"]
    assert main(["compare", *tiny, "--passes", "baseline", "layout,sync"]) == 0
    out = capsys.readouterr().out
    assert "each pass added in order" in out and "  + layout" in out and "  + sync" in out
    assert "the kernels that changed most" not in out

    path = tmp_path / "c.json"
    assert main(["compare", *tiny, "--passes", "layout", "layout,sync", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "each pass added in order" not in out and "  + " not in out
    assert "A = layout, B = layout,sync; the kernels that changed most" in out
    # the events of `sync` change the host's waits, not a kernel's task time
    assert _kernel_rows(out) == [] and "  no kernel's task time changed by 0.005 us or more" in out
    data = json.loads(path.read_text())
    assert data["steps"] == {} and (data["ab"]["a"], data["ab"]["b"]) == ("layout", "layout,sync")


# ---- overlap


def test_a_removed_kernel_that_ran_beside_another_stream_is_said_to_be_hidden(tmp_path, capsys):
    """Without the layout pass, the streams pass puts K's and up's TransData on stream 1,
    beside Q's and gate's on stream 0; the layout pass removes them all. The line names
    one removed from stream 1, and the JSON's A run shows it there, off the critical
    path, overlapping the kernel named beside it."""
    path = tmp_path / "c.json"
    assert main(["compare", "--workload", "k3-tiny", "--batch", "8", "--passes", "sync,launch,streams",
                 "layout,sync,launch,streams", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("  hidden by overlap: ")]
    assert lines
    count, base, beside = re.match(r"  hidden by overlap: (?:(\d+) x L\*\.)?(\S+) \(removed in B; [\d.]+ us in A(?: each)?\) "
                                   r"ran in A on stream 1 beside (\S+) \(stream 0\), off the critical path",
                                   lines[0]).groups()
    data = json.loads(path.read_text())
    ops = {o["name"]: o for o in data["runs"]["sync,launch,streams"]["ops"]}
    # a line for like kernels of several layers (`2 x L*.k_proj.to_nz`, beside `L*.q_proj.to_nz`) names
    # them by what follows the layer: the JSON lists each, the first layer's is checked here
    layer0 = (lambda n: f"L0.{n}") if count else (lambda n: n)
    name, beside = layer0(base), layer0(beside[len("L*."):] if count else beside)
    assert name.endswith(".to_nz") and ops[name]["stream"] == 1 and ops[beside]["stream"] == 0
    assert name not in {o["name"] for o in data["runs"]["layout,sync,launch,streams"]["ops"]}
    k, o = ops[name], ops[beside]
    assert k["start_us"] < o["start_us"] + o["duration_us"] and o["start_us"] < k["start_us"] + k["duration_us"]
    listed = {h["name"] for h in data["ab"]["hidden_by_overlap"]}
    assert name in listed and all(ops[n]["stream"] == 1 for n in listed)


def test_no_overlap_line_on_one_stream(wide, tmp_path, capsys):
    half = tmp_path / "half.yaml"
    half.write_text(HALF_HBM)
    assert main(["compare", "--hw", "ascend910b2", str(half), "--workload", wide, "--batch", "1", "--context", "64",
                 "--passes", NO_FUSION]) == 0
    assert "hidden by overlap" not in capsys.readouterr().out


def _k(id_, stream, queued, end, name=None) -> KernelRecord:
    return KernelRecord(id_, name or f"k{id_}", "add", "AIV", 1, stream, queued, queued, end, KernelStats())


def test_the_critical_path_follows_what_each_kernel_waited_for():
    # stream 0: x [0, 10] then y; stream 1: k [0, 4]. y waits for x: k is off the path
    x, k, y = _k(0, 0, 0, 10), _k(1, 1, 0, 4), _k(2, 0, 10, 12)
    assert critical_path([x, k, y]) == {0, 2}
    # now y waits on an event of k (k ends at 10, x at 6): k is on the path, x is not
    x, k, y = _k(0, 0, 0, 6), _k(1, 1, 0, 10), _k(2, 0, 10, 12)
    assert critical_path([x, k, y]) == {1, 2}
    # a host gap (y queued at 15) keeps the path through the kernel before it
    assert critical_path([_k(0, 0, 0, 10), _k(1, 0, 15, 20)]) == {0, 1}


def test_a_slower_kernel_the_step_waited_for_is_not_called_hidden():
    """k slows from 4 to 10 cycles beside x: in B the join waits for k, so the change is
    not hidden; when k slows only to 8 (x still ends last) it is."""
    def runs(k_end_b):
        a = [_k(0, 0, 0, 9, "x"), _k(1, 1, 0, 4, "k"), _k(2, 0, 9, 12, "y")]
        b = [_k(0, 0, 0, 9, "x"), _k(1, 1, 0, k_end_b, "k"), _k(2, 0, max(9, k_end_b), 12, "y")]
        return (SimpleNamespace(result=SimpleNamespace(kernels=a)), SimpleNamespace(result=SimpleNamespace(kernels=b)))

    def change(end):
        return [KernelChange("k", 0, "add", 4.0, float(end), "launch", "launch")]

    assert hidden(*runs(10), change(10)) == []
    (h,) = hidden(*runs(8), change(8))
    assert h.change.name == "k"
    assert (h.side, h.stream, h.beside, h.beside_stream) == ("B", 1, "x", 0)


# ---- prefill: one prompt unless told


@pytest.mark.parametrize(("command", "decode"), [("run", 8), ("compare", 8), ("sweep", 8), ("validate", 2)])
def test_prefill_without_batch_is_one_prompt(command, decode):
    parse = build_parser().parse_args
    extra = ["--out", "x"] if command == "sweep" else []
    assert parse([command, *extra]).batch == decode
    assert parse([command, "--phase", "prefill", *extra]).batch == 1
    assert parse([command, "--phase", "prefill", "--batch", "4", *extra]).batch == 4
    assert parse([command, "--batch", "3", "--phase", "decode", *extra]).batch == 3


def test_a_prefill_run_without_batch_runs_one_prompt(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["run", "--workload", "k3-tiny", "--phase", "prefill", "--context", "32", "--passes", NO_FUSION,
                 "--json", str(path)]) == 0
    assert "batch 1 x prompt 32" in capsys.readouterr().out.splitlines()[0]
    assert json.loads(path.read_text())["batch"] == 1


# ---- bad input: one line


@pytest.mark.parametrize(("extra", "said"), [
    (["--hw", "no-such-config", "ascend910b2"], "no config named 'no-such-config'"),
    (["--hw", "ascend910b2", "--hw", "ascend910b4"], "--hw given twice: give its values after one --hw"),
    (["--hw", "ascend910b2", "ascend910b2"], "--hw ascend910b2 ascend910b2: the same on both sides"),
    (["--hw", "ascend910b2", "ascend910b4", "ascend910b1"], "expected at most two to compare (A and B), got 3"),
    (["--hw", "ascend910b2", "ascend910b4", "--passes", "baseline", "optimized"], "runs ONE pipeline"),
    (["--hw", "ascend910b2", "ascend910b4", "--variant", "l2.l2_bytes=100663296"], "compare one thing at a time"),
    (["--hw", "ascend910b2", "ascend910b4", "--plans", "tp1", "tp2"], "--plans: compares plans on one config"),
    (["--variant", "l2.l2_bytes"], "--variant l2.l2_bytes: expected key.path=value"),
    (["--variant", "l2.no_such_field=1"], "l2.no_such_field=1: ascend910b2 (--set): unknown key"),
    (["--variant", "l2.l2_bytes=1,2"], "--variant l2.l2_bytes=1,2: takes one value"),
    (["--fusion-rules", "a.yaml", "--fusion-rules", "b.yaml"], "--fusion-rules given twice"),
    # the same passes named in another order: the step run once, shown as two columns of +0.00
    (["--passes", "fusion,memplan", "memplan,fusion"], "--passes fusion,memplan memplan,fusion: fusion,memplan and "
     "memplan,fusion run the same passes (fusion, memplan, in the order they run), nothing to compare"),
    # these ran the one step twice and printed a table of +0.00
    (["--variant", "l2.l2_bytes=201326592"], "sides unmodified and l2.l2_bytes=201326592: the same config and "
                                             "fusion rules once loaded, nothing to compare"),
    (["--variant", "chip.aic_count=4", "--variant", "chip.aic_count=4.0"],
     "sides chip.aic_count=4 and chip.aic_count=4.0: the same config and fusion rules once loaded"),
    (["--variant", "chip.freq_hz=1.8e9", "--variant", "chip.freq_hz=1800000000"],
     "sides chip.freq_hz=1.8e9 and chip.freq_hz=1800000000: the same config"),
])
def test_bad_input_is_one_line(extra, said, capsys):
    try:  # a usage error (a flag given twice) exits from argparse, the rest return
        status = main(["compare", "--workload", "k3-tiny", "--batch", "2", "--context", "64", *extra])
    except SystemExit as e:
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_output_onto_the_second_config_is_refused(tmp_path, capsys):
    half = tmp_path / "half.yaml"
    half.write_text(HALF_HBM)
    assert main(["compare", "--hw", "ascend910b2", str(half), "--workload", "k3-tiny", "--json", str(half)]) == 2
    err = capsys.readouterr().err
    assert "the same file as the input of --hw (B)" in err and err.count("\n") == 1
    assert half.read_text() == HALF_HBM


def test_one_hw_compares_pipelines_on_that_config(capsys):
    """--hw with one name is no A/B: the pipelines, side by side on that config."""
    assert main(["compare", "--hw", "ascend910b4", "--workload", "k3-tiny", "--batch", "2", "--context", "64",
                 "--passes", "baseline", NO_FUSION]) == 0
    out = capsys.readouterr().out
    assert out.startswith("k3-tiny decode on ascend910b4: batch 2")
    assert out.splitlines()[2].split() == ["baseline", NO_FUSION] and "each pass added in order" in out


# ---- the Python API


def test_compare_in_python_runs_one_pipeline_per_side_and_steps_only_from_the_baseline():
    import npusim

    c = npusim.compare("k3-tiny", batch=2, context=64, pipelines=["layout"],
                       sides={"a": {"hw": "ascend910b2"}, "b": {"overrides": {"hbm.peak_bw_bytes_per_s": 8e11}}})
    assert list(c.runs) == ["a", "b"] and c.steps == {}
    assert c.runs["b"].hw.hbm.peak_bw_bytes_per_s == 8e11 and c.runs["a"].hw.hbm.peak_bw_bytes_per_s == 1.6e12
    assert c.runs["a"].graph.applied == c.runs["b"].graph.applied == ("layout",)
    assert npusim.compare("k3-tiny", batch=2, context=64, pipelines=["layout", "layout,sync"]).steps == {}
    assert list(npusim.compare("k3-tiny", batch=2, context=64, pipelines=["baseline", "layout,sync"]).steps) == \
        ["layout", "sync"]
    with pytest.raises(npusim.ConfigError, match="runs ONE pipeline, got 2"):
        npusim.compare("k3-tiny", batch=2, context=64, sides={"a": {}, "b": {"overrides": {"l2.l2_bytes": 1 << 20}}})
