"""The step's command-line flags as the commands that run steps read them (run,
compare, sweep, validate, op): context lengths, the batch (one prompt in prefill), a
pass pipeline, --set overrides, pass options, the two sides of `compare --hw A B`,
`--variant` and `--fusion-rules A B`; and the check, before anything runs, that every
output can be written and lands neither on an input nor on another output."""

from __future__ import annotations

import contextlib
import os
import re

from npusim.parallel.flags import plan_args

# A whole number as a flag takes it: ASCII digits (int() would also read '1_000' and
# other scripts' digits), a sign left for the range checks to word.
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _integers(text: str, flag: str, expected: str) -> list[int]:
    """A comma list of whole numbers; anything else is `FLAG: expected EXPECTED, got 'TEXT'`."""
    from npusim.errors import ConfigError
    from npusim.hw.parse import short

    words = [w.strip() for w in text.split(",")]
    if all(_INTEGER.fullmatch(w) for w in words):
        with contextlib.suppress(ValueError):  # an integer of more digits than Python converts
            return [int(w) for w in words]
    raise ConfigError(f"{flag}: expected {expected}, got {short(text)}")


def lengths(text: str):
    """--context 4096, or one length per sequence: 4096,1000,77."""
    values = _integers(text, "--context", "an integer or a comma list of integers")
    return values[0] if len(values) == 1 else values


def pipeline(text: str, flag: str = "--passes") -> str:
    """A pipeline as run and compare take it: a name or one comma list of passes. A
    comma list naming two pipelines (baseline,optimized) is one pipeline, their
    union - never what was meant, so it is refused with the syntax of both commands."""
    from npusim.errors import ConfigError
    from npusim.hw.parse import first_repeated
    from npusim.passes import PIPELINES

    words = [s.strip() for s in text.split(",")]
    if len(words) > 1 and "" in words:  # fusion,,memplan: a pass left out, or a stray comma
        raise ConfigError(f"{flag} {text}: an empty item in the comma list; expected pipelines and passes "
                          "separated by single commas")
    twice = first_repeated(w for w in words if w not in PIPELINES)
    if twice is not None:  # as a pipeline named twice: the list is not the one meant
        raise ConfigError(f"{flag} {text}: the pass {twice} is named twice")
    named = [s for s in words if s in PIPELINES]
    if len(named) > 1 and len(set(named)) == 1:  # compare --passes optimized optimized is refused too
        raise ConfigError(f"{flag} {text}: the pipeline {named[0]} is named twice")
    if len(named) > 1:
        raise ConfigError(f"{flag} {text}: a comma list is ONE pipeline (its passes together); to compare "
                          f"pipelines give them as separate words: npusim compare --passes {' '.join(named)}")
    return text


def overrides(args) -> dict:
    """--set KEY=VALUE of run, compare, op and hw show: one value per --set."""
    from npusim.errors import ConfigError
    from npusim.hw.load import parse_set_args

    from npusim.sweep import STEP_KNOBS

    overrides = parse_set_args(args.set)
    for key, value in overrides.items():
        if key in STEP_KNOBS:  # a step knob only a sweep's grid takes by --set; else "unknown key 'batch'"
            command = getattr(args, "command", "")
            how = (f"; an op's is a parameter: npusim op TYPE {key}={value}" if command == "op"
                   else f"; give it as --{key} {value}" if command in ("run", "compare") else "")
            raise ConfigError(f"--set {key}={value}: {key} is not a hardware field (what --set sets){how}")
        if "," in value and not _flow_mapping(value):  # {m0: 16, n0: 16, k0: 16}: one value, the fields it sets
            raise ConfigError(f"--set {key}={value}: takes one value here (a list of values is a sweep: "
                              f"npusim sweep --set {key}={value} --out DIR)")
    return overrides


def _flow_mapping(value: str) -> bool:
    """A --set value written as a YAML mapping, {field: value, ...}: its commas part the
    fields it sets (the loader merges it into the section), not a sweep's values."""
    return value.startswith("{") and value.endswith("}")


def add_workload_set(p) -> None:
    """--workload-set KEY=VALUE, on the commands that run a workload's steps."""
    p.add_argument("--workload-set", action="append", metavar="KEY=VALUE",
                   help="change one field of the workload for this run, e.g. --workload-set routing=zipf "
                   "--workload-set capacity_factor=1.25 (repeat for more fields; the workload files list them)")


def workload_sets(args) -> dict[str, str]:
    """--workload-set KEY=VALUE of the commands that run steps (a workload field each)."""
    from npusim.hw.load import parse_set_args

    return parse_set_args(getattr(args, "workload_set", None), "--workload-set")


def file_sets_absolute(sets: dict[str, str]) -> dict[str, str]:
    """--workload-set values as a step file records them (npusim run --profile, rerun by
    calibrate from any folder): a file field's relative path (routing_trace) made absolute,
    as the working folder read it. Recorded as given, it was read again from calibrate's
    folder: 'no file' there, or another file of that name, silently."""
    import attrs

    from npusim.workload import Workload

    files = {a.name for a in attrs.fields(Workload) if a.metadata.get("file")}
    return {k: os.path.abspath(v) if k in files and v and not os.path.isabs(v) else v for k, v in sets.items()}


def workload_of(args):
    """The step's workload: --workload as given (a name or a path), or, with --workload-set,
    that workload with the fields changed."""
    from npusim.workload import load_workload

    sets = workload_sets(args)
    return load_workload(args.workload, sets) if sets else args.workload


def pass_options(args) -> dict:
    """Options of the passes given on the command line (None: the pass's default)."""
    from npusim.passes import check_options

    from npusim.errors import ConfigError

    if args.margin is not None and args.margin < 0:  # the pass says it as "buckets: ... margin >= 0"
        raise ConfigError(f"--margin: expected a whole number of tokens >= 0, got {args.margin}")
    if args.quant_layers is not None:
        from npusim.passes.quantize import LAYER_CHOICES, layer_names

        if args.quant_layers not in LAYER_CHOICES:
            layer_names(args.quant_layers)  # its syntax, before a cached step answers for the list
    buckets = bucket_lengths(args) if args.buckets else None
    rules = args.fusion_rules  # compare --fusion-rules A B: a list, each side given its own (step_flags.sides)
    rules = rules[0] if isinstance(rules, list) else rules
    options = dict(fusion_rules=rules, kv_layout=args.kv_layout, buckets=buckets, margin=args.margin,
                   quant=args.quant, quant_layers=args.quant_layers, smooth_alpha=args.smooth_alpha)
    check_options([args.passes] if isinstance(args.passes, str) else args.passes, options)
    return options


def bucket_lengths(args) -> tuple[int, ...]:
    """--buckets L1,L2,...: positive lengths, strictly increasing (passes.buckets.out_of_order),
    none past the step's workload's max context (the pass never pads beyond it, so a longer
    bucket would be cut silently)."""
    from npusim.errors import ConfigError
    from npusim.passes.buckets import out_of_order
    from npusim.workload import load_workload

    values = _integers(args.buckets, "--buckets", "a comma list of lengths")
    workload = workload_of(args)
    workload = load_workload(workload) if isinstance(workload, (str, os.PathLike)) else workload
    given = f"--buckets {args.buckets}"
    after = out_of_order(values)
    for length in values:
        if length < 1:
            raise ConfigError(f"{given}: expected positive lengths, got {length}")
    if after:
        raise ConfigError(f"{given}: expected strictly increasing lengths, got {after[1]} after {after[0]}")
    for length in values:
        if length > workload.max_context_tokens:
            raise ConfigError(f"{given}: {length} is past {workload.name}'s max context "
                              f"({workload.max_context_tokens} tokens), which the buckets pass never pads beyond")
    return tuple(values)


def context(args):
    """--context as the step takes it (None: the workload's default); its lengths positive
    and, a comma list, one per sequence of --batch (the step builder checks both too, but
    in its own terms: build_decoder(k3, decode): ...)."""
    from npusim.errors import ConfigError

    if not args.context:
        return None
    value = lengths(args.context)
    values = value if isinstance(value, list) else [value]
    bad = [n for n in values if n < 1]
    if bad:
        raise ConfigError(f"--context {args.context}: lengths must be positive integers, got {bad[0]}")
    batch = getattr(args, "batch", None)
    if isinstance(value, list) and isinstance(batch, int) and len(value) != batch:
        raise ConfigError(f"--context {args.context}: {len(value)} lengths for batch {batch}")
    _within_max_context(args, max(values))
    return value


def _within_max_context(args, longest: int) -> None:
    """--context no longer than the workload's max_context_tokens (the step builder refuses
    it too, in its own terms: 'build_decoder(k3, decode): length 100000 exceeds ...', the
    flag unnamed). A workload that does not load is left to the command to report."""
    from npusim.errors import ConfigError, NpusimError
    from npusim.workload import load_workload

    if getattr(args, "workload", None) is None:
        return
    try:
        w = load_workload(args.workload, workload_sets(args))
    except (NpusimError, OSError, TypeError, ValueError):
        return
    if longest > w.max_context_tokens:
        raise ConfigError(f"--context {args.context} (--workload {args.workload}): length {longest} exceeds the "
                          f"workload's max_context_tokens {w.max_context_tokens}")


PREFILL_BATCH = 1  # --phase prefill without --batch: one prompt


def default_batch(args) -> None:
    """--batch not given: one prompt in prefill, the command's decode default
    (`decode_batch`, which its --help shows) in decode. Set on a step command's
    parsed arguments, before anything reads them."""
    if getattr(args, "batch", 0) is None and hasattr(args, "decode_batch"):
        args.batch = PREFILL_BATCH if args.phase == "prefill" else args.decode_batch


def _label(value: str, others) -> str:
    """A side's column name: a path's file stem, a name as given; as given when two
    stems are the same."""
    stems = [os.path.splitext(os.path.basename(v))[0] for v in others]
    return value if len(set(stems)) < len(stems) else os.path.splitext(os.path.basename(value))[0]


def _variant(words: list[str]) -> dict:
    """One --variant group: KEY.PATH=VALUE words, one value each (as --set)."""
    from npusim.errors import ConfigError
    from npusim.hw.load import parse_set_args

    try:
        overrides = parse_set_args(words)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--set", "--variant", 1)) from None
    for key, value in overrides.items():
        if "," in value and not _flow_mapping(value):
            raise ConfigError(f"--variant {key}={value}: takes one value (a list of values is a sweep: "
                              f"npusim sweep --set {key}={value} --out DIR)")
    return overrides


def sides(args) -> dict[str, dict] | None:
    """compare's two sides, {column name: what it changes (compare's `sides`)}, from
    `--hw A B`, `--variant K=V...` (once: against the unmodified config; twice: one
    against the other) or `--fusion-rules A B`; None when none is given (pipelines are
    compared). A flag given one value is left as that value, as the rest of the command
    reads it; the two of `--hw A B` or `--fusion-rules A B` stay a list (both are inputs:
    step_flags.inputs)."""
    from npusim.errors import ConfigError

    hws = args.hw if isinstance(args.hw, list) else [args.hw]
    rules = args.fusion_rules if isinstance(args.fusion_rules, list) else [args.fusion_rules]
    variants = args.variant or []
    for flag, values in (("--hw", hws), ("--fusion-rules", rules), ("--variant", variants)):
        if len(values) > 2:
            shown = " ".join(" ".join(v) if isinstance(v, list) else v for v in values)
            raise ConfigError(f"{flag} {shown}: expected at most two to compare (A and B), got {len(values)}")
    given = [flag for flag, n in (("--hw A B", len(hws)), ("--fusion-rules A B", len(rules)),
                                  ("--variant", 2 * len(variants))) if n > 1]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)}: compare one thing at a time (two configs, two --variant groups "
                          "or two fusion-rules files), the rest the same on both sides")
    args.hw = hws[0] if len(hws) == 1 else hws
    args.fusion_rules = rules[0] if len(rules) == 1 else rules
    if not given:
        return None
    if len(hws) == 2:
        out = {_label(h, hws): {"hw": h} for h in hws}
        same = len(out) < 2 or _same_file(hws, "hwconfigs")
        what = f"--hw {' '.join(hws)}"
    elif len(rules) == 2:
        out = {_label(r, rules): {"fusion_rules": r} for r in rules}
        same = len(out) < 2 or _same_file(rules, None)
        what = f"--fusion-rules {' '.join(rules)}"
    else:
        groups = [_variant(v) for v in variants]
        if len(groups) == 1:
            groups.insert(0, {})
        out = {(" ".join(f"{k}={v}" for k, v in g.items()) or "unmodified"): {"overrides": g} for g in groups}
        same = len(out) < 2
        what = " ".join("--variant " + " ".join(v) for v in variants)
    if same:
        raise ConfigError(f"{what}: the same on both sides, nothing to compare (give two different ones)")
    return out


def _same_file(values, kind: str | None) -> bool:
    """Whether two config names or paths are the same file."""
    from npusim.errors import ConfigError
    from npusim.hw.load import find_file

    def where(v):
        try:
            return os.path.realpath(find_file(v, kind) if kind else v)
        except ConfigError:
            return v  # unknown: the run reports it

    return where(values[0]) == where(values[1])


def given(args, flag: str) -> bool:
    """Was `flag` (e.g. "--batch") on the command line: `flag VALUE`, `flag=VALUE`, or
    abbreviated as argparse takes it (`--bat 4`: a prefix argparse found unambiguous)?"""
    words = (a.split("=", 1)[0] for a in getattr(args, "argv", ()))
    return any(len(w) > 2 and w.startswith("--") and flag.startswith(w) for w in words)


def add_fast_forward_flag(p) -> None:
    """--fast-forward (run, op, serve): price a kernel that repeats many identical waves
    from a few of them (npusim.engine.fastforward); without it (args.exact) every kernel
    is simulated in full. Opt-in: on an L2-thrashing kernel (notebook 03's unfused
    attention chain at S = 4096) it was 1.2% off, beyond the 1% it is held to."""
    p.add_argument("--fast-forward", dest="exact", action="store_false",
                   help="price kernels that repeat many identical waves from a few of them (the summary says which) "
                        "and keep identical blocks that come apart simulated as one: faster on large prefills, "
                        "within about 1%% (default: off, every kernel simulated in full)")


def fast_forward_key(exact: bool) -> tuple:
    """What a cached result's key adds for how it was priced: nothing when exact (as every
    result was before fast-forward existed), the fast-forward's parameters otherwise."""
    if exact:
        return ()
    from npusim.engine import fastforward, fastforward_blocks

    return (("fast-forward", *fastforward.PARAMETERS, *fastforward_blocks.PARAMETERS),)


def step_args(args) -> dict:
    return dict(phase=args.phase, batch=args.batch, context=context(args),
                overrides=overrides(args), **pass_options(args), **plan_args(args))


def inputs(args) -> dict:
    """The input files of a command, by flag (None: a name that resolves to no file), each
    checked before anything opens it (hw.parse.input_file: a named pipe or a device given
    for one would block or never end; --workload may be a folder, a Hugging Face model's)."""
    from npusim.errors import ConfigError
    from npusim.hw.load import find_file
    from npusim.hw.parse import input_file

    def path(value, kind):
        if value is None:
            return None
        try:
            return str(find_file(value, kind))
        except ConfigError:  # unknown: the command reports it in its turn
            return value if os.path.exists(value) else None

    def each(flag, values, kind):  # compare --hw A B, --fusion-rules A B: both are inputs
        if not isinstance(values, list):
            return {flag: path(values, kind) if kind else values}
        return {(flag if i == 0 else f"{flag} (B)"): path(v, kind) if kind else v for i, v in enumerate(values)}

    found = {**each("--hw", getattr(args, "hw", None), "hwconfigs"),
             "--workload": path(getattr(args, "workload", None), "workloads"),
             **each("--fusion-rules", getattr(args, "fusion_rules", None), None), **_workload_files(args)}
    for flag, value in found.items():
        if value is not None:
            input_file(value, f"{flag} {value}", folder=flag == "--workload")
        if flag.startswith("--fusion-rules") and value is not None and not os.path.exists(value):
            # a path, never a name: missing (or a dangling link), it was "/x.yaml: No such file or
            # directory", the flag unnamed
            raise ConfigError(f"{flag} {value}: no such file")
    return found


def _workload_files(args) -> dict:
    """The files the workload reads (its routing trace), as inputs named by the field: an
    output on one replaced what the run had read. None if the workload does not load (the
    command reports it in its turn)."""
    import attrs

    from npusim.errors import NpusimError
    from npusim.workload import load_workload

    if getattr(args, "workload", None) is None:
        return {}
    try:
        w = load_workload(args.workload, workload_sets(args))
    except (NpusimError, OSError, TypeError, ValueError):
        return {}
    return {f"--workload's {a.name}": getattr(w, a.name) for a in attrs.fields(type(w))
            if a.metadata.get("file") and getattr(w, a.name)}


def check_outputs(args, extra: dict | None = None, plots: tuple[str, ...] = (),
                  tables: tuple[str, ...] | None = None) -> None:
    """Before running: no output on an input, no two outputs on one path, none that
    cannot be written (outputs_check.check_paths, check_writable). `extra`: the command's
    further files, by the flag that asks for them; `plots`: the files --plot DIR will
    hold (no other output may be one of them: the plot would replace it); `tables`: those
    --profile DIR will hold (default report.tables.TABLE_FILES)."""
    from npusim.outputs_check import check_paths, check_writable

    files = {"--json": getattr(args, "json", None), "--trace": getattr(args, "trace", None)}
    folders = {"--profile": getattr(args, "profile", None), "--plot": getattr(args, "plot", None)}
    if folders["--profile"]:
        from npusim.report.tables import TABLE_FILES

        files |= {f"--profile ({name})": os.path.join(folders["--profile"], name)
                  for name in (TABLE_FILES if tables is None else tables)}
    files |= extra or {}
    plotted = {f"--plot ({name})": os.path.join(folders["--plot"], name) for name in plots} if folders["--plot"] else {}
    check_paths(files | plotted, inputs(args), folders)
    check_writable(files, folders)
    check_writable(plotted)  # a folder in a plot's place: the run, then an error without the flag


__all__ = ["PREFILL_BATCH", "add_fast_forward_flag", "add_workload_set", "bucket_lengths", "check_outputs",
           "context", "default_batch", "fast_forward_key", "file_sets_absolute", "given", "inputs", "lengths",
           "overrides", "pass_options", "pipeline", "sides", "step_args", "workload_of", "workload_sets"]
