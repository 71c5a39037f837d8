"""Progress with an ETA on stderr for long commands (sweeps, compare), drawn by tqdm.

Shown when stderr is a terminal, or when forced (`--progress`); never when stderr
is captured (a pipe, a file, a test), unless forced."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[int, int, int], None]  # (done, in all, failed)


def progress_bar(what: str, unit: str, force: bool | None = None, stream=None) -> Progress:
    """A callback progress(done, total, failed) that draws `what: 3/12 UNIT [00:14<00:42, ...]`.
    force: True always, False never, None when `stream` (default stderr) is a terminal."""
    from tqdm import tqdm

    state: dict = {}

    def show(done: int, total: int, failed: int = 0) -> None:
        bar = state.get("bar")
        if bar is None:
            bar = state["bar"] = tqdm(total=total, desc=what, unit=f" {unit}", file=stream or sys.stderr,
                                      disable=None if force is None else not force, dynamic_ncols=True,
                                      bar_format="{desc}: {n_fmt}/{total_fmt}{unit} |{bar}| "
                                                 "[{elapsed}<{remaining}]{postfix}")
        if failed:
            bar.set_postfix_str(f"{failed} failed", refresh=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return show


__all__ = ["Progress", "progress_bar"]
