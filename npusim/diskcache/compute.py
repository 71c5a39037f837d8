"""A computation on a hardware config, served from the store when it ran before.

    value = cached(store, "step", inputs, hw, lambda hw: run_graph(...))

The entry's key is the kind, the npusim model version (keys.version: not its
source), the inputs other than the config (their values: a workload, a step's
shape, pass names and options, file contents by hash) and the values of the
config fields the computation read (reads.py).
Which fields that is, is known only after a first run: a small "reads" entry per
(kind, inputs) lists the field sets runs have read so far, each then tried in
turn. Two processes updating that list at once may lose one set (the last writer
wins): a later run then misses and recomputes, never gets a wrong value.

On a miss the value is computed on a tracked copy of the config, stored, and
what is returned is the stored pickle read back - the same object a later hit
gives, so a warm run prints and writes exactly what the cold run did. The config
(and each of its sections) is stored by name, not by value: a value read back
refers to the caller's config, which may differ from the first run's in fields
that run did not read (a report of it names the caller's config, not the other).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from npusim.diskcache.keys import digest, version
from npusim.diskcache.reads import recording, tracked, values_of
from npusim.diskcache.store import DiskCache, dumps, loads_with_layout
from npusim.hw import HwConfig

T = TypeVar("T")
MAX_READ_SETS = 8  # field sets kept per (kind, inputs): distinct branches a config can take


def cached(store: DiskCache | None, kind: str, inputs: Any, hw: HwConfig, compute: Callable[[HwConfig], T]) -> T:
    """compute(hw), or the value a run with the same inputs and the same values of
    the config fields it read stored (see the module doc). store None or off: compute(hw)."""
    if store is None or not store.enabled:
        return compute(hw)
    base = digest(kind, version(), inputs)
    reads_key = digest("reads", base)
    mine = _refs(hw)
    for fields in store.get(reads_key, expected=_field_sets) or ():
        hit = store.get(digest(base, values_of(hw, fields)), mine)
        if hit is not None:
            return hit
    if not store.enabled:  # the folder turned out unusable: no tracking, no pickling
        return compute(hw)
    copy = tracked(hw)
    with recording() as reads:
        value = compute(copy)
    fields = sorted(reads)
    payload = dumps(value, _refs(copy))
    value, layout = loads_with_layout(payload, mine)  # what a hit will give (and the classes it holds)
    store.write(digest(base, values_of(hw, fields)), payload, layout)
    known = [f for f in store.get(reads_key, expected=_field_sets) or () if f != fields]
    store.put(reads_key, [fields, *known][:MAX_READ_SETS])
    return value


def _field_sets(value) -> bool:
    """What cached() stores under a reads key: a list of lists of field names."""
    return isinstance(value, list) and all(isinstance(f, list) and all(isinstance(n, str) for n in f)
                                           for f in value)


def _refs(hw: HwConfig) -> dict[str, Any]:
    """The config and its sections by name: what a stored value refers to, not holds."""
    return {"hw": hw} | {f"hw.{a.name}": getattr(hw, a.name) for a in attrs.fields(HwConfig)
                         if attrs.has(type(getattr(hw, a.name)))}


__all__ = ["cached"]
