"""Which hardware fields a computation reads: what a cached step is keyed on.

`tracked(hw)` is a copy of a config whose sections note every field read while a
`recording()` block is open. A cached computation runs on the tracked copy; its
entry is keyed on the values of the fields it read, not on the whole config. A
later run whose config agrees on those fields takes the same branches, reads the
same fields and computes the same value (the computation is deterministic and
sees the config only through these reads), so it is served from the cache even if
another field differs - e.g. a sweep point that changes a field no kernel of the
step reads. A table field (vector costs per op, fractals per dtype) is read entry
by entry when looked up or tested for by key ('aiv.vector_cycles_per_repeat.exp'),
as a whole when iterated or compared; `hash`, `==` and `attrs.asdict` of a
tracked config read every field (conservative: a smaller cache hit rate, never a
wrong hit).

A tracked config pickles as a plain one, so stored values never refer to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import attrs

from npusim.hw import HwConfig

_active: list[set[str]] = []  # the open recordings, innermost last; every read goes into each


@contextlib.contextmanager
def recording() -> Iterator[set[str]]:
    """Collect the dotted paths ('l2.line_bytes') of the tracked fields read in the block."""
    reads: set[str] = set()
    _active.append(reads)
    try:
        yield reads
    finally:  # by identity: an enclosing recording may hold an equal set
        del _active[next(i for i in range(len(_active) - 1, -1, -1) if _active[i] is reads)]


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Reads in the block are not recorded (a key built from the whole config, which
    a cache checks separately)."""
    saved = _active[:]
    _active.clear()
    try:
        yield
    finally:
        _active[:] = saved


def note(reads: Iterable[str]) -> None:
    """Record `reads` as if made now (a value reused from an in-process cache brings the reads that made it)."""
    for r in _active:
        r.update(reads)


def _rebuild(cls, values: dict):
    return cls(**values)


def _record(path: str) -> None:
    for r in _active:
        r.add(path)


class _Table(dict):
    """A table field of a tracked config: a lookup of a key (or a test for it) records
    that entry's path, any other use (iteration, comparison, copying) the whole
    table's. Pickles as a plain dict."""

    __slots__ = ("path",)

    def __init__(self, data: dict, path: str):
        super().__init__(data)
        self.path = path

    def __getitem__(self, key):
        if _active:
            _record(f"{self.path}.{key}")
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        if _active:
            _record(f"{self.path}.{key}")
        return dict.get(self, key, default)

    def __contains__(self, key):
        if _active:
            _record(f"{self.path}.{key}")
        return dict.__contains__(self, key)

    def __reduce_ex__(self, protocol):
        return dict, (dict(self),)


def _whole(name: str):
    method = getattr(dict, name)

    def read_all(self, *args, **kwargs):
        if _active:
            _record(self.path)
        return method(self, *args, **kwargs)

    read_all.__name__ = name
    return read_all


for _name in ("__iter__", "__len__", "__eq__", "__ne__", "__repr__", "keys", "values", "items",
              "copy", "__or__", "__ror__"):
    setattr(_Table, _name, _whole(_name))
_Table.__hash__ = None  # a dict's: unhashable


def value_at(obj, dotted: str):
    """The value at a dotted key path of a config: a field, or an entry of a table field."""
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _tracking_class(cls: type, prefix: str, skip: frozenset = frozenset()) -> type:
    """A subclass of the attrs class `cls` whose field reads (but those in `skip`) are
    recorded as prefix + name."""
    names = frozenset(a.name for a in attrs.fields(cls))
    recorded = names - skip
    get = object.__getattribute__

    def __getattribute__(self, name):
        value = get(self, name)
        if _active and name in recorded and value.__class__ is not _Table:  # a table records its own reads
            for r in _active:
                r.add(prefix + name)
        return value

    def __reduce_ex__(self, protocol):
        return _rebuild, (cls, {n: get(self, n) for n in names})

    return type(f"Tracked{cls.__name__}", (cls,), {"__slots__": (), "__getattribute__": __getattribute__,
                                                   "__reduce_ex__": __reduce_ex__, "__module__": __name__})


def _section_types() -> dict[str, type]:
    """Field name -> attrs class of each section of HwConfig (its annotations are strings)."""
    import typing

    hints = typing.get_type_hints(HwConfig)
    return {a.name: hints[a.name] for a in attrs.fields(HwConfig) if attrs.has(hints[a.name])}


# a section is not recorded when reached from the config, only the fields read from it
_SECTIONS = {name: _tracking_class(t, f"{name}.") for name, t in _section_types().items()}
_TOP = _tracking_class(HwConfig, "", frozenset(_SECTIONS))


def tracked(hw: HwConfig) -> HwConfig:
    """A copy of `hw` that records its field reads (see the module doc); the same copy
    for the same config object (so what is memoised per config object - a verified
    kernel - is shared by the runs of one command)."""
    hit = _TRACKED.get(id(hw))
    if hit is not None and hit[0] is hw:
        return hit[1]
    copy = _tracked_copy(hw)
    _TRACKED[id(hw)] = (hw, copy)  # holds hw: its id is not reused while the entry lives
    if len(_TRACKED) > _TRACKED_MAX:
        del _TRACKED[next(iter(_TRACKED))]
    return copy


_TRACKED: dict[int, tuple[HwConfig, HwConfig]] = {}
_TRACKED_MAX = 16


def _tracked_copy(hw: HwConfig) -> HwConfig:
    with paused():  # building it reads every field (the validators): not the computation's reads
        values = {}
        for a in attrs.fields(HwConfig):
            v = getattr(hw, a.name)
            if a.name in _SECTIONS:
                v = _SECTIONS[a.name](**{f.name: _tracked_value(getattr(v, f.name), f"{a.name}.{f.name}")
                                         for f in attrs.fields(type(v))})
            values[a.name] = v
        return _TOP(**values)


def _tracked_value(v, path: str):
    """A section field as the tracked copy holds it: a table wrapped to record its reads."""
    return _Table(v, path) if isinstance(v, dict) else v


def values_of(hw: HwConfig, reads: Iterable[str]) -> dict[str, object]:
    """path -> value in `hw` of each read path (what a step's key holds)."""
    out = {}
    for path in sorted(reads):
        try:
            v = value_at(hw, path)
        except KeyError:  # a table entry a lowering tested for and this config lacks
            v = ABSENT
        out[path] = attrs.asdict(v) if attrs.has(type(v)) else v
    return out


ABSENT = "<absent>"  # values_of: the value of a table entry the config does not have


__all__ = ["note", "paused", "recording", "tracked", "value_at", "values_of"]
