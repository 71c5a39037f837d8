"""How long `npusim calibrate` takes on a 2,000-row profile (target: 60 s).

    python benchmarks/bench_calibrate.py [ROWS]

The profile is synthetic (npusim.calibrate.synth): the ops of a small decoder's decode
steps (batch 1 and 8) and a 128-token prefill, timed on a config with three assumed
fields moved, +-3% noise, repeated to ROWS rows as a profile of many steps repeats
its shapes. Rows are deduplicated by (op, shape), so the cost is simulations of the
distinct ops: printed with the wall and CPU time.
"""

import argparse
import tempfile
import time
from pathlib import Path

from npusim.calibrate import calibrate
from npusim.calibrate.report import overall
from npusim.calibrate.synth import decoder_mix, synthetic_rows, write_profile
from npusim.hw import load_hw

HIDDEN = {"hbm.bw_efficiency": 0.55, "runtime.kernel_start_aiv_cycles": 11000, "dma.startup_cycles": 200}


def _positive(text: str) -> int:
    """ROWS: a whole number of rows, at least 1 (argparse reports anything else in one line)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of rows, at least 1, got {text!r}")
    return int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rows", nargs="?", type=_positive, default=2000, help="rows of the profile (default 2000)")
    n_rows = p.parse_args().rows
    specs = decoder_mix(decode_batches=(1, 8), prompts=(128,))
    rows = synthetic_rows(specs, load_hw("ascend910b2", HIDDEN), repeats=-(-n_rows // len(specs)), seed=3)[:n_rows]
    with tempfile.TemporaryDirectory() as d:
        path = write_profile(rows, Path(d) / "op_summary_0.csv")
        wall, cpu = time.perf_counter(), time.process_time()
        cal = calibrate(path, "ascend910b2")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    e = overall(cal)
    print(f"{cal.rows_read} rows, {len({m.key for m in cal.mapped})} distinct ops, {cal.simulations} simulations "
          f"(screening, {cal.folds} folds and the final fit): {wall:.1f} s wall, {cpu:.1f} s CPU (target 60 s)")
    print("fitted: " + ", ".join(f"{f.field} {f.before:g} -> {f.after:g} (hidden {HIDDEN.get(f.field, f.before):g})"
                                 for f in cal.fields))
    print(f"held-out median error {100 * e['held_out']['median']:.2f}%, max {100 * e['held_out']['max']:.2f}%")


if __name__ == "__main__":
    main()
