"""The local backend: this machine's worker processes (npusim.pool), or this process
alone for one job."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from npusim.pool import run_tasks


class LocalBackend:
    """`jobs` worker processes (default one per CPU), never more than there are tasks;
    with one job the tasks run in this process, one after another."""

    name = "local"

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs

    def run(self, fn: Callable, tasks: Sequence[tuple], done, failed) -> None:
        jobs = max(1, min(self.jobs or os.cpu_count() or 1, len(tasks) or 1))
        if jobs == 1:
            for i, args in enumerate(tasks):
                done(i, fn(*args))
        else:
            run_tasks(fn, tasks, jobs, done, failed)


__all__ = ["LocalBackend"]
