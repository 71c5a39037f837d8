"""Which hardware config fields calibration may fit: those whose source comment in the
YAML (in the file of the `base:` chain that gives the value) says "assumed", and whose
unit makes them a cost or a rate (cycles, microseconds, bytes per cycle or second, an
efficiency, a cost counted in bytes of transfer: `_cost_bytes`) - never a size, a
count or a structural choice (L2 ways, flag ids), which a profile cannot measure and
a fit must not invent, and never a host-side cost (the
runtime's microsecond fields, PCIe), which neither a kernel's Task Duration nor
hccl_test's device-timed collective contains. The topology's microsecond fields (link
and NIC start-ups) are device-side: each transfer step of a collective pays them.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs

from npusim.diskcache.reads import value_at
from npusim.hw import HwConfig, load_hw
from npusim.hw.load import raw_config, find_file

COST_SUFFIXES = ("_cycles", "_efficiency", "_bytes_per_cycle", "_bytes_per_s", "_us", "_per_repeat", "_cost_bytes")
# host-side costs (the runtime's microsecond fields, host <-> device copies) are not part
# of a kernel's Task Duration nor of a collective's device time, so no profile fits them
HOST_SIDE_SECTION = "runtime."
HOST_SIDE = ("runtime.pcie_bw_bytes_per_s",)


def host_side(dotted: str) -> bool:
    return dotted in HOST_SIDE or (dotted.startswith(HOST_SIDE_SECTION) and dotted.endswith("_us"))
_KEY_LINE = re.compile(r"^( *)([A-Za-z_]\w*):(.*)$")


def field_comments(path: Path) -> dict[str, str]:
    """{dotted key path: the comment on its line} of one YAML config file."""
    comments, stack = {}, []  # stack: (indent, key) of the enclosing sections
    for line in path.read_text().splitlines():
        m = _KEY_LINE.match(line)
        if not m:
            continue
        indent, key, rest = len(m[1]), m[2], m[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        comment = re.match(r"(.*?)(?:\s#(.*))?$", rest).group(2)
        if comment:
            comments[dotted] = comment.strip()
    return comments


value_of = value_at  # the value at a dotted key path: a field, or a table's entry ('aiv.vector_cycles_per_repeat.exp')


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def scalar_fields(hw: HwConfig) -> list[str]:
    """Every plain numeric field of the config, and every entry of a table of numbers
    (a vector op's cost factor), as dotted key paths, in config order."""
    out = []
    for section in attrs.fields(HwConfig):
        record = getattr(hw, section.name)
        if not attrs.has(type(record)):
            continue
        for f in attrs.fields(type(record)):
            v = getattr(record, f.name)
            if _number(v):
                out.append(f"{section.name}.{f.name}")
            elif isinstance(v, dict) and v and all(_number(x) for x in v.values()):
                out += [f"{section.name}.{f.name}.{k}" for k in v]
    return out


def fittable_fields(hw_name_or_path: str | Path, host: bool = False) -> dict[str, str]:
    """{dotted field: its source comment} of the fields calibration may fit, in config
    order; host-side costs too if `host` (measurements timed around host calls: an
    event-timed loop of eager calls contains the host's cost per call)."""
    path = find_file(hw_name_or_path, "hwconfigs")
    _, origins = raw_config(path)
    comments: dict[Path, dict[str, str]] = {}
    hw = load_hw(path)
    out = {}
    for dotted in scalar_fields(hw):
        # a table's entry has the table's unit and, unless its own line says, its comment
        table = dotted.rsplit(".", 1)[0] if dotted.count(".") > 1 else dotted
        if not table.endswith(COST_SUFFIXES) or (host_side(dotted) and not host) or dotted not in origins:
            continue
        file = origins[dotted]
        lines = comments.setdefault(file, field_comments(file))
        comment = lines.get(dotted) or lines.get(table, "")
        if "assumed" in comment.lower():
            out[dotted] = comment
    return out
