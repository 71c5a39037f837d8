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
        # Who writes and reads each tensor: tensor -> {node name: node}, for the list
        # `_indexed` (a pass may set `nodes` to a new list: the index is then built again;
        # replace keeps it up to date), and each node's place in that list (`_places`,
        # built when a tensor has several writers or readers to put in order).
        self._indexed: list[Node] | None = None
        self._writers: dict[str, dict[str, Node]] = {}
        self._readers: dict[str, dict[str, Node]] = {}
        self._places: dict[str, int] | None = None

    def producer(self, tensor: str) -> Node | None:
        """The first node (in order) writing `tensor`."""
        found = self._ordered(self._index()[0].get(tensor))
        return found[0] if found else None

    def readers(self, tensor: str) -> list[Node]:
        """The nodes reading `tensor`, in order."""
        return self._ordered(self._index()[1].get(tensor))

    def _index(self) -> tuple[dict, dict]:
        if self._indexed is not self.nodes:
            self._writers, self._readers = {}, {}
            self._enter(self.nodes)
            self._indexed, self._places = self.nodes, None
        return self._writers, self._readers

    def _enter(self, nodes: Iterable[Node]) -> None:
        for n in nodes:
            for t in n.outputs.values():
                self._writers.setdefault(t, {})[n.name] = n
            for t in n.inputs.values():
                self._readers.setdefault(t, {})[n.name] = n

    def _ordered(self, found: dict[str, Node] | None) -> list[Node]:
        if not found:
            return []
        if len(found) == 1:
            return list(found.values())
        if self._places is None:
            self._places = {n.name: i for i, n in enumerate(self.nodes)}
        return sorted(found.values(), key=lambda n: self._places[n.name])

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
        new = list(new)
        old_names = {n.name for n in old}
        before: list[Node] = []  # the nodes before the first of `old`
        after: list[Node] = []  # the others after it
        removed: list[Node] = []
        for n in self.nodes:
            (removed if n.name in old_names else after if removed else before).append(n)
        if not removed:
            raise ValueError(f"replace: none of {sorted(old_names)} is in the graph")
        indexed = self._indexed is self.nodes
        self.nodes = before + new + after
        if indexed:  # keep the index: out with the old nodes, in with the new
            for n in removed:
                for t in n.outputs.values():
                    self._writers[t].pop(n.name, None)
                for t in n.inputs.values():
                    self._readers[t].pop(n.name, None)
            self._enter(new)
            self._indexed, self._places = self.nodes, None

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
