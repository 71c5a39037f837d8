"""Operator simulation speed: wall time of `npusim op`-sized runs.

    python benchmarks/bench_ops.py [--repeat N]

Targets (issue 3): matmul 4096^3 under 2 s; FlashAttention S = 8192, 32 heads under 5 s.
Prints the best of N runs (wall time on a shared machine is noisy), and beside it
what was simulated - cycles, HBM bytes, L2 hit bytes - which a change made for
speed must leave identical.
"""

import argparse
import time

from npusim.hw import load_hw
from npusim.ops import OPS, lower, simulate_op

CASES = [
    ("matmul", dict(m=4096, n=4096, k=4096)),
    ("matmul", dict(m=4096, n=4096, k=4096, format_a="NZ", format_b="NZ")),
    ("matmul", dict(m=1, n=4096, k=4096, format_b="NZ")),
    ("flash_attention", dict(batch=1, heads=32, kv_heads=32, head_dim=128, seq_q=8192, seq_kv=8192, causal=True)),
]


def best_run(op: str, params: dict, hw, repeat: int):
    """(fastest wall time in seconds, the report of that run) over `repeat` runs."""
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        report = simulate_op(lower(op, params, hw), hw, trace="kernel")
        wall = time.perf_counter() - start
        if best is None or wall < best[0]:
            best = (wall, report)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the fastest is shown")
    args = parser.parse_args()
    hw = load_hw("ascend910b2")
    for op, params in CASES:
        if op not in OPS:
            print(f"{op}: not registered")
            continue
        wall, report = best_run(op, params, hw, args.repeat)
        s = report.stats
        print(f"{op} {params}: {wall:.2f} s wall for {report.us:.1f} us simulated "
              f"({report.stats.instructions} instructions, {report.stats.instructions / wall:,.0f}/s)")
        print(f"    {report.cycles:.0f} cycles, HBM read {s.hbm_read_bytes:.0f} B, write {s.hbm_write_bytes:.0f} B, "
              f"L2 hit {s.l2_hit_bytes:.0f} B")


if __name__ == "__main__":
    main()
