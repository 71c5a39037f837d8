"""Hostile use of npusim's outputs, signals and sweeps (issue 10's first two families).

Every case asserts the exit status, a message of at most 3 lines without a
traceback, and that no partial output is left: a file asked for is either whole
(it parses) or absent, no temporary file remains, and a file that was there
before (an input, an earlier result) is unchanged unless it was replaced whole.

Signal cases run `npusim` in a subprocess and deliver the signal at a chosen
moment: the child is started through a small driver that makes one step (a file
write, the simulation, a sweep point) send the signal to its own process, so the
signal lands exactly mid-write or mid-run on any machine, however loaded.
Sweep cases replace the simulated point by a fake one (forked workers inherit it),
so they take a fraction of a second; the real sweep is covered by tests/test_sweep.py.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_check import interrupt_at_the_first_replace
from npusim.cli import main
from npusim.outputs import OutputError, atomic_write, write_text
from npusim.outputs_check import check_paths, check_writable

ROOT = Path(__file__).resolve().parents[2]
RUN = ["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64"]
OP = ["op", "add", "shape=8,4096"]
TOO_SMALL = 1 << 20  # hbm.hbm_bytes that k3-tiny's 3.4 MiB of weights and cache do not fit in


# ---- helpers


def clean_error(err: str) -> None:
    """A message of 1 to 3 lines and no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, err


def no_partial(folder: Path) -> None:
    """No temporary file left, and every JSON or CSV output in `folder` is whole."""
    for p in folder.rglob("*"):
        assert not (p.name.startswith(".") and p.name.endswith(".tmp")), f"temporary file left: {p}"
        if p.suffix == ".json" and p.is_file():
            json.loads(p.read_text())
        if p.suffix == ".csv" and p.is_file():
            rows = list(csv.reader(p.open()))
            assert rows and all(len(r) == len(rows[0]) for r in rows), p


def cli(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(argv, capsys, *needles) -> str:
    """The command exits 2 with one clean message holding every needle."""
    code, _, err = cli(argv, capsys)
    assert code == 2, err
    clean_error(err)
    for n in needles:
        assert str(n) in err, err
    return err


DRIVER = """
import contextlib, os, signal, sys, time
import npusim.outputs, npusim.runtime.decoder, npusim.sweep
from npusim.cli import main
HOOK, SIG = sys.argv[1], getattr(signal, sys.argv[2])
def fire():
    os.kill(os.getpid(), SIG)
    time.sleep(30)  # the signal's handler ends this
if HOOK == "write":  # the signal lands when half of the first file is written
    real = npusim.outputs.atomic_write
    @contextlib.contextmanager
    def halfway(path, mode="w", **kw):
        with real(path, mode, **kw) as f:
            class Half:
                def write(self, data):
                    f.write(data[: len(data) // 2]); f.flush(); fire()
            yield Half()
    npusim.outputs.atomic_write = halfway
elif HOOK == "run":  # ... while the step is simulated
    npusim.runtime.decoder.run_decoder = lambda *a, **k: fire()
elif HOOK == "ended":  # ... as the command has ended (its outputs written and named), before main() returns
    real_on_sigterm = npusim.outputs.on_sigterm
    @contextlib.contextmanager
    def then_fire():
        with real_on_sigterm():
            yield
            os.kill(os.getpid(), SIG); time.sleep(1)
    npusim.outputs.on_sigterm = then_fire
elif HOOK == "returned":  # ... once main() has returned (its objects being freed)
    import npusim.collector
    real_fewer = npusim.collector.fewer_collections
    @contextlib.contextmanager
    def then_fire():
        with real_fewer():
            yield
            os.kill(os.getpid(), SIG); time.sleep(1)
    npusim.collector.fewer_collections = then_fire
elif HOOK == "exiting":  # ... while the interpreter exits
    import atexit
    atexit.register(lambda: (os.kill(os.getpid(), SIG), time.sleep(1)))
if HOOK in ("ended", "returned", "exiting"):  # the program, as `python -m npusim` runs it
    from npusim.__main__ import program
    sys.argv[1:] = sys.argv[3:]
    sys.exit(program())
elif HOOK.startswith("points"):  # a sweep of fake points: point N (0-based) fires, the others take 0.2 s
    fire_at = int(HOOK[len("points"):] or -1)
    def point(spec, params):
        if params["batch"] == fire_at:  # from a worker, or from the sweep's own process (one job)
            os.kill(PARENT, SIG); time.sleep(30)
        time.sleep(0.2)
        if "pids" in os.environ:
            with open(os.environ["pids"], "a") as f: f.write(f"{os.getpid()}\\n")
        return {**params, **dict.fromkeys(npusim.sweep.METRICS, 1.0), "status": "ok"}
    PARENT = os.getpid()
    npusim.sweep.run_point = point
sys.exit(main(sys.argv[3:]))
"""


def driven(hook: str, sig: str, argv, cwd: Path, timeout: float = 60, env: dict | None = None):
    """Run `npusim argv` under DRIVER; (exit status, stderr, seconds)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", DRIVER, hook, sig, *map(str, argv)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return proc.returncode, proc.stderr, time.monotonic() - start


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its new parent, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.fixture
def hw_copy(tmp_path) -> Path:
    p = tmp_path / "hw.yaml"
    shutil.copy(ROOT / "hwconfigs" / "ascend910b2.yaml", p)
    return p


# ---- outputs: an output on an input or on another output is refused before anything runs


def _inputs(tmp_path: Path) -> dict[str, Path]:
    files = {"hw": tmp_path / "hw.yaml", "workload": tmp_path / "tiny.yaml", "rules": tmp_path / "rules.yaml"}
    shutil.copy(ROOT / "hwconfigs" / "ascend910b2.yaml", files["hw"])
    shutil.copy(ROOT / "workloads" / "k3-tiny.yaml", files["workload"])
    shutil.copy(ROOT / "npusim" / "passes" / "fusion_rules.yaml", files["rules"])
    return files


COLLISIONS = [  # (argv with {hw} {workload} {rules} {d}, words of the message)
    (["run", "--hw", "{hw}", "--json", "{hw}"], ["--json", "--hw"]),
    (["run", "--hw", "{hw}", "--trace", "{hw}"], ["--trace", "--hw"]),
    (["run", "--workload", "{workload}", "--json", "{workload}"], ["--json", "--workload"]),
    (["run", "--workload", "{workload}", "--trace", "{d}/../{d_name}/tiny.yaml"], ["--trace", "--workload"]),
    (["run", "--fusion-rules", "{rules}", "--json", "{rules}"], ["--json", "--fusion-rules"]),
    (["run", "--json", "{d}/x.json", "--trace", "{d}/x.json"], ["--trace", "--json"]),
    (["run", "--json", "{d}/x.json", "--trace", "{d}/./x.json"], ["--trace", "--json"]),
    (["run", "--json", "{d}/x.json", "--plot", "{d}/x.json"], ["--plot", "--json"]),
    (["run", "--json", "{d}/x.json", "--profile", "{d}/x.json"], ["--profile", "--json"]),
    (["run", "--json", "{d}/p/op_summary.csv", "--profile", "{d}/p"], ["op_summary.csv", "--json"]),
    (["run", "--trace", "{d}/p/op_statistic.csv", "--profile", "{d}/p"], ["op_statistic.csv", "--trace"]),
    (["run", "--json", "{d}/p/roofline.png", "--plot", "{d}/p"], ["--plot (roofline.png)", "--json"]),
    (["run", "--trace", "{d}/p/memory.svg", "--plot", "{d}/p"], ["--plot (memory.svg)", "--trace"]),
    (["op", "add", "shape=8,64", "--hw", "{hw}", "--json", "{hw}"], ["--json", "--hw"]),
    (["op", "add", "shape=8,64", "--json", "{d}/o.json", "--trace", "{d}/o.json"], ["--trace", "--json"]),
    (["op", "add", "shape=8,64", "--json", "{d}/o.json", "--plot", "{d}/o.json"], ["--plot"]),
    (["op", "add", "shape=8,64", "--json", "{d}/p/timeline.svg", "--plot", "{d}/p"], ["--plot (timeline.svg)"]),
    (["compare", "--hw", "{hw}", "--json", "{hw}"], ["--json", "--hw"]),
    (["compare", "--trace", "{d}/t.json", "--json", "{d}/t.baseline.json"], ["--trace (baseline)"]),
    (["compare", "--trace", "{d}/t.json", "--json", "{d}/t.optimized.json"], ["--trace (optimized)"]),
    (["op", "all_reduce", "elements=1024", "devices=8", "--json", "{d}/p/all_reduce_test.txt", "--profile", "{d}/p"],
     ["--profile (all_reduce_test.txt)", "--json"]),
    (["compare", "--json", "{d}/p/before_after.png", "--plot", "{d}/p"], ["--plot (before_after.png)"]),
    (["compare", "--plans", "tp1", "tp2", "--json", "{d}/p/plan_scaling.svg", "--plot", "{d}/p"],
     ["--plot (plan_scaling.svg)"]),
    (["sweep", "--hw", "{hw}", "--set", "batch=1,2", "--out", "{hw}"], ["--out", "not a folder"]),
]


@pytest.mark.parametrize(("argv", "words"), COLLISIONS, ids=[" ".join(a[:1] + a[-2:-1]) + f"-{i}"
                                                             for i, (a, _) in enumerate(COLLISIONS)])
def test_an_output_on_an_input_or_another_output_is_refused(argv, words, tmp_path, capsys):
    files = _inputs(tmp_path)
    before = {p: p.read_bytes() for p in files.values()}
    argv = [a.format(hw=files["hw"], workload=files["workload"], rules=files["rules"], d=tmp_path,
                     d_name=tmp_path.name) for a in argv]
    if argv[0] in ("run", "compare"):
        argv += ["--batch", "2", "--context", "64"] + ([] if "--workload" in argv else ["--workload", "k3-tiny"])
    refused(argv, capsys, *words)
    assert {p: p.read_bytes() for p in files.values()} == before  # inputs untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hw.yaml", "rules.yaml", "tiny.yaml"]  # nothing written


def test_a_symlink_to_an_input_is_the_input(tmp_path, capsys, hw_copy):
    link = tmp_path / "link.json"
    link.symlink_to(hw_copy)
    before = hw_copy.read_bytes()
    refused([*RUN, "--hw", hw_copy, "--json", link], capsys, "--json", "--hw")
    assert hw_copy.read_bytes() == before


def test_a_hard_link_to_an_input_is_the_input(tmp_path, capsys, hw_copy):
    link = tmp_path / "hard.json"
    os.link(hw_copy, link)
    refused([*RUN, "--hw", hw_copy, "--trace", link], capsys, "--trace", "--hw")


MOE_TRACE = ["--workload", "k3-tiny-moe", "--workload-set", "routing=trace", "--batch", "64", "--context", "16"]


@pytest.mark.parametrize("argv", [
    ["run", *MOE_TRACE, "--workload-set", "routing_trace={d}/trace.json", "--json", "{d}/trace.json"],
    ["run", "--workload", "{d}/moe.yaml", "--batch", "64", "--context", "16", "--trace", "{d}/trace.json"],
    ["compare", *MOE_TRACE, "--workload-set", "routing_trace={d}/trace.json", "--json", "{d}/trace.json"],
    ["serve", *MOE_TRACE[:4], "--workload-set", "routing_trace={d}/trace.json", "--requests", "3", "--rate", "5",
     "--csv", "{d}/trace.json"],
])
def test_an_output_on_the_workload_s_routing_trace_is_refused(argv, tmp_path, capsys, monkeypatch):
    """The routing trace a run reads was replaced by its --json report (or trace, or CSV):
    the next run read a report as its routing, and failed."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([[[t % 8, (t + 1) % 8] for t in range(64)]]))
    moe = (ROOT / "workloads" / "k3-tiny-moe.yaml").read_text()
    (tmp_path / "moe.yaml").write_text(moe + "routing: trace\nrouting_trace: trace.json\n")
    before = trace.read_bytes()
    _no_simulation(monkeypatch)
    refused([a.format(d=tmp_path) for a in argv] + ["--no-cache"], capsys,
            f"{tmp_path}/trace.json: the same file as the input of --workload's routing_trace (give another path)")
    assert trace.read_bytes() == before


def test_check_paths_ignores_outputs_not_asked_for(tmp_path):
    check_paths({"--json": None, "--trace": tmp_path / "t.json"}, {"--hw": None}, {"--plot": None})


# ---- outputs: an unwritable path names the path and the reason


UNWRITABLE = [  # (flag, path under tmp_path or absolute, reason)
    ("--json", "/dev/full", "No space left on device"),
    ("--trace", "/dev/full", "No space left on device"),
    ("--json", "{d}/a_file/x.json", "Not a directory"),
    ("--trace", "{d}/a_file/t.json", "Not a directory"),
    ("--profile", "{d}/a_file/prof", "Not a directory"),
    ("--plot", "{d}/a_file/plots", "Not a directory"),
    ("--json", "{d}/a_dir", "is a directory"),
    ("--trace", "{d}/a_dir", "is a directory"),
    ("--json", "/proc/npusim-nowhere.json", "No such file or directory"),
]


@pytest.mark.parametrize(("flag", "path", "reason"), UNWRITABLE)
def test_an_unwritable_output_names_the_path_and_the_reason(flag, path, reason, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_dir").mkdir()
    path = path.format(d=tmp_path)
    err = refused([*RUN, flag, path], capsys, reason)
    assert path.split("/a_file")[0] in err and "None" not in err
    no_partial(tmp_path)
    assert (tmp_path / "a_file").read_text() == "x"


@pytest.mark.parametrize(("argv", "reason"), [
    ([*OP, "--json", "-"], "--json -: expected a file path ('-' is not read as the terminal: give /dev/stdout)"),
    ([*RUN, "--plot", "-"], "--plot -: expected a folder path"),
    (["sweep", "--workload", "k3-tiny", "--set", "chip.aic_count=4,8", "--out", "-"], "--out -: expected a folder"),
])
def test_a_dash_is_not_taken_for_a_file_named_dash(argv, reason, tmp_path, capsys, monkeypatch):
    """'-' would have become a file (or folder) named '-' in the working folder."""
    monkeypatch.chdir(tmp_path)
    refused(argv, capsys, reason)
    assert not (tmp_path / "-").exists()


def test_a_full_disk_on_op_json(capsys):
    refused([*OP, "--json", "/dev/full"], capsys, "--json /dev/full: cannot be written: No space left on device")


def test_a_full_disk_on_a_sweep_csv(capsys, tmp_path, monkeypatch):
    import npusim.sweep

    monkeypatch.setattr(npusim.sweep, "run_point", _fake_point)
    os.symlink("/dev/full", tmp_path / "sweep.csv")  # the CSV lands on a full device
    code, _, err = cli(["sweep", "--set", "batch=1,2", "--jobs", "1", "--out", tmp_path, "--overwrite"], capsys)
    assert code == 2 and "No space left on device" in err and "sweep.csv" in err
    clean_error(err)


def test_a_device_is_written_in_place_not_replaced(capsys):
    code, out, err = cli([*OP, "--json", "/dev/null"], capsys)
    assert code == 0 and "wrote /dev/null" in out, err
    with pytest.raises(OutputError, match="cannot write /dev/full: No space left on device"):
        write_text("/dev/full", "x")  # had the check let it by
    assert Path("/dev/null").is_char_device() and Path("/dev/full").is_char_device()


def _immutable(path: Path) -> bool:
    """chattr +i `path` (root, on a file system that has the flag); False if it cannot be."""
    try:
        return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    except OSError:
        return False


def test_an_output_that_takes_no_bytes_is_refused_before_the_run(tmp_path):
    """A socket (no device behind it to open), a disk, a file made read-only or immutable:
    the run, then the write failed (or, on a disk, overwrote it)."""
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(OutputError, match=f"^--json {tmp_path}/sock: cannot be written: No such device"):
            check_writable({"--json": tmp_path / "sock"})
    disks = [p for p in Path("/dev").iterdir() if p.is_block_device()]
    if disks:
        with pytest.raises(OutputError, match=f"^--trace {disks[0]}: is a block device"):
            check_writable({"--trace": disks[0]})
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    if _immutable(kept):
        try:
            with pytest.raises(OutputError, match=f"^--json {kept}: cannot be written: the file is read-only"):
                check_writable({"--json": kept})
        finally:
            subprocess.run(["chattr", "-i", str(kept)])
    if os.geteuid() != 0:  # root may write a file whatever its mode
        kept.chmod(0o444)
        with pytest.raises(OutputError, match="the file is read-only"):
            check_writable({"--json": kept})
        kept.chmod(0o644)
    check_writable({"--json": kept, "--trace": "/dev/null", "--csv": tmp_path / "new" / "c.csv"})


@pytest.mark.parametrize("argv", [[*RUN, "--json", "{d}/gone/a.json"], [*RUN, "--plot", "{d}/gone"],
                                  [*OP, "--trace", "{d}/gone"],
                                  ["sweep", *RUN[1:], "--set", "chip.aic_count=16,20", "--out", "{d}/gone"]])
def test_an_output_through_a_link_to_nothing_is_refused_before_the_run(argv, tmp_path, capsys, monkeypatch):
    """A link to a folder not there (an unmounted disk): the run, then 'Not a directory
    (. is a file)', a reason that was not so (a link itself as the file was replaced)."""
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    _no_simulation(monkeypatch)
    refused([a.format(d=tmp_path) for a in argv] + ["--no-cache"], capsys,
            f"cannot be written: {tmp_path}/gone is a link to {tmp_path}/nowhere, which does not exist")
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "gone").is_symlink()


def test_an_output_on_a_link_replaces_the_file_it_points_to(tmp_path, capsys):
    """op --json link.json, the link to results/op.json: the link was replaced by the
    report and results/op.json kept the earlier run's, without a word."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "op.json").write_text("{}\n")
    (tmp_path / "link.json").symlink_to("results/op.json")
    (tmp_path / "plots").symlink_to("results")
    code, out, _ = cli([*OP, "--json", tmp_path / "link.json", "--trace", tmp_path / "plots" / "t.json"], capsys)
    assert code == 0 and f"wrote {tmp_path}/link.json, {tmp_path}/plots/t.json" in out
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "plots").is_symlink()
    assert json.loads((tmp_path / "results" / "op.json").read_text())["latency_us"] > 0
    assert json.loads((tmp_path / "results" / "t.json").read_text())
    no_partial(tmp_path)


# ---- outputs: checked before anything runs, on a cache hit too; written all or none (issue 35)


def _no_simulation(monkeypatch) -> None:
    """Any step, op, comparison or sweep point simulated fails the test."""
    import importlib

    def simulated(*a, **k):
        pytest.fail("simulated before its outputs were checked")

    targets = ("npusim.runtime.decoder.run_decoder", "npusim.runtime.decoder.compare",
               "npusim.parallel.compare.compare_plans", "npusim.parallel.pipeline.run_pipeline",
               "npusim.ops.simulate_op", "npusim.ops.collectives.command.run_collective_op", "npusim.sweep.run_point")
    for target in targets:  # imported first: a module importing another's function keeps the real one
        importlib.import_module(target.rsplit(".", 1)[0])
    for target in targets:
        monkeypatch.setattr(target, simulated)


PROC = "cannot be written: no new file can be made in /proc"
FULL = "cannot be written: No space left on device"
BEFORE_RUNNING = [  # (argv, the message's start after "npusim: error: ")
    ([*RUN, "--json", "/proc/x/y.json"], f"--json /proc/x/y.json: {PROC}"),
    ([*RUN, "--trace", "{d}/a_file/t.json"], "--trace {d}/a_file/t.json: cannot be written: Not a directory"),
    ([*RUN, "--profile", "/proc/x/p"], f"--profile (op_summary.csv) /proc/x/p/op_summary.csv: {PROC}"),
    ([*RUN, "--plot", "/proc/x/p"], f"--plot /proc/x/p: {PROC}"),
    # a folder in a plot's place: the run, then the error without the flag
    ([*RUN, "--plot", "{d}/plots"], "--plot (timeline.svg) {d}/plots/timeline.svg: is a directory"),
    ([*RUN, "--pp", "2", "--json", "/proc/x/y.json"], f"--json /proc/x/y.json: {PROC}"),
    ([*OP, "--json", "/proc/x/y.json"], f"--json /proc/x/y.json: {PROC}"),
    ([*OP, "--plot", "{d}/a_file/p"], "--plot {d}/a_file/p: cannot be written: Not a directory"),
    (["op", "all_reduce", "elements=1024", "devices=8", "--profile", "/proc/x/p"],
     f"--profile (all_reduce_test.txt) /proc/x/p/all_reduce_test.txt: {PROC}"),
    (["op", "send_recv", "bytes=1024", "devices=2", "--profile", "{d}/p"],
     "op send_recv --profile: hccl_test has no test for it"),
    (["compare", *RUN[1:], "--trace", "/proc/x/t.json"], "--trace /proc/x/t.json: " + PROC),
    (["compare", *RUN[1:], "--plans", "tp1", "tp2", "--json", "/proc/x/c.json"], f"--json /proc/x/c.json: {PROC}"),
    (["sweep", *RUN[1:], "--set", "chip.aic_count=16,20", "--out", "/proc/x/s"],
     f"--out (sweep.csv) /proc/x/s/sweep.csv: {PROC}"),
    # a device that takes no byte: the run, then 'cannot write /dev/full' (issue: --json /dev/full)
    ([*RUN, "--json", "/dev/full"], f"--json /dev/full: {FULL}"),
    ([*RUN, "--trace", "/dev/full"], f"--trace /dev/full: {FULL}"),
    ([*OP, "--json", "/dev/full"], f"--json /dev/full: {FULL}"),
    (["compare", *RUN[1:], "--json", "/dev/full"], f"--json /dev/full: {FULL}"),
    (["sweep", *RUN[1:], "--set", "chip.aic_count=16,20", "--out", "{d}/full", "--overwrite"],
     f"--out (sweep.csv) {{d}}/full/sweep.csv: {FULL}"),
]


@pytest.mark.parametrize("cache", ["--no-cache", "cache"])
@pytest.mark.parametrize(("argv", "message"), BEFORE_RUNNING, ids=[f"{a[0]}-{i}" for i, (a, _) in
                                                                   enumerate(BEFORE_RUNNING)])
def test_an_unwritable_output_is_refused_before_anything_runs(argv, message, cache, tmp_path, capsys, monkeypatch):
    """`npusim run --json /proc/x/y.json` (and every other command's outputs): one line
    naming the flag, before anything is simulated, whether the cache is on or off."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "plots" / "timeline.svg").mkdir(parents=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "sweep.csv").symlink_to("/dev/full")
    _no_simulation(monkeypatch)
    argv = [a.format(d=tmp_path) for a in argv]
    argv += ["--no-cache"] if cache == "--no-cache" else ["--cache-dir", tmp_path / "cache"]
    err = refused(argv, capsys)
    assert err.startswith(f"npusim: error: {message.format(d=tmp_path)}"), err


@pytest.mark.parametrize("cache", ["--no-cache", "cache"])
def test_a_pipelined_run_says_what_it_wrote(cache, tmp_path, capsys):
    """`run --pp 2 --json PATH` wrote PATH without a word (every other command names its
    outputs), and its JSON without the final newline the others have."""
    argv = [*RUN, "--pp", "2", "--json", tmp_path / "r.json"]
    argv += ["--no-cache"] if cache == "--no-cache" else ["--cache-dir", tmp_path / "cache"]
    for _ in range(2):  # the second: served from the cache, if on
        code, out, err = cli(argv, capsys)
        assert code == 0 and out.splitlines()[-1] == f"wrote {tmp_path / 'r.json'}", out + err
        text = (tmp_path / "r.json").read_text()
        assert text.endswith("}\n") and json.loads(text)["pp"] == 2


def test_a_pipelined_run_s_json_has_its_provenance(tmp_path, capsys):
    """`run --pp 2 --json PATH` had no "provenance" (the command, the config in effect,
    the workload), which --help promises and every other report's JSON has."""
    argv = [*RUN, "--pp", "2", "--set", "hbm.peak_bw_bytes_per_s=1e12", "--json", tmp_path / "r.json"]
    code, out, err = cli(argv, capsys)
    assert code == 0, out + err
    meta = json.loads((tmp_path / "r.json").read_text())["provenance"]
    assert meta["command"] == ["npusim", *map(str, argv)] and meta["hw"] == "ascend910b2"
    assert meta["overrides"] == {"hbm.peak_bw_bytes_per_s": "1e12"}
    assert meta["hw_config"]["hbm"]["peak_bw_bytes_per_s"] == 1e12
    assert meta["workload"]["path"].endswith("k3-tiny.yaml")


def test_a_cache_hit_checks_its_outputs_as_a_run_does(tmp_path, capsys):
    """A replayed run (served from the cache) refuses an output the run would refuse,
    before writing anything: the same one line."""
    cache = ["--cache-dir", tmp_path / "cache"]
    code, _, err = cli([*RUN, *cache, "--json", tmp_path / "r.json"], capsys)
    assert code == 0, err
    refused([*RUN, *cache, "--json", "/proc/x/y.json"], capsys,
            "--json /proc/x/y.json: cannot be written: no new file can be made in /proc")
    refused([*RUN, *cache, "--json", tmp_path / "a" / "r.json", "--trace", tmp_path / "a" / "r.json"], capsys,
            "--trace", "the same file as the output of --json")
    assert not (tmp_path / "a").exists()


def _interrupt_after(monkeypatch, target: str) -> None:
    """`target` (module.function) does its work, then Ctrl-C comes."""
    module, name = target.rsplit(".", 1)
    real = getattr(__import__(module, fromlist=[name]), name)

    def then_interrupted(*a, **k):
        real(*a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(target, then_interrupted)


BETWEEN_OUTPUTS = [  # (argv, the function after which Ctrl-C comes: the last output written)
    ([*RUN, "--json", "{d}/r.json", "--trace", "{d}/t/t.json", "--profile", "{d}/p"],
     "npusim.report.tables.write_tables"),
    ([*OP, "--json", "{d}/r.json", "--trace", "{d}/t.json", "--profile", "{d}/p"],
     "npusim.report.tables.write_tables"),
    (["compare", *RUN[1:], "--json", "{d}/c.json", "--trace", "{d}/t/t.json"], "npusim.report.trace.write_trace"),
    (["op", "all_reduce", "elements=1024", "devices=8", "--json", "{d}/r.json", "--profile", "{d}/p"],
     "npusim.ops.collectives.command.hccl_test_output"),
]


@pytest.mark.parametrize(("argv", "last"), BETWEEN_OUTPUTS, ids=[a[0] + ("-hccl" if "all_reduce" in a else "")
                                                                 for a, _ in BETWEEN_OUTPUTS])
def test_ctrl_c_between_two_outputs_leaves_none(argv, last, tmp_path, capsys, monkeypatch):
    """Ctrl-C once every output but the last is written: none of them is left (no file,
    no temporary, no folder made for them), and the message says so."""
    _interrupt_after(monkeypatch, last)
    code, _, err = cli([*(a.format(d=tmp_path) for a in argv), "--no-cache"], capsys)
    assert code == 130 and err.strip() == "npusim: interrupted (no partial output left)", err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_the_outputs_are_put_in_place_names_them(tmp_path, capsys, monkeypatch):
    """Ctrl-C while finished outputs replace their targets waits for the last; the
    message names every one."""
    calls = interrupt_at_the_first_replace(monkeypatch)
    outs = [tmp_path / "r.json", tmp_path / "t.json"]
    code, out, err = cli([*RUN, "--no-cache", "--json", outs[0], "--trace", outs[1], "--profile", tmp_path / "p"],
                         capsys)
    assert code == 130 and "npusim: interrupted (after writing every output: " in err, err
    assert all(str(p) in err for p in outs) and "op_summary.csv" in err
    assert all(p.exists() for p in outs) and len(calls) == 5
    assert "tables: " not in out  # printed once the block ends: here, the interruption's line says it
    no_partial(tmp_path)


# ---- outputs: whole or absent


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "r.json"
    target.write_text('{"old": 1}')
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with atomic_write(target) as f:
                f.write('{"new": ')
                raise exc
        assert target.read_text() == '{"old": 1}'
        assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_an_os_error_while_writing_is_an_output_error_naming_the_path(tmp_path):
    with pytest.raises(OutputError, match=r"cannot write .*r\.json: No space left"):
        with atomic_write(tmp_path / "r.json") as f:
            f.write("x")
            raise OSError(28, "No space left on device")  # what a write on a full disk raises: no file name
    assert list(tmp_path.iterdir()) == []


def test_a_written_file_has_ordinary_permissions(tmp_path):
    with atomic_write(tmp_path / "r.json") as f:
        f.write("{}")
    assert (tmp_path / "r.json").stat().st_mode & 0o644 == 0o644


# ---- outputs: a closed stdout never stops the files asked for


@pytest.mark.parametrize("argv", [
    [*RUN, "--json", "{d}/r.json", "--trace", "{d}/t.json"],
    [*OP, "--json", "{d}/r.json", "--profile", "{d}/prof"],
    [*RUN, "--profile", "{d}/prof"],
], ids=["run", "op", "run-profile"])
def test_a_closed_stdout_still_writes_the_files(argv, tmp_path):
    argv = [a.format(d=tmp_path) for a in argv]
    proc = subprocess.Popen([sys.executable, "-m", "npusim", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # `| head -0`: the reader is gone before the first line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err
    for a in argv:
        if str(tmp_path) in a:
            assert Path(a).exists(), a
    no_partial(tmp_path)


@pytest.mark.parametrize("to", ["pipe", "file"])
def test_json_to_dev_stdout_follows_the_summary(to, tmp_path):
    """The advice for '--json -' is '--json /dev/stdout'. Into a pipe (`| jq`) it failed after
    the run ('cannot write /dev/stdout: No such file or directory': realpath made the pipe's
    'pipe:[N]' a path); into a file (`> out.txt`) the report replaced the file, the summary
    printed before it lost, or (a cache hit) was read back as JSON: a JSONDecodeError."""
    argv = [sys.executable, "-m", "npusim", *OP, "--json", "/dev/stdout", "--cache-dir", str(tmp_path / "cache")]
    for _ in range(2):  # the second: a cache hit
        if to == "pipe":
            proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
            out = proc.stdout
        else:
            with open(tmp_path / "out.txt", "w") as f:
                proc = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.PIPE, text=True, timeout=120)
            out = (tmp_path / "out.txt").read_text()
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        summary, report = out.split("\n{\n", 1)
        assert summary.startswith("add on ascend910b2:")
        report, last = ("{\n" + report).rsplit("\n", 2)[:2]
        assert json.loads(report)["latency_us"] > 0 and last == "wrote /dev/stdout"


def test_a_descriptor_that_takes_no_bytes_is_refused_before_the_run(tmp_path):
    (tmp_path / "in.json").write_text("{}")
    with open(tmp_path / "in.json") as f:
        with pytest.raises(OutputError, match=f"^--json /dev/fd/{f.fileno()}: cannot be written: descriptor "
                                              f"{f.fileno()} is open for reading only"):
            check_writable({"--json": f"/dev/fd/{f.fileno()}"})
    with open("/dev/full", "w") as f:
        with pytest.raises(OutputError, match="No space left on device"):
            check_writable({"--json": f"/proc/self/fd/{f.fileno()}"})
    assert (tmp_path / "in.json").read_text() == "{}"


def test_a_closed_stdout_in_a_sweep_still_writes_the_csv(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "npusim", "sweep", "--workload", "k3-tiny", "--jobs", "1",
                             "--set", f"hbm.hbm_bytes={TOO_SMALL},{2 * TOO_SMALL}", "--out", tmp_path / "s"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and "Traceback" not in err, err  # every point failed: status 1
    assert len(list(csv.reader((tmp_path / "s" / "sweep.csv").open()))) == 3


# ---- signals: 130 / 143, one line, no partial files


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
@pytest.mark.parametrize("what", ["json", "trace"])
def test_a_signal_mid_write_leaves_no_partial_file(sig, status, what, tmp_path):
    target = tmp_path / f"{what}.json"
    code, err, _ = driven("write", sig, [*RUN, f"--{what}", target], ROOT)
    assert code == status, err
    clean_error(err)
    assert ("interrupted" if status == 130 else "terminated") in err
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_a_signal_mid_write_keeps_the_earlier_result(tmp_path):
    target = tmp_path / "r.json"
    target.write_text('{"earlier": true}')
    code, err, _ = driven("write", "SIGTERM", [*RUN, "--json", target], ROOT)
    assert code == 143 and json.loads(target.read_text()) == {"earlier": True}
    clean_error(err)
    no_partial(tmp_path)


def test_a_signal_mid_write_of_op_json(tmp_path):
    code, err, _ = driven("write", "SIGINT", [*OP, "--json", tmp_path / "o.json"], ROOT)
    assert code == 130 and list(tmp_path.iterdir()) == []
    clean_error(err)


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_simulating_writes_nothing(sig, status, tmp_path):
    code, err, _ = driven("run", sig, [*RUN, "--json", tmp_path / "r.json", "--profile", tmp_path / "p"], ROOT)
    assert code == status
    clean_error(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("hook", "sig"), [("ended", "SIGINT"), ("ended", "SIGTERM"), ("returned", "SIGINT"),
                                           ("exiting", "SIGINT"), ("exiting", "SIGTERM")])
def test_a_signal_once_the_command_has_ended_changes_nothing(hook, sig, tmp_path):
    """Ctrl-C or SIGTERM once the outputs are written and named, as main() ends or returns
    or the interpreter exits: was a traceback after "wrote ..." (exit status -2), "Exception
    ignored ... KeyboardInterrupt", or the process killed by the signal. (SIGTERM once main()
    has returned still ends the process: main() has put its default action back.)"""
    code, err, _ = driven(hook, sig, [*OP, "--no-cache", "--json", tmp_path / "o.json"], ROOT)
    assert code == 0 and err == "", err
    assert json.loads((tmp_path / "o.json").read_text())["op_type"] == "add"
    no_partial(tmp_path)


# ---- sweeps


def _fake_point(spec, params):
    """A point that takes no time: its batch as its latency."""
    from npusim.sweep import METRICS

    return {**params, **dict.fromkeys(METRICS, float(params.get("batch", 1))), "status": "ok"}


def _killed_point(spec, params):
    """Points 2 and 4 kill their own worker (kill -9), the others are fine."""
    if params["batch"] in (2, 4):
        os.kill(os.getpid(), signal.SIGKILL)
    return _fake_point(spec, params)


def _raising_point(spec, params):
    """Point 3 fails with an error that is not npusim's (run_point's own guard bypassed)."""
    if params["batch"] == 3:
        raise RuntimeError("boom\nsecond line")
    return _fake_point(spec, params)


def test_a_killed_worker_costs_only_its_own_point(monkeypatch):
    import npusim.sweep

    monkeypatch.setattr(npusim.sweep, "run_point", _killed_point)
    rows = npusim.sweep.sweep("k3-tiny", {"batch": [1, 2, 3, 4, 5, 6]}, jobs=2)
    assert [r["batch"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["status"] for r in rows] == ["ok", "worker lost (killed by SIGKILL)", "ok",
                                           "worker lost (killed by SIGKILL)", "ok", "ok"]
    assert [r["latency_us"] for r in rows] == [1.0, None, 3.0, None, 5.0, 6.0]


def test_an_error_in_a_worker_costs_its_point_in_one_line(monkeypatch):
    import npusim.sweep

    monkeypatch.setattr(npusim.sweep, "run_point", _raising_point)
    rows = npusim.sweep.sweep("k3-tiny", {"batch": [1, 2, 3, 4]}, jobs=2)
    assert [r["status"] for r in rows] == ["ok", "ok", "RuntimeError: boom", "ok"]


def test_a_sweep_where_every_point_fails_exits_non_zero(tmp_path, capsys):
    code, out, err = cli(["sweep", "--workload", "k3-tiny", "--jobs", "1", "--out", tmp_path / "s",
                          "--set", f"hbm.hbm_bytes={TOO_SMALL},{2 * TOO_SMALL}"], capsys)
    assert code == 1 and "2 points (0 ok, 2 failed)" in out and err == ""
    lines = list(csv.DictReader((tmp_path / "s" / "sweep.csv").open()))
    assert [r["status"].split(":")[0] for r in lines] == ["OutOfMemoryError"] * 2


def test_a_sweep_with_a_lost_worker_exits_non_zero(tmp_path, capsys, monkeypatch):
    import npusim.sweep

    monkeypatch.setattr(npusim.sweep, "run_point", _killed_point)
    code, out, _ = cli(["sweep", "--set", "batch=1,2,3", "--jobs", "2", "--out", tmp_path], capsys)
    assert code == 1 and "3 points (2 ok, 1 failed)" in out and "worker lost" in out


def test_a_sweep_where_every_point_is_fine_exits_zero(tmp_path, capsys, monkeypatch):
    import npusim.sweep

    monkeypatch.setattr(npusim.sweep, "run_point", _fake_point)
    code, out, _ = cli(["sweep", "--set", "batch=1,2,3", "--jobs", "2", "--out", tmp_path], capsys)
    assert code == 0 and "3 points (3 ok, 0 failed)" in out


def test_a_non_empty_out_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "sweep.csv").write_text("a,b\n1,2\n")
    (tmp_path / "notes.txt").write_text("mine")
    refused(["sweep", "--set", "batch=1,2", "--out", tmp_path], capsys, "--out", "not empty", "--overwrite")
    assert (tmp_path / "sweep.csv").read_text() == "a,b\n1,2\n" and (tmp_path / "notes.txt").read_text() == "mine"


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    refused(["sweep", "--set", "batch=1,2", "--out", tmp_path / "f", "--overwrite"], capsys, "not a folder")
    assert (tmp_path / "f").read_text() == "x"


def test_overwrite_replaces_the_sweep_files_only(tmp_path, capsys, monkeypatch):
    import npusim.sweep

    monkeypatch.setattr(npusim.sweep, "run_point", _fake_point)
    (tmp_path / "sweep.csv").write_text("old\n")
    (tmp_path / "notes.txt").write_text("mine")
    code, _, _ = cli(["sweep", "--set", "batch=1,2", "--jobs", "1", "--out", tmp_path, "--overwrite"], capsys)
    assert code == 0 and (tmp_path / "notes.txt").read_text() == "mine"
    assert [r["batch"] for r in csv.DictReader((tmp_path / "sweep.csv").open())] == ["1", "2"]
    no_partial(tmp_path)


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupted_sweep_keeps_every_finished_row(sig, status, tmp_path):
    """Point batch=4 signals the parent (points 1 and 2, at least, are done by then)."""
    out = tmp_path / "s"
    code, err, _ = driven("points4", sig, ["sweep", "--set", "batch=1,2,3,4,5,6", "--jobs", "2", "--out", out],
                          ROOT)
    assert code == status, err
    clean_error(err)
    assert "of 6 points written to" in err
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert 2 <= len(rows) < 6 and all(r["status"] == "ok" for r in rows)
    assert [int(r["batch"]) for r in rows] == sorted(int(r["batch"]) for r in rows)
    no_partial(out)


def test_an_interrupted_overwrite_leaves_no_stale_plots(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    for name in ("sweep.csv", "sweep.png", "sweep.svg"):
        (out / name).write_text("from an earlier sweep")
    code, err, _ = driven("points3", "SIGINT", ["sweep", "--set", "batch=1,2,3,4", "--jobs", "2", "--out", out,
                                                "--overwrite"], ROOT)
    assert code == 130, err
    assert sorted(p.name for p in out.iterdir()) == ["sweep.csv", "sweep.settings.json"]  # the rows, what --resume needs
    assert "earlier" not in (out / "sweep.csv").read_text()


def test_an_interrupt_before_any_point_keeps_an_earlier_result(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    for name in ("sweep.csv", "sweep.png"):
        (out / name).write_text("from an earlier sweep")
    code, err, _ = driven("points1", "SIGTERM", ["sweep", "--set", "batch=1", "--out", out, "--overwrite"], ROOT)
    assert code == 143 and "before any of 1 points finished: nothing written" in err
    clean_error(err)
    assert all((out / n).read_text() == "from an earlier sweep" for n in ("sweep.csv", "sweep.png"))


def test_ctrl_c_while_plotting_keeps_every_row_and_no_half_plot(tmp_path, capsys, monkeypatch):
    """Ctrl-C once sweep.png is written, before sweep.svg: the CSV keeps every point
    (resume semantics), the plot is both files or neither, the message says which;
    --resume then makes the plot without running a point again."""
    import npusim.sweep
    from npusim.outputs import write_text

    def plot_then_interrupted(rows, out_dir, *a, **k):
        write_text(Path(out_dir) / "sweep.png", "png")
        raise KeyboardInterrupt

    monkeypatch.setattr(npusim.sweep, "run_point", _fake_point)
    monkeypatch.setattr(npusim.sweep, "plot", plot_then_interrupted)
    argv = ["sweep", "--set", "batch=1,2", "--jobs", "1", "--out", tmp_path / "s"]
    code, _, err = cli(argv, capsys)
    csv_path = tmp_path / "s" / "sweep.csv"
    assert code == 130 and err.strip() == f"npusim: interrupted: 2 of 2 points written to {csv_path}, no plot " \
                                          "(--resume makes it)", err
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["sweep.csv", "sweep.settings.json"]
    assert [r["batch"] for r in csv.DictReader((tmp_path / "s" / "sweep.csv").open())] == ["1", "2"]
    monkeypatch.undo()
    monkeypatch.setattr(npusim.sweep, "run_point", lambda *a: pytest.fail("a finished point ran again"))
    code, out, _ = cli([*argv, "--resume"], capsys)
    assert code == 0 and "sweep.svg" in out and (tmp_path / "s" / "sweep.png").stat().st_size > 1000


def test_ctrl_c_does_not_wait_for_running_points(tmp_path):
    """The point batch=1 signals the parent and then runs 30 s: the sweep must not wait for it."""
    code, err, seconds = driven("points1", "SIGINT", ["sweep", "--set", "batch=1,2", "--jobs", "2",
                                                      "--out", tmp_path / "s"], ROOT)
    assert code == 130 and seconds < 20, (code, seconds, err)  # generous: a loaded CI; typically < 0.5 s after the signal


def _sweep_with_pids(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A sweep of slow fake points (30 s each) whose workers write their pid once started."""
    pids = tmp_path / "pids"
    code = DRIVER.replace("time.sleep(0.2)", "open(os.environ['pids'], 'a').write(f'{os.getpid()}\\n'); "
                                             "time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code, "points", "SIGINT", "sweep", "--set", "batch=1,2,3",
                             "--jobs", "2", "--out", str(tmp_path / "s")], cwd=ROOT, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "pids": str(pids)})
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline and proc.poll() is None, "the workers never started"
        time.sleep(0.05)
    return proc, pids


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGKILL, -9)])
def test_workers_die_with_their_parent(sig, status, tmp_path):
    proc, pids = _sweep_with_pids(tmp_path)
    workers = [int(p) for p in pids.read_text().split()]
    assert all(alive(w) for w in workers)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == status
    deadline = time.monotonic() + 5
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(w) for w in workers), "a worker outlived its parent"
    if sig == signal.SIGTERM:
        clean_error(proc.stderr.read())


@pytest.mark.parametrize("cmd, name", [("run", "memory.svg"), ("op", "roofline.png"), ("compare", "before_after.png")])
def test_a_plot_file_that_is_a_folder_is_refused_before_the_run(cmd, name, tmp_path, capsys):
    """run --plot DIR with DIR/memory.svg a folder simulated, printed the summary, then
    failed ("DIR/memory.svg: is a directory"); now refused before anything runs."""
    (tmp_path / "plots" / name).mkdir(parents=True)
    argv = {"run": RUN, "op": OP, "compare": ["compare", *RUN[1:]]}[cmd] + ["--plot", tmp_path / "plots"]
    code, out, err = cli(argv, capsys)
    assert code == 2 and out == "", out
    assert err == (f"npusim: error: --plot ({name}) {tmp_path / 'plots' / name}: is a directory "
                   "(expected a file path)\n")
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [name]


LONG = "x" * 300


@pytest.mark.parametrize(("argv", "reason"), [
    ([*RUN, "--json", f"{{d}}/{LONG}.json"], "the name xxxxxxxxxxxxxxxxxxxx... is 305 bytes (at most 241 here)"),
    # a name its temporary (".NAME.XXXXXXXX.tmp") would take past 255 bytes
    ([*OP, "--trace", "{d}/" + "t" * 245], "the name tttttttttttttttttttt... is 245 bytes (at most 241 here)"),
    ([*RUN, "--plot", f"{{d}}/plots/{LONG}"], "the name xxxxxxxxxxxxxxxxxxxx... is 300 bytes (at most 255 here)"),
    (["serve", "--workload", "k3-tiny", "--requests", "5", "--rate", "10", "--plot", f"{{d}}/{LONG}/p"],
     "is 300 bytes (at most 255 here)"),
    ([*RUN, "--json", "{d}/" + "/".join(["y" * 200] * 25) + "/a.json"], "the path is"),
])
def test_an_output_name_too_long_is_refused_before_anything_runs(argv, reason, tmp_path, capsys, monkeypatch):
    """A name longer than a folder entry may have: the run was simulated, its folders made,
    and then the write failed (or Path.is_dir()'s bare 'File name too long' came without the flag)."""
    _no_simulation(monkeypatch)
    argv = [a.format(d=tmp_path) for a in argv]
    err = refused(argv, capsys, ": cannot be written: ", reason)
    assert err.startswith(f"npusim: error: {argv[-2]} ")
    assert list(tmp_path.iterdir()) == []


def test_json_outputs_hold_no_number_json_has_not(tmp_path):
    """write_json wrote NaN (a calibration with no field fitted: its held-out errors), which
    JSON has not and strict readers refuse; a float that is not finite is now null."""
    from npusim.outputs import write_json

    path = write_json(tmp_path / "r.json", {"median": float("nan"), "rows": [1.5, float("inf"), (float("-inf"),)],
                                            "n": 3})
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} written")) == {
        "median": None, "rows": [1.5, None, [None]], "n": 3}
