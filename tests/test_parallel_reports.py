"""Reports of several devices: the Chrome trace with a process group per device and
the collectives as spans, `compare --plans`, and the plot against the TP degree."""

from __future__ import annotations

import re

import pytest

from npusim.hw import load_hw
from npusim.ops.collectives import KINDS
from npusim.parallel.trace import run_trace
from npusim.report import chrome_trace, memory_timeline
from npusim.runtime.decoder import run_decoder
from trace_check import check_trace

HW = load_hw()
TINY = ["--workload", "k3-tiny", "--batch", "2", "--context", "64"]


def _processes(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}


def _device_of(name: str) -> int:
    return int(re.match(r"device (\d+) ", name)[1])


def test_one_device_trace_is_the_single_device_trace():
    run = run_decoder("k3-tiny", HW, "decode", 2, 64, "optimized")
    memory = memory_timeline(run)
    assert run_trace(run, memory) == chrome_trace(run.result, memory)


@pytest.mark.parametrize("phase, tp, sp", [("decode", 2, 1), ("prefill", 1, 2), ("prefill", 2, 2)])
def test_a_trace_per_device_repeats_the_simulated_timeline(phase, tp, sp):
    run = run_decoder("k3-tiny", HW, phase, 1, 64, "optimized", tp=tp, sp=sp)
    one = chrome_trace(run.result, memory_timeline(run))
    trace = run_trace(run, memory_timeline(run))
    check_trace(trace)
    world, sim = tp * sp, (sp - 1) * tp  # the last part of the prompt is simulated
    names = _processes(trace)
    single = sorted(_processes(one).values())
    for d in range(world):
        label = f"device {d} (simulated)" if d == sim else f"device {d} (symmetric copy of device {sim})"
        mine = sorted(n for n in names.values() if _device_of(n) == d)
        assert mine == sorted(f"{label}: {n}" for n in single + ["collectives"])
    assert trace["otherData"]["devices"]["simulated"] == sim
    # every device's kernel spans are the simulated one's, at the same times
    spans = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and names[e["pid"]].endswith(": kernels"):
            spans.setdefault(_device_of(names[e["pid"]]), []).append((e["name"], e["ts"], e["dur"]))
    assert len(spans) == world and all(s == spans[sim] for s in spans.values())
    ones = sorted((e["name"], e["ts"], e["dur"]) for e in one["traceEvents"] if e.get("cat") == "kernel")
    assert sorted(spans[sim]) == ones


def _collective_events(trace: dict, device: int) -> list[dict]:
    names = _processes(trace)
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and names[e["pid"]].endswith(": collectives")
            and _device_of(names[e["pid"]]) == device]


def test_collectives_are_spans_with_their_steps_inside():
    run = run_decoder("k3-tiny", HW, "decode", 2, 64, "optimized", tp=2)
    trace = run_trace(run)
    nodes = [n for n in run.graph.nodes if n.op_type in KINDS]
    records = [r for r in run.result.kernels if r.op_type in KINDS]
    for d in (0, 1):
        events = _collective_events(trace, d)
        whole = [e for e in events if e["cat"] == "collective"]
        assert sorted(e["name"] for e in whole) == sorted(n.name for n in nodes)
        assert all(e["args"]["group"] == [0, 1] and e["args"]["rank"] == d for e in whole)
        steps = [e for e in events if e["cat"] in ("transfer", "collective kernel")]
        assert len(steps) == len(records)
        for s in steps:  # inside its collective's span
            parent = next(e for e in whole if s["name"].startswith(e["name"]))
            assert parent["ts"] <= s["ts"] and s["ts"] + s["dur"] <= parent["ts"] + parent["dur"] + 1e-9
        sends = [e for e in steps if e["cat"] == "transfer"]
        assert sends and all(e["args"]["sends_to"] == e["args"]["receives_from"] == [1 - d] for e in sends)


def test_flow_arrows_go_to_the_devices_a_step_sends_to():
    """tp 2 x sp 2 prefill: the all_reduces go within a tensor-parallel pair (0-1, 2-3), the
    all_gathers of K and V between the parts (0-2, 1-3); one arrow per device and peer."""
    run = run_decoder("k3-tiny", HW, "prefill", 1, 64, "optimized", tp=2, sp=2)
    trace = run_trace(run)
    names = _processes(trace)
    ends: dict = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "f") and e["cat"] == "collective":
            ends.setdefault(e["id"], {})[e["ph"]] = (e["name"], _device_of(names[e["pid"]]))
    pairs = {(v["s"][0], v["s"][1], v["f"][1]) for v in ends.values()}
    assert pairs == {("all_reduce", a, b) for a, b in ((0, 1), (1, 0), (2, 3), (3, 2))} | \
        {("all_gather", a, b) for a, b in ((0, 2), (2, 0), (1, 3), (3, 1))}
    transfers = sum(1 for r in run.result.kernels if r.op_type in KINDS and r.core_type == "HCCS")
    assert len(ends) == 4 * transfers  # each device, each step, one peer in a group of two


def test_run_writes_the_devices_trace_and_the_plan_in_its_json(tmp_path, capsys):
    import json

    from npusim.cli import main

    path, report = tmp_path / "t.json", tmp_path / "r.json"
    assert main(["run", *TINY, "--tp", "2", "--trace", str(path), "--json", str(report)]) == 0
    trace = json.loads(path.read_text())
    check_trace(trace)
    assert {_device_of(n) for n in _processes(trace).values()} == {0, 1}
    assert trace["otherData"]["command"][:2] == ["npusim", "run"] and "devices" in trace["otherData"]
    data = json.loads(report.read_text())
    assert data["plan"] == {"tp": 2, "sp": 1, "devices": 2, "simulated_device": 0}
    comm = data["communication"]
    assert 0 < comm["exposed_comm_us"] <= comm["comm_us"] < data["latency_us"]
    assert comm["comm_share"] == pytest.approx(comm["comm_us"] / data["latency_us"])
    assert main(["run", *TINY, "--json", str(report)]) == 0
    assert "plan" not in json.loads(report.read_text())  # one device: the report as before


# ---- compare --plans


def _table(out: str) -> dict[str, list[str]]:
    """compare --plans' table: row label -> the cells, a plan's column each."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"  (\S.{21})(.*)$", line)
        if m and re.search(r"\S\s{2,}\S|^\s+\S", m[2]) and not line.startswith("  one device"):
            rows[m[1].strip()] = re.split(r"\s{2,}", m[2].strip())
    return rows


def test_compare_plans_side_by_side(tmp_path, capsys):
    import json

    from npusim.cli import main

    path = tmp_path / "c.json"
    argv = ["compare", *TINY, "--plans", "tp1", "tp2", "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = _table(out)
    assert rows["devices"] == ["1", "2"]
    assert rows["speed-up over tp1"][0] == "1.00x" and rows["communication share"][0] == "0.0%"
    data = json.loads(path.read_text())
    assert list(data["plans"]) == ["tp1", "tp2"] and data["speedup_over"] == "tp1"
    one, two = data["plans"]["tp1"], data["plans"]["tp2"]
    # the numbers are run's: the same step, run alone
    alone = run_decoder("k3-tiny", HW, "decode", 2, 64, "optimized", tp=2)
    assert two["latency_us"] == alone.latency_us and two["plan"]["devices"] == 2
    assert two["speedup"] == pytest.approx(one["latency_us"] / two["latency_us"])
    assert rows["speed-up over tp1"][1] == f"{two['speedup']:.2f}x"
    assert one["communication"]["comm_us"] == 0 < two["communication"]["exposed_comm_us"]
    assert rows["communication share"][1] == f"{100 * two['communication']['comm_share']:.1f}%"
    assert two["peak_memory_bytes"] < one["peak_memory_bytes"]  # each device holds half the heads and FFN
    assert data["provenance"]["command"] == ["npusim", *argv]
    first = path.read_bytes()
    assert main(argv) == 0 and capsys.readouterr().out == out and path.read_bytes() == first  # bit for bit


def test_compare_plans_of_sequence_and_tensor_parallel_prefill(capsys):
    from npusim.cli import main

    assert main(["compare", "--workload", "k3-tiny", "--batch", "1", "--context", "64", "--phase", "prefill",
                 "--plans", "tp1", "sp2", "tp2,sp2"]) == 0
    rows = _table(capsys.readouterr().out)
    assert rows["devices"] == ["1", "2", "4"]
    assert all(float(v.rstrip("%")) > 0 for v in rows["communication share"][1:])


def test_compare_plans_shows_a_plan_that_does_not_fit(tmp_path, capsys):
    """At 3 MiB of device memory k3-tiny's weights need two devices: tp1 says so, tp2 runs."""
    import json

    from npusim.cli import main

    path = tmp_path / "c.json"
    assert main(["compare", *TINY, "--plans", "tp1", "tp2", "--set", "hbm.hbm_bytes=3145728",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    rows = _table(out)
    assert rows["devices"] == ["1", "2"] and rows["latency (us)"][0] == "does not fit"
    assert rows["speed-up over tp2"] == ["does not fit", "1.00x"]
    assert re.search(r"^  tp1: .* does not fit .*fit on 2 devices \(--tp 2\)$", out, re.M)
    data = json.loads(path.read_text())
    assert data["plans"]["tp1"]["fits"] is False and "fit on 2 devices" in data["plans"]["tp1"]["error"]
    assert data["plans"]["tp2"]["fits"] is True and data["speedup_over"] == "tp2"


def test_compare_plans_writes_a_trace_per_plan_and_the_plot(tmp_path, capsys):
    import json

    from npusim.cli import main
    from test_plots import assert_not_blank

    trace = tmp_path / "t.json"
    assert main(["compare", *TINY, "--plans", "tp1", "tp2", "--trace", str(trace), "--plot",
                 str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert f"traces: {tmp_path / 't.tp1.json'}, {tmp_path / 't.tp2.json'}" in out
    one, two = (json.loads((tmp_path / f"t.{n}.json").read_text()) for n in ("tp1", "tp2"))
    check_trace(two)
    assert not any(re.match(r"device \d+ ", n) for n in _processes(one).values())  # one device: as run writes it
    assert {_device_of(n) for n in _processes(two).values()} == {0, 1}
    assert two["otherData"]["plan"] == "tp2"
    assert_not_blank([tmp_path / "plots" / "plan_scaling.png", tmp_path / "plots" / "plan_scaling.svg"],
                     "plan_scaling")


def test_compare_of_pipelines_under_a_plan_checks_the_sharded_numerics(monkeypatch, capsys):
    """compare --tp 2 --passes A B: each pipeline's shard checked as validate --tp checks it
    (it used to stop at the first all_reduce); an all_reduce that does not sum shows FAIL."""
    import attrs

    from npusim.cli import main
    from npusim.ops import OPS

    argv = ["compare", *TINY, "--tp", "2", "--passes", "baseline", "optimized"]
    assert main(argv) == 0
    row = _table(capsys.readouterr().out)["logits cosine vs FP32"]
    assert row == ["1.00000 ok", "1.00000 ok"]
    keep = attrs.evolve(OPS["all_reduce"], reference=lambda p, x, specs, ctx: {"y": x["x"]})
    monkeypatch.setitem(OPS, "all_reduce", keep)
    assert main(argv) == 0
    assert all(v.endswith("FAIL") for v in _table(capsys.readouterr().out)["logits cosine vs FP32"])


def test_compare_plans_imports_matplotlib_only_to_plot(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from npusim.cli import main; "
            f"assert main({['compare', *TINY, '--plans', 'tp1', 'tp2']!r}) == 0; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.splitlines()[-1] == "False"
