"""A command's printed text and JSON report, served from the store when the same command ran before.

`npusim run` and `npusim op` print a summary and may write a JSON report; neither
needs the simulated run itself once those exist. `replayed(command)` keys a
command on its arguments (output paths left out), the hardware config and the
workload by value, the files they came from and npusim's source (keys.source_version:
the printed text is the reports' as much as the model's): on a hit it
prints what the first run printed and writes its JSON with this command line in
the provenance, without importing the pipeline at all - which is what makes a
warm rerun of a K3 decode step take a fraction of a second. On a miss the command
runs as usual (its simulated step goes through the step cache, which knows which
hardware fields a step reads: compute.py); what it printed and wrote is stored.
A command asking for a trace, profile tables or plots always runs (those need the run).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Callable

from npusim.outputs import descriptor, say, write_json, wrote_line

# flags that name outputs or steer the cache and the terminal, not what is computed
_NOT_INPUTS = frozenset({"json", "trace", "profile", "plot", "progress", "cache_dir", "no_cache", "argv", "func",
                         "parser"})


class _Tee(io.TextIOBase):
    """Writes go to `out` and are kept."""

    def __init__(self, out):
        self.out, self.kept = out, []

    def write(self, text: str) -> int:
        self.kept.append(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def _key(args) -> str | None:
    """The command's key, or None when its inputs do not load (the command then runs
    and reports the problem in its own words)."""
    from npusim.diskcache.keys import digest, file_digest, source_version
    from npusim.errors import NpusimError
    from npusim.hw import load_hw
    from npusim.hw.load import find_file, parse_set_args

    try:
        hw = load_hw(args.hw, parse_set_args(args.set))
        parts = {k: v for k, v in sorted(vars(args).items()) if k not in _NOT_INPUTS}
        parts["json"] = bool(getattr(args, "json", None))  # a JSON report is stored only if one was written
        if getattr(args, "workload", None) is not None:
            from npusim.step_flags import workload_sets
            from npusim.workload import load_workload

            # with the fields --workload-set changes: a routing trace set so is keyed on its content too
            parts["workload"] = (args.workload, load_workload(args.workload, workload_sets(args)))
            with contextlib.suppress(NpusimError):  # (a Hugging Face file: its path is in the value's name)
                parts["workload_file"] = str(find_file(args.workload, "workloads").resolve())
        if getattr(args, "fusion_rules", None):
            parts["fusion_rules"] = file_digest(args.fusion_rules)
        return digest("command", args.command, source_version(), hw, parts)
    except (NpusimError, OSError, TypeError, ValueError):
        return None


def _replayable(value) -> bool:
    """A stored run as run() stores it: its printed text, and its JSON report or None."""
    return (isinstance(value, dict) and isinstance(value.get("stdout"), str)
            and (value.get("json") is None or isinstance(value["json"], dict)
                 and isinstance(value["json"].get("provenance"), dict)))


def replayed(command: Callable, check_outputs: Callable) -> Callable:
    """`command(args)`, served from the store when it ran before (see the module doc).
    `check_outputs(args)`: the command's own check of its output paths, made before
    a hit writes anything (a JSON report is never written over an input)."""

    def run(args) -> int:
        from npusim.diskcache.command import store_of

        store = store_of(args)
        if args.trace or args.profile or args.plot or not store.enabled:
            return command(args)
        check_outputs(args)
        key = _key(args)
        hit = store.get(key, expected=_replayable) if key else None
        if hit is not None:
            if hit["stdout"]:
                say(hit["stdout"].removesuffix("\n"))
            if args.json:
                data = hit["json"] | {"provenance": hit["json"]["provenance"] | {"command": args.argv}}
                write_json(args.json, data)
                say(wrote_line([args.json]))
            return 0
        tee = _Tee(sys.stdout)
        with contextlib.redirect_stdout(tee):
            status = command(args)
        if status == 0 and key:
            data = None
            if args.json:
                if descriptor(args.json) is not None or not os.path.isfile(args.json):  # a device, /dev/stdout: not kept
                    return status
                with open(args.json) as f:
                    data = json.load(f)
            # the line naming the JSON is this command's, not the stored run's (a hit names its own path)
            printed = "".join(tee.kept).removesuffix(wrote_line([args.json]) + "\n" if args.json else "")
            store.put(key, {"stdout": printed, "json": data})
        return status

    return run


__all__ = ["replayed"]
