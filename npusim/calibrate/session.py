"""One calibration, end to end: read the measurements (msprof op_summary rows, hccl_test
rows, or both), map their rows, choose the fields the ops identify, fit them on every
row, and cross-validate so the error reported is on ops the fit never saw. Returns a
Calibration record; report.py and write.py turn it into text, JSON, a plot and a
config file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from attrs import frozen

from npusim.calibrate import fit
from npusim.calibrate.fields import fittable_fields, value_of
from npusim.calibrate.hccl import HcclRow, map_hccl, read_hccl
from npusim.calibrate.model import Model
from npusim.calibrate.opmap import Mapped, Unmappable, map_row
from npusim.calibrate.profile import ProfileError, ProfileRow, read_profile
from npusim.calibrate.timing import KERNELS
from npusim.errors import ConfigError
from npusim.hw import HwConfig, load_hw
from npusim.hw.load import find_file
from npusim.hw.parse import clipped, did_you_mean

DEFAULT_FOLDS = 5
MAX_REASON_CHARS = 300  # of a row's reason for not being simulated, as the report shows it


@frozen
class Unmapped:
    """Rows of one CANN op type that were not simulated, and why (the first reason seen)."""

    op_type: str
    count: int
    reason: str
    where: str  # the first such row


@frozen
class FieldFit:
    field: str
    before: float
    after: float
    rows: int  # rows whose ops the field moves (by MIN_EFFECT for a 20% change)
    op_types: tuple[str, ...]  # their CANN op types
    error_before: float  # median |error| on those rows, base config
    error_after: float  # ... fitted config

    @property
    def change(self) -> float:
        return self.after / self.before - 1 if self.before else math.inf


@frozen
class Calibration:
    sources: tuple[str, ...]  # the op_summary profile and the hccl_test files, as given
    hw_ref: str  # --hw as given: a name or a path
    hw_path: Path
    base: HwConfig
    rows_read: int
    mapped: tuple[Mapped, ...]
    unmapped: tuple[Unmapped, ...]
    fields: tuple[FieldFit, ...]
    excluded: tuple[fit.Excluded, ...]
    measured_us: np.ndarray  # per mapped row
    before_us: np.ndarray
    after_us: np.ndarray
    held_out_us: np.ndarray  # NaN where no held-out prediction exists
    folds: int
    simulations: int

    @property
    def profile(self) -> str:
        """The measurements, as the report names them."""
        return ", ".join(self.sources)

    def overrides(self) -> dict:
        return {f.field: f.after for f in self.fields}


def map_rows(rows: Sequence[ProfileRow | HcclRow], model: Model) -> tuple[list[Mapped], list[Unmapped]]:
    """The rows that map to simulated ops, and the rest grouped by op type with the reason
    (a row whose op does not simulate on the config, too). The ops are simulated on the
    base config (in model.jobs workers) and remembered."""
    read, bad = [], {}
    for row in rows:
        try:
            read.append(map_row(row) if isinstance(row, ProfileRow) else map_hccl(row, model.base))
        except Unmappable as e:
            read.append((row, str(e)))
    failures = model.failures(list(dict.fromkeys(m.key for m in read if isinstance(m, Mapped))))
    mapped = []
    for m in read:
        if not isinstance(m, Mapped):
            row, why = m
        elif m.key in failures:
            row, why = m.row, f"{m.op} does not simulate on {model.base.name}: {failures[m.key]}"
        else:
            mapped.append(m)
            continue
        # a reason quotes the row's cells (its shapes, dtypes, task type): thousands of characters
        count, reason, where = bad.get(row.op_type, (0, clipped(why, MAX_REASON_CHARS), row.where))
        bad[row.op_type] = (count + 1, reason, where)
    unmapped = [Unmapped(t, *v) for t, v in sorted(bad.items(), key=lambda kv: (-kv[1][0], kv[0]))]
    return mapped, unmapped


HcclInput = str | Path | tuple[str | Path, Mapping[str, str]]  # a file, or a file and its options (hccl.OPTIONS)
Profiles = str | Path | Sequence[str | Path] | None  # an op_summary CSV or folder, or several


def read_measurements(profile: Profiles, hccl: Sequence[HcclInput]) -> tuple[list, tuple[str, ...]]:
    """The measured rows of the op_summary profiles and the hccl_test files, and how the
    report names them."""
    profiles = [] if profile is None else [profile] if isinstance(profile, (str, Path)) else list(profile)
    if not profiles and not hccl:
        raise ConfigError("calibrate: nothing to fit: give --profile (msprof's op_summary) and/or --hccl "
                          "(hccl_test's output)")
    rows = [r for p in profiles for r in read_profile(p)]
    names = [str(p) for p in profiles]
    for item in hccl:
        path, options = (item, {}) if isinstance(item, (str, Path)) else item
        rows += read_hccl(path, options)
        names.append(str(path))
    return rows, tuple(names)


def calibrate(profile: Profiles = None, hw: str | Path = "ascend910b2", fields: Sequence[str] | None = None,
              folds: int = DEFAULT_FOLDS, hccl: Sequence[HcclInput] = (), jobs: int = 1) -> Calibration:
    """Fit the assumed fields of `hw` (all of them the measurements identify, or only
    `fields`) to the measured op times of `profile` (op_summary CSVs or folders)
    and of `hccl` (hccl_test output files), together; the ops simulated in `jobs`
    worker processes (the result does not depend on it)."""
    rows, sources = read_measurements(profile, hccl)
    hw_path = find_file(hw, "hwconfigs")
    base = load_hw(hw_path)
    fittable = fittable_fields(hw_path, host=True)
    for f in fields or ():
        if f not in fittable:
            sections = ", ".join(sorted({x.split(".")[0] for x in fittable}))  # all 55 were a 2,800-character line
            raise ConfigError(f"--fields {f}: not a field {hw} marks \"assumed\" with a cost unit"
                              f"{did_you_mean(f, fittable)} ({len(fittable)} fittable, in {sections}: "
                              f"{', '.join(list(fittable)[:3])}, ...)")
    mapping = Model(base, (), jobs)
    mapped, unmapped = map_rows(rows, mapping)
    # host-side costs are in a row's time only if it was timed around host calls
    if not any(m.timing != KERNELS for m in mapped):
        fittable = fittable_fields(hw_path)
        for f in fields or ():
            if f not in fittable:
                raise ConfigError(f"--fields {f}: a host-side cost, and no row of the measurements was timed "
                                  "around host calls (only kernel times)")
    candidates = list(fields or fittable)
    model = mapping.with_fields(candidates)
    if not mapped:
        by_reason: dict[str, list[str]] = {}  # op types sharing a reason are listed once (it can be long)
        for u in unmapped[:3]:
            by_reason.setdefault(u.reason, []).append(f"{clipped(u.op_type)} x{u.count}")
        listed = "; ".join(f"{', '.join(types)} ({reason})" for reason, types in by_reason.items())
        first = next(r for r in rows if r.where == unmapped[0].where)
        column = ", column 'OP Type'" if isinstance(first, ProfileRow) else ""  # an hccl row: the reason says why
        raise ProfileError(f"{', '.join(sources)}: none of its {len(rows)} rows maps to an npusim op ({listed}); "
                           f"first at {unmapped[0].where}{column}")
    keys = list(dict.fromkeys(m.key for m in mapped))
    index = {k: i for i, k in enumerate(keys)}
    row_key = np.array([index[m.key] for m in mapped])
    measured = np.array([m.row.duration_us for m in mapped])
    log_measured = np.log(measured)

    theta0 = np.zeros(len(candidates))
    f0 = model.log_times(theta0, keys)
    J_all = fit.jacobian(model, theta0, keys, f0)
    weights = np.bincount(row_key, minlength=len(keys)).astype(float)
    first_name: dict = {}
    for m in mapped:
        first_name.setdefault(m.key, m.row.op_name)
    labels = [first_name[key] for key in keys]
    kept, excluded = fit.select_fields(model, J_all, weights, labels)
    fitted = model.with_fields([candidates[j] for j in kept])
    J0 = J_all[:, kept]
    k = min(folds, len(keys))
    held, start = np.full(len(mapped), np.nan), None
    if kept and k >= 2:
        residual, start = fit.cross_validate(fitted, keys, row_key, log_measured, J0, k)
        held = np.exp(residual + log_measured)
    # the fit on every row starts where the folds' fits ended on average (it sees their
    # rows and more, so this leaks nothing into the held-out error above)
    theta = fit.solve(fitted, keys, row_key, log_measured, J0, start) if kept else np.zeros(0)
    before = np.exp(f0[row_key])
    after = np.exp(fitted.log_times(theta, keys)[row_key])
    values = fitted.values(theta)
    fits = []
    for pos, j in enumerate(kept):
        moved = np.abs(J_all[:, j]) * fit.STEP >= fit.MIN_EFFECT
        rows_j = moved[row_key]
        types = tuple(sorted({m.row.op_type for m, r in zip(mapped, rows_j) if r}))
        fits.append(FieldFit(candidates[j], value_of(base, candidates[j]), values[pos], int(rows_j.sum()), types,
                             float(np.median(np.abs(before[rows_j] / measured[rows_j] - 1))),
                             float(np.median(np.abs(after[rows_j] / measured[rows_j] - 1)))))
    return Calibration(sources, str(hw), hw_path, base, len(rows), tuple(mapped), tuple(unmapped), tuple(fits),
                       tuple(excluded), measured, before, after, held, k if kept else 0, model.simulations)
