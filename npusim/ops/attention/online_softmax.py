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

from npusim.isa.program import VecOp


def online_softmax(n: int, ns: int, s, m, l_, alpha, red, p_dst, dtype: str) -> list:
    """The instructions of one tile (UB addresses: scores s, statistics m / l_ / alpha,
    a reduce scratch red, the cast probabilities p_dst in `dtype`)."""
    return [VecOp("reduce_max", n, "fp32", red, (s,), out_n=ns),
            VecOp("max", ns, "fp32", red, (red, m)), VecOp("sub", ns, "fp32", alpha, (m, red)),
            VecOp("muls", ns, "fp32", alpha, (alpha,)), VecOp("exp", ns, "fp32", alpha, (alpha,)),
            VecOp("copy", ns, "fp32", m, (red,), flops_per_elem=0),
            VecOp("sub", n, "fp32", s, (s,)), VecOp("muls", n, "fp32", s, (s,)),
            VecOp("exp", n, "fp32", s, (s,)), VecOp("reduce_sum", n, "fp32", red, (s,), out_n=ns),
            VecOp("mul", ns, "fp32", l_, (l_, alpha)), VecOp("add", ns, "fp32", l_, (l_, red)),
            VecOp("cast", n, "fp32", p_dst, (s,), dtype, flops_per_elem=0)]
