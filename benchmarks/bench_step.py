"""Whole-process speed of the commands issue 12 times: wall seconds, median of N runs.

Each case is a fresh `npusim` process (start-up, imports, lowering, passes and the
simulation all count), run N times (default 3); the median wall time is printed
beside the figure the issue measured before the speed work, with the CPU seconds
(user + system) of the median run, which a busy machine inflates less than the
wall time. The decode step's peak resident memory is that of its process
(os.wait4's resource usage of that child).

The on-disk cache (npusim.diskcache) is on by default: a "cold" case runs each time
with a new, empty cache folder (NPUSIM_CACHE_DIR), so it simulates and stores; a
"warm" case runs once to fill a folder (not counted), then N times reading it;
"--no-cache" neither reads nor writes one (what the cold case costs beyond it is
storing the step).

The last lines compare block grouping (the default: identical blocks that start
together are simulated once, engine.device) with simulating every block by itself
(engine.run(..., dedup=False)) on the same decode step, in-process (the CLI does
not offer the latter): CPU seconds of each, the latency difference and the largest
relative difference of any number in the step's JSON report. Grouping gives what one
block at a time gives (a group whose members come apart is simulated again block by
block, engine.run.until_even): the difference should be zero, the time saved is the point.

    python benchmarks/bench_step.py [--repeat N] [--only NAME,...] [--no-approx]
    PYTHONPATH=/path/to/another/tree python benchmarks/bench_step.py   # measure that tree
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

# (name, command after `npusim`, cache: "cold" | "warm" | None (--no-cache), the issue's
# wall figure before the speed work (s), its target (s))
DECODE = ["run", "--workload", "k3", "--batch", "8", "--context", "4096", "--passes", "optimized"]
MATMUL = ["op", "matmul", "m=4096", "n=4096", "k=4096"]
CASES = [
    ("decode cold", DECODE, "cold", 5.2, 1.0),
    ("decode warm", DECODE, "warm", None, 0.3),
    ("decode no-cache", [*DECODE, "--no-cache"], None, 5.2, None),
    ("decode --no-memo", [*DECODE, "--no-memo"], "cold", 42.7, 10.0),
    ("prefill 4096", ["run", "--workload", "k3", "--phase", "prefill", "--batch", "1", "--context", "4096",
                      "--passes", "optimized"], "cold", 20.0, 5.0),
    ("op matmul 4096^3", MATMUL, "cold", 1.24, 0.3),
    ("op matmul warm", MATMUL, "warm", None, None),
    ("import npusim.cli", None, None, 0.44, None),
]


def _command(args: list[str] | None) -> list[str]:
    if args is None:
        return [sys.executable, "-c", "import npusim.cli"]
    exe = shutil.which("npusim", path=os.path.dirname(sys.executable)) or shutil.which("npusim")
    return [exe, *args] if exe else [sys.executable, "-m", "npusim", *args]


def _one(cmd: list[str], cache_dir: str | None = None) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of one run of `cmd` in a child process, its cache in `cache_dir`."""
    env = os.environ | ({"NPUSIM_CACHE_DIR": cache_dir} if cache_dir else {})
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            lines = err.read().decode().strip().splitlines() or ["(no output)"]
            sys.exit(f"{' '.join(cmd)} failed: {lines[-1]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024  # Linux: KiB


def _approx_child(grouped: bool, out: str) -> None:
    """Run the decode step in this process with or without block grouping; write its JSON report."""
    import functools
    import json

    import npusim.runtime.run as runtime_run
    from npusim.engine import run
    from npusim.report.step import step_json
    from npusim.runtime.decoder import run_decoder

    runtime_run.run = functools.partial(run, dedup=grouped)  # the runtime has no option for it
    start = time.process_time()
    step = run_decoder("k3", "ascend910b2", "decode", 8, 4096, "optimized")
    report = step_json(step)
    report["_cpu_s"] = time.process_time() - start
    with open(out, "w") as f:
        json.dump(report, f)


def _numbers(prefix: str, value, out: dict) -> dict:
    """Every number of a JSON value by its path."""
    if isinstance(value, dict):
        for k, v in value.items():
            _numbers(f"{prefix}.{k}", v, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _numbers(f"{prefix}[{i}]", v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = value
    return out


def _approx_report() -> None:
    import json

    reports = {}
    with tempfile.TemporaryDirectory() as tmp:
        for grouped in (False, True):
            out = f"{tmp}/{grouped}.json"
            subprocess.run([sys.executable, __file__, "--approx-child", str(grouped), out], check=True)
            with open(out) as f:
                reports[grouped] = json.load(f)
    single, grouped = (_numbers("", {k: v for k, v in reports[g].items() if k != "_cpu_s"}, {}) for g in (False, True))
    worst = max(((abs(grouped[k] - v) / abs(v), k) for k, v in single.items() if v and grouped.get(k) != v),
                default=(0.0, "-"))
    lat = (reports[True]["latency_us"] - reports[False]["latency_us"]) / reports[False]["latency_us"]
    print(f"block grouping on the decode step, in-process: every block by itself {reports[False]['_cpu_s']:.2f} s "
          f"CPU, grouped (the default) {reports[True]['_cpu_s']:.2f} s CPU; latency {100 * lat:+.4f}%, largest "
          f"difference of any number in the JSON {100 * worst[0]:.2f}% ({worst[1]}): "
          + ("NOT within 0.5%" if worst[0] > 0.005 else "within 0.5%"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the median is shown (default 3)")
    ap.add_argument("--only", help="comma list of case names to run (default all)")
    ap.add_argument("--no-approx", action="store_true", help="skip the comparison with every block simulated by itself")
    ap.add_argument("--approx-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.approx_child:
        _approx_child(args.approx_child[0] == "True", args.approx_child[1])
        return
    only = set(args.only.split(",")) if args.only else None
    print(f"{'case':20s} {'before':>8s} {'after':>8s} {'cpu':>8s} {'target':>8s}  peak RSS")
    for name, cmd_args, cache, before, target in CASES:
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            if cache == "warm":
                _one(_command(cmd_args), tmp)  # fills the cache; not counted
            runs = sorted((_one(_command(cmd_args), tempfile.mkdtemp(dir=tmp) if cache == "cold" else tmp)
                           for _ in range(args.repeat)), key=lambda r: r[0])
        wall, cpu, _ = runs[len(runs) // 2]
        rss = max(r[2] for r in runs)
        tgt = f"{target:7.2f}s" if target is not None else "       -"
        old = f"{before:7.2f}s" if before is not None else "       -"
        print(f"{name:20s} {old} {statistics.median(r[0] for r in runs):7.2f}s {cpu:7.2f}s {tgt}  "
              f"{rss / 2**20:.0f} MiB", flush=True)
    if not args.no_approx:
        _approx_report()


if __name__ == "__main__":
    main()
