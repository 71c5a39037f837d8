"""Output files written whole or not at all, and the checks made before a command runs.

Every file npusim writes (JSON reports, traces, profile tables, plots, sweep CSVs)
goes through `atomic_write`: the bytes go to a temporary file in the same folder,
which replaces the target with `os.replace` only once it is complete. An
interrupted or failed write (Ctrl-C, SIGTERM, a full disk) leaves the old file, or
none, never half of one; the temporary file is removed on the way out.

`check_paths` refuses, before anything is simulated, an output that is also an
input (`--json` pointed at the `--hw` file) or two outputs on one path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from npusim.errors import NpusimError


_UMASK = os.umask(0o022)  # read once (the only way to read it), put back at once
os.umask(_UMASK)


class OutputError(NpusimError):
    """An output that cannot be written, or that would overwrite an input or another output."""


class Terminated(BaseException):
    """SIGTERM, raised where the program is (see `on_sigterm`) so that it unwinds as
    for Ctrl-C: unfinished outputs removed, finished sweep rows kept, exit 143."""


@contextlib.contextmanager
def on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated in the main thread (outside it, or
    in a thread, nothing changes)."""

    def raise_terminated(signum, frame):
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _reason(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", durable: bool = True, **open_args) -> Iterator[IO]:
    """Open a temporary file beside `path` for writing (mode "w" or "wb"); when the
    block ends without an error it becomes `path`, otherwise it is removed. The
    folder is created if missing; a path that is a device or a pipe (/dev/stdout)
    is written in place, as it cannot be replaced. An OSError is raised as OutputError naming `path`
    and the reason (the OS gives no file name for a write that hits a full disk).
    durable: the bytes reach the disk before the rename (after a crash of the machine,
    the old file or the new one, never an empty one); False for a file whose reader
    checks it anyway (a cache entry: its digest)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode {mode!r} (expected 'w' or 'wb')")
    path = Path(path)
    tmp = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file where a folder of the path should be
            blocker = next(p for p in (path.parent, *path.parent.parents) if p.exists())
            raise OutputError(f"cannot write {path}: Not a directory ({blocker} is a file)") from None
        if path.is_dir():
            raise OutputError(f"{path}: is a directory (expected a file path)")
        if path.exists() and not path.is_file():  # a device or a pipe (/dev/stdout): written in place
            with path.open(mode, **open_args) as f:
                yield f
            return
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, mode, **open_args) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; an output is an ordinary file
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise OutputError(f"cannot write {path}: {_reason(e)}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """`text` into `path`, atomically."""
    with atomic_write(path) as f:
        f.write(text)
    return Path(path)


def _key(path: str | os.PathLike) -> tuple:
    """One key per file: an existing file's device and inode (hard links are one file),
    else its path with symlinks, '..' and relative parts resolved."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.normcase(os.path.realpath(path)))


def check_paths(outputs: Mapping[str, str | os.PathLike | None], inputs: Mapping[str, str | os.PathLike | None],
                folders: Mapping[str, str | os.PathLike | None] | None = None) -> None:
    """Refuse, before a command runs, an output file that is also an input or another
    output, and an output file that is also an output folder. Keys are what the user
    typed (`--json`); None values are outputs or inputs not asked for."""
    seen: dict[tuple, str] = {}
    for flag, path in inputs.items():
        if path is not None and os.path.isfile(path):
            seen.setdefault(_key(path), f"input of {flag}")
    for flag, path in outputs.items():
        if path is None:
            continue
        key = _key(path)
        if key in seen:
            raise OutputError(f"{flag} {path}: the same file as the {seen[key]} (give another path)")
        seen[key] = f"output of {flag}"
    for flag, path in (folders or {}).items():
        if path is not None and _key(path) in seen:
            raise OutputError(f"{flag} {path}: the same path as the {seen[_key(path)]} (give another path)")


# ---- printing: a closed stdout (npusim ... | head) never stops the files asked for


def say(text: str) -> None:
    """Print to stdout; once the reader has gone, drop the rest and go on."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        drop_stdout()


def drop_stdout() -> None:
    """Send the rest of stdout (and the flush at exit) to /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout without a descriptor (a test's capture)
        sys.stdout = open(os.devnull, "w")


def err(text: str) -> None:
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr, flush=True)


__all__ = ["OutputError", "Terminated", "atomic_write", "check_paths", "drop_stdout", "err", "on_sigterm", "say",
           "write_text"]
