"""The graph IR: tensors, nodes and the graph of one decoder step.

A node is one registered operator (`npusim.ops.OPS`): its `params` are exactly
the keyword parameters `npusim.ops.registry.lower(op_type, params, hw)` takes, and
its `inputs` / `outputs` map the operator's own GM tensor names (the names its
lowering gives `gm.tensor(...)`: "a", "b", "c" for a matmul, "x", "y" for most
vector ops, ...) to graph tensor names. So lowering a node is
`lower(node.op_type, node.params, hw, gm=GmArena(bound={local: address of the graph tensor}))`.

Records are frozen; their dicts are not copied on read, so treat them as
read-only and build a new record (attrs.evolve) to change one.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs
from attrs import field, frozen

from npusim.errors import NpusimError
from npusim.isa.program import DTYPE_BYTES

KINDS = ("weight", "activation", "kv", "input", "output")

# Storage formats. BSND is plain row-major (ND) storage of a [batch, seq, heads,
# head_dim] tensor - the token-major layout projections and RoPE produce - that
# attention's batch matmuls read and write head by head through strides (the
# head-major view [batch, heads, seq, head_dim] is its transpose; with seq = 1, as
# in decode, both are the same bytes). No transpose kernel is implied.
FORMATS = ("ND", "NZ", "BSND")
# An NZ fractal: 16 rows of one 32-byte block (16 x 16 in fp16), as the cube reads operands.
NZ_ROWS, NZ_BLOCK_BYTES = 16, 32


class GraphError(NpusimError):
    """A graph breaks a structural rule: unknown tensor, order, producer, op parameter."""


def _shape(value) -> tuple[int, ...]:
    return tuple(int(d) for d in value)


@frozen
class TensorSpec:
    """A graph tensor: its logical shape, dtype, storage format and role."""

    name: str
    shape: tuple[int, ...] = field(converter=_shape)
    dtype: str = field(validator=attrs.validators.in_(tuple(DTYPE_BYTES)))
    format: str = field(default="ND", validator=attrs.validators.in_(FORMATS))
    kind: str = field(default="activation", validator=attrs.validators.in_(KINDS))

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes in GM: NZ pads the last two dims to whole fractals (16 rows x one
        32-byte block of columns), as trans_data and the cube store it."""
        e = DTYPE_BYTES[self.dtype]
        if self.format != "NZ":
            return self.numel * e
        *outer, rows, cols = (1, *self.shape) if len(self.shape) == 1 else self.shape
        c0 = NZ_BLOCK_BYTES // e
        n = -(-rows // NZ_ROWS) * NZ_ROWS * (-(-cols // c0) * c0) * e
        for d in outer:
            n *= d
        return n


@frozen
class Node:
    """One operator instance. `inputs` / `outputs`: op-local GM tensor name -> graph
    tensor name. `layer`: the decoder layer it belongs to (None outside the layers)."""

    name: str
    op_type: str
    params: dict[str, Any] = field(converter=dict)
    inputs: dict[str, str] = field(converter=dict)
    outputs: dict[str, str] = field(converter=dict)
    layer: int | None = None
    _args: Any = field(default=None, init=False, eq=False, repr=False)

    @property
    def args(self) -> Any:
        """The op's typed parameter record (defaults filled in), as the lowering and the
        reference see it: built from `params` on first use (a bad parameter is a
        ConfigError naming it; Graph.check reports it as a GraphError first)."""
        if self._args is None:
            from npusim.ops.registry import make_record, spec

            object.__setattr__(self, "_args", make_record(self.op_type, spec(self.op_type).params, self.params))
        return self._args

    def op_key(self, leave_out: str = "") -> tuple[str, str]:
        """(op type, parameters): equal for nodes that lower to the same kernels (addresses aside);
        `leave_out`: a parameter left out of the key (one that only moves the kernels' addresses)."""
        return self.op_type, repr(sorted((k, v) for k, v in self.params.items() if k != leave_out))


@frozen(repr=False)
class Graph:
    """A decoder step as nodes in execution order.

    phase "decode": one new token per sequence, `lengths` = context length of each
    sequence including the new token; phase "prefill": `lengths` = prompt lengths.
    Shapes use the longest length (ragged batches are padded to it); `lengths`
    keeps each sequence's own (the executor and masks use them).
    """

    tensors: dict[str, TensorSpec] = field(converter=dict)
    nodes: tuple[Node, ...] = field(converter=tuple)
    inputs: tuple[str, ...] = field(converter=tuple)
    outputs: tuple[str, ...] = field(converter=tuple)
    phase: str = field(validator=attrs.validators.in_(("decode", "prefill", "mixed")))
    batch: int
    lengths: tuple[int, ...] = field(converter=tuple)
    workload: Any = None  # the npusim.workload.Workload it was built from (RoPE theta, names, KV sizes)
    # the length the shapes are built for, when larger than the longest sequence (a shape bucket)
    capacity: int | None = None
    # weight made by a pass -> the original weights it concatenates along axis 0 (a fused
    # QKV or gate/up weight is prepared offline from the checkpoint's separate ones)
    derived: dict[str, tuple[str, ...]] = field(factory=dict, converter=dict)
    # how the runtime runs the graph: set by the streams / sync / launch passes
    schedule: Any = None  # npusim.passes.Schedule, None = the baseline (one stream, sync every op, eager)
    memory_plan: Any = None  # npusim.passes.MemoryPlan, None = every tensor its own allocation
    applied: tuple[str, ...] = field(default=(), converter=tuple)  # names of the passes applied, in order
    # mixed phase: new tokens per sequence (the decodes, 1 each, before the prefill chunks)
    new_tokens: tuple[int, ...] = field(default=(), converter=tuple)
    # activations several nodes write, each its own rows (a mixed step's two attention parts)
    written_in_parts: tuple[str, ...] = field(default=(), converter=tuple)
    # the tensor- and sequence-parallel degrees its shapes are one device's shard of (a pass
    # that rebuilds the graph, as buckets does, builds the same shard)
    tp: int = 1
    sp: int = 1
    ep: int = 1  # expert-parallel degree: a MoE layer's experts split over this many devices

    # ---- shape facts

    @property
    def seq(self) -> int:
        """New tokens per sequence in this step: 1 in decode, the (padded) prompt length in
        prefill, the longest chunk in a mixed step."""
        if self.phase == "mixed":
            return max(self.new_tokens)
        return 1 if self.phase == "decode" else self.context

    @property
    def context(self) -> int:
        """Tokens the shapes hold per sequence: the longest length, or the capacity of a shape bucket."""
        return self.capacity or max(self.lengths)

    @property
    def tokens(self) -> int:
        """Rows of the token-major activations: batch x seq (mixed: a row per decode,
        the longest chunk per prefill chunk)."""
        if self.phase == "mixed":
            chunks = sum(n > 1 for n in self.new_tokens)
            return self.batch - chunks + chunks * self.seq
        return self.batch * self.seq

    # ---- lookups

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def producers(self) -> dict[str, list[str]]:
        """Tensor -> names of the nodes writing it, in order (a KV cache may have several)."""
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            for t in n.outputs.values():
                out.setdefault(t, []).append(n.name)
        return out

    def producer(self, tensor: str) -> Node | None:
        """The (first) node writing `tensor`; None for inputs, weights and unwritten state."""
        for n in self.nodes:
            if tensor in n.outputs.values():
                return n
        return None

    def consumers(self, tensor: str) -> list[Node]:
        """Nodes reading `tensor`, in order."""
        return [n for n in self.nodes if tensor in n.inputs.values()]

    def layer_nodes(self, layer: int) -> list[Node]:
        return [n for n in self.nodes if n.layer == layer]

    def of_kind(self, kind: str) -> list[TensorSpec]:
        return [t for t in self.tensors.values() if t.kind == kind]

    def count_by_type(self) -> dict[str, int]:
        return dict(Counter(n.op_type for n in self.nodes))

    def bytes_by_kind(self) -> dict[str, int]:
        out = {k: 0 for k in KINDS}
        for t in self.tensors.values():
            out[t.kind] += t.nbytes
        return out

    # ---- checks

    def check(self) -> Graph:
        """Raise GraphError unless the graph is well formed: tensors exist, node names
        are unique, op types are registered and their params are the op's parameters,
        every activation is written once and before it is read, graph inputs are
        kind input and outputs are written. Returns the graph (for chaining)."""
        from npusim.ops import OPS  # the registry: which op types and parameters exist

        names = set()
        written: set[str] = set()
        for t in self.inputs:
            self._need(t, f"graph input '{t}'")
            if self.tensors[t].kind != "input":
                raise GraphError(f"graph input '{t}' is kind {self.tensors[t].kind}, expected input")
        for n in self.nodes:
            where = f"node '{n.name}'"
            if n.name in names:
                raise GraphError(f"{where}: name used twice")
            names.add(n.name)
            if n.op_type not in OPS:
                raise GraphError(f"{where}: unknown op type '{n.op_type}'")
            op = OPS[n.op_type]
            known = {f.name for f in attrs.fields(op.params)}
            extra = sorted(set(n.params) - known)
            if extra:
                raise GraphError(f"{where}: '{extra[0]}' is not a parameter of {n.op_type}")
            _check_operands(n, op.operands, where)
            for local, t in n.inputs.items():
                spec = self._need(t, f"{where} input '{local}'")
                if spec.kind in ("activation", "output") and t not in written:
                    raise GraphError(f"{where} reads '{t}' before any node writes it")
            for local, t in n.outputs.items():
                spec = self._need(t, f"{where} output '{local}'")
                if spec.kind in ("weight", "input"):
                    raise GraphError(f"{where} writes '{t}', a {spec.kind}")
                if spec.kind != "kv" and t in written and t not in self.written_in_parts:
                    raise GraphError(f"{where} writes '{t}', already written by '{self.producer(t).name}'")
                written.add(t)
        for t in self.outputs:
            self._need(t, f"graph output '{t}'")
            if t not in written:
                raise GraphError(f"graph output '{t}' is never written")
        return self

    def _need(self, t: str, what: str) -> TensorSpec:
        if t not in self.tensors:
            raise GraphError(f"{what}: no tensor '{t}'")
        return self.tensors[t]

    # ---- printing

    def __repr__(self) -> str:
        name = getattr(self.workload, "name", "?")
        return (f"Graph({name}, {self.phase}, batch={self.batch}, lengths={_short(self.lengths)}, "
                f"{len(self.nodes)} nodes, {len(self.tensors)} tensors)")

    def summary(self) -> str:
        """Node counts per op type and tensor bytes per kind, as a small table."""
        layers = sorted({n.layer for n in self.nodes if n.layer is not None})
        per_layer = len(self.layer_nodes(layers[0])) if layers else 0
        lines = [repr(self),
                 f"  {per_layer} nodes per layer x {len(layers)} layers + "
                 f"{len(self.nodes) - per_layer * len(layers)} outside the layers"]
        lines.append(f"  {'op type':<16}{'count':>7}")
        for op, c in sorted(self.count_by_type().items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {op:<16}{c:>7}")
        lines.append(f"  {'tensor kind':<16}{'count':>7}{'bytes':>16}")
        counts = Counter(t.kind for t in self.tensors.values())
        for kind, b in self.bytes_by_kind().items():
            lines.append(f"  {kind:<16}{counts[kind]:>7}{b:>16,}")
        return "\n".join(lines)


def _check_operands(n: Node, roles, where: str) -> None:
    """Every operand a node binds is one its op reads or writes (a KV cache op: or its cache's)."""
    from npusim.kvcache import CACHE_TENSORS

    cache = CACHE_TENSORS if roles.kv else ()
    for side, names, allowed in (("input", n.inputs, roles.ins + cache),
                                 ("output", n.outputs, roles.outs + (cache if roles.kv == "write" else ()))):
        bad = [k for k in names if not roles.allows(k, allowed)]
        if bad:
            raise GraphError(f"{where}: '{bad[0]}' is not an {side} of {n.op_type} "
                             f"(expected: {', '.join(allowed)})")


def _short(lengths: tuple[int, ...]) -> str:
    if len(set(lengths)) == 1:
        return f"{len(lengths)} x {lengths[0]}"
    return str(lengths) if len(lengths) <= 8 else f"({', '.join(map(str, lengths[:8]))}, ...)"
