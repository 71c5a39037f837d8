"""Operator lowerings: each op type -> tiled kernels for a hardware config."""

from npusim.ops import copy, matmul  # noqa: F401  (register their op types)
from npusim.ops import vector, rowwise, sampling, layout, kv_cache  # noqa: F401
from npusim.ops import attention, geglu, logit_softcap, quant, collectives  # noqa: F401
from npusim.ops.registry import OPS, GmArena, Lowered, OpSpec, TensorInfo, lower, ops_where
from npusim.ops.roofline import OpReport, roofline, simulate_op

# Tables passes and the executor need, derived from the descriptors (never kept beside them)
IN_PLACE_OPS = ops_where(lambda s: s.in_place)  # the memory plan may give the output an input's buffer
KV_READERS = ops_where(lambda s: s.operands.kv == "read")
KV_WRITERS = ops_where(lambda s: s.operands.kv == "write")
CACHE_OPS = KV_WRITERS + KV_READERS  # ops touching a KV cache: params.kv_cache() says which

__all__ = ["CACHE_OPS", "IN_PLACE_OPS", "KV_READERS", "KV_WRITERS", "OPS", "GmArena", "Lowered", "OpReport", "OpSpec",
           "TensorInfo", "lower", "ops_where", "roofline", "simulate_op"]
