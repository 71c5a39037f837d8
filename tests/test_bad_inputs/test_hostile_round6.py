"""Bad-input catalogue, round 6: an input path that is no regular file (a named pipe
blocked the run until it was killed), bucket lengths that were sorted, clamped or
kept silently, a config named '' and two counts computed twice. Each bad input is one
line naming the flag or file; a case that blocks fails at its deadline instead of
hanging the suite."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import npusim.cli
from cli_check import fails_cleanly, one_line_error
from kernels import deadline
from npusim.errors import ConfigError
from npusim.graph.routing import LayerRouting
from npusim.hw import load_hw
from npusim.report.tables import STEP_FILE
from npusim.serving.service import load_service

STEP = ["--batch", "1", "--context", "16", "--no-cache"]
RUN = ["run", "--workload", "k3-tiny", *STEP]
SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--requests", "3"]
CALIBRATE_OUT = ["--out", "{d}/my.yaml"]
FIFO = r"expected a regular file, got a named pipe \(FIFO\)$"


# ---- an input that is no regular file, refused before it is opened


@pytest.mark.parametrize("argv, expect", [
    (["run", "--hw", "{p}", "--workload", "k3-tiny", *STEP], r"--hw {p}: " + FIFO),  # said 'no such file'
    (["run", "--workload", "{p}", *STEP], r"--workload {p}: expected a file or a folder, got a named pipe"),
    ([*RUN, "--fusion-rules", "{p}"], r"--fusion-rules {p}: " + FIFO),  # blocked in the cache key's hash
    (["validate", "--workload", "k3-tiny", "--fusion-rules", "{p}"], r"{p}: " + FIFO),  # blocked reading the rules
    (["compare", "--hw", "ascend910b2", "{p}", "--workload", "k3-tiny", *STEP], r"--hw \(B\) {p}: " + FIFO),
    (["op", "matmul", "m=4", "n=64", "k=64", "--hw", "{p}"], r"--hw {p}: " + FIFO),
    (["hw", "show", "{p}"], r"{p}: " + FIFO),
    ([*SERVE, "--rate", "5", "--service", "{p}"], r"{p}: " + FIFO),
    ([*SERVE, "--trace-file", "{p}"], r"{p}: " + FIFO),  # blocked
    ([*SERVE, "--rate", "5", "--prompt-lengths", "file:{p}"], r"--prompt-lengths: {p}: " + FIFO),  # blocked
    (["calibrate", "--hccl", "{p}", *CALIBRATE_OUT], r"--hccl {p}: " + FIFO),  # blocked
    (["calibrate", "--profile", "{p}", *CALIBRATE_OUT], r"{p}: expected a file or a folder, got a named pipe"),
    (["run", "--workload", "k3-tiny-moe", "--workload-set", "routing=trace", "--workload-set", "routing_trace={p}",
      *STEP], r"key 'routing_trace': {p}: " + FIFO),  # said 'no file'
])
def test_a_named_pipe_is_refused_before_it_is_opened(argv, expect, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path / "cache"))
    pipe = tmp_path / "in.yaml"
    os.mkfifo(pipe)  # no writer: opening it for reading would wait forever
    with deadline(20):
        fails_cleanly([a.format(p=pipe, d=tmp_path) for a in argv], capsys, expect.format(p=pipe))


@pytest.mark.parametrize("argv, expect", [
    (["run", "--hw", "{d}", "--workload", "k3-tiny", *STEP], r"--hw {d}: expected a regular file, got a folder$"),
    ([*RUN, "--fusion-rules", "{d}"], r"--fusion-rules {d}: expected a regular file, got a folder$"),
    ([*SERVE, "--trace-file", "{d}"], r"{d}: expected a regular file, got a folder$"),  # said [Errno 21]
    (["calibrate", "--hccl", "{d}", *CALIBRATE_OUT], r"--hccl {d}: expected a regular file, got a folder$"),
    (["run", "--workload", "/dev/zero", *STEP], r"--workload /dev/zero: expected a file or a folder, got a "
                                                r"character device$"),  # said 'no such file'
    ([*SERVE, "--trace-file", "/dev/null"], r"/dev/null: expected a regular file, got a character device$"),
])
def test_a_folder_or_a_device_in_place_of_a_file(argv, expect, capsys, tmp_path):
    folder = tmp_path / "configs.yaml"
    folder.mkdir()
    with deadline(20):
        fails_cleanly([a.format(d=folder) for a in argv], capsys, expect.format(d=folder))


def test_a_link_to_a_named_pipe_is_refused(capsys, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "hw.yaml").symlink_to(tmp_path / "pipe")
    with deadline(20):
        fails_cleanly(["op", "matmul", "m=4", "n=64", "k=64", "--hw", tmp_path / "hw.yaml"], capsys,
                      r"hw\.yaml: " + FIFO)


# ---- --buckets


@pytest.mark.parametrize("buckets, expect", [
    ("0", r"--buckets 0: expected positive lengths, got 0$"),  # the pass worded it, without the flag
    ("-5", r"--buckets -5: expected positive lengths, got -5$"),
    ("256,64", r"--buckets 256,64: expected strictly increasing lengths, got 64 after 256$"),  # it sorted them
    ("64,64", r"--buckets 64,64: expected strictly increasing lengths, got 64 after 64$"),  # kept both
    ("64,100000000000", r"--buckets 64,100000000000: 100000000000 is past k3-tiny's max context \(512 tokens\)"),
    ("1024", r"--buckets 1024: 1024 is past k3-tiny's max context \(512 tokens\)"),  # padded to 512 silently
    ("1e11", r"--buckets: expected a comma list of lengths, got '1e11'$"),
    ("1_000", r"--buckets: expected a comma list of lengths, got '1_000'$"),  # was 1000
    ("9" * 5000, r"--buckets: expected a comma list of lengths, got '9+\.\.\.9+'$"),  # the message held all 5000
])
def test_bad_buckets(buckets, expect, capsys):
    fails_cleanly([*RUN, "--passes", "optimized,buckets", "--buckets", buckets], capsys, expect)


def test_buckets_up_to_the_max_context_run(tmp_path):
    """The bound is the workload's max context as the run has it (--workload-set changes it)."""
    out = tmp_path / "o.json"
    argv = [*RUN, "--passes", "optimized,buckets", "--json", str(out)]
    assert npusim.cli.main([*argv, "--buckets", "64,512"]) == 0
    assert npusim.cli.main([*argv, "--buckets", "64,1024", "--workload-set", "max_context_tokens=1024"]) == 0


def test_a_context_with_an_underscore_is_refused(capsys):
    fails_cleanly(["run", "--workload", "k3-tiny", "--batch", "1", "--context", "1_6"], capsys,
                  r"--context: expected an integer or a comma list of integers, got '1_6'$")


# ---- a config named ''


@pytest.mark.parametrize("argv, flag", [
    (["run", "--hw", "", *STEP], "--hw"),
    (["run", "--workload", "", *STEP], "--workload"),
    ([*SERVE, "--rate", "5", "--service", ""], "--service"),
    ([*SERVE, "--rate", "5", "--compare", "", "seed-baseline"], "--compare"),
    (["calibrate", "--hw", "", "--hccl", "h.txt", "--out", "my.yaml"], "--hw"),
])
def test_an_empty_config_name_on_the_command_line(argv, flag, capsys):
    fails_cleanly(argv, capsys, rf"argument {flag}: expected a value, got an empty string")


def test_hw_show_of_an_empty_name(capsys):
    """It was `.: no such file` (Path('') is the working folder)."""
    fails_cleanly(["hw", "show", ""], capsys,
                  r"hwconfigs: expected a config name or a path to a \.yaml file, got an empty string$")


@pytest.mark.parametrize("load, kind", [(load_hw, "hwconfigs"), (load_service, "services")])
def test_an_empty_name_in_the_api(load, kind):
    one_line_error(lambda: load(""), ConfigError, rf"^{kind}: expected a config name or a path to a \.yaml file, "
                                                  r"got an empty string$")


def test_an_empty_workload_name_in_the_api():
    """It was ': a directory without a config.json' (Path('') is the working folder)."""
    from npusim.workload import load_workload

    one_line_error(lambda: load_workload(""), ConfigError, r"^workload: expected a name or a path, got an empty string$")


def test_a_fusion_rules_pipe_given_in_python_is_refused_before_it_is_read(tmp_path):
    """The cache key hashes a rules file given to the API; a pipe there blocked the read."""
    from npusim.diskcache.keys import file_digest

    fifo = tmp_path / "rules.fifo"
    os.mkfifo(fifo)
    one_line_error(lambda: file_digest(fifo), ConfigError, r"^fusion_rules: expected a regular file, got a named pipe")


# ---- counted once


def test_run_reads_the_workload_sets_once(tmp_path, monkeypatch):
    """_cmd_run read --workload-set twice to write them into the profile's step."""
    calls = []
    real = npusim.cli.workload_sets
    monkeypatch.setattr(npusim.cli, "workload_sets", lambda args: calls.append(1) or real(args))
    profile = tmp_path / "prof"
    assert npusim.cli.main([*RUN, "--workload-set", "max_context_tokens=256", "--profile", str(profile)]) == 0
    assert len(calls) == 1
    assert json.loads((profile / STEP_FILE).read_text())["workload_set"] == {"max_context_tokens": "256"}


def test_dropped_rows_count_the_routing_once(monkeypatch):
    """Experts 0..3 routed 5, 1, 0, 2 rows, capacity 2: 3 of expert 0's rows dropped."""
    ids = np.array([0, 0, 0, 0, 0, 1, 3, 3]).reshape(-1, 1)
    calls = []
    real = np.bincount
    monkeypatch.setattr(np, "bincount", lambda *a, **k: calls.append(1) or real(*a, **k))
    routing = LayerRouting(ids, experts=4, capacity=2)
    assert routing.dropped_rows == 3
    assert len(calls) == 1
    assert routing.tokens_per_expert == (2, 1, 0, 2)
    assert LayerRouting(ids, experts=4).dropped_rows == 0
