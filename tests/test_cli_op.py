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
    assert out.splitlines()[-1] == f"wrote {j}, {t}"  # the message says what was written
    report = json.loads(j.read_text())
    for key in CONTRACT:
        assert key in report
    assert report["kernel_count"] == len(report["ops"]) >= 1
    for key in OP_FIELDS:
        assert key in report["ops"][-1]
    assert report["ops"][-1]["flops"] == 2 * 256**3
    events = json.loads(t.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e.get("cat") == "M" for e in events)  # cube instructions
    assert any(e["ph"] == "C" for e in events)  # the links' bandwidth, sampled only when a trace is asked for


def test_parameters_after_an_option_are_the_op_s(tmp_path, capsys):
    """`npusim op matmul --no-cache m=16` was "unrecognized arguments: m=16" (argparse
    takes positionals only before the first option); now the words are the op's parameters."""
    j = tmp_path / "op.json"
    assert main(["op", "matmul", "m=16", "--no-cache", "n=32", "--json", str(j), "k=16"]) == 0
    capsys.readouterr()
    assert json.loads(j.read_text())["ops"][-1]["flops"] == 2 * 16 * 32 * 16
    assert main(["op", "matmul", "--no-cache", "m"]) == 2
    assert capsys.readouterr().err == "npusim: error: op matmul: expected key=value, got 'm'\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["op", "nosuchop"], "unknown op type 'nosuchop'"),
    (["op", "matmul", "mm=3"], "unknown parameter 'mm'"),
    (["op", "matmul", "m"], "expected key=value, got 'm'"),
    (["op", "matmul", "=5"], "op matmul: expected key=value, got '=5'"),  # was "unknown parameter ''"
    (["op", "matmul", "m=64", "n=64", "k=64", "tiling.base_m=4096"], "tiling does not fit"),
    (["op", "matmul", "--set", "chip.aic_count=0"], "key 'chip.aic_count': expected a value > 0"),
    # simulated, and --check "PASSED" on the root of a negative variance
    (["op", "rms_norm", "shape=8,64", "eps=-1", "--check"], "op rms_norm: 'eps' must be > 0: -1.0"),
    (["op", "layer_norm", "shape=8,64", "eps=0"], "op layer_norm: 'eps' must be > 0: 0.0"),
])
def test_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_a_float_parameter_that_is_not_finite(value, tmp_path, capsys):
    """It ran (and --json wrote "scale": NaN, which is no JSON); now one line naming it."""
    out = tmp_path / "op.json"
    assert main(["op", "scale", "shape=[8,64]", f"scale={value}", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"npusim: error: op scale: parameter 'scale' expects a finite number, got '{value}'\n"
    assert not out.exists()


@pytest.mark.parametrize("params", [["m=4096", "n=4096", "k=4096", "format_a=NZ", "format_b=NZ"],
                                    ["m=1", "n=4096", "k=4096", "format_b=NZ"]], ids=["big", "gemv"])
def test_text_json_and_csv_give_the_same_figures(params, tmp_path, capsys):
    """One op time (kernel start costs + kernel times), one busy (work + data wait),
    one bound: the text, the JSON and op_summary.csv print the same digits."""
    import csv
    import re

    j, prof = tmp_path / "op.json", tmp_path / "prof"
    assert main(["op", "matmul", *params, "--json", str(j), "--profile", str(prof)]) == 0
    out = capsys.readouterr().out
    report = json.loads(j.read_text())
    head = re.search(r": ([\d.]+) us = kernel starts? ([\d.]+) \+ kernels? ([\d.]+)", out)
    assert head, out
    op_us, start_us, kernel_us = head.groups()
    assert op_us == f"{report['latency_us']:.2f}"
    assert start_us == f"{report['kernel_start_us']:.2f}" == f"{sum(o['start_cost_us'] for o in report['ops']):.2f}"
    assert kernel_us == f"{report['kernel_us']:.2f}" == f"{sum(o['duration_us'] for o in report['ops']):.2f}"
    assert report["latency_us"] == pytest.approx(report["kernel_start_us"] + report["kernel_us"] + report["host_gap_us"])
    assert report["run_us"] > report["latency_us"]  # the run adds the host's launch and synchronize
    bound = re.search(r"bound: (\S+)", out).group(1)
    assert bound == report["bound"] and bound != "memory"
    rows = list(csv.DictReader((prof / "op_summary.csv").open()))
    longest = max(report["ops"], key=lambda o: o["duration_us"])
    row = next(r for r in rows if r["Op Name"] == longest["name"])
    assert row["Bound"] == longest["bound"]
    if bound != "latency":
        assert bound == longest["bound"]
    for pipe, busy in re.findall(r"(AI[CV]\.\w+) (\d+)%", out.split("pipes busy:")[1]):
        assert busy == f"{100 * report['pipe_busy'][pipe]:.0f}"
        stall = longest["stalls_percent"].get(pipe)
        if stall is not None and len(report["ops"]) == 1:
            assert busy == f"{stall['work'] + stall['data']:.0f}"
            assert f"{float(row[f'{pipe} work(%)']) + float(row[f'{pipe} data(%)']):.0f}" == busy


@pytest.mark.parametrize(("op", "value"), [("rms_norm", "shape=1,,2"), ("rms_norm", "shape=8,4096,"),
                                           ("rms_norm", "shape=,8,4096"), ("rms_norm", "shape=(8,4096"),
                                           ("rms_norm", "shape=8x"), ("matmul", "n_parts=32,,32")])
def test_a_tuple_with_an_empty_item_or_an_open_bracket(op, value, capsys):
    """shape=1,,2 simulated shape (1, 2), and n=64 n_parts=32,,32 the parts (32, 32): the
    empty item was dropped; now one line naming the parameter."""
    assert main(["op", op, "n=64", value] if op == "matmul" else ["op", op, value]) == 2
    name, _, text = value.partition("=")
    assert capsys.readouterr().err == (f"npusim: error: op {op}: parameter '{name}' expects a tuple of ints "
                                       f"(e.g. 8,4096), got '{text}'\n")


@pytest.mark.parametrize("value", ["8,4096", "8x4096", "[8,4096]", "(8, 4096)", "(64,)"])
def test_a_tuple_spelt_as_the_help_and_python_do(value):
    from npusim.ops.registry import _tuple

    assert _tuple(value) == ((64,) if value == "(64,)" else (8, 4096))
    assert _tuple("()") == _tuple("") == ()


@pytest.mark.parametrize("flag, path", [("--json", "c.json"), ("--trace", "t.json"), ("--profile", "prof"),
                                        ("--plot", "plots")])
def test_check_with_an_output(flag, path, tmp_path, capsys):
    """op matmul --check --json PATH printed PASSED with status 0 and wrote nothing (nor said so)."""
    out = tmp_path / path
    assert main(["op", "matmul", "m=64", "n=64", "k=64", "--check", flag, str(out)]) == 2
    assert capsys.readouterr().err == (f"npusim: error: op matmul --check: prints the check and writes nothing; "
                                       f"drop {flag} (or --check, to simulate and write it)\n")
    assert not out.exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--json", "{out}"], "op --json: give the op type first: npusim op TYPE key=value ... --json "
                          "(npusim op --list lists them)"),
    (["--list", "--profile", "{out}"], "op --list: lists the op types and runs nothing; drop --profile"),
    (["matmul", "m=64", "--list"], "op --list: lists the op types and runs nothing; drop 'm=64'"),
])
def test_list_with_an_output_or_parameters(argv, message, tmp_path, capsys):
    """They printed the op types with status 0: the output asked for unwritten, the parameters unused."""
    out = tmp_path / "out"
    assert main(["op", *(a.format(out=out) for a in argv)]) == 2
    assert capsys.readouterr().err == f"npusim: error: {message}\n"
    assert not out.exists()


@pytest.mark.parametrize("argv", [["transpose", "shape=32,64"], ["transpose", "shape=3,5,7", "perm=2,0,1"],
                                  ["trans_data", "shape=32,64"], ["trans_data", "shape=3,17,33"]])
def test_check_of_an_op_reordering_in_ub_is_not_a_verdict(argv, capsys):
    """Their UB reorders are priced as vector copies, which the interpreter runs as
    copies: --check printed FAIL (transpose 32x64 off by 4.56; 3x5x7 NaN) with status 1,
    or, for trans_data 3x17x33, a ValueError traceback (reshape of 1683 elements)."""
    assert main(["op", *argv, "--check"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "NOT CHECKED"
    assert "not checked: its " in out and "(the IR carries no permutation to run)" in out


@pytest.mark.parametrize(("argv", "said"), [
    (["decode_attention", "block_tokens=16"], "op decode_attention: 'block_tokens' is read by the paged layout only, "
                                              "and kv_layout is per_layer (leave it out, or give kv_layout=paged)"),
    (["flash_attention", "layers=4", "layer=2"], "op flash_attention: 'layers' is read by the contiguous layout only, "
                                                 "and kv_layout is per_layer (leave it out, or give "
                                                 "kv_layout=contiguous)"),
    (["kv_cache_write", "layout=paged", "layer=3", "--check"], "op kv_cache_write: 'layer' is read by the contiguous "
                                                               "layout only, and layout is paged"),
])
def test_a_kv_field_the_layout_does_not_read(argv, said, capsys):
    """It was simulated without a word: the run was the one without the field."""
    assert main(["op", *argv, "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"npusim: error: {said}") and err.count("\n") == 1
