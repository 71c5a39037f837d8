"""Links between devices: one step of a collective as a host call, and the fabric it flows on.

A LinkTransfer is queued on a stream like a kernel: when it reaches the stream's
head the device sends `nbytes` to each of its peers (rank offsets: rank r sends to
r + o and receives from r - o) and the step ends when everything it sends and
everything it receives has arrived. Its bytes are flows on the engine's flow model
(flows.Link): on the HCCS links (or the NIC between nodes) and on the HBM of each
end, so a transfer that overlaps a kernel shares HBM bandwidth with it.
# assumption: transfers read and write HBM directly (SDMA), not through the L2.
# assumption: one transfer step costs a fixed start-up (topology.link_latency_us or
# nic_latency_us, alpha in the cost formulas) before its bytes flow.

Two fabrics:
- SymmetricFabric simulates one device. Its peers are assumed identical and in
  step (the ranks of a tensor-parallel group run the same program), so in every
  step what it sends each peer it also receives from one: its links carry its own
  bytes out (each direction of a link is independent) and its HBM carries them
  out (read) and in (write). Full mesh: one link per peer, each flow capped at a
  link's rate; the links of a device together are one Link of that many times the
  rate.
- FullFabric simulates every rank: a Link per direction of every wired pair and a
  device (with its own HBM) per rank; a step waits for what its peers send it, so
  ranks out of step wait for each other.
"""

from __future__ import annotations

import math

import simpy
from attrs import frozen

from npusim.engine.cycles import whole_cycles
from npusim.engine.device import Device, KernelRecord, Owner
from npusim.engine.flows import Link
from npusim.engine.stats import KernelStats
from npusim.errors import ProgramError

# KernelRecord.core_type of a transfer step (reports show it as the task type)
HCCS, NIC = "HCCS", "NIC"


@frozen
class LinkTransfer:
    """Host call: one transfer step of a collective (see the module doc). `nbytes` go to
    each peer in `peers` (offsets within the `group` ranks of the collective) and as
    many come back from the mirrored ones; `inter_node`: over the NIC, not HCCS."""

    name: str
    op_type: str
    nbytes: int
    peers: tuple[int, ...]
    group: int
    inter_node: bool = False
    stream: int = 0
    mode: str = "eager"
    owner: Owner | None = None
    gm: tuple = ()  # no GM tensors of a kernel (code walking kernels' operands sees none)

    def check(self) -> str | None:
        """What is wrong with the call, or None."""
        if self.nbytes < 0 or self.group < 2 or not self.peers:
            return f"expected nbytes >= 0, group >= 2 and peers, got {self.nbytes}, {self.group}, {self.peers}"
        if any(not 0 < o < self.group for o in self.peers) or len(set(self.peers)) != len(self.peers):
            return f"peers must be distinct offsets 1 .. {self.group - 1}, got {self.peers}"
        return None


def _record(device: Device, t: LinkTransfer, queued: float, start: float, nbytes_out: float) -> KernelRecord:
    """The transfer's record, numbered among the device's kernels. Its stats count the
    HBM bytes it moved on this device (sent: read, received: written)."""
    kid = device._next_id
    device._next_id += 1
    stats = KernelStats(cycles=device.env.now - start, hbm_read_bytes=nbytes_out, hbm_write_bytes=nbytes_out)
    rec = KernelRecord(kid, t.name, t.op_type, NIC if t.inter_node else HCCS, len(t.peers), t.stream, queued,
                       start, device.env.now, stats, t.owner)
    device.records.append(rec)
    return rec


class _Busy:
    """Marks the device busy while a transfer runs: a kernel overlapping it is not
    'alone', so it is never taken as the pattern of a replay (device.Reuse)."""

    alone = False


def _alpha(hw, t: LinkTransfer) -> int:
    us = hw.topology.nic_latency_us if t.inter_node else hw.topology.link_latency_us
    return whole_cycles(hw.cycles(us * 1e-6))


def _all_done(env: simpy.Environment, n: int) -> tuple[simpy.Event, callable]:
    """An event that fires after `n` calls of the returned callback."""
    ev = env.event()
    left = [n]

    def one() -> None:
        left[0] -= 1
        if not left[0]:
            ev.succeed()

    if n == 0:
        ev.succeed()
    return ev, one


class SymmetricFabric:
    """One simulated device, its peers mirrored (see the module doc)."""

    def __init__(self, env: simpy.Environment, device: Device):
        self.env, self.device = env, device
        topo = device.hw.topology
        f = device.hw.chip.freq_hz
        self.link_cap = topo.link_bw_bytes_per_s / f
        self.hccs = Link(env, HCCS, topo.links_per_device * self.link_cap)
        self.nic = Link(env, NIC, topo.nic_bw_bytes_per_s / f)

    @property
    def links(self) -> tuple[Link, ...]:
        return self.hccs, self.nic

    def transfer(self, t: LinkTransfer, queued: float):
        env, dev = self.env, self.device
        busy = _Busy()
        for other in dev.active:
            other.alone = False
        dev.active.append(busy)
        start = env.now
        yield env.timeout(_alpha(dev.hw, t))
        w = len(t.peers)
        if t.nbytes:
            done, one = _all_done(env, 2)
            link, cap = (self.nic, math.inf) if t.inter_node else (self.hccs, self.link_cap)
            link.add(t.nbytes, cap, one, w)
            # what it sends is read from its HBM, what it receives is written to it, at the link's pace
            dev.memory.hbm.add(2 * t.nbytes, 2 * cap, one, w)
            yield done
        dev.active.remove(busy)
        return _record(dev, t, queued, start, float(t.nbytes * w))


class FullFabric:
    """Every rank simulated: `devices[r]` is rank r; a Link per direction of every wired
    pair (HCCS inside a node of `node_device_count`, the NICs between nodes).
    # assumption (FullFabric only): a pair across nodes gets a NIC's rate of its own;
    # the flows of one card's NIC to several cards do not share it."""

    def __init__(self, env: simpy.Environment, devices: list[Device]):
        self.env, self.devices = env, devices
        hw = devices[0].hw
        topo = hw.topology
        f = hw.chip.freq_hz
        self.link_cap = topo.link_bw_bytes_per_s / f
        self.per_node = topo.node_device_count
        p = len(devices)
        self.pairs: dict[tuple[int, int], Link] = {}
        for i in range(p):
            for j in range(p):
                if i != j and (i // self.per_node != j // self.per_node or self._wired(i, j, topo)):
                    inter = i // self.per_node != j // self.per_node
                    self.pairs[i, j] = Link(env, f"{NIC if inter else HCCS} {i}->{j}",
                                            (topo.nic_bw_bytes_per_s / f) if inter else self.link_cap)
        self.steps = [0] * p
        self.arrived: dict[tuple[int, int, int], simpy.Event] = {}

    def _wired(self, i: int, j: int, topo) -> bool:
        if topo.intra_node == "full_mesh":
            return True
        n = min(self.per_node, len(self.devices))
        return (j - i) % n in (1, n - 1)

    @property
    def links(self) -> tuple[Link, ...]:
        return tuple(self.pairs.values())

    def _arrival(self, src: int, dst: int, step: int) -> simpy.Event:
        key = (src, dst, step)
        if key not in self.arrived:
            self.arrived[key] = self.env.event()
        return self.arrived[key]

    def transfer(self, rank: int, t: LinkTransfer, queued: float):
        env, p = self.env, len(self.devices)
        if t.group != p:
            raise ProgramError(f"{t.name}: a group of {t.group} ranks, but {p} are simulated")
        dev = self.devices[rank]
        step = self.steps[rank]
        self.steps[rank] += 1
        start = env.now
        yield env.timeout(_alpha(dev.hw, t))
        sends = []
        for o in t.peers:
            j = (rank + o) % p
            link = self.pairs.get((rank, j))
            if link is None:
                raise ProgramError(f"{t.name}: rank {rank} has no link to rank {j} in a "
                                   f"{dev.hw.topology.intra_node} topology")
            arrived = self._arrival(rank, j, step)
            done, one = _all_done(env, 3)
            done.callbacks.append(lambda _ev, a=arrived: a.succeed())
            link.add(t.nbytes, math.inf, one)
            dev.memory.hbm.add(t.nbytes, link.capacity, one)
            self.devices[j].memory.hbm.add(t.nbytes, link.capacity, one)
            sends.append(done)
        receives = [self._arrival((rank - o) % p, rank, step) for o in t.peers]
        yield env.all_of(sends + receives)
        return _record(dev, t, queued, start, float(t.nbytes * len(t.peers)))
