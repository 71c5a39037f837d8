"""`npusim op`: the vendor-op-simulator workflow from the command line."""

import json

import pytest

from npusim.cli import main

CONTRACT = ("latency_us", "tokens_per_s", "hbm_read_bytes", "hbm_write_bytes", "l2_hit_rate", "peak_memory_bytes",
            "kernel_count", "host_launch_us", "host_wait_us", "ops", "by_type")
OP_FIELDS = ("name", "type", "core_type", "block_dim", "start_us", "duration_us", "flops", "gm_bytes", "bound")


def test_list(capsys):
    assert main(["op", "--list"]) == 0
    out = capsys.readouterr().out
    for op in ("matmul", "batch_matmul", "copy"):
        assert op in out


def test_op_help_lists_parameters(capsys):
    assert main(["op", "matmul", "--help"]) == 0
    out = capsys.readouterr().out
    for name in ("m", "n", "k", "dtype", "out_dtype", "bias", "trans_b", "format_a", "format_b", "weight_dtype"):
        assert f"\n  {name} " in out


def test_run_prints_summary_and_writes_json_and_trace(tmp_path, capsys):
    j, t = tmp_path / "op.json", tmp_path / "trace.json"
    assert main(["op", "matmul", "m=256", "n=256", "k=256", "--json", str(j), "--trace", str(t)]) == 0
    out = capsys.readouterr().out
    assert "matmul on ascend910b2:" in out and "TFLOPS" in out and "bound:" in out and "pipes busy:" in out
    report = json.loads(j.read_text())
    for key in CONTRACT:
        assert key in report
    assert report["kernel_count"] == len(report["ops"]) >= 1
    for key in OP_FIELDS:
        assert key in report["ops"][-1]
    assert report["ops"][-1]["flops"] == 2 * 256**3
    events = json.loads(t.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e.get("cat") == "M" for e in events)  # cube instructions


@pytest.mark.parametrize(("argv", "message"), [
    (["op", "nosuchop"], "unknown op type 'nosuchop'"),
    (["op", "matmul", "mm=3"], "unknown parameter 'mm'"),
    (["op", "matmul", "m"], "expected key=value, got 'm'"),
    (["op", "matmul", "m=64", "n=64", "k=64", "tiling.base_m=4096"], "tiling does not fit"),
    (["op", "matmul", "--set", "chip.aic_count=0"], "key 'chip.aic_count': expected a value > 0"),
])
def test_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
