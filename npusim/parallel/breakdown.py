"""Where a device's step time goes under a parallel plan: compute, communication, and
the communication nothing hides (exposed), and how busy its links were.

Communication is every record of a collective (its transfer steps and its reduction
or copy kernels); compute is every other kernel. Times are unions of intervals on
the device's timeline, so work overlapping on two streams counts once.
"""

from __future__ import annotations

from attrs import frozen

from npusim.engine.links import HCCS, NIC
from npusim.ops.collectives import KINDS
from npusim.parallel.plan import graph_plan
from npusim.runtime.run import GraphRun


@frozen
class CommBreakdown:
    devices: int
    latency_us: float
    compute_us: float  # kernels other than collectives, as a union of intervals
    comm_us: float  # collectives' transfers and kernels, as a union of intervals
    exposed_us: float  # communication while no compute kernel runs
    link_bytes: float  # bytes this device sent over its links
    link_capacity_bytes_per_s: float  # all its HCCS links, one direction

    @property
    def comm_share(self) -> float:
        return self.comm_us / self.latency_us if self.latency_us else 0.0

    @property
    def link_utilisation(self) -> float:
        """Bytes sent over the step's time at the links' full rate."""
        cap = self.link_capacity_bytes_per_s * self.latency_us * 1e-6
        return self.link_bytes / cap if cap else 0.0

    def as_json(self) -> dict:
        return {"devices": self.devices, "compute_us": self.compute_us, "comm_us": self.comm_us,
                "comm_share": self.comm_share, "exposed_comm_us": self.exposed_us, "link_bytes": self.link_bytes,
                "link_utilisation": self.link_utilisation}

    def line(self) -> str:
        return (f"devices {self.devices} (one simulated, peers symmetric): compute {self.compute_us:.1f} us, "
                f"communication {self.comm_us:.1f} us ({100 * self.comm_share:.1f}% of the step), exposed "
                f"{self.exposed_us:.1f} us; links {100 * self.link_utilisation:.2f}% used")


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _length(spans) -> float:
    return sum(hi - lo for lo, hi in spans)


def _overlap(a, b) -> float:
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def comm_breakdown(run: GraphRun) -> CommBreakdown:
    hw = run.hw
    recs = run.result.kernels
    comm = _union([(r.start, r.end) for r in recs if r.op_type in KINDS])
    compute = _union([(r.start, r.end) for r in recs if r.op_type not in KINDS])
    sent = sum(r.stats.hbm_read_bytes for r in recs if r.core_type in (HCCS, NIC))  # a transfer reads what it sends
    topo = hw.topology
    return CommBreakdown(graph_plan(run.graph).world, run.latency_us, hw.us(_length(compute)), hw.us(_length(comm)),
                         hw.us(_length(comm) - _overlap(comm, compute)), sent,
                         topo.links_per_device * topo.link_bw_bytes_per_s)


def plan_json(run: GraphRun) -> dict:
    """A JSON report's plan (its degrees, devices, the device simulated) and communication."""
    return {"plan": graph_plan(run.graph).as_json(), "communication": comm_breakdown(run).as_json()}
