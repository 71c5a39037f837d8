"""Bad-input catalogue, `npusim serve` (issues 11 and 35): each a one-line error
before any step is simulated; a request longer than the model's context is
rejected and counted, not an error. Issue 35: values that gave silent wrong
answers, hangs or tracebacks are refused at their bounds; outputs are checked
before the run (not an input, not each other, writable) and written all or none."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_check import fails_cleanly, interrupt_at_the_first_replace
from kernels import deadline
from npusim.cli import main

ROOT = Path(__file__).resolve().parents[2]
SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--requests", "5"]
HEADER = "arrival_s,prompt_tokens,output_tokens\n"


def no_temporary_files(folder: Path) -> None:
    left = [p for p in folder.rglob("*") if p.name.endswith(".tmp")]
    assert not left, f"temporary files left: {left}"


@pytest.mark.parametrize("argv, expect", [
    (["--rate", "1", "--service-set", "scheduler.kind=fifo"], r"unknown scheduler 'fifo'"),
    (["--rate", "0"], r"--rate: expected a positive number"),
    (["--rate", "-3"], r"--rate: expected a positive number"),
    (["--rate", "1", "--slo", "ttft_ms=soon"], r"--slo ttft_ms: expected a number"),
    (["--rate", "1", "--slo", "ttft_ms"], r"--slo"),
    (["--rate", "1", "--prompt-lengths", "uniform:-5,10"], r"--prompt-lengths"),
    (["--rate", "1", "--output-lengths", "fixed:-1"], r"--output-lengths"),
    # issue 35: lengths are whole token counts within a stated bound, never int64's minimum
    *[(["--rate", "20", "--prompt-lengths", spec], r"--prompt-lengths: expected whole token counts from 1 to 16777216")
      for spec in ("fixed:1e30", "fixed:nan", "fixed:inf", "fixed:1.5", "uniform:1,inf", "uniform:0.5,9")],
    (["--rate", "20", "--output-lengths", "fixed:1e30"], r"--output-lengths: expected whole token counts"),
    (["--rate", "20", "--prompt-lengths", "lognormal:10,nan"], r"--prompt-lengths: expected .*a finite SIGMA"),
    (["--rate", "20", "--prompt-lengths", "lognormal:1e30,1"], r"--prompt-lengths: expected 1 <= MEDIAN <= 16777216"),
    (["--rate", "20", "--prompt-lengths", "lognormal:100,1000"], r"draws lengths up to inf tokens, above the 16777216"),
    (["--rate", "20", "--prompt-lengths", "file:/dev/zero"], r"--prompt-lengths: /dev/zero: expected a regular file, got a character device"),
    # issue 35: tracebacks once
    (["--ramp", "nan,1,1,10"], r"--ramp: expected four finite numbers"),
    (["--ramp", "1,1,1,inf"], r"--ramp: expected four finite numbers"),
    (["--rate", "5", "--seed", "-1"], r"--seed: expected a whole number >= 0, got -1"),
    (["--rate", "5", "--requests", "100000000"], r"--requests: expected a number of requests from 1 to 1000000"),
    (["--rate", "5", "--arrival", "gamma", "--cv", "1e-200"], r"--cv: expected a coefficient of variation from"),
    (["--rate", "5", "--service-set", "buckets=[0]"], r"'buckets' must be a non-empty list of lengths from 1 to"),
    (["--rate", "5", "--service-set", "host.tokenize_us=.inf"],
     r"key 'host': 'tokenize_us' must be from 0 to 1e\+07 us"),
    (["--rate", "5", "--service-set", "host.pool_threads=100000000000"], r"'pool_threads' must be from 1 to 4096"),
    # the section replaced whole: max_batch 4 dropped without a word (and kept the other way round)
    *[(["--rate", "5", *sets], r"--service-set scheduler\.max_batch: 'scheduler' is set twice \(by --service-set "
                               r"scheduler too\)$")
      for sets in (["--service-set", "scheduler.max_batch=4", "--service-set", "scheduler={kind: static}"],
                   ["--service-set", "scheduler={kind: static}", "--service-set", "scheduler.max_batch=4"])],
    # a batch a step's graph may have, but minutes of pricing before the first request (was not done in 5 minutes)
    (["--rate", "5", "--service-set", "scheduler.max_batch=65536"],
     r"'max_batch' must be from 1 to 1024 sequences \(the most a service's steps are priced at\): 65536$"),
    # it named only scheduler.block_tokens, which was not the value at fault
    (["--rate", "5", "--service", "vllm-continuous", "--service-set", "scheduler.kv_memory_fraction=1e-300"],
     r"scheduler\.block_tokens=16: the KV cache \(scheduler\.kv_memory_fraction 1e-300 of the memory left\) holds 0 "
     r"tokens, not one block of that many$"),
    (["--rate", "5", "--service-set", "host.preprocess_on=thread_pool"],
     r"key 'host.preprocess_on': expected one of pool, inference_thread, got 'thread_pool'$"),
    (["--requests", "10", "--max-rate", "--rate", "5"], r"--max-rate: seed-optimized met the SLOs at every rate tried"),
    # every request longer than k3-tiny's context: "no rate meets these SLOs", after probes down to 5e-08 req/s
    (["--max-rate", "--prompt-lengths", "fixed:600"], r"--max-rate: every one of the 5 requests \(--prompt-lengths "
     r"fixed:600, --output-lengths fixed:64\) is longer than the workload's context of 512 tokens"),
    # a TPOT limit alone, and no request with a TPOT: every load met it ('give more --requests')
    (["--max-rate", "--output-lengths", "fixed:1", "--service-set", "slo.ttft_ms=null"],
     r"--max-rate: seed-optimized's only SLO is tpot_ms, but every request has one output token \(--output-lengths "
     r"fixed:1\), so none has a TPOT to limit"),
    # doubled past float's largest: "--rate: expected a positive number of requests per second, got inf"
    (["--max-rate", "--rate", "1e308"], r"--max-rate: seed-optimized met the SLOs at every rate tried, up to 1e\+308 "
                                        r"req/s: 5 requests per probe do not load it"),
    # issue 35: hangs (the dynamic scheduler's next scan lost to rounding), refused at a stated bound
    (["--rate", "1e-16"], r"--rate: the 5 requests would arrive over .* more than the 1e\+09 s"),
    (["--ramp", "1e-16,0,1,1"], r"--ramp: the 5 requests would arrive over"),
    *[(["--rate", "5", "--service-set", f"scheduler.scan_period_ms={v}"], r"'scan_period_ms' must be from 0.1 to "
       r"3.6e\+06 ms") for v in ("1e-300", ".inf")],
    # a partial batch scanned until its timeout: .inf with scans of 0.1 ms ran for minutes on 5 requests
    *[(["--rate", "0.01", "--service-set", "scheduler.scan_period_ms=0.1", "--service-set",
        f"scheduler.timeout_ms={v}"], rf"'timeout_ms' must be from 0 to 1000 x scan_period_ms \(100 ms: a waiting "
       rf"batch is scanned every scan_period_ms, each scan a pass of the serving loop\): {e}$")
      for v, e in ((".inf", "inf"), ("100.5", "100.5"))],
    # issue 35: --max-rate writes only what it can (its probes are Poisson runs of its own)
    (["--max-rate", "--rate", "5", "--csv", "c.csv"], r"--csv: --max-rate runs many probes"),
    (["--max-rate", "--rate", "5", "--ramp", "1,1,1,2"], r"--ramp: not used by --max-rate"),
    # a list key given a number or a string: "'int' object is not iterable", or read letter by letter
    *[(["--rate", "5", "--service-set", f"buckets={v}"], rf"seed-optimized\.yaml \(--service-set\): key 'buckets': "
       rf"expected a list, got {e}$") for v, e in (("512", "512"), ("abc", "'abc'"), ("{a: 1}", r"\{'a': 1\}"))],
    # a pass option for a pass the service does not run was ignored silently (`run` refuses it);
    # an unknown pass or KV layout was named as --passes, or without the file and key
    (["--rate", "5", "--service", "seed-baseline", "--service-set", "buckets=[128]"],
     r"seed-baseline\.yaml \(--service-set\): key 'buckets' is an option of the buckets pass, which 'passes' "
     r"\(baseline\) does not include"),
    (["--rate", "5", "--service-set", "passes=fusion,banana"],
     r"seed-optimized\.yaml \(--service-set\): key 'passes': unknown pass or pipeline 'banana'"),
    # a scheduler knob its kind does not read was ignored silently (the file's knobs of a kind set away from are not)
    (["--rate", "5", "--service", "vllm-continuous", "--service-set", "scheduler.token_budget=64"],
     r"vllm-continuous\.yaml \(--service-set\): key 'scheduler\.token_budget' is read only by the chunked scheduler, "
     r"but 'scheduler\.kind' is continuous \(leave it out, or give the kind that reads it\)$"),
    (["--rate", "5", "--service-set", "scheduler.kind=continuous", "--service-set", "scheduler.length_ratio=3"],
     r"key 'scheduler\.length_ratio' is read only by the dynamic scheduler, but 'scheduler\.kind' is continuous"),
    (["--rate", "5", "--service", "vllm-continuous", "--service-set", "scheduler={kind: static, block_tokens: 8}"],
     r"key 'scheduler\.block_tokens' is read only by the continuous and chunked schedulers, but 'scheduler\.kind' is "
     r"static"),
    (["--rate", "5", "--service", "vllm-continuous", "--service-set", "kv_layout=banana"],
     r"vllm-continuous\.yaml \(--service-set\): key 'kv_layout': expected one of contiguous, paged, got 'banana'$"),
])
def test_serve_bad_argument(argv, expect, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o.json"
    with deadline():
        fails_cleanly([*SERVE, *argv, "--json", out], capsys, expect, outputs=[out, tmp_path / "c.csv"])


def test_a_pass_option_without_its_pass(tmp_path):
    """A service file giving buckets without the buckets pass is refused; --service-set
    passes=... dropping a pass leaves the file's options for it unused on purpose."""
    from npusim.errors import ConfigError
    from npusim.serving.service import load_service

    assert "buckets" not in load_service("seed-optimized", {"passes": "optimized"}).passes
    f = tmp_path / "svc.yaml"
    f.write_text("passes: optimized\nmargin: 4\nscheduler: {kind: continuous}\n")
    with pytest.raises(ConfigError, match=rf"^{f}: key 'margin' is an option of the buckets pass, which 'passes' "
                                          r"\(optimized\) does not include"):
        load_service(f)
    assert load_service(f, {"passes": "optimized,buckets"}).margin == 4


@pytest.mark.parametrize("name", ["a/b", "../up", "", "..", "a\nb"])
def test_a_service_name_that_cannot_name_a_file(name, capsys, tmp_path):
    """--compare names its outputs after the services: a name 'a/b' was a traceback
    (Path.with_name), '../up' put the --plot folder outside DIR."""
    f = tmp_path / "svc.yaml"
    f.write_text(f"name: {json.dumps(name)}\nscheduler: {{kind: continuous}}\n")
    outs = [tmp_path / "r.csv", tmp_path / "plots"]
    fails_cleanly([*SERVE, "--rate", "5", "--compare", f, "vllm-continuous", "--csv", outs[0], "--plot", outs[1]],
                  capsys, r"svc\.yaml: 'name' must be a plain name, without '/'.*: " + re.escape(repr(name)) + "$",
                  outputs=outs)


@pytest.mark.parametrize("rows, expect", [
    ("arrival_s,prompt_tokens\n0,10\n", r"row 1: missing column 'output_tokens'"),
    (HEADER + "0,10,4\n1,-4,2\n", r"row 3: column 'prompt_tokens': expected a count >= 1, got -4$"),
    (HEADER + "0,10,-4\n", r"row 2: column 'output_tokens': expected a count >= 1, got -4$"),
    (HEADER + "1,10,4\n0.5,10,4\n", r"row 3: column 'arrival_s': arrivals must be sorted"),
])
def test_serve_bad_trace_file(rows, expect, capsys, tmp_path):
    f = tmp_path / "trace.csv"
    f.write_text(rows)
    err = fails_cleanly(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", f], capsys, expect)
    assert str(f) in err


@pytest.mark.parametrize("flag", ["--prompt-lengths", "--output-lengths"])
def test_lengths_beside_a_trace_file(flag, capsys, tmp_path):
    """The trace's own lengths were served and --prompt-lengths fixed:300 ignored without
    a word (as --rate beside a trace is refused)."""
    f = tmp_path / "trace.csv"
    f.write_text(HEADER + "0,10,4\n")
    out = tmp_path / "o.json"
    fails_cleanly(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", f, flag, "fixed:300", "--json", out],
                  capsys, rf"^npusim: error: {flag}: not used by --trace-file, whose requests give their own lengths",
                  outputs=[out])


def test_a_seed_beside_a_trace_file(capsys, tmp_path):
    """The trace's requests were served and --seed 5 ignored without a word (its default, 0,
    is applied after the check)."""
    f = tmp_path / "trace.csv"
    f.write_text(HEADER + "0,10,4\n")
    out = tmp_path / "o.json"
    fails_cleanly(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", f, "--seed", "5", "--json", out],
                  capsys, r"^npusim: error: --seed: not used by --trace-file, whose requests are read, not drawn",
                  outputs=[out])


def test_serve_too_long_request_is_rejected_and_counted(capsys, tmp_path):
    """k3-tiny's context is 512 tokens: a 600-token prompt is rejected, the run goes on."""
    f = tmp_path / "trace.csv"
    f.write_text(HEADER + "0,600,4\n0.001,20,4\n")
    out = tmp_path / "o.json"
    assert main(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", str(f), "--json", str(out)]) == 0
    m = json.loads(out.read_text())
    assert (m["rejected"], m["completed"]) == (1, 1)


# ---- issue 35: outputs checked before the run, written all or none


def _hw_without(tmp_path: Path, *dtypes: str) -> Path:
    """ascend910b2 without the cube fractals of `dtypes` (a config only needs fp16's)."""
    text = (ROOT / "hwconfigs" / "ascend910b2.yaml").read_text().splitlines(keepends=True)
    p = tmp_path / "hw.yaml"
    p.write_text("".join(line for line in text if not any(line.startswith(f"    {d}: {{m0") for d in dtypes)))
    return p


@pytest.mark.parametrize("argv, expect", [
    (["--trace-file", "{d}/t.csv", "--json", "{d}/t.csv"],
     r"--json .*t.csv: the same file as the input of --trace-file"),
    (["--rate", "5", "--service", "{d}/svc.yaml", "--json", "{d}/svc.yaml"],
     r"--json .*svc.yaml: the same file as the input of --service"),
    (["--rate", "5", "--json", "{d}/x", "--csv", "{d}/x"], r"--csv .*x: the same file as the output of --json"),
    (["--rate", "5", "--compare", "seed-optimized", "{d}/seed-optimized.yaml", "--csv", "{d}/c.csv"],
     r"--compare: both services are named 'seed-optimized', so their --csv outputs would be one"),
    (["--rate", "5", "--compare", "seed-optimized", "{d}/seed-optimized.yaml", "--json", "{d}/c.json"],
     r"--compare: both services are named 'seed-optimized', so their --json outputs would be one"),
    (["--rate", "5", "--json", "/proc/x/y.json"], r"--json /proc/x/y.json: cannot be written"),
    (["--rate", "5", "--json", "/dev/full"], r"--json /dev/full: cannot be written: No space left on device"),
    (["--rate", "5", "--csv", "/dev/full"], r"--csv /dev/full: cannot be written: No space left on device"),
    (["--rate", "5", "--csv", "{d}/t.csv/c.csv"], r"--csv .*: cannot be written: Not a directory"),
    (["--rate", "5", "--plot", "{d}/t.csv"], r"--plot .*t.csv: is a file"),
    # a plot's file as another output: the plot replaced the JSON, exit status 0
    (["--rate", "5", "--plot", "{d}/p", "--json", "{d}/p/latency_cdf.png"],
     r"--plot \(latency_cdf\.png\) .*p/latency_cdf\.png: the same file as the output of --json"),
    (["--rate", "5", "--compare", "seed-optimized", "vllm-continuous", "--plot", "{d}/p", "--json",
      "{d}/p/vllm-continuous/batch_kv.svg"], r"--plot \(vllm-continuous\) \(batch_kv\.svg\) .*: the same file as the "
                                             r"output of --json"),
])
def test_serve_outputs_checked_before_the_run(argv, expect, capsys, tmp_path, monkeypatch):
    """An output on an input or on another output, or one that cannot be written, is
    refused before any step is priced, and every input is left as it was."""
    (tmp_path / "t.csv").write_text(HEADER + "0,10,4\n")
    shutil.copy(ROOT / "services" / "seed-optimized.yaml", tmp_path / "svc.yaml")
    shutil.copy(ROOT / "services" / "seed-optimized.yaml", tmp_path / "seed-optimized.yaml")
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    priced = []
    monkeypatch.setattr("npusim.serving.command.serve", lambda *a: priced.append(a))
    fails_cleanly([*SERVE, *(a.format(d=tmp_path) for a in argv)], capsys, expect)
    assert not priced
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_folder_in_a_plots_place_is_refused_before_the_run(capsys, tmp_path, monkeypatch):
    """--plot DIR with a folder DIR/latency_cdf.svg: the whole run, then "DIR/latency_cdf.svg:
    is a directory" without the flag; now refused before any step is priced."""
    (tmp_path / "p" / "latency_cdf.svg").mkdir(parents=True)
    priced = []
    monkeypatch.setattr("npusim.serving.command.serve", lambda *a: priced.append(a))
    out = tmp_path / "o.json"
    fails_cleanly([*SERVE, "--rate", "5", "--plot", tmp_path / "p", "--json", out], capsys,
                  r"^npusim: error: --plot \(latency_cdf\.svg\) .*p/latency_cdf\.svg: is a directory \(expected a "
                  r"file path\)$", outputs=[out])
    assert not priced


def test_serve_plot_names_are_the_files_checked(tmp_path):
    """The files checked before the run against the other outputs are those --plot writes."""
    from npusim.serving.command import PLOT_NAMES

    assert main([*SERVE, "--rate", "20", "--plot", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PLOT_NAMES)


def test_serve_closed_stdout_still_writes_the_files(tmp_path):
    """`npusim serve ... | true`: the summary is dropped, the files are written."""
    outs = {"--json": tmp_path / "j.json", "--csv": tmp_path / "c.csv", "--trace": tmp_path / "t.json"}
    proc = subprocess.Popen([sys.executable, "-m", "npusim", *SERVE, "--rate", "20",
                             *[str(a) for kv in outs.items() for a in kv]], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err
    assert json.loads(outs["--json"].read_text())["completed"] >= 1
    assert outs["--csv"].read_text().startswith("id,") and "traceEvents" in outs["--trace"].read_text()


def test_serve_max_rate_writes_its_json(capsys, tmp_path):
    out = tmp_path / "m.json"
    assert main([*SERVE, "--requests", "40", "--max-rate", "--rate", "50", "--slo", "ttft_ms=1000", "--json",
                 str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["service"] == "seed-optimized" and m["requests_per_probe"] == 40
    assert m["probes"] and all(set(p) == {"rate_requests_per_s", "sustained"} for p in m["probes"])
    printed = capsys.readouterr().out
    assert f"highest sustainable rate {m['max_rate_requests_per_s']:.3g} req/s" in printed
    assert printed.splitlines()[-1] == f"wrote {out}"
    assert m["max_rate_requests_per_s"] > 0 and any(not p["sustained"] for p in m["probes"])  # bracketed


def test_every_slo_flag_is_kept(capsys, tmp_path):
    """--slo ttft_ms=1 --slo tpot_ms=5: argparse kept the last, and goodput was counted
    against the service's TTFT limit (2 s), not the 1 ms given; a key in two is refused."""
    out = tmp_path / "s.json"
    assert main([*SERVE, "--rate", "5", "--slo", "ttft_ms=1", "--slo", "tpot_ms=5", "--json", str(out)]) == 0
    slo = json.loads(out.read_text())["slo"]
    assert (slo["ttft_ms"], slo["tpot_ms"]) == (1.0, 5.0)
    fails_cleanly([*SERVE, "--rate", "5", "--slo", "ttft_ms=1", "--slo", "e2e_ms=9,ttft_ms=2"], capsys,
                  r"--slo ttft_ms: given twice$")


def test_serve_max_rate_an_slo_no_load_meets_writes_nothing(capsys, tmp_path):
    """Unloaded, seed-optimized's TTFT is hundreds of ms: an SLO of 30 ms is one line, and no JSON."""
    out = tmp_path / "m.json"
    assert main([*SERVE, "--max-rate", "--rate", "50", "--slo", "ttft_ms=30", "--json", str(out)]) == 2
    assert "no rate meets these SLOs" in capsys.readouterr().err and not out.exists()


def test_serve_interrupted_between_outputs_leaves_none(capsys, tmp_path, monkeypatch):
    """Ctrl-C after the CSV and the trace are written, before the JSON: none of them is
    left, and the message says so."""
    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr("npusim.serving.command.write_json", interrupted)
    outs = [tmp_path / "c.csv", tmp_path / "out" / "t.json", tmp_path / "j.json"]
    code = main([*SERVE, "--rate", "20", "--csv", str(outs[0]), "--trace", str(outs[1]), "--json", str(outs[2])])
    err = capsys.readouterr().err
    assert code == 130 and err.strip() == "npusim: interrupted (no partial output left)", err
    assert list(tmp_path.iterdir()) == []  # no output, no temporary file, no folder made for them


def test_serve_interrupt_while_outputs_are_put_in_place_waits(capsys, tmp_path, monkeypatch):
    """Ctrl-C while the finished outputs replace their targets waits for the last one;
    the message says they were all written."""
    calls = interrupt_at_the_first_replace(monkeypatch)
    outs = [tmp_path / "c.csv", tmp_path / "j.json"]
    code = main([*SERVE, "--rate", "20", "--csv", str(outs[0]), "--json", str(outs[1])])
    err = capsys.readouterr().err
    assert code == 130 and "interrupted (after writing every output: " in err, err
    assert len(calls) == 2 and all(p.exists() for p in outs)
    json.loads(outs[1].read_text())
    no_temporary_files(tmp_path)


def test_serve_missing_cube_fractal_is_one_line(capsys, tmp_path):
    """A config that gives only fp16's cube fractal: a bf16 workload is one line
    naming the key (it was KeyError: 'bf16')."""
    workload = tmp_path / "bf16.yaml"
    workload.write_text((ROOT / "workloads" / "k3-tiny.yaml").read_text().replace("dtype: fp16", "dtype: bf16"))
    fails_cleanly(["serve", "--workload", workload, "--hw", _hw_without(tmp_path, "bf16", "int8"), "--no-cache",
                   "--requests", "5", "--rate", "5"], capsys, r"missing key 'aic.mmad_fractals.bf16'")


def test_w8a8_without_an_int8_fractal_is_one_line(capsys, tmp_path):
    """W8A8's int8 matmuls on such a config (serve's services take no --quant; `npusim
    run` reaches the same lookup): it was KeyError: 'int8'."""
    fails_cleanly(["run", "--workload", "k3-tiny", "--hw", _hw_without(tmp_path, "int8"), "--no-cache",
                   "--batch", "2", "--context", "64", "--passes", "optimized,quantize", "--quant", "w8a8"], capsys,
                  r"missing key 'aic.mmad_fractals.int8'")


def test_a_trace_file_that_cannot_be_read_names_the_flag_and_the_reason(capsys, tmp_path):
    """--trace-file on a missing file said "s.csv: cannot read: [Errno 2] No such file or
    directory: 's.csv'": the path twice, the flag nowhere."""
    fails_cleanly(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", tmp_path / "s.csv"], capsys,
                  r"^npusim: error: --trace-file \S+s\.csv: cannot read: No such file or directory$")
