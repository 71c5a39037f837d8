"""Whole-process speed of the commands issue 12 times: wall seconds, median of N runs.

Each case is a fresh `npusim` process (start-up, imports, lowering, passes and the
simulation all count), run N times (default 3); the median wall time is printed
beside the figure the issue measured before the speed work, with the CPU seconds
(user + system) of the median run, which a busy machine inflates less than the
wall time. The decode step's peak resident memory is that of its process
(os.wait4's resource usage of that child).

    python benchmarks/bench_step.py [--repeat N] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

# (name, command after `npusim`, the wall figure before the speed work (s), its target (s))
CASES = [
    ("decode", ["run", "--workload", "k3", "--batch", "8", "--context", "4096", "--passes", "optimized"], 5.2, 1.0),
    ("decode --no-memo", ["run", "--workload", "k3", "--batch", "8", "--context", "4096", "--passes", "optimized",
                          "--no-memo"], 42.7, 10.0),
    ("prefill 4096", ["run", "--workload", "k3", "--phase", "prefill", "--batch", "1", "--context", "4096",
                      "--passes", "optimized"], 20.0, 5.0),
    ("op matmul 4096^3", ["op", "matmul", "m=4096", "n=4096", "k=4096"], 1.24, 0.3),
    ("import npusim.cli", None, 0.44, None),
]


def _command(args: list[str] | None) -> list[str]:
    if args is None:
        return [sys.executable, "-c", "import npusim.cli"]
    exe = shutil.which("npusim", path=os.path.dirname(sys.executable)) or shutil.which("npusim")
    return [exe, *args] if exe else [sys.executable, "-m", "npusim.cli", *args]


def _one(cmd: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of one run of `cmd` in a child process."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            lines = err.read().decode().strip().splitlines() or ["(no output)"]
            sys.exit(f"{' '.join(cmd)} failed: {lines[-1]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024  # Linux: KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the median is shown (default 3)")
    ap.add_argument("--only", help="comma list of case names to run (default all)")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    print(f"{'case':20s} {'before':>8s} {'after':>8s} {'cpu':>8s} {'target':>8s}  peak RSS")
    for name, cmd_args, before, target in CASES:
        if only and name not in only:
            continue
        runs = sorted((_one(_command(cmd_args)) for _ in range(args.repeat)), key=lambda r: r[0])
        wall, cpu, _ = runs[len(runs) // 2]
        rss = max(r[2] for r in runs)
        tgt = f"{target:7.2f}s" if target is not None else "       -"
        print(f"{name:20s} {before:7.2f}s {statistics.median(r[0] for r in runs):7.2f}s {cpu:7.2f}s {tgt}  "
              f"{rss / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
