"""The runtime: place a graph's tensors in device memory, lower its nodes to
kernels, issue them through the host and streams, and simulate the step."""

from npusim.runtime.compile import CompiledNode, LoweringCache, compile_nodes, host_program
from npusim.runtime.memory import MemoryBreakdown, OutOfMemoryError, Placement, place
from npusim.runtime.run import GraphRun, run_graph

__all__ = [
    "CompiledNode", "GraphRun", "LoweringCache", "MemoryBreakdown", "OutOfMemoryError", "Placement", "compile_nodes",
    "host_program", "place", "run_graph",
]
