"""--workload-set KEY=VALUE: a workload field changed for one run, on every command that
runs a workload's steps (run, compare, sweep, validate, serve), recorded in a profile's
step file so that calibrate reruns the same step; a bad key or value is one line."""

import json

import pytest

from npusim.cli import main


def _run(argv, capsys) -> str:
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_a_field_set_on_the_command_line_changes_the_step(capsys):
    base = ["run", "--workload", "k3-tiny-moe", "--batch", "8", "--context", "128", "--no-cache"]
    plain = _run(base, capsys)
    skewed = _run(base + ["--workload-set", "routing=zipf", "--workload-set", "capacity_factor=1"], capsys)
    assert "routing        uniform" in plain and "routing        zipf" in skewed
    assert "rows dropped per MoE layer" in skewed and "dropped" not in plain


@pytest.mark.parametrize("sets, expect", [
    (["routng=zipf"], "(--workload-set): unknown key 'routng' (did you mean 'routing'?)"),
    (["routing"], "--workload-set routing: expected key=value"),
    (["routing=zipf", "routing=uniform"], "--workload-set routing: given twice"),
    (["capacity_factor=-1"], "key 'capacity_factor': expected a finite value >= 0"),
    (["first_dense_layers=01"], "key 'first_dense_layers': expected an integer, got '01'"),  # YAML 1.1's octal 1
    (["routing_seed=1_0"], "key 'routing_seed': expected an integer, got '1_0'"),  # was seed 10
])
@pytest.mark.parametrize("command", [["run"], ["serve", "--service", "seed-optimized", "--rate", "1",
                                                "--requests", "2"]])
def test_a_bad_workload_set_is_one_line(command, sets, expect, capsys):
    argv = command + ["--workload", "k3-tiny-moe"] + [w for s in sets for w in ("--workload-set", s)]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and expect in err and len(err.splitlines()) == 1, err


def test_calibrate_reruns_the_step_with_the_fields_set(tmp_path, capsys):
    prof = tmp_path / "prof"
    _run(["run", "--workload", "k3-tiny-moe", "--batch", "4", "--context", "128", "--workload-set", "routing=zipf",
          "--profile", str(prof), "--no-cache"], capsys)
    assert json.loads((prof / "npusim_step.json").read_text())["workload_set"] == {"routing": "zipf"}
    out = _run(["calibrate", "--profile", str(prof), "--hw", "ascend910b2", "--out", str(tmp_path / "c.yaml"),
                "--fields", "runtime.kernel_start_aiv_cycles"], capsys)
    assert "before median 0.0% max 0.0%" in out  # every kernel timed as it ran: the zipf routing's GEMMs
