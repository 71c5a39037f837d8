"""Output files written whole or not at all, and the lines that name them.

Every file npusim writes (JSON reports, traces, profile tables, plots, sweep CSVs)
goes through `atomic_write`: the bytes go to a temporary file in the same folder,
which replaces the target with `os.replace` only once it is complete. An
interrupted or failed write (Ctrl-C, SIGTERM, a full disk) leaves the old file, or
none, never half of one; the temporary file is removed on the way out.

The checks made before a command runs (an output that is also an input, one that
cannot be written) are in npusim.outputs_check.

`all_or_none` holds a command's outputs back until all of them are complete: each
atomic_write in the block leaves its temporary file, and they all take their places
together when the block ends, or are all removed if it does not (Ctrl-C between
two outputs leaves neither).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import re
import signal
import sys
import tempfile
from collections.abc import Iterator
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


class _Staged:
    """The outputs of an `all_or_none` block: finished temporary files, the files they
    replace (a link's target) and the paths given for them, and the folders made for them
    (removed again if the block fails)."""

    def __init__(self) -> None:
        self.files: list[tuple[str, Path, Path]] = []
        self.folders: list[Path] = []


_staged: contextvars.ContextVar[_Staged | None] = contextvars.ContextVar("npusim_outputs_staged", default=None)


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and its parents that do not exist yet, deepest first."""
    out = []
    for f in (folder, *folder.parents):
        if f.exists() or f.is_symlink():
            break
        out.append(f)
    return out


def dangling_link(path: str | os.PathLike) -> str | None:
    """Where `path` goes through a link to nothing (itself, or a folder on its way): 'L is a
    link to T, which does not exist'; None if it does not. Written through, such a link
    would make its target: a folder on an unmounted disk, say, on the disk below it."""
    p = Path(path)
    for f in (p, *p.parents):
        if os.path.islink(f) and not os.path.exists(f):
            return f"{f} is a link to {os.readlink(f)}, which does not exist"
    return None


# the folder of this process's open file descriptors, which /dev/fd, /dev/stdout and /dev/stderr are links into
_FD_FOLDER = re.compile(r"/proc/(self|thread-self|\d+)(/task/\d+)?/fd")


def descriptor(path: str | os.PathLike) -> int | None:
    """The file descriptor of this process that `path` names (/dev/stdout: 1, /dev/fd/3: 3,
    /proc/self/fd/1), itself or through links; None if it names none. Such a path is written
    through the descriptor (atomic_write): the kernel's link names the open file, and a pipe's,
    'pipe:[N]', is no path (realpath makes one to nothing), while a file's path is that of a
    file the shell opened with the command's earlier output in it (replaced, or opened
    anew, that output was lost or written over)."""
    p = Path(os.path.abspath(path))
    for _ in range(40):  # the links followed (a loop of links ends here: not a descriptor)
        folder = os.path.realpath(p.parent)
        match = _FD_FOLDER.fullmatch(folder)
        if match:
            ours = match.group(1) in ("self", "thread-self", str(os.getpid()))
            return int(p.name) if ours and p.name.isdigit() else None
        link = os.path.join(folder, p.name)
        if not os.path.islink(link):
            return None
        p = Path(folder, os.readlink(link))
    return None


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", durable: bool = True, **open_args) -> Iterator[IO]:
    """Open a temporary file beside `path` for writing (mode "w" or "wb"); when the
    block ends without an error it becomes `path`, otherwise it is removed. The
    folder is created if missing; a path that is a device or a pipe (/dev/stdout)
    is written in place, as it cannot be replaced; a link is written through (its target is
    replaced, the link stays; one to nothing is refused). An OSError is raised as OutputError naming `path`
    and the reason (the OS gives no file name for a write that hits a full disk).
    durable: the bytes reach the disk before the rename (after a crash of the machine,
    the old file or the new one, never an empty one); False for a file whose reader
    checks it anyway (a cache entry: its digest)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode {mode!r} (expected 'w' or 'wb')")
    path = Path(path)
    fd = descriptor(path)
    if fd is not None:  # /dev/stdout: written through the descriptor, after what it has had
        try:
            with os.fdopen(os.dup(fd), mode, **open_args) as f:
                yield f
        except OSError as e:
            raise OutputError(f"cannot write {path}: {_reason(e)}") from None
        return
    dangling = dangling_link(path)
    if dangling:
        raise OutputError(f"cannot write {path}: {dangling}")
    target = Path(os.path.realpath(path))  # a link's target: os.replace on the link would leave it stale
    tmp = None
    staged = _staged.get()
    try:
        try:
            if staged is not None:
                staged.folders += _missing_folders(target.parent)
            target.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file where a folder of the path should be
            blocker = next(p for p in (path.parent, *path.parent.parents) if p.exists())
            raise OutputError(f"cannot write {path}: Not a directory ({blocker} is a file)") from None
        if target.is_dir():
            raise OutputError(f"{path}: is a directory (expected a file path)")
        if target.exists() and not target.is_file():  # a device or a pipe (/dev/stdout): written in place
            with target.open(mode, **open_args) as f:
                yield f
            return
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, mode, **open_args) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; an output is an ordinary file
        if staged is not None:  # all_or_none puts it in place with the others
            staged.files.append((tmp, target, path))
        else:
            os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise OutputError(f"cannot write {path}: {_reason(e)}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Within the block, Ctrl-C and SIGTERM wait; at its end the first one that came is
    delivered as usual (KeyboardInterrupt, Terminated). Outside the main thread, nothing changes."""
    held: list[int] = []
    wanted = [signal.SIGINT, signal.SIGTERM]
    try:
        previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in wanted}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if held:
            handler = previous[held[0]]
            if callable(handler):
                handler(held[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), held[0])


@contextlib.contextmanager
def all_or_none() -> Iterator[list[Path]]:
    """A command's outputs, all or none: every atomic_write in the block writes its
    temporary file only; when the block ends without an error they all replace their
    targets at once (Ctrl-C or SIGTERM meanwhile waits until the last is in place), and
    otherwise (an error, Ctrl-C, SIGTERM) they are removed, with the folders made for
    them, and no target changes. Yields the list of the paths written, filled at the
    end. Nested blocks join the outer one."""
    if _staged.get() is not None:
        yield []
        return
    staged, written = _Staged(), []
    token = _staged.set(staged)
    try:
        yield written
        _staged.reset(token)
        token = None
        try:
            with _signals_held():
                for tmp, target, path in staged.files:
                    try:
                        os.replace(tmp, target)
                    except OSError as e:
                        done = ", ".join(str(p) for p in written) or "none"
                        raise OutputError(f"cannot write {path}: {_reason(e)} (outputs written: {done})") from None
                    written.append(path)
                staged.files = []
        except (KeyboardInterrupt, Terminated) as e:  # held during the renames: every output is in place
            e.npusim_written = list(written)
            raise
    finally:
        if token is not None:
            _staged.reset(token)
        for tmp, *_ in staged.files:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if not written:
            for folder in sorted(set(staged.folders), key=lambda f: -len(f.parts)):  # left if anything is in it
                with contextlib.suppress(OSError):
                    folder.rmdir()


def interruption_note(e: BaseException) -> str:
    """What the command interrupted by `e` (KeyboardInterrupt, Terminated) leaves, for
    its last message: an all_or_none block that had put its outputs in place when the
    signal was delivered marks `e` with them."""
    written = getattr(e, "npusim_written", None)
    if written:
        return f"after writing every output: {', '.join(map(str, written))}"
    return "no partial output left"


def write_text(path: str | os.PathLike, text: str) -> Path:
    """`text` into `path`, atomically."""
    with atomic_write(path) as f:
        f.write(text)
    return Path(path)


def write_json(path: str | os.PathLike, data) -> Path:
    """`data` as JSON (one-space indent, a final newline) into `path`, atomically; a float
    that is not finite is written as null (json.dumps wrote NaN, which JSON has not: a
    calibration with no field fitted had a NaN held-out error)."""
    import json

    return write_text(path, json.dumps(_finite(data), indent=1, allow_nan=False) + "\n")


def _finite(data):
    """`data` with every float that is not finite (NaN, inf) in it as None, dicts, lists and
    tuples walked."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


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


def say_all(lines) -> None:
    """The lines naming a command's outputs, once all_or_none has put them all in place."""
    for line in lines:
        say(line)


def wrote_line(paths) -> str:
    """One line naming the files (a JSON report, a trace, a CSV) a command wrote."""
    return "wrote " + ", ".join(str(p) for p in paths)


def plots_line(out_dir: str | os.PathLike, paths) -> str:
    """One line naming the plots written into `out_dir`."""
    names = ", ".join(dict.fromkeys(Path(p).stem for p in paths))
    return f"plots in {out_dir}: {names} (.png, .svg)"


def tables_line(paths) -> str:
    """One line naming the profile tables written."""
    return "tables: " + ", ".join(str(p) for p in paths)


def err(text: str) -> None:
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr, flush=True)


__all__ = ["OutputError", "Terminated", "all_or_none", "atomic_write", "dangling_link", "descriptor", "drop_stdout",
           "err", "interruption_note", "on_sigterm", "plots_line", "say", "say_all", "tables_line", "write_json",
           "write_text", "wrote_line"]
