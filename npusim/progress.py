"""Progress with an ETA on stderr for long commands (sweeps, compare), drawn by tqdm.

Shown when stderr is a terminal, or when forced (`--progress`); never when stderr
is captured (a pipe, a file, a test), unless forced."""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[int, int, int], None]  # (done, in all, failed)


class progress_bar:
    """A callback bar(done, total, failed) that draws `what: 3/12 UNIT |###   | [00:14<00:42]`
    on stderr; close() ends the line (call it before printing after an interruption).
    force: True always, False never, None when `stream` (default stderr) is a terminal."""

    def __init__(self, what: str, unit: str, force: bool | None = None, stream=None):
        self.what, self.unit, self.force, self.stream = what, unit, force, stream
        self.bar = None

    def __call__(self, done: int, total: int, failed: int = 0) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.what, unit=f" {self.unit}", file=self.stream or sys.stderr,
                            disable=None if self.force is None else not self.force, dynamic_ncols=True,
                            bar_format="{desc}: {n_fmt}/{total_fmt}{unit} |{bar}| [{elapsed}<{remaining}]{postfix}")
        if failed:
            self.bar.set_postfix_str(f"{failed} failed", refresh=False)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "progress_bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Progress", "progress_bar"]
