"""How close npusim is to silicon: the public 910B measurements shipped with npusim
(npusim/data/measured, sources in its README) simulated row by row, grouped into
families, before and after `npusim calibrate` fits the config's assumed fields to
them, with the k-fold held-out error of that fit (benchmarks/fidelity.py prints it;
the README's "How close to silicon" is its table).

Families group rows by what bounds them on the device, so an error in one mechanism
shows as one family off, not as noise over all of them.
"""

from __future__ import annotations

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
        folder: Path = DATA) -> Calibration:
    """`npusim calibrate` of `hw` on every measured row of `folder`."""
    return calibrate(measured_files(folder), hw, fields, folds)


def _pct(pair: tuple[float, float]) -> str:
    return "  ".join("    -" if np.isnan(x) else f"{100 * x:4.0f}%" for x in pair)


def table(cal: Calibration) -> str:
    """Per family: rows, median and max error as shipped, fitted and held out."""
    lines = [f"{'family':20s} {'rows':>4s}   {'shipped':^11s}   {'fitted':^11s}   {'held out':^11s}",
             f"{'':20s} {'':>4s}   {'med    max':^11s}   {'med    max':^11s}   {'med    max':^11s}"]
    for f in by_family(cal):
        lines.append(f"{f.family:20s} {f.rows:4d}   {_pct(f.before)}   {_pct(f.after)}   {_pct(f.held_out)}")
    return "\n".join(lines)
