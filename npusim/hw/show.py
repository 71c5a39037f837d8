"""`npusim hw show`: a config as an aligned table (key path, value, help) plus its
derived peaks, bandwidths and ridge points. Formatting only; the figures come from
npusim.hw.derived."""

from __future__ import annotations

import attrs

from npusim.hw.config import Fractal, HwConfig
from npusim.hw.derived import Derived, derive
from npusim.hw.load import find_file, load_hw, parse_set_args


def show_hw(name_or_path: str, set_args: list[str] | None = None) -> str:
    overrides = parse_set_args(set_args)
    hw = load_hw(name_or_path, overrides)
    title = f"{hw.name}  ({find_file(name_or_path, 'hwconfigs')})"
    if overrides:
        title += "  with " + " ".join(f"{k}={v}" for k, v in overrides.items())
    sections: list[tuple[str, list[tuple[str, ...]]]] = [("", _rows(hw, "", hw))]
    for f in attrs.fields(HwConfig):
        record = getattr(hw, f.name)
        if attrs.has(type(record)):
            doc = (type(record).__doc__ or "").strip().splitlines()
            sections.append((f.name + (f"  - {doc[0]}" if doc else ""), _rows(record, f.name + ".", hw)))
    sections.append(("derived  (npusim.hw.derived.derive)", _rows(derive(hw), "", hw)))
    return title + "\n" + _table(sections)


def _rows(record, prefix: str, hw: HwConfig) -> list[tuple[str, ...]]:
    """(key path, value, value in readable units, help) for each plain field of `record`."""
    rows = []
    for f in attrs.fields(type(record)):
        value = getattr(record, f.name)
        help = f.metadata.get("help", "")
        if attrs.has(type(value)):
            continue  # a section of its own
        if isinstance(value, dict):
            for i, (k, v) in enumerate(value.items()):
                unit_name = f.name.replace("flops", "ops") if k.startswith("int") else f.name
                rows.append((f"{prefix}{f.name}.{k}", *_format(unit_name, v, hw, record), help if i == 0 else ""))
        else:
            rows.append((prefix + f.name, *_format(f.name, value, hw, record), help))
    return rows


def _format(name: str, v, hw: HwConfig, record) -> tuple[str, str]:
    """(value, readable form) by the unit in the field's name. Config values print as
    they would be written in YAML or --set; derived figures print in readable units."""
    derived = isinstance(record, Derived)
    if isinstance(v, Fractal):
        return f"m0={v.m0} n0={v.n0} k0={v.k0}", f"{v.m0} x {v.n0} x {v.k0}"
    if name.endswith("_flops_per_s"):
        return f"{v / 1e12:.1f} TFLOPS", ""
    if name.endswith("_ops_per_s") and derived:
        return f"{v / 1e12:.1f} TOPS" if "cube" in name else f"{v / 1e12:.2f} Tops/s", ""
    if name.endswith("_flops_per_byte"):
        return f"{v:.1f} FLOP/B", ""
    if name.endswith("_ops_per_byte"):
        return f"{v:.2f} op/B", ""
    if name.endswith("_bytes_per_s"):
        rate = f"{v / 1e12:.4g} TB/s" if v >= 1e12 else f"{v / 1e9:.4g} GB/s"
        per_cycle = f"{v / hw.chip.freq_hz:.1f} B/cycle"
        return (rate, per_cycle) if derived else (_num(v), f"{rate}, {per_cycle}")
    if name.endswith("_bytes") and v >= 1024:
        unit = next(u for u in range(3, 0, -1) if v >= 1024**u)
        return _num(v), f"{v / 1024**unit:g} {('KiB', 'MiB', 'GiB')[unit - 1]}"
    if name.endswith("_hz"):
        return _num(v), f"{v / 1e6:g} MHz"
    return _num(v), ""


def _num(v) -> str:
    """1.8e9 rather than 1800000000.0 or 1.8e+09, so it can be pasted into --set."""
    if isinstance(v, float):
        return f"{v:.6g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
    return str(v)


def _table(sections: list[tuple[str, list[tuple[str, ...]]]]) -> str:
    rows = [r for _, section in sections for r in section]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for title, section in sections:
        if title:
            lines += ["", title]
        for row in section:
            cells = [c.ljust(w) for c, w in zip(row, widths)] + [row[3]]
            lines.append(("  " + "  ".join(cells)).rstrip())
    return "\n".join(lines)
