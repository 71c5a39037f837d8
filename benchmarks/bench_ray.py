"""Sweeps on Ray against the local process pool: speed-up, per-task overhead, and what
a 1,000-point sweep would take on a 64-core cluster.

    python benchmarks/bench_ray.py                                # 48 k3 decode points (batch 8 x 4096)
    python benchmarks/bench_ray.py --points 12 --batch 1 --context 256   # a smaller run for a busy 2-core machine

Runs the same grid (HBM bandwidth x AIC count x L2 size, first --points points) as:
  local, 1 job   in this process (after one untimed warm-up point): the time of a
                 point with no overhead at all (t_point)
  local, 2 jobs  npusim.pool's worker processes
  ray, 1 and 2 workers   a local Ray instance of that many CPUs (its start-up timed apart)
and checks every run gives the same rows. Per-task overhead of a backend with w
workers = (wall x w - points x t_point) / points: the time a worker spends per point
on anything but the point (shipping it, scheduling, a process's first imports).
A second figure times empty tasks (NOOP_TASKS of them) through each backend: the
bare cost of one task's round trip.

The estimate at the end is arithmetic on those figures, printed with its formula:
a cluster of C cores runs P points in ceil(P / C) waves, each one point's CPU time
(a core to itself) plus a task's round trip, after Ray's start and each new
worker's imports. CPU time, not wall time, because on a shared machine (load above
the CPU count) a point's wall time is mostly waiting for a core.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

NOOP_TASKS = 200
GRID = {"hbm.peak_bw_bytes_per_s": [1.2e12, 1.6e12, 2.4e12, 3.2e12], "chip.aic_count": [16, 20, 24],
        "l2.l2_bytes": [48 << 20, 96 << 20, 192 << 20, 384 << 20]}  # 48 points


def noop(i: int) -> int:
    return i


def timed_sweep(grids, step: dict, backend) -> tuple[float, float, list[dict]]:
    """(wall seconds, CPU seconds of this process, rows) of the sweep on `backend`."""
    from npusim.sweep import sweep

    start, cpu = time.perf_counter(), time.process_time()
    rows = sweep(step["workload"], grids, batch=step["batch"], context=step["context"], passes="optimized",
                 backend=backend)
    return time.perf_counter() - start, time.process_time() - cpu, rows


def noop_overhead(backend) -> float:
    """Seconds per empty task through `backend` (its workers already started)."""
    start = time.perf_counter()
    backend.run(noop, [(i,) for i in range(NOOP_TASKS)], lambda i, v: None, lambda i, r: None)
    return (time.perf_counter() - start) / NOOP_TASKS


def import_seconds() -> float:
    """In a fresh worker: the time to import what a sweep point needs (paid once per worker)."""
    import importlib

    start = time.perf_counter()
    for module in ("npusim.runtime.decoder", "npusim.sweep"):
        importlib.import_module(module)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=48, help="points of the grid to run (at most 48)")
    ap.add_argument("--workload", default="k3")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--cluster-cores", type=int, default=64, help="cores of the cluster in the estimate")
    ap.add_argument("--cluster-points", type=int, default=1000, help="points of the sweep in the estimate")
    args = ap.parse_args()
    try:
        import ray
    except ImportError:
        sys.exit('bench_ray: Ray is not installed: pip install "npusim[ray]"')
    from npusim.backends import get_backend
    from npusim.backends.ray import OBJECT_STORE_BYTES
    from npusim.sweep import points

    grids = [{k: [v] for k, v in p.items()} for p in points(GRID)[: args.points]]
    n = len(grids)
    step = {"workload": args.workload, "batch": args.batch, "context": args.context}
    print(f"{n} points: {args.workload} decode batch {args.batch} x context {args.context}, optimized; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")

    timed_sweep(grids[:1], step, get_backend("local", 1))  # warm-up: imports and config loading, once, untimed
    results, reference, cpu_point, worker_import = {}, None, 0.0, 0.0
    for name, workers in (("local", 1), ("local", 2), ("ray", 1), ("ray", 2)):
        startup = 0.0
        if name == "ray":
            start = time.perf_counter()
            ray.init(address="local", num_cpus=workers, include_dashboard=False,
                     object_store_memory=OBJECT_STORE_BYTES, log_to_driver=False, logging_level="ERROR")
            startup = time.perf_counter() - start
            worker_import = max(ray.get([ray.remote(import_seconds).remote() for _ in range(workers)]))
        backend = get_backend(name, workers)
        wall, cpu, rows = timed_sweep(grids, step, backend)
        reference = reference or rows
        assert rows == reference, f"{name} x {workers}: rows differ from the first run"
        if (name, workers) == ("local", 1):
            cpu_point = cpu / n
        noop_s = noop_overhead(backend) if (name, workers) != ("local", 1) else 0.0
        if name == "ray":
            ray.shutdown()
        results[name, workers] = (wall, startup, noop_s)
        print(f"  {name:5s} {workers} worker{'s' if workers > 1 else ' '}: {wall:7.1f} s for {n} points"
              + (f" (+ {startup:.1f} s to start Ray, {worker_import:.1f} s of imports in a new worker)"
                 if startup else f" ({cpu:.1f} s of CPU)" if (name, workers) == ("local", 1) else "")
              + (f"; empty task round trip {noop_s * 1e3:.2f} ms" if noop_s else ""))
    load = os.getloadavg()[0]
    t_point = results["local", 1][0] / n
    print(f"load average {load:.1f} at the end" + (" (more than the CPUs: other work shared the cores, so the "
          "wall times below are as much the machine's load as the backends')" if load > os.cpu_count() else ""))
    print(f"\nt_point = {t_point:.2f} s per point (local, 1 job, in this process), of which {cpu_point:.2f} s "
          f"on a CPU ({cpu_point / t_point:.0%} of a core)")
    print("backend   workers  speed-up vs 1 job  overhead per point")
    overheads = {}
    for (name, workers), (wall, _, _) in results.items():
        if (name, workers) == ("local", 1):
            continue
        overhead = (wall * workers - n * t_point) / n
        overheads[name, workers] = overhead
        print(f"{name:9s} {workers:7d}  {results['local', 1][0] / wall:17.2f}x  {overhead:+15.2f} s")
    ray1, ray2 = results["ray", 1][0], results["ray", 2][0]
    print(f"Ray, 2 workers against 1: {ray1 / ray2:.2f}x; against the local pool of 2 jobs: "
          f"{results['local', 2][0] / ray2:.2f}x (above 1: Ray faster)")

    # the estimate: a cluster of C cores, P points in ceil(P / C) waves; a wave is one point's CPU time
    # (a core to itself) + the task round trip; once: Ray's start (or connect) and each worker's imports
    cores, total = args.cluster_cores, args.cluster_points
    waves = math.ceil(total / cores)
    connect, trip = results["ray", 2][1], results["ray", 2][2]
    estimate = connect + worker_import + waves * (cpu_point + trip)
    serial = total * cpu_point
    print(f"\nEstimate, {total} points on a {cores}-core Ray cluster (a core per point, to itself):\n"
          f"  {connect:.1f} s start/connect + {worker_import:.1f} s imports in each new worker + ceil({total} / "
          f"{cores}) = {waves} waves x (point {cpu_point:.2f} s CPU + task round trip {trip * 1e3:.1f} ms)\n"
          f"  = {estimate:,.0f} s ({estimate / 60:.1f} min), against {serial:,.0f} s ({serial / 3600:.2f} h) on one "
          f"core: {serial / estimate:.0f}x. Assumes cores as fast as this machine's, points alike in cost, and "
          "the cluster's own scheduling no slower than the local instance's.")


if __name__ == "__main__":
    main()
