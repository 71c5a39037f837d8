"""Which hardware fields a computation reads: what a cached step is keyed on.

`tracked(hw)` is a copy of a config whose sections note every field read while a
`recording()` block is open. A cached computation runs on the tracked copy; its
entry is keyed on the values of the fields it read, not on the whole config. A
later run whose config agrees on those fields takes the same branches, reads the
same fields and computes the same value (the computation is deterministic and
sees the config only through these reads), so it is served from the cache even if
another field differs - e.g. a sweep point that changes a field no kernel of the
step reads. Reads through a dict field (vector costs per op, fractals per dtype)
count as reads of the whole field; `hash`, `==` and `attrs.asdict` of a tracked
config read every field (conservative: a smaller cache hit rate, never a wrong hit).

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


def _tracking_class(cls: type, prefix: str, skip: frozenset = frozenset()) -> type:
    """A subclass of the attrs class `cls` whose field reads (but those in `skip`) are
    recorded as prefix + name."""
    names = frozenset(a.name for a in attrs.fields(cls))
    recorded = names - skip
    get = object.__getattribute__

    def __getattribute__(self, name):
        if _active and name in recorded:
            for r in _active:
                r.add(prefix + name)
        return get(self, name)

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
                v = _SECTIONS[a.name](**{f.name: getattr(v, f.name) for f in attrs.fields(type(v))})
            values[a.name] = v
        return _TOP(**values)


def values_of(hw: HwConfig, reads: Iterable[str]) -> dict[str, object]:
    """path -> value in `hw` of each read path (what a step's key holds)."""
    out = {}
    for path in sorted(reads):
        v = hw
        for part in path.split("."):
            v = getattr(v, part)
        out[path] = attrs.asdict(v) if attrs.has(type(v)) else v
    return out


__all__ = ["note", "paused", "recording", "tracked", "values_of"]
