"""Bad-input catalogue, sweep backends and resume: an unknown backend, a Ray that is
not installed or not reachable, --resume on a CSV from another grid."""

import socket
import sys

import pytest

from cli_check import fails_cleanly

SWEEP = ["sweep", "--workload", "k3-tiny", "--context", "64", "--set", "batch=1,2"]


@pytest.mark.parametrize("flag, knob", [(["--batch", "2"], "batch=1,2"), (["--context=64"], "context=32,64"),
                                        (["--bat", "2"], "batch=1,2")])
def test_a_step_knob_given_by_its_flag_and_by_the_grid(flag, knob, tmp_path, capsys):
    """--batch 2 with --set batch=1,2: the flag was ignored, and the title said batch 2."""
    name = knob.split("=")[0]
    fails_cleanly(["sweep", "--workload", "k3-tiny", *flag, "--set", knob, "--out", tmp_path / "o"], capsys,
                  rf"sweep: --{name} and --set {name}=\.\.\. both give the {name}: drop one", [tmp_path / "o"])


@pytest.mark.parametrize("flags, expect", [
    (["--batch", "0"], r"argument --batch: expected a whole number of sequences >= 1, got 0"),
    (["--context", "1000"], r"length 1000 exceeds the workload's max_context_tokens 512$"),
    (["--batch", "3", "--context", "4,8"], r"--context 4,8: 2 lengths for batch 3$"),
    (["--tp", "3"], r"--tp 3 does not divide k3-tiny's heads 4$"),
    (["--sp", "2"], r"--sp 2: sequence parallel splits a prefill's prompt"),
    (["--pp", "2"], r"--pp: a pipelined step is run by `npusim run`, not swept$"),
    (["--set", "context=600,700"], r"length 600 exceeds the workload's max_context_tokens 512$"),
])
def test_a_flag_no_point_can_take_is_refused_before_any_runs(flags, expect, tmp_path, capsys):
    """They ran every point, each failing alike, and wrote sweep.csv and the plot of failures."""
    out = tmp_path / "o"
    fails_cleanly(["sweep", "--workload", "k3-tiny", "--jobs", "1", "--set", "chip.aic_count=4,8", *flags,
                   "--out", out], capsys, expect, [out / "sweep.csv", out / "sweep.png"])


def test_a_shape_some_points_can_take_fails_only_at_the_others(tmp_path, capsys):
    from npusim.cli import main

    assert main(["sweep", "--workload", "k3-tiny", "--jobs", "1", "--set", "context=8,1000",
                 "--out", str(tmp_path / "o")]) == 1
    out = capsys.readouterr().out
    assert "1 ok, 1 failed" in out and "length 1000 exceeds" in out


def test_an_unknown_backend(tmp_path, capsys):
    fails_cleanly([*SWEEP, "--backend", "dask", "--out", tmp_path / "o"], capsys,
                  r"--backend dask: unknown backend \(expected one of: local, ray\)", [tmp_path / "o"])


def test_an_address_without_the_ray_backend(tmp_path, capsys):
    fails_cleanly([*SWEEP, "--address", "auto", "--out", tmp_path / "o"], capsys,
                  r"--address auto: only the ray backend connects to a cluster \(add --backend ray\)")


def test_ray_not_installed_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    fails_cleanly([*SWEEP, "--backend", "ray", "--out", tmp_path / "o"], capsys,
                  r'--backend ray: Ray is not installed: pip install "npusim\[ray\]"', [tmp_path / "o"])


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address, reason", [
    ("ray://127.0.0.1:{port}", r"cannot reach 127\.0\.0\.1:\d+ \(Connection refused\)"),
    ("127.0.0.1:{port}", r"cannot reach 127\.0\.0\.1:\d+ \(Connection refused\)"),
    ("ray://192.0.2.1:10001", r"cannot reach 192\.0\.2\.1:10001 \([A-Za-z ]+\)"),
    ("ray://head", r"expected auto, ray://HOST:PORT or HOST:PORT"),
    ("http://head:10001", r"expected auto, ray://HOST:PORT or HOST:PORT"),
])
def test_an_unreachable_or_malformed_address_fails_fast(address, reason, tmp_path, capsys):
    """192.0.2.1 is TEST-NET-1 (RFC 5737), never routed: the connection times out
    (CONNECT_TIMEOUT_S), or is refused where a firewall answers, rather than Ray
    retrying for minutes."""
    pytest.importorskip("ray", reason='the ray extra is not installed (pip install "npusim[ray]")')
    address = address.format(port=_closed_port())
    fails_cleanly([*SWEEP, "--backend", "ray", "--address", address, "--out", tmp_path / "o"], capsys,
                  rf"--address {address}: {reason}", [tmp_path / "o"], seconds=20)


def test_auto_without_a_running_cluster(tmp_path, capsys, monkeypatch):
    ray = pytest.importorskip("ray", reason='the ray extra is not installed (pip install "npusim[ray]")')
    if ray.is_initialized():
        pytest.skip("a Ray instance is running in this process")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no-ray-here"))  # where `auto` looks for a local head
    fails_cleanly([*SWEEP, "--backend", "ray", "--address", "auto", "--out", tmp_path / "o"], capsys,
                  r"--address auto: ConnectionError: Could not find any running Ray instance", [tmp_path / "o"])


def test_resume_into_a_folder_of_something_else(tmp_path, capsys):
    """--resume on a folder holding other files and no sweep (a mistyped --out) started a
    sweep among them, where without --resume the folder is refused as not empty."""
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine\n")
    fails_cleanly([*SWEEP, "--resume", "--out", tmp_path / "o"], capsys,
                  r"^npusim: error: --resume: .*o holds no sweep to resume \(1 entries, none of them sweep\.csv, "
                  r"e\.g\. notes\.txt\); give the folder of the interrupted sweep$")
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["notes.txt"]


def test_resume_with_a_csv_from_another_grid(tmp_path, capsys):
    from npusim.cli import main

    out = tmp_path / "o"
    assert main([*SWEEP, "--out", str(out), "--jobs", "1"]) == 0
    before = (out / "sweep.csv").read_bytes()
    capsys.readouterr()
    fails_cleanly([*SWEEP[:-1], "batch=1,2,3", "--resume", "--out", out], capsys,
                  r"--resume: .*sweep\.csv was made with other settings \(grid: .*there, .* now\); give a new --out")
    assert (out / "sweep.csv").read_bytes() == before


@pytest.mark.parametrize("out, expect", [
    ("/proc/x/s", r"--out \(sweep\.csv\) /proc/x/s/sweep\.csv: cannot be written: no new file can be made in /proc"),
    ("{d}/a_file/s", r"--out \(sweep\.csv\) .*/a_file/s/sweep\.csv: cannot be written: Not a directory"),
], ids=["proc", "under-a-file"])
def test_an_out_that_cannot_be_written_is_refused_before_the_backend_starts(out, expect, tmp_path, capsys,
                                                                           monkeypatch):
    """Issue 35: --out is checked before a backend starts (a Ray instance, worker
    processes) or a point runs, not when the first point finishes."""
    (tmp_path / "a_file").write_text("x")
    monkeypatch.setattr("npusim.backends.get_backend", lambda *a: pytest.fail("a backend started"))
    fails_cleanly([*SWEEP, "--backend", "ray", "--out", out.format(d=tmp_path)], capsys, expect)
    assert (tmp_path / "a_file").read_text() == "x"


@pytest.mark.parametrize("sets, expect", [
    ([f"batch={','.join(map(str, range(1, 20001)))}"],
     r"--set batch: 20000 values, more than the 4096 points a sweep takes"),
    ([f"batch={','.join(map(str, range(1, 101)))}", f"chip.aic_count={','.join(map(str, range(1, 101)))}"],
     r"--set: 10,000 points \(batch 100 x chip\.aic_count 100 values\), more than the 4096 a sweep takes"),
])
def test_a_grid_of_thousands_of_points_is_refused(sets, expect, tmp_path, capsys):
    """20,000 values in one --set were checked for minutes before the first point ran; a
    100 x 100 grid ran 10,000 points (hours), with no word of its size."""
    argv = ["sweep", "--workload", "k3-tiny", "--jobs", "1", "--out", tmp_path / "o"]
    for s in sets:
        argv += ["--set", s]
    fails_cleanly(argv, capsys, expect, [tmp_path / "o"], seconds=5)


def test_the_api_refuses_a_grid_of_thousands_of_points_before_loading_its_values():
    from cli_check import one_line_error
    from npusim.errors import ConfigError
    from npusim.sweep import sweep

    one_line_error(lambda: sweep("k3-tiny", [{"chip.aic_count": list(range(1, 4000))}, {"batch": [1, 2, 3, 4, 5]},
                                             {"batch": list(range(1, 200))}]),
                   ConfigError, r"4,203 points \(chip\.aic_count 3999; batch 5; batch 199 values\)")


def test_the_docs_give_the_largest_grid_the_code_takes():
    from pathlib import Path

    from npusim.sweep import MAX_POINTS

    assert f"of at most {MAX_POINTS} points" in (Path(__file__).parents[2] / "docs" / "sweeps.md").read_text()
