"""`npusim calibrate`: fit a config's assumed fields to a user's msprof profile and/or
hccl_test output.

Its outputs follow npusim.outputs' policy: checked before the fit (npusim.outputs_check:
not an input, not each other, writable), written all or none. The config written (`base: --hw`)
never replaces --hw's file or one of its `base:` chain, whether --hw is a path or a
name, nor becomes the file a name of that chain finds first: it would load itself."""

from __future__ import annotations

import os
from pathlib import Path

from npusim.errors import ConfigError
from npusim.hw.parse import first_repeated
from npusim.outputs import OutputError, all_or_none, say, write_json
from npusim.outputs_check import check_paths, check_writable
from npusim.pool import check_jobs

PLOT_NAMES = ("calibration.png", "calibration.svg")  # what --plot DIR holds (report.plot)


def add_arguments(p) -> None:
    p.add_argument("--profile", metavar="DIR_OR_CSV", action="append",
                   help="msprof's op_summary CSV, or a folder searched for op_summary*.csv (once: a folder "
                        "holds several)")
    p.add_argument("--hccl", nargs="+", action="append", metavar=("FILE", "KEY=VALUE"),
                   help="hccl_test's output (all_reduce_test, all_gather_test, reduce_scatter_test, alltoall_test), "
                        "fitted with --profile's rows or alone; repeat for more files. The test and the ranks come "
                        "from an 'mpirun -n 8 ./bin/all_reduce_test ...' line in the file, or from op=all_reduce "
                        "devices=8 [dtype=fp16] after the file")
    p.add_argument("--hw", default="ascend910b2", help="the config calibrated: name (hwconfigs/) or path")
    p.add_argument("--out", required=True, metavar="PATH", help="write the calibrated config (YAML, base: --hw)")
    p.add_argument("--fields", metavar="F1,F2,...", help="fit only these assumed fields (default: every assumed "
                   "field the profile's ops identify)")
    p.add_argument("--folds", type=int, default=5, help="k of the k-fold cross-validation over distinct ops")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON (every row's times too)")
    p.add_argument("--plot", metavar="DIR", help="write calibration.png and .svg: simulated against measured")
    p.add_argument("--jobs", type=int, help="worker processes simulating the ops of a trial config at once; the "
                   "result does not depend on it (default: the machine's CPUs)")


def main(args) -> int:
    from npusim.calibrate.report import plot, summary, to_json
    from npusim.calibrate.session import calibrate
    from npusim.calibrate.write import write_config

    if args.profile and len(args.profile) > 1:  # argparse kept the last: the others' rows were left out silently
        raise ConfigError(f"--profile given {len(args.profile)} times ({', '.join(args.profile)}): give it once, a "
                          f"CSV or a folder holding every op_summary*.csv to fit")
    args.profile = args.profile[0] if args.profile else None
    check_folds(args.folds)
    jobs = check_jobs(args.jobs) or os.cpu_count() or 1
    fields = parse_fields(args.fields)
    if not args.out.endswith((".yaml", ".yml")):
        raise ConfigError(f"--out {args.out}: expected a .yaml path (the config written)")
    if Path(args.out).is_dir():
        raise OutputError(f"--out {args.out}: is a directory (expected a file path)")
    hccl = [_hccl_input(words) for words in args.hccl or []]
    chain = _chain(args.hw)
    inputs = {}
    if args.profile:  # every file the fit reads: a folder's op_summary CSVs, and the step file beside each
        from npusim.calibrate.profile import STEP_FILE, profile_files

        for csv in profile_files(args.profile):
            inputs |= {f"--profile {csv}": str(csv), f"--profile {csv.parent / STEP_FILE}": str(csv.parent / STEP_FILE)}
    inputs |= {"--hw" if i == 0 else f"--hw's base {path}": str(path) for i, (_, path) in enumerate(chain)}
    inputs |= {f"--hccl {path}": path for path, _ in hccl}
    files = {"--out": args.out, "--json": args.json}
    if args.plot:
        files |= {f"--plot ({name})": os.path.join(args.plot, name) for name in PLOT_NAMES}
    check_paths(files, inputs, {"--plot": args.plot})
    for name, path in chain:
        if name is not None and _found_first(name, Path(args.out)):
            raise OutputError(f"--out {args.out}: the name '{name}' (of --hw or its base chain) would then find it "
                              f"instead of {path}: the calibrated config would load itself (give another path)")
    check_writable(files, {"--plot": args.plot})
    cal = calibrate(args.profile, args.hw, fields, args.folds, hccl, jobs)
    say(summary(cal))
    with all_or_none() as written:  # an interruption or a failure between two outputs leaves none of them
        write_config(cal, args.out)
        if args.json:
            write_json(args.json, to_json(cal))
        if args.plot:
            plot(cal, args.plot)
    say("wrote " + ", ".join(map(str, written)))
    return 0


def check_folds(folds: int) -> None:
    """--folds k: a cross-validation holds out one of k folds, so k is 2 or more (below,
    no op would be held out and the report would have no held-out error)."""
    if folds < 2:
        raise ConfigError(f"--folds: expected 2 or more, got {folds}")


def parse_fields(text: str | None) -> list[str] | None:
    """--fields F1,F2,...: the fields named (None: not given, every field); a list naming
    none (',') is not the option left out, and a field named twice is a slip."""
    if text is None:
        return None
    fields = [f.strip() for f in text.split(",") if f.strip()]
    if not fields:
        raise ConfigError(f"--fields {text}: expected a comma list of field names, got none")
    twice = first_repeated(fields)
    if twice is not None:
        raise ConfigError(f"--fields {text}: '{twice}' given twice")
    return fields


def _chain(hw: str) -> list[tuple[str | None, Path]]:
    """The files the config `hw` loads: its own, then its `base:` chain's, each with the
    name it is looked up by in hwconfigs/ (None: by its path), as npusim.hw.load reads
    them; as far as they resolve (a config that does not load is the fit's to report)."""
    from npusim.hw.load import MAX_BASE_DEPTH, find_file
    from npusim.hw.parse import read_yaml

    chain: list[tuple[str | None, Path]] = []
    ref: str | Path = hw
    while len(chain) <= MAX_BASE_DEPTH:
        by_name = Path(ref).suffix not in (".yaml", ".yml", ".json") and not Path(ref).exists()
        try:
            path = find_file(ref, "hwconfigs")
            base = read_yaml(path).get("base")
        except (ConfigError, OSError):
            break
        if any(path.resolve() == p.resolve() for _, p in chain):  # a loop: the loader says so
            break
        chain.append((str(ref) if by_name else None, path))
        if not isinstance(base, str):
            break
        # a path is relative to the file naming it; a bare name is looked up in hwconfigs/
        ref = path.parent / base if Path(base).suffix in (".yaml", ".yml") else base
    return chain


def _found_first(name: str, out: Path) -> bool:
    """`out`, once written, is the file the config name `name` finds (it is, or comes
    before, the first match in the folders hwconfigs/ are searched in)."""
    from npusim.hw.load import search_dirs

    target = os.path.realpath(out)
    for folder in search_dirs("hwconfigs"):
        for ext in (".yaml", ".yml"):
            candidate = folder / f"{name}{ext}"
            if os.path.realpath(candidate) == target:
                return True
            if candidate.is_file():
                return False
    return False


def _hccl_input(words: list[str]) -> tuple[str, dict[str, str]]:
    """--hccl FILE [KEY=VALUE ...] -> (FILE, {KEY: VALUE})."""
    path, options = words[0], {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq or not key or not value:
            raise ConfigError(f"--hccl {path}: expected KEY=VALUE after the file (op=all_reduce devices=8), "
                              f"got '{word}'")
        if key in options:  # devices=8 devices=4: the last was taken silently
            raise ConfigError(f"--hccl {path}: {key}= given twice ({key}={options[key]}, {word})")
        options[key] = value
    return path, options
