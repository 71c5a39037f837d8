"""Collectives (AllReduce, ReduceScatter, AllGather, AllToAll) as ops on the engine:
HCCL's Mesh and Ring algorithms (algorithms.py), lowered to vector kernels plus
transfer steps on the links (lower.py), with numpy semantics across ranks (exchange.py)."""

from npusim.ops.collectives.algorithms import ALGOS, KINDS, Copy, Reduce, Send, formula_us, pick, steps
from npusim.ops.collectives.lower import CollectiveParams, CollectivePlan, collective_steps, launch_order

__all__ = ["ALGOS", "KINDS", "CollectiveParams", "CollectivePlan", "Copy", "Reduce", "Send", "collective_steps",
           "formula_us", "launch_order", "pick", "steps"]
