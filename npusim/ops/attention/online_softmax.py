"""The online softmax step both attention kernels run on the vector unit, written once.

For a tile of scores S (fp32, `n` elements: rows x keys) and per-row statistics
(running max m, running sum l, rescale alpha; `ns` fp32 words, one 32-byte block a
row as Brcb lays them out):
    m_new = max(m, rowmax(S)); alpha = exp((m - m_new) * scale); m = m_new
    P = exp((S - m_new) * scale); l = l * alpha + rowsum(P); P cast to the cube's dtype
(m starts at -inf, so the first alpha is 0). The caller rescales its output
accumulator by alpha. A per-row statistic is broadcast by the binary op's zero
repeat stride. # assumption: no per-row instruction or scalar round trip
"""

from __future__ import annotations

from attrs import frozen

from npusim.isa.program import VecOp
from npusim.ops.attention.common import STAT

F32 = 4  # bytes of an fp32 score or statistic


@frozen
class Rows:
    """How a tile of scores sits in UB: `rows` rows of `nsub` sub-tiles of `nb` keys,
    sub-tile-major ([nsub][rows][nb] fp32), and the softmax scale."""

    rows: int
    nsub: int
    nb: int
    scale: float


def per_row(rows: int, cols: int) -> tuple:
    """VecOp.pitches of x[rows, cols] (fp32, row-major) op a per-row statistic (one STAT block a row)."""
    return ((rows, cols * F32, cols * F32, STAT), (cols, F32, F32, 0))


def online_softmax(n: int, ns: int, s, m, l_, alpha, red, p_dst, dtype: str, layout: Rows | None = None) -> list:
    """The instructions of one tile (UB addresses: scores s, statistics m / l_ / alpha,
    a reduce scratch red, the cast probabilities p_dst in `dtype`). With `layout` the
    instructions carry what the functional interpreter needs (the scale, the per-row
    broadcasts and reductions as VecOp.pitches); without, they are costed only."""
    reduce = broadcast = ()
    scale = None
    if layout is not None:
        r, nsub, nb, scale = layout.rows, layout.nsub, layout.nb, layout.scale
        tile, row = r * nb * F32, nb * F32
        reduce = ((r, STAT, row), (nsub, 0, tile))  # a row's keys in every sub-tile -> its STAT block
        broadcast = ((nsub, tile, tile, 0), (r, row, row, STAT), (nb, F32, F32, 0))  # s op the row's statistic
    return [VecOp("reduce_max", n, "fp32", red, (s,), out_n=ns, pitches=reduce),
            VecOp("max", ns, "fp32", red, (red, m)), VecOp("sub", ns, "fp32", alpha, (m, red)),
            VecOp("muls", ns, "fp32", alpha, (alpha,), scalar=scale), VecOp("exp", ns, "fp32", alpha, (alpha,)),
            VecOp("copy", ns, "fp32", m, (red,), flops_per_elem=0),
            VecOp("sub", n, "fp32", s, (s, red) if layout else (s,), pitches=broadcast),
            VecOp("muls", n, "fp32", s, (s,), scalar=scale),
            VecOp("exp", n, "fp32", s, (s,)), VecOp("reduce_sum", n, "fp32", red, (s,), out_n=ns, pitches=reduce),
            VecOp("mul", ns, "fp32", l_, (l_, alpha)), VecOp("add", ns, "fp32", l_, (l_, red)),
            VecOp("cast", n, "fp32", p_dst, (s,), dtype, flops_per_elem=0)]
