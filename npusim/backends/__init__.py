"""Where the points of a sweep run: one small interface, two backends.

    backend = get_backend("local", jobs=4)               # this machine's worker processes
    backend = get_backend("ray", address="auto")          # a Ray cluster (pip install "npusim[ray]")
    backend.run(fn, tasks, done, failed)

`run` calls fn(*tasks[i]) for every i and reports each task in this process as it
ends, in the order they end: done(i, result), or failed(i, one-line reason) when
the task could not be run at all (its worker was lost, and stayed lost through the
backend's retries). fn itself turns an npusim error into a result (a failed row),
so a point that fails that way is answered, not retried. Ctrl-C (KeyboardInterrupt)
or SIGTERM (npusim.outputs.Terminated) in this process stops the tasks still
running and propagates; what was reported before stays reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from npusim.errors import ConfigError, NpusimError
from npusim.pool import check_jobs

BACKENDS = ("local", "ray")
Done = Callable[[int, Any], None]
Failed = Callable[[int, str], None]


class BackendError(NpusimError):
    """A backend that cannot be used: its package is missing, its cluster unreachable."""


class Backend(Protocol):
    name: str

    def run(self, fn: Callable, tasks: Sequence[tuple], done: Done, failed: Failed) -> None: ...


def get_backend(name: str = "local", jobs: int | None = None, address: str | None = None) -> Backend:
    """The backend called `name`: "local" (`jobs` worker processes, default one per
    CPU; 1 runs in this process) or "ray" (a Ray cluster at `address`, or a local Ray
    instance of `jobs` CPUs when no address is given)."""
    check_jobs(jobs)
    if name == "local":
        if address is not None:
            raise ConfigError(f"--address {address}: only the ray backend connects to a cluster (add --backend ray)")
        from npusim.backends.local import LocalBackend

        return LocalBackend(jobs)
    if name == "ray":
        from npusim.backends.ray import RayBackend

        return RayBackend(address, jobs)
    raise ConfigError(f"--backend {name}: unknown backend (expected one of: {', '.join(BACKENDS)})")


__all__ = ["BACKENDS", "Backend", "BackendError", "get_backend"]
