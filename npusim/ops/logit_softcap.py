"""Logit soft-capping (Gemma 2): y = cap * tanh(x / cap), applied to attention scores
and to the final logits so that no value leaves (-cap, cap).

One elementwise streaming kernel (npusim.ops.vector's conventions): Muls(1/cap),
Tanh, Muls(cap) - 3 vector ops per element. Tanh is priced by the config's
`aiv.vector_cycles_per_repeat.tanh` (Ascend C's Tanh is a composite of exp, add and
div: assumed about their cost, see hwconfigs/). bf16 is cast to fp32 and back, as
every vector op here does.
"""

from __future__ import annotations

import numpy as np
from attrs import frozen, validators

from npusim.hw import HwConfig
from npusim.ops.reference import eltwise
from npusim.ops.registry import GmArena, Lowered, param, register
from npusim.ops.vector import EltwiseParams, lower_eltwise, vop

SOFTCAP_FLOPS = 3  # per element: muls, tanh, muls


@frozen
class SoftcapParams(EltwiseParams):
    cap: float = param(30.0, "the cap: outputs stay inside (-cap, cap) (Gemma 2: 50 for scores, 30 for logits)",
                       validator=validators.gt(0))


def softcap(p: SoftcapParams, x: np.ndarray) -> np.ndarray:
    """cap * tanh(x / cap), in fp32."""
    cap = np.float32(p.cap)
    return cap * np.tanh(x / cap)


@register("logit_softcap", SoftcapParams, reference=eltwise(softcap, "x"), in_place=True, ins=("x",), outs=("y",))
def lower_logit_softcap(p: SoftcapParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Soft-capping: y = cap * tanh(x / cap), elementwise."""

    def body(n, s, d, t, dt):
        return [vop("muls", n, dt, d, s[0]), vop("tanh", n, dt, d, d), vop("muls", n, dt, d, d)]

    return lower_eltwise("logit_softcap", p, hw, gm, ("x",), body, SOFTCAP_FLOPS)
