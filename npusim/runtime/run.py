"""Run a graph on the simulated device: place, lower, launch, simulate.

The layer memo: decoder layers 1 .. L-2 are the same kernels at other addresses,
so by default (memo=True, at least MEMO_MIN_LAYERS layers) the engine simulates
the step with layers {0, 1, L-1} only (the first and last layers differ from the
middle ones after fusion across layer boundaries) and takes layer 1 as the
pattern of the missing ones: what it adds to the step - the time from the end of
layer 0's last kernel to the end of layer 1's, its host launch time and the host
wait that ended in that span - is added L-3 more times, its kernels replicated
as the nodes at the same place in layers 2, 3, ... (each record names its node
and layer, see engine.device.Owner) and everything after them shifted; the
middle layers must run the same op types in the same order, or every layer is
simulated. tests/test_runtime.py checks the result against the full simulation
(memo=False) on a 4-layer decoder.
The trace of a memoised run is filled in to the whole timeline (memo_trace.py):
replicated layers and replayed kernels have the spans of what they repeat. memo=True also lets
the engine replay a kernel whose twin (the same op and parameters at other
addresses; a KV cache op's layer is only an address: runtime.compile._reuse_key)
already ran alone on the device (engine.device.Reuse), instead of simulating it
again; memo=False simulates everything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from attrs import frozen

from npusim.collector import fewer_collections
from npusim.engine import KernelRecord, Owner, RunResult, run
from npusim.engine.host import Launch, host_cost_cycles
from npusim.graph.ir import Graph, Node
from npusim.hw import HwConfig
from npusim.isa.program import Kernel
from npusim.runtime.compile import CompiledNode, HostProgram, LoweringCache, compile_nodes, host_program
from npusim.runtime.memo_trace import fill_replays, replicate_trace
from npusim.runtime.memory import MemoryBreakdown, OutOfMemoryError, place

MEMO_MIN_LAYERS = 4  # below this there is no middle layer to replicate beyond the one simulated


@frozen
class GraphRun:
    """A simulated step: the engine's result (every kernel of every layer, each record
    naming its node and layer), the memory it needs, and the nodes lowered for it."""

    graph: Graph
    result: RunResult
    memory: MemoryBreakdown
    _compiled: tuple[CompiledNode, ...] | None = attrs.field(eq=False, repr=False)  # init arg `compiled`
    memo: bool
    pattern: dict[str, str]  # node of a replicated layer -> the simulated node it repeats
    workspace: dict[str, int]  # kernel name -> GM workspace its node's kernels use beyond their operands
    _simulated: tuple[str, ...] = attrs.field(init=False, repr=False, eq=False)  # names of the compiled nodes
    _nodes: dict[str, Node] = attrs.field(init=False, repr=False, eq=False)
    _lowered: dict[str, CompiledNode] | None = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_nodes", {n.name: n for n in self.graph.nodes})
        object.__setattr__(self, "_lowered", None)
        if self._compiled is not None:
            object.__setattr__(self, "_simulated", tuple(c.node.name for c in self._compiled))

    @property
    def compiled(self) -> tuple[CompiledNode, ...]:
        """The nodes lowered and simulated, in launch order. A run read back from the
        disk cache lowers them again on first use: they are most of a pickled run's
        bytes, and only what re-simulates a kernel (a timeline plot) needs them."""
        if self._compiled is None:
            placement = place(self.graph, self.hw.hbm.hbm_bytes)
            nodes = [self._nodes[name] for name in self._simulated]
            object.__setattr__(self, "_compiled", tuple(compile_nodes(self.graph, nodes, self.hw, placement)))
        return self._compiled

    def __reduce__(self):
        return _unpickle_run, (self.graph, self.result, self.memory, self.memo, self.pattern, self.workspace,
                               self._simulated)

    def node(self, rec: KernelRecord) -> Node | None:
        """The graph node a kernel was launched for (None: not launched for a node)."""
        return None if rec.owner is None else self._nodes[rec.owner.node]

    def kernel(self, rec: KernelRecord) -> Kernel:
        """The lowered kernel a record ran, at its bound addresses (a replicated layer's
        kernel: its pattern's, the same kernel at other addresses)."""
        if rec.owner is None:
            raise ValueError(f"kernel {rec.name!r} was not launched for a node of this run")
        name = self.pattern.get(rec.owner.node, rec.owner.node)
        if self._lowered is None:
            object.__setattr__(self, "_lowered", {c.node.name: c for c in self.compiled})
        kernels = self._lowered[name].kernels
        if rec.owner.index >= len(kernels):  # numbered after the node's kernels: a collective's transfer step
            raise ValueError(f"{rec.name!r} is a transfer step on the links, not a kernel")
        return kernels[rec.owner.index]

    @property
    def hw(self) -> HwConfig:
        return self.result.hw

    @property
    def latency_us(self) -> float:
        return self.result.us

    @property
    def tokens(self) -> int:
        """Tokens this step processes: one new token per sequence in decode, every
        prompt token in prefill, every chunk token in a mixed step."""
        if self.graph.phase == "mixed":
            return sum(self.graph.new_tokens)
        return self.graph.batch if self.graph.phase == "decode" else sum(self.graph.lengths)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.latency_us * 1e-6) if self.latency_us else 0.0


def _unpickle_run(graph, result, memory, memo, pattern, workspace, simulated) -> GraphRun:
    """A GraphRun as pickled: without its compiled nodes (see GraphRun.compiled)."""
    run = GraphRun(graph, result, memory, None, memo, pattern, workspace)
    object.__setattr__(run, "_simulated", simulated)
    return run


def check_memory(graph: Graph, hw: HwConfig, breakdown: MemoryBreakdown) -> None:
    if not breakdown.fits:
        raise OutOfMemoryError(f"{graph!r} does not fit in {hw.name}'s memory: {breakdown.line()}", breakdown)


def _alike(graph: Graph, layers: Sequence[int]) -> bool:
    """These layers run the same op types in the same order (what the memo repeats)."""
    first = [n.op_type for n in graph.layer_nodes(layers[0])]
    return all([n.op_type for n in graph.layer_nodes(i)] == first for i in layers[1:])


@fewer_collections()  # lowering and verify allocate as the simulation does
def run_graph(graph: Graph, hw: HwConfig, memo: bool = True, trace: str = "kernel",
              cache: LoweringCache | None = None, progress: Callable[[int, int], None] | None = None,
              counters: bool = True, exact: bool = True) -> GraphRun:
    """Simulate one step of `graph` on `hw` (see the module doc for `memo`). `cache`:
    lowerings to reuse and fill (runs of one graph share a cache); None: a cache of this
    run's own, so nodes that lower alike (the kept layers' SwiGlu, norms, adds: same
    parameters, same bound addresses) are lowered and verified once.
    `progress(kernels simulated, kernels to simulate)` as the engine goes. counters=False:
    no bandwidth samples in the trace (engine.run; only a Chrome trace shows them).
    exact=True: no kernel fast-forwarded (engine.run, engine.fastforward)."""
    placement = place(graph, hw.hbm.hbm_bytes)
    check_memory(graph, hw, placement.breakdown)
    layers = sorted({n.layer for n in graph.nodes if n.layer is not None})
    memoised = memo and len(layers) >= MEMO_MIN_LAYERS and _alike(graph, layers[1:-1])
    keep = {layers[0], layers[1], layers[-1]} if memoised else set(layers)
    compiled = compile_nodes(graph, [n for n in graph.nodes if n.layer is None or n.layer in keep], hw, placement,
                             LoweringCache() if cache is None else cache)
    breakdown = attrs.evolve(placement.breakdown, workspace_bytes=_workspace(compiled))
    check_memory(graph, hw, breakdown)  # before simulating: the workspace is known once lowered
    program = host_program(graph, compiled, placement.addresses, replay=memo)
    result = run(program.calls, hw, trace, progress=progress, counters=counters, exact=exact)
    if memo:
        result = fill_replays(result, program)
    pattern: dict[str, str] = {}
    if memoised:
        copies = _copies(graph, layers[1], len(layers) - 3)
        pattern = {target.name: source for targets in copies.values() for source, target in targets.items()}
        result = _replicate(result, program, layers[0], layers[1], copies, _renames(graph, layers[1], copies))
    simulated = {c.node.name: c.workspace_bytes for c in compiled}
    used = {r.name: simulated[pattern.get(r.owner.node, r.owner.node)] for r in result.kernels}
    return GraphRun(graph, result, breakdown, tuple(compiled), memoised, pattern,
                    {k: v for k, v in used.items() if v})


def _workspace(compiled: Sequence[CompiledNode]) -> int:
    """Per stream its largest kernel workspace (the stream's region), summed over streams."""
    per_stream: dict[int, int] = {}
    for c in compiled:
        per_stream[c.stream] = max(per_stream.get(c.stream, 0), c.workspace_bytes)
    return sum(per_stream.values())


def _copies(graph: Graph, layer: int, copies: int) -> dict[int, dict[str, Node]]:
    """j -> {node of `layer`: the node at its place in layer `layer` + j}, for j in 1 .. copies."""
    pattern = graph.layer_nodes(layer)
    return {j: {s.name: t for s, t in zip(pattern, graph.layer_nodes(layer + j))} for j in range(1, copies + 1)}


def _renames(graph: Graph, layer: int, copies: dict[int, dict[str, Node]]) -> list[dict[str, str]]:
    """Per copy (see _copies), in copy order, node name -> the name of the node at its
    place in the copy: the pattern layer's nodes, and the layer's before it when that
    layer runs the same op types (an event a layer waits for may be recorded there)."""
    before = graph.layer_nodes(layer - 1)
    out = []
    for j, targets in sorted(copies.items()):
        names = {s: t.name for s, t in targets.items()}
        then = graph.layer_nodes(layer - 1 + j)
        if [n.op_type for n in before] == [n.op_type for n in then]:
            names |= {s.name: t.name for s, t in zip(before, then) if s.name not in names}
        out.append(names)
    return out


def _replicate(part: RunResult, program: HostProgram, first: int, layer: int,
               copies: dict[int, dict[str, Node]], renames: list[dict[str, str]]) -> RunResult:
    """`part` with layer `layer`'s kernels repeated as the `copies` (see _copies),
    everything after them shifted, host costs grown to match (`renames`: see _renames).
    The host thread ends with the final synchronize when the device does, so its wait
    is the step's time less what its calls cost - which is what is extended."""
    n = len(copies)
    block = [r for r in part.kernels if r.owner.layer == layer]
    end_before = max(r.end for r in part.kernels if r.owner.layer == first)
    end = max(r.end for r in block)
    delta = end - end_before
    order = [(call.owner.node, call.owner.index) for call in program.calls  # launch order (transfers too)
             if getattr(call, "owner", None) is not None]
    last = max(i for i, (node, _) in enumerate(order) if node in copies[1])
    after = set(order[last + 1:])  # launched after the layer
    costs = [(host_cost_cycles(call, part.hw), call) for call, owner in zip(program.calls, program.owners)
             if owner in copies[1]]
    launch = sum(cost for cost, call in costs if isinstance(call, Launch))
    busy = sum(cost for cost, _ in costs)
    cycles = part.cycles + n * delta
    records = []
    moved: set[int] = set()  # simulated kernels launched after the layer
    for r in part.kernels:
        shift = n * delta if (r.owner.node, r.owner.index) in after else 0.0
        if shift:
            moved.add(r.id)
        records.append(attrs.evolve(r, queued=r.queued + shift, start=r.start + shift, end=r.end + shift))
    replicas: dict[int, list[KernelRecord]] = {r.id: [] for r in block}
    next_id = max(r.id for r in part.kernels) + 1  # simulated records keep their ids: the trace refers to them
    for j, targets in copies.items():
        for i, r in enumerate(block):
            target = targets[r.owner.node]
            name = target.name + r.name[len(r.owner.node):]  # kernel_name() of the same kernel in the copy
            records.append(attrs.evolve(r, id=next_id + (j - 1) * len(block) + i, name=name,
                                        owner=Owner(target.name, target.layer, r.owner.index),
                                        queued=r.queued + j * delta, start=r.start + j * delta, end=r.end + j * delta))
            replicas[r.id].append(records[-1])
    records.sort(key=lambda r: (r.queued, r.start, r.id))
    return RunResult(
        hw=part.hw,
        cycles=cycles,
        kernels=tuple(records),
        host_launch_cycles=part.host_launch_cycles + n * launch,
        host_wait_cycles=cycles - (part.cycles - part.host_wait_cycles + n * busy),
        trace=replicate_trace(part, program, set(copies[1]), replicas, moved, delta, (end_before, end), renames),
        kept_together=part.kept_together,
    )


__all__ = ["GraphRun", "MEMO_MIN_LAYERS", "OutOfMemoryError", "check_memory", "run_graph"]
