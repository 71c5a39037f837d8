"""Bad-input catalogue, round 9's hostile sweep of `npusim run` and what it reads. Each
case is one line naming the flag, file or key and what was expected; nothing runs and
nothing is written."""

from __future__ import annotations

import pytest
from cli_check import fails_cleanly, one_line_error

from npusim.errors import ConfigError
from npusim.hw.load import find_file
from npusim.workload import load_workload

STEP = ["--batch", "1", "--context", "16", "--no-cache"]
MOE = find_file("k3-tiny-moe", "workloads").read_text()


# ---- a workload's routing trace


def test_a_missing_routing_trace_names_the_workload_file_and_how_the_path_was_read(capsys, tmp_path, monkeypatch):
    """It was 'routing_trace: no file model/t.yaml', raised while the step was built: neither
    the workload file nor that a relative path is read in that file's folder was said."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.yaml").write_text(MOE + "routing: trace\nrouting_trace: t.yaml\n")
    (tmp_path / "t.yaml").write_text("- [[0, 1]]\n")  # the working folder's: not the one meant
    prof = tmp_path / "prof"
    fails_cleanly(["run", "--workload", "model/w.yaml", *STEP, "--profile", prof], capsys,
                  r"^npusim: error: model/w\.yaml: key 'routing_trace': no file t\.yaml \(a relative path is read "
                  r"in the workload file's folder: model/t\.yaml\)$", outputs=[prof])


def test_a_missing_routing_trace_given_by_workload_set(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(lambda: load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": "t.yaml"}),
                   ConfigError, r"k3-tiny-moe\.yaml \(--workload-set\): key 'routing_trace': no file t\.yaml$")
    one_line_error(lambda: load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": str(tmp_path)}),
                   ConfigError, r"\(--workload-set\): key 'routing_trace': .*: expected a regular file, got a folder$")


def test_profile_records_a_relative_routing_trace_of_workload_set_as_absolute(capsys, tmp_path, monkeypatch):
    """--profile's step file kept '--workload-set routing_trace=../t.yaml' as given: calibrate,
    rerunning the step from another folder, said 'no file ../t.yaml' for every row (or read
    another trace of that name there, silently)."""
    import json

    from npusim.cli import main

    (tmp_path / "run").mkdir()
    (tmp_path / "t.yaml").write_text("- [[0, 1], [2, 3]]\n")
    monkeypatch.chdir(tmp_path / "run")
    assert main(["run", "--workload", "k3-tiny-moe", "--workload-set", "routing=trace", "--workload-set",
                 "routing_trace=../t.yaml", *STEP, "--profile", "prof"]) == 0
    capsys.readouterr()
    sets = json.loads((tmp_path / "run" / "prof" / "npusim_step.json").read_text())["workload_set"]
    assert sets == {"routing": "trace", "routing_trace": str(tmp_path / "t.yaml")}
    monkeypatch.chdir(tmp_path)  # calibrate's folder: the step file's workload loads from here too
    assert load_workload("k3-tiny-moe", sets).routing_trace == str(tmp_path / "t.yaml")


# ---- --set: a section's fields given as one mapping


@pytest.mark.parametrize("flag", ["--set", "--variant"])
def test_a_set_mapping_of_several_fields_is_one_value(flag, capsys):
    """{m0: 16, n0: 16, k0: 16} was refused as a sweep's list of values ('takes one value
    here (a list of values is a sweep ...)'), its commas taken for a list's; it is one value,
    merged as the loader merges any mapping (a bad field in it named by its key path)."""
    from npusim.cli import main

    command = ["run"] if flag == "--set" else ["compare"]
    assert main([*command, "--workload", "k3-tiny", *STEP, flag, "chip={freq_hz: 1.0e9, aic_count: 20}"]) == 0
    capsys.readouterr()
    fails_cleanly([*command, "--workload", "k3-tiny", *STEP, flag, "chip={freq_hz: 0, aic_count: 20}"], capsys,
                  r"ascend910b2(\.yaml)? \(--set\): key 'chip\.freq_hz': expected a value > 0, got 0$")
    fails_cleanly(["run", "--workload", "k3-tiny", *STEP, "--set", "chip.freq_hz=1e9,2e9"], capsys,
                  r"takes one value here \(a list of values is a sweep")  # a list still says so


# ---- step sizes: the flag named


@pytest.mark.parametrize("argv, expect", [
    (["run", "--workload", "k3-tiny", "--batch", "1", "--context", "513"],
     r"^npusim: error: --context 513 \(--workload k3-tiny\): length 513 exceeds the workload's "
     r"max_context_tokens 512$"),
    (["run", "--workload", "k3-tiny", "--batch", "2", "--context", "16,600", "--phase", "prefill"],
     r"^npusim: error: --context 16,600 \(--workload k3-tiny\): length 600 exceeds the workload's "
     r"max_context_tokens 512$"),
    (["run", "--workload", "k3-tiny", "--workload-set", "max_context_tokens=64", "--batch", "1", "--context", "65"],
     r"^npusim: error: --context 65 \(--workload k3-tiny\): length 65 exceeds the workload's "
     r"max_context_tokens 64$"),
    (["run", "--workload", "k3-tiny", "--batch", "100000", "--context", "16"],
     r"argument --batch: expected at most the 65536 sequences a step may have, got 100000"),
])
def test_a_step_past_the_workload_or_the_batch_bound_names_the_flag(argv, expect, capsys, tmp_path):
    """They said 'build_decoder(k3-tiny, decode): length 513 exceeds the workload's
    max_context_tokens 512' and 'build_decoder(...): batch 100000 is more than the 65536
    sequences a step may have': a function's name, not the flag given."""
    out = tmp_path / "o.json"
    fails_cleanly([*argv, "--no-cache", "--json", out], capsys, expect, outputs=[out])
