"""The worked example of `npusim calibrate` in docs/calibrate.md: ascend910b1 calibrated on four
public GEMM points (npusim/data/calibration; a 24-core 910-class die at 1850 MHz).

    python benchmarks/calibrate.py [--fields F1,F2]   # about 25 s on an empty cache: each GEMM is simulated ~20 times

The same as `npusim calibrate --profile npusim/data/calibration/gemm_op_summary.csv --hw
ascend910b1 --fields ...`; it prints the fit and its held-out error (leave-one-GEMM-out).
How close npusim is to silicon over every public measurement is benchmarks/fidelity.py.
"""

import sys
from pathlib import Path

from npusim.calibrate import calibrate
from npusim.calibrate.report import summary

# what the GEMMs identify, less HBM efficiency: four GEMMs are compute-bound
FIELDS = "aic.mmad_startup_cycles,dma.startup_cycles,runtime.kernel_start_aic_cycles"  # as docs/calibrate.md
GEMM_CSV = Path(__file__).resolve().parents[1] / "npusim" / "data" / "calibration" / "gemm_op_summary.csv"


def main():
    fields = (sys.argv[sys.argv.index("--fields") + 1] if "--fields" in sys.argv else FIELDS).split(",")
    print(summary(calibrate(GEMM_CSV, "ascend910b1", fields, folds=4)))


if __name__ == "__main__":
    main()
