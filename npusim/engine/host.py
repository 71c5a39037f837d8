"""The host and its streams.

A host program is a list of calls, executed in order by one host thread:
- Launch(kernel, stream, mode): the host spends the launch cost (eager or graph
  mode), then the kernel joins the stream's FIFO;
- Memcpy(nbytes, direction, stream): queued on the stream; moves over the PCIe
  link (one link per direction) after its start-up latency;
- RecordEvent(name, stream) / WaitEvent(name, stream): queued on the stream; a
  stream reaching WaitEvent blocks until the latest RecordEvent of that name issued
  before it has been reached by its own stream (or, if none was issued yet, the
  first one issued later) - like aclrtStreamWaitEvent;
- Synchronize(stream): the host blocks until that stream (None: every stream) has
  drained; the blocked time is host wait;
- HostWork(us): host-side compute (framework, sampling on the CPU).

A stream runs its queue in order; a kernel at its head pays its kind's start cost,
then its blocks go to the device. Kernels of different streams overlap when cores
are free.

Host time has its own unit: host costs are configured in µs and enter the
simulated clock as exact (fractional) chip cycles, never rounded to whole cycles -
a host call does not run on the chip clock. So at a 1 kHz clock 30 launches of
1 µs take 30 µs (0.03 cycles), not 30 ms. Device work stays in whole cycles: a
kernel's start cost ends on a clock edge, so its blocks begin at a whole cycle.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Union

import simpy
from attrs import frozen

from npusim.engine.cycles import whole_cycles
from npusim.engine.device import Device, Owner, Reuse
from npusim.engine.flows import Link
from npusim.engine.links import LinkTransfer, SymmetricFabric
from npusim.isa.program import Kernel

LAUNCH_MODES = ("eager", "graph")
MEMCPY_DIRECTIONS = ("h2d", "d2h")


@frozen
class Launch:
    kernel: Kernel
    stream: int = 0
    mode: str = "eager"
    reuse: Reuse | None = None  # the kernel may be replayed from a lone twin (see device.py)
    owner: Owner | None = None  # what it was launched for; its KernelRecord carries it


@frozen
class Memcpy:
    nbytes: int
    direction: str = "h2d"  # or "d2h"
    stream: int = 0


@frozen
class RecordEvent:
    name: str
    stream: int = 0


@frozen
class WaitEvent:
    name: str
    stream: int = 0


@frozen
class Synchronize:
    stream: int | None = None


@frozen
class HostWork:
    us: float
    name: str = "host work"


HostCall = Union[Launch, Memcpy, RecordEvent, WaitEvent, Synchronize, HostWork, LinkTransfer]


@lru_cache(maxsize=1024)
def _us_in_cycles(us: float, freq_hz: float) -> float:
    # the µs value as the decimal the config wrote (its shortest repr), times the clock, in
    # exact arithmetic: 1.12 µs at 1.8 GHz is 2016 cycles, not 2016.0000000002
    return float(Fraction(repr(float(us))) * Fraction(freq_hz) / 1_000_000)


def _host_cycles(us: float, hw) -> float:
    """A host cost configured in µs, in chip cycles: exact, not rounded (see the module doc)."""
    return _us_in_cycles(us, hw.chip.freq_hz)


def host_cost_cycles(call: HostCall, hw) -> float:
    """What a call costs the host thread itself (a synchronize's wait comes on top)."""
    rt = hw.runtime
    if isinstance(call, (Launch, LinkTransfer)):  # a collective's transfer step is a task launched like a kernel
        return _host_cycles(rt.eager_launch_us if call.mode == "eager" else rt.graph_launch_us, hw)
    if isinstance(call, Synchronize):
        return _host_cycles(rt.synchronize_us, hw)
    if isinstance(call, HostWork):
        return _host_cycles(call.us, hw)
    return _host_cycles(rt.event_us, hw)  # Memcpy, RecordEvent, WaitEvent: one API call


class _Stream:
    def __init__(self, env: simpy.Environment, index: int):
        self.index = index
        self.queue = simpy.Store(env)
        self.outstanding = 0
        self.drained = env.event()
        self.drained.succeed()


class _Event:
    """One named event: its record instances, in the order the host issued them."""

    def __init__(self):
        self.records: list[simpy.Event] = []
        self.first: simpy.Event | None = None  # for a wait issued before any record


class Host:
    def __init__(self, env: simpy.Environment, device: Device):
        self.env = env
        self.device = device
        hw = device.hw
        self.hw = hw
        self.streams: dict[int, _Stream] = {}
        self.events: dict[str, _Event] = {}
        self.pcie = {d: Link(env, f"PCIe {d}", hw.pcie_bytes_per_cycle) for d in MEMCPY_DIRECTIONS}
        self.launch_cycles = 0.0
        self.wait_cycles = 0.0
        self.done = False
        self.end = 0.0  # when the host program and all its stream work had finished
        # where LinkTransfers flow: transfer(call, queued) -> generator returning the record;
        # one device with mirrored peers unless the caller wires several (engine.links)
        self.fabric = None

    def cycles(self, us: float) -> float:
        return _host_cycles(us, self.hw)

    def _stream(self, index: int) -> _Stream:
        s = self.streams.get(index)
        if s is None:
            s = self.streams[index] = _Stream(self.env, index)
            self.env.process(self._run_stream(s))
        return s

    def _span(self, track: str, name: str, start: float, end: float) -> None:
        self.device.tracer.host_spans.append((track, name, start, end))

    # ---------------------------------------------------------------- the host thread

    def run(self, calls: list[HostCall]):
        env = self.env
        for call in calls:
            start = env.now
            cls = call.__class__
            cost = host_cost_cycles(call, self.hw)
            if cls is Launch or cls is LinkTransfer:
                yield env.timeout(cost)
                self.launch_cycles += cost
                self._span("host", f"launch {call.kernel.name if cls is Launch else call.name}", start, env.now)
                self._enqueue(call.stream, call)
            elif cls is Synchronize:
                yield env.timeout(cost)
                targets = list(self.streams.values()) if call.stream is None else [self._stream(call.stream)]
                wait_from = env.now
                for s in targets:
                    if not s.drained.triggered:
                        self.device.blocked[("host", "synchronize")] = f"synchronize on stream {s.index}"
                        yield s.drained
                        del self.device.blocked[("host", "synchronize")]
                self.wait_cycles += env.now - wait_from
                self._span("host", "synchronize", start, env.now)
            elif cls is HostWork:
                yield env.timeout(cost)
                self._span("host", call.name, start, env.now)
            else:  # Memcpy, RecordEvent, WaitEvent: an API call, then queued on the stream
                yield env.timeout(cost)
                self._span("host", call.__class__.__name__, start, env.now)
                if cls is RecordEvent:
                    ev = self.events.setdefault(call.name, _Event())
                    instance = env.event()
                    if ev.first is not None and not ev.records:
                        instance = ev.first
                    ev.records.append(instance)
                    call = (call, instance)
                elif cls is WaitEvent:
                    ev = self.events.setdefault(call.name, _Event())
                    if ev.records:
                        target = ev.records[-1]
                    else:
                        ev.first = ev.first or env.event()
                        target = ev.first
                    call = (call, target)
                self._enqueue(call[0].stream if isinstance(call, tuple) else call.stream, call)
        self.done = True
        self.end = max(self.end, env.now)

    def _enqueue(self, stream: int, item) -> None:
        s = self._stream(stream)
        if s.outstanding == 0:
            s.drained = self.env.event()
        s.outstanding += 1
        s.queue.put(item)

    # ---------------------------------------------------------------- streams

    def _run_stream(self, s: _Stream):
        env, rt = self.env, self.hw.runtime
        track = f"stream {s.index}"
        while True:
            item = yield s.queue.get()
            start = env.now
            if isinstance(item, Launch):
                # the start cost is device time: the kernel's blocks begin on a clock edge
                begin = whole_cycles(env.now + rt.kernel_start_cycles(item.kernel.core_type.value))
                yield env.timeout(begin - env.now)
                yield self.device.run_kernel(item.kernel, s.index, start, item.reuse, item.owner)
                self._span(track, item.kernel.name, start, env.now)
            elif isinstance(item, LinkTransfer):
                if self.fabric is None:
                    self.fabric = SymmetricFabric(env, self.device)
                yield env.process(self.fabric.transfer(item, start))
                self._span(track, item.name, start, env.now)
            elif isinstance(item, Memcpy):
                yield env.timeout(self.cycles(rt.memcpy_startup_us))
                done = env.event()
                self.pcie[item.direction].add(item.nbytes, math.inf, done.succeed)
                yield done
                self._span(track, f"memcpy {item.direction}", start, env.now)
            else:
                call, target = item
                if isinstance(call, RecordEvent):
                    if not target.triggered:
                        target.succeed(env.now)
                    self._span(track, f"record {call.name}", start, env.now)
                else:
                    if not target.triggered:
                        self.device.blocked[(track, "wait")] = f"WaitEvent '{call.name}'"
                        yield target
                        del self.device.blocked[(track, "wait")]
                    self._span(track, f"wait {call.name}", start, env.now)
            s.outstanding -= 1
            self.end = max(self.end, env.now)
            if s.outstanding == 0:
                s.drained.succeed()
