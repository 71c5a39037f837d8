"""The `npusim` command line."""

from __future__ import annotations

import argparse
import functools
import os
import sys

from npusim.errors import ConfigError, NpusimError
from npusim.hw.parse import plain
from npusim.outputs import all_or_none, err, plots_line, say, say_all, tables_line, write_json, wrote_line
from npusim.diskcache.command import add_cache_command, add_cache_flags, store_of
from npusim.compare_command import COMPARED_PIPELINES, cmd_compare
from npusim.op_command import cmd_op
from npusim.diskcache.replay import replayed
from npusim.kvcache import PASS_KV_LAYOUTS
from npusim.parallel.flags import add_plan_flags, plan_args, plan_report, run_pipelined, say_plan, validate_sharded
from npusim.step_flags import (PREFILL_BATCH, add_fast_forward_flag, add_workload_set, check_outputs, context,
                               default_batch, file_sets_absolute, given, inputs, pass_options, pipeline, step_args,
                               workload_of, workload_sets)


# the files `npusim run --plot DIR` writes (report.plots: each plot as NAME.png and NAME.svg)
RUN_PLOTS = ("roofline.png", "roofline.svg", "hotspots.png", "hotspots.svg", "memory.png", "memory.svg",
             "timeline.png", "timeline.svg")


def _cmd_hw(args) -> int:
    from npusim.hw.show import show_hw

    say(show_hw(args.name, args.set))
    return 0


def _cmd_demo(args) -> int:
    from npusim.demo import main as demo, vector_add
    from npusim.hw import load_hw
    from npusim.hw.load import find_file
    from npusim.runtime.memory import size

    hw = load_hw(args.hw)
    kernel = vector_add(hw)
    where = f"demo --hw {find_file(args.hw, 'hwconfigs')}: the vector add's"
    # its x, y and z, one chunk per AIV core: past the HBM the run would be meaningless (and,
    # on a config of thousands of cores, would take hours)
    need = sum(t.nbytes for t in kernel.gm)
    if need > hw.hbm.hbm_bytes:
        raise ConfigError(f"{where} x, y and z over {hw.aiv_count} AIV cores take {size(need)} of GM, more than "
                          f"hbm.hbm_bytes {hw.hbm.hbm_bytes} ({size(hw.hbm.hbm_bytes)})")
    ub = max(b.addr + b.nbytes for b in kernel.aiv[0].buffers)  # verify's words named neither config nor key
    if ub > hw.aiv.ub_bytes:
        raise ConfigError(f"{where} ping and pong tiles take {ub} bytes of UB, more than aiv.ub_bytes "
                          f"{hw.aiv.ub_bytes}")
    demo(hw)
    return 0


def _cmd_run(args) -> int:
    from npusim.report.contract import provenance
    from npusim.report.step import memory_timeline, step_json, summary
    from npusim.report.tables import statistic_table, write_tables
    from npusim.runtime.compile import tilings_of
    from npusim.runtime.decoder import run_decoder

    check_outputs(args, plots=RUN_PLOTS)
    if args.trace_level and not args.trace:
        raise ConfigError(f"--trace-level {args.trace_level}: the detail of --trace (give --trace PATH too)")
    step = step_args(args)
    if "pp" in step or "microbatches" in step:
        return run_pipelined(args, step)
    from npusim.progress import progress_bar

    with progress_bar("run", "kernels", args.progress) as bar:
        run = run_decoder(workload_of(args), args.hw, passes=pipeline(args.passes), memo=not args.no_memo,
                          trace=args.trace_level or "kernel", progress=bar, store=store_of(args),
                          counters=bool(args.trace),
                          exact=args.exact, **step)
    say(summary(run, overrides=step["overrides"]))
    say_plan(run, step)
    say(statistic_table(run.result))
    meta = provenance(args.argv, run.hw, step["overrides"], args.workload, inputs(args)["--workload"])
    written = []
    with all_or_none():  # an interruption or a failure between two outputs leaves none of them
        if args.json:
            write_json(args.json, step_json(run) | plan_report(run) | {"provenance": meta})
        if args.trace:
            from npusim.parallel.trace import run_trace
            from npusim.report.trace import write_trace

            write_trace(run_trace(run, memory_timeline(run)), args.trace, metadata=meta)
        if args.json or args.trace:
            written.append(wrote_line(p for p in (args.json, args.trace) if p))
        if args.profile:
            # what ran, but the config (the one `npusim calibrate` fits), its files as absolute paths
            workload = args.workload  # a name, or a path made absolute
            workload = os.path.abspath(workload) if os.path.exists(workload) else workload
            ran = {k: v for k, v in step.items() if k != "overrides"} | {"workload": workload,
                                                                         "passes": pipeline(args.passes)}
            sets = workload_sets(args)
            if sets:  # the fields --workload-set changed, applied again when calibrate reruns it
                ran["workload_set"] = file_sets_absolute(sets)
            if ran.get("fusion_rules"):
                ran["fusion_rules"] = os.path.abspath(ran["fusion_rules"])
            ran["tilings"] = tilings_of(run.compiled)  # the kernels that ran: calibrate runs the same ones
            written.append(tables_line(write_tables(run.result, args.profile, run.graph, step=ran)))
        if args.plot:
            from npusim.report import plots

            written.append(plots_line(args.plot, plots.roofline(run, args.plot) + plots.hotspots(run, args.plot)
                                  + plots.memory(run, args.plot) + plots.run_timeline(run, args.plot)))
    say_all(written)
    return 0


def _cmd_sweep(args) -> int:
    from npusim.sweep_command import main as sweep

    step = {"phase": args.phase, "batch": args.batch, "context": context(args),
            **pass_options(args), **plan_args(args)}
    return sweep(args, step, pipeline(args.passes), check_outputs)


def _cmd_validate(args) -> int:
    from npusim.passes.validate import validate_passes
    from npusim.serving.arrivals import check_seed

    check_seed(args.seed)  # numpy's generators take no negative seed
    inputs(args)  # checked, as run's are, before anything reads them
    if args.kernels:  # the lowered kernels run by the functional interpreter
        from npusim.errors import ConfigError
        from npusim.hw import load_hw
        from npusim.passes.validate_kernels import check_step

        if plan_args(args):
            raise ConfigError("validate --kernels checks one device's kernels: drop the parallel plan flags")

        report = check_step(workload_of(args), pipeline(args.passes),
                            (args.phase,) if given(args, "--phase") else ("decode", "prefill"),
                            args.batch or 2, context(args), load_hw(getattr(args, "hw", None) or "ascend910b2"),
                            args.seed, **pass_options(args))
        say(report.table())
        return 0 if report.passed else 1
    if plan_args(args):  # several devices: every rank's shard with numpy
        return validate_sharded(args, pipeline(args.passes), context(args),
                                pass_options(args))
    report = validate_passes(workload_of(args), pipeline(args.passes), phase=args.phase, batch=args.batch,
                             context=context(args), seed=args.seed,
                             **pass_options(args))
    say(report.table())
    return 0 if report.passed else 1


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, except where there is none to show."""

    def _get_help_string(self, action):
        if any(action.default is v for v in (None, False, argparse.SUPPRESS)) or "(default" in (action.help or ""):
            return action.help
        if isinstance(action.default, list):
            return f"{action.help} (default: {' '.join(map(str, action.default))})"
        return super()._get_help_string(action)


SET_ONE = "override a hardware field, one value per --set (repeat --set for more fields; lists of values: sweep)"
PROGRESS = "progress with an ETA on stderr (default: only when stderr is a terminal)"


class _Once(argparse.Action):
    """A flag that takes its values after one mention (--hw A B): a second mention is a
    usage error, not silently the only one kept."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault("_mentioned", set())
        if self.dest in seen:
            parser.error(f"{option_string} given twice: give its values after one {option_string} "
                         f"({option_string} A B)")
        seen.add(self.dest)
        setattr(namespace, self.dest, values)


HW_HELP = "hardware config name (hwconfigs/) or path"


def _common(p, *, plot: str | None = None, trace: str | None = None, json_: bool = True, two: bool = False) -> None:
    """The flags that mean the same in every subcommand that has them (two=True: --hw
    takes two configs to compare, as compare does)."""
    if two:
        p.add_argument("--hw", nargs="+", action=_Once, default="ascend910b2", metavar="HW",
                       help=HW_HELP + ": two (--hw A B) are compared under one pipeline")
    else:
        p.add_argument("--hw", default="ascend910b2", help=HW_HELP)
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=SET_ONE)
    if json_:
        p.add_argument("--json", metavar="PATH", help="write the JSON report (with provenance)")
    if trace:
        p.add_argument("--trace", metavar="PATH", help=trace)
    if plot:
        p.add_argument("--plot", metavar="DIR", help=f"write plots (PNG and SVG) into DIR: {plot}")


def _step_parser(sub, name: str, help: str, passes_nargs=None, default_workload: str = "k3", decode_batch: int = 8):
    """A command running a step; `decode_batch`: its --batch in decode (prefill: one
    prompt; step_flags.default_batch)."""
    p = sub.add_parser(name, help=help, description=help, formatter_class=_Help)
    p.add_argument("--workload", default=default_workload, help="workload name (workloads/) or path, "
                   "or a Hugging Face config.json")
    add_workload_set(p)
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode", help="the step simulated")
    add_plan_flags(p)
    p.add_argument("--batch", type=int, help=f"sequences (default: {decode_batch} in decode; in prefill "
                   f"{PREFILL_BATCH}: one prompt)")
    p.set_defaults(decode_batch=decode_batch)
    p.add_argument("--context", help="decode: context length per sequence (new token included; default the "
                   "workload's max context); prefill: prompt length (default 128); one int, or a comma list "
                   "(one per sequence, ragged)")
    from npusim.passes import passes_help  # the registry's pipelines and passes (imports no pass)

    passes = passes_help()
    if passes_nargs:
        p.add_argument("--passes", nargs=passes_nargs, metavar="PIPELINE",
                       help="pipelines to compare, as separate words (--passes baseline optimized); each is "
                       + passes + f" (default: {' '.join(COMPARED_PIPELINES)}); comparing plans, two configs, "
                       "what-ifs or two fusion-rules files: ONE pipeline, default optimized")
    else:
        p.add_argument("--passes", default="optimized", help=passes)
    rules = "fusion rules file (default: npusim/passes/fusion_rules.yaml, the shipped rules)"
    if passes_nargs:  # compare
        p.add_argument("--fusion-rules", nargs="+", action=_Once, metavar="PATH",
                       help=rules + "; two (--fusion-rules A B) are compared under one pipeline")
        p.add_argument("--variant", nargs="+", action="append", metavar="KEY.PATH=VALUE",
                       help="a what-if of the config to compare, as --set words (one value each): once, against "
                       "the unmodified config (--variant l2.l2_bytes=100663296); twice, one against the other "
                       "(--variant hbm.peak_bw_bytes_per_s=8e11 --variant hbm.peak_bw_bytes_per_s=3.2e12); "
                       "--set applies to both sides; under one pipeline")
    else:
        p.add_argument("--fusion-rules", metavar="PATH", help=rules)
    p.add_argument("--kv-layout", choices=PASS_KV_LAYOUTS, help="KV layout the kv_layout pass makes "
                   "(default contiguous)")
    p.add_argument("--buckets", metavar="L1,L2,...", help="shape buckets of the buckets pass (default "
                   "512,1024,2048,4096; add it with --passes optimized,buckets)")
    p.add_argument("--margin", type=int, metavar="TOKENS", help="buckets pass: headroom a sequence keeps in its "
                   "bucket (default 0)")
    p.add_argument("--quant", choices=("w8a16", "w8a8"), help="quantize pass: INT8 weights, or weights and "
                   "activations (default w8a16; add it with --passes optimized,quantize)")
    p.add_argument("--quant-layers", metavar="no-head|all|NAMES", help="quantize pass: the Linear layers quantised "
                   "(default no-head: all but the LM head; or a comma list, e.g. o_proj,down_proj)")
    p.add_argument("--smooth-alpha", type=float, metavar="A", help="quantize pass, w8a8: SmoothQuant migration "
                   "strength in (0, 1] (default: none)")
    return p


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line (not the whole usage of a
    command with thirty options before it); subcommands' parsers are of this class too.
    Its type=int and type=float flags take plain ASCII numbers only (hw.parse.plain), so
    `--ep ２` or `--requests 1_000` is a usage error, not silently 2 or 1000."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for kind in (int, float):
            self.register("type", kind, functools.partial(plain, kind))

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if isinstance(getattr(namespace, "params", None), list):  # op: key=value words after an option
            namespace.params += [e for e in extras if not e.startswith("-")]
            extras = [e for e in extras if e.startswith("-")]
        empty = _empty_option(self, namespace)
        if empty:
            self.error(f"argument {empty}: expected a value, got an empty string")
        default_batch(namespace)  # a step command's --batch not given: by its --phase
        # (build_decoder would refuse it too, without naming the flag)
        if isinstance(getattr(namespace, "batch", None), int):
            from npusim.graph.build import MAX_BATCH

            if namespace.batch < 1:
                self.error(f"argument --batch: expected a whole number of sequences >= 1, got {namespace.batch}")
            if namespace.batch > MAX_BATCH:
                self.error(f"argument --batch: expected at most the {MAX_BATCH} sequences a step may have, got "
                           f"{namespace.batch}")
        namespace.__dict__.pop("_mentioned", None)  # _Once's record
        return namespace, extras


def _empty_option(parser: argparse.ArgumentParser, namespace) -> str | None:
    """The first option of `parser` given an empty string ('' is no path, flag value or
    list: `--pd ''` or `--cache-dir ''` must not read as the option left out)."""

    def has_empty(value) -> bool:
        return value == "" if isinstance(value, str) else isinstance(value, list) and any(map(has_empty, value))

    for action in parser._actions:
        if action.option_strings and action.default != "" and has_empty(getattr(namespace, action.dest, None)):
            return "/".join(action.option_strings)
    return None


def build_parser(serve_options: bool = True) -> argparse.ArgumentParser:
    """serve_options=False leaves out serve's options (their module imports the whole serving stack)."""
    p = _Parser(prog="npusim", description="Cycle-approximate simulator of a 910B-like NPU.")
    sub = p.add_subparsers(dest="command", required=True)

    hw = sub.add_parser("hw", help="hardware configs")
    hw_sub = hw.add_subparsers(dest="hw_command", required=True)
    show = hw_sub.add_parser("show", help="print a config with derived figures", formatter_class=_Help)
    show.add_argument("name", nargs="?", default="ascend910b2", help="config name or path")
    show.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help=SET_ONE)
    show.set_defaults(func=_cmd_hw)

    demo = sub.add_parser("demo", help="run the README's hand-built vector add on every AIV core",
                          formatter_class=_Help)
    demo.add_argument("--hw", default="ascend910b2", help="hardware config name (hwconfigs/) or path")
    demo.set_defaults(func=_cmd_demo)

    op = sub.add_parser("op", add_help=False, formatter_class=_Help,
                        help="simulate one operator (npusim op --list; npusim op TYPE --help)",
                        description="Simulate one operator. `npusim op TYPE --help` adds the op's parameters.")
    op.add_argument("type", nargs="?", help="op type (snake_case; npusim op --list)")
    op.add_argument("params", nargs="*", metavar="key=value", help="op parameters; tiling.KEY=VALUE to force a tiling")
    _common(op, plot="roofline, timeline", trace="write a Chrome trace (instruction level)")
    op.add_argument("--profile", metavar="DIR", help="write op_summary.csv and op_statistic.csv (msprof's columns); "
                    "for a collective, hccl_test's output (DIR/all_reduce_test.txt ...)")
    op.add_argument("--list", action="store_true", help="list the op types")
    op.add_argument("--check", action="store_true", help="run the lowered kernels on numpy data (functional "
                    "interpreter) and compare with the op's reference instead of simulating (small shapes)")
    op.add_argument("-h", "--help", action="store_true", help="show this help (with TYPE: and the op's parameters)")
    op.set_defaults(func=replayed(cmd_op, check_outputs), parser=op)

    run = _step_parser(sub, "run", "simulate one decoder step (K3 decode by default)")
    _common(run, plot="roofline, hotspots, memory, timeline of the longest kernel",
            trace="write a Chrome trace (Perfetto, chrome://tracing)")
    run.add_argument("--trace-level", choices=("kernel", "block", "instr"),
                     help="detail of --trace: kernel and host spans, + blocks per core, + every instruction "
                     "(default: kernel)")
    run.add_argument("--profile", metavar="DIR", help="write op_summary.csv and op_statistic.csv (msprof's columns)")
    compare = _step_parser(sub, "compare", "pipelines side by side (and each pass's gain when the first is "
                           "baseline); or, under one pipeline, two configs (--hw A B), what-ifs (--variant) or "
                           "fusion-rules files (--fusion-rules A B), with the kernels that changed most; or parallel "
                           "plans (--plans)", "+")
    _common(compare, plot="before_after, waterfall (when the first pipeline is baseline); with --plans "
            "plan_scaling (latency and communication share against the devices)",
            trace="write a Chrome trace (kernel level) per pipeline (with --plans: per plan; A and B: per side): "
                  "PATH with its name before the suffix (trace.json -> trace.baseline.json, trace.optimized.json; "
                  "trace.tp2.json; trace.A.json, trace.B.json)", two=True)
    compare.add_argument("--plans", nargs="+", metavar="PLAN", help="compare parallel plans instead of "
                         "pipelines, as separate words (--plans tp1 tp2 tp4); each is tpN, spN, epN (a MoE decoder) "
                         "or ONE comma list of them (tp2,sp2; tp2,ep8), under one pipeline of --passes")
    for p_ in (run, compare):
        p_.add_argument("--progress", action=argparse.BooleanOptionalAction, help=PROGRESS)
        p_.add_argument("--no-memo", action="store_true", help="simulate every layer (no layer memo)")
    run.set_defaults(func=replayed(_cmd_run, check_outputs))
    compare.set_defaults(func=cmd_compare)

    sweep = _step_parser(sub, "sweep", "hardware what-if: one step at every point of a grid, in parallel")
    sweep.set_defaults(func=_cmd_sweep)
    from npusim.sweep_command import add_arguments as _sweep_arguments

    _sweep_arguments(sweep, PROGRESS)

    validate = _step_parser(sub, "validate", "check passes keep the numbers: numpy run vs an FP32 reference",
                            default_workload="k3-tiny", decode_batch=2)
    validate.set_defaults(context="64")
    for action in validate._actions:
        if action.dest == "context":
            action.help = "context length per sequence (decode) or prompt length (prefill); one int, or a comma list"
    validate.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    validate.add_argument("--kernels", action="store_true", help="run every distinct lowered kernel of the step "
                          "(decode and prefill unless --phase) on numpy data with the functional interpreter and "
                          "compare with the op's reference; also what each pass changed")
    validate.set_defaults(func=_cmd_validate)

    serve = sub.add_parser("serve", help="a service under load: arrivals, batching, host; TTFT, TPOT, P99")
    if serve_options:
        from npusim.serving.command import add_arguments

        add_arguments(serve)
    serve.set_defaults(func=_cmd_serve)
    for p_ in (op, run, compare, sweep):
        add_cache_flags(p_)
    for p_ in (op, run):
        add_fast_forward_flag(p_)
    add_cache_command(sub)
    calibrate = sub.add_parser("calibrate", help="fit the assumed fields of a config to msprof and/or hccl_test measurements",
                               formatter_class=_Help)
    from npusim.calibrate.command import add_arguments as _calibrate_arguments, main as _calibrate

    _calibrate_arguments(calibrate)
    calibrate.set_defaults(func=_calibrate)
    return p


def _cmd_serve(args) -> int:
    from npusim.serving.command import main as serve

    return serve(args)


def main(argv: list[str] | None = None) -> int:
    from npusim.outputs import Terminated, drop_stdout, interruption_note, on_sigterm

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(serve_options=argv[:1] == ["serve"]).parse_args(argv)
    args.argv = ["npusim", *argv]
    status = None
    try:
        with on_sigterm():
            try:
                status = args.func(args)
            except NpusimError as e:
                err(f"npusim: error: {e}")
                status = 2
            except KeyboardInterrupt as e:
                err(f"npusim: interrupted ({interruption_note(e)})")
                status = 130
            except Terminated as e:
                err(f"npusim: terminated ({interruption_note(e)})")
                status = 143
            except BrokenPipeError:  # the reader went away outside say() (a library printed)
                drop_stdout()
                status = 0
            except OSError as e:  # an output folder that cannot be made, ...
                err(f"npusim: error: {e.filename or 'output'}: {e.strerror or e}")
                status = 2
    except (KeyboardInterrupt, Terminated) as e:  # as on_sigterm ended: the command had, and said what it wrote
        if status is None:  # (it came while the line of an error or interruption above was printed)
            status = 143 if isinstance(e, Terminated) else 130
    return status
