"""Per-kernel statistics (summable frozen records) and the tracer that records
instruction intervals, block and host spans during a run."""

from __future__ import annotations

from collections import defaultdict

from attrs import field, frozen

_SUMMED_NUMBERS = (
    "instructions", "flops", "gm_read_bytes", "gm_write_bytes", "hbm_read_bytes",
    "hbm_write_bytes", "l2_hit_bytes", "l2_miss_bytes", "wasted_burst_bytes",
    "misaligned_segments", "dma_segments",
)
_SUMMED_DICTS = ("busy_cycles", "wait_cycles", "data_wait_cycles", "core_cycles", "local_bytes")


@frozen
class KernelStats:
    """What one kernel (or, summed, a run) did. Bytes moved count burst rounding.

    busy_cycles / wait_cycles: per "CORE.PIPE" (e.g. "AIV.MTE2"), summed over cores;
    wait is time a pipe spent blocked on a flag, barrier or cross-core flag.
    data_wait_cycles: the part of a data mover's busy time beyond what its transfers
    take alone (start-up + bytes at its core's port rate): waiting for bandwidth
    shared with other transfers, or for HBM behind an L2 miss.
    core_cycles: per core type, block residency summed over cores (the denominator
    of pipe utilisation). local_bytes: bytes written into each local buffer."""

    cycles: float = 0.0
    instructions: int = 0
    flops: float = 0.0
    gm_read_bytes: float = 0.0
    gm_write_bytes: float = 0.0
    hbm_read_bytes: float = 0.0
    hbm_write_bytes: float = 0.0
    l2_hit_bytes: float = 0.0
    l2_miss_bytes: float = 0.0
    wasted_burst_bytes: float = 0.0
    misaligned_segments: int = 0
    dma_segments: int = 0
    busy_cycles: dict = field(factory=dict)
    wait_cycles: dict = field(factory=dict)
    data_wait_cycles: dict = field(factory=dict)
    core_cycles: dict = field(factory=dict)
    local_bytes: dict = field(factory=dict)

    def __add__(self, other: KernelStats) -> KernelStats:
        kw = {"cycles": self.cycles + other.cycles}
        for name in _SUMMED_NUMBERS:
            kw[name] = getattr(self, name) + getattr(other, name)
        for name in _SUMMED_DICTS:
            merged = dict(getattr(self, name))
            for k, v in getattr(other, name).items():
                merged[k] = merged.get(k, 0) + v
            kw[name] = dict(sorted(merged.items()))
        return KernelStats(**kw)

    @property
    def l2_hit_rate(self) -> float:
        total = self.l2_hit_bytes + self.l2_miss_bytes
        return self.l2_hit_bytes / total if total else 0.0

    @property
    def gm_bytes(self) -> float:
        return self.gm_read_bytes + self.gm_write_bytes

    def utilisation(self, core_pipe: str) -> float:
        """Busy fraction of a pipe ("AIC.M", "AIV.V", ...) over the cycles its cores held blocks."""
        core = core_pipe.split(".")[0]
        denom = self.core_cycles.get(core, 0)
        return self.busy_cycles.get(core_pipe, 0) / denom if denom else 0.0


class StatsAccumulator:
    """Mutable counters a running kernel adds into; frozen into KernelStats at its end."""

    def __init__(self):
        for name in _SUMMED_NUMBERS:
            setattr(self, name, 0)
        for name in _SUMMED_DICTS:
            setattr(self, name, defaultdict(float))

    def freeze(self, cycles: float) -> KernelStats:
        kw = {name: getattr(self, name) for name in _SUMMED_NUMBERS}
        for name in _SUMMED_DICTS:
            kw[name] = dict(sorted(getattr(self, name).items()))
        return KernelStats(cycles=cycles, **kw)


TRACE_LEVELS = ("kernel", "block", "instr")


class Tracer:
    """Collects what a run did, at the chosen level of detail:
    kernel (kernel, host and stream spans, link bandwidth), block (+ block spans
    per core), instr (+ every instruction interval per core and pipe)."""

    def __init__(self, level: str = "instr"):
        if level not in TRACE_LEVELS:
            raise ValueError(f"trace level: expected one of {', '.join(TRACE_LEVELS)}, got {level!r}")
        self.level = level
        self.instr = level == "instr"
        self.block = level in ("block", "instr")
        self.intervals: list[tuple] = []  # (core, pipe, name, start, end, kernel id)
        self.block_spans: list[tuple] = []  # (core, kernel name, block, start, end, kernel id)
        self.host_spans: list[tuple] = []  # (track, name, start, end)
