"""Resumable sweeps: rows flushed as points finish, a killed sweep resumed to the same
CSV as an uninterrupted one, a torn last line dropped, other settings refused."""

import csv
import io
import json
import re
import signal
from pathlib import Path

import pytest

from npusim.cli import main
from sweep_process import sweep_until
from npusim.errors import ConfigError
from npusim.sweep import METRICS, points, sweep
from npusim.workload import load_workload

ROOT = Path(__file__).resolve().parents[1]
GRID = {"chip.aic_count": [16, 20, 24], "hbm.peak_bw_bytes_per_s": [1.2e12, 1.6e12, 2.4e12, 3.2e12]}
ARGV = ["sweep", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--jobs", "2",
        "--set", "chip.aic_count=16,20,24", "--set", "hbm.peak_bw_bytes_per_s=1.2e12,1.6e12,2.4e12,3.2e12"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> bytes:
    """The CSV of the 12-point sweep run in one go."""
    out = tmp_path_factory.mktemp("whole")
    assert main([*ARGV, "--out", str(out)]) == 0
    return (out / "sweep.csv").read_bytes()


def test_a_killed_sweep_resumes_to_the_csv_of_an_uninterrupted_run(tmp_path, uninterrupted, capsys):
    """SIGKILL (no handler runs: the CSV is as the rows were flushed, in the order
    they finished) once three points are done, then --resume."""
    out = tmp_path / "out"
    proc = sweep_until([*ARGV, "--out", out], 3)
    proc.kill()
    proc.wait(timeout=30)
    kept = list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))
    assert 3 <= len(kept) < 12, "killed after 3 points, before the last"
    assert all(r["status"] == "ok" for r in kept)
    capsys.readouterr()
    assert main([*ARGV, "--out", str(out), "--resume"]) == 0
    assert "12 points (12 ok, 0 failed)" in capsys.readouterr().out
    assert (out / "sweep.csv").read_bytes() == uninterrupted


def _ran(monkeypatch) -> list[dict]:
    """The points run from here on (in this process: jobs=1)."""
    import npusim.sweep

    ran, real = [], npusim.sweep.run_point
    monkeypatch.setattr(npusim.sweep, "run_point", lambda spec, p: ran.append(p) or real(spec, p))
    return ran


def test_resume_drops_a_torn_line_reruns_lost_points_and_skips_the_rest(tmp_path, uninterrupted, monkeypatch):
    """A CSV as a killed sweep leaves it: rows in the order they finished, one row a
    lost worker's, the last line cut short. Only the lost, torn and missing points run."""
    out = tmp_path / "out"
    whole = sweep("k3-tiny", GRID, batch=2, context=64, jobs=1, out=out)
    assert (out / "sweep.csv").read_bytes() == uninterrupted
    header, *lines = (out / "sweep.csv").read_text().splitlines(keepends=True)
    cells = lines[1].split(",")
    lost = ",".join(cells[:2] + [""] * len(METRICS) + ["worker lost (killed by SIGKILL)\r\n"])
    (out / "sweep.csv").write_text(header + lines[4] + lines[0] + lost + lines[7] + lines[2][:20], newline="")
    ran = _ran(monkeypatch)
    again = sweep("k3-tiny", GRID, batch=2, context=64, jobs=1, out=out, resume=True)
    every = points(GRID)
    assert ran == [every[i] for i in (1, 2, 3, 5, 6, 8, 9, 10, 11)]
    assert again == whole
    assert (out / "sweep.csv").read_bytes() == uninterrupted
    ran.clear()
    assert sweep("k3-tiny", GRID, batch=2, context=64, jobs=1, out=out, resume=True) == whole and ran == []


@pytest.mark.parametrize(("change", "message"), [
    (dict(grid={"chip.aic_count": [16, 20], "hbm.peak_bw_bytes_per_s": [1.2e12]}), r"grid: "),
    (dict(batch=4), r"step\.batch: 2 there, 4 now"),
    (dict(hw_set={"hbm.hbm_bytes": 1 << 34}), r"overrides\.hbm\.hbm_bytes: unset there, 17179869184 now"),
])
def test_resume_refuses_a_csv_made_with_other_settings(tmp_path, change, message):
    out = tmp_path / "out"
    sweep("k3-tiny", {"chip.aic_count": [16, 20], "hbm.peak_bw_bytes_per_s": [1.2e12, 2.4e12]}, batch=2,
          context=64, jobs=1, out=out)
    before = (out / "sweep.csv").read_bytes()
    args = dict(grid={"chip.aic_count": [16, 20], "hbm.peak_bw_bytes_per_s": [1.2e12, 2.4e12]}, batch=2) | change
    with pytest.raises(ConfigError, match=r"--resume: .*sweep\.csv was made with other settings \(" + message) as e:
        sweep("k3-tiny", args["grid"], batch=args["batch"], context=64, jobs=1, out=out, resume=True,
              overrides=args.get("hw_set"))
    assert "\n" not in str(e.value)
    assert (out / "sweep.csv").read_bytes() == before


def test_resume_refuses_an_edited_hardware_file(tmp_path):
    hw = tmp_path / "hw.yaml"
    hw.write_text((ROOT / "hwconfigs" / "ascend910b2.yaml").read_text())
    out = tmp_path / "out"
    sweep("k3-tiny", {"batch": [1, 2]}, hw=str(hw), context=64, jobs=1, out=out)
    hw.write_text(hw.read_text().replace("aic_count: 24", "aic_count: 20", 1))
    with pytest.raises(ConfigError, match="made with other settings \\(hw_content: "):
        sweep("k3-tiny", {"batch": [1, 2]}, hw=str(hw), context=64, jobs=1, out=out, resume=True)


def test_resume_refuses_a_csv_without_its_settings_or_with_foreign_rows(tmp_path):
    out = tmp_path / "out"
    sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out)
    text = (out / "sweep.csv").read_text()
    (out / "sweep.csv").write_text(text + text.splitlines(keepends=True)[1].replace("1,", "7,", 1))
    with pytest.raises(ConfigError, match=r"sweep\.csv: line 4 is not a point of this grid: 7,"):
        sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True)
    row = text.splitlines()[1]  # batch 1: its first figure (latency_us) spoiled by a letter
    latency = row.split(",")[1]
    spoiled = "x" + latency[1:]
    (out / "sweep.csv").write_text(text.replace(row, row.replace(latency, spoiled, 1), 1))
    with pytest.raises(ConfigError, match=r"sweep\.csv: line 2 has a figure that is not a number: 1,"
                                          + re.escape(spoiled)):
        sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True)
    (out / "sweep.csv").write_bytes(b"\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"sweep\.csv: not a sweep CSV"):
        sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True)
    (out / "sweep.settings.json").unlink()
    with pytest.raises(ConfigError, match=r"no sweep\.settings\.json beside it"):
        sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True)


def test_rows_are_flushed_as_they_finish(tmp_path):
    """What a reader sees in sweep.csv while the sweep runs: the header and every finished row."""
    out = tmp_path / "out"
    seen = []

    def progress(done, total, failed):
        if done:
            seen.append(len((out / "sweep.csv").read_text().splitlines()) - 1)

    sweep("k3-tiny", {"batch": [1, 2, 3]}, context=64, jobs=1, out=out, progress=progress)
    assert seen == [1, 2, 3]
    settings = json.loads((out / "sweep.settings.json").read_text())
    assert settings["grid"] == [{"batch": [1, 2, 3]}] and settings["workload"] == "k3-tiny"


def test_cli_resume_of_a_finished_sweep_runs_nothing_and_refuses_overwrite_too(tmp_path, capsys, uninterrupted):
    out = tmp_path / "out"
    assert main([*ARGV, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*ARGV, "--out", str(out), "--resume"]) == 0
    assert (out / "sweep.csv").read_bytes() == uninterrupted
    assert main([*ARGV, "--out", str(out), "--resume", "--overwrite"]) == 2
    assert "--resume and --overwrite: give one" in capsys.readouterr().err


def test_ctrl_c_then_resume(tmp_path, uninterrupted):
    """SIGINT: the finished rows are rewritten in grid order; --resume completes them."""
    out = tmp_path / "out"
    proc = sweep_until([*ARGV, "--out", out], 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "--resume runs the rest" in err.decode()
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    every = [(str(p["chip.aic_count"]), str(p["hbm.peak_bw_bytes_per_s"])) for p in points(GRID)]
    index = [every.index((r["chip.aic_count"], r["hbm.peak_bw_bytes_per_s"])) for r in rows]
    assert index == sorted(index) and 2 <= len(rows) < 12
    assert main([*ARGV, "--out", str(out), "--resume"]) == 0
    assert (out / "sweep.csv").read_bytes() == uninterrupted


def test_resume_refuses_a_rewritten_routing_trace(tmp_path):
    """The settings held the workload's repr: a routing trace rewritten at the same path
    between a sweep and its resume mixed rows of both traces, silently."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([[[t % 8, (t + 1) % 8] for t in range(64)]]))
    w = load_workload("k3-tiny-moe", {"routing": "trace", "routing_trace": str(trace)})
    out = tmp_path / "out"
    sweep(w, {"batch": [8, 16]}, context=16, jobs=1, out=out)
    trace.write_text(json.dumps([[[0, 1]] * 64]))
    with pytest.raises(ConfigError, match="made with other settings \\(workload_content: "):
        sweep(w, {"batch": [8, 16]}, context=16, jobs=1, out=out, resume=True)


@pytest.mark.parametrize("edit, message", [
    (lambda cells: cells[:1] + [""] + cells[2:], r"line 2 is ok but has no latency_us: 1,,"),
    (lambda cells: cells[:-1] + [""], r"line 2 has no status \(expected ok, or the error of a point that failed\)"),
])
def test_resume_refuses_a_row_edited_out_of_shape(tmp_path, edit, message):
    """An ok row without its latency was kept, and the table of the finished sweep failed
    with a traceback (unsupported format string passed to NoneType); a row without a
    status read as a point that failed, with no reason."""
    out = tmp_path / "out"
    sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out)
    header, first, *rest = (out / "sweep.csv").read_bytes().decode().splitlines(keepends=True)
    edited = ",".join(edit(first.rstrip("\r\n").split(","))) + "\r\n"
    (out / "sweep.csv").write_text(header + edited + "".join(rest), newline="")
    with pytest.raises(ConfigError, match=message) as e:
        sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True)
    assert "\n" not in str(e.value)


def test_resume_refuses_a_point_given_twice_with_other_figures(tmp_path):
    """A row repeated by hand with other figures: the last one was kept without a word. (The
    same row twice, as two sweeps of one point leave it, is one result: read.)"""
    out = tmp_path / "out"
    whole = sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out)
    header, first, second = (out / "sweep.csv").read_bytes().decode().splitlines(keepends=True)
    (out / "sweep.csv").write_text(header + first + second + first, newline="")
    assert sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True) == whole
    again = first.replace("1,1", "1,2", 1)
    (out / "sweep.csv").write_text(header + first + second + again, newline="")
    with pytest.raises(ConfigError, match=r"sweep\.csv: line 4 holds the point of line 2 again, with other "
                                          r"figures: 1,2") as e:
        sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["5\n", "[{}]\n", "null\n"])
def test_resume_refuses_settings_that_are_not_an_object(tmp_path, text):
    """A sweep.settings.json holding a number or a list: 'int' object is not iterable,
    'unhashable type: dict', with a traceback."""
    out = tmp_path / "out"
    sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out)
    (out / "sweep.settings.json").write_text(text)
    with pytest.raises(ConfigError, match=r"sweep\.settings\.json: expected the JSON object of a sweep's settings, "
                                          + re.escape(f"got {text.strip()};")):
        sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True)


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_a_second_sweep_in_a_folder_being_written_is_refused(tmp_path, flag, capsys):
    """A second terminal's sweep --overwrite of the --out a sweep was writing replaced its
    CSV and settings, and the first one's last rows then went under the second's settings
    (a later --resume took them as its own); now the folder is held while a sweep writes it."""
    import fcntl
    import os

    out = tmp_path / "out"
    sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    held = os.open(out, os.O_RDONLY)  # as the sweep writing it holds it
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        argv = ["sweep", "--workload", "k3-tiny", "--context", "64", "--set", "batch=1,2,3", "--jobs", "1",
                "--out", str(out), flag]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == f"npusim: error: {out}: another sweep is writing its files now (wait for it to end, or give " \
                      "another --out)\n"
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        os.close(held)
    assert main(argv[:-1] + ["--overwrite"]) == 0  # let go, and the sweep that held it let go too
    assert main(argv[:-1] + ["--resume"]) == 0


def test_resume_reads_a_csv_an_editor_saved(tmp_path):
    """A byte-order mark before the header said 'its columns are not this sweep's (batch,...)',
    the same columns to the eye; a blank last line 'line 4 is not a point of this grid: ' (nothing)."""
    out = tmp_path / "out"
    whole = sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out)
    before = (out / "sweep.csv").read_bytes()
    (out / "sweep.csv").write_bytes(b"\xef\xbb\xbf" + before + b"\r\n")
    assert sweep("k3-tiny", {"batch": [1, 2]}, context=64, jobs=1, out=out, resume=True) == whole
    assert (out / "sweep.csv").read_bytes() == before
