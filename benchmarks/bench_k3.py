"""Whole-model simulation speed: wall time and peak resident memory of a K3 step.

    python benchmarks/bench_k3.py [--no-memo] [--passes optimized]

Targets (issue 4): a decode step (32 layers, batch 8, context 4096) under 3 s,
prefill of 4096 tokens under 15 s, each under 2 GB of resident memory. Each case
runs in its own process so that its peak RSS is its own.
"""

import argparse
import resource
import subprocess
import sys
import time

CASES = [("decode", 8, 4096), ("prefill", 1, 4096)]


def one(phase: str, batch: int, context: int, passes: str, memo: bool) -> None:
    from npusim.runtime.decoder import run_decoder

    start = time.perf_counter()
    run = run_decoder("k3", "ascend910b2", phase, batch, context, passes, memo=memo)
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(f"k3 {phase} batch {batch} x {context} ({passes}{'' if memo else ', no memo'}): {wall:.2f} s wall, "
          f"peak RSS {rss / 1e9:.2f} GB, simulated {run.latency_us:,.1f} us, {len(run.result.kernels)} kernels")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", default="optimized")
    ap.add_argument("--no-memo", action="store_true")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # phase,batch,context: run one case in this process
    args = ap.parse_args()
    if args.case:
        phase, batch, context = args.case.split(",")
        one(phase, int(batch), int(context), args.passes, not args.no_memo)
        return
    for phase, batch, context in CASES:
        cmd = [sys.executable, __file__, "--case", f"{phase},{batch},{context}", "--passes", args.passes]
        subprocess.run(cmd + (["--no-memo"] if args.no_memo else []), check=True)


if __name__ == "__main__":
    main()
