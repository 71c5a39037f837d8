"""The decoder graph: tensors and nodes of one decode step or prefill, the baseline
builder, and a numpy executor for functional checks."""

from npusim.graph.build import MASK_VALUE, attention_mask, build_decoder, host_inputs, node_params
from npusim.graph.execute import Execution, cosine, execute, random_kv, random_weights
from npusim.graph.ir import DTYPE_BYTES, FORMATS, KINDS, Graph, GraphError, Node, TensorSpec

__all__ = [
    "DTYPE_BYTES", "FORMATS", "KINDS", "MASK_VALUE", "Execution", "Graph", "GraphError", "Node", "TensorSpec",
    "attention_mask", "build_decoder", "cosine", "execute", "host_inputs", "node_params", "random_kv",
    "random_weights",
]
