"""Bad-input catalogue, round 5's hostile sweep: inputs that gave a traceback, a silent
other run or a result JSON cannot hold. Each is now one line naming the flag, file or
key; nothing runs and nothing is written."""

from __future__ import annotations

import json

import pytest

from cli_check import fails_cleanly
from kernels import deadline
from npusim.cli import main
from npusim.diskcache import DiskCache

SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--requests", "5"]
HEADER = "arrival_s,prompt_tokens,output_tokens\n"


# ---- an empty value is not the option left out


@pytest.mark.parametrize("argv, flag", [
    ([*SERVE, "--rate", "5", "--pd", ""], "--pd"),  # it served colocated
    ([*SERVE, "--rate", "5", "--slo", ""], "--slo"),  # it kept the service's SLOs
    ([*SERVE, "--rate", "5", "--trace-file", ""], "--trace-file"),  # it served a Poisson load
    (["cache", "clear", "--cache-dir", ""], "--cache-dir"),  # it cleared the default cache
    (["run", "--workload", "k3-tiny", "--batch", "1", "--context", "16", "--passes", "optimized,buckets",
      "--buckets", ""], "--buckets"),  # it used the default buckets
    (["calibrate", "--hccl", "h.txt", "--out", "my.yaml", "--fields="], "--fields"),  # it fitted every field
])
def test_an_empty_value_is_refused(argv, flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path / "cache"))
    fails_cleanly(argv, capsys, rf"argument {flag}: expected a value, got an empty string")


# ---- serve: cards, routers, SLOs and load flags


@pytest.mark.parametrize("argv, expect", [
    (["--rate", "5", "--pd", "1:1", "--tp", "0"], r"--tp: expected a whole number of cards from 1 to 4096, got 0$"),
    (["--rate", "5", "--tp", "0"], r"--tp: expected a whole number of cards"),  # it named --cards
    (["--rate", "5", "--pd", "4096:1"], r"--pd 4096:1: expected a whole number of cards from 1 to 4096, got 4097$"),
    (["--rate", "5", "--cards", "2", "--router", "kv-local"], r"--router kv-local: picks the decode instance"),
    (["--rate", "5", "--slo", "ttft_ms=inf"], r"--slo ttft_ms: expected a positive number of milliseconds, at most "
                                              r"1e\+12"),
    (["--rate", "5", "--slo", "e2e_ms=1e300"], r"--slo e2e_ms: expected a positive number of milliseconds"),
    (["--rate", "5", "--slo", "ttft_ms=100,ttft_ms=200"], r"--slo ttft_ms: given twice$"),
    (["--rate", "5", "--service-set", "slo.tpot_ms=.inf"], r"key 'slo': 'tpot_ms' must be above 0 and at most 1e\+12"),
    (["--ramp", "1,1,1,2", "--rate", "5"], r"--rate: not used by --arrival ramp"),
    (["--rate", "5", "--cv", "3"], r"--cv: not used by --arrival poisson"),
    (["--rate", "5", "--arrival", "poisson", "--ramp", "1,1,1,2"], r"--ramp: not used by --arrival poisson"),
    (["--trace-file", "{d}/t.csv", "--rate", "5"], r"--rate: not used by --arrival trace"),
    (["--trace-file", "{d}/t.csv", "--arrival", "poisson", "--rate", "5"], r"--trace-file: not used by --arrival "
                                                                          r"poisson"),
    (["--max-rate", "--cv", "2"], r"--cv: not used by --max-rate, whose probes are Poisson loads"),
])
def test_serve_refuses(argv, expect, capsys, tmp_path):
    (tmp_path / "t.csv").write_text(HEADER + "0,10,4\n")
    out = tmp_path / "o.json"
    fails_cleanly([*SERVE, *(a.format(d=tmp_path) for a in argv), "--json", out], capsys, expect, outputs=[out])


def test_gamma_still_takes_its_cv(tmp_path):
    out = tmp_path / "o.json"
    assert main([*SERVE, "--rate", "20", "--arrival", "gamma", "--cv", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["completed"] >= 1


# ---- serve: trace files


@pytest.mark.parametrize("name, text, expect", [
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": 1e400, "output_tokens": 4}\n',  # was OverflowError
     r"line 1: column 'prompt_tokens': expected an integer, got inf"),
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": true, "output_tokens": 4}\n',  # was a 1-token prompt
     r"line 1: column 'prompt_tokens': expected an integer, got True"),
    ("t.csv", HEADER + "0,10,4,7\n", r"row 2: more values than the header's 3 columns"),  # the 7 was dropped
])
def test_bad_trace_rows(name, text, expect, capsys, tmp_path):
    f = tmp_path / name
    f.write_text(text)
    fails_cleanly([*SERVE, "--trace-file", f], capsys, expect)


def test_a_trace_with_a_byte_order_mark_or_a_trailing_comma_is_read(tmp_path):
    f, out = tmp_path / "t.csv", tmp_path / "o.json"
    f.write_bytes(b"\xef\xbb\xbf" + (HEADER + "0,10,4,\n0.01,12,4\n").encode())
    assert main([*SERVE, "--trace-file", str(f), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["completed"] == 2


# ---- op parameters, sweep values


def test_an_op_parameter_given_twice(capsys):
    fails_cleanly(["op", "matmul", "m=4", "n=64", "k=64", "m=8"], capsys,
                  r"op matmul: parameter 'm' given twice \('4' and '8'\)")
    fails_cleanly(["op", "matmul", "m=64", "n=64", "k=64", "tiling.base_m=16", "tiling.base_m=32"], capsys,
                  r"op matmul: parameter 'tiling.base_m' given twice")


def test_a_sweep_value_given_twice(capsys, tmp_path):
    out = tmp_path / "o"
    fails_cleanly(["sweep", "--workload", "k3-tiny", "--batch", "1", "--context", "16", "--set", "chip.aic_count=4,4.0",
                   "--out", out], capsys, r"--set chip.aic_count: value 4.0 given twice in '4,4.0'", outputs=[out])


# ---- the cache


def test_a_folder_in_place_of_an_entry_is_a_miss(tmp_path):
    """It was `npusim: error: 3: Is a directory` on every run that read the key."""
    store = DiskCache(tmp_path / "c")
    store.put("k", 1)
    store.entry_path("k").unlink()
    store.entry_path("k").mkdir()
    assert store.get("k") is None
    assert store.put("k", 2) is None and store.entry_path("k").is_dir()  # not the store's to replace


@pytest.mark.parametrize("command", ["info", "clear"])
def test_cache_info_or_clear_on_a_file(command, capsys, tmp_path):
    f = tmp_path / "f"
    f.write_text("mine")
    fails_cleanly(["cache", command, "--cache-dir", f], capsys, r"cache .*f: not a folder")
    assert f.read_text() == "mine"


def test_a_plan_of_more_candidates_than_it_serves(capsys):
    """Every P:D split of 4096 cards is 6144 serves a card count: minutes of silence on k3-tiny."""
    with deadline(60):
        fails_cleanly([*SERVE, "--plan", "--rate", "5", "--max-cards", "4096", "--slo", "ttft_ms=1e-9",
                       "--service-set", "scheduler.kind=continuous", "--set", "topology.node_count=512"], capsys,
                      r"--max-cards 4096: 6144 candidate clusters on 4096 cards .* more than the 512", seconds=20)


# ---- service files


@pytest.mark.parametrize("text, expect", [
    ("name: x\n", r"svc.yaml: service x: missing key 'scheduler'"),  # was 'NoneType' object has no attribute 'kind'
    ("name: x\nscheduler: {}\n", r"svc.yaml: service x: missing key 'scheduler.kind'"),
    ("name: x\nscheduler: null\n", r"svc.yaml: key 'scheduler': expected a mapping, got None"),
    ("name: x\nscheduler: {kind: dynamic}\nhost: 3\n", r"svc.yaml: key 'host': expected a mapping, got 3"),
])
def test_a_service_without_its_sections(text, expect, capsys, tmp_path):
    f = tmp_path / "svc.yaml"
    f.write_text(text)
    fails_cleanly([*SERVE, "--rate", "5", "--service", f], capsys, expect)


# ---- calibrate: a hand-edited step file


def test_a_step_file_with_a_batch_of_the_wrong_type(capsys, tmp_path):
    """It was TypeError: batch: expected a positive integer, got 'x' (a traceback)."""
    d = tmp_path / "prof"
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--no-cache",
                 "--profile", str(d)]) == 0
    step = json.loads((d / "npusim_step.json").read_text())
    (d / "npusim_step.json").write_text(json.dumps(step | {"batch": "x"}))
    capsys.readouterr()
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--profile", d, "--out", out], capsys,
                  r"the profile's step file: batch: expected a positive integer, got 'x'", outputs=[out])


def test_a_trace_level_without_a_trace(capsys, tmp_path):
    """It was ignored: no trace is written, whatever its detail."""
    fails_cleanly(["run", "--workload", "k3-tiny", "--trace-level", "instr", "--json", tmp_path / "o.json"], capsys,
                  r"--trace-level instr: the detail of --trace \(give --trace PATH too\)$", outputs=[tmp_path / "o.json"])


def test_a_lognormal_sigma_of_minus_zero_is_zero(capsys):
    """numpy's lognormal refused -0.0 with a traceback ("sigma < 0"); it is a sigma of 0."""
    argv = [*SERVE, "--rate", "1", "--requests", "1", "--output-lengths", "lognormal:1,-0"]
    assert main(argv) == 0, capsys.readouterr().err
