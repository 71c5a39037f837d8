"""The worked example of `npusim calibrate` in docs/calibrate.md: ascend910b1 calibrated on four
public GEMM points (npusim/data/calibration; a 24-core 910-class die at 1850 MHz).

    python benchmarks/calibrate.py [--fields F1,F2]   # about 25 s on an empty cache: each GEMM is simulated ~20 times

The same as `npusim calibrate --profile npusim/data/calibration/gemm_op_summary.csv --hw
ascend910b1 --fields ...`; it prints the fit and its held-out error (leave-one-GEMM-out).
How close npusim is to silicon over every public measurement is benchmarks/fidelity.py.
"""

import argparse
from pathlib import Path

from npusim.calibrate import calibrate
from npusim.calibrate.report import summary
from npusim.errors import ConfigError

# what the GEMMs identify, less HBM efficiency: four GEMMs are compute-bound
FIELDS = "aic.mmad_startup_cycles,dma.startup_cycles,runtime.kernel_start_aic_cycles"  # as docs/calibrate.md
GEMM_CSV = Path(__file__).resolve().parents[1] / "npusim" / "data" / "calibration" / "gemm_op_summary.csv"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fields", default=FIELDS, help=f"the fields to fit, comma-separated (default {FIELDS})")
    fields = p.parse_args().fields.split(",")
    try:
        print(summary(calibrate(GEMM_CSV, "ascend910b1", fields, folds=4)))
    except ConfigError as e:  # a field that is not fittable: its one line, not a traceback
        p.exit(2, f"{p.prog}: {e}\n")


if __name__ == "__main__":
    main()
