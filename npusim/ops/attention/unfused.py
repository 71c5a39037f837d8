"""The unfused 5-kernel attention chain FlashAttention replaces."""

from __future__ import annotations

import math

import numpy as np

from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, GmTensor, Kernel, VecOp
from npusim.ops.build import align_up, cdiv, line_quantum
from npusim.ops.reference import attention, group_heads
from npusim.ops.registry import GmArena, Lowered, lower, register
from npusim.ops.vector_kernels import Stream, streaming_kernel
from npusim.ops.attention.common import AttentionParams, _io


# ================================================================ the unfused chain


class _Renamed(GmArena):
    """A view of an arena under other names: a lowering called from here asks for "a"
    and gets this op's "q", so every tensor of the chain is allocated once."""

    def __init__(self, parent: GmArena, names: dict[str, str]):
        self.parent, self.names = parent, names
        self.bound, self.tensors = parent.bound, parent.tensors

    @property
    def next(self) -> int:
        return self.parent.next

    def tensor(self, name: str, nbytes: int) -> GmTensor:
        return self.parent.tensor(self.names.get(name, name), nbytes)


def _mask_kernel(p: AttentionParams, hw: HwConfig, scores: GmTensor) -> Kernel:
    """Masked fill of the scores in place: hidden keys -> -inf. The mask is built in
    UB (compare of a key-index ramp with each row's limit) and applied by Select.
    # assumption: no [seq_q, seq_kv] mask tensor is read (HF's additive mask would add
    # its bytes); a non-causal chain still runs the kernel (a padding mask)."""
    e = DTYPE_BYTES[p.dtype]
    row = p.seq_kv * e
    pitch = align_up(row, 32)

    def compute(nr, ub_in, ub_out, tmp, consts):
        n = nr * pitch // e
        return [VecOp("compare", n, p.dtype, tmp, (ub_in[0],), "uint8", cdiv(n, 8), 0),
                VecOp("select", n, p.dtype, ub_out[0], (ub_in[0],), flops_per_elem=0)]

    s = Stream(scores, row, 0, 0, pitch if pitch != row else 0)
    return streaming_kernel("attn_mask", "masked_fill", hw, p.batch * p.heads * p.seq_q, [s], [s], compute,
                            tmp_row_bytes=align_up(cdiv(pitch // e, 8), 32), quantum=line_quantum(hw, row))


def reference_attention_unfused(p: AttentionParams, x, specs, ctx) -> dict:
    """softmax(q k^T / sqrt(d) + causal mask) v over BNSD q, k, v; the chain stores the
    scores and the probabilities in the op's dtype."""
    q = x["q"].reshape(p.batch, p.heads, p.seq_q, p.head_dim)
    k, v = (group_heads(x[n].reshape(p.batch, p.kv_heads, p.seq_kv, p.head_dim), p.group) for n in "kv")
    visible = np.ones((p.seq_q, p.seq_kv), dtype=bool)
    if p.causal:
        visible = np.arange(p.seq_kv)[None, :] <= np.arange(p.seq_q)[:, None] + p.seq_kv - p.seq_q
    return {"o": attention(q, k, v, visible, lambda a: ctx.store(a, p.dtype))}


@register("attention_unfused", AttentionParams, reference=reference_attention_unfused, ins=("q", "k", "v"),
          outs=("o",))
def lower_attention_unfused(p: AttentionParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Attention as five kernels: BatchMatMul Q K^T -> Scale -> Mask -> Softmax -> BatchMatMul P V.

    The S x S scores live in GM: QK^T writes them (fp16), Scale and Mask rewrite
    them in place, Softmax writes the probabilities to a second S x S tensor that
    the PV matmul reads. Under GQA the query heads of a group are stacked as the
    matmul's M (q of heads g*j..g*j+g-1 is contiguous), so K and V are read per KV
    head. Every kernel the chain calls allocates through one arena: q, k, v, the
    scores, the probabilities and o exist once."""
    e, grp = DTYPE_BYTES[p.dtype], p.group
    bkv = p.batch * p.kv_heads
    rows = p.batch * p.heads * p.seq_q
    S = gm.tensor("scores", rows * p.seq_kv * e)
    P = gm.tensor("probs", rows * p.seq_kv * e)
    mm = dict(batch=bkv, m=grp * p.seq_q, dtype=p.dtype, out_dtype=p.dtype)
    qk = lower("batch_matmul", dict(mm, n=p.seq_kv, k=p.head_dim, trans_b=True), hw,
               gm=_Renamed(gm, {"a": "q", "b": "k", "c": "scores"}))
    scale = lower("scale", dict(shape=(rows, p.seq_kv), dtype=p.dtype, scale=1.0 / math.sqrt(p.head_dim)), hw,
                  gm=_Renamed(gm, {"x": "scores", "y": "scores"}))
    softmax = lower("softmax", dict(shape=(rows, p.seq_kv), dtype=p.dtype), hw,
                    gm=_Renamed(gm, {"x": "scores", "y": "probs"})).kernels
    pv = lower("batch_matmul", dict(mm, n=p.head_dim, k=p.seq_kv), hw,
               gm=_Renamed(gm, {"a": "probs", "b": "v", "c": "o"}))
    kernels = [*qk.kernels, *scale.kernels, _mask_kernel(p, hw, S), *softmax, *pv.kernels]
    ins, outs = _io(p)
    sxs = S.nbytes
    # the chain's least traffic: q, k, S written; S read and written by scale and mask; S read,
    # P written; P, v read, o written
    return Lowered(
        op_type="attention_unfused", params=p, tiling=None, kernels=kernels,
        flops=4.0 * p.batch * p.heads * p.head_dim * p.seq_q * p.seq_kv,
        min_gm_bytes=float(sum(x.nbytes for x in ins + outs) + 7 * sxs + P.nbytes),
        unit="cube", inputs=ins, outputs=outs,
    )
