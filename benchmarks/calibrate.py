"""Search the config fields marked "assumed" that the calibration points depend on.

    python benchmarks/calibrate.py            # small grid on the cheaper points
    python benchmarks/calibrate.py --check    # every point with the committed config

Prints each candidate's errors; the worst-case error decides. Copy the winner into
hwconfigs/ascend910b2.yaml by hand (the variants inherit it).
"""

import itertools
import sys

from npusim.ops.calibration import evaluate, table

GRID = {
    "dma.startup_cycles": [100, 128, 160],
    "dma.segment_cycles": [1, 2],
    "runtime.kernel_start_cycles": [5400, 9000],
    "hbm.bw_efficiency": [0.66],
}


def main():
    if "--check" in sys.argv:
        print(table(evaluate()))
        return
    results = []
    for values in itertools.product(*GRID.values()):
        over = dict(zip(GRID, values))
        pts = evaluate(over, sizes=(1536, 3072))
        worst = max(abs(p.error) for p in pts if p.unit == "us")
        results.append((worst, over, pts))
        print(f"{worst:6.1%}  {over}  " + "  ".join(f"{p.name.split()[1]} {100 * p.error:+.1f}%" for p in pts),
              flush=True)
    worst, over, pts = min(results, key=lambda r: r[0])
    print("\nbest:", over)
    print(table(pts))


if __name__ == "__main__":
    main()
