"""How the host runs a graph: streams, synchronisation and launch mode.

The baseline is what an eager framework does op by op: one stream, a
synchronize after every kernel (the host waits for the device before it issues
the next launch, so the device idles for every launch) and eager launches. The
passes change one aspect each:
- streams: independent work goes to a second stream, so two small kernels can
  share the cores; the runtime puts an event wherever a node depends on work of
  the other stream (read after write, and write after read / write of the same
  bytes, which a memory plan's reuse can create);
- sync: no synchronize until the end of the step: stream order and events carry
  every dependency;
- launch: graph mode (the step captured once and replayed: a small per-kernel
  host cost instead of a full eager launch).
"""

from __future__ import annotations

import attrs
from attrs import field, frozen

from npusim.graph.ir import Graph

SYNC_POLICIES = ("every_op", "events")


@frozen
class Schedule:
    """stream: node name -> stream index (a node not listed runs on stream 0)."""

    streams: dict[str, int] = field(factory=dict, converter=dict)
    sync: str = field(default="every_op", validator=attrs.validators.in_(SYNC_POLICIES))
    launch: str = field(default="eager", validator=attrs.validators.in_(("eager", "graph")))

    def stream(self, node: str) -> int:
        return self.streams.get(node, 0)


def schedule_of(graph: Graph) -> Schedule:
    return graph.schedule if graph.schedule is not None else Schedule()


def _with(graph: Graph, name: str, **changes) -> Graph:
    return attrs.evolve(graph, schedule=attrs.evolve(schedule_of(graph), **changes),
                        applied=(*graph.applied, name))


def assign_streams(graph: Graph) -> Graph:
    """Side chains go to stream 1. A node that reads nothing its predecessor on the
    main stream wrote starts a side chain (rope of k and the KV-cache write beside
    rope of q); the chain goes on while each node reads its predecessor's output
    and nothing the node before the fork wrote; the first node that does not is
    the join, back on the main stream. Everything else stays on stream 0."""
    streams: dict[str, int] = {}
    fork = None  # the main-stream node the current side chain runs beside
    for i, n in enumerate(graph.nodes):
        reads = set(n.inputs.values())
        prev = graph.nodes[i - 1] if i else None
        if prev is None:
            s = 0
        elif streams[prev.name] == 0:
            s = 0 if reads & set(prev.outputs.values()) else 1
            fork = prev if s else None
        else:
            chained = reads & set(prev.outputs.values()) and not reads & set(fork.outputs.values())
            s = 1 if chained else 0
        streams[n.name] = s
    return _with(graph, "streams", streams={k: v for k, v in streams.items() if v})


def sync_by_events(graph: Graph) -> Graph:
    return _with(graph, "sync", sync="events")


def graph_launch(graph: Graph) -> Graph:
    return _with(graph, "launch", launch="graph")


__all__ = ["SYNC_POLICIES", "Schedule", "assign_streams", "graph_launch", "schedule_of", "sync_by_events"]
