"""The device: AI cores running blocks, their pipes, flags and barriers.

Each pipe of a core is a process that runs its stream in order (pipe.py; its walk and
its process in C, in SimPy's event order: a SimPy process would do the same). A pipe keeps
its own clock `t` (never behind env.now) and only synchronises with simulated time
when it touches something shared: a GM transfer (bandwidth and L2 depend on what
else is in flight at that moment) or an empty flag it must wait for. Fixed-cost
instructions just advance `t`, so a run costs events at transfer and
synchronisation boundaries, not per instruction. This is exact, not an
approximation: flags are FIFO per (src pipe, dst pipe, id) with a single setting
pipe, so the k-th WaitFlag always takes the k-th SetFlag, whenever Python happens
to process them. Cross-core flags can be set by several pipes, so a cross set
first catches up with simulated time.

Blocks go onto free cores of the right type (lowest free id first), in waves when
block_dim exceeds the cores; kernels are served in the order they reached the
device, and a later kernel may use cores an earlier one leaves free.

Identical blocks that start together are simulated once (a *group*): consecutive
blocks of one kernel running the same Program object cost the same when every GM
transfer rounds to bursts alike in each of them and they touch separate L2 lines,
or share lines only in a way that costs each of them the same (see grouping.groupable:
e.g. every block reading the same resident input), so one representative runs
with weight w: its transfers count as w flows in the fair share, each member's
addresses go through the L2 (a line members share is missed, and read from HBM,
by the first member to touch it, and hit by the others, which wait for that read
as they would one by one), and its counters are multiplied by w.
A run of blocks is cut where the L2 holds their inputs differently when they are
dispatched (17 lines spread over every read, block by block), so that members
hit alike. They may still come apart: lines one member needs can be evicted before
it reads them (a kernel whose data outgrows the L2). A transfer whose members read
different numbers of lines from HBM ends the run there (grouping.Diverged); engine.run
then runs the whole program again with every block from that group's first on - of
that kernel and of every kernel launched after it - one at a time (`lone_from`), until
no grouped kernel diverges. Up to that group the rerun is the same run, so the groups
before it stay even and stay grouped; the kernels after it are not grouped at all,
because a step whose data outgrows the L2 tends to make one after another come apart,
and each would cost a rerun of everything before it. So grouping never changes a result. It can be
turned off (Device(dedup=False)); tests check both give the same results. A run that may
approximate (engine.run's exact=False, --fast-forward) keeps such a group together instead
(MemorySystem.exact_groups): the members' transfer ends when the slowest member's fill does,
with every member's lines and bytes counted; no rerun.

Replay: a kernel launched with a Reuse key whose twin (same key: the same kernel
at other addresses) has already run *alone* - no other kernel on the device from
its start to its end - is not simulated again when it too starts on an idle
device: it holds the cores of its type(s) for the twin's cycles, its counters
are the twin's, and its reads and writes are put through the L2 so later kernels
find the cache as it would be. Anything else runs in full.
# assumption: an idle-device kernel's time and traffic do not depend on its
# addresses (whole-line aligned alike, see Reuse.key) nor on what the L2 holds
# of its inputs; tests/test_runtime.py checks whole decoder steps with and
# without replay (and the layer memo) agree within 1%.
# assumption: a replay makes no link traffic, so a kernel another stream starts
# meanwhile (on the core types the replay does not hold) sees no contention
# from it; and its L2 footprint lands at its end, not over its run.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import simpy
from attrs import frozen

from npusim.engine._pipe import Flags
from npusim.engine.compile import compile_program, count_instructions
from npusim.engine.events import after
from npusim.engine.grouping import Grouping, gm_accesses, groupable
from npusim.engine.l2_image import warm
from npusim.engine.memory import MemorySystem
from npusim.engine.pipe import start_pipe
from npusim.engine.stats import KernelStats, StatsAccumulator, Tracer
from npusim.hw import HwConfig
from npusim.isa.program import CoreType, Kernel


@frozen
class Reuse:
    """A kernel's identity for replay: `key` (equal keys = the same kernel at other
    addresses) and the GM ranges (start, bytes) it reads and writes."""

    key: tuple
    reads: tuple[tuple[int, int], ...] = ()
    writes: tuple[tuple[int, int], ...] = ()


@frozen
class Owner:
    """What a kernel was launched for, carried from the Launch to its KernelRecord so
    reports never parse names: the graph node (by name), its decoder layer (None
    outside the layers) and the kernel's index among that node's kernels."""

    node: str
    layer: int | None = None
    index: int = 0


@frozen
class KernelRecord:
    """One kernel as it ran: when (cycles) and what it did; `owner` as launched
    (None for a kernel launched on its own, e.g. `npusim op`)."""

    id: int
    name: str
    op_type: str
    core_type: str
    block_dim: int
    stream: int
    queued: float  # reached the head of its stream; start - queued is the kernel start cost
    start: float
    end: float
    stats: KernelStats
    owner: Owner | None = None
    skipped: int = 0  # waves fast-forwarded (engine.fastforward): priced from a few, not simulated; 0: in full

    @property
    def cycles(self) -> float:
        return self.end - self.start


class _CoreRun:
    """One core executing its program for one block - or for a group of w identical
    blocks on w cores, as their representative."""

    __slots__ = ("name", "names", "kind", "vars", "streams", "flags", "cross", "bar_n", "bar_t", "bar_ev", "block",
                 "offsets")

    def __init__(self, names: list[str], kind: CoreType, vars: dict, streams: tuple, block, offsets: list[int]):
        self.name, self.names, self.kind, self.vars, self.streams = names[0], names, kind, vars, streams
        self.offsets = offsets  # block index of each member minus the representative's
        self.flags = Flags()  # SetFlag/WaitFlag, by the number compile.code_of gives each key
        self.cross = Flags()  # cross-core flags, by id and source (see pipe.start_pipe)
        self.bar_n, self.bar_t, self.bar_ev = 0, 0.0, None
        self.block = block

    @property
    def weight(self) -> int:
        return len(self.names)


class _BlockRun:
    __slots__ = ("index", "aic", "aivs")

    def __init__(self, index: int):
        self.index = index
        self.aic: _CoreRun | None = None
        self.aivs: list[_CoreRun] = []


class _KernelRun:
    def __init__(self, kid: int, kernel: Kernel, stream: int, env: simpy.Environment):
        self.id = kid
        self.kernel = kernel
        self.stream = stream
        self.acc = StatsAccumulator()
        self.next_block = 0
        self.blocks_done = 0
        self.done = env.event()
        self.start = env.now
        self.sync_n, self.sync_t, self.sync_ev = 0, 0.0, env.event()
        self.sync_parties = 0


class Device:
    def __init__(self, env: simpy.Environment, hw: HwConfig, tracer: Tracer, dedup: bool = True,
                 counters: bool = True, fast_forward: Callable | None = None):
        self.env = env
        self.hw = hw
        self.tracer = tracer
        self.memory = MemorySystem(env, hw, record=counters)  # counters: the links' bandwidth samples
        self.free = {CoreType.AIC: list(range(hw.chip.aic_count)), CoreType.AIV: list(range(hw.aiv_count))}
        # config values read per block or per pipe started, read once (a tracked config's
        # reads cost a Python call each: diskcache.reads)
        self.aiv_per_aic = hw.chip.aiv_per_aic
        self.flag_cycles = hw.sync.flag_latency_cycles
        self.cross_flag_cycles = hw.sync.cross_core_flag_latency_cycles
        self.pending: list[_KernelRun] = []  # kernels with blocks still to dispatch, in arrival order
        self.blocked: dict[tuple[str, str], str] = {}  # (core, pipe) -> what it waits for
        self.records: list[KernelRecord] = []
        self._compiled: dict = {}
        self._lowered: dict = {CoreType.AIC: {}, CoreType.AIV: {}}  # per core type: see compile_program
        self._groupable: dict = {}
        self._next_id = 0
        self.dedup = dedup
        # (kernel id, block): that block of that kernel, and every block after it (of it and of
        # every kernel launched later), runs one at a time; None: grouping throughout
        self.lone_from: tuple[int, int] | None = None
        self.active: list[_KernelRun] = []  # kernels started and not finished
        # Reuse key -> (cycles, stats, waves fast-forwarded) of a lone run
        self.replays: dict[tuple, tuple[float, KernelStats, int]] = {}
        # fast_forward(kernel, device) -> (stats, waves skipped) or None: prices a kernel that starts
        # alone from a few of its waves (engine.fastforward); None: every kernel is simulated in full
        self.fast_forward = fast_forward
        self.on_finish: Callable[[int], None] | None = None  # called with the kernels finished so far
        # engine.fastforward's marks: every pipe marks where it stands as each iteration of a loop
        # over mark_var ends (pipe.mark), into pipe_marks; None: no marks
        self.mark_var: str | None = None
        # (core run, pipe name, that pipe's marks: a list of pipe.mark's tuples), one per pipe started
        # while mark_var is set (pipe.marks_of)
        self.pipe_marks: list[tuple[_CoreRun, str, list]] = []
        # engine.fastforward_blocks' marks: as each block (or group of blocks) ends, a mark into
        # block_marks; False: none
        self.mark_blocks = False
        # (its block indices, its kernel's counters then: a KernelStats, cycles since the kernel's
        # start), a block's (or group's) as it ends, in the order they end
        self.block_marks: list[tuple[list[int], KernelStats]] = []

    # ---------------------------------------------------------------- kernels

    def run_kernel(self, kernel: Kernel, stream: int = 0, queued: float | None = None,
                   reuse: Reuse | None = None, owner: Owner | None = None) -> simpy.Event:
        """Start a kernel now (it reached the head of its stream at `queued`, before its
        start cost); the returned event fires with its KernelRecord when it ends."""
        kr = _KernelRun(self._next_id, kernel, stream, self.env)
        kr.queued = self.env.now if queued is None else queued
        self._next_id += 1
        kr.reuse, kr.alone, kr.owner = reuse, not self.active, owner
        for other in self.active:
            other.alone = False
        self.active.append(kr)
        kr.skipped = 0
        if reuse is not None and reuse.key in self.replays and kr.alone:
            self.env.process(self._replay(kr, *self.replays[reuse.key]))
            return kr.done
        if self.fast_forward is not None and kr.alone and self._fills_cores(kernel):
            priced = self.fast_forward(kernel, self)
            if priced is not None:
                stats, kr.skipped, left = priced
                self.env.process(self._replay(kr, stats.cycles, stats, kr.skipped, left))
                return kr.done
        kr.sync_parties = sum(self._parties(kernel, b) for b in range(kernel.block_dim))
        self.pending.append(kr)
        self._dispatch()
        return kr.done

    def _replay(self, kr: _KernelRun, cycles: float, stats: KernelStats, skipped: int = 0, left=None):
        """Run a kernel as its lone twin ran (see the module doc), or as engine.fastforward
        priced it (`skipped`: the waves it did not simulate; `left`: the L2 it leaves, an
        l2_image, put over the device's L2 in place of its footprint)."""
        held = {kind: self.free[kind] for kind in self._kinds(kr.kernel)}
        for kind in held:
            self.free[kind] = []
        yield self.env.timeout(cycles)
        for kind, cores in held.items():
            self.free[kind] = sorted(self.free[kind] + cores)
        if left is not None:
            warm(self.memory.l2, left)
        elif kr.reuse is not None:
            for start, nbytes in kr.reuse.reads:
                self.memory.touch(start, nbytes, False)
            for start, nbytes in kr.reuse.writes:
                self.memory.touch(start, nbytes, True)
        else:  # a fast-forwarded kernel launched without its footprint: the GM tensors it names, as read
            # assumption: which of them it writes is not known here; their lines are left clean
            for t in kr.kernel.gm:
                self.memory.touch(t.addr, t.nbytes, False)
        kr.skipped = skipped
        self._finish(kr, stats)
        self._dispatch()

    def _fills_cores(self, kernel: Kernel) -> bool:
        """Do the kernel's blocks fill every core of its type in every wave (block_dim a whole
        number of times the cores)? Only such a kernel is fast-forwarded: it is run as a replay,
        which holds every core of its type(s) throughout, as the kernel itself then does.
        # assumption: a core freed between two of its blocks is taken by its next block at
        # once, so no other kernel could have slipped in."""
        cores = self.hw.chip.aic_count if kernel.core_type is not CoreType.AIV else self.hw.aiv_count
        return kernel.block_dim % cores == 0

    def _finish(self, kr: _KernelRun, stats: KernelStats) -> None:
        k = kr.kernel
        rec = KernelRecord(kr.id, k.name, k.op_type or k.name, k.core_type.value, k.block_dim, kr.stream,
                           kr.queued, kr.start, self.env.now, stats, kr.owner, kr.skipped)
        self.records.append(rec)
        self.active.remove(kr)
        if kr.reuse is not None and kr.alone:
            self.replays.setdefault(kr.reuse.key, (rec.cycles, stats, kr.skipped))
        kr.done.succeed(rec)
        if self.on_finish is not None:
            self.on_finish(len(self.records))

    def _compile(self, kernel: Kernel, kind: CoreType, block: int) -> tuple:
        """(program, its streams, the instructions it executes) of a block's program, compiled once."""
        program = kernel.program(kind, block)
        key = (id(program), kind)
        hit = self._compiled.get(key)
        if hit is None or hit[0] is not program:
            hit = self._compiled[key] = (program, compile_program(program, kind, self.hw, self._lowered[kind]),
                                         count_instructions(program.body))
        return hit

    def _streams(self, kernel: Kernel, kind: CoreType, block: int) -> tuple:
        return self._compile(kernel, kind, block)[1]

    def _parties(self, kernel: Kernel, block: int) -> int:
        """Pipe processes of one block (they all meet at a SyncAll)."""
        n = 0
        if kernel.core_type in (CoreType.AIC, CoreType.MIX):
            n += len(self._streams(kernel, CoreType.AIC, block))
        if kernel.core_type is CoreType.AIV:
            n += len(self._streams(kernel, CoreType.AIV, block))
        if kernel.core_type is CoreType.MIX:
            n += self.aiv_per_aic * len(self._streams(kernel, CoreType.AIV, block))
        return n

    def _take_cores(self, core_type: CoreType) -> tuple[int | None, list[int]]:
        """Free cores for one block of `core_type` (AIC id, AIV ids), or None if none fit."""
        per = self.aiv_per_aic
        if core_type is CoreType.AIC:
            return (heapq.heappop(self.free[CoreType.AIC]), []) if self.free[CoreType.AIC] else None
        if core_type is CoreType.AIV:
            return (None, [heapq.heappop(self.free[CoreType.AIV])]) if self.free[CoreType.AIV] else None
        # MIX: an AIC together with its own AIVs (the ones wired to it).
        free_aiv = set(self.free[CoreType.AIV])
        for c in sorted(self.free[CoreType.AIC]):
            aivs = [c * per + s for s in range(per)]
            if all(v in free_aiv for v in aivs):
                self.free[CoreType.AIC].remove(c)
                heapq.heapify(self.free[CoreType.AIC])
                for v in aivs:
                    self.free[CoreType.AIV].remove(v)
                heapq.heapify(self.free[CoreType.AIV])
                return c, aivs
        return None

    def _free_cores(self, cores: tuple[int | None, list[int]]) -> None:
        """Give back the cores of one block (see _take_cores)."""
        aic, aivs = cores
        if aic is not None:
            heapq.heappush(self.free[CoreType.AIC], aic)
        for v in aivs:
            heapq.heappush(self.free[CoreType.AIV], v)

    def _kinds(self, kernel: Kernel) -> list[CoreType]:
        return [CoreType.AIC, CoreType.AIV] if kernel.core_type is CoreType.MIX else [kernel.core_type]

    def _lone(self, kr: _KernelRun, block: int) -> bool:
        """Does this block of this kernel run one at a time (see lone_from)?"""
        return self.lone_from is not None and (kr.id, block) >= self.lone_from

    def _grouping(self, kr: _KernelRun, block: int) -> Grouping | None:
        """How a block's program(s) may run grouped now (see grouping.groupable); None if not."""
        kernel = kr.kernel
        if not self.dedup or self._lone(kr, block):
            return None
        parts = []
        for kind in self._kinds(kernel):
            program = kernel.program(kind, block)
            hit = self._groupable.get(id(program))
            if hit is None or hit[0] is not program:
                accesses = [a for _, stream, _ in self._streams(kernel, kind, block)
                            for a in gm_accesses(stream, {"sub": self.aiv_per_aic})]
                members = kernel.blocks_running(kind, program)
                hit = self._groupable[id(program)] = (program, groupable(accesses, kernel, self.hw, block, members))
            # blocks sharing lines are grouped only while their kernel is alone on the device
            # (another kernel touching those lines would reach the blocks unevenly), and
            # never when they share lines they write (a line one writes while another of the
            # group, or of another group, reads or writes it lets their timings drift apart)
            g = hit[1]
            if g is None or (g.shared and len(self.active) > 1) or any(write for *_, write in g.shared):
                return None
            parts.append(g)
        if len(parts) == 1:
            return parts[0]
        return Grouping(np.concatenate([g.reads for g in parts]), sum((g.shared for g in parts), ()))

    def _held(self, reads: np.ndarray, block: int) -> bytes:
        """Which of 17 lines spread over each of a block's reads (the first, the last and
        15 between) the L2 holds now: blocks whose inputs the L2 holds differently are not
        grouped, they would not hit alike."""
        if not len(reads):
            return b""
        lo = reads[:, 1] + reads[:, 0] * block
        hi = reads[:, 2] + reads[:, 0] * block - 1
        points = lo[:, None] + ((hi - lo)[:, None] * _HELD_POINTS) // _HELD_POINTS[-1]
        lines = points.ravel() // self.hw.l2.line_bytes
        return (self.memory.l2.find(lines) >= 0).tobytes()

    def _sharing(self, g: Grouping, first: int, n: int) -> int:
        """How many of n blocks from `first` may run as one group when they share lines
        they read: the lines must be in the L2 already and lie inside the group (its
        regions start and end on line boundaries); else blocks outside the group, or
        in another wave, would race them for the fill."""
        line = self.hw.l2.line_bytes
        for step, lo, hi, _ in g.shared:
            a, b = lo + step * first, hi + step * first
            ends = sorted({a // line, (b - 1) // line})  # the first and last line, each once
            if not (self.memory.l2.find(np.array(ends, np.int64)) >= 0).all():
                return 1
            if step == 0:
                continue
            if a % line:
                return 1
            while n > 1 and (hi + step * (first + n - 1)) % line:
                n -= 1
        return n

    def _same_programs(self, kernel: Kernel, a: int, b: int) -> bool:
        return all(kernel.program(kind, a) is kernel.program(kind, b) for kind in self._kinds(kernel))

    def _dispatch(self) -> None:
        for kr in list(self.pending):
            k = kr.kernel
            while kr.next_block < k.block_dim:
                first = kr.next_block
                g = held = None
                taken = []
                while first + len(taken) < k.block_dim:
                    b = first + len(taken)
                    cores = self._take_cores(k.core_type)
                    if cores is None:
                        break
                    if taken:
                        if len(taken) == 1:  # a second block could start with the first: may it join?
                            g = self._grouping(kr, first)
                            held = None if g is None else self._held(g.reads, first)
                        if (g is None or self._lone(kr, b) or not self._same_programs(k, first, b)
                                or self._held(g.reads, b) != held):
                            self._free_cores(cores)  # back as they were: the heaps give the same cores next
                            break
                    taken.append(cores)
                if not taken:
                    break
                if g is not None and g.shared:
                    for cores in taken[self._sharing(g, first, len(taken)):]:
                        self._free_cores(cores)
                    del taken[self._sharing(g, first, len(taken)):]
                self.env.process(self._block(kr, list(range(first, first + len(taken))), taken))
                kr.next_block += len(taken)
            if kr.next_block == k.block_dim:
                self.pending.remove(kr)

    # ---------------------------------------------------------------- blocks

    def _block(self, kr: _KernelRun, blocks: list[int], cores: list[tuple[int | None, list[int]]]):
        """Run one block, or a group of identical blocks (one per entry of `cores`)."""
        env, k = self.env, kr.kernel
        yield after(env, self.hw.runtime.block_start_cycles)
        start = env.now
        b0 = blocks[0]
        offsets = [b - b0 for b in blocks]
        blk = _BlockRun(b0)
        runs: list[_CoreRun] = []
        if cores[0][0] is not None:
            blk.aic = _CoreRun([f"AIC{aic}" for aic, _ in cores], CoreType.AIC, {"block": b0, "sub": 0},
                               self._streams(k, CoreType.AIC, b0), blk, offsets)
            runs.append(blk.aic)
        for s in range(len(cores[0][1])):
            blk.aivs.append(_CoreRun([f"AIV{aivs[s]}" for _, aivs in cores], CoreType.AIV, {"block": b0, "sub": s},
                                     self._streams(k, CoreType.AIV, b0), blk, offsets))
        runs += blk.aivs
        ends = [start_pipe(self, kr, cr, pipe, code) for cr in runs for pipe, _, code in cr.streams]
        if ends:
            yield env.all_of(ends)
        end = max([e._value for e in ends], default=env.now)
        if end > env.now:
            yield after(env, end - env.now)
        for cr in runs:
            kr.acc.core_cycles[cr.kind.value] += (end - start) * cr.weight
            kr.acc.instructions += self._compile(k, cr.kind, blocks[0])[2] * cr.weight
            if self.tracer.block:
                for name, b in zip(cr.names, blocks):
                    self.tracer.block_spans.append((name, k.name, b, start, end, kr.id))
        for c in cores:
            self._free_cores(c)
        kr.blocks_done += len(blocks)
        if self.mark_blocks:
            self.block_marks.append((blocks, kr.acc.freeze(env.now - kr.start)))
        if kr.blocks_done == k.block_dim:
            self._finish(kr, kr.acc.freeze(env.now - kr.start))
        self._dispatch()


# Where _held looks into each read of a block: at 0/16 ... 16/16 of its extent.
_HELD_POINTS = np.arange(17, dtype=np.int64)
