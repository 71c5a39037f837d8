"""Fast-forward: price a kernel whose blocks repeat one loop many times from a few of
its iterations, measured on the engine (issue 37, "price big steps fast, exactly enough").

A GEMM of 131,072 rows is, on each of the 24 cube cores, ~42 iterations of one loop
(a row of output tiles); a vector kernel over many rows is hundreds of iterations of
one. Each iteration of every block together is a *wave*. Simulating them all costs
time proportional to the waves; after the first few they repeat.

How a kernel is priced (a kernel-level fast-forward; the device calls price() for a
kernel that starts alone on an idle device, as it replays one, see device.py):
- Its *repeat loop*: in every block program, the loop that executes the most
  instructions (count x its body's) among the top-level loops and the loops they wrap
  alone (a Loop whose body is one Loop), the first on ties: a GEMM's loop over rows of
  tiles, not a partial row's loop over tiles. Every program must have one, all with
  the same loop variable (the same loop of the lowering in every block); a MIX
  kernel's AIC and AIV programs of a block must have the same (variable, count)
  (their cross-core flags pair up per iteration). c = the smallest count over the
  blocks.
- The kernel is simulated several times, each on its own device, with every block's
  repeat loop cut by the same number of iterations (a *truncated run*: it has the
  whole head and tail of the kernel: the nests before and after the loop, the uneven
  last wave, the drain). The difference between two runs is what the waves between
  them add: cycles and every counter (bytes, HBM and L2 traffic, instructions, pipe
  busy and wait time, flops).
- Where to measure: a steady state can only hold once the kernel's own lines fill the
  L2 and evict each other. Two probe runs keeping FF_KEEP and FF_KEEP + 1 waves give
  the new lines a wave brings in (missed reads and writes); the increments are
  measured from the wave f by which an L2's worth has come in: runs keeping f, f + s,
  ..., f + FF_INCREMENTS * s waves (the stride s: FF_STRIDE_DIVISOR).
- Steady state: the FF_INCREMENTS increments of cycles agree within FF_TOLERANCE
  (relative to their mean), those of HBM read bytes and L2 hit bytes within
  FF_TRAFFIC_TOLERANCE (see there why looser). Then the kernel is the longest
  truncated run plus the last increment per wave times the waves left out (c - f -
  FF_INCREMENTS * s); else (no steady state) it is simulated in full.
- Not worth it: fewer than FF_MIN_SKIP waves to skip, or truncated runs costing more
  than 1 / FF_MIN_GAIN of the kernel (plan()): simulated in full. A bound from the GM
  bytes a wave moves (wave_gm_bytes) rules most such kernels out before any run. Every
  small kernel (the tests' tiny decoders, the regression corpus) is simulated in full.

Assumptions (stated again in docs/benchmarks.md):
# assumption: the waves a truncated run leaves out each add the last measured
#   increment (the steady state seen over FF_INCREMENTS increments holds to the end);
# assumption: the L2 at the kernel's start is the device's (every cached line, each
#   set's LRU order, dirty bits: copied into each truncated run's L2), fills in flight
#   taken as arrived (the kernel starts on an idle device) and background write-backs
#   then still draining ignored;
# assumption: as for a replayed kernel (device.py), the fast-forwarded kernel makes no
#   link traffic on the device's links while it holds its cores, and its L2 footprint
#   (its Reuse reads and writes, else every GM tensor it names as read) lands at its end.
A fast-forwarded kernel's record says how many waves were not simulated
(KernelRecord.skipped); it has no instruction or block spans in a trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import numpy as np

from npusim.engine.compile import count_instructions
from npusim.engine.stats import KernelStats
from npusim.isa.program import CoreType, Copy, Kernel, Loop, Mem

# Iterations of the repeat loop the shortest truncated run keeps (in its smallest block):
# the first wave pays the pipeline fill (first loads with nothing to overlap), so the
# increments are measured from the second on (or later: see price).
FF_KEEP = 1
# Consecutive increments that must agree before the rest is extrapolated (the issue's
# "3 consecutive waves with the same duration, bytes and L2 behaviour").
FF_INCREMENTS = 3
# An increment spans c // FF_STRIDE_DIVISOR waves (at least one) of a kernel of c: a
# kernel of many short waves (a vector kernel over 65,536 rows: 663 waves of ~3,600
# cycles, consecutive ones apart by up to 1.5% as DMA start-ups land on other cycles)
# is measured over strides of 20 waves, which average that jitter out, and priced from
# about 6/32 of its waves; a GEMM's ~40 waves of rows are measured one by one.
FF_STRIDE_DIVISOR = 32
# How far (relative to their mean) the increments of cycles may spread and still count
# as one steady state. The last increment is what is extrapolated; its error is about
# this spread, and the error of the whole kernel that times the fraction of it left out
# (the benchmark's targets: 0.2% median, 1% max). A GEMM's waves agree to 0.1%.
FF_TOLERANCE = 0.005
# Fewer waves to skip than this: simulate the kernel in full (measured: at 12 skipped
# waves a GEMM priced 2.5x slower than simulated). It also keeps every small test case
# (the regression corpus, the tiny decoders) bit-identical to the exact engine.
FF_MIN_SKIP = 16
# What a truncated run costs beyond the waves it keeps, in waves: the nests before and
# after the repeat loop (a GEMM block's partial first and last rows of tiles) are about
# one wave each.
FF_HEAD_TAIL_WAVES = 2
# The truncated runs must cost at most 1 / FF_MIN_GAIN of the full simulation (in waves,
# as plan() counts them), or the kernel is simulated in full: a GEMM of ~21 waves of rows
# (16 x 4096 tokens) priced from 4 truncated runs took longer than simulating it.
FF_MIN_GAIN = 1.5

# How far the increments of HBM read bytes and L2 hit bytes may spread: a wave's share of
# HBM moves from wave to wave with which lines the L2 already holds (a row of A that
# neighbouring blocks share, set conflicts with the resident weights) while its time does
# not (a big GEMM is bound by the cube, not by HBM): measured on a 131,072-row GEMM, the
# HBM increments of consecutive waves spread +-25% around their mean and the cycles
# +-0.1%. So the time must be steady to FF_TOLERANCE, the traffic only to this; the
# benchmark prints the traffic error beside the latency error.
FF_TRAFFIC_TOLERANCE = 0.5
# Every parameter above: what a fast-forwarded result depends on besides its inputs (the
# disk cache keys such results on them: npusim.step_flags.fast_forward_key)
PARAMETERS = (FF_KEEP, FF_INCREMENTS, FF_STRIDE_DIVISOR, FF_TOLERANCE, FF_TRAFFIC_TOLERANCE, FF_MIN_SKIP,
              FF_HEAD_TAIL_WAVES, FF_MIN_GAIN)
_MEASURED = (("cycles", FF_TOLERANCE), ("hbm_read_bytes", FF_TRAFFIC_TOLERANCE),
             ("l2_hit_bytes", FF_TRAFFIC_TOLERANCE))  # what must be steady (see the module doc)
_NUMBERS = ("instructions", "flops", "gm_read_bytes", "gm_write_bytes", "hbm_read_bytes", "hbm_write_bytes",
            "l2_hit_bytes", "l2_miss_bytes", "wasted_burst_bytes", "misaligned_segments", "dma_segments")
_DICTS = ("busy_cycles", "wait_cycles", "data_wait_cycles", "core_cycles", "local_bytes")
_INTEGERS = ("instructions", "misaligned_segments", "dma_segments")


def _repeat_path(body: tuple) -> tuple[tuple[int, ...], Loop] | None:
    """(index path, loop) of a program body's repeat loop (see the module doc), or None."""
    best, most = None, 0
    for i, entry in enumerate(body):
        path, loop = (i,), entry
        while loop.__class__ is Loop:
            work = loop.count * count_instructions(loop.body)
            if loop.count > 1 and work > most:  # (a loop of one iteration wraps what repeats)
                best, most = (path, loop), work
            if len(loop.body) != 1:
                break
            path, loop = path + (0,), loop.body[0]
    return best


def _with_count(body: tuple, path: tuple[int, ...], count: int) -> tuple:
    """`body` with the loop at `path` running `count` times."""
    i, rest = path[0], path[1:]
    loop = body[i]
    new = attrs.evolve(loop, count=count) if not rest else attrs.evolve(loop, body=_with_count(loop.body, rest, count))
    return body[:i] + (new,) + body[i + 1:]


def _kinds(kernel: Kernel) -> list[CoreType]:
    return [CoreType.AIC, CoreType.AIV] if kernel.core_type is CoreType.MIX else [kernel.core_type]


def repeat_loops(kernel: Kernel) -> dict | None:
    """Per core type, per distinct program (by position in the kernel's tuple): (path,
    loop) of its repeat loop; None if a program has none, they are not the same loop
    variable, or a MIX block's two disagree."""
    out = {}
    for kind in _kinds(kernel):
        progs = kernel.aic if kind is CoreType.AIC else kernel.aiv
        found = []
        for p in progs:
            f = _repeat_path(p.body)
            # too few iterations in one block, or another loop than the others': nothing to skip
            if f is None or f[1].count < FF_MIN_SKIP or (found and f[1].var != found[0][1].var):
                return None
            found.append(f)
        if not found:
            return None
        out[kind] = found
    if kernel.core_type is CoreType.MIX:
        for b in range(kernel.block_dim):
            a = out[CoreType.AIC][0 if len(kernel.aic) == 1 else b][1]
            v = out[CoreType.AIV][0 if len(kernel.aiv) == 1 else b][1]
            if (a.var, a.count) != (v.var, v.count):
                return None
    return out


def waves(kernel: Kernel) -> int:
    """The waves of a kernel: its repeat loop's count in its shortest block (0: it has none)."""
    hit = _WAVES.get(id(kernel))
    if hit is not None and hit[0] is kernel:
        return hit[1]
    n = _waves(kernel)
    _WAVES[id(kernel)] = (kernel, n)
    if len(_WAVES) > _WAVES_MAX:
        _WAVES.pop(next(iter(_WAVES)))
    return n


# waves() of the kernels last asked about, by identity (a step asks once per launch, and
# walking a FlashAttention kernel's 500 unrolled programs takes a fraction of a second);
# entries hold their kernel, so an id stays its own
_WAVES: dict[int, tuple[Kernel, int]] = {}
_WAVES_MAX = 256


def _waves(kernel: Kernel) -> int:
    loops = repeat_loops(kernel)
    if loops is None:
        return 0
    return min(loop.count for found in loops.values() for _, loop in found)


def _gm_bytes(body: tuple) -> int:
    """GM bytes the copies of a program body move, loops multiplied out."""
    n = 0
    for item in body:
        if item.__class__ is Loop:
            n += item.count * _gm_bytes(item.body)
        elif item.__class__ is Copy and Mem.GM in (item.src, item.dst):
            n += item.nbytes * item.segments
    return n


def wave_gm_bytes(kernel: Kernel) -> int:
    """GM bytes one wave moves (one iteration of every block's repeat loop): an upper bound
    of the new lines it brings into the L2. (A MIX block's AIV program is counted once,
    not once per AIV: a smaller bound, so a MIX kernel may be simulated in full where
    it need not be, never the other way.)"""
    loops = repeat_loops(kernel)
    total = 0
    for kind, found in loops.items():
        progs = kernel.aic if kind is CoreType.AIC else kernel.aiv
        per = [_gm_bytes(loop.body) for _, loop in found]
        total += sum(per[0 if len(progs) == 1 else b] for b in range(kernel.block_dim))
    return total


def plan(c: int, first: int = FF_KEEP, spent: int = 0) -> tuple[list[int], int, int]:
    """For a kernel of c waves whose increments are measured from wave `first` on: the
    waves each truncated run keeps, the stride between them and the waves left out (0:
    not fast-forwarded: fewer than FF_MIN_SKIP, or the truncated runs, with `spent` waves
    already simulated, would cost more than c / FF_MIN_GAIN waves)."""
    stride = max(1, c // FF_STRIDE_DIVISOR)
    kept = [first + j * stride for j in range(FF_INCREMENTS + 1)]
    skip = c - kept[-1]
    cost = spent + sum(k + FF_HEAD_TAIL_WAVES for k in kept)
    return kept, stride, skip if skip >= FF_MIN_SKIP and cost * FF_MIN_GAIN <= c else 0


def truncated(kernel: Kernel, drop: int) -> Kernel:
    """The kernel with every block's repeat loop `drop` iterations shorter."""
    loops = repeat_loops(kernel)
    kw = {}
    for kind, found in loops.items():
        progs = kernel.aic if kind is CoreType.AIC else kernel.aiv
        new = tuple(attrs.evolve(p, body=_with_count(p.body, path, loop.count - drop))
                    for p, (path, loop) in zip(progs, found))
        kw["aic" if kind is CoreType.AIC else "aiv"] = new
    return attrs.evolve(kernel, **kw)


def l2_image(l2) -> tuple[np.ndarray, np.ndarray]:
    """The lines an L2Cache holds, oldest use first within each set (the order they are
    put back in: see warm), and which of them are dirty."""
    held = np.flatnonzero(l2.tags >= 0)
    order = held[np.argsort(l2.last_use[held], kind="stable")]
    sets = l2.sets
    tag = l2.tags[order].astype(np.int64)
    s = order // l2.ways
    # set = (line + (line // sets * ROTATE) % sets) % sets, line = tag * sets + r: solve for r
    from npusim.engine.l2cache import _ROTATE

    r = (s - (tag * _ROTATE) % sets) % sets
    return tag * sets + r, l2.dirty[order].copy()


def warm(l2, image: tuple[np.ndarray, np.ndarray]) -> None:
    """Put an l2_image into an empty L2Cache of the same geometry: each line accessed once,
    in the image's order (so each set's LRU order is the image's), then its dirty bits."""
    lines, dirty = image
    if not len(lines):
        return
    l2.access(np.ascontiguousarray(lines), False)
    if dirty.any():
        slots = l2.find(lines[dirty])
        l2.dirty[slots[slots >= 0]] = True


def _add(a: KernelStats, b: KernelStats, scale: float) -> KernelStats:
    """a + scale * b, counter by counter (b an increment; integer counters stay integers)."""
    kw = {"cycles": a.cycles + scale * b.cycles}
    for name in _NUMBERS:
        v = getattr(a, name) + scale * getattr(b, name)
        kw[name] = int(round(v)) if name in _INTEGERS else v
    for name in _DICTS:
        da, db = getattr(a, name), getattr(b, name)
        kw[name] = {k: da.get(k, 0) + scale * db.get(k, 0) for k in sorted(set(da) | set(db))}
    return KernelStats(**kw)


def _diff(a: KernelStats, b: KernelStats) -> KernelStats:
    return _add(a, b, -1.0)


def _steady(increments: list[KernelStats]) -> bool:
    for name, tolerance in _MEASURED:
        values = [getattr(s, name) for s in increments]
        mean = sum(values) / len(values)
        if name == "cycles" and mean <= 0:
            return False
        if any(abs(v - mean) > tolerance * abs(mean) for v in values):
            return False
    return True


def price(kernel: Kernel, l2_bytes: int, image: Callable[[], tuple[np.ndarray, np.ndarray]] | None,
          simulate: Callable[[Kernel, Callable], KernelStats]) -> tuple[KernelStats, int] | None:
    """(stats of the whole kernel, waves not simulated), or None when the kernel is to be
    simulated in full (too few waves, no steady state, or a truncated run that fails).
    `l2_bytes`: the L2's capacity; `image()`: the device's L2 (l2_image) each truncated run
    starts from; `simulate(kernel, on_device)`: the stats of one kernel run alone
    (on_device warms its L2)."""
    c = waves(kernel)
    # the earliest wave the increments can be measured from: a wave brings in at most the GM
    # bytes it moves (see below); not worth it even then: no truncated run at all
    moved = wave_gm_bytes(kernel)
    if not plan(c, max(FF_KEEP, math.ceil(l2_bytes / moved)) if moved else FF_KEEP)[2]:
        return None
    held = image() if image is not None else None

    def on_device(device) -> None:
        if held is not None:
            warm(device.memory.l2, held)

    done: dict[int, KernelStats] = {}

    def keeping(n: int) -> KernelStats:
        if n not in done:
            done[n] = simulate(truncated(kernel, c - n), on_device)
        return done[n]

    try:
        # A steady state can only hold once the kernel's own lines fill the L2 and evict each
        # other (before that a wave's lines land in free or clean slots; after, a dirty line
        # it evicts is written back): the increments are measured from the wave at which the
        # kernel has brought an L2's worth of new lines (missed reads and writes) in.
        # assumption: a wave brings in what the second wave does (the first pays the warm-up).
        probe = _diff(keeping(FF_KEEP + 1), keeping(FF_KEEP))
        new_lines = probe.l2_miss_bytes + probe.gm_write_bytes
        first = max(FF_KEEP, math.ceil(l2_bytes / new_lines)) if new_lines > 0 else FF_KEEP
        kept, stride, skip = plan(c, first, sum(n + FF_HEAD_TAIL_WAVES for n in done if n < first))
        if not skip:
            return None
        runs = []
        for n in kept:
            runs.append(keeping(n))
            # two increments that already disagree: no steady state, spare the remaining runs
            if len(runs) >= 3 and not _steady([_diff(b, a) for a, b in zip(runs, runs[1:])]):
                return None
    except Exception:  # noqa: BLE001 - a truncation the engine refuses: price the kernel in full
        return None
    increments = [_diff(b, a) for a, b in zip(runs, runs[1:])]
    if not _steady(increments):
        return None
    # the last increment is the one furthest into the kernel: a one-off change the first
    # waves still show (a row two blocks share falling out of the L2 as the waves between
    # its two reads grow) is behind it
    per_wave = _add(KernelStats(), increments[-1], 1.0 / stride)
    return _add(runs[-1], per_wave, float(skip)), skip


__all__ = ["FF_HEAD_TAIL_WAVES", "FF_INCREMENTS", "FF_KEEP", "FF_MIN_GAIN", "FF_MIN_SKIP", "FF_STRIDE_DIVISOR",
           "FF_TOLERANCE", "FF_TRAFFIC_TOLERANCE", "PARAMETERS", "plan", "l2_image", "price", "repeat_loops",
           "truncated", "warm", "waves"]
