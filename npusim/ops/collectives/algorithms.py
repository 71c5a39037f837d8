"""Collective algorithms as HCCL runs them: which one a group uses, and its steps.

A collective on p ranks moves a buffer of n bytes (all_reduce: in and out;
reduce_scatter: the input, each rank keeps n/p; all_gather: the output, each rank
gives n/p; all_to_all: each rank's buffer, n/p to each rank; send_recv: each rank
sends its whole buffer to the next rank and receives the previous one's, as the
stages of a pipeline hand over their activations). Its plan is a list of steps,
the same on every rank (the ranks are symmetric):
- Send(nbytes, peers): send nbytes to each peer (rank offsets) and receive as much
  from the mirrored ones - one transfer step on the links (engine.links);
- Reduce(inputs): add `inputs` chunks of n/p elements into the rank's output chunk,
  one vector kernel (the rank's own chunk and what arrived);
- Copy: the rank's own chunk from input to output (all_gather, all_to_all), one
  vector kernel.

Mesh (a full mesh inside a node; CANN HCCL user guide, "Mesh", hcclug_000116):
every rank exchanges with all others at once over its p-1 links.
  all_reduce = reduce_scatter + all_gather: 2 alpha + (2/p) n beta + ((p-1)/p) n gamma
Ring (hcclug_000117): each rank sends to its right neighbour and receives from its
left one, p-1 steps per phase, a reduction after each step of a reduce phase.
  all_reduce: 2 (p-1) alpha + 2 ((p-1)/p) n beta + ((p-1)/p) n gamma
alpha: a step's start-up, beta: seconds per byte on one link, gamma: seconds per byte
reduced on the device. HCCL picks Mesh inside a fully meshed server and Ring (among
others) between servers (hcclug_000114); `pick` does the same. send_recv (HcclSend /
HcclRecv) is one point-to-point step, over the link to the next rank or the NIC:
  alpha + n beta
"""

from __future__ import annotations

from attrs import frozen

from npusim.errors import ConfigError
from npusim.hw import HwConfig

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")
ALGOS = ("auto", "mesh", "ring", "p2p")


@frozen
class Send:
    nbytes: int
    peers: tuple[int, ...]
    inter_node: bool = False


@frozen
class Reduce:
    inputs: int  # chunks summed into the output chunk (the rank's own among them)


@frozen
class Copy:
    """The rank's own chunk, input -> output."""


def pick(kind: str, devices: int, algo: str, hw: HwConfig) -> str:
    """The algorithm a group of `devices` uses: `algo` if named (and possible), else HCCL's
    choice - Mesh inside one fully meshed node, Ring otherwise."""
    topo = hw.topology
    where = f"{kind}: "
    if kind not in KINDS:
        raise ConfigError(f"collective: unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    if algo not in ALGOS:
        raise ConfigError(f"{where}algo must be one of {', '.join(ALGOS)}, got {algo!r}")
    if devices < 2:
        raise ConfigError(f"{where}devices must be at least 2, got {devices}")
    if devices > topo.max_devices:
        raise ConfigError(f"{where}{devices} devices, but the topology has {topo.size_text()}")
    if kind == "send_recv":
        if algo not in ("auto", "p2p"):
            raise ConfigError(f"{where}one point-to-point step: algo must be auto or p2p, got {algo!r}")
        return "p2p"
    if algo == "p2p":
        raise ConfigError(f"{where}algo p2p is send_recv's; expected mesh, ring or auto")
    meshed = devices <= topo.node_device_count and topo.intra_node == "full_mesh"
    if algo == "auto":
        algo = "mesh" if meshed else "ring"
    if algo == "mesh" and not meshed:
        raise ConfigError(f"{where}algo mesh needs every rank wired to every other: {devices} devices in a "
                          f"{topo.intra_node} of {topo.node_device_count} per node")
    if kind == "all_to_all" and algo != "mesh":
        raise ConfigError(f"{where}only the mesh algorithm is modelled (pairwise exchange in a full mesh)")
    return algo


def steps(kind: str, algo: str, nbytes: int, devices: int, hw: HwConfig) -> tuple:
    """The steps of one rank (see the module doc); `nbytes` is the buffer size n."""
    p = devices
    chunk = -(-nbytes // p)
    inter = devices > hw.topology.node_device_count
    # assumption: a ring spanning nodes runs at the pace of its slowest hop, the NIC
    if kind == "send_recv":  # assumption: the next rank sits across the NIC when the group spans nodes
        return (Send(nbytes, (1,), inter),)
    if algo == "mesh":
        send = Send(chunk, tuple(range(1, p)))
        return {"all_reduce": (send, Reduce(p), send),
                "reduce_scatter": (send, Reduce(p)),
                "all_gather": (Copy(), send),
                "all_to_all": (Copy(), send)}[kind]
    hop = Send(chunk, (1,), inter)
    reduce_phase = tuple(s for _ in range(p - 1) for s in (hop, Reduce(2)))
    gather_phase = (hop,) * (p - 1)
    return {"all_reduce": reduce_phase + gather_phase,
            "reduce_scatter": reduce_phase,
            "all_gather": (Copy(),) + gather_phase}[kind]


def formula_us(kind: str, algo: str, nbytes: int, devices: int, hw: HwConfig) -> float:
    """The alpha-beta-gamma cost of the HCCL user guide, in µs: what the simulated
    collective is checked against for large messages. gamma: a reduction streams two
    inputs and one output through HBM per byte reduced.
    # assumption: the reduction is HBM bound (3 bytes of HBM traffic per byte)."""
    topo = hw.topology
    p, n = devices, nbytes
    inter = devices > topo.node_device_count
    alpha = (topo.nic_latency_us if inter else topo.link_latency_us) * 1e-6
    beta = 1 / (topo.nic_bw_bytes_per_s if inter else topo.link_bw_bytes_per_s)
    gamma = 3 / (hw.hbm.peak_bw_bytes_per_s * hw.hbm.bw_efficiency)
    sent = [s.nbytes for s in steps(kind, algo, nbytes, devices, hw) if isinstance(s, Send)]
    reduced = {"all_reduce": (p - 1) / p * n, "reduce_scatter": (p - 1) / p * n}.get(kind, 0.0)
    return (len(sent) * alpha + sum(sent) * beta + reduced * gamma) * 1e6
