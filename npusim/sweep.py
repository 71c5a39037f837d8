"""Hardware what-if sweeps: one decoder step simulated at every point of a grid.

    rows = sweep("k3", {"hbm.peak_bw_bytes_per_s": [1.2e12, 1.6e12, 2.4e12], "chip.aic_count": [20, 24, 32]},
                 phase="decode", batch=8, context=4096, passes="optimized")
    write_csv(rows, "out/sweep.csv"); plot(rows, "out")

A grid maps a key to its values; its points are the cartesian product, the first
key varying slowest. A key is a hardware field (`hbm.peak_bw_bytes_per_s`, as
`--set` takes it) or a step knob (`batch`, `context`). `grid` may also be a list
of grids: their points one after another (a 12-point grid plus one odd point).

Points run on a backend (npusim.backends): this machine's worker processes
(npusim.pool), or Ray tasks on a cluster; one step each, independent. A point
that fails (an out-of-memory step, a tiling that no longer fits, a worker that
died) gets its error in its row and the others still run. Rows come back in grid
order whatever order the workers finish in, so the CSV is deterministic. Ctrl-C
(or SIGTERM under the CLI) stops the workers at once and raises SweepInterrupted
carrying the rows finished so far. With `out`, the CSV grows as points finish
and a sweep can be resumed (npusim.sweep_csv).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from npusim.backends import Backend, get_backend
from npusim.errors import ConfigError
from npusim.outputs import Terminated
from npusim.pool import one_line
from npusim.progress import Progress
from npusim.sweep_csv import METRICS, STATUS_OK, Journal, columns, content_digest, param_names, write_csv

STEP_KNOBS = ("batch", "context")  # grid keys that are step parameters, not hardware fields
# the most points one sweep takes: a K3 point is seconds of CPU, so more is hours even on a cluster's
# cores (and 20,000 values in one --set were minutes of checking before the first point ran)
MAX_POINTS = 4096
GB, GIB = 1e9, 1 << 30

Grid = Mapping[str, Sequence[Any]]


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, under the CLI) during a sweep: `rows` are the points
    finished so far, in grid order; `status` the exit status the CLI gives (130, 143)."""

    def __init__(self, rows: list[dict], total: int, status: int = 130):
        super().__init__(f"sweep interrupted after {len(rows)} of {total} points")
        self.rows = rows
        self.total = total
        self.status = status


# ---- the grid


def parse_values(item: str) -> tuple[str, list]:
    """'key.path=v1,v2,...' (the CLI's --set in a sweep) -> (key, [v1, v2, ...]),
    each value read as a YAML scalar (1.6e12 is a number, 24 an integer). The list may be
    enclosed in brackets, as `npusim op`'s tuples may: [v1,v2] or (v1,v2)."""
    from npusim.hw.load import parse_yaml
    from npusim.hw.parse import unbracketed

    key, eq, text = item.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ConfigError(f"--set {item}: expected key.path=value[,value...]")
    try:
        raws = unbracketed(text).split(",")
    except ValueError:
        raise ConfigError(f"--set {key}: '{text[:80]}' has a bracket not closed or not opened (expected v1,v2,... "
                          "or [v1,v2,...])") from None
    if len(raws) > MAX_POINTS:
        raise ConfigError(f"--set {key}: {len(raws)} values, more than the {MAX_POINTS} points a sweep takes "
                          "(split it over several sweeps)")
    values, seen = [], set()
    for i, raw in enumerate(raws):
        if not raw.strip():
            raise ConfigError(f"--set {key}: value {i + 1} of '{text[:80]}' is empty (expected v1,v2,...)")
        value = parse_yaml(raw.strip(), f"--set {key}")
        if isinstance(value, (list, dict)) or value is None:
            raise ConfigError(f"--set {key}: value '{raw.strip()}' is not a number or a word")
        if value in seen:  # the same point twice: two rows of one result (1, 1.0 and true are one value)
            raise ConfigError(f"--set {key}: value {value!r} given twice in '{text[:80]}'")
        seen.add(value)
        values.append(value)
    return key, values


def parse_grid(items: Sequence[str] | None) -> dict[str, list]:
    """The CLI's --set items -> a grid; a key given twice is an error."""
    grid: dict[str, list] = {}
    for item in items or []:
        key, values = parse_values(item)
        if key in grid:
            raise ConfigError(f"--set {key}: given twice (put every value in one list: {key}=v1,v2,...)")
        grid[key] = values
    check_size(grid)
    return grid


def count_points(grid: Grid | Sequence[Grid]) -> int:
    """How many points the grid (or grids) has, without listing them."""
    return sum(math.prod(len(v) for v in g.values()) for g in _grids(grid))


def check_size(grid: Grid | Sequence[Grid]) -> None:
    """Refuse a grid of more than MAX_POINTS points, naming each key's count."""
    n = count_points(grid)
    if n > MAX_POINTS:
        counts = "; ".join(" x ".join(f"{k} {len(v)}" for k, v in g.items()) for g in _grids(grid))
        raise ConfigError(f"--set: {n:,} points ({counts[:200]} values), more than the {MAX_POINTS} a sweep takes "
                          "(split it over several sweeps)")


def _grids(grid: Grid | Sequence[Grid]) -> list[Grid]:
    return [grid] if isinstance(grid, Mapping) else list(grid)


def points(grid: Grid | Sequence[Grid]) -> list[dict]:
    """Every point of the grid (or of each grid, one after another), first key slowest."""
    out = []
    for g in _grids(grid):
        keys = list(g)
        out += [dict(zip(keys, combo)) for combo in itertools.product(*(list(g[k]) for k in keys))]
    return out


def params_of(grid: Grid | Sequence[Grid]) -> list[str]:
    """The grid's keys, in order of first appearance: the CSV's leading columns."""
    return list(dict.fromkeys(k for g in _grids(grid) for k in g))


def check_grid(grid: Grid | Sequence[Grid], hw: str) -> None:
    """Every key and value is valid on its own (each hardware value loads; each step
    knob is a positive integer), so that a typo is one error before anything runs,
    not a failed row per point."""
    from npusim.hw import load_hw

    for g in _grids(grid):
        for key, values in g.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise ConfigError(f"--set {key}: expected a non-empty list of values, got {values!r}")
    check_size(grid)  # before each value is loaded: that alone took minutes for 20,000
    for g in _grids(grid):
        for key, values in g.items():
            for v in values:
                if key in STEP_KNOBS:
                    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                        raise ConfigError(f"--set {key}={v}: expected a positive integer")
                else:
                    load_hw(hw, {key: v})


def check_step(workload, grid: Grid | Sequence[Grid], step: Mapping[str, Any]) -> None:
    """What every point shares - the parallel plan, the fusion rules, and --batch and
    --context where the grid does not sweep them - checked against the workload before
    anything runs: a flag no point can take is one error, not a failed row per point.
    (What a point's hardware decides - memory, a plan's topology - stays that point's.)"""
    from npusim.graph.build import check_sp, step_lengths
    from npusim.parallel.plan import Plan, check_plan_shape

    for key in ("pp", "microbatches"):
        if key in step:
            raise ConfigError(f"--{key}: a pipelined step is run by `npusim run`, not swept")
    plan = check_plan_shape(Plan(step.get("tp", 1), step.get("sp", 1), step.get("devices"), step.get("ep", 1)),
                            workload)
    if step.get("fusion_rules") is not None:
        from npusim.passes.fusion import load_rules

        load_rules(step["fusion_rules"])
    shapes = list(dict.fromkeys(tuple(_split(p)[0].items()) for p in points(grid)))  # distinct (batch, context)
    errors = []
    for knobs in shapes:
        s = dict(step) | dict(knobs)
        try:
            check_sp(workload, s["phase"], step_lengths(workload, s["phase"], s["batch"], s.get("context")), plan.sp)
        except ConfigError as e:
            errors.append(e)
    if shapes and len(errors) == len(shapes):  # some shapes fit the workload: the others fail as their points
        raise errors[0]


# ---- one point


def _split(params: Mapping[str, Any]) -> tuple[dict, dict]:
    """(step knobs, hardware overrides) of a point."""
    knobs = {k: v for k, v in params.items() if k in STEP_KNOBS}
    return knobs, {k: v for k, v in params.items() if k not in STEP_KNOBS}


def run_point(spec: Mapping[str, Any], params: Mapping[str, Any]) -> dict:
    """One row: the point's parameters, the step's figures and status "ok" - or, if
    the step fails, empty figures and the error in one line as its status."""
    from npusim.runtime.decoder import run_decoder

    knobs, overrides = _split(params)
    step = dict(spec["step"]) | knobs
    overrides = dict(spec["overrides"]) | overrides
    row: dict[str, Any] = dict(params)
    try:
        run = run_decoder(spec["workload"], spec["hw"], overrides=overrides, **step)
    except Exception as e:  # noqa: BLE001 - NpusimError is the expected failure; any other is reported, not lost
        return row | dict.fromkeys(METRICS) | {"status": one_line(e)}
    s = run.result.stats
    return row | {
        "latency_us": run.latency_us,
        "tokens_per_s": run.tokens_per_s,
        "hbm_read_bytes": s.hbm_read_bytes,
        "hbm_write_bytes": s.hbm_write_bytes,
        "l2_hit_rate": s.l2_hit_rate,
        "peak_memory_bytes": run.memory.total_bytes,
        "kernel_count": len(run.result.kernels),
        "status": STATUS_OK,
    }


# ---- the sweep


def sweep(workload, grid: Grid | Sequence[Grid], hw: str = "ascend910b2", phase: str = "decode", batch: int = 1,
          context=None, passes: str | Sequence[str] = "optimized", jobs: int | None = None, *,
          overrides: Mapping[str, Any] | None = None, memo: bool = True, progress: Progress | None = None,
          backend: str | Backend = "local", address: str | None = None, out: str | Path | None = None,
          resume: bool = False, **options) -> list[dict]:
    """Simulate one step of `workload` at every point of `grid` (see the module doc)
    and return one row per point, in grid order: the point's parameters, METRICS
    and "status" ("ok" or the error). `batch`, `context`, `passes`, `overrides` (fixed
    hardware overrides) and `options` (pass options: fusion_rules, kv_layout) hold for
    every point unless the grid sets them. `backend`: where the points run
    (npusim.backends: "local", the default, or "ray" at `address`); `jobs`: its
    workers (default one per CPU; local with 1 runs in this process).
    `progress(done, total, failed)` is called after each point. `out`: a folder in
    which sweep.csv grows as points finish (npusim.sweep_csv); with `resume`, the
    points an earlier run of the same settings left there are not run again."""
    check_grid(grid, hw)
    from npusim.hw import load_hw

    hw_config = load_hw(hw, overrides or {})
    if isinstance(workload, str):
        from npusim.workload import load_workload

        loaded = load_workload(workload)  # a bad name: one error, before the pool starts
    else:
        loaded = workload
    check_step(loaded, grid, dict(phase=phase, batch=batch, context=context, **options))
    if isinstance(backend, str):
        backend = get_backend(backend, jobs, address)
    spec = {"workload": workload, "hw": hw, "overrides": dict(overrides or {}),
            "step": dict(phase=phase, batch=batch, context=context, passes=passes, memo=memo,
                         **{k: v for k, v in options.items() if v is not None})}
    every = points(grid)
    journal = None
    if out is not None:
        # where results are cached and which counters are kept do not change a row
        step = {k: v for k, v in spec["step"].items() if k not in ("store", "counters")}
        settings = spec | {"step": step, "grid": _grids(grid), "hw_content": content_digest(hw_config),
                           "workload_content": content_digest(loaded), "npusim": _version()}
        journal = Journal(out, every, params_of(grid), settings, resume)
    done: dict[int, dict] = dict(journal.earlier) if journal else {}
    todo = [i for i in range(len(every)) if i not in done]
    progress = progress or (lambda *_: None)
    progress(len(done), len(every), _failed(done))

    def finished(index: int, row: dict) -> None:
        done[index] = row
        if journal:
            journal.add(row)
        progress(len(done), len(every), _failed(done))

    def lost(index: int, reason: str) -> None:
        finished(index, dict(every[index]) | dict.fromkeys(METRICS) | {"status": reason})

    try:
        backend.run(_run_point, [(spec, every[i]) for i in todo], lambda k, row: finished(todo[k], row),
                    lambda k, reason: lost(todo[k], reason))
        rows = [done[i] for i in range(len(every))]
        if journal:  # interrupted while the CSV is put in grid order: the rows are all there all the same
            journal.finish(rows)
    except (KeyboardInterrupt, Terminated) as e:
        status = 143 if isinstance(e, Terminated) else 130
        rows = [done[i] for i in sorted(done)]
        if journal:
            journal.finish(rows)
        raise SweepInterrupted(rows, len(every), status) from None
    finally:
        if journal:
            journal.close()
    return rows


def _failed(rows: Mapping[int, dict]) -> int:
    return sum(r["status"] != STATUS_OK for r in rows.values())


def _version() -> str:
    from npusim import __version__

    return __version__


def _run_point(spec, params) -> dict:
    """run_point as the module holds it when the worker runs (tests replace it)."""
    return run_point(spec, params)


# ---- outputs


def swept(rows: Sequence[dict], params: Sequence[str]) -> list[str]:
    """The parameters that take more than one value: the plot's x axes."""
    return [p for p in params if len({repr(r[p]) for r in rows if r.get(p) is not None}) > 1]


def plot(rows: Sequence[dict], out_dir: str | Path, params: Sequence[str] | None = None, title: str = "",
         name: str = "sweep") -> list[Path]:
    """Latency and tokens/s against each swept parameter (npusim.report.plots.sweep_curves)."""
    from npusim.report.plots import sweep_curves

    params = param_names(rows, params)
    return sweep_curves(rows, swept(rows, params) or params[:1], out_dir, name, title)


def table(rows: Sequence[dict], params: Sequence[str] | None = None) -> str:
    """The rows as a console table: parameters, latency, tokens/s, HBM traffic, peak memory, status."""
    params = param_names(rows, params)
    head = [*params, "latency (us)", "tokens/s", "HBM (GB)", "peak (GiB)", "kernels", "status"]
    body = []
    for r in rows:
        ok = r["status"] == STATUS_OK
        figures = ([f"{r['latency_us']:,.1f}", f"{r['tokens_per_s']:,.1f}",
                    f"{(r['hbm_read_bytes'] + r['hbm_write_bytes']) / GB:.3f}",
                    f"{r['peak_memory_bytes'] / GIB:.2f}", str(r["kernel_count"])] if ok else ["-"] * 5)
        body.append([_cell(r.get(p)) for p in params] + figures + [r["status"]])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head[:-1], widths)) + "  status"]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b[:-1], widths)) + "  " + b[-1] for b in body]
    return "\n".join(lines)


def _cell(v) -> str:
    return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


__all__ = ["MAX_POINTS", "METRICS", "STEP_KNOBS", "SweepInterrupted", "check_grid", "check_size", "check_step",
           "columns", "count_points", "params_of", "parse_grid", "parse_values", "plot", "points", "run_point", "sweep",
           "swept", "table", "write_csv"]
