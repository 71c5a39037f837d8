"""The Ray backend: each task (a sweep point) is one Ray task, on a cluster or on a
Ray instance started here for the run.

- `address` None: a local Ray instance of `jobs` CPUs (default one per CPU) is
  started for the run and stopped after it. "auto": the cluster `ray start --head`
  started on this machine. "ray://HOST:PORT" (Ray Client) or "HOST:PORT" (the head's
  GCS): a remote cluster, checked first with a plain TCP connection so that an
  unreachable address is one error within CONNECT_TIMEOUT_S, not Ray's long retries.
  If Ray is already initialised in this process (a notebook, a benchmark), that
  instance is used and left running.
- A task whose worker is lost (a node gone, a process killed) is retried up to
  MAX_RETRIES times by Ray; an exception raised by the task itself is not retried
  (npusim errors never reach here: a sweep point turns them into its row).
- Environment variables named NPUSIM_* (the persistent cache's folder, say) are
  passed to the tasks through their runtime_env, so workers on a cluster that
  shares a file system share what they name.
- Every node of a remote cluster must have npusim (the same version) installed:
  tasks refer to npusim's functions by name, they do not ship its code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import warnings
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from npusim.backends import BackendError
from npusim.pool import one_line

INSTALL = 'pip install "npusim[ray]"'
MAX_RETRIES = 3  # retries of a task whose worker was lost (Ray's own default for tasks)
CONNECT_TIMEOUT_S = 5.0  # how long the reachability check of --address waits for a TCP connection
WAIT_S = 0.5  # longest wait for a result before Python sees Ctrl-C / SIGTERM again
# a local instance holds only the tasks' small arguments and rows: a small object store
# keeps Ray's shared memory (default 30% of RAM) out of other people's way
OBJECT_STORE_BYTES = 100 << 20
ENV_PREFIX = "NPUSIM_"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise BackendError(f"--backend ray: Ray is not installed: {INSTALL}") from None
    return ray


def check_address(address: str) -> None:
    """`address` is "auto", ray://HOST:PORT or HOST:PORT, and a TCP connection to
    HOST:PORT opens within CONNECT_TIMEOUT_S (one error line otherwise)."""
    if address == "auto":
        return
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number
        host, port = None, None
    if parts.scheme not in ("ray", "tcp") or not host or port is None:
        raise BackendError(f"--address {address}: expected auto, ray://HOST:PORT or HOST:PORT")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise BackendError(f"--address {address}: cannot reach {host}:{port} ({reason}); is a Ray head "
                           "running there (ray start --head) and its port open?") from None


def _runtime_env() -> dict:
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIX)}
    return {"env_vars": env} if env else {}


class RayBackend:
    """Tasks as Ray tasks (see the module doc)."""

    name = "ray"

    def __init__(self, address: str | None = None, jobs: int | None = None):
        self.ray = _import_ray()
        self.address, self.jobs = address, jobs
        if address is not None:
            check_address(address)

    def _connect(self) -> bool:
        """Initialise Ray unless it is already; True if this call did (and so must shut it down)."""
        ray = self.ray
        if ray.is_initialized():
            return False
        common = dict(logging_level=logging.ERROR, log_to_driver=False)
        try:
            with warnings.catch_warnings():  # Ray warns, then raises: the error line says it all
                warnings.simplefilter("ignore")
                if self.address is None:
                    # "local": a new instance, even where a stale address file names a cluster gone
                    ray.init(address="local", num_cpus=self.jobs or os.cpu_count() or 1,
                             include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES, **common)
                else:
                    ray.init(address=self.address, **common)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = "a local Ray instance" if self.address is None else f"--address {self.address}"
            hint = ""
            if self.address and self.address.startswith("ray://") and "RAY_AUTH_MODE" not in os.environ:
                hint = (" (a head with token authentication, Ray's default, answers only a client with "
                        "RAY_AUTH_MODE=token and its token: see docs/sweeps.md)")
            raise BackendError(f"{where}: {one_line(e)}{hint}") from None
        return True

    def run(self, fn: Callable, tasks: Sequence[tuple], done, failed) -> None:
        ray = self.ray
        if not tasks:
            return
        started = self._connect()
        options = dict(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)
        if env := _runtime_env():  # per task, so that it holds on a Ray initialised elsewhere too
            options["runtime_env"] = env
        remote = ray.remote(fn).options(**options)
        index, pending = {}, []
        try:
            for i, args in enumerate(tasks):
                ref = remote.remote(*args)
                index[ref] = i
                pending.append(ref)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=WAIT_S)
                for ref in ready:
                    try:
                        value = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:  # the task raised: not a lost worker
                        failed(index[ref], one_line(e.cause if e.cause is not None else e))
                    except ray.exceptions.RayError as e:  # lost through every retry
                        failed(index[ref], f"worker lost ({one_line(e)})")
                    else:
                        done(index[ref], value)
        finally:
            if started:  # our own instance: shutting it down ends its workers and tasks
                ray.shutdown()
            else:  # a cluster that outlives us: its tasks of ours are cancelled
                # (cancelling on an instance about to shut down races Ray's own completion
                # of a task that just finished: its driver aborts on a failed check)
                for ref in pending:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)


__all__ = ["INSTALL", "RayBackend", "check_address"]
