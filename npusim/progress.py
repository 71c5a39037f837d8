"""Progress with an ETA on stderr for long commands (sweeps, compare), drawn by tqdm.

Shown when stderr is a terminal, or when forced (`--progress`); never when stderr
is captured (a pipe, a file, a test), unless forced."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[int, int, int], None]  # (done, in all, failed)


class progress_bar:
    """A callback bar(done, total, failed) that draws `what: 3/12 UNIT |###   | [00:14<00:42]`
    on stderr; with total None (work that finds its own size as it goes) a count,
    `what: 3 UNIT [00:14, note]`, `note` saying what is under way. close() ends the line
    (call it before printing after an interruption). force: True always, False never,
    None when `stream` (default stderr) is a terminal."""

    def __init__(self, what: str, unit: str, force: bool | None = None, stream=None):
        self.what, self.unit, self.force, self.stream = what, unit, force, stream
        self.bar = None

    def __call__(self, done: int, total: int | None, failed: int = 0, note: str = "") -> None:
        stream = self.stream or sys.stderr
        if not (self.force if self.force is not None else not hasattr(stream, "isatty") or stream.isatty()):
            return  # not shown (tqdm's rule for disable=None): tqdm is not even imported
        from tqdm import tqdm

        if self.bar is None:
            shape = ("{desc}: {n_fmt}/{total_fmt}{unit} |{bar}| [{elapsed}<{remaining}]{postfix}" if total is not None
                     else "{desc}: {n_fmt}{unit} [{elapsed}{postfix}]")
            self.bar = tqdm(total=total, desc=self.what, unit=f" {self.unit}", file=stream, dynamic_ncols=True,
                            bar_format=shape, **({} if total is not None else {"miniters": 1, "mininterval": 0}))
            # a count without a total (serve's engine steps) redraws at every call: its steps
            # are few and long, and tqdm's throttling, tuned to fast loops, left the count of
            # a burst of short steps, and the step under way, off the screen for minutes
        if failed or note:
            self.bar.set_postfix_str(", ".join(x for x in (f"{failed} failed" if failed else "", note) if x),
                                     refresh=False)
        self.bar.update(done - self.bar.n)
        if total is not None and done >= total:
            self.close()

    def close(self) -> None:
        """End the line; a later call starts a new bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "progress_bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Progress", "progress_bar"]
