"""`npusim sweep`: its arguments (beyond the step's, which npusim.cli shares with
run and compare) and the command: the grid on a backend, the CSV, the plot, the table.

Its outputs follow npusim.outputs' policy but for one thing: sweep.csv is not held
back until the end (all or none) but grows as points finish, so that an interrupted
sweep keeps every finished point and `--resume` runs only the rest. The plot's files
are written all or none once the CSV is whole; the last message says what is in --out."""

from __future__ import annotations

import argparse
import os
import time

from npusim.errors import ConfigError
from npusim.outputs import Terminated, all_or_none, err, say
from npusim.sweep_csv import CSV_NAME, PLOT_NAMES, SETTINGS_NAME

SWEEP_FILES = (CSV_NAME, *PLOT_NAMES, SETTINGS_NAME)


def add_arguments(p, progress_help: str) -> None:
    """The sweep's own flags, on the parser npusim.cli made with the step's flags."""
    from npusim.backends import BACKENDS

    p.add_argument("--hw", default="ascend910b2", help="hardware config name (hwconfigs/) or path")
    p.add_argument("--set", action="append", metavar="KEY=V1,V2,...", help="a swept hardware field (key.path) or "
                   "step knob (batch, context) and its LIST of values (V1,V2 or [V1,V2]); the grid is the product "
                   "of all")
    p.add_argument("--out", metavar="DIR", required=True, help=f"write DIR/{CSV_NAME} (growing as points finish), "
                   f"DIR/{SETTINGS_NAME} and DIR/sweep.png, .svg (a new or empty folder, unless --overwrite "
                   "or --resume)")
    p.add_argument("--overwrite", action="store_true", help="replace the sweep files of a non-empty --out")
    p.add_argument("--resume", action="store_true", help=f"keep the points DIR/{CSV_NAME} already has (same "
                   "settings only) and run the rest")
    p.add_argument("--backend", default="local", metavar="NAME", help=f"where points run: {' or '.join(BACKENDS)} "
                   "(ray: pip install \"npusim[ray]\")")
    p.add_argument("--address", metavar="ADDR", help="ray: the cluster, auto (the head `ray start --head` "
                   "started here), ray://HOST:PORT (Ray Client) or HOST:PORT (the head's GCS); default: a Ray "
                   "instance started for this sweep")
    p.add_argument("--jobs", type=int, help="workers: local processes, or the CPUs of a Ray instance started "
                   "here (default: one per CPU)")
    p.add_argument("--no-memo", action="store_true", help="simulate every layer (no layer memo)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, help=progress_help)


def check_out(args, check_outputs) -> None:
    """--out is a new or empty folder, or --overwrite / --resume was given; no output on
    an input; every sweep file can be written there."""
    from npusim.outputs import OutputError
    from npusim.outputs_check import check_paths

    check_paths({}, {}, {"--out": args.out})  # ('-' is no folder)
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite: give one (resume keeps the finished points, overwrite "
                          "starts again)")
    if os.path.exists(args.out):
        if not os.path.isdir(args.out):
            raise OutputError(f"--out {args.out}: not a folder")
        entries = os.listdir(args.out)
        if entries and not (args.overwrite or args.resume):
            raise OutputError(f"--out {args.out}: not empty ({len(entries)} entries, e.g. {sorted(entries)[0]}); "
                              "give a new or empty folder, --overwrite to replace its sweep files, or --resume "
                              "to finish an interrupted sweep")
        if entries and args.resume and not set(entries) & set(SWEEP_FILES):  # (a new or empty one starts the sweep)
            raise OutputError(f"--resume: {args.out} holds no sweep to resume ({len(entries)} entries, none of them "
                              f"{CSV_NAME}, e.g. {sorted(entries)[0]}); give the folder of the interrupted sweep")
    check_outputs(args, {f"--out ({n})": os.path.join(args.out, n) for n in SWEEP_FILES})


def main(args, step: dict, passes: str, check_outputs) -> int:
    """Run the sweep `args` describe; `step`: phase, batch, context and pass options."""
    from npusim.backends import get_backend
    from npusim.diskcache.command import store_of
    from npusim.progress import progress_bar
    from npusim.sweep import STEP_KNOBS, SweepInterrupted, params_of, parse_grid, plot, sweep, table
    from npusim.step_flags import given, workload_of

    grid = parse_grid(args.set)
    if not grid:
        raise ConfigError("sweep: nothing to sweep: give --set KEY=V1,V2,... (a hardware field, or batch / context)")
    for knob in STEP_KNOBS:
        if given(args, f"--{knob}") and knob in grid:
            raise ConfigError(f"sweep: --{knob} and --set {knob}=... both give the {knob}: drop one")
    check_out(args, check_outputs)
    backend = get_backend(args.backend, args.jobs, args.address)
    csv_path = os.path.join(args.out, CSV_NAME)
    start = time.monotonic()
    try:
        with progress_bar("sweep", "points", args.progress) as bar:
            rows = sweep(workload_of(args), grid, args.hw, passes=passes, memo=not args.no_memo, progress=bar,
                         backend=backend, out=args.out, resume=args.resume, store=store_of(args), counters=False,
                         **step)
    except SweepInterrupted as e:
        what = "terminated" if e.status == 143 else "interrupted"
        if not e.rows:  # nothing to keep: an earlier result (--overwrite) stays as it was
            err(f"npusim: {what} before any of {e.total} points finished: nothing written")
            return e.status
        rest = "--resume runs the rest" if len(e.rows) < e.total else "--resume makes the plot"
        err(f"npusim: {what}: {len(e.rows)} of {e.total} points written to {csv_path} ({rest})")
        return e.status
    seconds = time.monotonic() - start
    title = (f"{args.workload} {args.phase} batch {args.batch} x context {args.context or 'default'}, "
             f"passes {args.passes}, on {args.hw}")
    try:
        with all_or_none():  # its .png and .svg, both or neither
            plots = plot(rows, args.out, params_of(grid), title)
    except (KeyboardInterrupt, Terminated) as e:
        what, status = ("terminated", 143) if isinstance(e, Terminated) else ("interrupted", 130)
        plotted = getattr(e, "npusim_written", None)  # the signal came while the plot was put in place
        done = f"the plot: {', '.join(map(str, plotted))}" if plotted else "no plot (--resume makes it)"
        err(f"npusim: {what}: {len(rows)} of {len(rows)} points written to {csv_path}, {done}")
        return status
    say(table(rows, params_of(grid)))
    failed = sum(r["status"] != "ok" for r in rows)
    say(f"{len(rows)} points ({len(rows) - failed} ok, {failed} failed) in {seconds:.1f} s: {csv_path}, "
        + ", ".join(str(p) for p in plots))
    return 1 if failed else 0


__all__ = ["SWEEP_FILES", "add_arguments", "check_out", "main"]
