"""Run a graph on the simulated device: place, lower, launch, simulate.

The layer memo: decoder layers 1 .. L-2 are the same kernels at other addresses,
so by default (memo=True, at least MEMO_MIN_LAYERS layers) the engine simulates
the step with layers {0, 1, L-1} only (the first and last layers differ from the
middle ones after fusion across layer boundaries) and takes layer 1 as the
pattern of the missing ones: what it adds to the step - the time from the end of
layer 0's last kernel to the end of layer 1's, its host launch time and the host
wait that ended in that span - is added L-3 more times, its kernels replicated
(renamed L2., L3., ...) and everything after them shifted. tests/test_runtime.py
checks the result against the full simulation (memo=False) on a 4-layer decoder.
The trace of a memoised run holds the simulated layers only. memo=True also lets
the engine replay a kernel whose twin (the same op and parameters at other
addresses) already ran alone on the device (engine.device.Reuse), instead of
simulating it again; memo=False simulates everything.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs
from attrs import frozen

from npusim.engine import RunResult, run
from npusim.engine.host import Launch, host_cost_cycles
from npusim.graph.ir import Graph, Node
from npusim.hw import HwConfig
from npusim.runtime.compile import CompiledNode, HostProgram, compile_nodes, host_program
from npusim.runtime.memory import MemoryBreakdown, OutOfMemoryError, place

MEMO_MIN_LAYERS = 4  # below this there is no middle layer to replicate beyond the one simulated


@frozen
class GraphRun:
    """A simulated step: the engine's result (every kernel of every layer), the
    memory it needs, and which node each kernel came from."""

    graph: Graph
    result: RunResult
    memory: MemoryBreakdown
    node_of: dict[str, Node]  # kernel name -> node
    memo: bool
    workspace: dict[str, int]  # kernel name -> GM workspace its node's kernels use beyond their operands

    @property
    def hw(self) -> HwConfig:
        return self.result.hw

    @property
    def latency_us(self) -> float:
        return self.result.us

    @property
    def tokens(self) -> int:
        """Tokens this step processes: one new token per sequence in decode, every
        prompt token in prefill."""
        return self.graph.batch if self.graph.phase == "decode" else sum(self.graph.lengths)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.latency_us * 1e-6) if self.latency_us else 0.0


def check_memory(graph: Graph, hw: HwConfig, breakdown: MemoryBreakdown) -> None:
    if not breakdown.fits:
        raise OutOfMemoryError(f"{graph!r} does not fit in {hw.name}'s memory: {breakdown.line()}", breakdown)


def run_graph(graph: Graph, hw: HwConfig, memo: bool = True, trace: str = "kernel") -> GraphRun:
    """Simulate one step of `graph` on `hw` (see the module doc for `memo`)."""
    placement = place(graph, hw.hbm.hbm_bytes)
    check_memory(graph, hw, placement.breakdown)
    layers = sorted({n.layer for n in graph.nodes if n.layer is not None})
    memoised = memo and len(layers) >= MEMO_MIN_LAYERS
    keep = {layers[0], layers[1], layers[-1]} if memoised else set(layers)
    compiled = compile_nodes(graph, [n for n in graph.nodes if n.layer is None or n.layer in keep], hw, placement)
    breakdown = attrs.evolve(placement.breakdown, workspace_bytes=_workspace(compiled))
    check_memory(graph, hw, breakdown)  # before simulating: the workspace is known once lowered
    program = host_program(graph, compiled, placement.addresses, replay=memo)
    result = run(program.calls, hw, trace)
    if memoised:
        result = _replicate(result, compiled, program, layers[0], layers[1], len(layers) - 3)
    nodes = {n.name: n for n in graph.nodes}
    node_of = {r.name: nodes[_node_name(r.name)] for r in result.kernels}
    simulated = {c.node.name: c.workspace_bytes for c in compiled}

    def workspace(kernel: str) -> int:
        name = _node_name(kernel)
        if name not in simulated and memoised:  # a replicated layer: as its pattern layer's node
            name = _LAYER.sub(f"L{layers[1]}.", name)
        return simulated.get(name, 0)

    used = {r.name: workspace(r.name) for r in result.kernels}
    return GraphRun(graph, result, breakdown, node_of, memoised, {k: v for k, v in used.items() if v})


def _node_name(kernel: str) -> str:
    """Kernels are named NODE, or NODE/KERNEL when a node lowers to several."""
    return kernel.split("/")[0]


def _workspace(compiled: Sequence[CompiledNode]) -> int:
    """Per stream its largest kernel workspace (the stream's region), summed over streams."""
    per_stream: dict[int, int] = {}
    for c in compiled:
        per_stream[c.stream] = max(per_stream.get(c.stream, 0), c.workspace_bytes)
    return sum(per_stream.values())


_LAYER = re.compile(r"^L\d+\.")  # the layer prefix of a node's (and its kernels') name


def _renamed(name: str, layer: int, to: int) -> str:
    """A kernel name of layer `layer` as layer `to`'s (names start with "L{layer}.")."""
    prefix = f"L{layer}."
    return f"L{to}." + name[len(prefix):] if name.startswith(prefix) else name


def _replicate(part: RunResult, compiled: Sequence[CompiledNode], program: HostProgram, first: int, layer: int,
               copies: int) -> RunResult:
    """`part` with layer `layer`'s kernels repeated `copies` more times (as layers
    layer+1 ..), everything after them shifted, host costs grown to match. The
    host thread ends with the final synchronize when the device does, so its wait
    is the step's time less what its calls cost - which is what is extended."""
    layer_of = {k.name: c.node.layer for c in compiled for k in c.kernels}
    block = [r for r in part.kernels if layer_of.get(r.name) == layer]
    end_before = max(r.end for r in part.kernels if layer_of.get(r.name) == first)
    end = max(r.end for r in block)
    delta = end - end_before
    names = {r.name for r in block}
    order = [k.name for c in compiled for k in c.kernels]
    after = set(order[max(i for i, name in enumerate(order) if name in names) + 1:])  # launched after layer
    in_layer = {c.node.name for c in compiled if c.node.layer == layer}
    costs = [(host_cost_cycles(call, part.hw), call) for call, owner in zip(program.calls, program.owners)
             if owner in in_layer]
    launch = sum(cost for cost, call in costs if isinstance(call, Launch))
    busy = sum(cost for cost, _ in costs)
    cycles = part.cycles + copies * delta
    records = []
    for r in part.kernels:
        shift = copies * delta if r.name in after else 0.0
        records.append(attrs.evolve(r, queued=r.queued + shift, start=r.start + shift, end=r.end + shift))
    next_id = max(r.id for r in part.kernels) + 1  # simulated records keep their ids: the trace refers to them
    for j in range(1, copies + 1):
        records += [attrs.evolve(r, id=next_id + (j - 1) * len(block) + i, name=_renamed(r.name, layer, layer + j),
                                 queued=r.queued + j * delta, start=r.start + j * delta, end=r.end + j * delta)
                    for i, r in enumerate(block)]
    records.sort(key=lambda r: (r.queued, r.start, r.id))
    return RunResult(
        hw=part.hw,
        cycles=cycles,
        kernels=tuple(records),
        host_launch_cycles=part.host_launch_cycles + copies * launch,
        host_wait_cycles=cycles - (part.cycles - part.host_wait_cycles + copies * busy),
        trace=part.trace,
    )


__all__ = ["GraphRun", "MEMO_MIN_LAYERS", "OutOfMemoryError", "check_memory", "run_graph"]
