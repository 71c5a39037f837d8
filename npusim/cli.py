"""The `npusim` command line."""

from __future__ import annotations

import argparse
import os
import sys

from npusim.errors import NpusimError


def _cmd_hw(args) -> int:
    from npusim.hw.show import show_hw

    print(show_hw(args.name, args.set))
    return 0


def _cmd_demo(args) -> int:
    from npusim.demo import main as demo

    demo(args.hw)
    return 0


def _op_help(op_type: str) -> str:
    import attrs

    from npusim.ops.registry import spec

    sp = spec(op_type)
    lines = [f"npusim op {op_type} key=value ...  ({sp.help})", "", "parameters:"]
    for f in attrs.fields(sp.params):
        lines.append(f"  {f.name:14s} default {f.default!r:10s} {f.metadata.get('help', '')}")
    if sp.tiling is not None:
        lines += ["", "tiling (tiling.KEY=VALUE, default: chosen by the lowering):"]
        for f in attrs.fields(sp.tiling):
            lines.append(f"  {f.name:14s} {f.metadata.get('help', '')}")
    return "\n".join(lines)


def _cmd_op(args) -> int:
    from npusim.errors import ConfigError
    from npusim.hw import load_hw
    from npusim.hw.load import parse_set_args
    from npusim.ops import OPS, lower, simulate_op

    if args.list or not args.type:
        print("op types: " + ", ".join(sorted(OPS)))
        return 0
    if args.help:
        print(_op_help(args.type))
        return 0
    params, tiling = {}, {}
    for item in args.params:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"op {args.type}: expected key=value, got '{item}'")
        if key.startswith("tiling."):
            tiling[key[len("tiling."):]] = value
        else:
            params[key] = value
    hw = load_hw(args.hw, parse_set_args(args.set))
    low = lower(args.type, params, hw, tiling or None)
    report = simulate_op(low, hw, trace="instr" if args.trace or args.plot else "kernel")
    print(_op_summary(report))
    if args.json:
        import json

        from npusim.report import op_json

        with open(args.json, "w") as f:
            json.dump(op_json(report), f, indent=1)
    if args.trace:
        from npusim.report import write_chrome_trace

        write_chrome_trace(report.run, args.trace)
    if args.plot:
        from npusim.report import plots

        _wrote(args.plot, plots.roofline(report, args.plot) + plots.timeline(report.run, args.plot))
    return 0


def _wrote(out_dir: str, paths) -> None:
    """One line naming the plots written."""
    names = ", ".join(dict.fromkeys(p.stem for p in paths))
    print(f"plots in {out_dir}: {names} (.png, .svg)")


def _op_summary(r) -> str:
    low = r.lowered
    lines = [
        f"{low.op_type} on {r.hw.name}: {r.us:.2f} us ({r.cycles:.0f} cycles), {len(low.kernels)} kernel(s)",
        f"  {r.tflops:.2f} TFLOPS, GM {r.gm_bw_bytes_per_s / 1e12:.3f} TB/s, HBM {r.hbm_bw_bytes_per_s / 1e12:.3f} TB/s, "
        f"L2 hit rate {100 * r.stats.l2_hit_rate:.1f}%",
        f"  bound: {r.bound} (roofline {r.roofline.time_s * 1e6:.2f} us: compute {r.roofline.compute_s * 1e6:.2f}, "
        f"HBM {r.roofline.hbm_s * 1e6:.2f}, L2 {r.roofline.l2_s * 1e6:.2f})",
        "  pipes busy: " + ", ".join(f"{p} {100 * v:.0f}%" for p, v in r.utilisation().items()),
    ]
    if low.tiling is not None:
        lines.append(f"  tiling: {low.tiling}")
    return "\n".join(lines)


def _lengths(text: str):
    """--context 4096, or one length per sequence: 4096,1000,77."""
    from npusim.errors import ConfigError

    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--context: expected an integer or a comma list of integers, got '{text}'") from None
    return values[0] if len(values) == 1 else values


def _pass_options(args) -> dict:
    """Options of the passes given on the command line (None: the pass's default)."""
    from npusim.errors import ConfigError

    buckets = None
    if args.buckets:
        try:
            buckets = tuple(int(x) for x in args.buckets.split(","))
        except ValueError:
            raise ConfigError(f"--buckets: expected a comma list of lengths, got '{args.buckets}'") from None
    return dict(fusion_rules=args.fusion_rules, kv_layout=args.kv_layout, buckets=buckets, margin=args.margin)


def _step_args(args) -> dict:
    from npusim.hw.load import parse_set_args

    return dict(phase=args.phase, batch=args.batch, context=_lengths(args.context) if args.context else None,
                overrides=parse_set_args(args.set), **_pass_options(args))


def _cmd_run(args) -> int:
    from npusim.report.step import memory_timeline, step_json, summary
    from npusim.report.tables import statistic_table, write_tables
    from npusim.runtime.decoder import run_decoder

    run = run_decoder(args.workload, args.hw, passes=args.passes, memo=not args.no_memo,
                      trace=args.trace_level, **_step_args(args))
    print(summary(run))
    print(statistic_table(run.result))
    if args.json:
        _write_json(step_json(run), args.json)
    if args.trace:
        from npusim.report import write_chrome_trace

        write_chrome_trace(run.result, args.trace, memory_timeline(run))
    if args.profile:
        print("tables: " + ", ".join(str(p) for p in write_tables(run.result, args.profile, run.node_of, run.graph)))
    if args.plot:
        from npusim.report import plots

        _wrote(args.plot, plots.roofline(run, args.plot) + plots.hotspots(run, args.plot)
               + plots.memory(run, args.plot) + plots.run_timeline(run, args.plot))
    return 0


def _cmd_compare(args) -> int:
    from npusim.report.step import comparison_table, step_json
    from npusim.runtime.decoder import compare

    c = compare(args.workload, args.hw, pipelines=args.passes, memo=not args.no_memo, **_step_args(args))
    print(comparison_table(c))
    if args.json:
        _write_json({"runs": {k: step_json(r) for k, r in c.runs.items()},
                     "steps": {k: step_json(r) for k, r in c.steps.items()}}, args.json)
    if args.plot:
        from npusim.report import plots

        _wrote(args.plot, plots.before_after(c, args.plot) + plots.waterfall(c, args.plot))
    return 0


def _cmd_sweep(args) -> int:
    import time

    from npusim.errors import ConfigError
    from npusim.sweep import (
        SweepInterrupted,
        params_of,
        parse_grid,
        plot,
        progress_bar,
        sweep,
        table,
        write_csv,
    )

    grid = parse_grid(args.set)
    if not grid:
        raise ConfigError("sweep: nothing to sweep: give --set KEY=V1,V2,... (a hardware field, or batch / context)")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs: expected a positive integer, got {args.jobs}")
    step = {"phase": args.phase, "batch": args.batch, "context": _lengths(args.context) if args.context else None,
            **_pass_options(args)}
    csv_path = f"{args.out}/sweep.csv"
    start = time.monotonic()
    try:
        rows = sweep(args.workload, grid, args.hw, passes=args.passes, jobs=args.jobs, memo=not args.no_memo,
                     progress=progress_bar(), **step)
    except SweepInterrupted as e:
        write_csv(e.rows, csv_path, params_of(grid))
        print(f"\nnpusim: interrupted: {len(e.rows)} of {e.total} points written to {csv_path}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # before any point ran
        return 130
    seconds = time.monotonic() - start
    print(table(rows, params_of(grid)))
    write_csv(rows, csv_path, params_of(grid))
    title = (f"{args.workload} {args.phase} batch {args.batch} x context {args.context or 'default'}, "
             f"passes {args.passes}, on {args.hw}")
    plots = plot(rows, args.out, params_of(grid), title)
    failed = sum(r["status"] != "ok" for r in rows)
    print(f"{len(rows)} points ({len(rows) - failed} ok, {failed} failed) in {seconds:.1f} s: {csv_path}, "
          + ", ".join(str(p) for p in plots))
    return 0


def _cmd_validate(args) -> int:
    from npusim.passes.validate import validate_passes

    report = validate_passes(args.workload, args.passes, phase=args.phase, batch=args.batch,
                             context=_lengths(args.context) if args.context else None, seed=args.seed,
                             **_pass_options(args))
    print(report.table())
    return 0 if report.passed else 1


def _write_json(data: dict, path: str) -> None:
    import json

    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def _step_parser(sub, name: str, help: str, passes_nargs=None, default_workload: str = "k3"):
    p = sub.add_parser(name, help=help)
    p.add_argument("--workload", default=default_workload, help="workload name (workloads/) or path, "
                   "or a Hugging Face config.json")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    p.add_argument("--batch", type=int, help="sequences")
    p.add_argument("--context", help="decode: context length per sequence (new token included; default the "
                   "workload's max context); prefill: prompt length (default 128); one int, or a comma list "
                   "(one per sequence, ragged)")
    if passes_nargs:
        p.add_argument("--passes", nargs=passes_nargs, default=["baseline", "optimized"],
                       help="pipelines to compare (baseline, optimized, or comma lists of passes)")
    else:
        p.add_argument("--passes", default="optimized", help="baseline, optimized, or a comma list of "
                       "passes: fusion,layout,kv_layout,sync,launch,streams,memplan")
    p.add_argument("--fusion-rules", metavar="PATH", help="fusion switch file (see npusim/passes/fusion_rules.yaml)")
    p.add_argument("--kv-layout", choices=("contiguous", "paged"), help="KV layout the kv_layout pass makes "
                   "(default contiguous)")
    p.add_argument("--buckets", metavar="L1,L2,...", help="shape buckets of the buckets pass (default "
                   "512,1024,2048,4096; add it with --passes optimized,buckets)")
    p.add_argument("--margin", type=int, metavar="TOKENS", help="buckets pass: headroom a sequence keeps in its "
                   "bucket (default 0)")
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npusim", description="Cycle-approximate simulator of a 910B-like NPU.")
    sub = p.add_subparsers(dest="command", required=True)

    hw = sub.add_parser("hw", help="hardware configs")
    hw_sub = hw.add_subparsers(dest="hw_command", required=True)
    show = hw_sub.add_parser("show", help="print a config with derived figures")
    show.add_argument("name", nargs="?", default="ascend910b2", help="config name or path")
    show.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a field")
    show.set_defaults(func=_cmd_hw)

    demo = sub.add_parser("demo", help="run the README's hand-built vector add on every AIV core")
    demo.add_argument("--hw", default="ascend910b2", help="config name or path")
    demo.set_defaults(func=_cmd_demo)

    op = sub.add_parser("op", add_help=False, help="simulate one operator (npusim op --list; npusim op TYPE --help)")
    op.add_argument("type", nargs="?", help="op type (snake_case)")
    op.add_argument("params", nargs="*", metavar="key=value", help="op parameters; tiling.KEY=VALUE to force a tiling")
    op.add_argument("--hw", default="ascend910b2", help="config name or path")
    op.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a hardware field")
    op.add_argument("--json", metavar="PATH", help="write the JSON report")
    op.add_argument("--trace", metavar="PATH", help="write a Chrome trace (instruction level)")
    op.add_argument("--list", action="store_true", help="list the op types")
    op.add_argument("-h", "--help", action="store_true", help="show the op's parameters")
    op.set_defaults(func=_cmd_op)

    run = _step_parser(sub, "run", "simulate one decoder step (K3 decode by default)")
    run.set_defaults(batch=8)
    compare = _step_parser(sub, "compare", "pipelines side by side, and the gain of each pass", "+")
    compare.set_defaults(batch=8)
    for p_ in (run, compare):
        p_.add_argument("--hw", default="ascend910b2", help="config name or path")
        p_.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a hardware field")
        p_.add_argument("--json", metavar="PATH", help="write the JSON report")
        p_.add_argument("--no-memo", action="store_true", help="simulate every layer (no layer memo)")
    run.add_argument("--trace", metavar="PATH", help="write a Chrome trace (Perfetto, chrome://tracing)")
    run.add_argument("--trace-level", choices=("kernel", "block", "instr"), default="kernel",
                     help="detail of --trace: kernel and host spans, + blocks per core, + every instruction")
    run.add_argument("--profile", metavar="DIR", help="write op_summary.csv and op_statistic.csv (msprof's columns)")
    for p_ in (run, compare, op):
        p_.add_argument("--plot", metavar="DIR", help="write plots (PNG and SVG) into DIR: run: roofline, hotspots, "
                        "memory, timeline of the longest kernel; op: roofline, timeline; compare: before_after, "
                        "waterfall")
    run.set_defaults(func=_cmd_run)
    compare.set_defaults(func=_cmd_compare)

    sweep = _step_parser(sub, "sweep", "hardware what-if: one step at every point of a grid, in parallel")
    sweep.set_defaults(batch=8, func=_cmd_sweep)
    sweep.add_argument("--hw", default="ascend910b2", help="config name or path")
    sweep.add_argument("--set", action="append", metavar="KEY=V1,V2,...", help="a swept hardware field "
                       "(key.path) or step knob (batch, context) and its values; the grid is the product of all")
    sweep.add_argument("--out", metavar="DIR", required=True, help="write DIR/sweep.csv and DIR/sweep.png, .svg")
    sweep.add_argument("--jobs", type=int, help="worker processes (default: one per CPU)")
    sweep.add_argument("--no-memo", action="store_true", help="simulate every layer (no layer memo)")

    validate = _step_parser(sub, "validate", "check passes keep the numbers: numpy run vs an FP32 reference",
                            default_workload="k3-tiny")
    validate.set_defaults(batch=2, context="64")
    validate.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    validate.set_defaults(func=_cmd_validate)

    serve = sub.add_parser("serve", help="a service under load: arrivals, batching, host; TTFT, TPOT, P99")
    from npusim.serving.command import add_arguments as _serve_arguments

    _serve_arguments(serve)
    serve.set_defaults(func=_cmd_serve)
    return p


def _cmd_serve(args) -> int:
    from npusim.serving.command import main as serve

    return serve(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except NpusimError as e:
        print(f"npusim: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of our output went away (npusim ... | head)
        sys.stdout = open(os.devnull, "w")  # nothing more to flush at exit
        return 0
    except OSError as e:  # an output path that cannot be written
        print(f"npusim: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
