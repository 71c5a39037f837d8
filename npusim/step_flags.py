"""The step's command-line flags as the commands that run steps read them (run,
compare, sweep, validate, op): context lengths, a pass pipeline, --set overrides,
pass options; and the check, before anything runs, that every output can be written
and lands neither on an input nor on another output."""

from __future__ import annotations

import os

from npusim.parallel.flags import plan_args


def lengths(text: str):
    """--context 4096, or one length per sequence: 4096,1000,77."""
    from npusim.errors import ConfigError

    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--context: expected an integer or a comma list of integers, got '{text}'") from None
    return values[0] if len(values) == 1 else values


def pipeline(text: str, flag: str = "--passes") -> str:
    """A pipeline as run and compare take it: a name or one comma list of passes. A
    comma list naming two pipelines (baseline,optimized) is one pipeline, their
    union - never what was meant, so it is refused with the syntax of both commands."""
    from npusim.errors import ConfigError
    from npusim.passes import PIPELINES

    named = [s.strip() for s in text.split(",") if s.strip() in PIPELINES]
    if len(named) > 1:
        raise ConfigError(f"{flag} {text}: a comma list is ONE pipeline (its passes together); to compare "
                          f"pipelines give them as separate words: npusim compare --passes {' '.join(named)}")
    return text


def overrides(args) -> dict:
    """--set KEY=VALUE of run, compare, op and hw show: one value per --set."""
    from npusim.errors import ConfigError
    from npusim.hw.load import parse_set_args

    overrides = parse_set_args(args.set)
    for key, value in overrides.items():
        if "," in value:
            raise ConfigError(f"--set {key}={value}: takes one value here (a list of values is a sweep: "
                              f"npusim sweep --set {key}={value} --out DIR)")
    return overrides


def pass_options(args) -> dict:
    """Options of the passes given on the command line (None: the pass's default)."""
    from npusim.errors import ConfigError

    buckets = None
    if args.buckets:
        try:
            buckets = tuple(int(x) for x in args.buckets.split(","))
        except ValueError:
            raise ConfigError(f"--buckets: expected a comma list of lengths, got '{args.buckets}'") from None
    from npusim.passes import check_options

    options = dict(fusion_rules=args.fusion_rules, kv_layout=args.kv_layout, buckets=buckets, margin=args.margin,
                   quant=args.quant, quant_layers=args.quant_layers, smooth_alpha=args.smooth_alpha)
    check_options([args.passes] if isinstance(args.passes, str) else args.passes, options)
    return options


def context(args):
    """--context as the step takes it (None: the workload's default)."""
    return lengths(args.context) if args.context else None


def step_args(args) -> dict:
    return dict(phase=args.phase, batch=args.batch, context=context(args),
                overrides=overrides(args), **pass_options(args), **plan_args(args))


def inputs(args) -> dict:
    """The input files of a command, by flag (None: a name that resolves to no file)."""
    from npusim.errors import ConfigError
    from npusim.hw.load import find_file

    def path(value, kind):
        if value is None:
            return None
        try:
            return str(find_file(value, kind))
        except ConfigError:  # unknown: the command reports it in its turn
            return value if os.path.exists(value) else None

    return {"--hw": path(getattr(args, "hw", None), "hwconfigs"),
            "--workload": path(getattr(args, "workload", None), "workloads"),
            "--fusion-rules": getattr(args, "fusion_rules", None)}


def check_outputs(args, extra: dict | None = None) -> None:
    """Before running: no output on an input, no two outputs on one path, none that
    cannot be written (outputs.check_paths, check_writable). `extra`: the command's
    further files, by the flag that asks for them."""
    from npusim.outputs import check_paths, check_writable

    files = {"--json": getattr(args, "json", None), "--trace": getattr(args, "trace", None)}
    folders = {"--profile": getattr(args, "profile", None), "--plot": getattr(args, "plot", None)}
    if folders["--profile"]:
        from npusim.report.tables import TABLE_FILES

        files |= {f"--profile ({name})": os.path.join(folders["--profile"], name) for name in TABLE_FILES}
    files |= extra or {}
    check_paths(files, inputs(args), folders)
    check_writable(files, folders)


__all__ = ["check_outputs", "context", "inputs", "lengths", "overrides", "pass_options", "pipeline", "step_args"]
