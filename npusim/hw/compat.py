"""Hardware configs written for an earlier npusim keep loading: a complete config (one
without `base:`) that lacks a field added since gets the value that keeps what the
npusim it was written for simulated (docs/architecture.md, "Configs of earlier
releases"). A variant (`base:`) inherits the field from its base instead."""

from __future__ import annotations

import copy

# field added -> the value an earlier config means by its absence
ADDED = {
    # one card: collectives need a topology, a single-card run never uses it
    "topology": {"node_device_count": 1, "node_count": 1, "intra_node": "full_mesh",
                 "link_bw_bytes_per_s": 5.6e10, "link_latency_us": 2.0,
                 "nic_bw_bytes_per_s": 2.5e10, "nic_latency_us": 10.0},
    # Ascend C's Tanh as its composite, (exp(2x) - 1) / (exp(2x) + 1): as ascend910b2.yaml states
    "aiv.vector_cycles_per_repeat.tanh": 11,
    # every copy paid its own start-up
    "dma.outstanding": 1,
}
# field renamed -> the fields it became (each takes its value; the old key goes)
RENAMED = {
    "runtime.kernel_start_cycles": ("runtime.kernel_start_aic_cycles", "runtime.kernel_start_aiv_cycles",
                                    "runtime.kernel_start_mix_cycles"),
}
# field split off -> the field that held its value before (one DMA time per segment
# for every core, before the vector cores' had their own)
SPLIT_FROM = {"dma.vector_segment_cycles": "dma.segment_cycles"}


def _section(data: dict, dotted: str, make: bool = False) -> tuple[dict | None, str]:
    """The mapping that holds `dotted`'s last key (None: a section missing or not a
    mapping, which the loader names), and that key."""
    *sections, key = dotted.split(".")
    for s in sections:
        data = data.setdefault(s, {}) if make else data.get(s)
        if not isinstance(data, dict):
            return None, key
    return data, key


def _has(data: dict, dotted: str) -> bool:
    holder, key = _section(data, dotted)
    return holder is not None and key in holder


def upgrade(data: dict) -> dict:
    """`data` (a complete config's mapping) with the fields added, renamed or split
    since it was written filled in; a field it gives is never changed."""
    out = copy.deepcopy(data)
    for old, new in RENAMED.items():
        if _has(out, old) and not any(_has(out, n) for n in new):
            holder, key = _section(out, old)
            value = holder.pop(key)
            for n in new:
                target, k = _section(out, n, make=True)
                if target is not None:
                    target[k] = value
    for new, old in SPLIT_FROM.items():
        target, k = _section(out, new)
        if target is not None and k not in target and _has(out, old):
            source, key = _section(out, old)
            target[k] = source[key]
    for field, value in ADDED.items():
        target, k = _section(out, field, make=True)
        if target is not None and k not in target:
            target[k] = copy.deepcopy(value)
    return out
