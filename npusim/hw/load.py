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
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

from npusim.errors import ConfigError
from npusim.hw.checks import inconsistency
from npusim.hw.compat import upgrade
from npusim.hw.config import HwConfig
from npusim.hw.parse import clipped, did_you_mean, input_file, parse_yaml, read_yaml, short, strict_converter
from npusim.outputs_check import overlong

__all__ = ["DEFAULT_HW", "find_file", "known_names", "leaf_errors", "load_hw", "parse_set_args", "parse_yaml",
           "possible_path", "raw_config", "read_yaml", "search_dirs"]

DEFAULT_HW = "ascend910b2"


def search_dirs(kind: str) -> list[Path]:
    """Where named configs of `kind` (hwconfigs, workloads, services) are looked up, first match
    wins: $NPUSIM_HWCONFIGS / $NPUSIM_WORKLOADS, ./KIND of the working folder, then the
    configs shipped inside the package (npusim/KIND, package data: found wherever
    npusim is installed; the repository's top-level KIND/ is a link to them)."""
    dirs = []
    if given := os.environ.get(variable := "NPUSIM_" + kind.upper()):
        if not Path(given).is_dir():  # else a name it was meant to find would be taken from the next folder
            raise ConfigError(f"${variable}: {given} is not a folder (expected the folder of {kind} .yaml files "
                              "to look names up in first)")
        dirs.append(Path(given))
    dirs.append(Path.cwd() / kind)
    dirs.append(Path(str(resources.files("npusim") / kind)))  # an installed package is a folder, not a zip
    return dirs


def find_file(name_or_path: str | os.PathLike, kind: str) -> Path:
    """A name from hwconfigs/ (or workloads/, services/), or a path to a YAML file (a
    regular file: input_file)."""
    if os.fspath(name_or_path) == "":  # Path('') is the working folder
        raise ConfigError(f"{kind}: expected a config name or a path to a .yaml file, got an empty string")
    p = possible_path(name_or_path, kind)
    if p.suffix in (".yaml", ".yml", ".json") or p.exists():
        if not p.exists():
            raise ConfigError(f"{p}: no such file")
        return input_file(p)
    for d in search_dirs(kind):
        for ext in (".yaml", ".yml"):
            if (d / (str(name_or_path) + ext)).is_file():
                return d / (str(name_or_path) + ext)
    raise ConfigError(f"{kind}: no config named '{name_or_path}' (known: {', '.join(known_names(kind)) or 'none'})")


def possible_path(name_or_path: str | os.PathLike, kind: str) -> Path:
    """`name_or_path` as a Path, refused in one line if no file system could hold it (a name
    longer than a folder entry takes, a path longer than PATH_MAX): looking it up raised
    'File name too long' with the whole name, thousands of characters."""
    p = Path(name_or_path)
    if overlong(p):
        raise ConfigError(f"{kind}: expected a config name or a path to a .yaml file, got "
                          f"{clipped(os.fspath(p))}: longer than a file's name or path can be")
    return p


def known_names(kind: str) -> list[str]:
    return sorted({f.stem for d in search_dirs(kind) if d.is_dir() for f in d.glob("*.yaml")})


_converter = strict_converter()

# `base:` chains deeper than this are refused (the shipped variants are one level deep).
MAX_BASE_DEPTH = 8


def merge(base: dict, over: Mapping, where: str, path: str = "") -> dict:
    """Deep-merge `over` into a copy of `base`; a key `base` does not have is an error."""
    out = dict(base)
    for k, v in over.items():
        key = f"{path}.{k}" if path else str(k)
        if k not in base:
            raise ConfigError(f"{where}: unknown key '{short(key)[1:-1]}'{did_you_mean(k, base)}")
        if isinstance(v, Mapping) and isinstance(base[k], dict):
            out[k] = merge(base[k], v, where, key)
        else:
            out[k] = v
    return out


def dotted_to_nested(overrides: Mapping[str, Any]) -> dict:
    """{'memory.hbm.x': 1} -> {'memory': {'hbm': {'x': 1}}}. String values are read as YAML scalars."""
    if not isinstance(overrides, Mapping):
        raise TypeError(f"overrides: expected a mapping {{'key.path': value}}, got {short(overrides)}")
    nested: dict = {}
    for dotted, value in overrides.items():
        if not isinstance(dotted, str):
            raise TypeError(f"overrides: expected 'key.path' strings as keys, got {short(dotted)}")
        if isinstance(value, str):
            value = parse_yaml(value, f"--set {short(dotted)[1:-1]}") if value.strip() else value
        if _sets_nothing(value):  # merged into the config as no change, yet reported as a what-if
            raise ConfigError(f"--set {short(dotted)[1:-1]}: an empty mapping sets no field (expected a value, or "
                              "{field: value, ...})")
        parts = dotted.split(".")
        d = nested
        for p in parts[:-1]:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ConfigError(f"--set {short(dotted)[1:-1]}: '{short(p)[1:-1]}' is set twice")
        if parts[-1] in d:
            raise ConfigError(f"--set {short(dotted)[1:-1]}: '{short(parts[-1])[1:-1]}' is set twice")
        d[parts[-1]] = value
    return nested


def _sets_nothing(value: Any) -> bool:
    """`value` is, or holds, an empty mapping ({} or {a: {}})."""
    return isinstance(value, Mapping) and (not value or any(_sets_nothing(v) for v in value.values()))


def parse_set_args(items: list[str] | None, flag: str = "--set") -> dict[str, str]:
    """['a.b=1', ...] (the CLI's --set, or `flag`) -> {'a.b': '1'}; a key given twice is an error."""
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            key = "key" if flag == "--workload-set" else "key.path"
            raise ConfigError(f"{flag} {short(item)[1:-1]}: expected {key}=value")
        if key.strip() in out:
            raise ConfigError(f"{flag} {short(key.strip())[1:-1]}: given twice ({short(out[key.strip()])} and "
                              f"{short(value.strip())})")
        out[key.strip()] = value.strip()
    return out


def raw_config(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, dict[str, Path]]:
    """The merged mapping of a config and its `base:` chain, and which file gave each
    key path (so an error names the file the bad value is in)."""
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'base' chain loops back to itself")
    if len(seen) >= MAX_BASE_DEPTH:
        raise ConfigError(f"{path}: 'base' chain deeper than {MAX_BASE_DEPTH} files")
    data = read_yaml(path)
    given = "base" in data  # `base:` left empty is no base (it said "missing key 'name'")
    base = data.pop("base", None)
    if base is None and not given:  # a complete config: fields added since it was written take their earlier meaning
        data = upgrade(data)
        return data, _origins(data, path)
    base_path = None
    if isinstance(base, str):
        # a path is relative to the variant file; a bare name is looked up in hwconfigs/
        ref = path.parent / base if Path(base).suffix in (".yaml", ".yml") else base
        with contextlib.suppress(ConfigError):
            base_path = find_file(ref, "hwconfigs")
    if base_path is None:
        expected = ", ".join(known_names("hwconfigs")) + " or a path to a .yaml file"
        raise ConfigError(f"{path}: key 'base': expected {expected}, got {short(base)}")
    raw, origins = raw_config(base_path, seen + (path.resolve(),))
    return merge(raw, data, str(path)), origins | _origins(data, path)


def _origins(data: dict, path: Path, prefix: str = "") -> dict[str, Path]:
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        out[key] = path
        if isinstance(v, dict):
            out |= _origins(v, path, key + ".")
    return out


def _file_of(key: str, origins: Mapping[str, Path] | None, where: str) -> str:
    """The file that gave `key` (or its nearest enclosing section), else `where`."""
    while origins:
        if key in origins:
            return str(origins[key])
        if "." not in key:
            break
        key = key.rpartition(".")[0]
    return where


def structure(raw: dict, where: str, origins: Mapping[str, Path] | None = None) -> HwConfig:
    """A validated HwConfig from a merged mapping. `where` names the source in errors;
    `origins` (key path -> file) names the file of a bad value in a `base:` chain."""
    try:
        hw = _converter.structure(raw, HwConfig)
    except Exception as e:  # cattrs collects type, missing-key and validator errors into a group
        errors = list(leaf_errors(e))
        # an unknown key first: a misspelt key also shows up as a missing one
        errors.sort(key=lambda err: not isinstance(err[1], ForbiddenExtraKeysError))
        key, message = _describe(*errors[0], raw)
        # a missing key is the root file's to give (the one without a base)
        file = where if isinstance(errors[0][1], KeyError) else _file_of(key, origins, where)
        raise ConfigError(f"{file}: {message}") from None
    bad = inconsistency(hw)
    if bad:
        key, message = bad
        raise ConfigError(f"{_file_of(key, origins, where)}: key '{key}': {message}")
    return hw


def leaf_errors(exc: BaseException, path: tuple[str, ...] = (), type_: Any = None):
    """(key path, exception, expected type) for each error in cattrs' error tree."""
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            key = note.name if isinstance(note, AttributeValidationNote) else note.index
            yield from leaf_errors(sub, path + (str(key),), note.type)
        for sub in without:
            yield from leaf_errors(sub, path, None)
    else:
        yield path, exc, type_


_EXPECTED = {int: "an integer", float: "a number", str: "a string"}


def _record_at(path: tuple[str, ...]) -> Any:
    """The attrs class (or dict type) of the value at a key path of HwConfig."""
    cls: Any = HwConfig
    for part in path:
        if attrs.has(cls):
            cls = typing.get_type_hints(cls).get(part)
        elif typing.get_origin(cls) is dict:
            cls = typing.get_args(cls)[1]
        else:
            return None
    return cls


def _describe(path: tuple[str, ...], exc: BaseException, type_: Any, raw: dict) -> tuple[str, str]:
    """(dotted key path, the message after the file name) for one cattrs leaf error."""
    dotted = ".".join(path)
    if isinstance(exc, ForbiddenExtraKeysError):
        extra = sorted(map(str, exc.extra_fields))[0]
        cls = _record_at(path)
        hint = did_you_mean(extra, attrs.fields_dict(cls)) if attrs.has(cls) else ""
        key = ".".join(path + (extra,))
        return key, f"unknown key '{short(key)[1:-1]}'{hint}"
    if isinstance(exc, KeyError):
        return dotted, f"missing key '{dotted}'"
    # attrs validators raise in the record's __init__, so the path stops at the record:
    # "'l1_bytes' must be > 0: 0" names the field
    m = re.match(r"'([\w.]+)' must be (.*?): ", str(exc))
    if isinstance(exc, ValueError) and m:
        path += tuple(m[1].split("."))
        expected = "a finite number" if m[2] == "finite" else f"a value {m[2]}"
        return ".".join(path), f"key '{'.'.join(path)}': expected {expected}, got {short(_value_at(raw, path))}"
    if type_ is None:
        return dotted, f"key '{dotted}': {short(str(exc))[1:-1]}"
    expected = _EXPECTED.get(type_, "a mapping")  # the other field types are records and dicts
    return dotted, f"key '{dotted}': expected {expected}, got {short(_value_at(raw, path))}"


def _value_at(raw: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        raw = {str(k): v for k, v in raw.items()}[key]
    return raw


def load_hw(name_or_path: str | os.PathLike | HwConfig = DEFAULT_HW,
            overrides: Mapping[str, Any] | None = None) -> HwConfig:
    """Load a hardware config by name (hwconfigs/NAME.yaml) or path - or take a loaded
    one - with optional what-if overrides as a mapping {"key.path": value}."""
    if not isinstance(name_or_path, (str, os.PathLike, HwConfig)):
        raise TypeError(f"hw: expected a config name, a path or an HwConfig, got {short(name_or_path)}")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"overrides: expected a mapping {{'key.path': value}} or None, got {short(overrides)}")
    if isinstance(name_or_path, HwConfig):
        if not overrides:
            return name_or_path
        where = name_or_path.name + " (--set)"
        return structure(merge(attrs.asdict(name_or_path), dotted_to_nested(overrides), where), where)
    path = find_file(name_or_path, "hwconfigs")
    raw, origins = raw_config(path)
    where = str(path)
    hw = structure(raw, where, origins)
    if not overrides:
        return hw
    # the file alone is valid, so an error from here on is the override's
    where += " (--set)"
    return structure(merge(raw, dotted_to_nested(overrides), where), where)
