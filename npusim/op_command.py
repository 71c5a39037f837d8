"""`npusim op`: one operator simulated, checked on numpy data (--check) or, for a
collective, priced as hccl_test prints it. Its flags are npusim.cli's (shared with
run); its outputs follow npusim.outputs' policy (checked before the run by npusim.outputs_check, all or none)."""

from __future__ import annotations

import os
import sys

from npusim.errors import ConfigError
from npusim.hw.parse import odd_number
from npusim.outputs import all_or_none, plots_line, say, say_all, tables_line, write_json, wrote_line
from npusim.step_flags import check_outputs, overrides

# the files --plot DIR holds (report.plots: each plot as NAME.png and NAME.svg)
OP_PLOTS = ("roofline.png", "roofline.svg", "timeline.png", "timeline.svg")
# what `npusim op` may write: left undone by --list and refused beside --check
OP_OUTPUTS = ("--json", "--trace", "--plot", "--profile")
# KV cache fields only some layouts read (npusim.kvcache.KvLayout): field -> those layouts
LAYOUT_ONLY = {"block_tokens": ("paged",), "layers": ("contiguous",), "layer": ("contiguous",)}


def cmd_op(args) -> int:
    from npusim.hw import load_hw
    from npusim.ops.registry import spec
    from npusim.report.op_text import op_help

    if args.help:
        say(args.parser.format_help().rstrip() + ("\n\n" + op_help(args.type) if args.type else ""))
        return 0
    if args.list or not args.type:
        return _list(args)
    params, tiling = _params(args)
    if args.check:  # it prints a table row and PASSED/FAIL; an output asked for would be left unwritten
        for flag in OP_OUTPUTS:
            if getattr(args, flag[2:]):
                raise ConfigError(f"op {args.type} --check: prints the check and writes nothing; drop {flag} "
                                  "(or --check, to simulate and write it)")
    spec(args.type)  # imports the op modules up to the one registering it: a collective's is the collectives package
    collectives = sys.modules.get("npusim.ops.collectives")
    collective = collectives is not None and args.type in collectives.KINDS
    if collective and args.profile:  # hccl_test's output, not the tables
        from npusim.ops.collectives.command import hccl_test_file

        check_outputs(args, plots=OP_PLOTS, tables=(hccl_test_file(args.type),))
    else:
        check_outputs(args, plots=OP_PLOTS)
    if not collective:
        _check_layout_fields(args.type, params)
    sets = overrides(args)
    hw = load_hw(args.hw, sets)
    if collective:
        return _collective(args, params, hw)
    if args.check:
        return _check(args, params, tiling, hw)
    return _simulate(args, params, tiling, hw, sets)


def _list(args) -> int:
    """The op types, printed; an output or a check asked for would be left undone."""
    asked = next((f for f in (*OP_OUTPUTS, "--check") if getattr(args, f[2:])), None)
    if asked and not args.list:
        raise ConfigError(f"op {asked}: give the op type first: npusim op TYPE key=value ... {asked} "
                          "(npusim op --list lists them)")
    if asked or args.params:
        raise ConfigError(f"op --list: lists the op types and runs nothing; drop {asked or repr(args.params[0])}")
    from npusim.ops import OPS

    say("op types: " + ", ".join(sorted(OPS)))
    return 0


def _params(args) -> tuple[dict, dict]:
    """The key=value words: (op parameters, tiling.KEY values), each named once."""
    params, tiling = {}, {}
    for item in args.params:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():  # =5: "unknown parameter ''" said less
            raise ConfigError(f"op {args.type}: expected key=value, got '{item}'")
        if odd_number(value):  # int() would read it: the op's parameter would be 16 silently
            raise ConfigError(f"op {args.type}: parameter '{key}': expected a number in ASCII digits without '_', "
                              f"got '{value}'")
        given, name = (tiling, key[len("tiling."):]) if key.startswith("tiling.") else (params, key)
        if name in given:
            raise ConfigError(f"op {args.type}: parameter '{key}' given twice ('{given[name]}' and '{value}')")
        given[name] = value
    return params, tiling


def _check_layout_fields(op_type: str, params: dict) -> None:
    """A KV cache field given where the op's layout does not read it is refused: the run
    would be the one without it."""
    from npusim.ops.registry import make_record, spec

    record = make_record(op_type, spec(op_type).params, params)
    key = "kv_layout" if hasattr(record, "kv_layout") else "layout"
    layout = getattr(record, key, None)
    for name, readers in LAYOUT_ONLY.items():
        if name in params and layout is not None and layout not in readers:
            raise ConfigError(f"op {op_type}: '{name}' is read by the {' and '.join(readers)} layout only, and "
                              f"{key} is {layout} (leave it out, or give {key}={readers[0]})")


def _collective(args, params: dict, hw) -> int:
    """Printed as hccl_test prints it (--profile: written)."""
    from npusim.ops.collectives.command import hccl_test_output, report_json, run_collective_op

    if args.check:  # its kernels wait for their peers' data: no one rank runs on its own
        raise ConfigError(f"op {args.type} --check: a collective's numerics need its peers; "
                          "`npusim validate --tp N` checks them in a step")
    for flag, value in (("--trace", args.trace), ("--plot", args.plot)):
        if value:
            raise ConfigError(f"op {args.type}: {flag} is for kernels; a collective prints hccl_test's table "
                              "(--json, --profile); `npusim run --tp N --trace` traces collectives in a step")
    text, reports = run_collective_op(args.type, params, hw)
    say(text)
    written = []
    with all_or_none():  # both or neither
        if args.json:
            write_json(args.json, report_json(reports))
            written.append(wrote_line([args.json]))
        if args.profile:
            from npusim.outputs import write_text

            name, table = hccl_test_output(reports, hw)
            written.append(f"hccl_test output: {write_text(os.path.join(args.profile, name), table)}")
    say_all(written)
    return 0


def _check(args, params: dict, tiling: dict, hw) -> int:
    """The lowered kernels run on numpy data, against the op's reference."""
    from npusim.passes.validate_kernels import check_op, table_header

    result = check_op(args.type, params, hw, tiling=tiling or None)
    say(f"check {args.type}: its kernels run by the functional interpreter vs its numpy reference\n"
        f"{table_header()}\n{result.row()}\n{result.status.upper() if result.status != 'pass' else 'PASSED'}")
    return 1 if result.failed else 0


def _simulate(args, params: dict, tiling: dict, hw, sets) -> int:
    from npusim.diskcache.command import store_of
    from npusim.diskcache.compute import cached
    from npusim.ops import lower, simulate_op
    from npusim.ops.registry import make_record, spec
    from npusim.report.contract import provenance
    from npusim.report.op_text import op_summary
    from npusim.step_flags import fast_forward_key

    # the parameters are checked before the cache is asked: a result stored before a check
    # existed is never served for values it now refuses
    make_record(args.type, spec(args.type).params, params)
    trace, counters = "instr" if args.trace or args.plot else "kernel", bool(args.trace)
    report = cached(store_of(args), "op", (args.type, params, tiling, trace, counters) + fast_forward_key(args.exact),
                    hw, lambda hw: simulate_op(lower(args.type, params, hw, tiling or None), hw, trace=trace,
                                               counters=counters, exact=args.exact))
    say(op_summary(report, sets))
    meta = provenance(args.argv, hw, sets)
    written = []
    with all_or_none():  # an interruption or a failure between two outputs leaves none of them
        if args.json:
            from npusim.report import op_json

            write_json(args.json, op_json(report) | {"provenance": meta})
        if args.trace:
            from npusim.report import write_chrome_trace

            write_chrome_trace(report.run, args.trace, metadata=meta)
        if args.json or args.trace:
            written.append(wrote_line(p for p in (args.json, args.trace) if p))
        if args.profile:
            from npusim.report.tables import write_tables

            written.append(tables_line(write_tables(report.run, args.profile, op=report.lowered)))
        if args.plot:
            from npusim.report import plots

            paths = plots.roofline(report, args.plot) + plots.timeline(report.run, args.plot)
            written.append(plots_line(args.plot, paths))
    say_all(written)
    return 0
