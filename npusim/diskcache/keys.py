"""Cache keys: SHA-256 of a canonical JSON form of what a value depends on.

The npusim version an entry carries is the package version plus a hash of the
package's own source and data files (.py, .yaml, .c): an edited engine, lowering or
default config makes every older entry foreign, so a developer never reads a
result an older model computed. The serving layer is left out of the hash: what it
caches are engine points (a step of a given shape, simulated as `npusim run` does),
and what a point simulates is versioned by serving.stepcost.POINT_SCHEME, so an
edit to a scheduler or a report does not throw away hours of simulated K3 steps.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import os
from pathlib import Path

import attrs

_SOURCE_SUFFIXES = (".py", ".yaml", ".c")
# Folders of the package outside the hash (see the module doc): the serving layer and its configs.
_UNVERSIONED = {"serving", "services"}


@functools.cache
def version() -> str:
    """npusim's version and a hash of its source (see the module doc)."""
    from npusim import __version__

    return f"{__version__}+{source_hash(Path(__file__).resolve().parents[1])[:16]}"


def source_hash(root: Path) -> str:
    """SHA-256 of the source and data files under `root` (names and contents), but
    those in its top-level folders _UNVERSIONED."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        top = Path(dirpath) == root
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not (top and d in _UNVERSIONED))
        for name in sorted(filenames):
            if name.endswith(_SOURCE_SUFFIXES):
                p = Path(dirpath, name)
                h.update(p.relative_to(root).as_posix().encode() + b"\0")
                h.update(p.read_bytes())
    return h.hexdigest()


def _plain(value):
    """A JSON-able form of `value`: attrs records as dicts (with their class name),
    tuples and sets as lists, enums by value, paths as strings."""
    if attrs.has(type(value)):
        return {"__class__": type(value).__name__,
                **{a.name: _plain(getattr(value, a.name)) for a in attrs.fields(type(value))}}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cache key: cannot hash a {type(value).__name__}")


def digest(*parts) -> str:
    """The key of `parts`: hex SHA-256 of their canonical JSON (floats exact, keys sorted)."""
    text = json.dumps(_plain(list(parts)), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def file_digest(path: str | os.PathLike | None) -> str | None:
    """A file's content hash (a fusion rules file the key must follow), None for no file."""
    if path is None:
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def options_key(options: dict) -> dict:
    """Pass options as a key holds them: a fusion rules file by its content's hash (a
    rules mapping given in Python stays as it is)."""
    rules = options.get("fusion_rules")
    if isinstance(rules, (str, os.PathLike)):
        return options | {"fusion_rules": file_digest(rules)}
    return options


__all__ = ["digest", "file_digest", "options_key", "version"]
