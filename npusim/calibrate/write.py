"""The calibrated config: a variant YAML with `base:` the config calibrated and only the
fitted fields, each with a comment saying it is an assumed field, fitted from how
many rows on which op types, and the error on those rows before and after."""

from __future__ import annotations

import os
from pathlib import Path

from npusim.calibrate.report import overall
from npusim.calibrate.session import Calibration
from npusim.hw.load import known_names
from npusim.outputs import write_text


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def yaml_number(v) -> str:
    if isinstance(v, int):
        return str(v)
    text = f"{v:.6g}"
    return text if any(c in text for c in ".en") else text + ".0"  # stays a float in YAML


def config_text(cal: Calibration, out: str | Path) -> str:
    out = Path(out)
    if cal.hw_ref in known_names("hwconfigs") and not Path(cal.hw_ref).suffix:
        base = cal.hw_ref
    else:  # a path: relative to the written file, as the loader reads it
        base = os.path.relpath(cal.hw_path.resolve(), out.resolve().parent)
    o = overall(cal)
    lines = [f"# {cal.base.name} calibrated by `npusim calibrate` on {cal.profile}: {len(cal.mapped)} of "
             f"{cal.rows_read} rows mapped.",
             "# Only fields the base marks \"assumed\" are fitted; every other value is the base's.",
             f"# Op time error |simulated / measured - 1|: before median {_pct(o['before']['median'])} "
             f"max {_pct(o['before']['max'])}; after median {_pct(o['after']['median'])} "
             f"max {_pct(o['after']['max'])};",
             f"# held out ({cal.folds}-fold cross-validation over distinct ops) median "
             f"{_pct(o['held_out']['median'])} max {_pct(o['held_out']['max'])}.",
             f"base: {base}", f"name: {out.stem}"]
    tree: dict = {}  # the fitted fields nested as the config nests them (aiv.vector_cycles_per_repeat.mul)
    for f in cal.fields:
        *path, key = f.field.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        types = ", ".join(f.op_types[:6]) + (f" and {len(f.op_types) - 6} more" if len(f.op_types) > 6 else "")
        node[key] = (f"{yaml_number(f.after)}   # assumed; fitted from {f.rows} rows on {types}; median error "
                     f"{_pct(f.error_before)} -> {_pct(f.error_after)} (base {yaml_number(f.before)})")
    return "\n".join(lines + _yaml_lines(tree)) + "\n"


def _yaml_lines(tree: dict, depth: int = 0) -> list[str]:
    """`tree`'s keys as YAML lines, a leaf's text after its key."""
    lines = []
    for key, value in tree.items():
        if isinstance(value, dict):
            lines += [f"{'  ' * depth}{key}:", *_yaml_lines(value, depth + 1)]
        else:
            lines.append(f"{'  ' * depth}{key}: {value}")
    return lines


def write_config(cal: Calibration, out: str | Path) -> Path:
    return write_text(out, config_text(cal, out))
