"""Operator lowerings: each op type -> tiled kernels for a hardware config.

The op modules are imported as their op types are needed (registry.OP_MODULES):
reading OPS or one of the tables below imports them all."""

from npusim.ops import registry
from npusim.ops.registry import GmArena, Lowered, OpSpec, TensorInfo, lower, ops_where
from npusim.ops.roofline import OpReport, roofline, simulate_op

# Tables passes and the executor need, derived from the descriptors (never kept beside them)
_TABLES = {
    "IN_PLACE_OPS": lambda s: s.in_place,  # the memory plan may give the output an input's buffer
    "KV_READERS": lambda s: s.operands.kv == "read",
    "KV_WRITERS": lambda s: s.operands.kv == "write",
    "CACHE_OPS": lambda s: s.operands.kv is not None,  # ops touching a KV cache: params.kv_cache() says which
}


def __getattr__(name: str):
    if name == "OPS":
        return registry.OPS
    if name in _TABLES:
        table = globals()[name] = ops_where(_TABLES[name])
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CACHE_OPS", "IN_PLACE_OPS", "KV_READERS", "KV_WRITERS", "OPS", "GmArena", "Lowered", "OpReport", "OpSpec",
           "TensorInfo", "lower", "ops_where", "roofline", "simulate_op"]
