"""Bad-input catalogue, `npusim serve` (issue 11): each a one-line error before any
step is simulated; a request longer than the model's context is rejected and
counted, not an error."""

import json

import pytest

from cli_check import fails_cleanly
from npusim.cli import main

SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--requests", "5"]
HEADER = "arrival_s,prompt_tokens,output_tokens\n"


@pytest.mark.parametrize("argv, expect", [
    (["--rate", "1", "--service-set", "scheduler.kind=fifo"], r"unknown scheduler 'fifo'"),
    (["--rate", "0"], r"--rate: expected a positive number"),
    (["--rate", "-3"], r"--rate: expected a positive number"),
    (["--rate", "1", "--slo", "ttft_ms=soon"], r"--slo ttft_ms: expected a number"),
    (["--rate", "1", "--slo", "ttft_ms"], r"--slo"),
    (["--rate", "1", "--prompt-lengths", "uniform:-5,10"], r"--prompt-lengths"),
    (["--rate", "1", "--output-lengths", "fixed:-1"], r"--output-lengths"),
])
def test_serve_bad_argument(argv, expect, capsys, tmp_path):
    out = tmp_path / "o.json"
    fails_cleanly([*SERVE, *argv, "--json", out], capsys, expect, outputs=[out])


@pytest.mark.parametrize("rows, expect", [
    ("arrival_s,prompt_tokens\n0,10\n", r"row 1: missing column 'output_tokens'"),
    (HEADER + "0,10,4\n1,-4,2\n", r"row 3: column 'prompt_tokens': expected a positive"),
    (HEADER + "0,10,-4\n", r"row 2: column 'output_tokens': expected a positive"),
    (HEADER + "1,10,4\n0.5,10,4\n", r"row 3: column 'arrival_s': arrivals must be sorted"),
])
def test_serve_bad_trace_file(rows, expect, capsys, tmp_path):
    f = tmp_path / "trace.csv"
    f.write_text(rows)
    err = fails_cleanly(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", f], capsys, expect)
    assert str(f) in err


def test_serve_too_long_request_is_rejected_and_counted(capsys, tmp_path):
    """k3-tiny's context is 512 tokens: a 600-token prompt is rejected, the run goes on."""
    f = tmp_path / "trace.csv"
    f.write_text(HEADER + "0,600,4\n0.001,20,4\n")
    out = tmp_path / "o.json"
    assert main(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", str(f), "--json", str(out)]) == 0
    m = json.loads(out.read_text())
    assert (m["rejected"], m["completed"]) == (1, 1)
