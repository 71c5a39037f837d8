"""Run one lowered operator on the engine and place it against its roofline."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
from attrs import frozen

from npusim.engine import Launch, RunResult, Synchronize, run
from npusim.engine.device import KernelRecord
from npusim.engine.stats import KernelStats
from npusim.errors import ConfigError
from npusim.hw import HwConfig
from npusim.hw.parse import short
from npusim.hw.derived import cube_peak_flops_per_s, vector_peak_ops_per_s
from npusim.isa.program import DTYPE_BYTES
from npusim.ops.registry import Lowered

# An op whose busiest pipe is busy less than this fraction of the time is called
# latency-bound: start-ups, synchronisation and pipeline fill dominate it.
LATENCY_BOUND_FRACTION = 0.5
COMPUTE_UNITS = {"M": "cube", "V": "vector"}  # pipe -> the compute unit it is


def link_utilisation(stats: KernelStats, hw: HwConfig, cycles: float) -> dict[str, float]:
    """Fraction of each memory link's bandwidth used over `cycles`: HBM (read + write
    bytes over its sustained bandwidth, peak x efficiency) and L2 (GM bytes, which all
    pass through the L2, over its bandwidth)."""
    seconds = hw.us(cycles) * 1e-6
    if seconds <= 0:
        return {"HBM": 0.0, "L2": 0.0}
    hbm = (stats.hbm_read_bytes + stats.hbm_write_bytes) / (hw.hbm.peak_bw_bytes_per_s * hw.hbm.bw_efficiency)
    return {"HBM": hbm / seconds, "L2": stats.gm_bytes / hw.l2.bw_bytes_per_s / seconds}


def bound_of(stats: KernelStats, hw: HwConfig, cycles: float) -> str:
    """What bounds a kernel (or an op) that ran for `cycles`, by its busiest pipe
    (busy = working + waiting for data, over its cores' residency):
    - "latency": no pipe is busy LATENCY_BOUND_FRACTION of the time (start-ups,
      synchronisation and pipeline fill dominate);
    - "cube" / "vector": the busiest pipe is that compute unit;
    - "HBM" / "L2": the busiest pipe moves data and spends more of its time waiting
      for data than working; the link named is the one using the larger fraction of
      its bandwidth over `cycles`;
    - the pipe itself ("AIC.MTE2", ...): it moves data and its own work (DMA
      start-ups and port rate) dominates, the links are not what holds it back."""
    util = {p: stats.utilisation(p) for p in stats.busy_cycles}
    if not util or max(util.values()) < LATENCY_BOUND_FRACTION:
        return "latency"
    busiest = max(sorted(util), key=util.get)
    pipe = busiest.split(".")[1]
    if pipe in COMPUTE_UNITS:
        return COMPUTE_UNITS[pipe]
    data = stats.data_wait_cycles.get(busiest, 0.0)
    if data >= stats.busy_cycles[busiest] - data:
        links = link_utilisation(stats, hw, cycles)
        return max(sorted(links), key=links.get)
    return busiest


def peak_flops_per_s(lowered: Lowered, hw: HwConfig) -> float:
    """Peak of the unit the op's FLOPs run on, at its input dtype."""
    dtype = lowered.inputs[0].dtype if lowered.inputs else "fp16"
    if lowered.unit == "cube":
        return cube_peak_flops_per_s(hw, dtype if dtype in hw.aic.mmad_fractals else "fp16")
    return vector_peak_ops_per_s(hw, DTYPE_BYTES[dtype])


def hbm_floor_bytes(lowered: Lowered, hw: HwConfig) -> float:
    """Least HBM traffic possible from a cold L2: every input byte the op needs is read
    once (an op may need less than its inputs hold - the weights of an expert no token
    was routed to - which its minimum GM bytes say), and written bytes beyond what the
    write-back L2 can hold must reach HBM."""
    writes = sum(t.nbytes for t in lowered.outputs)
    reads = min(sum(t.nbytes for t in lowered.inputs), lowered.min_gm_bytes - writes)
    return reads + max(0, writes - hw.l2.l2_bytes)


@frozen
class Roofline:
    compute_s: float  # FLOPs / peak of the unit
    hbm_s: float  # HBM floor bytes / sustained HBM bandwidth
    l2_s: float  # minimum GM bytes / L2 bandwidth

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.hbm_s, self.l2_s)


def roofline(lowered: Lowered, hw: HwConfig) -> Roofline:
    return Roofline(
        compute_s=lowered.flops / peak_flops_per_s(lowered, hw),
        hbm_s=hbm_floor_bytes(lowered, hw) / (hw.hbm.peak_bw_bytes_per_s * hw.hbm.bw_efficiency),
        l2_s=lowered.min_gm_bytes / hw.l2.bw_bytes_per_s,
    )


@frozen
class OpReport:
    """One operator as simulated: time, throughput, bound and pipe utilisation."""

    lowered: Lowered
    run: RunResult
    cycles: float  # the op time: first kernel reaching its stream's head (incl. its start cost) to last kernel end
    stats: KernelStats
    roofline: Roofline

    @property
    def hw(self) -> HwConfig:
        return self.run.hw

    @property
    def us(self) -> float:
        return self.hw.us(self.cycles)

    @property
    def seconds(self) -> float:
        return self.us * 1e-6

    @property
    def tflops(self) -> float:
        return self.lowered.flops / self.seconds / 1e12

    @property
    def gm_bw_bytes_per_s(self) -> float:
        return self.stats.gm_bytes / self.seconds

    @property
    def hbm_bw_bytes_per_s(self) -> float:
        return (self.stats.hbm_read_bytes + self.stats.hbm_write_bytes) / self.seconds

    @property
    def longest(self) -> KernelRecord:
        """The kernel that takes most of the op's time (the first of equals)."""
        return max(self.run.kernels, key=lambda k: (k.cycles, -k.id))

    @property
    def bound(self) -> str:
        """What bounds the op: "latency" if kernel start costs and waits for the
        host's launches take LATENCY_BOUND_FRACTION of its time, else what bounds its
        longest kernel (see bound_of). Pipe utilisations are fractions of their
        cores' residency, so a short kernel on other cores (a zero fill before a
        split-K matmul) must not decide it."""
        if self.start_cycles + self.host_gap_cycles >= LATENCY_BOUND_FRACTION * self.cycles:
            return "latency"
        k = self.longest
        return bound_of(k.stats, self.hw, k.cycles)

    @property
    def start_cycles(self) -> float:
        """Kernel start costs: for each kernel, from reaching its stream's head to starting."""
        return sum(k.start - k.queued for k in self.run.kernels)

    @property
    def kernel_cycles(self) -> float:
        """The kernels' own run times, summed (ops[].duration_us in the JSON)."""
        return sum(k.cycles for k in self.run.kernels)

    @property
    def host_gap_cycles(self) -> float:
        """The rest of the op time: a kernel's stream idle until the host launched it."""
        return self.cycles - self.start_cycles - self.kernel_cycles

    def utilisation(self) -> dict[str, float]:
        """Busy fraction of every pipe that did work, over the cycles its cores held blocks."""
        return {p: self.stats.utilisation(p) for p in sorted(self.stats.busy_cycles)}


def _first_difference(a, b, path: str = "") -> str:
    """The first field in which two configs (attrs records, mappings inside) differ, as
    `key (X, then Y)`; "" when they are equal."""
    if attrs.has(type(a)) and type(a) is type(b):
        keys, get = [f.name for f in attrs.fields(type(a))], getattr
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        keys, get = sorted(set(a) | set(b), key=str), lambda m, k: m.get(k)
    else:
        return "" if a == b else f"{path.rstrip('.')} ({short(a)}, then {short(b)})"
    for key in keys:
        found = _first_difference(get(a, key), get(b, key), f"{path}{key}.")
        if found:
            return found
    return ""


def simulate_op(lowered: Lowered, hw: HwConfig, trace: str = "instr", counters: bool = True,
                exact: bool = True) -> OpReport:
    """Launch the op's kernels in order on one stream (graph mode) and synchronize.
    counters=False: no bandwidth samples in the trace (engine.run; only a Chrome trace shows them).
    exact=True: no kernel fast-forwarded (engine.run)."""
    if not isinstance(lowered, Lowered):
        raise TypeError(f"simulate_op: lowered: expected what npusim.ops.lower returns (a Lowered), got {short(lowered)}")
    if not isinstance(hw, HwConfig):
        raise TypeError(f"simulate_op: hw: expected an HwConfig (npusim.load_hw(name)), got {short(hw)}")
    if lowered.hw is not None and lowered.hw is not hw and lowered.hw != hw:
        raise ConfigError(f"simulate_op: op {lowered.op_type} was lowered for hw '{lowered.hw.name}' and is simulated "
                          f"on '{hw.name}', which differs in {_first_difference(lowered.hw, hw)}: lower it with the "
                          f"hw it runs on")
    calls = [Launch(k, 0, "graph") for k in lowered.kernels] + [Synchronize()]
    result = run(calls, hw, trace, counters=counters, exact=exact)
    ks = result.kernels
    stats = sum((k.stats for k in ks), KernelStats())
    return OpReport(lowered, result, ks[-1].end - ks[0].queued, stats, roofline(lowered, hw))
