"""Operator simulation speed: wall time of `npusim op`-sized runs.

    python benchmarks/bench_ops.py

Targets (issue 3): matmul 4096^3 under 2 s; FlashAttention S = 8192, 32 heads under 5 s.
"""

import time

from npusim.hw import load_hw
from npusim.ops import OPS, lower, simulate_op

CASES = [
    ("matmul", dict(m=4096, n=4096, k=4096)),
    ("matmul", dict(m=4096, n=4096, k=4096, format_a="NZ", format_b="NZ")),
    ("matmul", dict(m=1, n=4096, k=4096, format_b="NZ")),
    ("flash_attention", dict(batch=1, heads=32, kv_heads=32, head_dim=128, seq_q=8192, seq_kv=8192, causal=True)),
]


def main():
    hw = load_hw("ascend910b2")
    for op, params in CASES:
        if op not in OPS:
            print(f"{op}: not registered")
            continue
        start = time.perf_counter()
        report = simulate_op(lower(op, params, hw), hw, trace="kernel")
        wall = time.perf_counter() - start
        print(f"{op} {params}: {wall:.2f} s wall for {report.us:.1f} us simulated "
              f"({report.stats.instructions} instructions, {report.stats.instructions / wall:,.0f}/s)")


if __name__ == "__main__":
    main()
