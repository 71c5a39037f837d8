"""The Ray backend: the same CSV as the local pool, lost workers retried, a point's
own error kept in its row and not retried, Ctrl-C keeping the finished rows."""

import csv
import os
import signal

import pytest

ray = pytest.importorskip("ray", reason='the ray extra is not installed (pip install "npusim[ray]"); '
                          ".ci/run installs it")

from npusim.backends.ray import OBJECT_STORE_BYTES, RayBackend  # noqa: E402
from npusim.cli import main  # noqa: E402
from sweep_process import sweep_until  # noqa: E402

TOO_SMALL = 1 << 20  # hbm.hbm_bytes that k3-tiny's weights and cache do not fit in
TWELVE = ["sweep", "--workload", "k3-tiny", "--batch", "2", "--context", "64",
          "--set", "chip.aic_count=16,20,24", "--set", "hbm.peak_bw_bytes_per_s=1.2e12,1.6e12,2.4e12,3.2e12"]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray instance of 2 CPUs for this module (the backend uses it, and leaves it running)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
             log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_twelve_points_on_ray_give_the_local_backends_csv_byte_for_byte(local_ray, tmp_path, capsys):
    assert main([*TWELVE, "--jobs", "2", "--out", str(tmp_path / "local")]) == 0
    assert main([*TWELVE, "--backend", "ray", "--out", str(tmp_path / "ray")]) == 0
    out = capsys.readouterr().out
    assert "12 points (12 ok, 0 failed)" in out
    local, on_ray = (tmp_path / "local" / "sweep.csv").read_bytes(), (tmp_path / "ray" / "sweep.csv").read_bytes()
    assert len(local.splitlines()) == 13 and on_ray == local
    assert (tmp_path / "ray" / "sweep.png").exists()


def test_a_failing_point_keeps_its_error_in_its_row_on_ray(local_ray, tmp_path, capsys):
    argv = ["sweep", "--workload", "k3-tiny", "--batch", "2", "--context", "64",
            "--set", f"hbm.hbm_bytes={TOO_SMALL},{64 << 30}"]
    assert main([*argv, "--jobs", "1", "--out", str(tmp_path / "local")]) == 1
    assert main([*argv, "--backend", "ray", "--out", str(tmp_path / "ray")]) == 1
    rows = list(csv.DictReader((tmp_path / "ray" / "sweep.csv").open()))
    assert rows[0]["status"].startswith("OutOfMemoryError: k3-tiny decode") and rows[1]["status"] == "ok"
    assert (tmp_path / "ray" / "sweep.csv").read_bytes() == (tmp_path / "local" / "sweep.csv").read_bytes()


def test_a_lost_worker_is_retried_and_a_raising_task_is_not(local_ray, tmp_path):
    """Task 0 kills its worker on its first try (Ray runs it again); task 1 raises
    (answered as failed at once, one try); task 2 is fine."""
    tries = tmp_path / "tries"
    tries.mkdir()

    def task(n):
        (tries / f"{n}.{len(list(tries.glob(f'{n}.*')))}").touch()
        if n == 0 and len(list(tries.glob("0.*"))) == 1:
            os._exit(1)  # the worker process dies: a lost worker, not an error of the task
        if n == 1:
            raise ValueError("bad point\nsecond line")
        return n * 10

    done, failed = {}, {}
    RayBackend().run(task, [(0,), (1,), (2,)], done.__setitem__, failed.__setitem__)
    assert done == {0: 0, 2: 20} and failed == {1: "ValueError: bad point"}
    assert sorted(p.name for p in tries.iterdir()) == ["0.0", "0.1", "1.0", "2.0"]


def test_ctrl_c_on_ray_keeps_the_finished_rows_in_grid_order(tmp_path):
    """A real SIGINT to `npusim sweep --backend ray` (which starts its own Ray instance)."""
    out = tmp_path / "out"
    argv = TWELVE[:3] + TWELVE[5:]  # without --batch: the grid gives it
    proc = sweep_until([*argv, "--set", "batch=1,2", "--backend", "ray", "--jobs", "2", "--out", out], 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert "interrupted: " in err.decode() and "Traceback" not in err.decode()
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert 2 <= len(rows) < 24 and all(r["status"] == "ok" for r in rows)
    order = [(int(r["chip.aic_count"]), float(r["hbm.peak_bw_bytes_per_s"]), int(r["batch"])) for r in rows]
    assert order == sorted(order)


def test_npusim_variables_reach_the_workers(local_ray, monkeypatch):
    """NPUSIM_* of this process (a shared cache folder, say) are set in the tasks' environment."""
    monkeypatch.setenv("NPUSIM_CACHE_DIR", "/shared/npusim-cache")
    monkeypatch.setenv("OTHER_VARIABLE", "not passed on")
    done = {}
    RayBackend().run(lambda name: os.environ.get(name), [("NPUSIM_CACHE_DIR",), ("OTHER_VARIABLE",)],
                     done.__setitem__, pytest.fail)
    assert done == {0: "/shared/npusim-cache", 1: None}
