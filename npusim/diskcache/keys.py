"""Cache keys: SHA-256 of a canonical JSON form of what a value depends on.

Two versions go into keys. A computed value - a step, an operator, a serving
point - is keyed on `version()`: npusim's package version and its model version
(npusim.model_version.MODEL_VERSION, bumped by the change that makes npusim
simulate something else), beside its inputs by value. So an edit that leaves
results alone keeps the cache warm; the regression corpus
(tests/test_engine_regression.py) fails when results change without the bump.
What a stored value is made of - the fields of its record classes - is checked by
the store on every read (store.py), so a record that gained or lost a field is
recomputed, not read back half-filled.

What `run` and `op` printed and wrote (replay.py) is keyed on `source_version()`:
the package version plus a hash of the package's source and data files (.py,
.yaml, .c), since that text is the reports' as much as the model's. Such an entry
is cheap to remake: the step or operator behind it comes from the cache (not a
pipelined `run --pp`'s stages, which are simulated again).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import os
from pathlib import Path

import attrs

from npusim.errors import NpusimError
from npusim.hw.parse import input_file

_SOURCE_SUFFIXES = (".py", ".yaml", ".c")


@functools.cache
def version() -> str:
    """npusim's version and model version: what computed values are keyed on (see the module doc)."""
    from npusim import __version__
    from npusim.model_version import MODEL_VERSION

    return f"{__version__}+model{MODEL_VERSION}"


@functools.cache
def source_version() -> str:
    """npusim's version and a hash of its source: what a command's printed output is keyed on."""
    from npusim import __version__

    return f"{__version__}+{source_hash(Path(__file__).resolve().parents[1])[:16]}"


def source_hash(root: Path) -> str:
    """SHA-256 of the source and data files under `root` (names and contents)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
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
        out = {"__class__": type(value).__name__}
        for a in attrs.fields(type(value)):
            out[a.name] = _plain(getattr(value, a.name))
            if a.metadata.get("file") and getattr(value, a.name):  # a file read by the run: its content counts
                out[a.name + ":sha256"] = _content(getattr(value, a.name))
        return out
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


def _content(path: str | os.PathLike) -> str | None:
    """SHA-256 of a file's bytes; None when it cannot be read (the run that reads it says why)."""
    try:
        return hashlib.sha256(input_file(path).read_bytes()).hexdigest()
    except (OSError, NpusimError):
        return None


def digest(*parts) -> str:
    """The key of `parts`: hex SHA-256 of their canonical JSON (floats exact, keys sorted)."""
    text = json.dumps(_plain(list(parts)), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def file_digest(path: str | os.PathLike | None) -> str | None:
    """A file's content hash (a fusion rules file the key must follow), None for no file."""
    if path is None:
        return None
    return hashlib.sha256(input_file(path, "fusion_rules").read_bytes()).hexdigest()


def options_key(options: dict) -> dict:
    """Pass options as a key holds them: a fusion rules file by its content's hash (a
    rules mapping given in Python stays as it is)."""
    rules = options.get("fusion_rules")
    if isinstance(rules, (str, os.PathLike)):
        return options | {"fusion_rules": file_digest(rules)}
    return options


__all__ = ["digest", "file_digest", "options_key", "source_hash", "source_version", "version"]
