"""The shared calibration data as a worked example of `npusim calibrate`.

    python benchmarks/calibrate.py [--fields F1,F2]   # calibrate ascend910b1 on the four GEMM points (minutes)
    python benchmarks/calibrate.py --check            # every public point with the committed config

The first fits the assumed fields the GEMMs identify (npusim.calibrate, the same as
`npusim calibrate --profile npusim/data/calibration/gemm_op_summary.csv --hw ascend910b1`)
and prints its held-out error (leave-one-GEMM-out) beside the committed config's error
on the same points. Copy fitted values into hwconfigs/ by hand only with their evidence.
"""

import sys
from pathlib import Path

from npusim.calibrate import calibrate
from npusim.calibrate.report import overall, summary
from npusim.ops.calibration import evaluate, table

# what the GEMMs identify, less HBM efficiency: the 256 MiB copy calibrates that, and
# this profile does not hold it (README, "Calibrate to your hardware")
FIELDS = "dma.startup_cycles,dma.segment_cycles,runtime.kernel_start_aic_cycles"
GEMM_CSV = Path(__file__).resolve().parents[1] / "npusim" / "data" / "calibration" / "gemm_op_summary.csv"


def main():
    if "--check" in sys.argv:
        print(table(evaluate()))
        return
    fields = (sys.argv[sys.argv.index("--fields") + 1] if "--fields" in sys.argv else FIELDS).split(",")
    cal = calibrate(GEMM_CSV, "ascend910b1", fields, folds=4)
    print(summary(cal))
    committed = max(abs(p.error) for p in evaluate() if p.name.startswith("gemm"))
    e = overall(cal)["held_out"]
    print(f"\nGEMM points: committed config max error {100 * committed:.1f}% (in-sample: it was tuned on them); "
          f"calibrated, held out: median {100 * e['median']:.1f}%, max {100 * e['max']:.1f}%")


if __name__ == "__main__":
    main()
