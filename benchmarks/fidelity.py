"""How close to silicon: every public 910B measurement npusim can express
(npusim/data/measured), simulated on a config as shipped, then `npusim calibrate`d on
all of them with k-fold cross-validation; the error per family.

    python benchmarks/fidelity.py [--hw ascend910b2] [--folds 5] [--fields F1,F2] [--json PATH]

Prints the calibration's report (fitted fields, rows not simulated and why, error by
CANN op type) and then the table of the README's "How close to silicon": per family,
median and max |simulated / measured - 1| as shipped, fitted on every row, and held
out (each row predicted by the fit of the folds that did not hold its op).
"""

import argparse
import json
import time

import attrs

from npusim.calibrate.fidelity import by_family, run, table
from npusim.calibrate.report import summary, to_json
from npusim.outputs import write_text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="ascend910b2")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--fields", help="fit only these assumed fields (default: all the rows identify)")
    ap.add_argument("--json", help="write the calibration report and the table as JSON")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cal = run(args.hw, args.folds, args.fields.split(",") if args.fields else None)
    print(summary(cal))
    print(f"\nHow close to silicon ({args.hw}; {len(cal.mapped)} rows, {cal.simulations} simulations, "
          f"{time.perf_counter() - t0:.0f} s):")
    print(table(cal))
    if args.json:
        data = to_json(cal) | {"families": [attrs.asdict(f) for f in by_family(cal)]}
        print("wrote", write_text(args.json, json.dumps(data, indent=1)))


if __name__ == "__main__":
    main()
