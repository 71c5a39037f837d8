"""Two runs of one step side by side, A and B (`npusim compare --hw A B`, `--variant`,
`--fusion-rules A B`, or two pipelines not starting at the baseline): which kernels
changed most, what bounds each, and when a change is hidden by overlap.

Kernels of A and B are matched by name and, for a name that recurs, by its place
among the kernels of that name (the n-th `L0.q_proj.to_nz` of A is the n-th of B); a
kernel with no match ran in one run only (removed or added). A kernel's time is its
task time as msprof's Task Duration holds it (report.tables.task_cycles): from
reaching the head of its stream to its end, the kernel start included - what removing
the kernel would take off its stream.
"""

from __future__ import annotations

import bisect
import re

from attrs import frozen

from npusim.engine.device import KernelRecord
from npusim.ops.roofline import bound_of
from npusim.report.tables import task_cycles
from npusim.runtime.run import GraphRun

TOP = 10  # kernels the table lists, the largest changes first
HIDDEN_LINES = 3  # overlap lines printed at most (the JSON lists every one)
SAME_US = 0.005  # a change smaller than this prints as 0.00 us: no change to explain


def task_bound(k: KernelRecord, hw) -> str:
    """What bounds a kernel's task time: "launch" when its kernel start (the device's
    fixed cost per kernel, start - queued) is at least half of it, else what bounds the
    kernel as it ran (ops.roofline.bound_of, op_summary's Bound column: cube, vector,
    HBM, L2, a pipe such as AIC.MTE2, or latency)."""
    return "launch" if 2 * (k.start - k.queued) >= task_cycles(k) else bound_of(k.stats, hw, k.cycles)


@frozen
class KernelChange:
    """One kernel of A matched with its B (None: it ran in one run only), times in µs."""

    name: str
    index: int  # its place among the kernels of that name
    op_type: str
    a_us: float | None
    b_us: float | None
    a_bound: str | None
    b_bound: str | None

    @property
    def delta_us(self) -> float:
        return (self.b_us or 0.0) - (self.a_us or 0.0)

    @property
    def bound(self) -> str:
        """"HBM", or "launch -> HBM" when it differs between A and B."""
        bounds = [b for b in (self.a_bound, self.b_bound) if b is not None]
        return bounds[0] if len(set(bounds)) == 1 else " -> ".join(bounds)


def _keyed(kernels) -> dict[tuple[str, int], KernelRecord]:
    """Each kernel by (name, its place among the kernels of that name), in start order."""
    seen: dict[str, int] = {}
    out = {}
    for k in sorted(kernels, key=lambda r: (r.queued, r.id)):
        n = seen.get(k.name, 0)
        seen[k.name] = n + 1
        out[(k.name, n)] = k
    return out


def kernel_changes(a: GraphRun, b: GraphRun) -> list[KernelChange]:
    """Every kernel of A and of B, matched (see the module doc): A's in start order, then
    those only B ran."""
    ka, kb = _keyed(a.result.kernels), _keyed(b.result.kernels)
    out = []
    for key in list(ka) + [k for k in kb if k not in ka]:
        x, y = ka.get(key), kb.get(key)
        out.append(KernelChange(*key, (x or y).op_type,
                                a.hw.us(task_cycles(x)) if x else None, b.hw.us(task_cycles(y)) if y else None,
                                task_bound(x, a.hw) if x else None, task_bound(y, b.hw) if y else None))
    return out


_LAYER = re.compile(r"^L(\d+)\.")


@frozen
class ChangeRow:
    """Kernels of the same name but their layer ("L3.") whose change is the same - a
    decoder's layers run the same kernels - as one row: `layers` the layers it spans."""

    name: str  # "L1..L30.attention/decode_attention", or the kernel's own name
    count: int
    change: KernelChange  # the first of them (every one has its times and bounds)

    @property
    def delta_us(self) -> float:
        return self.count * self.change.delta_us


def rows_of(changes: list[KernelChange]) -> list[ChangeRow]:
    """`changes` with every group of like kernels (see ChangeRow) as one row, in A's order."""
    groups: dict[tuple, list[tuple[int | None, KernelChange]]] = {}
    for c in changes:
        m = _LAYER.match(c.name)
        base = c.name[m.end():] if m else c.name
        key = (base, c.index, c.op_type, c.a_us, c.b_us, c.a_bound, c.b_bound) if m else (c.name, c.index, id(c))
        groups.setdefault(key, []).append((int(m.group(1)) if m else None, c))
    rows = []
    for (base, *_), members in groups.items():
        layers = [n for n, _ in members]
        first = members[0][1]
        if len(members) == 1:
            rows.append(ChangeRow(first.name, 1, first))
        else:
            rows.append(ChangeRow(f"L{min(layers)}..L{max(layers)}.{base}" if len(set(layers)) == max(layers) - min(layers) + 1
                                  else f"L*.{base}", len(members), first))
    return rows


def largest(changes: list[KernelChange], top: int = TOP) -> list[ChangeRow]:
    """The `top` rows (rows_of) with the largest changes in all, ties in A's order."""
    rows = rows_of(changes)
    ranked = sorted(range(len(rows)), key=lambda i: -abs(rows[i].delta_us))
    return [rows[i] for i in ranked[:top]]


@frozen
class Hidden:
    """A kernel whose change the step need not see: in `side` (the run where it took
    longer) it was off the critical path, running on stream `stream` beside `beside`
    (on stream `beside_stream`), a kernel on it."""

    change: KernelChange
    side: str  # "A" or "B"
    stream: int
    beside: str
    beside_stream: int


def critical_path(kernels) -> set[int]:
    """The ids of the kernels on a run's critical path, found by last arrival: from the
    kernel that ends last, back to the kernel that ended last before it reached the head
    of its stream (what it waited for: its stream's previous kernel, an event's kernel on
    another stream, or - after a host gap - the kernel the host waited on), ties to its
    own stream, and so on to the step's first kernel. A gap the host makes (launch,
    synchronize) keeps the chain going through the kernel before it, so a kernel is called
    off the path only when a kernel of another stream, not it, is what came next."""
    ordered = sorted(kernels, key=lambda k: (k.end, k.id))
    ends = [k.end for k in ordered]
    if not ordered:
        return set()
    on, cur = set(), ordered[-1]
    while True:
        on.add(cur.id)
        i = bisect.bisect_right(ends, cur.queued) - 1
        if i < 0:
            return on
        latest = [k for k in ordered[bisect.bisect_left(ends, ends[i]):i + 1] if k.id not in on]
        if not latest:
            return on
        cur = next((k for k in latest if k.stream == cur.stream), latest[-1])


def _beside(k: KernelRecord, kernels, on: set[int]) -> KernelRecord | None:
    """The kernel of the critical path on another stream that overlaps k's task span most."""
    overlap = [(min(o.end, k.end) - max(o.queued, k.queued), o) for o in kernels
               if o.id in on and o.stream != k.stream and o.end > k.queued and o.queued < k.end]
    return max(overlap, key=lambda x: x[0])[1] if overlap else None


def hidden(a: GraphRun, b: GraphRun, changes: list[KernelChange]) -> list[Hidden]:
    """The changes hidden by overlap, largest first: a kernel removed, added, made
    slower or faster that, in the run where it took longer, was off the critical path
    (critical_path) while a kernel on it ran on another stream - the step did not wait
    for it there, so removing it (or making it faster) need not shorten the step by its
    time, adding it (or slowing it) need not lengthen it."""
    ka, kb = _keyed(a.result.kernels), _keyed(b.result.kernels)
    paths = {"A": critical_path(a.result.kernels), "B": critical_path(b.result.kernels)}
    out = []
    for c in changes:
        if abs(c.delta_us) < SAME_US:
            continue
        key = (c.name, c.index)
        side, run, k = ("A", a, ka[key]) if c.delta_us < 0 else ("B", b, kb[key])
        if k.id in paths[side]:
            continue
        other = _beside(k, run.result.kernels, paths[side])
        if other is not None:
            out.append(Hidden(c, side, k.stream, other.name, other.stream))
    return sorted(out, key=lambda h: -abs(h.change.delta_us))


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def _what(c: KernelChange) -> str:
    if c.a_us is None:
        return "added in B"
    if c.b_us is None:
        return "removed in B"
    return f"{'slower' if c.delta_us > 0 else 'faster'} in B"


def _strip_layer(name: str) -> str:
    m = _LAYER.match(name)
    return name[m.end():] if m else name


def hidden_lines(found: list[Hidden]) -> list[str]:
    """One line per group of like hidden changes (the same kernel of several layers,
    beside the same kernel, with the same times), largest first."""
    groups: dict[tuple, list[Hidden]] = {}
    for h in found:
        c = h.change
        key = (_strip_layer(c.name), c.a_us, c.b_us, h.side, h.stream, _strip_layer(h.beside), h.beside_stream)
        groups.setdefault(key, []).append(h)
    lines = []
    for members in sorted(groups.values(), key=lambda m: -abs(sum(h.change.delta_us for h in m))):
        h, c, n = members[0], members[0].change, len(members)
        name, beside = (c.name, h.beside) if n == 1 else (f"{n} x L*.{_strip_layer(c.name)}",
                                                           f"L*.{_strip_layer(h.beside)}")
        each = "" if n == 1 else " each"
        effect = (f"removing {'it' if n == 1 else 'them'} need not shorten the step by their time" if c.b_us is None
                  else f"adding {'it' if n == 1 else 'them'} need not lengthen the step by their time" if c.a_us is None
                  else f"the step need not see {n * c.delta_us:+,.2f} us")
        times = (f"{c.a_us:,.2f} us in A{each}" if c.b_us is None else f"{c.b_us:,.2f} us in B{each}"
                 if c.a_us is None else f"{c.a_us:,.2f} -> {c.b_us:,.2f} us{each}")
        lines.append(f"  hidden by overlap: {name} ({_what(c)}; {times}) ran in {h.side} on stream {h.stream} "
                     f"beside {beside} (stream {h.beside_stream}), off the critical path: {effect}")
    return lines


def kernel_table(names: tuple[str, str], a: GraphRun, b: GraphRun, top: int = TOP) -> str:
    """The per-kernel table of the largest changes, what A and B ran in all, and the
    changes hidden by overlap."""
    changes = kernel_changes(a, b)
    rows = [r for r in largest(changes, top) if abs(r.delta_us) >= SAME_US]
    only_a = [c for c in changes if c.b_us is None]
    only_b = [c for c in changes if c.a_us is None]
    kernel_delta = sum(c.delta_us for c in changes)
    w = max([len(r.name) for r in rows] + [len("kernel")]) + 2
    lines = [f"  A = {names[0]}, B = {names[1]}; the kernels that changed most (task time of one, kernel start "
             "included; like kernels of several layers on one row; bound: launch when the kernel start is half "
             "of it or more, else op_summary's Bound):",
             f"  {'kernel':{w}s}{'count':>6s}{'A us':>12s}{'B us':>12s}{'B - A us, all':>15s}  bound"]
    for r in rows:
        c = r.change
        lines.append(f"  {r.name:{w}s}{r.count:>6d}{_us(c.a_us):>12s}{_us(c.b_us):>12s}{r.delta_us:>+15,.2f}  {c.bound}")
    shown = sum(r.count for r in rows)
    if not rows:
        lines.append(f"  no kernel's task time changed by {SAME_US} us or more: the difference is outside the kernels "
                     "(the host's launches and waits)")
    elif len(changes) > shown:
        rest = kernel_delta - sum(r.delta_us for r in rows)
        lines.append(f"  ... and {len(changes) - shown} more kernels ({rest:+,.2f} us between them)")
    lines.append(f"  only in A: {len(only_a)} kernels ({sum(c.a_us for c in only_a):,.2f} us); only in B: "
                 f"{len(only_b)} ({sum(c.b_us for c in only_b):,.2f} us); kernel time {kernel_delta:+,.2f} us in all, "
                 f"latency {b.latency_us - a.latency_us:+,.2f} us")
    found = hidden_lines(hidden(a, b, changes))
    lines += found[:HIDDEN_LINES]
    if len(found) > HIDDEN_LINES:
        lines.append(f"  ... and {len(found) - HIDDEN_LINES} more hidden by overlap (--json lists them)")
    return "\n".join(lines)


def ab_json(a: GraphRun, b: GraphRun) -> dict:
    """Every kernel change (A's order, then B's additions) and the ones hidden by overlap."""
    changes = kernel_changes(a, b)

    def entry(c: KernelChange) -> dict:
        return {"name": c.name, "index": c.index, "type": c.op_type, "a_us": c.a_us, "b_us": c.b_us,
                "delta_us": c.delta_us, "a_bound": c.a_bound, "b_bound": c.b_bound}

    return {"latency_delta_us": b.latency_us - a.latency_us, "kernels": [entry(c) for c in changes],
            "hidden_by_overlap": [entry(h.change) | {"side": h.side, "stream": h.stream, "beside": h.beside,
                                                     "beside_stream": h.beside_stream}
                                  for h in hidden(a, b, changes)]}


__all__ = ["HIDDEN_LINES", "SAME_US", "TOP", "ChangeRow", "Hidden", "KernelChange", "ab_json", "critical_path", "hidden",
           "hidden_lines", "kernel_changes", "kernel_table", "largest", "rows_of", "task_bound"]
