"""A calibration as text, as JSON (the same figures) and as a predicted-vs-measured plot.

Errors are |simulated / measured - 1| per measured row: before (the base config),
after (the fitted config, on every row: in-sample) and held-out (each row predicted
by the fit of the folds that did not contain its op).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npusim.calibrate.session import Calibration
from npusim.hw.parse import clipped


def _errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted / measured - 1)


def _stats(e: np.ndarray) -> dict:
    e = e[np.isfinite(e)]
    if not len(e):
        return {"median": None, "max": None}
    return {"median": float(np.median(e)), "max": float(np.max(e))}


def by_op_type(cal: Calibration) -> dict[str, dict]:
    """CANN op type -> rows and error stats before, after and held out, most rows first."""
    types = np.array([m.row.op_type for m in cal.mapped])
    out = {}
    for t in sorted(set(types), key=lambda t: (-int(np.sum(types == t)), t)):
        sel = types == t
        out[t] = {"rows": int(sel.sum())} | {
            name: _stats(_errors(pred[sel], cal.measured_us[sel]))
            for name, pred in (("before", cal.before_us), ("after", cal.after_us), ("held_out", cal.held_out_us))}
    return out


def overall(cal: Calibration) -> dict:
    return {name: _stats(_errors(pred, cal.measured_us))
            for name, pred in (("before", cal.before_us), ("after", cal.after_us), ("held_out", cal.held_out_us))}


def to_json(cal: Calibration) -> dict:
    return {
        "profile": cal.profile, "hw": cal.hw_ref, "rows_read": cal.rows_read, "rows_mapped": len(cal.mapped),
        "distinct_ops": len({m.key for m in cal.mapped}), "folds": cal.folds, "simulations": cal.simulations,
        "unmapped": [{"op_type": u.op_type, "rows": u.count, "reason": u.reason, "first": u.where}
                     for u in cal.unmapped],
        "fields": [{"field": f.field, "before": f.before, "after": f.after, "change": f.change, "rows": f.rows,
                    "op_types": list(f.op_types), "median_error_before": f.error_before,
                    "median_error_after": f.error_after} for f in cal.fields],
        "not_fitted": [{"field": e.field, "reason": e.reason} for e in cal.excluded],
        "error": overall(cal), "by_op_type": by_op_type(cal),
        "rows": [{"file": m.row.file, "row": m.row.line, "op_name": m.row.op_name, "op_type": m.row.op_type,
                  "npusim_op": m.op, "measured_us": float(meas), "before_us": float(b), "after_us": float(a),
                  "held_out_us": None if np.isnan(h) else float(h)}
                 for m, meas, b, a, h in zip(cal.mapped, cal.measured_us, cal.before_us, cal.after_us,
                                             cal.held_out_us)],
    }


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summary(cal: Calibration, out: str | None = None) -> str:
    n_unmapped = sum(u.count for u in cal.unmapped)
    distinct = len({m.key for m in cal.mapped})
    lines = [f"calibrated {cal.hw_ref} on {cal.profile}: {cal.rows_read} rows read, {len(cal.mapped)} mapped to "
             f"{distinct} distinct ops, {n_unmapped} not simulated"]
    for u in cal.unmapped:
        lines.append(f"  not simulated  {clipped(u.op_type)} x{u.count}: {u.reason} (first: {u.where})")
    if cal.fields:
        lines.append(f"  fitted         {len(cal.fields)} assumed field(s); held-out error from {cal.folds}-fold "
                     "cross-validation over distinct ops")
        width = max(len(f.field) for f in cal.fields)
        for f in cal.fields:
            lines.append(f"    {f.field:{width}s}  {f.before:g} -> {f.after:g} ({100 * f.change:+.1f}%)  "
                         f"{f.rows} rows; their median error {_pct(f.error_before)} -> {_pct(f.error_after)}")
    else:
        lines.append("  fitted         no field: none of the assumed fields moves these ops measurably")
    for e in cal.excluded:
        lines.append(f"  not fitted     {e.field}: {e.reason}")
    o = overall(cal)
    lines.append(f"  op time error  before median {_pct(o['before']['median'])} max {_pct(o['before']['max'])}; "
                 f"after median {_pct(o['after']['median'])} max {_pct(o['after']['max'])}; "
                 f"held-out median {_pct(o['held_out']['median'])} max {_pct(o['held_out']['max'])}")
    table = by_op_type(cal)
    width = max([len(t) for t in table] + [len("OP Type")])
    lines.append(f"  {'OP Type':{width}s} {'Rows':>5s} {'before med':>11s} {'max':>7s} {'after med':>10s} "
                 f"{'max':>7s} {'held-out med':>13s} {'max':>7s}")
    for t, s in table.items():
        lines.append(f"  {t:{width}s} {s['rows']:5d} {_pct(s['before']['median']):>11s} {_pct(s['before']['max']):>7s} "
                     f"{_pct(s['after']['median']):>10s} {_pct(s['after']['max']):>7s} "
                     f"{_pct(s['held_out']['median']):>13s} {_pct(s['held_out']['max']):>7s}")
    return "\n".join(lines)


def plot(cal: Calibration, out_dir: str | Path) -> list[Path]:
    """calibration.png/.svg: simulated against measured time per row, log-log, before
    and after the fit and held out, with the diagonal where they agree."""
    from matplotlib.figure import Figure

    from npusim.report.plots import _save

    fig = Figure(figsize=(6, 6))
    ax = fig.add_subplot()
    m = cal.measured_us
    for name, pred, style in (("base config", cal.before_us, dict(color="0.6", marker="x")),
                              ("fitted (all rows)", cal.after_us, dict(color="tab:blue", marker="o")),
                              ("held out", cal.held_out_us, dict(color="tab:orange", marker="+"))):
        ok = np.isfinite(pred)
        if ok.any():
            ax.scatter(m[ok], pred[ok], s=18, label=name, linewidths=1, **style)
    lo, hi = float(np.min(m)) / 1.5, float(np.max(m)) * 1.5
    ax.plot([lo, hi], [lo, hi], color="k", linewidth=0.8, label="simulated = measured")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured Task Duration (us)",
           ylabel="simulated (us)", title=f"{cal.hw_ref} calibrated on {', '.join(Path(x).name for x in cal.sources)}")
    ax.legend()
    return _save(fig, out_dir, "calibration")
