"""The pipe process in Python, as it ran before its walk moved to C (npusim/engine/
_pipe.c): the statement the C walk is held to (tests/test_engine_pipe_walk.py swaps
it in for npusim.engine.device.start_pipe and compares whole runs, value and type).
Barriers and SyncAll are the engine's own (pipe.py); a core's SetFlag/WaitFlag and
cross-core flags are kept here, per core run, as the Python kept them."""

from __future__ import annotations

from collections import defaultdict, deque

from npusim.engine.compile import (
    BarrierAll,
    CrossSet,
    CrossWait,
    Fixed,
    FixedRun,
    FlagSet,
    FlagWait,
    GmCopy,
    MEMS,
    LoopEntry,
    SyncAllEntry,
)
from npusim.engine.cycles import whole_cycles
from npusim.engine.events import Signal, after, at_delay
from npusim.engine.grouping import Diverged
from npusim.engine.pipe import MARKED_GM, barrier, marks_of, sync_all
from npusim.isa.program import CoreType, at


def _flags_of(dev, cr) -> tuple[dict, dict]:
    """The core run's (flags, waiters): key -> pending sets, key -> waiting events."""
    runs = dev.__dict__.setdefault("_reference_flags", {})
    if id(cr) not in runs:
        runs[id(cr)] = (cr, defaultdict(deque), defaultdict(deque))  # cr kept: its id is not reused
    return runs[id(cr)][1:]


def _post(dev, cr, key, visible_at) -> None:
    flags, waiters = _flags_of(dev, cr)
    waiting = waiters.get(key)
    if waiting:
        waiting.popleft().fire(visible_at)
    else:
        flags[key].append(visible_at)


def _wait_flag(dev, cr, key, pipe_name: str, what: str):
    flags, waiters = _flags_of(dev, cr)
    q = flags[key]
    if q:
        return q.popleft()
    ev = Signal(dev.env)
    waiters[key].append(ev)
    dev.blocked[(cr.name, pipe_name)] = what
    visible = yield ev
    del dev.blocked[(cr.name, pipe_name)]
    return visible


def run_pipe(dev, kr, cr, pipe, code):
    """The process of one pipe, as npusim's Python ran it before the walk moved to C
    (the Code is not read: the pipe's stream entries are)."""
    stream = next(s for p, s, _ in cr.streams if p is pipe)
    env, hw, mem, acc = dev.env, dev.hw, dev.memory, kr.acc
    vars = dict(cr.vars)  # each pipe walks its own loops
    intervals = dev.tracer.intervals if dev.tracer.instr else None
    pipe_name, kid = pipe.value, kr.id
    names, offsets, w = cr.names, cr.offsets, cr.weight
    flag_latency = hw.sync.flag_latency_cycles
    cross_latency = hw.sync.cross_core_flag_latency_cycles
    t = env.now
    busy = waited = data_wait = flops = 0.0
    # the DMA queue (_pipe.c's top comment): copies in the chain, their data starts, when
    # its first copy was met, when the last was requested and ended, the latest flag a
    # wait has seen set since (None: none)
    queue = hw.dma.outstanding
    starts: list = []
    first = req = end = gate = None
    local_bytes = acc.local_bytes
    # fast-forward's marks (pipe.mark): the bytes this pipe wrote into each buffer, unweighted
    marks = marks_of(dev, cr, pipe_name) if dev.mark_var is not None else None
    mine = dict.fromkeys(MEMS, 0)
    flags, waiters = _flags_of(dev, cr)

    # The stream in execution order, loops walked in place (a stack of open loops:
    # the iterator to resume after the loop, the loop entry, its iteration), so an
    # entry deep in nested loops costs one step of a for loop.
    stack: list[tuple] = []
    it = iter(stream)
    while True:
        for entry in it:
            kind = entry.__class__
            if kind is Fixed:
                cost = entry.cost
                if intervals is not None:
                    for name in names:
                        intervals.append((name, pipe_name, entry.name, t, t + cost, kid))
                t += cost
                busy += cost
                flops += entry.flops
                if entry.mem is not None:
                    local_bytes[entry.mem] += entry.nbytes * w
                    mine[entry.mem] += entry.nbytes
            elif kind is FixedRun:  # as its Fixed entries one after the other (exact: whole numbers)
                cost = entry.cost
                if intervals is not None:
                    at_t = t
                    for e in entry.entries:
                        for name in names:
                            intervals.append((name, pipe_name, e.name, at_t, at_t + e.cost, kid))
                        at_t += e.cost
                t += cost
                busy += cost
                flops += entry.flops
                for mem_name, nbytes in entry.local:
                    local_bytes[mem_name] += nbytes * w
                    mine[mem_name] += nbytes
            elif kind is GmCopy:
                startup, cap, write = entry.startup, entry.cap, entry.write
                nbytes, segments, step = entry.nbytes, entry.segments, entry.step
                a = at(entry.gm_addr, vars)
                issue = t
                if queue > 1 and starts and t == end:  # a chain: requested while the one before moved data
                    since = starts[-(queue - 1)] if len(starts) >= queue - 1 else first
                    req = since if since > req else req
                    if gate is not None and gate > req:
                        req = gate
                    start = req + startup
                    if t > start:
                        start, startup = t, 0
                    else:
                        startup = start - t
                else:
                    starts, first, req = [], t, t
                    start = t + startup
                starts.append(start)
                gate = None
                t = start
                done = Signal(env)
                addrs = [a + o * step for o in offsets]
                if t > env.now:
                    # The copy starts once its start-up has passed: a callback of that timeout
                    # starts it, at the very point of the event order where this pipe would
                    # have resumed to start it, without resuming the pipe.
                    started = []
                    at_delay(env, t - env.now,
                             lambda _ev, addrs=addrs, nbytes=nbytes, segments=segments, stride=entry.stride,
                             write=write, cap=cap, started=started, on_done=done.fire: started.append(
                                 mem.transfer(addrs, nbytes, segments, stride, write, cap, on_done)))
                    yield done
                    st = started[0]
                else:
                    st = mem.transfer(addrs, nbytes, segments, entry.stride, write, cap, done.fire)
                    yield done
                if st.uneven:  # this run of the program is void: engine.run simulates it again
                    raise Diverged(kr.id, cr.block.index)
                t = end = env.now
                busy += t - issue
                # beyond start-up + bytes at the port rate: waiting for shared bandwidth / HBM
                data_wait += max(0, t - issue - startup - whole_cycles(st.moved / w / cap))
                if intervals is not None:
                    for nm in names:
                        intervals.append((nm, pipe_name, entry.name, issue, t, kid))
                if write:
                    acc.gm_write_bytes += st.moved
                else:
                    acc.gm_read_bytes += st.moved
                    local_bytes[entry.local] += nbytes * segments * w
                    mine[entry.local] += nbytes * segments
                acc.hbm_read_bytes += st.hbm_read
                acc.hbm_write_bytes += st.hbm_write
                acc.l2_hit_bytes += st.hit_bytes
                acc.l2_miss_bytes += st.miss_bytes
                acc.wasted_burst_bytes += st.wasted
                acc.misaligned_segments += st.misaligned
                acc.dma_segments += segments * w
            elif kind is FlagSet:  # _post, inlined: the most frequent entry after Fixed
                waiting = waiters.get(entry.key)
                if waiting:
                    waiting.popleft().fire(t + flag_latency)
                else:
                    flags[entry.key].append(t + flag_latency)
            elif kind is FlagWait:
                pending = flags[entry.key]
                if pending:  # already set: no need to block (the common case)
                    visible = pending.popleft()
                else:
                    visible = yield from _wait_flag(dev, cr, entry.key, pipe_name, entry.name)
                if gate is None or visible > gate:
                    gate = visible
                if visible > t:
                    if intervals is not None:
                        for name in names:
                            intervals.append((name, pipe_name, entry.name, t, visible, kid))
                    waited += visible - t
                    t = visible
            elif kind is BarrierAll:
                starts = []
                t, stalled = yield from barrier(dev, cr, t, entry.cost, pipe_name)
                waited += stalled
                busy += entry.cost
            elif kind is SyncAllEntry:
                starts = []
                t, stalled = yield from sync_all(dev, kr, cr, t, entry.cost, pipe_name)
                waited += stalled
                busy += entry.cost
            elif kind is CrossSet:
                # Several pipes may set one cross flag: post in simulated-time order.
                if t > env.now:
                    yield after(env, t - env.now)
                blk = cr.block
                targets = blk.aivs if cr.kind is CoreType.AIC else [blk.aic]
                for other in targets:
                    _post(dev, other, ("cross", cr.vars["sub"] if cr.kind is CoreType.AIV else 0, entry.flag),
                          t + cross_latency)
            elif kind is CrossWait:
                starts = []
                blk = cr.block
                sources = range(len(blk.aivs)) if cr.kind is CoreType.AIC else (0,)
                visible = t
                for s in sources:
                    v = yield from _wait_flag(dev, cr, ("cross", s, entry.flag), pipe_name, entry.name)
                    visible = max(visible, v)
                waited += visible - t
                t = visible
            elif kind is LoopEntry:
                if entry.count > 0:
                    vars[entry.var] = 0
                    stack.append((it, entry, 0))
                    it = iter(entry.body)
                    break
        else:
            if not stack:
                break
            parent, loop, i = stack.pop()
            if marks is not None and loop.var == dev.mark_var:
                marks.append((t, busy, waited, data_wait, flops, tuple(mine.values()),
                              tuple([getattr(acc, name) for name in MARKED_GM])))
            if i + 1 < loop.count:
                vars[loop.var] = i + 1
                stack.append((parent, loop, i + 1))
                it = iter(loop.body)
            else:
                it = parent

    acc.busy_cycles[f"{cr.kind.value}.{pipe_name}"] += busy * w
    acc.wait_cycles[f"{cr.kind.value}.{pipe_name}"] += waited * w
    if data_wait:
        acc.data_wait_cycles[f"{cr.kind.value}.{pipe_name}"] += data_wait * w
    acc.flops += flops * w
    return t


def start_pipe(dev, kr, cr, pipe, code):
    """The pipe's process, a SimPy process of the generator above (its value: the clock)."""
    return dev.env.process(run_pipe(dev, kr, cr, pipe, code))
