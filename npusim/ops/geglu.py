"""GeGLU: Gemma's gated-GELU FFN activation, y = gelu(gate) * up.

The same kernel as SwiGLU (npusim.ops.vector.lower_gated: one [.., 2h] input as the
fused gate_up projection writes it, gate and up read as two strided streams) with
the GELU instruction sequence (tanh form, npusim.ops.vector.gelu_ops) in place of
SiLU's: 7 vector ops for the activation and 1 for the product per element.
"""

from __future__ import annotations

from npusim.hw import HwConfig
from npusim.ops.reference import gated, gelu
from npusim.ops.registry import GmArena, Lowered, register
from npusim.ops.vector import GELU_FLOPS, SwigluParams, gelu_ops, lower_gated


@register("geglu", SwigluParams, reference=gated(gelu), ins=("x",), outs=("y",))
def lower_geglu(p: SwigluParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """GeGLU: y = gelu(gate) * up, gate and up the two halves of one [.., 2h] input."""
    return lower_gated("geglu", p, hw, gm, gelu_ops, GELU_FLOPS)
