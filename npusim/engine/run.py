"""Run a host program (or one kernel) on a simulated device: the engine's entry point."""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable

from attrs import field, frozen

from npusim.diskcache.reads import note, recording
from npusim.engine import fastforward, fastforward_blocks
from npusim.engine.device import Device, KernelRecord
from npusim.engine.events import Environment
from npusim.engine.fastforward_rewrite import cores_of
from npusim.engine.grouping import Diverged
from npusim.engine.l2_image import l2_image
from npusim.engine.links import LinkTransfer
from npusim.engine.host import (
    LAUNCH_MODES, MEMCPY_DIRECTIONS, Host, HostCall, HostWork, Launch, Memcpy, RecordEvent, Synchronize, WaitEvent,
)
from npusim.engine.stats import KernelStats, Tracer
from npusim.errors import DeadlockError, ProgramError
from npusim.hw import HwConfig
from npusim.hw.checks import STEP_CYCLES_MAX
from npusim.isa.program import Kernel
from npusim.isa.verify import verify

# How many blocked waiters a deadlock message lists before "and N more".
_DEADLOCK_SHOWN = 4


@frozen
class Trace:
    """What a run recorded (cycles). intervals: (core, pipe, name, start, end, kernel id);
    block_spans: (core, kernel, block, start, end, kernel id); host_spans: (track, name,
    start, end); counters: link name -> ((cycle, bytes per cycle in use), ...);
    copies: kernel id -> (id of the kernel whose instructions it repeats, cycles later),
    for the kernels a memoised run did not simulate (runtime.memo_trace): their
    instructions are the other's moved in time, kept once, not in `intervals` (a K3
    step copies 29 layers: about 6.6 million intervals more); intervals_of gives them."""

    level: str
    intervals: tuple
    block_spans: tuple
    host_spans: tuple
    counters: dict
    copies: dict = field(factory=dict)

    def intervals_of(self, kernel_id: int) -> list[tuple]:
        """The instruction intervals of one kernel, a copy's those of its source moved to it."""
        source, shift = self.copies.get(kernel_id, (kernel_id, 0.0))
        return [(core, pipe, name, start + shift, end + shift, kernel_id)
                for core, pipe, name, start, end, kid in self.intervals if kid == source]


@frozen
class RunResult:
    hw: HwConfig
    cycles: float
    kernels: tuple[KernelRecord, ...]
    host_launch_cycles: float
    host_wait_cycles: float
    trace: Trace
    # transfers after which a group of blocks whose members came apart was kept together
    # (exact=False: memory.MemorySystem.exact_groups); 0 in an exact run
    kept_together: int = 0

    @property
    def us(self) -> float:
        return self.hw.us(self.cycles)

    @functools.cached_property  # a step's report reads it several times; a step has over a thousand kernels
    def stats(self) -> KernelStats:
        return sum((k.stats for k in self.kernels), KernelStats())

    @property
    def fast_forwarded(self) -> tuple[KernelRecord, ...]:
        """The kernels priced from a few of their waves (engine.fastforward), not simulated in full."""
        # (a record pickled before KernelRecord had `skipped`, read back from the disk cache, has none)
        return tuple(k for k in self.kernels if getattr(k, "skipped", 0))

    def fast_forward_note(self) -> str:
        """'' when the run was exact throughout, else what the summaries print."""
        ff = self.fast_forwarded
        notes = []
        if ff:
            notes.append(f"{len(ff)} fast-forwarded ({sum(k.skipped for k in ff):,} identical waves priced from the "
                         "few simulated before them)")
        if self.kept_together:
            notes.append(f"identical blocks that came apart kept as one after {self.kept_together:,} transfers")
        return "; ".join(notes) + " (without --fast-forward every wave and block is simulated)" if notes else ""

    @property
    def hbm_bw_bytes_per_s(self) -> float:
        """Achieved HBM bandwidth (read + write) over the whole run."""
        s = self.stats
        return (s.hbm_read_bytes + s.hbm_write_bytes) / (self.us * 1e-6) if self.cycles else 0.0


def run(calls: Iterable[HostCall], hw: HwConfig, trace: str = "instr", dedup: bool = True,
        on_device: Callable[[Device], None] | None = None,
        progress: Callable[[int, int], None] | None = None, counters: bool = True,
        exact: bool = True, checked: bool = False) -> RunResult:
    """Execute host calls (launches, memcpys, events, synchronizes) and return what happened.
    dedup=False simulates identical blocks one by one (tests compare both); on_device lets a
    caller look at (or instrument) the Device before the run starts (each attempt's,
    see until_even).
    progress(kernels finished, kernels launched in all) is called as each kernel ends
    (of the first attempt).
    counters=False records no bandwidth samples (Trace.counters is empty): they only feed
    a Chrome trace, and a long step makes hundreds of thousands of them.
    exact=False lets a kernel with many identical waves that starts alone be priced from a
    few of them (engine.fastforward; its record's `skipped` says how many were not
    simulated), and keeps a group of blocks whose members come apart together (the
    slowest member's transfer sets theirs: memory.MemorySystem.exact_groups) where
    exact=True runs the program again with them one at a time (until_even); exact=True
    simulates every kernel in full, as before fast-forward existed.
    checked=True: the calls are known to be well formed and their kernels to pass verify()
    (fast-forward's truncated runs: a verified kernel with a loop cut short)."""
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Iterable):
        raise ProgramError(f"run: calls is {type(calls).__name__!r}, expected a list of host calls (Launch, Memcpy, "
                           "RecordEvent, WaitEvent, Synchronize, HostWork)")
    calls = list(calls)
    fast = None if exact else _fast_forward(hw, dedup)
    if not checked:
        _check_calls(calls, hw)

    def attempt(lone_from: tuple[int, int] | None):
        env = Environment()
        tracer = Tracer(trace)
        device = Device(env, hw, tracer, dedup, counters, fast)
        device.lone_from = lone_from
        device.memory.exact_groups = exact
        if on_device is not None:
            on_device(device)
        if progress is not None and lone_from is None:
            launches = sum(isinstance(c, Launch) for c in calls)
            device.on_finish = lambda done: progress(done, launches)
        host = Host(env, device)
        env.process(host.run(calls))
        env.run()
        return [device], (env, tracer, device, host)

    env, tracer, device, host = until_even(attempt)
    stuck = dict(device.blocked)
    if not host.done or stuck or any(s.outstanding for s in host.streams.values()):
        raise DeadlockError(_deadlock_message(stuck, env.now))
    fabric = host.fabric.links if host.fabric is not None else ()  # only runs with collectives have one
    samples = {link.name: tuple(link.samples) for link in
               (device.memory.hbm, device.memory.l2_link, *host.pcie.values(), *fabric)} if counters else {}
    return RunResult(
        hw=hw,
        cycles=host.end,  # background write-backs may still be draining; nobody waits for them
        kernels=tuple(sorted(device.records, key=lambda r: r.id)),
        host_launch_cycles=host.launch_cycles,
        host_wait_cycles=host.wait_cycles,
        trace=Trace(trace, tuple(tracer.intervals), tuple(tracer.block_spans), tuple(tracer.host_spans), samples),
        kept_together=device.memory.kept_together,
    )


def _fast_forward(hw: HwConfig, dedup: bool) -> Callable:
    """The device's fast_forward (see Device): engine.fastforward.price of a kernel, each
    truncated run simulated exactly on a device of its own whose L2 starts as the
    calling device's."""

    lowered: dict = {}  # the truncated runs' devices share their instruction lowerings (compile.compile_program)

    def simulate(kernel: Kernel, on_device: Callable[[Device], None], mark: str) -> tuple[KernelStats, list, tuple]:
        """One truncated run (see fastforward.price), its pipes marking the iterations of loops over
        `mark` (its marks: Device.pipe_marks), or, when `mark` is the reserved variable "block"
        (fastforward_blocks.BLOCK), the device marking each block's end (Device.block_marks)."""
        devices = []
        by_block = mark == fastforward_blocks.BLOCK

        def setup(device: Device) -> None:
            device._lowered = lowered.setdefault("by kind", device._lowered)
            if by_block:
                device.mark_blocks = True
            else:
                device.mark_var = mark
            devices.append(device)  # (until_even may start the run again: the last device's marks)
            on_device(device)

        # checked: the kernel passed verify() before its loop was cut short, which changes no
        # tile, address or flag of it (a flag a cut loop would leave unbalanced would deadlock
        # the truncated run: an error, and the kernel is simulated in full)
        stats = run([Launch(kernel, 0), Synchronize()], hw, "kernel", dedup, on_device=setup, counters=False,
                    exact=True, checked=True).kernels[0].stats
        last = devices[-1]
        return stats, last.block_marks if by_block else last.pipe_marks, l2_image(last.memory.l2)

    # Prices made in this run, by kernel (identity), launch time and L2 clock: until_even runs
    # the program again from the start when a group diverges, and up to that group the rerun
    # is the same run, so a kernel launched at the same time on the same L2 gets the same price.
    priced: dict[tuple, tuple] = {}

    def price(kernel: Kernel, device: Device):
        key = (id(kernel), device.env.now, device.memory.l2.clock)
        if key not in priced:
            # blocks in one wave of cores: their repeat loop's iterations are the waves; in many: the waves of blocks
            way = fastforward if kernel.block_dim <= cores_of(kernel, hw) else fastforward_blocks
            if not way.worth_trying(kernel, hw):
                return None
            priced[key] = (kernel, way.price(kernel, hw, lambda: l2_image(device.memory.l2), simulate))
        return priced[key][1]

    return price


def until_even(attempt: Callable[[tuple[int, int] | None], tuple[list[Device], object]]):
    """What attempt(lone_from) gives - it simulates on devices that run every block from
    (kernel run id, block) = lone_from on one at a time (see device.py), and returns
    (those devices, its result) - once no grouped kernel's members came apart; a group
    that comes apart ends its attempt at once (grouping.Diverged), which is run again
    with lone_from at that group. Each round moves lone_from earlier, so it ends."""
    lone_from: tuple[int, int] | None = None
    while True:
        try:
            return attempt(lone_from)[1]
        except Diverged as diverged:
            lone_from = min(diverged.args, lone_from or diverged.args)


def _check_calls(calls: list, hw: HwConfig) -> None:
    """Every host call is well formed and every kernel passes verify(), before anything runs."""
    checked = set()
    for i, c in enumerate(calls):
        where = f"host call {i} ({type(c).__name__})"
        bad = _bad_field(c)
        if bad:
            raise ProgramError(f"{where}: {bad}")
        if isinstance(c, Launch):
            if c.mode not in LAUNCH_MODES:
                raise ProgramError(f"{where}: mode must be one of {', '.join(LAUNCH_MODES)}, got {c.mode!r}")
            if id(c.kernel) not in checked:
                _verify_once(c.kernel, hw)
                checked.add(id(c.kernel))
        elif isinstance(c, Memcpy):
            if c.direction not in MEMCPY_DIRECTIONS or c.nbytes < 1:
                raise ProgramError(f"{where}: expected nbytes >= 1 and direction in "
                                   f"{', '.join(MEMCPY_DIRECTIONS)}, got {c.nbytes}, {c.direction!r}")
            # a copy into or out of the device's memory holds at most all of it (2^63 bytes ran)
            if c.nbytes > hw.hbm.hbm_bytes:
                raise ProgramError(f"{where}: nbytes {c.nbytes} must be 1 to {hw.hbm.hbm_bytes} (hbm.hbm_bytes: "
                                   "the device memory it copies into or out of)")
        elif isinstance(c, LinkTransfer):
            bad = c.check() or (None if c.mode in LAUNCH_MODES else f"mode must be one of {', '.join(LAUNCH_MODES)}")
            if bad:
                raise ProgramError(f"{where}: {bad}")
        elif isinstance(c, HostWork) and not 0 <= c.us < math.inf:  # (a number: _bad_field)
            raise ProgramError(f"{where}: us must be a finite number >= 0, got {c.us}")
        elif isinstance(c, HostWork) and c.us * hw.chip.freq_hz / 1e6 > STEP_CYCLES_MAX:
            # (1e30 us ran: a host clock the engine's int cycles no longer count exactly)
            raise ProgramError(f"{where}: us {c.us:g} must be 0 to {STEP_CYCLES_MAX * 1e6 / hw.chip.freq_hz:.6g} "
                               f"(hw.checks.STEP_CYCLES_MAX: the 2^40 cycles one step may take, at chip.freq_hz "
                               f"{hw.chip.freq_hz:g})")
        elif not isinstance(c, (RecordEvent, WaitEvent, Synchronize, HostWork)):
            raise ProgramError(f"{where}: not a host call")


# The fields of each host call whose type the host relies on: (name, the classes it may be,
# what the error says is expected). A stream is an int >= 0 (a str or a float stream was
# a queue of its own; Synchronize(-5) waited on a stream nothing used).
_STREAM = ("stream", (int,), "an int >= 0")
_CALL_FIELDS = {
    Launch: (("kernel", (Kernel,), "a Kernel"), _STREAM),
    Memcpy: (("nbytes", (int,), "an int"), _STREAM),
    RecordEvent: (("name", (str,), "a str"), _STREAM),
    WaitEvent: (("name", (str,), "a str"), _STREAM),
    Synchronize: (("stream", (int, type(None)), "an int >= 0 or None (every stream)"),),
    HostWork: (("us", (int, float), "a number of microseconds"),),
}


def _bad_field(call) -> str | None:
    """What is wrong with a host call's fields (_CALL_FIELDS), or None."""
    for name, types, expected in _CALL_FIELDS.get(type(call), ()):
        value = getattr(call, name)
        if value.__class__ not in types or (name == "stream" and value is not None and value < 0):
            return f"{name} {value!r} is not {expected}"
    return None


# Kernels verify() passed in this process, keyed by the identity of what it checks: the
# config object and every part of the kernel but its name (names are only in its
# messages). A lowering reused under another name (compare's pipelines, a serving
# model's steps) is checked once. Entries hold the objects, so their ids stay theirs.
_VERIFIED: OrderedDict[tuple, tuple] = OrderedDict()
# Entries kept, the least recently used dropped first: a few steps' kernels (a K3 step
# has about 50 distinct ones). Each holds its kernel, about 0.15 MB for a K3 prefill's:
# 4096 of them held a long serving run's process at over 2 GB.
_VERIFIED_MAX = 512


def _verify_once(kernel: Kernel, hw: HwConfig) -> None:
    """verify(kernel, hw) unless an equal kernel passed it on this config object. The
    config fields it read are recorded again on a hit (a disk-cached step is keyed on them)."""
    # (the classes too: block_dim 1.0 or True equals the 1 that passed, and is refused)
    key = (id(hw), kernel.core_type, kernel.block_dim.__class__, kernel.block_dim, id(kernel.aic), id(kernel.aiv),
           id(kernel.gm), kernel.workspace_bytes.__class__, kernel.workspace_bytes, kernel.op_type)
    hit = _VERIFIED.get(key)
    if hit is not None:
        _VERIFIED.move_to_end(key)
        note(hit[2])
        return
    with recording() as reads:
        verify(kernel, hw)
    _VERIFIED[key] = (hw, kernel, frozenset(reads))
    if len(_VERIFIED) > _VERIFIED_MAX:
        _VERIFIED.popitem(last=False)


def _deadlock_message(stuck: dict, now: float) -> str:
    items = sorted(stuck.items())
    shown = "; ".join(f"{core} {pipe} waits on {what}" for (core, pipe), what in items[:_DEADLOCK_SHOWN])
    more = f" (and {len(items) - _DEADLOCK_SHOWN} more)" if len(items) > _DEADLOCK_SHOWN else ""
    return f"deadlock at cycle {now:.0f}: {shown or 'work left that nothing will start'}{more}"


def simulate(kernel: Kernel, hw: HwConfig, trace: str = "instr", mode: str = "eager",
             exact: bool = True) -> RunResult:
    """One kernel: launch it on stream 0 and synchronize (exact: see run)."""
    return run([Launch(kernel, 0, mode), Synchronize()], hw, trace, exact=exact)
