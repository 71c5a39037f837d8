"""`npusim calibrate`: fit a config's assumed fields to a user's msprof profile and/or
hccl_test output."""

from __future__ import annotations

import json
from pathlib import Path

from npusim.errors import ConfigError
from npusim.outputs import OutputError, check_paths, say, write_text


def add_arguments(p) -> None:
    p.add_argument("--profile", metavar="DIR_OR_CSV",
                   help="msprof's op_summary CSV, or a folder searched for op_summary*.csv")
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


def main(args) -> int:
    from npusim.calibrate.report import plot, summary, to_json
    from npusim.calibrate.session import calibrate
    from npusim.calibrate.write import write_config

    if args.folds < 2:
        raise ConfigError(f"--folds: expected 2 or more, got {args.folds}")
    if not args.out.endswith((".yaml", ".yml")):
        raise ConfigError(f"--out {args.out}: expected a .yaml path (the config written)")
    if Path(args.out).is_dir():
        raise OutputError(f"--out {args.out}: is a directory (expected a file path)")
    hccl = [_hccl_input(words) for words in args.hccl or []]
    inputs = {"--profile": args.profile if args.profile and Path(args.profile).is_file() else None, "--hw": args.hw}
    inputs |= {f"--hccl {path}": path for path, _ in hccl}
    check_paths({"--out": args.out, "--json": args.json}, inputs, {"--plot": args.plot})
    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else None
    cal = calibrate(args.profile, args.hw, fields, args.folds, hccl)
    say(summary(cal))
    written = [write_config(cal, args.out)]
    if args.json:
        written.append(write_text(args.json, json.dumps(to_json(cal), indent=1)))
    if args.plot:
        written += plot(cal, args.plot)
    say("wrote " + ", ".join(map(str, written)))
    return 0


def _hccl_input(words: list[str]) -> tuple[str, dict[str, str]]:
    """--hccl FILE [KEY=VALUE ...] -> (FILE, {KEY: VALUE})."""
    path, options = words[0], {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq or not key or not value:
            raise ConfigError(f"--hccl {path}: expected KEY=VALUE after the file (op=all_reduce devices=8), "
                              f"got '{word}'")
        options[key] = value
    return path, options
