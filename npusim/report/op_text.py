"""The text `npusim op` prints: an op report's figures, each under the name the JSON
and CSV give it (docs/operators.md, "Reading the figures"), and an op type's parameter help."""

from __future__ import annotations

import attrs

from npusim.ops.registry import spec
from npusim.ops.roofline import link_utilisation
from npusim.report.contract import set_note
from npusim.report.tables import stalls


def op_help(op_type: str) -> str:
    """`npusim op TYPE --help`: the op's parameters and tiling knobs, from its descriptor."""
    sp = spec(op_type)
    lines = [f"npusim op {op_type} key=value ...  ({sp.help})", "", "parameters:"]
    for f in attrs.fields(sp.params):
        lines.append(f"  {f.name:14s} default {f.default!r:10s} {f.metadata.get('help', '')}")
    if sp.tiling is not None:
        lines += ["", "tiling (tiling.KEY=VALUE, default: chosen by the lowering):"]
        for f in attrs.fields(sp.tiling):
            lines.append(f"  {f.name:14s} {f.metadata.get('help', '')}")
    return "\n".join(lines)


def op_summary(r, overrides=None) -> str:
    """The op's figures, each under the name the JSON and CSV give it (docs/operators.md, "Reading the figures")."""
    low, hw = r.lowered, r.hw
    n = len(low.kernels)
    parts = f"kernel start{'s' * (n > 1)} {hw.us(r.start_cycles):.2f} + kernel{'s' * (n > 1)} {hw.us(r.kernel_cycles):.2f}"
    if round(hw.us(r.host_gap_cycles), 2):
        parts += f" + waiting for launch {hw.us(r.host_gap_cycles):.2f}"
    links = link_utilisation(r.stats, hw, r.cycles)
    busy = []
    for st in stalls(r.stats):
        if st.pipe in r.stats.busy_cycles:
            split = f" (work {st.work:.0f} + data {st.data:.0f})" if round(st.data) else ""
            busy.append(f"{st.pipe} {st.busy:.0f}%{split}")
    lines = [
        f"{low.op_type} on {hw.name}{set_note(overrides)}: {r.us:.2f} us = {parts} ({r.cycles:.0f} cycles), "
        f"{n} kernel(s)",
        f"  {r.tflops:.2f} TFLOPS, GM {r.gm_bw_bytes_per_s / 1e12:.3f} TB/s, HBM {r.hbm_bw_bytes_per_s / 1e12:.3f} TB/s "
        f"({100 * links['HBM']:.0f}% of sustained), L2 {100 * links['L2']:.0f}% of its bandwidth, "
        f"L2 hit rate {100 * r.stats.l2_hit_rate:.1f}%",
        f"  bound: {r.bound}{f' (kernel {r.longest.name}, the longest)' if n > 1 and r.bound != 'latency' else ''} (roofline {r.roofline.time_s * 1e6:.2f} us: compute {r.roofline.compute_s * 1e6:.2f}, "
        f"HBM {r.roofline.hbm_s * 1e6:.2f}, L2 {r.roofline.l2_s * 1e6:.2f})",
        "  pipes busy: " + ", ".join(busy) + " (busy = working + waiting for data, % of core residency)",
    ]
    if low.tiling is not None:
        lines.append(f"  tiling: {low.tiling}")
    if r.run.fast_forward_note():
        lines.append(f"  kernels: {r.run.fast_forward_note()}")
    return "\n".join(lines)
