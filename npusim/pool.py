"""Worker processes for independent tasks (the points of a sweep), such that:

- each worker runs one task at a time and the parent knows which, so a worker that
  dies (kill -9, the host's out-of-memory killer) costs only the task it was running:
  that task is reported failed, a new worker takes its place and the rest go on;
- workers die with their parent, even when the parent is killed outright: on Linux
  the kernel sends them SIGKILL when it exits (prctl PR_SET_PDEATHSIG, one call via
  ctypes, no thread in the worker); elsewhere a thread in each worker watches the
  parent's pid;
- Ctrl-C (or SIGTERM turned into an exception by the CLI) in the parent ends the
  workers at once (SIGTERM, then SIGKILL), without waiting for their running tasks;
- while a worker starts the parent holds Ctrl-C and SIGTERM (signal.pthread_sigmask);
  where there is no pthread_sigmask (Windows) they are not held, and one landing in
  that moment may be reported as "Exception ignored" instead of stopping the run.

concurrent.futures.ProcessPoolExecutor cannot do the first: when a worker dies it
fails every pending future, and does not say which task the dead worker held.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any

from npusim.errors import ConfigError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_S = 0.5  # without prctl: how often a worker checks its parent is alive
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
STOP_GRACE_S = 1.0  # how long a worker told to stop (SIGTERM) may take before SIGKILL
# The most --jobs takes. Each local worker is a forked process whose pipe and sentinel
# the parent holds open: past about 500 workers the usual open-file limit (ulimit -n
# 1024) runs out, and long before that memory does (each worker holds its own engine).
# 1024 is more CPUs than any one host npusim runs on or Ray instance it starts; a
# larger value is a typo (an extra digit), not a machine, and forked thousands of workers.
JOBS_MAX = 1024


def _die_with_parent(parent: int) -> None:
    """End this worker when the process `parent` ends."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0:
                if os.getppid() != parent:  # the parent ended before prctl took effect
                    os._exit(1)
                return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _serve(conn, fn: Callable, parent: int) -> None:
    """A worker: run fn(*args) for each (index, args) received; None ends it."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the parent decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a handler inherited from the parent would not end a worker
    if hasattr(signal, "pthread_sigmask"):  # held by the parent while it forked
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        index, args = task
        try:
            conn.send((index, True, fn(*args)))
        except Exception as e:  # noqa: BLE001 - the task's failure is reported, the worker goes on
            conn.send((index, False, one_line(e)))


def check_jobs(jobs: int | None) -> int | None:
    """--jobs: a number of workers from 1 to JOBS_MAX, or None (not given: the command's default)."""
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"--jobs: expected a positive integer, got {jobs}")
    if jobs is not None and jobs > JOBS_MAX:
        raise ConfigError(f"--jobs: expected at most {JOBS_MAX} workers, got {jobs}")
    return jobs


def one_line(e: BaseException) -> str:
    """An exception as `Type: first line of its message`."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


@contextlib.contextmanager
def _stop_signals_held():
    """A signal that lands inside fork's bookkeeping is swallowed ("Exception ignored"):
    hold Ctrl-C and SIGTERM for the block, then take them. Without signal.pthread_sigmask
    (Windows) nothing is held (see the module doc)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class _Worker:
    def __init__(self, fn: Callable):
        self.conn, child = multiprocessing.Pipe()
        self.process = multiprocessing.Process(target=_serve, args=(child, fn, os.getpid()), daemon=True)
        with _stop_signals_held():
            self.process.start()
        child.close()
        self.task: int | None = None

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.process.terminate()

    def wait(self) -> None:
        self.process.join(STOP_GRACE_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def run_tasks(fn: Callable, tasks: Sequence[tuple], jobs: int, done: Callable[[int, Any], None],
              failed: Callable[[int, str], None], stop: Callable[[], bool] | None = None) -> None:
    """fn(*tasks[i]) for every i in `jobs` worker processes. `done(i, result)` or
    `failed(i, one-line reason)` is called in this process as each task ends, in the
    order they end; a task whose worker died is failed with the signal that killed it.
    Tasks are given out in their order; once `stop()` is true no further one is (those
    running end as usual)."""
    todo = deque(range(len(tasks)))
    workers: list[_Worker] = []

    def give(w: _Worker) -> None:
        if todo and not (stop is not None and stop()):
            w.task = todo.popleft()
            w.conn.send((w.task, tasks[w.task]))

    try:
        for _ in range(min(jobs, len(tasks))):
            workers.append(_Worker(fn))
            give(workers[-1])
        while busy := [w for w in workers if w.task is not None]:
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
            for w in busy:
                if w.conn in ready or w.process.sentinel in ready:
                    _collect(w, workers, fn, done, failed, give)
    finally:
        for w in workers:
            if w.task is None:
                with contextlib.suppress(OSError, ValueError):
                    w.conn.send(None)
            else:
                w.stop()
        for w in workers:
            w.wait()


def _collect(w: _Worker, workers: list[_Worker], fn: Callable, done, failed, give) -> None:
    """The answer of a worker that is ready, or its loss (then a new worker replaces it)."""
    try:
        index, ok, value = w.conn.recv()
    except (EOFError, OSError):  # it died without answering
        index = w.task
        w.process.join()
        reason = f"worker lost ({_exit_reason(w.process.exitcode)})"
        w.task = None
        w.wait()
        workers[workers.index(w)] = new = _Worker(fn)
        failed(index, reason)
        give(new)
        return
    w.task = None
    (done if ok else failed)(index, value)
    give(w)


__all__ = ["one_line", "run_tasks"]
