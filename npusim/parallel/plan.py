"""A parallel plan: how many devices a step runs on and how the decoder is split.

Tensor parallel (Megatron style): each of `tp` devices holds 1/tp of the heads, the
K/V heads (and their KV cache) and the FFN columns; an all_reduce after the O and
down projections sums the partial outputs (graph.build_decoder(tp=...)).
Sequence parallel (prefill): each of `sp` devices holds 1/sp of every prompt's
tokens and all_gathers each layer's K and V (graph.build_decoder(sp=...)); each
keeps the whole KV cache of its K/V heads. Expert parallel (a MoE decoder): each of
`ep` devices runs its own batch's attention (data parallel; with `tp`, ep / tp
tensor-parallel groups, each its own batch) and holds experts / ep of every MoE
layer's experts; all_to_alls send each token's rows to its experts' devices and back
(graph.build_decoder(ep=...)); the device simulated is, layer by layer, the one whose
experts receive the most rows. The
devices are symmetric: one is simulated, its collectives' peers are assumed to run
the same program (engine.links.SymmetricFabric; tests/test_parallel.py checks this
against simulating every rank).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from attrs import frozen

from npusim.errors import ConfigError
from npusim.graph.build import check_ep, check_tp, shard_weight_shapes
from npusim.hw import HwConfig
from npusim.workload import Workload


# The plan axis each collective of the decoder spans: graph.build_decoder puts an
# all_reduce over the tensor-parallel group, an all_gather over the sequence-parallel one
# (with expert parallelism, where sp is 1: over the tensor-parallel group, gathering
# the MoE layer's shares), all_to_alls over the expert-parallel one.
GROUP_AXIS = {"all_reduce": "tp", "all_gather": "sp", "all_to_all": "ep"}


def group_axis(kind: str, ep: int) -> str | None:
    """The plan axis a collective of `kind` spans in a plan with expert parallelism `ep`."""
    return "tp" if kind == "all_gather" and ep > 1 else GROUP_AXIS.get(kind)


@frozen
class Plan:
    """Devices are numbered part x tp + t: rank t of the tensor-parallel group of part
    `part` of the prompt (a tensor-parallel group is contiguous, inside one node)."""

    tp: int = 1
    sp: int = 1
    devices: int | None = None  # None: tp x sp, or ep
    ep: int = 1  # expert parallel over every device, attention data parallel (in tensor-parallel groups of tp)

    @property
    def world(self) -> int:
        if self.devices is not None:
            return self.devices
        return self.ep if self.ep > 1 else self.tp * self.sp

    @property
    def replicas(self) -> int:
        """Data-parallel groups, each running its own batch: ep / tp under expert parallelism, else 1."""
        return self.ep // self.tp if self.ep > 1 else 1

    @property
    def name(self) -> str:
        """tp2, sp4, tp2,sp2, ep8 - or tp1 for one device: as `compare --plans` takes it."""
        return ",".join(f"{axis}{n}" for axis, n in (("tp", self.tp), ("sp", self.sp), ("ep", self.ep))
                        if n > 1) or "tp1"

    @property
    def simulated_device(self) -> int:
        """The device the engine runs: rank 0 of its tensor-parallel group, in the last
        part of the prompt (graph.build_decoder: under the causal mask it attends to the most keys)."""
        return (self.sp - 1) * self.tp

    def as_json(self) -> dict:
        return {"tp": self.tp, "sp": self.sp} | ({"ep": self.ep} if self.ep > 1 else {}) | {
            "devices": self.world, "simulated_device": self.simulated_device}

    def group(self, kind: str, device: int) -> tuple[int, ...]:
        """The devices of `device`'s group for a collective of `kind`, in rank order."""
        part, t = divmod(device, self.tp)
        axis = group_axis(kind, self.ep)
        if axis == "tp":
            return tuple(part * self.tp + j for j in range(self.tp))
        if axis == "sp":
            return tuple(j * self.tp + t for j in range(self.sp))
        if axis == "ep":  # every device
            return tuple(range(self.ep))
        raise ValueError(f"{kind}: the decoder's plans place no {kind} (known: {', '.join(GROUP_AXIS)})")


def graph_plan(graph) -> Plan:
    """The plan a decoder graph is one device's shard of, read from its collectives."""
    ep = max((n.args.devices for n in graph.nodes if n.op_type == "all_to_all"), default=1)
    degree = {axis: max((n.args.devices for n in graph.nodes if group_axis(n.op_type, ep) == axis), default=1)
              for axis in ("tp", "sp", "ep")}
    return Plan(degree["tp"], degree["sp"], ep=degree["ep"])


def check_plan(plan: Plan, w: Workload, hw: HwConfig) -> Plan:
    """One-line ConfigError for a plan that cannot run: tp not dividing the heads, K/V
    heads or FFN; devices other than tp x sp; more devices than the topology has; a
    tensor-parallel group spanning nodes. (build_decoder checks that sp splits the prompt.)"""
    check_plan_shape(plan, w)
    topo = hw.topology
    if plan.world > topo.max_devices:
        raise ConfigError(f"{plan.world} devices, but {hw.name}'s topology has {topo.size_text()}")
    if plan.tp > topo.node_device_count:
        raise ConfigError(f"--tp {plan.tp} spans nodes: a tensor-parallel group must fit in one node of "
                          f"{topo.node_device_count} devices (topology.node_device_count)")
    return plan


def check_plan_shape(plan: Plan, w: Workload) -> Plan:
    """check_plan's rules that need no hardware: the degrees against each other and the
    workload (a sweep checks them once, whatever hardware its points have)."""
    if w.is_moe and plan.ep != 1 and plan.sp != 1:
        raise ConfigError(f"--ep {plan.ep} with --sp {plan.sp}: expert parallelism is modelled with data-parallel "
                          f"attention (each device or tensor-parallel group its own batch), not sequence parallel")
    check_tp(w, plan.tp)
    check_ep(w, plan.ep)
    if plan.ep > 1 and plan.ep % plan.tp:
        raise ConfigError(f"--tp {plan.tp} does not divide --ep {plan.ep}: attention runs in tensor-parallel groups "
                          f"of --tp devices among the --ep devices")
    if isinstance(plan.sp, bool) or not isinstance(plan.sp, int) or plan.sp < 1:
        raise ConfigError(f"--sp: expected a positive integer, got {plan.sp!r}")
    if plan.devices is not None:
        if isinstance(plan.devices, bool) or not isinstance(plan.devices, int) or plan.devices < 1:
            raise ConfigError(f"--devices: expected a positive integer, got {plan.devices!r}")
        world = attrs.evolve(plan, devices=None).world
        if plan.devices != world:
            product = f"--ep {plan.ep}" if plan.ep > 1 else f"--tp {plan.tp} x --sp {plan.sp}"
            raise ConfigError(f"--devices {plan.devices} must equal {product} = {world}")
    return plan


def device_weight_bytes(w: Workload, tp: int, ep: int = 1) -> int:
    """Weights one device holds: its shard of every layer (graph.build.shard_weight_shapes),
    the embedding, final norm and LM head whole.
    # assumption: embedding and LM head are replicated, not split over the vocabulary."""
    full = sum(_numel(x) for i in range(w.layers) for x in w.layer_weight_shapes(i).values())
    mine = sum(_numel(x) for i in range(w.layers) for x in shard_weight_shapes(w, tp, ep, i).values())
    return w.weight_bytes - (full - mine) * w.dtype_bytes


def device_kv_bytes(w: Workload, batch: int, tokens: int, tp: int) -> int:
    """KV cache one device holds: its K/V heads."""
    return w.kv_bytes(batch, tokens) // tp


def devices_to_fit(w: Workload, batch: int, tokens: int, hw: HwConfig,
                   weight_bytes: Callable[[int], int] | None = None) -> int | None:
    """The smallest tensor-parallel degree whose weights and KV cache fit one device, within a node.
    `weight_bytes(tp)`: one device's weights (default device_weight_bytes; an INT8 step passes its own)."""
    weight_bytes = weight_bytes or (lambda tp: device_weight_bytes(w, tp))
    for tp in range(1, hw.topology.node_device_count + 1):
        try:
            check_tp(w, tp)
        except ConfigError:
            continue
        if weight_bytes(tp) + device_kv_bytes(w, batch, tokens, tp) <= hw.hbm.hbm_bytes:
            return tp
    return None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
