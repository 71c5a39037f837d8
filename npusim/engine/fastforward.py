"""Fast-forward: price a kernel whose blocks repeat one loop many times from a few of
its iterations, measured on the engine (issue 37, "price big steps fast, exactly enough").

This module holds the measurement: its parameters (FF_*), which runs to make (plan), the
kernel at each wave's end from a marked run's marks (_snapshots), the steady-state test
and the extrapolation (measure, shared with engine.fastforward_blocks, the path for a
kernel whose blocks run in many waves of cores), and the entry for a kernel whose blocks
all run at once (worth_trying, price). What it reads from a kernel's programs and the
kernels it cuts short are engine.fastforward_rewrite's; the L2 images it copies,
engine.l2_image's.

A GEMM of 131,072 rows is, on each of the 24 cube cores, ~42 iterations of one loop
(a row of output tiles); a vector kernel over many rows is hundreds of iterations of
one. Each iteration of every block together is a *wave*. Simulating them all costs
time proportional to the waves; after the first few they repeat.

How a kernel is priced (a kernel-level fast-forward; the device calls price() for a
kernel that starts alone on an idle device, as it replays one, see device.py):
- Its *repeat loop* (fastforward_rewrite.repeat_loops): in every block program the loop
  that executes the most instructions, the same loop of the lowering in every block.
  c = the smallest count over the blocks (waves).
- Only a kernel whose blocks all run at once (block_dim no more than the cores of its
  type) is priced so: its waves are then simultaneous. A kernel whose blocks run in many
  waves of cores is priced over those waves of blocks (fastforward_blocks), by the same
  measurement (measure).
- The kernel is simulated once or twice, each time on its own device, with every
  block's repeat loop cut by the same number of iterations (a *truncated run*, of
  fastforward_rewrite.truncated's kernel: the whole head and tail kept), its pipes
  *marking* where they stand as each iteration of the loop ends
  (pipe.mark: the pipe's clock and own counters, the kernel's GM counters then). Wave i
  ends when the last pipe ends its iteration i; the kernel at that point (_snapshots)
  is that clock, the GM counters then, and every pipe's own counters at its own end of
  iteration i (busy, wait, data-wait cycles, flops, local bytes); instructions are
  counted exactly from the programs.
- Where to measure: a steady state can only hold once the kernel's own lines fill the
  L2 and evict each other. The increments are measured from the end of wave f by which
  an L2's worth of new lines has come in (or, when that gives no steady state, two L2s'
  worth: FF_FILLS), at the ends of waves f, f + s, ..., f + FF_INCREMENTS * s (the
  stride s: FF_STRIDE_DIVISOR), by a run keeping FF_PAST waves more than the last of
  them (or more). The first run (the probe) gives the new lines a wave brings in (missed
  reads and writes, wave FF_KEEP + 1); it keeps what the run from the soonest f the GM
  bytes of a wave allow (earliest) needs, when that costs little (FF_PROBE_SHARE): a
  kernel whose every byte is new (a vector kernel streaming rows, a GEMM of many rows)
  is measured from the probe alone.
- Steady state: the FF_INCREMENTS increments of cycles agree within FF_TOLERANCE
  (relative to their mean), those of HBM read bytes and L2 hit bytes within
  FF_TRAFFIC_TOLERANCE (see there why looser), beyond what the waves' own jitter
  explains (FF_NOISE_SIGMAS). Then the kernel is that run plus the mean wave measured
  times the waves it left out, if the jitter left in that mean is small enough (else,
  as without a steady state, it is simulated in full).
- Not worth it: fewer than FF_MIN_SKIP waves to skip, or the runs costing more
  than 1 / FF_MIN_GAIN of the kernel (plan()): simulated in full. A bound from the GM
  bytes a wave moves (wave_gm_bytes) rules most such kernels out before any run. Every
  small kernel (the tests' tiny decoders, the regression corpus) is simulated in full.

Assumptions (stated again in docs/benchmarks.md):
# assumption: the waves a truncated run leaves out each add the mean wave measured (the
#   steady state seen over FF_INCREMENTS increments holds to the end);
# assumption: the L2 at the kernel's start is the device's (every cached line, each
#   set's LRU order, dirty bits: copied into each truncated run's L2), fills in flight
#   taken as arrived (the kernel starts on an idle device) and background write-backs
#   then still draining ignored;
# assumption: as for a replayed kernel (device.py), the fast-forwarded kernel makes no
#   link traffic on the device's links while it holds its cores; at its end the L2 is
#   put as its measuring run left it (see price).
A fast-forwarded kernel's record says how many waves were not simulated
(KernelRecord.skipped); it has no instruction or block spans in a trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import numpy as np

from npusim.engine.compile import MEMS, count_instructions
from npusim.engine.fastforward_rewrite import (ByKernel, cores_of, programs, repeat_loops, static_instructions,
                                               truncated, wave_gm_bytes)
from npusim.engine.l2_image import warm
from npusim.engine.pipe import MARKED_GM
from npusim.engine.stats import KernelStats
from npusim.isa.program import Kernel

# The earliest wave whose end a marked run measures from: the first wave pays the pipeline
# fill (first loads with nothing to overlap), and the second ends early or late of the
# steady period by what the fill shifted (an add over 131,072 rows: its second wave takes
# 84% of the period, the third on agree to 0.2%); so the increments are measured from the
# end of the second wave on (or later: see price).
FF_KEEP = 2
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
# as one steady state (a trend within it goes into the mean wave extrapolated: the error
# of the whole kernel is at most about this spread times the fraction of it left out;
# the benchmark's targets: 0.2% median, 1% max). A GEMM's waves agree to 0.1%.
FF_TOLERANCE = 0.005
# A kernel's waves jitter (an add_rms_norm's over 65,536 rows by about 1.2% each, an add's
# by 3.5%, as DMA start-ups and write-backs land on other cycles), so an increment of s
# waves spreads by about that over sqrt(s) even in a steady state: the increments of
# cycles may also spread by this many times that (_jitter), on top of FF_TOLERANCE. A
# trend (write-backs setting in: +10% from one increment to the next) is far outside it.
# The waves left out are priced at the mean of those measured; this many times the
# jitter left in that mean, over the waves left out, must be within FF_TOLERANCE of the
# kernel, or it is simulated in full (the add: 0.65% of the kernel at one sigma).
FF_NOISE_SIGMAS = 3
# Waves a marked run keeps past the last one it measures: a wave's end is where its last
# pipe ends the wave, when the pipes that run ahead (MTE2 loading the next wave's tiles)
# are already into the next, except at the run's last wave, where they have none.
FF_PAST = 1
# Where the increments are measured from: the wave by which the kernel has brought this
# many L2s' worth of new lines in, the first that gives a steady state. Once the L2 is
# full a kernel's writes evict its own earlier lines, but the dirty ones among them reach
# the LRU end only about an L2's worth later, and their write-backs then take HBM time
# from the reads: an add_rms_norm over 65,536 rows of 4096 (a new line per 0.42% of the L2
# a wave) fills the L2 at wave 43, writes back from wave 58 and is steady from about 80.
FF_FILLS = (1, 2)
# What a marked run calls its repeat loop's variable (truncated renames it: no other loop
# of a program may mark its ends as waves' ends); no lowering names a loop so.
FF_MARKED = "fast-forward wave"
# Fewer waves to skip than this: simulate the kernel in full (measured: at 12 skipped
# waves a GEMM priced 2.5x slower than simulated). It also keeps every small test case
# (the regression corpus, the tiny decoders) bit-identical to the exact engine.
FF_MIN_SKIP = 16
# What a truncated run costs beyond the waves it keeps, in waves: the nests before and
# after the repeat loop (a GEMM block's partial first and last rows of tiles) are about
# one wave each. A block whose instructions outside its repeat loop come to more waves
# (outside_waves) is counted with those: a causal FlashAttention of 32,768 tokens on 8
# heads repeats its longest q tile's 62 key steps, and its other q tiles' steps are
# 2,702 such waves more, so a run keeping 12 waves cost 72% of the kernel for nothing
# (the kernel then simulated in full: 47 s against 21 s without fast-forward).
FF_HEAD_TAIL_WAVES = 2
# The truncated runs must cost at most 1 / FF_MIN_GAIN of the full simulation (in waves,
# as plan() counts them), or the kernel is simulated in full: a GEMM of ~21 waves of rows
# (16 x 4096 tokens) priced from truncated runs of about 2/3 of its waves took longer than
# simulating it. The waves are counted in the longest block:
# a run keeping n waves of the shortest keeps as many more in a longer one (an embedding
# of 131,072 tokens: 124 iterations in 47 blocks, 70 in the last; its probe of "4 waves"
# simulated 58 iterations of 124, half the kernel, for nothing).
FF_MIN_GAIN = 1.5
# The probe is the measuring run from the soonest wave the GM bytes of a wave allow when
# that run costs at most this share of the kernel (a GEMM of 131,072 rows: 8 waves of 42,
# measured from it alone); else it keeps FF_KEEP + 1 + FF_PAST waves, its cost counted
# with the measuring run's (an embedding whose tokens hit in the L2: the soonest run would
# keep 61% of it, and its lines fill the L2 only after all its waves).
FF_PROBE_SHARE = 1 / 3
# The version of the rules above (how the waves are counted, what a run costs): bumped when
# they change which kernels are fast-forwarded, or how, for the same parameters.
FF_RULES = 3

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
PARAMETERS = (FF_KEEP, FF_PAST, FF_FILLS, FF_NOISE_SIGMAS, FF_INCREMENTS, FF_STRIDE_DIVISOR, FF_TOLERANCE,
              FF_TRAFFIC_TOLERANCE, FF_MIN_SKIP, FF_HEAD_TAIL_WAVES, FF_MIN_GAIN, FF_PROBE_SHARE, FF_RULES)
_MEASURED = (("cycles", FF_TOLERANCE), ("hbm_read_bytes", FF_TRAFFIC_TOLERANCE),
             ("l2_hit_bytes", FF_TRAFFIC_TOLERANCE))  # what must be steady (see the module doc)
_NUMBERS = ("instructions", "flops", "gm_read_bytes", "gm_write_bytes", "hbm_read_bytes", "hbm_write_bytes",
            "l2_hit_bytes", "l2_miss_bytes", "wasted_burst_bytes", "misaligned_segments", "dma_segments")
_DICTS = ("busy_cycles", "wait_cycles", "data_wait_cycles", "core_cycles", "local_bytes")
_INTEGERS = ("instructions", "misaligned_segments", "dma_segments")


def waves(kernel: Kernel) -> int:
    """The waves of a kernel: its repeat loop's count in its shortest block (0: it has none,
    or one of fewer iterations than FF_MIN_SKIP in some block: nothing to skip)."""
    return _WAVES.get(kernel, _waves)


_WAVES = ByKernel()  # waves() of the kernels last asked about


def _waves(kernel: Kernel) -> int:
    loops = repeat_loops(kernel, FF_MIN_SKIP)
    if loops is None:
        return 0
    return min(loop.count for found in loops.values() for _, loop in found)


def plan(c: int, first: int = FF_KEEP, spent: int = 0, min_skip: int = FF_MIN_SKIP,
         extra: int = 0) -> tuple[list[int], int, int]:
    """For a kernel of c waves whose increments are measured from wave `first` on: the
    waves at whose ends the increments are measured (the marked run keeps FF_PAST more
    than the last of them), the stride between them and the waves left out (0: not
    fast-forwarded: fewer than `min_skip`, or the marked run, with `spent` waves
    already simulated, would cost more than the kernel / FF_MIN_GAIN). `extra`: the
    waves its longest block runs beyond c (every run keeps them too: see run_cost)."""
    stride = max(1, c // FF_STRIDE_DIVISOR)
    kept = [first + j * stride for j in range(FF_INCREMENTS + 1)]
    skip = c - kept[-1] - FF_PAST
    cost = spent + run_cost(kept[-1] + FF_PAST, extra)
    return kept, stride, skip if skip >= min_skip and cost * FF_MIN_GAIN <= c + extra else 0


def run_cost(n: int, extra: int = 0) -> int:
    """What a run keeping n waves costs, in waves of the longest block (`extra` waves longer
    than the shortest, whose count n is): its head and tail too (FF_HEAD_TAIL_WAVES)."""
    return n + extra + FF_HEAD_TAIL_WAVES


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


def _steady(increments: list[KernelStats], noise: float = 0.0, sigmas: float = FF_NOISE_SIGMAS) -> bool:
    """Do the increments agree (see _MEASURED)? `noise`: the relative spread the waves'
    own jitter gives an increment of cycles, of which `sigmas` times (see FF_NOISE_SIGMAS)
    are allowed on top of FF_TOLERANCE."""
    for name, tolerance in _MEASURED:
        if name == "cycles":
            tolerance += sigmas * noise
        values = [getattr(s, name) for s in increments]
        mean = sum(values) / len(values)
        if name == "cycles" and mean <= 0:
            return False
        if any(abs(v - mean) > tolerance * abs(mean) for v in values):
            return False
    return True


def _jitter(durations: list[float], stride: int) -> float:
    """The relative standard deviation of a sum of `stride` waves, from the waves' own
    durations taken as independent: their variance estimated from consecutive differences
    (half their mean square), which a slow trend in the durations barely moves."""
    if len(durations) < 2:
        return 0.0
    mean = sum(durations) / len(durations)
    var = sum((b - a) ** 2 for a, b in zip(durations, durations[1:])) / (2 * (len(durations) - 1))
    return math.sqrt(var / stride) / mean if mean > 0 else 0.0


def _too_jittery(durations: list[float], measured: int, skip: int, wave: float, whole: float) -> bool:
    """Would the mean of `measured` waves jittering as `durations` do, standing for `skip`
    waves of `wave` cycles, leave more than FF_TOLERANCE of a kernel of `whole` cycles in
    doubt (FF_NOISE_SIGMAS of that mean's jitter)?"""
    return FF_NOISE_SIGMAS * _jitter(durations, measured) * skip * wave > FF_TOLERANCE * whole


def _snapshots(marks: list, n: int) -> list[KernelStats]:
    """The kernel as it stands at the end of each of its first n waves, from the marks of a
    marked run (pipe.mark; Device.pipe_marks: (core run, pipe, its marks) per pipe that walks
    the repeat loop): wave i ends when the last pipe ends its iteration i (cycles: that clock),
    the GM counters as they stood then, each pipe's own counters as it ended iteration i
    (times its run's weight), core cycles as every core run held its core throughout.
    Instructions are left 0: price counts them exactly (static_instructions)."""
    pipes = [(cr, pipe, m) for cr, pipe, m in marks if len(m) >= n]
    runs = {id(cr): cr for cr, _, _ in pipes}
    held: dict[str, float] = {}
    for cr in runs.values():
        held[cr.kind.value] = held.get(cr.kind.value, 0) + cr.weight
    out = []
    for i in range(n):
        last = max(pipes, key=lambda p: p[2][i][0])[2][i]
        kw = {"cycles": float(last[0]), **dict(zip(MARKED_GM, last[6]))}
        kw["flops"] = sum(m[i][4] * cr.weight for cr, _, m in pipes)
        for name, at in (("busy_cycles", 1), ("wait_cycles", 2), ("data_wait_cycles", 3)):
            kw[name] = {f"{cr.kind.value}.{pipe}": m[i][at] * cr.weight for cr, pipe, m in pipes}
        local: dict[str, float] = {}
        for cr, _, m in pipes:
            for mem, nbytes in zip(MEMS, m[i][5]):
                if nbytes:
                    local[mem] = local.get(mem, 0) + nbytes * cr.weight
        kw["local_bytes"] = local
        kw["core_cycles"] = {kind: float(last[0]) * w for kind, w in held.items()}
        out.append(KernelStats(**kw))
    return out


def _check_marks(kernel: Kernel, drop: int, marks: list) -> None:
    """Every pipe of the kernel truncated by `drop` marked each iteration of its block's
    repeat loop, or none (a pipe with nothing to do in it): a ValueError if one marked
    another count."""
    loops = repeat_loops(kernel)
    for cr, pipe, m in marks:
        found = loops[cr.kind]
        count = found[0 if len(found) == 1 else cr.block.index][1].count - drop
        if len(m) not in (0, count):
            raise ValueError(f"fast-forward: {cr.kind.value}.{pipe} of block {cr.block.index} marked {len(m)} "
                             f"iterations of its repeat loop, which runs {count}")


# What a marked run gives: (its stats, its marks, the L2 it leaves: an l2_image) of a kernel run
# alone with a mark asked for (see price's `simulate`), its L2 first warmed by on_device
Simulate = Callable[[Kernel, Callable, str], tuple[KernelStats, list, tuple]]


def price(kernel: Kernel, hw, image: Callable[[], tuple[np.ndarray, np.ndarray]] | None,
          simulate: Simulate) -> tuple[KernelStats, int, tuple] | None:
    """(stats of the whole kernel, waves not simulated, the L2 it leaves: an l2_image), or
    None when the kernel is to be simulated in full (too few waves, blocks in more than one
    wave of cores, no steady state, or a truncated run that fails). `hw`: the device's
    config; `image()`: the device's L2 (l2_image) each truncated run starts from;
    `simulate(kernel, on_device, mark_var)`: (the stats, the marks: see _snapshots, the L2
    at its end: an l2_image) of one kernel run alone, its pipes marking the iterations of
    loops over mark_var (on_device warms its L2).
    # assumption: the kernel leaves the L2 as its marked run does (the same head and tail,
    #   its last waves at the addresses of earlier ones: what each wave re-reads, the
    #   weights of a GEMM, is held alike, and what it streams is held in the same share)."""
    if kernel.block_dim > cores_of(kernel, hw):
        return None
    c = waves(kernel)
    # the earliest wave the increments can be measured from: a wave brings in at most the GM
    # bytes it moves (see measure, which makes no run at all when not worth it even then)
    first = earliest(hw, wave_gm_bytes(kernel))
    extra = max(loop.count for found in repeat_loops(kernel).values() for _, loop in found) - c + outside_waves(kernel)

    def snapshots(marks: list, n: int) -> list[KernelStats]:
        _check_marks(kernel, c - n, marks)
        return _snapshots(marks, n)

    return measure(kernel, hw, image, simulate, c, lambda n: truncated(kernel, c - n, FF_MARKED), FF_MARKED,
                   snapshots, earliest_wave=first, extra=extra)


def outside_waves(kernel: Kernel) -> int:
    """The waves a block's instructions outside its repeat loop come to beyond
    FF_HEAD_TAIL_WAVES (every run keeps them: see run_cost), in iterations of that loop,
    the most over the kernel's programs; 0 for most kernels (a GEMM's, a vector kernel's)."""
    most = 0.0
    for kind, found in repeat_loops(kernel).items():
        for program, (_, loop) in zip(programs(kernel, kind), found):
            per = count_instructions(loop.body)
            most = max(most, (count_instructions(program.body) - loop.count * per) / per)
    return max(0, math.ceil(most) - FF_HEAD_TAIL_WAVES)


def worth_trying(kernel: Kernel, hw) -> bool:
    """A cheap first look (run's dispatch asks it of every kernel that starts alone): might
    price() fast-forward this kernel (enough waves to skip, if it can be measured at once)?"""
    return bool(plan(waves(kernel))[2])


def earliest(hw, moved: int) -> int:
    """The earliest wave increments can be measured from when a wave moves `moved` GM bytes
    (at most the new lines it brings in): by then an L2's worth has come in (see measure)."""
    return max(FF_KEEP, math.ceil(hw.l2.l2_bytes / moved)) if moved else FF_KEEP


def measure(kernel: Kernel, hw, image: Callable[[], tuple[np.ndarray, np.ndarray]] | None, simulate: Simulate,
            c: int, truncate: Callable[[int], Kernel], mark: str, snapshots: Callable[[list, int], list[KernelStats]],
            min_skip: int = FF_MIN_SKIP,
            sigmas: float = FF_NOISE_SIGMAS, earliest_wave: int = FF_KEEP,
            extra: int = 0, probe_share: float = FF_PROBE_SHARE) -> tuple[KernelStats, int, tuple] | None:
    """price's result for a kernel of c waves (None: simulate it in full), from marked runs of
    truncate(n), the kernel keeping n of its waves, marking `mark`; snapshots(marks, n): the
    kernel at the end of each of its first n waves from such a run's marks (a ValueError:
    the marks are not the waves', and the kernel is simulated in full). `min_skip`: the
    fewest waves worth leaving out (plan); `sigmas`: the waves' jitter allowed in a steady
    state (_steady); `earliest_wave`: the soonest wave the increments can be measured from
    (earliest), which the probe run keeps enough waves for if that costs at most
    `probe_share` of the kernel (FF_PROBE_SHARE); `extra`: see plan."""
    soonest, _, soonest_skip = plan(c, earliest_wave, 0, min_skip, extra)  # the soonest measuring run
    probe = soonest[-1] + FF_PAST
    if run_cost(probe, extra) > probe_share * (c + extra):
        probe = FF_KEEP + 1 + FF_PAST
        if not plan(c, earliest_wave, run_cost(probe, extra), min_skip, extra)[2]:
            return None
    elif not soonest_skip:
        return None
    held = image() if image is not None else None

    def on_device(device) -> None:
        if held is not None:
            warm(device.memory.l2, held)

    runs: dict[int, tuple] = {}  # waves kept -> that run's (truncated kernel, stats, snapshots, L2 left)

    def keeping(n: int) -> tuple[Kernel, KernelStats, list[KernelStats], tuple] | None:
        """A run keeping n waves: the truncated kernel it ran, its stats, the kernel at the end of
        each wave, the L2 it leaves; None: simulate the kernel in full (see the excepts)."""
        if n not in runs:
            # a truncation the engine refuses (a repeat loop holding a loop over its own variable:
            # fastforward_rewrite.truncated; a flag a cut loop leaves unbalanced deadlocks the
            # run): price the kernel in full
            try:
                short = truncate(n)
                stats, marks, left = simulate(short, on_device, mark)
            except Exception:  # noqa: BLE001 - (see above)
                return None
            try:
                at = snapshots(marks, n)
            except ValueError:  # marks that do not mark the waves (see price's snapshots): in full too
                return None
            runs[n] = short, stats, at, left
        return runs[n]

    # A steady state can only hold once the kernel's own lines fill the L2 and evict each
    # other (before that a wave's lines land in free or clean slots; after, a dirty line
    # it evicts is written back): the increments are measured from the wave at which the
    # kernel has brought FF_FILLS[0] L2s' worth of new lines (missed reads and writes)
    # in, else from FF_FILLS[1]'s.
    # assumption: a wave brings in what the third wave does (the first pays the warm-up).
    probed = keeping(probe)
    if probed is None:
        return None
    _, _, at, _ = probed
    wave = _diff(at[FF_KEEP], at[FF_KEEP - 1])
    new_lines = wave.l2_miss_bytes + wave.gm_write_bytes
    durations: list[float] = []  # the waves the last measuring run measured
    for fills in FF_FILLS:
        first = max(FF_KEEP, math.ceil(fills * hw.l2.l2_bytes / new_lines)) if new_lines > 0 else FF_KEEP
        kept, stride, _ = plan(c, first, 0, min_skip)
        # a run made already that keeps enough waves measures them (the waves it leaves out
        # are priced alike); else one keeping just enough, if worth it with those made
        longer = [m for m in runs if m >= kept[-1] + FF_PAST]
        if longer:
            n = min(longer)
            if c - n < min_skip:
                return None
        else:
            n = kept[-1] + FF_PAST
            if not plan(c, first, sum(run_cost(m, extra) for m in runs), min_skip, extra)[2]:
                return None
            # no steady state yet: another run only if, jittering as the last one's waves did,
            # its mean wave could price the waves it leaves out closely enough (see below)
            # assumption: the waves after the later fill jitter as those after the earlier did
            if durations:
                mean = sum(durations) / len(durations)
                if _too_jittery(durations, kept[-1] - kept[0], c - n, mean, (c + extra) * mean):
                    return None
        made = keeping(n)
        if made is None:
            return None
        short, stats, at, left = made
        skip = c - n
        # the increments between the waves kept: the kernel at the end of wave n is at[n - 1]
        increments = [_diff(at[b - 1], at[a - 1]) for a, b in zip(kept, kept[1:])]
        durations = [at[i].cycles - at[i - 1].cycles for i in range(kept[0], kept[-1])]
        if _steady(increments, _jitter(durations, stride), sigmas):
            break
    else:
        return None
    # a wave: the mean of the waves measured (steady: no trend beyond FF_TOLERANCE); the
    # jitter left in that mean, times the waves left out, must be small beside the kernel
    per_wave = _add(KernelStats(), _diff(at[kept[-1] - 1], at[kept[0] - 1]), 1.0 / (kept[-1] - kept[0]))
    whole = _add(stats, per_wave, float(skip))
    if _too_jittery(durations, len(durations), skip, per_wave.cycles, whole.cycles):
        return None
    aivs = hw.chip.aiv_per_aic
    instructions = stats.instructions + static_instructions(kernel, aivs) - static_instructions(short, aivs)
    return attrs.evolve(whole, instructions=instructions), skip, left


__all__ = ["FF_FILLS", "FF_HEAD_TAIL_WAVES", "FF_INCREMENTS", "FF_KEEP", "FF_MARKED", "FF_MIN_GAIN", "FF_MIN_SKIP",
           "FF_NOISE_SIGMAS", "FF_PAST", "FF_PROBE_SHARE", "FF_RULES", "FF_STRIDE_DIVISOR", "FF_TOLERANCE",
           "FF_TRAFFIC_TOLERANCE", "PARAMETERS", "Simulate", "earliest", "measure", "outside_waves", "plan", "price",
           "run_cost", "waves", "worth_trying"]
