"""Layout: propagate formats so that TransData runs only where it pays.

The baseline converts every matmul's ND activation to NZ with its own TransData
(a framework choosing each op's formats in isolation: three copies of the same
normed activation for q, k and v). This pass
1. lets a matmul read its ND activation directly (format_a=ND: the cube's DMA
   turns row-major rows into fractals on the way in, one segment per row of a
   tile) instead of through an NZ copy, and
2. drops a TransData whose result nothing reads any more (and any round trip
   ND -> NZ -> ND, which gives back what it started from).
What changes is data movement: fewer TransData kernels and GM round trips; the
matmul's own A loads become row-strided, which the simulation charges.
"""

from __future__ import annotations

import attrs

from npusim.graph.ir import Graph, Node
from npusim.passes.graph_edit import Editor


def propagate_layouts(graph: Graph) -> Graph:
    ed = Editor(graph)
    nodes = []
    for n in ed.nodes:
        if n.op_type == "matmul" and n.args.format_a == "NZ":
            src = ed.source(n.inputs["a"])
            if src != n.inputs["a"] and graph.tensors[src].format in ("ND", "BSND"):
                n = attrs.evolve(n, params=dict(n.params, format_a="ND"), inputs=dict(n.inputs, a=src))
        nodes.append(n)
    ed.nodes = _without_round_trips(ed, nodes)
    return ed.graph("layout")


def _without_round_trips(ed: Editor, nodes: list[Node]) -> list[Node]:
    """Readers of y = trans_data(trans_data(x, A->B), B->A) read x instead."""
    alias: dict[str, str] = {}
    for n in nodes:
        if n.op_type != "trans_data":
            continue
        first = ed.producer(n.inputs["x"])
        if (first is not None and first.op_type == "trans_data"
                and first.args.src_format == n.args.dst_format):
            alias[n.outputs["y"]] = first.inputs["x"]
    return [attrs.evolve(n, inputs={k: alias.get(t, t) for k, t in n.inputs.items()}) for n in nodes]


__all__ = ["propagate_layouts"]
