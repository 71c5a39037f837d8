"""The command line's surfaces agree with each other (issue 17): defaults in --help,
one meaning per flag in every subcommand, compare's pass syntax, provenance in
every JSON and trace, overrides in the headers, truncated tables that say so."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

import npusim
from npusim.cli import build_parser, main
from npusim.report.contract import config_hash
from npusim.report.tables import statistic_rows, statistic_table

TINY = ["--workload", "k3-tiny", "--batch", "2", "--context", "64"]
SET = "hbm.peak_bw_bytes_per_s=3.2e12"


def help_of(*command: str) -> str:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command[0]]
    return re.sub(r"\s+", " ", sub.format_help())


# ---- --help


@pytest.mark.parametrize(("command", "defaults"), [
    ("run", {"--batch": "8 in decode; in prefill 1: one prompt", "--phase": "decode", "--passes": "optimized", "--hw": "ascend910b2",
             "--workload": "k3", "--trace-level": "kernel"}),
    ("compare", {"--batch": "8 in decode; in prefill 1: one prompt", "--phase": "decode", "--passes": "baseline optimized", "--hw": "ascend910b2"}),
    ("sweep", {"--batch": "8 in decode; in prefill 1: one prompt", "--phase": "decode", "--passes": "optimized", "--hw": "ascend910b2"}),
    ("validate", {"--batch": "2 in decode; in prefill 1: one prompt", "--context": "64", "--passes": "optimized", "--workload": "k3-tiny"}),
    ("op", {"--hw": "ascend910b2"}),
])
def test_help_shows_the_defaults(command, defaults):
    text = help_of(command)
    for flag, value in defaults.items():
        after = text.split(f" {flag} ", 1)[1]  # the flag's help, then the rest
        assert after.split("(default: ", 1)[1].startswith(f"{value})"), (flag, after[:300])
    assert "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("command", ["run", "compare", "op"])
def test_set_takes_one_value_and_says_so(command):
    assert "one value per --set" in help_of(command) and "lists of values: sweep" in help_of(command)
    assert "LIST of values" in help_of("sweep")


@pytest.mark.parametrize("argv", [
    ["run", *TINY, "--set", "hbm.peak_bw_bytes_per_s=1e12,2e12"],
    ["compare", *TINY, "--set", "hbm.peak_bw_bytes_per_s=1e12,2e12"],
    ["op", "add", "--set", "hbm.peak_bw_bytes_per_s=1e12,2e12"],
])
def test_a_list_in_set_outside_a_sweep_points_to_sweep(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "takes one value here" in err and "npusim sweep --set hbm.peak_bw_bytes_per_s=1e12,2e12" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("flag", ["--hw", "--set", "--json", "--trace", "--plot", "--profile", "--list"])
def test_op_help_lists_its_flags_and_the_ops_parameters(flag, capsys):
    assert main(["op", "matmul", "--help"]) == 0
    out = capsys.readouterr().out
    assert f" {flag}" in out and "\n  m " in out and "\n  trans_b " in out
    assert main(["op", "--help"]) == 0
    assert f" {flag}" in capsys.readouterr().out


def test_the_shared_flags_mean_the_same_everywhere():
    """--hw, --set, --json, --plot: one help text for each in every subcommand that has them."""
    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices
    for flag in ("--hw", "--set", "--json", "--plot", "--no-memo", "--progress"):
        helps = {}
        for name in ("run", "compare", "op", "sweep"):
            for a in subs[name]._actions:
                if flag in a.option_strings:
                    helps[name] = a.help.split(":")[0]
        if flag == "--set":
            helps.pop("sweep")  # the one place --set takes a list: the grid
        assert len(set(helps.values())) == 1, (flag, helps)


# ---- op --profile and compare --trace


def test_op_profile_writes_the_tables(tmp_path, capsys):
    assert main(["op", "add", "shape=8,4096", "--profile", str(tmp_path)]) == 0
    assert "tables:" in capsys.readouterr().out
    lines = (tmp_path / "op_summary.csv").read_text().splitlines()
    assert lines[0].startswith("Op Name,OP Type") and len(lines) == 2
    assert (tmp_path / "op_statistic.csv").exists()


def test_compare_takes_pipelines_as_words_and_traces_each(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["compare", *TINY, "--passes", "baseline", "fusion,memplan", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    header = [line for line in out.splitlines() if "latency (us)" in line][0]
    assert len(re.findall(r"\d[\d,.]*", header)) == 2  # two columns
    assert re.search(r"baseline\s+fusion,memplan", out)
    for name in ("baseline", "fusion+memplan"):
        data = json.loads((tmp_path / f"t.{name}.json").read_text())
        assert data["otherData"]["pipeline"] == name.replace("+", ",")
        assert data["otherData"]["command"][:2] == ["npusim", "compare"]


@pytest.mark.parametrize("command", ["compare", "run"])
@pytest.mark.parametrize("passes", ["baseline,optimized", "optimized,baseline", "baseline, optimized,fusion"])
def test_a_comma_list_of_pipelines_is_refused_with_the_syntax(command, passes, capsys):
    assert main([command, *TINY, "--passes", passes]) == 2
    err = capsys.readouterr().err
    assert "a comma list is ONE pipeline" in err and "npusim compare --passes" in err and err.count("\n") == 1


def test_a_comma_list_of_passes_is_one_pipeline_in_both(capsys):
    assert main(["run", *TINY, "--passes", "optimized,buckets", "--buckets", "64,128"]) == 0
    assert "buckets" in capsys.readouterr().out.splitlines()[0]


# ---- provenance


def _check_provenance(p: dict, argv: list[str], overridden: bool) -> None:
    assert p["command"] == ["npusim", *argv]
    assert p["npusim_version"] == npusim.__version__
    canonical = json.dumps(p["hw_config"], sort_keys=True, separators=(",", ":"))
    assert p["hw_config_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert p["hw"] == p["hw_config"]["name"] == "ascend910b2"
    if overridden:
        assert p["overrides"] == {"hbm.peak_bw_bytes_per_s": "3.2e12"}
        assert p["hw_config"]["hbm"]["peak_bw_bytes_per_s"] == 3.2e12
    else:
        assert p["overrides"] == {}


def test_run_json_and_trace_carry_provenance(tmp_path, capsys):
    argv = ["run", *TINY, "--set", SET, "--json", str(tmp_path / "r.json"), "--trace", str(tmp_path / "t.json")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"k3-tiny decode on ascend910b2 (--set {SET}): batch 2")
    report = json.loads((tmp_path / "r.json").read_text())
    _check_provenance(report["provenance"], argv, overridden=True)
    assert report["provenance"]["workload"]["name"] == "k3-tiny"
    assert report["provenance"]["workload"]["path"].endswith("workloads/k3-tiny.yaml")
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["otherData"] == report["provenance"]


def test_the_hash_follows_the_effective_config(tmp_path, capsys):
    hashes = []
    for extra in ([], ["--set", SET], ["--set", "hbm.peak_bw_bytes_per_s=1.6e12"]):
        assert main(["op", "add", "--json", str(tmp_path / "o.json"), *extra]) == 0
        hashes.append(json.loads((tmp_path / "o.json").read_text())["provenance"]["hw_config_sha256"])
    capsys.readouterr()
    assert hashes[0] != hashes[1]
    assert hashes[0] == hashes[2]  # 1.6e12 is the default: the same config, the same hash


def test_op_json_carries_provenance_and_the_header_the_overrides(tmp_path, capsys):
    argv = ["op", "add", "--set", SET, "--json", str(tmp_path / "o.json")]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"add on ascend910b2 (--set {SET}): ")
    _check_provenance(json.loads((tmp_path / "o.json").read_text())["provenance"], argv, overridden=True)


def test_compare_json_carries_provenance(tmp_path, capsys):
    argv = ["compare", *TINY, "--passes", "baseline", "fusion", "--json", str(tmp_path / "c.json")]
    assert main(argv) == 0
    assert "on ascend910b2: batch 2" in capsys.readouterr().out
    _check_provenance(json.loads((tmp_path / "c.json").read_text())["provenance"], argv, overridden=False)


def test_config_hash_is_canonical():
    assert config_hash({"a": 1, "b": {"c": 2.5}}) == config_hash({"b": {"c": 2.5}, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


# ---- tables and progress


def test_a_truncated_op_table_says_how_many_more():
    from npusim.runtime.decoder import run_decoder

    run = run_decoder("k3-tiny", batch=2, context=64)
    rows = statistic_rows(run.result)
    table = statistic_table(run.result, top=3)
    kernels = sum(r["Count"] for r in rows[3:])
    assert f"... and {len(rows) - 3} more ({kernels} kernel{'s' * (kernels != 1)}, " in table
    assert "more" not in statistic_table(run.result, top=len(rows))


def test_compare_shows_progress_only_when_asked(capsys):
    assert main(["compare", *TINY, "--passes", "baseline", "fusion"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["compare", *TINY, "--passes", "baseline", "fusion", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "compare: 2/2 runs" in err and "Traceback" not in err


def test_run_shows_kernel_progress_only_when_asked(capsys, tmp_path):
    assert main(["run", *TINY, "--json", str(tmp_path / "r.json")]) == 0
    assert capsys.readouterr().err == ""
    # the bar counts the step's kernels, as many as the report's kernel_count (the
    # lowerings decide how many: e.g. a matmul that splits K adds its zero-fill kernel)
    kernels = json.loads((tmp_path / "r.json").read_text())["kernel_count"]
    assert main(["run", *TINY, "--no-memo", "--progress"]) == 0
    err = capsys.readouterr().err
    assert f"run: {kernels}/{kernels} kernels" in err and "Traceback" not in err
