"""A pipe of a core running its instruction stream: the process of each pipe (see
device.py for the model). Its walk through the stream - fixed-cost instructions,
SetFlag/WaitFlag, GM copies - and its process are in C (_pipe.c: scheduled and
resumed as SimPy schedules and resumes a process); the barriers, SyncAll and
cross-core flags it meets are here (meet), as generators the process runs.

A pipe keeps its own clock `t` (never behind env.now) and only synchronises with
simulated time when it touches something shared: a GM transfer or an empty flag.
`dev` is the Device (env, hw, memory, tracer, and `blocked`: what each blocked
pipe waits for, for the deadlock message); `kr` the kernel run, `cr` the core run.
"""

from __future__ import annotations

from functools import partial

from npusim.engine._pipe import Walker
from npusim.engine.compile import MEMS, BarrierAll, CrossSet, CrossWait, SyncAllEntry
from npusim.engine.cycles import whole_cycles
from npusim.engine.events import Signal, after
from npusim.engine.grouping import Diverged
from npusim.isa.program import CoreType


def wait_cross(dev, cr, key, pipe_name: str, what: str):
    """Take the oldest pending set of cross-core flag `key` on core `cr`, blocking until
    there is one. Returns the cycle at which that set became visible."""
    q = cr.cross_flags[key]
    if q:
        return q.popleft()
    ev = Signal(dev.env)
    cr.cross_waiters[key].append(ev)
    dev.blocked[(cr.name, pipe_name)] = what
    visible = yield ev  # the setter hands its set to the oldest waiter directly
    del dev.blocked[(cr.name, pipe_name)]
    return visible

def post_cross(cr, key, visible_at: float) -> None:
    waiting = cr.cross_waiters.get(key)
    if waiting:
        waiting.popleft().fire(visible_at)
    else:
        cr.cross_flags[key].append(visible_at)

def start_pipe(dev, kr, cr, pipe, code) -> Signal:
    """Start the process of one pipe of core run `cr`: its Code walked in C (_pipe.c), which
    waits for GM copies and flags itself and hands barriers, SyncAll and cross-core flags
    to meet(); the Signal returned fires with the pipe's clock at its end."""
    env, hw = dev.env, dev.hw
    pipe_name = pipe.value
    # each pipe walks its own loops: its own copy of the block's variables
    return Walker(code, dict(cr.vars), cr.flags, hw.sync.flag_latency_cycles, env.now,
                  dev.tracer.intervals if dev.tracer.instr else None, tuple(cr.names), pipe_name, kr.id,
                  env, dev.memory.transfer, Signal, after, whole_cycles, dev.blocked, (cr.name, pipe_name),
                  cr.offsets, cr.weight, kr.acc, partial(Diverged, kr.id, cr.block.index),
                  partial(meet, dev, kr, cr, pipe_name), partial(end, kr, cr, pipe_name)).start()


def meet(dev, kr, cr, pipe_name: str, walk, entry):
    """A barrier, SyncAll or cross-core flag the walk met: a generator its process runs
    (it yields what the pipe waits for), as the pipe's own code."""
    env = dev.env
    kind = entry.__class__
    if kind is BarrierAll:
        walk.t, stalled = yield from barrier(dev, cr, walk.t, entry.cost, pipe_name)
        walk.waited += stalled
        walk.busy += entry.cost
    elif kind is SyncAllEntry:
        walk.t, stalled = yield from sync_all(dev, kr, cr, walk.t, entry.cost, pipe_name)
        walk.waited += stalled
        walk.busy += entry.cost
    elif kind is CrossSet:
        # Several pipes may set one cross flag: post in simulated-time order.
        t = walk.t
        if t > env.now:
            yield after(env, t - env.now)
        blk = cr.block
        targets = blk.aivs if cr.kind is CoreType.AIC else [blk.aic]
        for other in targets:
            post_cross(other, ("cross", cr.vars["sub"] if cr.kind is CoreType.AIV else 0, entry.flag),
                       t + dev.hw.sync.cross_core_flag_latency_cycles)
    elif kind is CrossWait:
        blk = cr.block
        sources = range(len(blk.aivs)) if cr.kind is CoreType.AIC else (0,)
        t = visible = walk.t
        for s in sources:
            v = yield from wait_cross(dev, cr, ("cross", s, entry.flag), pipe_name, entry.name)
            visible = max(visible, v)
        walk.waited += visible - t
        walk.t = visible
    else:
        raise TypeError(f"pipe {pipe_name}: not a stream entry: {entry!r}")


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
