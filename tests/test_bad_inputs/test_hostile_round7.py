"""Bad-input catalogue, round 7's hostile sweep: a ramp whose stages overflowed (a
traceback), numbers spelt '1_0' or '２' taken silently, duplicated columns, keys, fields
and pipelines of which one was kept silently, an empty NPUSIM_CACHE_DIR that fell back
to (and cleared) the user's cache, a negative routing seed (a traceback), --ep with
--pp worded as a pass option, and errors naming the wrong flag. Each is now one line
naming the flag, file or key; nothing runs and nothing is written."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_check import fails_cleanly
from kernels import deadline
from npusim.cli import main

SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--requests", "5"]
STEP = ["--batch", "1", "--context", "16", "--no-cache"]
HEADER = "arrival_s,prompt_tokens,output_tokens\n"


# ---- serve: the load


@pytest.mark.parametrize("ramp", ["1e-300,1e-300,1e-300,1e-300", "5e-324,1,1,2"])
def test_a_ramp_past_the_longest_load(ramp, capsys):
    """Its stage count overflowed: OverflowError: cannot convert float infinity to integer."""
    fails_cleanly([*SERVE, "--ramp", ramp], capsys, r"--ramp: the 5 requests would arrive over .* s, more than the "
                                                   r"1e\+09 s")


@pytest.mark.parametrize("ramp", ["1,1,5e-324,2", "1,0,5e-324,2"])
def test_a_ramp_of_a_tiny_stage_runs(ramp, tmp_path):
    """An EVERY_S of 5e-324 s is past every stage at once: the ramp's top rate (was a traceback)."""
    out = tmp_path / "o.json"
    assert main([*SERVE, "--ramp", ramp, "--prompt-lengths", "fixed:16", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["completed"] == 5


@pytest.mark.parametrize("argv, expect", [
    (["--rate", "5", "--requests", "1_0"], r"argument --requests: invalid int value: '1_0'"),  # 10 requests
    (["--rate", "５"], r"argument --rate: invalid float value: '５'"),  # 5 req/s
    (["--rate", "5", "--tp", "２"], r"argument --tp: invalid int value: '２'"),
    (["--rate", "5", "--pd", "١:١"], r"--pd: expected P:D, whole numbers .*, got '١:١'"),  # served as 1:1
    (["--rate", "5", "--slo", "ttft_ms=1_0"], r"--slo ttft_ms: expected a number of milliseconds, got '1_0'$"),
    (["--rate", "5", "--slo", "ttft_ms=５"], r"--slo ttft_ms: expected a number of milliseconds, got '５'$"),
    (["--rate", "5", "--prompt-lengths", "fixed:1_0"], r"--prompt-lengths: expected fixed:N, got 'fixed:1_0'$"),
    (["--rate", "5", "--output-lengths", "uniform:1,１０"], r"--output-lengths: expected uniform:MIN,MAX, got "),
    (["--ramp", "1,1_0,1,20"], r"--ramp: expected START,STEP,EVERY_S,MAX"),
])
def test_a_number_spelt_with_an_underscore_or_other_digits(argv, expect, capsys):
    fails_cleanly([*SERVE, *argv], capsys, expect)


@pytest.mark.parametrize("name, text, expect", [
    ("t.csv", HEADER + "0,1_0,4\n", r"row 2: column 'prompt_tokens': expected an integer, got '1_0'$"),
    ("t.csv", HEADER + "0,１０,4\n", r"row 2: column 'prompt_tokens': expected an integer, got '１０'$"),
    ("t.csv", "arrival_s,prompt_tokens,output_tokens,arrival_s\n0,10,4,1\n",  # the last arrival_s was read
     r"t.csv: row 1: column 'arrival_s' given twice$"),
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 4, "arrival_s": 5}\n',
     r"t.jsonl: line 1: key 'arrival_s' given twice$"),
])
def test_bad_trace_cells(name, text, expect, capsys, tmp_path):
    f = tmp_path / name
    f.write_text(text)
    fails_cleanly([*SERVE, "--trace-file", f], capsys, expect)


def test_an_slo_list_of_nothing(capsys):
    """`--slo ,` kept the service's SLOs, as `--slo ''` did before round 5."""
    fails_cleanly([*SERVE, "--rate", "5", "--slo", ","], capsys, r"--slo ,: expected KEY=MS,\.\.\. .*, got none$")


# ---- serve: services


@pytest.mark.parametrize("item, expect", [
    ("=1", r"--service-set =1: expected key\.path=value$"),  # said --set
    ("scheduler.max_batch", r"--service-set scheduler\.max_batch: expected key\.path=value$"),
])
def test_a_service_set_error_names_its_flag(item, expect, capsys):
    fails_cleanly([*SERVE, "--rate", "5", "--service-set", item], capsys, expect)


def test_a_service_set_given_twice_names_its_flag(capsys):
    fails_cleanly([*SERVE, "--rate", "5", "--service-set", "scheduler.max_batch=16", "--service-set",
                   "scheduler.max_batch=8"], capsys,
                  r"--service-set scheduler\.max_batch: given twice \('16' and '8'\)")


@pytest.mark.parametrize("buckets, expect", [
    ("[64,32]", r"'buckets' must be strictly increasing lengths, got 32 after 64"),  # the pass sorted them
    ("[64,64]", r"'buckets' must be strictly increasing lengths, got 64 after 64"),  # it kept both
])
def test_service_buckets_out_of_order(buckets, expect, capsys):
    fails_cleanly([*SERVE, "--rate", "5", "--service-set", f"buckets={buckets}"], capsys,
                  r"seed-optimized\.yaml \(--service-set\): " + expect)


def test_a_service_file_with_buckets_out_of_order(capsys, tmp_path):
    from npusim.hw.load import find_file

    f = tmp_path / "svc.yaml"
    f.write_text(find_file("seed-optimized", "services").read_text().replace("[512, 1024,", "[1024, 512,"))
    fails_cleanly([*SERVE, "--rate", "5", "--service", f], capsys,
                  r"svc\.yaml: 'buckets' must be strictly increasing lengths, got 512 after 1024")


def test_compare_of_one_service_with_itself(capsys, monkeypatch):
    """It served the same service twice and printed a table of 1.00x."""
    priced = []
    monkeypatch.setattr("npusim.serving.command.serve", lambda *a: priced.append(a))
    fails_cleanly([*SERVE, "--rate", "5", "--compare", "seed-optimized", "seed-optimized"], capsys,
                  r"--compare seed-optimized seed-optimized: the same service on both sides, nothing to compare")
    assert not priced


# ---- run: flags, plans and MoE routing


@pytest.mark.parametrize("argv, expect", [
    (["run", "--workload", "k3-tiny-moe", "--ep", "２", *STEP], r"argument --ep: invalid int value: '２'"),  # ep 2
    (["run", "--workload", "k3-tiny", "--batch", "1_6", "--context", "16"], r"argument --batch: invalid int value"),
    (["compare", "--workload", "k3-tiny", "--plans", "tp１", *STEP], r"--plans tp１: expected tpN, spN"),  # ran tp1
    (["op", "matmul", "m=１６", "n=64", "k=64"], r"op matmul: parameter 'm': expected a number in ASCII digits "
                                                r"without '_', got '１６'$"),
    (["op", "matmul", "m=1_6", "n=64", "k=64"], r"op matmul: parameter 'm': expected a number"),
    (["op", "matmul", "m=16", "n=64", "k=64", "tiling.base_m=1_6"], r"parameter 'tiling\.base_m': expected a number"),
    (["op", "matmul", "m=16", "n=64", "k=64", "n_parts=32,3_2"], r"parameter 'n_parts': expected a number"),
])
def test_a_step_number_spelt_with_an_underscore_or_other_digits(argv, expect, capsys):
    fails_cleanly(argv, capsys, expect)


def test_ep_with_pp(capsys):
    """It was 'apply: unknown pass option 'ep''."""
    fails_cleanly(["run", "--workload", "k3-tiny-moe", "--batch", "4", "--context", "64", "--no-cache", "--ep", "2",
                   "--pp", "2"], capsys, r"--pp with --ep: a pipeline of expert-parallel stages is not modelled$")


@pytest.mark.parametrize("sets, expect", [
    (["routing_seed=-1"], r"key 'routing_seed': expected a whole number >= 0, got -1$"),  # numpy's traceback
    (["routing_zipf_exponent=1e308"], r"key 'routing_zipf_exponent': expected a value from 0 to 64 \(a sanity "
                                      r"bound\), got 1e\+308$"),  # numpy's RuntimeWarnings on stderr
])
def test_bad_routing_fields(sets, expect, capsys):
    argv = ["run", "--workload", "k3-tiny-moe", "--workload-set", "routing=zipf", *STEP]
    for s in sets:
        argv += ["--workload-set", s]
    fails_cleanly(argv, capsys, r"k3-tiny-moe\.yaml \(--workload-set\): " + expect)


def test_the_steepest_zipf_routing_runs_without_a_warning(capsys):
    argv = ["run", "--workload", "k3-tiny-moe", "--workload-set", "routing=zipf", "--workload-set",
            "routing_zipf_exponent=64", *STEP]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""


# ---- compare


def test_compare_of_one_pipeline_with_itself(capsys):
    """Its runs were one column: the table showed one pipeline of the two asked for."""
    fails_cleanly(["compare", "--workload", "k3-tiny", *STEP, "--passes", "baseline", "baseline"], capsys,
                  r"--passes baseline baseline: the pipeline baseline is given twice$")


def test_a_pipeline_named_twice_in_a_comma_list(capsys):
    """It advised `npusim compare --passes optimized optimized`."""
    fails_cleanly(["run", "--workload", "k3-tiny", *STEP, "--passes", "optimized,optimized"], capsys,
                  r"--passes optimized,optimized: the pipeline optimized is named twice$")


# ---- calibrate


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    d = tmp_path_factory.mktemp("prof")
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--no-cache",
                 "--profile", str(d)]) == 0
    return d


@pytest.mark.parametrize("fields, expect", [
    (",", r"--fields ,: expected a comma list of field names, got none$"),  # it fitted every field
    ("aiv.vector_startup_cycles,aiv.vector_startup_cycles", r"'aiv\.vector_startup_cycles' given twice$"),
])
def test_calibrate_fields(fields, expect, profile, capsys, tmp_path):
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--profile", profile, "--out", out, "--fields", fields], capsys, expect, outputs=[out])


def test_a_profile_with_a_column_twice(profile, capsys, tmp_path):
    """The first 'Task Duration(us)' was read silently, whatever the second said."""
    d = tmp_path / "p"
    shutil.copytree(profile, d)
    csv = d / "op_summary.csv"
    lines = csv.read_text().splitlines()
    lines = [lines[0] + ",Task Duration(us)"] + [line + ",999" for line in lines[1:]]
    csv.write_text("\n".join(lines) + "\n")
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--profile", d, "--out", out], capsys,
                  r"op_summary\.csv: row 1: column 'Task Duration\(us\)' given twice \(columns 5 and \d+\)$",
                  outputs=[out])


# ---- the cache


@pytest.mark.parametrize("argv", [["cache", "clear"], ["cache", "info"], ["run", "--workload", "k3-tiny", "--batch",
                                                                         "1", "--context", "16"]])
def test_an_empty_cache_dir_variable(argv, capsys, tmp_path, monkeypatch):
    """NPUSIM_CACHE_DIR='' was the variable unset: `cache clear` cleared the user's cache."""
    home = tmp_path / "home"
    (home / "npusim").mkdir(parents=True)
    (home / "npusim" / "keep.entry").write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.setenv("NPUSIM_CACHE_DIR", "")
    with deadline(30):
        fails_cleanly(argv, capsys, r"NPUSIM_CACHE_DIR: expected a folder, got an empty string")
    assert (home / "npusim" / "keep.entry").read_text() == "x"
