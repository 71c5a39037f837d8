"""The checks made on a command's output paths before it runs: none is also an input or
another output (`check_paths`), and each can be written (`check_writable`): its folder
takes a new file, a device or a descriptor takes bytes, an existing file is not
read-only, no name is longer than a file system holds (`overlong`), no link on the way
goes to nothing.

Apart from npusim.outputs, which writes the files: a check only looks (its probe file is
made and removed at once) and runs before anything is simulated, so that a path refused
costs no run; a write runs after. The two share what a path names (`descriptor`,
`dangling_link`), which lives with the writers and is imported here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from npusim.outputs import OutputError, _reason, dangling_link, descriptor


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


__all__ = ["NAME_MAX", "PATH_MAX", "TEMP_NAME_EXTRA", "check_paths", "check_writable", "overlong"]
