"""Load a hardware config by name (see search_dirs) or path: YAML -> validated frozen HwConfig.

A variant file names a `base:` and overrides only what differs. Overrides for
what-if runs (`--set key.path=value`, or a mapping in the API) go through the same
validation. Every failure is one ConfigError line naming the file, the key path
and what was expected.
"""

from __future__ import annotations

import contextlib
import os
from importlib import resources
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
import yaml
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

from npusim.errors import ConfigError
from npusim.hw.config import HwConfig

DEFAULT_HW = "ascend910b2"


def search_dirs(kind: str) -> list[Path]:
    """Where named configs of `kind` (hwconfigs, workloads) are looked up, first match
    wins: $NPUSIM_HWCONFIGS / $NPUSIM_WORKLOADS, ./KIND of the working folder, then the
    configs shipped inside the package (npusim/KIND, package data: found wherever
    npusim is installed; the repository's top-level KIND/ is a link to them)."""
    dirs = []
    if os.environ.get("NPUSIM_" + kind.upper()):
        dirs.append(Path(os.environ["NPUSIM_" + kind.upper()]))
    dirs.append(Path.cwd() / kind)
    dirs.append(Path(str(resources.files("npusim") / kind)))  # an installed package is a folder, not a zip
    return dirs


def find_file(name_or_path: str | os.PathLike, kind: str) -> Path:
    """A name from hwconfigs/ (or workloads/), or a path to a YAML file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.is_file():
            raise ConfigError(f"{p}: no such file")
        return p
    for d in search_dirs(kind):
        for ext in (".yaml", ".yml"):
            if (d / (str(name_or_path) + ext)).is_file():
                return d / (str(name_or_path) + ext)
    raise ConfigError(f"{kind}: no config named '{name_or_path}' (known: {', '.join(known_names(kind)) or 'none'})")


def known_names(kind: str) -> list[str]:
    return sorted({f.stem for d in search_dirs(kind) if d.is_dir() for f in d.glob("*.yaml")})


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1.6e12 as a float (YAML 1.1 wants 1.6e+12)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}:{line} not valid YAML: {getattr(e, 'problem', None) or e}") from None


def read_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        text = repr(data)
        got = "an empty file" if data is None else f"a {type(data).__name__}: {text[:60]}{'...' if len(text) > 60 else ''}"
        raise ConfigError(f"{path}: expected a mapping at the top level, got {got}")
    return data


def _strict_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)

    def to_int(v, _):
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                return int(v)
            raise TypeError(f"expected an integer, got {v!r}")
        return v

    def to_float(v, _):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"expected a number, got {v!r}")
        return float(v)

    def to_str(v, _):
        if not isinstance(v, str):
            raise TypeError(f"expected a string, got {v!r}")
        return v

    conv.register_structure_hook(int, to_int)
    conv.register_structure_hook(float, to_float)
    conv.register_structure_hook(str, to_str)
    return conv


_converter = _strict_converter()


def merge(base: dict, over: Mapping, where: str, path: str = "") -> dict:
    """Deep-merge `over` into a copy of `base`; a key `base` does not have is an error."""
    out = dict(base)
    for k, v in over.items():
        key = f"{path}.{k}" if path else str(k)
        if k not in base:
            raise ConfigError(f"{where}: unknown key '{key}'")
        if isinstance(v, Mapping) and isinstance(base[k], dict):
            out[k] = merge(base[k], v, where, key)
        else:
            out[k] = v
    return out


def dotted_to_nested(overrides: Mapping[str, Any]) -> dict:
    """{'memory.hbm.x': 1} -> {'memory': {'hbm': {'x': 1}}}. String values are read as YAML scalars."""
    nested: dict = {}
    for dotted, value in overrides.items():
        if isinstance(value, str):
            value = parse_yaml(value, f"--set {dotted}") if value.strip() else value
        parts = dotted.split(".")
        d = nested
        for p in parts[:-1]:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ConfigError(f"--set {dotted}: '{p}' is set twice")
        d[parts[-1]] = value
    return nested


def parse_set_args(items: list[str] | None) -> dict[str, str]:
    """['a.b=1', ...] (the CLI's --set) -> {'a.b': '1'}."""
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {item}: expected key.path=value")
        out[key.strip()] = value.strip()
    return out


def _raw_config(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'base' chain loops back to itself")
    data = read_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    base_path = None
    if isinstance(base, str):
        # a path is relative to the variant file; a bare name is looked up in hwconfigs/
        ref = path.parent / base if Path(base).suffix in (".yaml", ".yml") else base
        with contextlib.suppress(ConfigError):
            base_path = find_file(ref, "hwconfigs")
    if base_path is None:
        expected = ", ".join(known_names("hwconfigs")) + " or a path to a .yaml file"
        raise ConfigError(f"{path}: key 'base': expected {expected}, got {base!r}")
    return merge(_raw_config(base_path, seen + (path.resolve(),)), data, str(path))


def structure(raw: dict, where: str) -> HwConfig:
    try:
        return _converter.structure(raw, HwConfig)
    except Exception as e:  # cattrs collects type, missing-key and validator errors into a group
        errors = list(_leaf_errors(e))
        # an unknown key first: a misspelt key also shows up as a missing one
        errors.sort(key=lambda err: not isinstance(err[1], ForbiddenExtraKeysError))
        raise ConfigError(f"{where}: {_describe(*errors[0], raw)}") from None


def _leaf_errors(exc: BaseException, path: tuple[str, ...] = (), type_: Any = None):
    """(key path, exception, expected type) for each error in cattrs' error tree."""
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            key = note.name if isinstance(note, AttributeValidationNote) else note.index
            yield from _leaf_errors(sub, path + (str(key),), note.type)
        for sub in without:
            yield from _leaf_errors(sub, path, None)
    else:
        yield path, exc, type_


_EXPECTED = {int: "an integer", float: "a number", str: "a string"}


def _describe(path: tuple[str, ...], exc: BaseException, type_: Any, raw: dict) -> str:
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"unknown key '{'.'.join(path + (sorted(map(str, exc.extra_fields))[0],))}'"
    if isinstance(exc, KeyError):
        return f"missing key '{'.'.join(path)}'"
    # attrs validators raise in the record's __init__, so the path stops at the record:
    # "'l1_bytes' must be > 0: 0" names the field
    m = re.match(r"'([\w.]+)' must be (.*?): ", str(exc))
    if isinstance(exc, ValueError) and m:
        path += tuple(m[1].split("."))
        return f"key '{'.'.join(path)}': expected a value {m[2]}, got {_value_at(raw, path)!r}"
    if type_ is None:
        return f"key '{'.'.join(path)}': {exc}"
    expected = _EXPECTED.get(type_, "a mapping")  # the other field types are records and dicts
    return f"key '{'.'.join(path)}': expected {expected}, got {_value_at(raw, path)!r}"


def _value_at(raw: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        raw = {str(k): v for k, v in raw.items()}[key]
    return raw


def load_hw(name_or_path: str | os.PathLike | HwConfig = DEFAULT_HW,
            overrides: Mapping[str, Any] | None = None) -> HwConfig:
    """Load a hardware config by name (hwconfigs/NAME.yaml) or path - or take a loaded
    one - with optional what-if overrides as a mapping {"key.path": value}."""
    if isinstance(name_or_path, HwConfig):
        if not overrides:
            return name_or_path
        where = name_or_path.name + " (--set)"
        return structure(merge(attrs.asdict(name_or_path), dotted_to_nested(overrides), where), where)
    path = find_file(name_or_path, "hwconfigs")
    raw = _raw_config(path)
    where = str(path)
    hw = structure(raw, where)
    if not overrides:
        return hw
    # the file alone is valid, so an error from here on is the override's
    where += " (--set)"
    return structure(merge(raw, dotted_to_nested(overrides), where), where)
