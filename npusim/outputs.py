"""Output files written whole or not at all, and the checks made before a command runs.

Every file npusim writes (JSON reports, traces, profile tables, plots, sweep CSVs)
goes through `atomic_write`: the bytes go to a temporary file in the same folder,
which replaces the target with `os.replace` only once it is complete. An
interrupted or failed write (Ctrl-C, SIGTERM, a full disk) leaves the old file, or
none, never half of one; the temporary file is removed on the way out.

`check_paths` refuses, before anything is simulated, an output that is also an
input (`--json` pointed at the `--hw` file) or two outputs on one path;
`check_writable` one that cannot be written (its folder takes no new file).

`all_or_none` holds a command's outputs back until all of them are complete: each
atomic_write in the block leaves its temporary file, and they all take their places
together when the block ends, or are all removed if it does not (Ctrl-C between
two outputs leaves neither).
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import math
import os
import re
import signal
import stat
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
    for given, what in ((outputs, "a file path ('-' is not read as the terminal: give /dev/stdout)"),
                        (folders or {}, "a folder path")):
        for flag, path in given.items():
            if path is not None and os.fspath(path) == "-":  # it would be a file or folder named '-'
                raise OutputError(f"{flag} -: expected {what}")
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


def _probe(flag: str, path: Path, folder: Path) -> None:
    """Refuse `path` unless a new file can be made in `folder`, or in the nearest folder
    above it that exists (the missing ones are made there): made and removed at once."""
    above = next((f for f in (folder, *folder.parents) if f.exists()), None)
    if above is None or not above.is_dir():
        raise OutputError(f"{flag} {path}: cannot be written: Not a directory ({above} is a file)")
    try:
        fd, tmp = tempfile.mkstemp(dir=above, prefix=".npusim-probe.", suffix=".tmp")
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot be written: no new file can be made in {above} "
                          f"({_reason(e)})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def _probe_in_place(flag: str, path: Path) -> None:
    """Refuse a device or a pipe `path` (written in place, see atomic_write) that takes no
    bytes: a block device (a disk: the report would overwrite it), a device that cannot be
    opened (/dev/tty with no terminal, a socket) or that refuses a write (/dev/full: an
    empty write is refused as a full one is; /dev/null and a terminal take it and show
    nothing). A pipe is not opened (that waits for a reader, and closing it would end the
    reader's input): only its permission is checked."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:  # /dev/stdout with stdout closed
        raise OutputError(f"{flag} {path}: cannot be written: {_reason(e)}") from None
    if stat.S_ISBLK(mode):
        raise OutputError(f"{flag} {path}: is a block device (expected a file path, a character device or a pipe)")
    if stat.S_ISFIFO(mode):
        if not os.access(path, os.W_OK):
            raise OutputError(f"{flag} {path}: cannot be written: Permission denied")
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            os.write(fd, b"")
        finally:
            os.close(fd)
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot be written: {_reason(e)}") from None


def _probe_descriptor(flag: str, path: Path, fd: int) -> None:
    """Refuse a `path` naming descriptor `fd` (/dev/stdout) that is not open, is open for
    reading only (3<file), or refuses an empty write (> /dev/full)."""
    try:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OutputError(f"{flag} {path}: cannot be written: descriptor {fd} is open for reading only")
        os.write(fd, b"")
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot be written: {_reason(e)}") from None


def _replaceable(flag: str, path: Path) -> None:
    """Refuse an existing file `path` that is not to be replaced: one its owner made read-only
    (chmod a-w; root may write it), or immutable (chattr +i: not even root may, and the
    replacing rename failed after the run). atomic_write replaces a file whatever its mode,
    but a file made read-only is one its owner wants kept."""
    if not os.access(path, os.W_OK):
        raise OutputError(f"{flag} {path}: cannot be written: the file is read-only "
                          f"(give another path, or make it writable)")


# the longest name one folder's entry may have (Linux: NAME_MAX; the longest path: PATH_MAX)
NAME_MAX, PATH_MAX = 255, 4096
# what a file's temporary name adds to its name (atomic_write: "." NAME "." + mkstemp's 8 random characters + ".tmp")
TEMP_NAME_EXTRA = 1 + 1 + 8 + 4


def overlong(path: str | os.PathLike, temp_extra: int = 0, file: bool = False) -> str | None:
    """Why no file system could hold `path`: 'the path is N bytes (at most M)' if it is over
    PATH_MAX, else 'the name X... is N bytes (at most M)' for its first name over NAME_MAX;
    None if neither. `temp_extra`: what a temporary name beside it adds (atomic_write's:
    TEMP_NAME_EXTRA), taken off the path's limit and, for a `file`, off its own name's (the
    limit then said to hold 'here')."""
    p = Path(path)
    if len(os.fsencode(p)) + temp_extra >= PATH_MAX:
        return f"the path is {len(os.fsencode(p))} bytes (at most {PATH_MAX - 1 - temp_extra})"
    for i, part in enumerate(p.parts):
        most = NAME_MAX - temp_extra if file and i == len(p.parts) - 1 else NAME_MAX
        if len(os.fsencode(part)) > most:
            return (f"the name {part[:20]}... is {len(os.fsencode(part))} bytes "
                    f"(at most {most}{' here' if temp_extra else ''})")
    return None


def _named(flag: str, path: str | os.PathLike, file: bool) -> Path:
    """`path`, refused if no file system could hold its names or those of its temporary
    file (overlong): its folders would be made and the run done before the write failed,
    and Path.is_dir() says so only as a bare OSError."""
    p = Path(path)
    problem = overlong(p, TEMP_NAME_EXTRA, file)
    if problem:
        raise OutputError(f"{flag} {str(p)[:60]}...: cannot be written: {problem}")
    return p


def _linked(flag: str, path: Path) -> Path:
    """`path`, refused if it goes through a link to nothing (dangling_link)."""
    dangling = dangling_link(path)
    if dangling:
        raise OutputError(f"{flag} {path}: cannot be written: {dangling}")
    return path


def check_writable(outputs: Mapping[str, str | os.PathLike | None],
                   folders: Mapping[str, str | os.PathLike | None] | None = None) -> None:
    """Refuse, before a command runs, an output it could not write: a file output on a
    folder, a folder output on a file, or one whose folder takes no new file (read-only,
    /proc, missing permissions). Keys are what the user typed; None values are outputs
    not asked for. A device or a pipe (/dev/stdout) must be writable itself."""
    for flag, path in outputs.items():
        if path is None:
            continue
        p = _linked(flag, _named(flag, path, file=True))
        fd = descriptor(p)
        if fd is not None:  # written through the descriptor (atomic_write)
            _probe_descriptor(flag, p, fd)
            continue
        if p.is_dir():
            raise OutputError(f"{flag} {p}: is a directory (expected a file path)")
        if p.exists() and not p.is_file():  # written in place (atomic_write)
            _probe_in_place(flag, p)
            continue
        if p.is_file():
            _replaceable(flag, p)
        _probe(flag, p, Path(os.path.realpath(p)).parent)  # a link's target is replaced: its folder takes it
    for flag, path in (folders or {}).items():
        if path is None:
            continue
        p = _linked(flag, _named(flag, path, file=False))
        if p.exists() and not p.is_dir():
            raise OutputError(f"{flag} {p}: is a file (expected a folder)")
        _probe(flag, p, p)


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


__all__ = ["OutputError", "Terminated", "all_or_none", "atomic_write", "check_paths", "check_writable",
           "dangling_link", "descriptor", "drop_stdout", "err", "interruption_note", "on_sigterm", "overlong", "plots_line", "say",
           "say_all", "tables_line", "write_json", "write_text", "wrote_line"]
