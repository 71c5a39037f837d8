"""How close npusim is to silicon: the public 910B measurements shipped with npusim
(npusim/data/measured, sources in its README) simulated row by row, grouped into
families, before and after `npusim calibrate` fits the config's assumed fields to
them, with the k-fold held-out error of that fit (benchmarks/fidelity.py prints it;
the README's "How close to silicon" is its table).

Families group rows by what bounds them on the device, so an error in one mechanism
shows as one family off, not as noise over all of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from attrs import frozen

from npusim.calibrate.opmap import Mapped
from npusim.calibrate.profile import ProfileRow
from npusim.calibrate.session import Calibration, calibrate

DATA = Path(__file__).resolve().parents[1] / "data" / "measured"
# the order the table lists families in
FAMILIES = ("GEMM", "GEMV and small M", "quantised matmul", "grouped matmul", "vector", "attention", "copy",
            "eager call (host)")
SMALL_M = 128  # a matmul with at most this many rows streams its weights: a decode GEMV or a small batch
FOLDS = 5


def measured_files(folder: Path = DATA) -> list[Path]:
    """The measurement tables (every CSV of the folder), sorted."""
    return sorted(folder.glob("*.csv"))


def family(row: ProfileRow, op: str, params: dict) -> str:
    """The family of a measured row (its CANN op type, timing method and shape)."""
    if row.method.startswith("EV") and row.op_type != "copy_":
        return "eager call (host)"  # a small op timed around host calls: the host's cost per call
    if op in ("matmul", "batch_matmul"):
        if row.op_type.startswith(("QuantBatchMatmul", "WeightQuantBatchMatmul")):
            return "quantised matmul"
        return "GEMV and small M" if params["m"] <= SMALL_M else "GEMM"
    if op == "grouped_matmul":
        return "grouped matmul"
    if op in ("flash_attention", "decode_attention"):
        return "attention"
    if row.op_type == "copy_":
        return "copy"
    return "vector"


def families(mapped: Sequence[Mapped]) -> np.ndarray:
    return np.array([family(m.row, m.op, dict(m.params)) for m in mapped])


@frozen
class FamilyError:
    family: str
    rows: int
    before: tuple[float, float]  # median, max |simulated / measured - 1|: the config as shipped
    after: tuple[float, float]  # ... the config fitted on every row (in-sample)
    held_out: tuple[float, float]  # ... each row predicted by the fit without its op (k-fold)


def _median_max(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    e = np.abs(predicted / measured - 1)
    e = e[np.isfinite(e)]
    return (float(np.median(e)), float(np.max(e))) if len(e) else (float("nan"), float("nan"))


def by_family(cal: Calibration) -> list[FamilyError]:
    fam = families(cal.mapped)
    out = []
    for name in FAMILIES:
        sel = fam == name
        if sel.any():
            m = cal.measured_us[sel]
            out.append(FamilyError(name, int(sel.sum()), _median_max(cal.before_us[sel], m),
                                   _median_max(cal.after_us[sel], m), _median_max(cal.held_out_us[sel], m)))
    return out


def run(hw: str | Path = "ascend910b2", folds: int = FOLDS, fields: Sequence[str] | None = None,
        folder: Path = DATA, jobs: int = 1) -> Calibration:
    """`npusim calibrate` of `hw` on every measured row of `folder` (in `jobs` worker processes)."""
    return calibrate(measured_files(folder), hw, fields, folds, jobs=jobs)


def as_shipped(hw: str | Path = "ascend910b2", folder: Path = DATA,
               jobs: int = 1) -> list[tuple[str, int, float, float]]:
    """(family, rows, median, max |simulated / measured - 1|) of `hw` on every measured
    row of `folder`, without fitting anything (table()'s "config" columns, in seconds
    rather than the calibration's minutes), the ops simulated in `jobs` worker processes."""
    from npusim.calibrate.model import Model
    from npusim.calibrate.session import map_rows, read_measurements
    from npusim.hw import load_hw
    from npusim.hw.load import find_file

    rows, _ = read_measurements(measured_files(folder), ())
    model = Model(load_hw(find_file(hw, "hwconfigs")), (), jobs)
    mapped, _ = map_rows(rows, model)
    keys = list(dict.fromkeys(m.key for m in mapped))
    times = dict(zip(keys, np.exp(model.log_times(np.zeros(0), keys))))
    simulated = np.array([times[m.key] for m in mapped])
    measured = np.array([m.row.duration_us for m in mapped])
    fam = families(mapped)
    return [(name, int((fam == name).sum()), *_median_max(simulated[fam == name], measured[fam == name]))
            for name in FAMILIES if (fam == name).any()]


def _pct(pair: tuple[float, float]) -> str:
    return "  ".join("    -" if np.isnan(x) else f"{100 * x:4.0f}%" for x in pair)


def table(cal: Calibration) -> str:
    """Per family: rows, median and max error of the config calibrated (as given), of the
    fitted one (in-sample) and held out."""
    lines = [f"{'family':20s} {'rows':>4s}   {'config':^11s}   {'fitted':^11s}   {'held out':^11s}",
             f"{'':20s} {'':>4s}   {'med    max':^11s}   {'med    max':^11s}   {'med    max':^11s}"]
    for f in by_family(cal):
        lines.append(f"{f.family:20s} {f.rows:4d}   {_pct(f.before)}   {_pct(f.after)}   {_pct(f.held_out)}")
    return "\n".join(lines)


def _families_of(cal: Calibration, field) -> str:
    """The families of the rows a fitted field moves, most rows first."""
    fam = families(cal.mapped)
    types = set(field.op_types)
    counts: dict[str, int] = {}
    for f, m in zip(fam, cal.mapped):
        if m.row.op_type in types:
            counts[f] = counts.get(f, 0) + 1
    return ", ".join(sorted(counts, key=lambda k: -counts[k]))


def write_defaults(cal: Calibration, path: Path) -> Path:
    """The fitted values into the config file `path` (the one calibrated), in place: each
    fitted field's line gets its value and a comment saying it is an assumed field fitted
    on the public measurements, on how many rows of which families, with the median
    error of those rows before and after. Other lines are left as they are."""
    from npusim.calibrate.write import yaml_number
    from npusim.outputs import write_text

    lines = path.read_text().splitlines()
    for f in cal.fields:
        section, *keys = f.field.split(".")
        at = _line_of(lines, section, keys, path)
        indent = re.match(r" *", lines[at])[0]
        lines[at] = (f"{indent}{keys[-1]}: {yaml_number(f.after)}   # assumed; fitted (benchmarks/fidelity.py) on {f.rows} "
                     f"public 910B2 rows ({_families_of(cal, f)}): median error {100 * f.error_before:.0f}% -> "
                     f"{100 * f.error_after:.0f}% (was {yaml_number(f.before)})")
    return write_text(path, "\n".join(lines) + "\n")


def _line_of(lines: list[str], section: str, keys: list[str], path: Path) -> int:
    """The line of key path section.keys in a config file's lines (each nested key
    indented under the one before)."""
    at, indent = -1, -1
    for key in (section, *keys):
        pattern = re.compile(rf"^( *){re.escape(key)}:")
        for i in range(at + 1, len(lines)):
            m = pattern.match(lines[i])
            if m and len(m[1]) > indent:
                at, indent = i, len(m[1])
                break
        else:
            raise ValueError(f"{path}: no line for key '{key}' of {section}.{'.'.join(keys)}")
    return at
