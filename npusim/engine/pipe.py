"""A pipe of a core running its instruction stream: the process of each pipe (see
device.py for the model). Its walk through the stream - fixed-cost instructions,
SetFlag/WaitFlag and cross-core flags, GM copies - and its process are in C
(_pipe.c: scheduled and resumed as SimPy schedules and resumes a process); the
barriers and SyncAll it meets are here (meet), as generators the process runs.

A pipe keeps its own clock `t` (never behind env.now) and only synchronises with
simulated time when it touches something shared: a GM transfer or an empty flag.
`dev` is the Device (env, hw, memory, tracer, and `blocked`: what each blocked
pipe waits for, for the deadlock message); `kr` the kernel run, `cr` the core run.
"""

from __future__ import annotations

from functools import partial

from npusim.engine._pipe import Walker
from npusim.engine.compile import MEMS, BarrierAll, SyncAllEntry
from npusim.engine.cycles import whole_cycles
from npusim.engine.events import Signal, after
from npusim.engine.grouping import Diverged
from npusim.isa.program import CoreType


def start_pipe(dev, kr, cr, pipe, code) -> Signal:
    """Start the process of one pipe of core run `cr`: its Code walked in C (_pipe.c), which
    waits for GM copies and flags itself and hands barriers and SyncAll to meet(); the
    Signal returned fires with the pipe's clock at its end.

    Cross-core flags go between a block's AIC and its AIVs: the AIC's set reaches every
    AIV as from source 0, an AIV's reaches the AIC as from its `sub`; the AIC's wait
    takes a set from every AIV, an AIV's one from the AIC (cr.cross keeps them by flag
    id and source)."""
    env = dev.env
    pipe_name = pipe.value
    blk, aic = cr.block, cr.kind is CoreType.AIC
    cross = (cr.cross, tuple(other.cross for other in blk.aivs) if aic else
             (() if blk.aic is None else (blk.aic.cross,)), 0 if aic else cr.vars["sub"],
             len(blk.aivs) if aic else 1, dev.aiv_per_aic, dev.cross_flag_cycles)
    # each pipe walks its own loops: its own copy of the block's variables
    walk = Walker(code, dict(cr.vars), cr.flags, dev.flag_cycles, env.now,
                  dev.tracer.intervals if dev.tracer.instr else None, tuple(cr.names), pipe_name, kr.id,
                  env, dev.memory.transfer, Signal, after, whole_cycles, dev.blocked, (cr.name, pipe_name),
                  cr.offsets, cr.weight, kr.acc, partial(Diverged, kr.id, cr.block.index),
                  partial(meet, dev, kr, cr, pipe_name), partial(end, kr, cr, pipe_name), cross,
                  dev.hw.dma.outstanding)
    if dev.mark_var is not None:
        walk.mark_var, walk.on_mark = dev.mark_var, partial(mark, kr, marks_of(dev, cr, pipe_name))
    return walk.start()


# A mark (engine.fastforward): where a pipe stands as an iteration of the marked loop ends -
# its clock, its own counters so far (busy, waited, data-wait cycles, flops, bytes written
# into each local buffer, in compile.MEMS order) and its kernel's GM counters then
MARKED_GM = ("gm_read_bytes", "gm_write_bytes", "hbm_read_bytes", "hbm_write_bytes", "l2_hit_bytes",
             "l2_miss_bytes", "wasted_burst_bytes", "misaligned_segments", "dma_segments")


def marks_of(dev, cr, pipe_name: str) -> list:
    """A new list for one pipe's marks, kept in dev.pipe_marks with its core run and pipe."""
    marks: list = []
    dev.pipe_marks.append((cr, pipe_name, marks))
    return marks


def mark(kr, marks: list, walk) -> None:
    """The walk's on_mark: a mark of where it stands (see MARKED_GM) into `marks`."""
    acc = kr.acc
    marks.append((walk.t, walk.busy, walk.waited, walk.data_wait, walk.flops, walk.local,
                  tuple([getattr(acc, name) for name in MARKED_GM])))


def meet(dev, kr, cr, pipe_name: str, walk, entry):
    """A barrier or SyncAll the walk met: a generator its process runs (it yields what
    the pipe waits for), as the pipe's own code."""
    kind = entry.__class__
    if kind is BarrierAll:
        meeting = barrier(dev, cr, walk.t, entry.cost, pipe_name)
    elif kind is SyncAllEntry:
        meeting = sync_all(dev, kr, cr, walk.t, entry.cost, pipe_name)
    else:
        raise TypeError(f"pipe {pipe_name}: not a stream entry: {entry!r}")
    walk.t, stalled = yield from meeting
    walk.waited += stalled
    walk.busy += entry.cost


def end(kr, cr, pipe_name: str, walk) -> None:
    """The pipe has ended: its counters go into its kernel's (weighted by the run's members)."""
    acc, w = kr.acc, cr.weight
    walk.flush(acc.local_bytes, MEMS, w)
    acc.busy_cycles[f"{cr.kind.value}.{pipe_name}"] += walk.busy * w
    acc.wait_cycles[f"{cr.kind.value}.{pipe_name}"] += walk.waited * w
    if walk.data_wait:
        acc.data_wait_cycles[f"{cr.kind.value}.{pipe_name}"] += walk.data_wait * w
    acc.flops += walk.flops * w

def barrier(dev, cr, t: float, cost: int, pipe_name: str):
    """PipeBarrier(ALL): every pipe of the core meets here; returns (new t, cycles waited)."""
    if cr.bar_ev is None:
        cr.bar_ev = dev.env.event()
    cr.bar_n += 1
    cr.bar_t = max(cr.bar_t, t)
    ev = cr.bar_ev
    if cr.bar_n == len(cr.streams):
        release = cr.bar_t + cost
        cr.bar_n, cr.bar_t, cr.bar_ev = 0, 0.0, None
        ev.succeed(release)
    else:
        dev.blocked[(cr.name, pipe_name)] = "PipeBarrier(ALL)"
        yield ev
        del dev.blocked[(cr.name, pipe_name)]
    release = ev.value
    return release, release - cost - t

def sync_all(dev, kr, cr, t: float, cost: int, pipe_name: str):
    """SyncAll: every pipe of every core of the kernel meets here."""
    kr.sync_n += cr.weight
    kr.sync_t = max(kr.sync_t, t)
    ev = kr.sync_ev
    if kr.sync_n == kr.sync_parties:
        release = kr.sync_t + cost
        kr.sync_n, kr.sync_t, kr.sync_ev = 0, 0.0, dev.env.event()
        ev.succeed(release)
    else:
        dev.blocked[(cr.name, pipe_name)] = f"SyncAll of kernel '{kr.kernel.name}'"
        yield ev
        del dev.blocked[(cr.name, pipe_name)]
    release = ev.value
    return release, release - cost - t
