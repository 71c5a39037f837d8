"""Engine speed: a streaming kernel of 48 blocks x 1,000 loop iterations.

Prints wall time and simulated instructions per wall second, with identical-block
grouping (the default) and without it. Target: under 2 s wall on a 2-core machine.

    python benchmarks/bench_engine.py [--repeat N]

With --repeat, the best of N runs is shown. Wall time on a shared machine is noisy;
the CPU time of the process (time.process_time) is printed beside it.
"""

import argparse
import time

from npusim.demo import vector_add
from npusim.engine import Launch, Synchronize, run
from npusim.hw import load_hw


def run_once(kernel, hw, dedup: bool, trace: str):
    start, cpu = time.perf_counter(), time.process_time()
    result = run([Launch(kernel), Synchronize()], hw, trace, dedup)
    return time.perf_counter() - start, time.process_time() - cpu, result.kernels[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration; the fastest is shown")
    args = parser.parse_args()
    hw = load_hw("ascend910b2")
    kernel = vector_add(hw, tiles_per_block=2000)  # the loop runs 1,000 times, two tiles each
    print(f"kernel: {kernel.block_dim} blocks x {kernel.aiv[0].body[2].count} loop iterations")
    for dedup, trace in ((True, "kernel"), (True, "instr"), (False, "kernel")):
        wall, cpu, rec = min((run_once(kernel, hw, dedup, trace) for _ in range(args.repeat)), key=lambda r: r[1])
        n = rec.stats.instructions
        print(f"grouping {'on ' if dedup else 'off'} trace={trace:6s}: {wall:6.2f} s wall, {cpu:6.2f} s CPU, "
              f"{n} instructions, {n / wall:,.0f} simulated instructions/s, "
              f"{rec.cycles:.0f} cycles simulated, HBM {rec.stats.hbm_read_bytes + rec.stats.hbm_write_bytes:.0f} B")


if __name__ == "__main__":
    main()
