"""Small tools the passes share to rewrite a graph: find producers and readers,
replace a run of nodes by new ones, drop what nothing reads any more."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from npusim.graph.ir import Graph, Node, TensorSpec


class Editor:
    """A mutable working copy of a graph's nodes and tensors; `graph()` freezes it."""

    def __init__(self, g: Graph):
        self.base = g
        self.nodes: list[Node] = list(g.nodes)
        self.tensors: dict[str, TensorSpec] = dict(g.tensors)
        self.derived: dict[str, tuple[str, ...]] = dict(g.derived)

    def producer(self, tensor: str) -> Node | None:
        return next((n for n in self.nodes if tensor in n.outputs.values()), None)

    def readers(self, tensor: str) -> list[Node]:
        return [n for n in self.nodes if tensor in n.inputs.values()]

    def only_reader(self, tensor: str) -> Node | None:
        """The single node reading `tensor`, if exactly one does and it is not a graph output."""
        r = self.readers(tensor)
        return r[0] if len(r) == 1 and tensor not in self.base.outputs else None

    def source(self, tensor: str) -> str:
        """The tensor a TransData copy was made from (the tensor itself otherwise)."""
        n = self.producer(tensor)
        return n.inputs["x"] if n is not None and n.op_type == "trans_data" else tensor

    def replace(self, old: Iterable[Node], new: Iterable[Node]) -> None:
        """Put `new` where the first of `old` was; remove the rest of `old`."""
        old_names = {n.name for n in old}
        at = min(i for i, n in enumerate(self.nodes) if n.name in old_names)
        kept = [n for n in self.nodes if n.name not in old_names]
        before = sum(1 for n in self.nodes[:at] if n.name not in old_names)
        self.nodes = kept[:before] + list(new) + kept[before:]

    def add_tensor(self, spec: TensorSpec) -> str:
        self.tensors[spec.name] = spec
        return spec.name

    def prune(self) -> None:
        """Drop nodes whose outputs nothing reads (repeat until none), then tensors no
        node touches. Graph outputs and KV caches are always live."""
        live_out = set(self.base.outputs)
        while True:
            read = {t for n in self.nodes for t in n.inputs.values()} | live_out
            dead = [n for n in self.nodes
                    if not any(t in read or self.tensors[t].kind == "kv" for t in n.outputs.values())]
            if not dead:
                break
            names = {n.name for n in dead}
            self.nodes = [n for n in self.nodes if n.name not in names]
        used = {t for n in self.nodes for t in (*n.inputs.values(), *n.outputs.values())} | live_out
        self.inputs = tuple(t for t in self.base.inputs if t in used)  # a fused mask may no longer be read
        self.tensors = {k: v for k, v in self.tensors.items() if k in used}
        self.derived = {k: v for k, v in self.derived.items() if k in used}

    def graph(self, applied: str) -> Graph:
        self.prune()
        return attrs.evolve(self.base, tensors=self.tensors, nodes=self.nodes, inputs=self.inputs, derived=self.derived,
                            applied=(*self.base.applied, applied)).check()
