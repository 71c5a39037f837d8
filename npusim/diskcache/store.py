"""The on-disk store: content-addressed entries, written atomically, checked on read.

An entry is one file `<dir>/<key>.entry`: a header line (magic, format, the key,
the npusim version that wrote it, the payload's size and SHA-256, the layout of the
classes it holds) and the payload, a pickle. A read trusts an entry only when every
header field matches what the reader expects, the payload hashes to the recorded
digest and the classes the pickle names have the fields they had when it was
written (the layout: an attrs record's field names, an enum's members, the
parameters of a function that rebuilds a value). Entries outlive edits of npusim
that keep its results (keys.py), so a record that has since gained or lost a field
must not be read back half-filled. Anything else (a truncated file, another npusim
version's entry, such a record, bytes that are not an entry) is a miss, the file
is removed (only a file that carries the store's header: the store never deletes
what it did not write) and the caller computes the value again. Only regular
files are read, no more than they hold (a FIFO or a link to a device is a miss,
left alone).

Writes go through `outputs.atomic_write` (a temporary file in the same folder, then
`os.replace`): two processes writing one key at once each replace the file whole,
and a reader sees one complete entry or none. The store holds at most `max_bytes`;
after a write, the least recently used entries (by modification time, which a read
hit refreshes: access times are often not kept) go until it fits again.

A cache folder that cannot be made or written (read-only, a file in the way) turns
the store off for the process: one warning line on stderr, then every call is a
miss and nothing is written. The folder holds pickles that are loaded back: like
any cache of Python objects, it must be written by its user only. A folder owned by
another user, or writable by group or others, is refused the same way (the warning
says how to fix it); the store makes its folder private (0700).
"""

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import enum
import hashlib
import inspect
import io
import json
import os
import pickle
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from npusim.hw.parse import plain
from npusim.outputs import OutputError, atomic_write, err
from npusim.outputs_check import overlong

MAGIC = b"NPUSIM-CACHE"
FORMAT = 2  # bump when the entry layout changes (2: the layout of the payload's classes)
SUFFIX = ".entry"
DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB: hundreds of K3 steps (a decode step's entry is a few MB)
_WARNED: set[Path] = set()  # folders this process has warned about
# an entry's header line is short: a longer first line is not a header
_MAX_HEADER = 4096


def folder_problem(path: Path) -> str | None:
    """Why no cache folder can be at `path`, found without making it: a name or path longer
    than a file system takes (overlong), a link to nothing, a file in its place or on its
    way; None if one can be (or is) there."""
    too_long = overlong(path)
    if too_long:
        return too_long
    if path.is_symlink() and not path.exists():
        return f"a link to {os.readlink(path)}, which does not exist"
    if path.exists() and not path.is_dir():
        return "a file, not a folder"
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        return f"{above} is a file, not a folder"
    return None


def _folder_reason(path: Path, e: OSError) -> str:
    """Why the cache folder cannot be used, in words ("File exists" said nothing of a
    file, or a link to nothing, in the folder's place)."""
    return folder_problem(path) or e.strerror or type(e).__name__


def _parse_size(text: str) -> int:
    try:
        value = plain(int, text.strip())  # not '1_000' or '１０００', which int() reads
    except ValueError:
        value = -1
    if value < 1:
        raise OutputError(f"NPUSIM_CACHE_MAX_BYTES: expected a positive integer (bytes), got '{text}'")
    return value


class DiskCache:
    """Entries under `path` (created on first write), at most `max_bytes` in all.
    `version`: the npusim version entries are written with and must carry to be read
    (default: the running npusim's, see keys.version). `enabled=False`: a store that
    holds nothing (--no-cache). Picklable: sweep workers get the same store."""

    def __init__(self, path: str | os.PathLike, max_bytes: int | None = None, version: str | None = None,
                 enabled: bool = True):
        from npusim.diskcache.keys import version as npusim_version

        self.path = Path(path)
        env = os.environ.get("NPUSIM_CACHE_MAX_BYTES")
        self.max_bytes = max_bytes if max_bytes is not None else _parse_size(env) if env else DEFAULT_MAX_BYTES
        self.version = version or npusim_version()
        self.enabled = enabled
        self.hits = self.misses = self.dropped = 0  # counts of this process (dropped: bad entries removed)
        self._checked = False  # the folder was found writable (once per process)

    def __repr__(self) -> str:
        return f"DiskCache({str(self.path)!r}, max_bytes={self.max_bytes}, enabled={self.enabled})"

    def entry_path(self, key: str) -> Path:
        return self.path / f"{key}{SUFFIX}"

    # ---- reading

    def get(self, key: str, refs: Mapping[str, Any] | None = None,
            expected: Callable[[Any], bool] | None = None) -> Any | None:
        """The value stored under `key`, or None (a miss: absent, damaged, foreign, or
        the store is off). `refs`: the objects put() stored by name (see put);
        `expected(value)`: False for a value that is not what the caller stores under
        such keys (a damaged entry)."""
        if not self._usable():
            return None
        path = self.entry_path(key)
        data = _read_regular(path)
        if data is None:
            self.misses += 1
            return None
        payload, layout = self._payload(data, key)
        value = None
        if payload is not None:
            try:
                value, found = loads_with_layout(payload, refs)
            except Exception:  # noqa: BLE001 - an entry whose classes no longer load is recomputed
                payload = None
            else:
                if found != layout:  # a class it holds has other fields now: not read back half-filled
                    payload = None
            if payload is not None and expected is not None and not expected(value):
                payload = None
        if payload is None:
            self.dropped += 1
            self.misses += 1
            if data.startswith(MAGIC + b" "):  # the store's own entry: recomputed and written again
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return None
        self.hits += 1
        with contextlib.suppress(OSError):  # a hit is a use: it moves to the back of the eviction order
            now = time.time_ns()
            os.utime(path, ns=(now, now))
        return value

    def _payload(self, data: bytes, key: str) -> tuple[bytes | None, str | None]:
        """(payload, layout of its classes) of an entry's bytes if its header matches and
        its digest holds, else (None, None)."""
        end = data.find(b"\n", 0, _MAX_HEADER)
        if end < 0 or not data.startswith(MAGIC + b" "):
            return None, None
        try:
            head = json.loads(data[len(MAGIC) + 1:end])
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            return None, None
        payload = data[end + 1:]
        expected = {"format": FORMAT, "key": key, "version": self.version, "bytes": len(payload)}
        if not isinstance(head, dict) or any(head.get(k) != v for k, v in expected.items()):
            return None, None
        if head.get("sha256") != hashlib.sha256(payload).hexdigest() or not isinstance(head.get("layout"), str):
            return None, None
        return payload, head["layout"]

    # ---- writing

    def put(self, key: str, value: Any, refs: Mapping[str, Any] | None = None) -> bytes | None:
        """Store `value` under `key` (atomically; the last writer wins). `refs`: objects
        `value` refers to that are stored by name, not by value (the reader passes its
        own objects under those names). Returns the payload written (a pickle of
        `value`), or None when the store is off or the folder cannot be written (then
        it is off for the rest of the process)."""
        if not self._usable() or _foreign(self.entry_path(key)):
            return None
        payload = dumps(value, refs)
        return self.write(key, payload, loads_with_layout(payload, refs)[1])

    def write(self, key: str, payload: bytes, layout: str) -> bytes | None:
        """put() of a value already pickled by dumps, `layout` that of its classes
        (loads_with_layout); the payload, or None as put."""
        if not self._usable() or _foreign(self.entry_path(key)):
            return None
        head = {"format": FORMAT, "key": key, "version": self.version, "bytes": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(), "layout": layout}
        try:
            # not durable: an entry a machine crash leaves empty or short fails its digest, and is recomputed
            with atomic_write(self.entry_path(key), "wb", durable=False) as f:
                f.write(MAGIC + b" " + json.dumps(head, sort_keys=True).encode() + b"\n")
                f.write(payload)
        except OutputError as e:
            self.disable(str(e))
            return None
        self.evict()
        return payload

    def _usable(self) -> bool:
        """The store is on and its folder can be written: made if missing, and a
        temporary file created in it (once per process). A folder that cannot be
        written is not read either: the run is uncached, as the warning says."""
        if self.enabled and not self._checked:
            try:
                self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
                unsafe = _unsafe(self.path)
                if unsafe:
                    self.disable(unsafe)
                    return False
                fd, probe = tempfile.mkstemp(dir=self.path, prefix=".probe.", suffix=".tmp")
                os.close(fd)
                os.unlink(probe)
                self._checked = True
            except OSError as e:
                self.disable(_folder_reason(self.path, e))
        return self.enabled

    def disable(self, reason: str) -> None:
        """Turn the store off, with one warning line per folder and process (a command
        may open its store more than once)."""
        if self.enabled:
            self.enabled = False
            if self.path not in _WARNED:
                _WARNED.add(self.path)
                err(f"npusim: warning: cache {self.path} not used ({reason}); running uncached")

    # ---- size

    def entries(self) -> list[tuple[int, int, str]]:
        """(last use in ns, bytes, file name) of every entry (a file named and headed as
        one), oldest first."""
        return sorted(f for f in self._own_files() if f[2].endswith(SUFFIX))

    def _own_files(self) -> list[tuple[int, int, str]]:
        """(last use in ns, bytes, file name) of every file the store wrote: an entry, or
        a temporary file an interrupted write left (see outputs.atomic_write), that is a
        regular file beginning with the store's header."""
        out = []
        try:
            with os.scandir(self.path) as it:
                for e in it:
                    temporary = e.name.startswith(".") and e.name.endswith(".tmp") and SUFFIX + "." in e.name
                    if e.name.endswith(SUFFIX) or temporary:
                        with contextlib.suppress(OSError):  # removed meanwhile by another process
                            st = e.stat(follow_symlinks=False)
                            if stat.S_ISREG(st.st_mode) and _headed(self.path / e.name):
                                out.append((st.st_mtime_ns, st.st_size, e.name))
        except OSError:
            return []
        return out

    def evict(self) -> list[str]:
        """Remove least recently used entries until the store holds at most max_bytes; their names."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        gone = []
        for _, size, name in entries:
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):  # another process evicted it first
                os.unlink(self.path / name)
            total -= size
            gone.append(name)
        return gone

    def clear(self) -> tuple[int, int]:
        """Remove every entry and leftover temporary file of the store (files that carry
        its header; nothing else in the folder); (files removed, bytes freed)."""
        n = freed = 0
        for _, size, name in self._own_files():
            with contextlib.suppress(FileNotFoundError):
                (self.path / name).unlink()
                n, freed = n + 1, freed + size
        return n, freed


def _read_regular(path: Path) -> bytes | None:
    """The bytes of `path` if it is a regular file (no more than its size), else None:
    a FIFO is not waited on, a link to a device not read without end."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a folder in an entry's place too: fdopen would refuse it with an OSError
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(st.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _foreign(path: Path) -> bool:
    """Something that is not a regular file (a FIFO, a link, a device) is at `path`: not
    the store's to replace."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _headed(path: Path) -> bool:
    """`path` begins with the store's header (it is a file the store wrote)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC) + 1) == MAGIC + b" "
    except OSError:
        return False


def _unsafe(folder: Path) -> str | None:
    """Why `folder` may not hold pickles npusim loads (owned by someone else, writable
    by group or others), with the fix; None if it is the user's own. (No owners where
    the OS has no user ids.)"""
    if not hasattr(os, "getuid"):
        return None
    st = folder.stat()
    if st.st_uid != os.getuid():
        return (f"owned by user id {st.st_uid}, not you: its entries are code npusim would run; "
                f"give --cache-dir or NPUSIM_CACHE_DIR a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"writable by group or others: its entries are code npusim would run; "
                f"chmod go-w {folder}, or give --cache-dir a folder of your own")
    return None


def dumps(value: Any, refs: Mapping[str, Any] | None = None) -> bytes:
    """A pickle of `value` in which the objects of `refs` appear by name only: each
    as a call of `_named` (see loads). The pickler asks for a reduction only for
    objects of their types (a table lookup in C), not for each of the hundreds of
    thousands of objects of a step."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    if refs:
        names = {id(obj): name for name, obj in refs.items()}

        def by_name(obj):
            name = names.get(id(obj))  # another object of a named one's type: pickled as usual
            return (_named, (name,)) if name is not None else obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)

        pickler.dispatch_table = copyreg.dispatch_table | {type(obj): by_name for obj in refs.values()}
    pickler.dump(value)
    return out.getvalue()


def _named(name: str) -> Any:
    """Where a pickle of dumps holds an object by name; loads() puts the reader's object there."""
    raise pickle.UnpicklingError(f"cache entry: object '{name}' is stored by name; read it with loads()")


class _Unpickler(pickle.Unpickler):
    """Reads a pickle of dumps, its named objects taken from `refs`; `found` collects
    the classes (and functions) the pickle names, by their names in it."""

    def __init__(self, payload: bytes, refs: Mapping[str, Any] | None):
        super().__init__(io.BytesIO(payload))
        self.refs = refs or {}
        self.found: dict[tuple[str, str], Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == _named.__name__:
            return self.refs.__getitem__  # a name refs lacks: KeyError, a damaged entry
        obj = super().find_class(module, name)  # once per class and pickle: the pickler memoises them
        self.found[module, name] = obj
        return obj


def loads(payload: bytes, refs: Mapping[str, Any] | None = None) -> Any:
    """The value of a pickle made by dumps, its named objects taken from `refs`."""
    return _Unpickler(payload, refs).load()


def loads_with_layout(payload: bytes, refs: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """loads(), and the layout of the classes the pickle names: a digest of each one's
    name and fields (_fields), what an entry records when written and must show when read."""
    u = _Unpickler(payload, refs)
    value = u.load()
    layout = [[module, name, _fields(obj)] for (module, name), obj in sorted(u.found.items())]
    return value, hashlib.sha256(json.dumps(layout).encode()).hexdigest()


def _fields(obj: Any) -> list | None:
    """What an instance of a class is unpickled into: an attrs or dataclass record's field
    names, a named tuple's, an enum's members (names and values: a member is pickled by
    its value), __slots__; a function's parameters (one a class's __reduce__ names, called
    with its fields in order: runtime.run._unpickle_run); None for other objects (a class
    whose instances keep a __dict__: its pickles name no fields to check)."""
    if not isinstance(obj, type):
        try:
            return [[p.name, p.kind.name] for p in inspect.signature(obj).parameters.values()]
        except (TypeError, ValueError):  # not a callable, or a builtin without a signature
            return None
    if attrs.has(obj):
        return [a.name for a in attrs.fields(obj)]
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    if issubclass(obj, enum.Enum):
        return [[m.name, _member_value(m.value)] for m in obj.__members__.values()]
    if issubclass(obj, tuple) and hasattr(obj, "_fields"):
        return list(obj._fields)
    slots = [n for c in obj.__mro__ for n in ([c.__dict__["__slots__"]] if isinstance(c.__dict__.get("__slots__"), str)
                                              else c.__dict__.get("__slots__", ()))]
    return slots or None


def _member_value(v: Any) -> Any:
    """An enum member's value as a layout holds it: as it is (a number, a string), else by
    its repr, or its type where the repr is an address (not the same in another process)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    text = repr(v)
    return type(v).__qualname__ if " at 0x" in text else text


__all__ = ["DEFAULT_MAX_BYTES", "DiskCache", "dumps", "loads", "loads_with_layout"]
