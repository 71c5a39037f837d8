"""Sweeps: the grid, rows in grid order whatever order workers finish in, failed
points reported in their row, Ctrl-C keeps what finished, the CSV and the plot."""

import csv
import os
import signal
import time
from pathlib import Path

import matplotlib.image
import pytest

from npusim.cli import main
from sweep_process import sweep_until
from npusim.errors import ConfigError
from npusim.sweep import (
    METRICS,
    SweepInterrupted,
    parse_grid,
    parse_values,
    plot,
    points,
    sweep,
    write_csv,
)

TINY = {"batch": 2, "context": 64}
GIB = 1 << 30
TOO_SMALL = 1 << 20  # hbm.hbm_bytes that k3-tiny's 3.4 MiB of weights and cache do not fit in
HEADER = ["hbm.peak_bw_bytes_per_s", "chip.aic_count", *METRICS, "status"]


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with path.open() as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames), list(reader)


# ---- the grid


def test_parse_values_reads_numbers():
    assert parse_values("hbm.peak_bw_bytes_per_s=1.2e12,1.6e12") == ("hbm.peak_bw_bytes_per_s", [1.2e12, 1.6e12])
    assert parse_values(" chip.aic_count = 20,24 ") == ("chip.aic_count", [20, 24])


def test_parse_values_reads_a_bracketed_list_as_its_values():
    """As `npusim op` reads [8,4096]: the list was split into '[1' (a YAML error) and '2]',
    and (1,2) into the words '(1' and '2)'."""
    for text in ("[1,2]", "[1, 2]", "(1,2)", " [1,2] "):
        assert parse_values(f"batch={text}") == ("batch", [1, 2])
    assert parse_values("batch=(4,)") == ("batch", [4])


@pytest.mark.parametrize(("items", "message"), [
    (["chip.aic_count=20,,32"], "--set chip.aic_count: value 2 of '20,,32' is empty"),
    (["chip.aic_count"], "--set chip.aic_count: expected key.path=value[,value...]"),
    (["chip.aic_count=20", "chip.aic_count=24"], "--set chip.aic_count: given twice"),
    (["chip.aic_count=[1, 2"], "--set chip.aic_count: '[1, 2' has a bracket not closed or not opened"),
    (["batch=1,2]"], "--set batch: '1,2]' has a bracket not closed"),
    (["batch=[1,[2]]"], "--set batch: value '[2]' is not a number or a word"),
])
def test_parse_grid_errors_name_the_key(items, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_grid(items)


def test_points_first_key_slowest_and_grids_in_turn():
    grid = {"a": [1, 2], "b": ["x", "y", "z"]}
    assert points(grid) == [{"a": a, "b": b} for a in (1, 2) for b in ("x", "y", "z")]
    assert points([grid, {"c": [7]}])[-1] == {"c": 7} and len(points([grid, {"c": [7]}])) == 7


@pytest.mark.parametrize(("grid", "message"), [
    ({"chip.aic_cuont": [20]}, "unknown key 'chip.aic_cuont'"),
    ({"chip.aic_count": [0]}, "chip.aic_count"),
    ({"batch": [0]}, "--set batch=0: expected a positive integer"),
    ({"chip.aic_count": []}, "--set chip.aic_count: expected a non-empty list"),
])
def test_a_bad_grid_is_one_error_before_anything_runs(grid, message):
    with pytest.raises(ConfigError, match=message):
        sweep("k3-tiny", grid, jobs=1, **TINY)


# ---- running


def test_rows_in_grid_order_and_a_failing_point_in_its_row(tmp_path):
    grid = [{"hbm.peak_bw_bytes_per_s": [1.2e12, 2.4e12], "chip.aic_count": [20, 24]},
            {"hbm.hbm_bytes": [TOO_SMALL]}]
    rows = sweep("k3-tiny", grid, jobs=2, **TINY)
    assert [{k: r[k] for k in p} for r, p in zip(rows, points(grid))] == points(grid)
    ok, failed = rows[:4], rows[4]
    assert all(r["status"] == "ok" and r["latency_us"] > 0 and r["kernel_count"] > 0 for r in ok)
    assert failed["status"].startswith("OutOfMemoryError: k3-tiny decode batch 2 x context 64 does not fit")
    assert "\n" not in failed["status"] and all(failed[m] is None for m in METRICS)
    # more HBM bandwidth never makes the step slower
    assert rows[2]["latency_us"] <= rows[0]["latency_us"] and rows[3]["latency_us"] <= rows[1]["latency_us"]
    path = write_csv(rows, tmp_path / "sweep.csv")
    header, lines = read_csv(path)
    assert header == [*HEADER[:2], "hbm.hbm_bytes", *HEADER[2:]]
    assert [line["chip.aic_count"] for line in lines] == ["20", "24", "20", "24", ""]
    assert lines[4]["latency_us"] == "" and lines[4]["status"] == failed["status"]
    png, svg = plot(rows, tmp_path, title="k3-tiny")
    assert png.name == "sweep.png" and svg.exists() and matplotlib.image.imread(png).var() > 0


def test_the_csv_does_not_depend_on_the_workers(tmp_path):
    grid = {"chip.aic_count": [24, 20, 32], "batch": [2, 1]}
    one = write_csv(sweep("k3-tiny", grid, jobs=1, context=64), tmp_path / "one.csv").read_bytes()
    two = write_csv(sweep("k3-tiny", grid, jobs=2, context=64), tmp_path / "two.csv").read_bytes()
    assert one == two


def _slow_first(spec, params):
    """run_point, with the grid's first point finishing last."""
    if params["chip.aic_count"] == 20:
        time.sleep(1.0)
    return {**params, **dict.fromkeys(METRICS, 1.0), "status": "ok"}


def test_rows_in_grid_order_when_workers_finish_out_of_order(monkeypatch):
    import npusim.sweep

    monkeypatch.setattr(npusim.sweep, "run_point", _slow_first)  # forked workers inherit it
    finished = []
    rows = sweep("k3-tiny", {"chip.aic_count": [20, 24, 32]}, jobs=2, progress=lambda *a: finished.append(a[0]))
    assert [r["chip.aic_count"] for r in rows] == [20, 24, 32]
    assert finished == [0, 1, 2, 3]


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_keeps_the_finished_rows(jobs):
    grid = {"chip.aic_count": [20, 24, 32], "batch": [1, 2]}

    def progress(done, total, failed):
        if done == 2:
            raise KeyboardInterrupt

    start = time.monotonic()
    with pytest.raises(SweepInterrupted) as info:
        sweep("k3-tiny", grid, jobs=jobs, context=64, progress=progress)
    assert time.monotonic() - start < 30
    rows, every = info.value.rows, points(grid)
    assert len(rows) == 2 and info.value.total == 6
    index = [every.index({k: r[k] for k in grid}) for r in rows]
    assert index == sorted(index) and (jobs == 2 or index == [0, 1])
    assert isinstance(info.value, KeyboardInterrupt)


def test_k3_decode_twelve_points_and_one_out_of_memory(tmp_path, capsys):
    """The issue's sweep: k3 decode at batch 8 x 4096, 3 HBM bandwidths x 2 core
    counts x 2 L2 sizes, plus a point whose HBM is too small for weights + KV cache."""
    grid = [{"hbm.peak_bw_bytes_per_s": [1.2e12, 1.6e12, 2.4e12], "chip.aic_count": [20, 24],
             "l2.l2_bytes": [96 << 20, 192 << 20]},
            {"hbm.hbm_bytes": [16 * GIB]}]
    start = time.monotonic()
    rows = sweep("k3", grid, batch=8, context=4096, passes="optimized")
    seconds = time.monotonic() - start
    with capsys.disabled():
        print(f"\n  k3 decode sweep: {len(rows)} points in {seconds:.1f} s with {os.cpu_count()} workers")
    assert len(rows) == 13 and [r["status"] for r in rows[:12]] == ["ok"] * 12
    assert rows[12]["status"].startswith("OutOfMemoryError: k3 decode batch 8 x context 4096 does not fit")
    by_bw = {}
    for r in rows[:12]:
        by_bw.setdefault(r["hbm.peak_bw_bytes_per_s"], []).append(r["latency_us"])
    assert max(by_bw[2.4e12]) < min(by_bw[1.6e12]) and max(by_bw[1.6e12]) < min(by_bw[1.2e12])  # HBM bound
    header, lines = read_csv(write_csv(rows, tmp_path / "sweep.csv"))
    assert len(lines) == 13 and header[-1] == "status"
    assert all(p.exists() for p in plot(rows, tmp_path))


# ---- the command line


def test_cli_sweep_writes_csv_and_plot(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["sweep", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--jobs", "2",
            "--set", "hbm.peak_bw_bytes_per_s=1.2e12,2.4e12", "--set", f"hbm.hbm_bytes={TOO_SMALL},{64 * GIB}",
            "--out", str(out)]
    assert main(argv) == 1  # a point failed: the CSV and the plots are written, the status says so
    captured = capsys.readouterr()
    assert "4 points (2 ok, 2 failed)" in captured.out and "OutOfMemoryError" in captured.out
    assert captured.err == ""  # no progress bar when stderr is not a terminal
    header, lines = read_csv(out / "sweep.csv")
    assert header == ["hbm.peak_bw_bytes_per_s", "hbm.hbm_bytes", *METRICS, "status"]
    assert [(float(r["hbm.peak_bw_bytes_per_s"]), int(r["hbm.hbm_bytes"])) for r in lines] == [
        (1.2e12, TOO_SMALL), (1.2e12, 64 * GIB), (2.4e12, TOO_SMALL), (2.4e12, 64 * GIB)]
    assert [r["status"] == "ok" for r in lines] == [False, True, False, True]
    assert all(float(r["latency_us"]) > 0 and int(r["kernel_count"]) > 0 for r in lines[1::2])
    assert matplotlib.image.imread(out / "sweep.png").var() > 0 and (out / "sweep.svg").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", "chip.aic_count=20,,32"], "--set chip.aic_count: value 2 of '20,,32' is empty"),
    (["--set", "chip.aic_count=20,abc"], "chip.aic_count"),
    ([], "sweep: nothing to sweep"),
    (["--set", "batch=1,2", "--jobs", "0"], "--jobs: expected a positive integer, got 0"),
    # 10**9 forked a worker per point (thousands, past the open-file limit)
    (["--set", "batch=1,2", "--jobs", str(10**9)], "--jobs: expected at most 1024 workers, got 1000000000"),
])
def test_cli_sweep_errors_are_one_line(argv, message, tmp_path, capsys):
    assert main(["sweep", "--workload", "k3-tiny", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_ctrl_c_writes_the_rows_so_far_and_exits_130(tmp_path):
    """A real SIGINT to `npusim sweep` once some points are done."""
    out = tmp_path / "out"
    cmd = ["sweep", "--workload", "k3-tiny", "--context", "64", "--jobs", "2",
           "--set", "batch=1,2,3,4", "--set", "chip.aic_count=16,20,24,32", "--set", "l2.l2_bytes=64e6,128e6",
           "--out", out]
    proc = sweep_until(cmd, 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert "interrupted: " in err.decode() and "Traceback" not in err.decode()
    header, lines = read_csv(out / "sweep.csv")
    assert header[:3] == ["batch", "chip.aic_count", "l2.l2_bytes"]
    assert 2 <= len(lines) < 32 and all(r["status"] == "ok" for r in lines)
