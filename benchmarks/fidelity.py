"""How close to silicon: every public 910B measurement npusim can express
(npusim/data/measured), simulated on a config as shipped, then `npusim calibrate`d on
all of them with k-fold cross-validation; the error per family.

    python benchmarks/fidelity.py [--hw ascend910b2] [--folds 5] [--fields F1,F2] [--jobs N] [--json PATH]
                                  [--write-defaults]

Prints the calibration's report (fitted fields, rows not simulated and why, error by
CANN op type) and then the table of the README's "How close to silicon": per family,
median and max |simulated / measured - 1| as shipped, fitted on every row, and held
out (each row predicted by the fit of the folds that did not hold its op).
--write-defaults writes the fitted values into the config file calibrated (each with a
comment: the rows and families it was fitted on, their error before and after): how
the shipped ascend910b2.yaml got its assumed values.
"""

import argparse
import os
import time

import attrs

from npusim.calibrate.command import check_folds, parse_fields
from npusim.calibrate.fidelity import by_family, measured_files, run, table, write_defaults
from npusim.calibrate.report import summary, to_json
from npusim.errors import NpusimError
from npusim.hw.load import find_file
from npusim.outputs import write_json
from npusim.outputs_check import check_paths, check_writable
from npusim.pool import check_jobs


def _check_outputs(args) -> None:
    """--json and --write-defaults' file, before the run: not an input (a measurement
    table, the config), and writable (a bad --json path failed after the 75 minutes)."""
    hw_path = find_file(args.hw, "hwconfigs")
    inputs = {f"the measurements' {path.name}": path for path in measured_files()} | {"--hw": hw_path}
    check_paths({"--json": args.json}, inputs)
    check_writable({"--json": args.json, "--write-defaults (--hw's file)": hw_path if args.write_defaults else None})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="ascend910b2")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--fields", help="fit only these assumed fields (default: all the rows identify)")
    ap.add_argument("--jobs", type=int, help="worker processes simulating the ops at once; the table does not "
                    "depend on it (default: the machine's CPUs)")
    ap.add_argument("--json", help="write the calibration report and the table as JSON")
    ap.add_argument("--write-defaults", action="store_true", help="write the fitted values into the config file")
    args = ap.parse_args()
    t0 = time.perf_counter()
    try:
        check_folds(args.folds)  # --folds 1 ran for 75 minutes, and its table had no held-out error
        jobs = check_jobs(args.jobs) or os.cpu_count() or 1
        fields = parse_fields(args.fields)
        _check_outputs(args)
        cal = run(args.hw, args.folds, fields, jobs=jobs)
    except NpusimError as e:  # a config or field that is not one: its one line, not a traceback
        ap.exit(2, f"{ap.prog}: {e}\n")
    print(summary(cal))
    print(f"\nHow close to silicon ({args.hw}; {len(cal.mapped)} rows, {cal.simulations} simulations, "
          f"{time.perf_counter() - t0:.0f} s):")
    print(table(cal))
    if args.json:
        data = to_json(cal) | {"families": [attrs.asdict(f) for f in by_family(cal)]}
        print("wrote", write_json(args.json, data))
    if args.write_defaults:
        print("wrote", write_defaults(cal, cal.hw_path))


if __name__ == "__main__":
    main()
