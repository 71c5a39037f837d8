"""Operator lowerings: each op type -> tiled kernels for a hardware config."""

from npusim.ops import copy, matmul  # noqa: F401  (register their op types)
from npusim.ops import vector, layout  # noqa: F401
from npusim.ops import attention  # noqa: F401
from npusim.ops.registry import OPS, GmArena, Lowered, TensorInfo, lower
from npusim.ops.roofline import OpReport, roofline, simulate_op

__all__ = ["OPS", "GmArena", "Lowered", "OpReport", "TensorInfo", "lower", "roofline", "simulate_op"]
