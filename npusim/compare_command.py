"""`npusim compare`: one step under several pipelines side by side, or one pipeline on
two configs, what-ifs or fusion-rules files, or under several parallel plans; the
table, and the JSON, traces and plots asked for."""

from __future__ import annotations

import os

from npusim.diskcache.command import store_of
from npusim.hw.parse import first_repeated
from npusim.outputs import all_or_none, plots_line, say, say_all, write_json, wrote_line
from npusim.parallel.flags import plan_args
from npusim.step_flags import check_outputs, inputs, pipeline, step_args, workload_of

COMPARED_PIPELINES = ("baseline", "optimized")  # what compare puts side by side unless told
# the files --plot DIR holds (report.plots, parallel.plots: each plot as NAME.png and NAME.svg)
PLOT_NAMES = ("before_after.png", "before_after.svg", "waterfall.png", "waterfall.svg")
PLANS_PLOT_NAMES = ("plan_scaling.png", "plan_scaling.svg")


def _trace_paths(path: str, names, ab: bool = False) -> dict[str, str]:
    """compare --trace PATH: one trace per pipeline, PATH with the pipeline's name
    before the suffix (trace.json -> trace.baseline.json, trace.fusion+memplan.json);
    ab=True: per side, A then B (trace.A.json, trace.B.json)."""
    stem, suffix = os.path.splitext(path)
    tags = ("A", "B") if ab else [n.replace(",", "+") for n in names]
    return {n: f"{stem}.{tag}{suffix or '.json'}" for n, tag in zip(names, tags)}


def cmd_compare(args) -> int:
    """`npusim compare`: pipelines, configs, what-ifs or fusion rules side by side; plans with --plans."""
    from npusim.errors import ConfigError
    from npusim.progress import progress_bar
    from npusim.report.contract import provenance
    from npusim.report.step import comparison_table
    from npusim.runtime.decoder import compare
    from npusim.step_flags import sides as sides_of

    sides = sides_of(args)  # None: pipelines side by side
    if args.plans:
        if sides:
            raise ConfigError(f"--plans: compares plans on one config and one set of pass options; drop "
                              f"{'--variant' if args.variant else 'the second --hw or --fusion-rules'}")
        return _cmd_compare_plans(args)
    if sides and args.passes and len(args.passes) > 1:
        raise ConfigError(f"--passes {' '.join(args.passes)}: comparing {' and '.join(sides)} runs ONE pipeline "
                          f"(e.g. --passes {args.passes[-1]})")
    args.passes = args.passes or (["optimized"] if sides else list(COMPARED_PIPELINES))
    pipelines = [pipeline(p) for p in args.passes]
    _check_distinct(args.passes, pipelines)
    traces = _trace_paths(args.trace, list(sides) if sides else pipelines, sides is not None) if args.trace else {}
    check_outputs(args, {f"--trace ({n})": p for n, p in traces.items()}, PLOT_NAMES)
    step = step_args(args)
    with progress_bar("compare", "runs", args.progress) as bar:
        c = compare(workload_of(args), args.hw if isinstance(args.hw, str) else args.hw[0], pipelines=pipelines,
                    memo=not args.no_memo, progress=bar, store=store_of(args), counters=bool(traces), sides=sides,
                    **step)
    say(comparison_table(c, overrides=step["overrides"]))
    where = inputs(args)["--workload"]
    metas = {n: provenance(args.argv, r.hw, step["overrides"] | (sides or {}).get(n, {}).get("overrides", {}),
                           args.workload, where) for n, r in c.runs.items()}  # each side's config
    meta = next(iter(metas.values()))
    written = []
    with all_or_none():  # an interruption or a failure between two outputs leaves none of them
        if args.json:
            write_json(args.json, _compare_json(c, sides) | {"provenance": meta})
            written.append(wrote_line([args.json]))
        written += _write_traces(c.runs, traces, meta, "side" if sides else "pipeline", metas)
        if args.plot:
            from npusim.report import plots

            paths = plots.before_after(c, args.plot) + (plots.waterfall(c, args.plot) if c.steps else [])
            written.append(plots_line(args.plot, paths))
    say_all(written)
    return 0


def _check_distinct(passes: list[str], pipelines: list[str]) -> None:
    """Refuse two pipelines that run the same passes (passes run in one order, whatever
    the order named): one step run once, shown as two columns of +0.00."""
    from npusim.errors import ConfigError
    from npusim.passes import pass_names

    runs = [pass_names(p) for p in pipelines]
    twice = first_repeated(runs)
    if twice is None:
        return
    a, b = [p for p, run in zip(pipelines, runs) if run == twice][:2]
    if a == b:
        raise ConfigError(f"--passes {' '.join(passes)}: the pipeline {a} is given twice")
    raise ConfigError(f"--passes {' '.join(passes)}: {a} and {b} run the same passes "
                      f"({', '.join(twice) or 'none'}, in the order they run), nothing to compare")


def _compare_json(c, sides: dict | None) -> dict:
    """compare --json: every run (and every pass-by-pass step), and, without steps,
    the kernels of the first run (A) and the last (B) matched (report.ab); with sides,
    what each side changed and its config's hash."""
    from npusim.report.ab import ab_json
    from npusim.report.contract import config_hash
    from npusim.report.step import step_json

    out = {"runs": {k: step_json(r) for k, r in c.runs.items()}, "steps": {k: step_json(r) for k, r in c.steps.items()}}
    names = list(c.runs)
    if not c.steps and len(names) > 1:
        out["ab"] = {"a": names[0], "b": names[-1]} | ab_json(c.runs[names[0]], c.runs[names[-1]])
    if sides:
        import attrs

        out["sides"] = {name: {k: str(v) if k != "overrides" else dict(v) for k, v in side.items()}
                        | {"hw_name": c.runs[name].hw.name,
                           "hw_config_sha256": config_hash(attrs.asdict(c.runs[name].hw))}
                        for name, side in sides.items()}
    return out


def _write_traces(runs: dict, paths: dict[str, str], meta: dict, key: str, metas: dict | None = None) -> list[str]:
    """compare --trace: the trace of each run named in `paths` (a process group per device
    under a plan) into its path, `meta` (or its own in `metas`, by name) and {key: its name}
    as its metadata; the line naming them (none if there are none)."""
    from npusim.parallel.trace import run_trace
    from npusim.report.step import memory_timeline
    from npusim.report.trace import write_trace

    written = {name: path for name, path in paths.items() if name in runs}
    for name, path in written.items():
        write_trace(run_trace(runs[name], memory_timeline(runs[name])), path,
                    metadata=(metas or {}).get(name, meta) | {key: name})
    return ["traces: " + ", ".join(written.values())] if written else []


def _cmd_compare_plans(args) -> int:
    """`compare --plans tp1 tp2 tp4`: one step under each plan (npusim.parallel.compare)."""
    from npusim.errors import ConfigError
    from npusim.parallel.compare import compare_plans, parse_plans, plans_json, plans_table
    from npusim.progress import progress_bar
    from npusim.report.contract import provenance
    from npusim.report.step import step_title

    passes = args.passes or ["optimized"]
    if len(passes) > 1:
        raise ConfigError(f"--passes {' '.join(passes)}: --plans compares plans under ONE pipeline (e.g. --passes "
                          f"{passes[-1]}); to compare pipelines under one plan: --tp N --passes {' '.join(passes)}")
    args.passes = pipeline(passes[0])
    for flag in ("tp", "sp", "ep", "devices"):
        if flag in plan_args(args):
            raise ConfigError(f"--{flag}: with --plans each plan gives its own degrees (tp2,sp2; tp2,ep8); "
                              f"drop --{flag}")
    names = list(parse_plans(args.plans))
    traces = _trace_paths(args.trace, names) if args.trace else {}
    check_outputs(args, {f"--trace ({n})": p for n, p in traces.items()}, PLANS_PLOT_NAMES)
    step = step_args(args)
    with progress_bar("compare", "runs", args.progress) as bar:
        c = compare_plans(workload_of(args), args.hw, passes=args.passes, plans=args.plans, memo=not args.no_memo,
                          progress=bar, store=store_of(args), counters=bool(traces), **step)
    say(plans_table(c, overrides=step["overrides"]))
    first = next(iter(c.fitted.values()))
    meta = provenance(args.argv, first.hw, step["overrides"], args.workload, inputs(args)["--workload"])
    written = []
    with all_or_none():  # an interruption or a failure between two outputs leaves none of them
        if args.json:
            write_json(args.json, plans_json(c) | {"provenance": meta})
            written.append(wrote_line([args.json]))
        written += _write_traces(c.fitted, traces, meta, "plan")
        if args.plot:
            from npusim.parallel.plots import plan_scaling

            g = first.graph
            paths = plan_scaling({f"{g.workload.name} {g.phase} batch {g.batch}": c.curve()}, args.plot,
                                 title=step_title(first, step["overrides"]))
            written.append(plots_line(args.plot, paths))
    say_all(written)
    return 0


__all__ = ["COMPARED_PIPELINES", "cmd_compare"]
