"""`copy`: a device-to-device copy by the vector cores (GM -> UB -> GM).

The HBM-bandwidth calibration point is a 256 MiB copy; this is the kernel it is
compared with: every AIV streams its share through UB in large double-buffered
tiles (the UB -> UB move on V is hidden under the DMAs).
"""

from __future__ import annotations

from attrs import frozen, validators

from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, VecOp
from npusim.ops.reference import eltwise
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector_kernels import Stream, streaming_kernel


@frozen
class CopyParams:
    n: int = param(1 << 20, "elements to copy", validator=validators.gt(0))
    dtype: str = param("fp16", "element dtype", validator=validators.in_(tuple(DTYPE_BYTES)))


@register("copy", CopyParams, reference=eltwise(lambda p, a: a, "x"), ins=("x",), outs=("y",))
def lower_copy(p: CopyParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Device-to-device copy of n elements through the vector cores' UB."""
    e = DTYPE_BYTES[p.dtype]
    x = gm.tensor("x", p.n * e)
    y = gm.tensor("y", p.n * e)

    def compute(rows, ub_in, ub_out, tmp, consts):
        return [VecOp("copy", rows, p.dtype, ub_out[0], (ub_in[0],), flops_per_elem=0)]

    kernel = streaming_kernel("copy", "copy", hw, p.n, [Stream(x, e)], [Stream(y, e)], compute,
                              quantum=max(1, hw.l2.line_bytes // e))
    info = TensorInfo("x", (p.n,), p.dtype)
    return Lowered("copy", p, None, [kernel], flops=0.0, min_gm_bytes=2 * p.n * e, unit="vector",
                   inputs=[info], outputs=[TensorInfo("y", (p.n,), p.dtype)])
