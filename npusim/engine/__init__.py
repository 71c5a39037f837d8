"""The discrete-event model of the device and host (SimPy)."""

from npusim.engine.device import KernelRecord, Owner
from npusim.engine.host import HostWork, Launch, Memcpy, RecordEvent, Synchronize, WaitEvent
from npusim.engine.run import RunResult, Trace, run, simulate
from npusim.engine.stats import KernelStats

__all__ = [
    "HostWork", "KernelRecord", "KernelStats", "Launch", "Memcpy", "Owner", "RecordEvent", "RunResult",
    "Synchronize", "Trace", "WaitEvent", "run", "simulate",
]
