"""Graph -> kernels -> host program.

Each node is lowered by its op's lowering with the op's GM names bound to the
addresses of the graph tensors they map to (so kernels read and write where the
memory plan put things); names a node does not map are the kernel's workspace,
placed in its stream's workspace region. The host program then follows the
graph's Schedule: launches in node order on the node's stream, a synchronize
after every kernel (sync "every_op") or only at the end ("events"), and an event
wherever a node depends on bytes the other stream wrote or read.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import attrs
from attrs import frozen

from npusim.diskcache.reads import note, paused, recording
from npusim.engine.device import Owner, Reuse
from npusim.engine.host import HostCall, Launch, Memcpy, RecordEvent, Synchronize, WaitEvent
from npusim.errors import NpusimError
from npusim.graph.ir import Graph, GraphError, Node
from npusim.graph.lifetimes import align
from npusim.hw import HwConfig
from npusim.isa.program import Kernel
from npusim.ops.collectives.lower import launch_order, transfer
from npusim.ops.kv_cache import kv_row_align_bytes
from npusim.ops.registry import GmArena, Lowered, gm_align_bytes, lower, spec
from npusim.passes import Schedule, schedule_of
from npusim.runtime.memory import Placement


@frozen
class CompiledNode:
    node: Node
    lowered: Lowered
    kernels: tuple[Kernel, ...]  # the lowering's kernels, named after the node
    stream: int
    workspace_bytes: int
    reuse_key: tuple  # equal for nodes lowering to the same kernels at other addresses
    # a KV cache op's parts of the cache tensors it touches (_cache_parts; None: any other op)
    cache_parts: dict | None = None


def _reuse_key(node: Node, bound: dict[str, int], line: int, parts: dict | None) -> tuple:
    """Same op, parameters and operand offsets within an L2 line: the same kernels at
    other addresses (engine.device.Reuse). A KV cache op's `layer` only says where in
    the cache its layer lies: it is left out, and its cache tensors count from the
    first part it touches (_cache_parts), so the layers of a step share one key
    (checked: tests/test_runtime_reuse.py lowers them)."""
    op_type, params = node.op_key(leave_out="layer" if parts is not None else "")
    starts = {k: a + (parts[k][0][0] if parts and k in parts else 0) for k, a in bound.items()}
    return (op_type, params, tuple(sorted((k, a % line) for k, a in starts.items())))


def _cache_parts(node: Node, hw: HwConfig) -> dict[str, tuple[tuple[int, int], ...]] | None:
    """A KV cache op's (npusim.ops CACHE_OPS) parts of its cache tensors it touches: the
    tokens it writes (a cache write), or every token of its layer (a reader), in each
    sequence and head (npusim.kvcache.KvLayout.parts); None for any other op."""
    operands = spec(node.op_type).operands
    if operands is None or operands.kv is None:
        return None
    args = node.args
    cache = args.kv_cache(kv_row_align_bytes(hw))
    start, n = (args.start, args.new_tokens) if operands.kv == "write" else (0, cache.context)
    return cache.parts(start, n)


def _bound(node: Node, addresses: dict[str, int]) -> dict[str, int]:
    return {local: addresses[t] for local, t in (node.inputs | node.outputs).items()}


def _check_binding(node: Node, low: Lowered, graph: Graph) -> None:
    """Every operand the op declares is mapped by the node to a graph tensor big enough."""
    mapped = node.inputs | node.outputs
    sizes = {t.name: t.nbytes for k in low.kernels for t in k.gm}
    for info in (*low.inputs, *low.outputs):  # (an info may describe a part of a GM tensor, by another name)
        if info.name in sizes and info.name not in mapped:
            raise GraphError(f"node '{node.name}': {node.op_type} operand '{info.name}' is not mapped to a tensor")
    for local, t in mapped.items():
        if sizes.get(local, 0) > graph.tensors[t].nbytes:
            raise GraphError(f"node '{node.name}': {node.op_type} operand '{local}' needs {sizes[local]} bytes, "
                             f"tensor '{t}' has {graph.tensors[t].nbytes}")


# node name -> tiling fields: the tilings a step ran with, to run it again with the same
# kernels on another config (npusim calibrate times a profile's rows so: a tiling is chosen
# by a cost model that reads timing fields, the kernels that were measured do not change)
_PINNED: ContextVar[Mapping[str, dict]] = ContextVar("pinned_tilings", default={})


@contextmanager
def tilings_pinned(tilings: Mapping[str, dict]) -> Iterator[None]:
    """Within: a node named in `tilings` is lowered with that tiling, not the op's choice."""
    token = _PINNED.set(tilings)
    try:
        yield
    finally:
        _PINNED.reset(token)


def tilings_of(compiled: Sequence[CompiledNode]) -> dict[str, dict]:
    """The tilings the nodes were lowered with (those whose op has a tiling record), as
    tilings_pinned takes them."""
    return {c.node.name: attrs.asdict(c.lowered.tiling) for c in compiled
            if spec(c.node.op_type).tiling is not None and isinstance(c.lowered.tiling, spec(c.node.op_type).tiling)}


def lower_node(node: Node, graph: Graph, hw: HwConfig, addresses: dict[str, int], workspace_base: int) -> Lowered:
    """The node's lowering with its operands bound to their addresses and its workspace at
    `workspace_base` (and its pinned tiling, if any: tilings_pinned)."""
    try:
        low = lower(node.op_type, node.params, hw, _PINNED.get().get(node.name),
                    gm=GmArena(_bound(node, addresses), base=workspace_base, align_bytes=gm_align_bytes(hw)))
    except (ValueError, TypeError) as e:
        raise GraphError(_by_workload(graph, node, hw, f"node '{node.name}' ({node.op_type}): {e}")) from None
    except NpusimError as e:
        raise type(e)(_by_workload(graph, node, hw, f"node '{node.name}': {e}")) from None
    _check_binding(node, low, graph)
    return low


def _by_workload(graph: Graph, node: Node, hw: HwConfig, message: str) -> str:
    """`message` (a node the config cannot lower) led by the workload file and the keys that
    shape the node (graph.build.node_keys), and the config: a hidden_size whose row does not
    fit UB was 'node 'embedding': op embedding: ...', the file and key that gave it not named.
    (What the config cannot do, and what it can, is the lowering's to say: the cause may be
    the config's, as chip.aiv_per_aic 3 for flash_attention.)"""
    from npusim.graph.build import node_keys
    from npusim.workload import source_of

    w = graph.workload
    keys = node_keys(node.name) if w is not None else ()
    if not keys:
        return message
    where, nm = source_of(w) or (f"workload {w.name}", lambda k: k)
    values = ", ".join(f"'{nm(k)}' {getattr(w, k)}" for k in keys)
    return f"{where}: key{'s' if len(keys) > 1 else ''} {values}, on {hw.name}: {message}"


class LoweringCache:
    """Lowered nodes kept for reuse by the caller that owns the cache: repeated runs of
    one graph (compare's pipelines, a serving model's steps) lower each node once.
    Keyed by everything a lowering depends on: the op and its parameters, the bound
    addresses and sizes of its operands, the workspace base and the hardware config
    by value (two equal configs share entries). Holds at most `max_entries`; the
    least recently used entry goes first."""

    def __init__(self, max_entries: int = 4096):
        if max_entries < 1:
            raise ValueError(f"LoweringCache: max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, tuple[Lowered, frozenset]] = OrderedDict()  # (lowering, hw reads)
        self._hw: tuple[HwConfig, str] | None = None  # the last config and its value key

    def __len__(self) -> int:
        return len(self._entries)

    def _hw_key(self, hw: HwConfig) -> str:
        if self._hw is None or self._hw[0] is not hw:  # (a held reference: its id cannot be reused)
            with paused():  # the whole config is the key here, not what a lowering reads of it
                self._hw = (hw, json.dumps(attrs.asdict(hw), sort_keys=True, default=str))
        return self._hw[1]

    def lower(self, node: Node, graph: Graph, hw: HwConfig, addresses: dict[str, int],
              workspace_base: int) -> Lowered:
        """lower_node, through the cache."""
        operands = tuple(sorted((local, addresses[t], graph.tensors[t].nbytes)
                                for local, t in (node.inputs | node.outputs).items()))
        pin = _PINNED.get().get(node.name)
        key = (*node.op_key(), operands, workspace_base, self._hw_key(hw), json.dumps(pin, sort_keys=True))
        hit = self._entries.get(key)
        if hit is None:
            with recording() as reads:  # what a disk-cached step reads of the config (npusim.diskcache)
                low = lower_node(node, graph, hw, addresses, workspace_base)
            self._entries[key] = (low, frozenset(reads))
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return low
        self._entries.move_to_end(key)
        note(hit[1])  # a step served this lowering read these fields as if it had lowered it
        return hit[0]


def kernel_name(node: str, kernel: str, many: bool) -> str:
    """A launched kernel's name: its node's, or "NODE/KERNEL" when the node lowers to several."""
    return f"{node}/{kernel}" if many else node


def compile_nodes(graph: Graph, nodes: Sequence[Node], hw: HwConfig, placement: Placement,
                  cache: LoweringCache | None = None) -> list[CompiledNode]:
    """Lower `nodes` (a subset of the graph's, in order), through `cache` if given.
    Stream s's workspace region starts after stream s-1's largest workspace."""
    sched = schedule_of(graph)
    lowered = lower_node if cache is None else cache.lower
    out: dict[str, CompiledNode] = {}
    base = placement.workspace_base
    for s in sorted({sched.stream(n.name) for n in nodes}):
        largest = 0
        for n in (n for n in nodes if sched.stream(n.name) == s):
            low = lowered(n, graph, hw, placement.addresses, base)
            ws = sum(t.nbytes for k in low.kernels for t in k.gm if t.name not in n.inputs | n.outputs)
            ws = max(ws, low.workspace_bytes)
            largest = max(largest, ws)
            many = len(low.kernels) > 1
            kernels = tuple(attrs.evolve(k, name=kernel_name(n.name, k.name, many)) for k in low.kernels)
            parts = _cache_parts(n, hw)
            key = _reuse_key(n, _bound(n, placement.addresses), hw.l2.line_bytes, parts)
            out[n.name] = CompiledNode(n, low, kernels, s, ws, key, parts)
        base += align(largest, gm_align_bytes(hw))
    return [out[n.name] for n in nodes]


# ---------------------------------------------------------------- the host program


def _ranges(node: Node, graph: Graph, addresses: dict[str, int], which: str) -> list[tuple[int, int]]:
    tensors = node.inputs if which == "read" else node.outputs
    return [(addresses[t], addresses[t] + graph.tensors[t].nbytes) for t in tensors.values()]


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(lo < hi2 and lo2 < hi for lo, hi in a for lo2, hi2 in b)


def cross_stream_deps(graph: Graph, nodes: Sequence[CompiledNode], addresses: dict[str, int]) -> dict[str, list[str]]:
    """node -> earlier nodes on other streams it must wait for: it reads bytes they
    wrote, or writes bytes they read or wrote - unless its stream already waited
    for them, or for something after them on their stream (vector clocks: what
    each stream knows to be done on every other)."""
    deps: dict[str, list[str]] = {}
    history: list[tuple[int, CompiledNode, list, list]] = []
    known: dict[int, dict[int, int]] = {}  # stream -> other stream -> last node index known done there
    seen_at: dict[str, dict[int, int]] = {}  # node -> what its stream knew when it finished
    for i, c in enumerate(nodes):
        reads = _ranges(c.node, graph, addresses, "read")
        writes = _ranges(c.node, graph, addresses, "write")
        mine = known.setdefault(c.stream, {})
        need: dict[int, tuple[int, CompiledNode]] = {}
        for j, prev, p_reads, p_writes in reversed(history):
            if prev.stream == c.stream or prev.stream in need or mine.get(prev.stream, -1) >= j:
                continue
            if _overlap(reads, p_writes) or _overlap(writes, p_reads) or _overlap(writes, p_writes):
                need[prev.stream] = (j, prev)
        for j, prev in need.values():
            for t, k in [(prev.stream, j), *seen_at[prev.node.name].items()]:
                mine[t] = max(mine.get(t, -1), k)
        if need:
            deps[c.node.name] = sorted(prev.node.name for _, prev in need.values())
        mine[c.stream] = i
        seen_at[c.node.name] = dict(mine)
        history.append((i, c, reads, writes))
    return deps


def _footprint(kernel: Kernel, compiled: CompiledNode, graph: Graph, addresses: dict[str, int]) -> tuple[tuple, tuple]:
    """(reads, writes) as (address, bytes) of the node's tensors this kernel itself
    declares (a split-K matmul's zero-fill kernel touches C, not A or B); of a KV cache,
    the parts it touches (_cache_parts: a cache write's new tokens, not the whole cache)."""
    mine = {t.name for t in kernel.gm}
    parts = compiled.cache_parts or {}

    def ranges(tensors: dict[str, str]) -> tuple:
        return tuple((addresses[t] + offset, nbytes) for local, t in tensors.items() if local in mine
                     for offset, nbytes in parts.get(local, ((0, graph.tensors[t].nbytes),)))

    return ranges(compiled.node.inputs), ranges(compiled.node.outputs)


@frozen
class HostProgram:
    """The host calls of a step, and the node each belongs to (None: the step's own
    input / output copies and the final synchronize)."""

    calls: tuple[HostCall, ...]
    owners: tuple[str | None, ...]


def host_program(graph: Graph, nodes: Sequence[CompiledNode], addresses: dict[str, int],
                 replay: bool = False) -> HostProgram:
    """Copy the host inputs in, launch every kernel as the schedule says, copy the
    sampled tokens out, synchronize. replay: kernels carry a Reuse, so the engine may
    replay a kernel whose twin ran alone instead of simulating it again."""
    sched: Schedule = schedule_of(graph)
    deps = cross_stream_deps(graph, nodes, addresses) if sched.streams else {}
    recorded = {d for ds in deps.values() for d in ds}
    calls: list[tuple[str | None, HostCall]] = []
    inputs = sum(graph.tensors[t].nbytes for t in graph.inputs)
    if inputs:
        calls.append((None, Memcpy(inputs, "h2d", 0)))
    for c in nodes:
        name = c.node.name
        calls += [(name, WaitEvent(d, c.stream)) for d in deps.get(name, ())]
        sends = 0
        for i in launch_order(c.lowered):  # kernel indices; a collective's transfer steps between them
            if not isinstance(i, int):
                owner = Owner(name, c.node.layer, len(c.kernels) + sends)  # numbered after the node's kernels
                calls.append((name, transfer(c.lowered.tiling, i, kernel_name(name, f"send{sends}", True), c.stream,
                                             sched.launch, owner)))
                sends += 1
                continue
            k = c.kernels[i]
            reuse = Reuse((*c.reuse_key, i), *_footprint(k, c, graph, addresses)) if replay else None
            calls.append((name, Launch(k, c.stream, sched.launch, reuse, Owner(name, c.node.layer, i))))
            if sched.sync == "every_op":
                calls.append((name, Synchronize()))
        if name in recorded:
            calls.append((name, RecordEvent(name, c.stream)))
    last = [n for n in nodes if set(n.node.outputs.values()) & set(graph.outputs)]
    out_bytes = sum(graph.tensors[t].nbytes for t in graph.outputs if graph.tensors[t].dtype == "int32")
    if out_bytes and last:  # the sampled token ids go back to the host
        if last[-1].stream != 0:
            event = last[-1].node.name + ":out"
            calls += [(None, RecordEvent(event, last[-1].stream)), (None, WaitEvent(event, 0))]
        calls.append((None, Memcpy(out_bytes, "d2h", 0)))
    calls.append((None, Synchronize()))
    return HostProgram(tuple(c for _, c in calls), tuple(o for o, _ in calls))


__all__ = ["CompiledNode", "HostProgram", "LoweringCache", "compile_nodes", "cross_stream_deps", "host_program",
           "kernel_name", "lower_node"]
