"""Sampling on the vector cores (AIV): argmax and top-k over the vocabulary.

(see npusim.ops.vector for the conventions every vector op follows)."""

from __future__ import annotations

import math

import numpy as np
from attrs import frozen, validators

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, Mem
from npusim.ops.build import align_up, capacity_text, cdiv
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector_kernels import Stream, streaming_kernel
from npusim.ops.vector import (
    UB_BLOCK, dtype_validator, vector_lowered, cast, numel, per_row, quantum, scalar_read, shape_validator, vop,
)


def reference_argmax(p, x, specs, ctx) -> dict:
    return {"index": np.argmax(x["logits"].reshape(-1, p.shape[-1]), axis=-1).astype(np.int32)}


def reference_top_k(p, x, specs, ctx) -> dict:
    """The exponential race over each row's k largest logits: argmax_i exp(v_i - v_max) / q_i
    with q = noise [.., k] (Exp(1) draws), i over the top k in descending order."""
    logits = x["logits"].reshape(-1, p.shape[-1])
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :p.k]
    v = np.take_along_axis(logits, top, axis=-1)
    race = np.exp(v - v[:, :1]) / x["noise"].reshape(-1, p.k)
    return {"token": np.take_along_axis(top, np.argmax(race, axis=-1)[:, None], axis=-1)[:, 0].astype(np.int32)}

# A [batch, vocab] row is usually too long for one core to be quick (and batch is
# smaller than the core count), so both ops split each row into `parts` chunks:
# kernel 1 reduces every chunk to a partial record in a GM workspace, kernel 2
# combines each row's partials. Chunks are a divisor of the vocab so they never
# straddle rows.

RECORD_BYTES = 32  # an argmax partial: (value, index) padded to one 32-byte block
MIN_CHUNK_BYTES = 4096  # assumed: a shorter chunk costs more in start-ups than it saves


@frozen
class ArgmaxParams:
    shape: tuple = param((8, 64000), "logits [.., vocab]; the argmax is over the last dim",
                         validator=shape_validator())
    dtype: str = param("fp16", "dtype of the logits", validator=dtype_validator())


@frozen
class TopKParams:
    shape: tuple = param((8, 64000), "logits [.., vocab]", validator=shape_validator())
    dtype: str = param("fp16", "dtype of the logits", validator=dtype_validator())
    k: int = param(50, "candidates kept per row", validator=validators.gt(0))


def _divisors(n: int) -> list[int]:
    """The divisors of n, in increasing order, found up to sqrt(n) (a walk to n took
    minutes on a vocab of 1e9)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def _split_vocab(op: str, hw: HwConfig, rows: int, vocab: int, e: int, ub_per_elem: int, ub_fixed: int,
                 min_chunk: int = 1) -> int:
    """Chunks per row: the fewest (a divisor of vocab) that give every AIV a chunk and
    whose UB need (ub_per_elem bytes per element + ub_fixed) fits; else the most that
    fit. A chunk is never shorter than min_chunk elements (nor than a few KiB: shorter
    ones are not worth a core)."""
    budget = hw.aiv.ub_bytes - 1024  # alignment slack of the buffers
    shortest = max(min_chunk, MIN_CHUNK_BYTES // e)

    def fits(p: int) -> bool:
        return align_up(vocab // p * e, UB_BLOCK) // e * ub_per_elem + ub_fixed <= budget

    want = cdiv(hw.aiv_count, rows)
    ok = [p for p in _divisors(vocab) if (p == 1 or vocab // p >= shortest) and fits(p)]
    if not ok:
        raise ProgramError(f"op {op}: shape[-1]={vocab} has no divisor that makes a chunk fit "
                           f"{capacity_text(hw, Mem.UB)} at {ub_per_elem} bytes per element")
    enough = [p for p in ok if p >= want]
    return min(enough) if enough else max(ok)


@register("argmax", ArgmaxParams, reference=reference_argmax, ins=("logits",), outs=("index",))
def lower_argmax(p: ArgmaxParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Greedy sampling: the index of each row's largest logit (int32)."""
    *lead, vocab = p.shape
    rows, e = (numel(lead) if lead else 1), DTYPE_BYTES[p.dtype]
    x = gm.tensor("logits", rows * vocab * e)  # first: logits past the HBM are refused before the split
    parts = _split_vocab("argmax", hw, rows, vocab, e, 2 * e, 2 * RECORD_BYTES)
    chunk = vocab // parts
    pitch = align_up(chunk * e, UB_BLOCK)
    idx = gm.tensor("index", rows * 4)
    chunk_in = Stream(x, chunk * e, 0, 0, pitch if pitch != chunk * e else 0)

    if parts == 1:  # whole rows: one kernel
        def one(nr, ub_in, ub_out, tmp, consts):
            return [vop("reduce_max", nr * (pitch // e), p.dtype, tmp, ub_in[0], out_n=2 * nr),
                    vop("gather", nr, "int32", ub_out[0], tmp, flops=0)]

        k = streaming_kernel("argmax", "argmax", hw, rows, [chunk_in], [Stream(idx, 4)], one,
                             tmp_row_bytes=RECORD_BYTES)
        return vector_lowered("argmax", p, [k], rows * vocab, [TensorInfo("logits", p.shape, p.dtype)],
                        [TensorInfo("index", tuple(lead) or (1,), "int32")])

    units = rows * parts
    ws = gm.tensor("workspace", units * RECORD_BYTES)

    def partial(nr, ub_in, ub_out, tmp, consts):  # ReduceMax with its index, per chunk
        return [vop("reduce_max", nr * (pitch // e), p.dtype, ub_out[0], ub_in[0], out_n=2 * nr)]

    k1 = streaming_kernel("argmax_partial", "argmax", hw, units, [chunk_in], [Stream(ws, RECORD_BYTES)], partial,
                          quantum=quantum(hw, units, chunk * e))

    def combine(nr, ub_in, ub_out, tmp, consts):
        # the winning chunk's record, then index = chunk * chunk_len + local index
        best, local = tmp
        return [vop("reduce_max", nr * parts, p.dtype, best, ub_in[0], out_n=2 * nr),
                vop("gather", nr, "int32", local, ub_in[0], flops=0),
                vop("muls", nr, "int32", best, best), vop("add", nr, "int32", ub_out[0], best, local)]

    k2 = streaming_kernel("argmax_combine", "argmax", hw, rows, [Stream(ws, parts * RECORD_BYTES)],
                          [Stream(idx, 4)], combine, tmp_row_bytes=[RECORD_BYTES, 4], quantum=rows)
    return vector_lowered("argmax", p, [k1, k2], rows * vocab + rows * parts, [TensorInfo("logits", p.shape, p.dtype)],
                    [TensorInfo("index", tuple(lead) or (1,), "int32")], workspace_bytes=units * RECORD_BYTES)


def _merge_ops(nr: int, lists: int, length: int, k: int, pairs: int, src: int, dst: int) -> tuple[list, int]:
    """4-way merges (MrgSort4) of `lists` sorted lists of up to `length` pairs (`pairs`
    in all) per unit, each merged list cut to its best k, until one list remains.
    Returns (instructions, the buffer holding the result). A pair is 8 bytes (fp32
    value, uint32 index) = 2 fp32 slots; merges ping-pong between src and dst."""
    ops = []
    while lists > 1:
        pairs_in = min(pairs, lists * min(length, k))
        lists, length = cdiv(lists, 4), min(4 * length, k)
        pairs = min(pairs_in, lists * length)
        ops.append(vop("mrgsort", 2 * nr * pairs_in, "fp32", dst, src, out_n=2 * nr * pairs, flops=0))
        src, dst = dst, src
    return ops, src


@register("top_k", TopKParams, reference=reference_top_k, ins=("logits", "noise"), outs=("token",))
def lower_top_k(p: TopKParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
    """Top-k sampling: draw one token per row from its k largest logits (int32)."""
    # Modelled: kernel 1 sorts each vocab chunk (Sort32 over groups of 32, then 4-way
    # MrgSort levels, every merged list cut to its best k) and writes the chunk's top
    # k (value, index) pairs to a workspace; kernel 2 merges a row's chunk lists down
    # to its top k, then draws by the exponential race (as vLLM does): token =
    # argmax_i exp(v_i - v_max) / q_i with q ~ Exp(1) from the `noise` input [.., k].
    *lead, vocab = p.shape
    rows, e, k = (numel(lead) if lead else 1), DTYPE_BYTES[p.dtype], p.k
    if k > vocab:
        raise ProgramError(f"op top_k: k={k} exceeds the vocabulary shape[-1]={vocab}")
    pair = 8
    out_pitch = align_up(k * pair, UB_BLOCK)
    x = gm.tensor("logits", rows * vocab * e)  # first: logits past the HBM are refused before the split
    # UB per element of a chunk: logits ping+pong, fp32 values, indices, pairs, merge scratch
    parts = _split_vocab("top_k", hw, rows, vocab, e, 2 * e + 4 + 4 + 2 * pair, 2 * out_pitch, min_chunk=k)
    chunk = vocab // parts
    if chunk < k:
        raise ProgramError(f"op top_k: k={k} is larger than a vocab chunk ({chunk} of shape[-1]={vocab})")
    pitch = align_up(chunk * e, UB_BLOCK)
    cp = pitch // e
    noise = gm.tensor("noise", rows * k * 4)
    tok = gm.tensor("token", rows * 4)
    units = rows * parts
    ws = gm.tensor("workspace", units * k * pair)

    def chunk_topk(nr, ub_in, ub_out, tmp, consts):
        vals, ids, pa, pb = tmp
        n = nr * cp
        ops = [cast(n, p.dtype, "fp32", vals, ub_in[0])] if p.dtype != "fp32" else []
        src = vals if p.dtype != "fp32" else ub_in[0]
        ops += [vop("dup", n, "int32", ids, flops=0),  # CreateVecIndex (+ chunk offset)
                vop("sort32", n, "fp32", pa, src, ids, out_n=2 * n)]
        merge, res = _merge_ops(nr, cdiv(cp, 32), 32, k, cp, pa, pb)
        return ops + merge + [vop("copy", 2 * nr * k, "fp32", ub_out[0], res, flops=0)]

    k1 = streaming_kernel(
        "top_k_chunks", "top_k", hw, units, [Stream(x, chunk * e, 0, 0, pitch if pitch != chunk * e else 0)],
        [Stream(ws, k * pair, 0, 0, out_pitch if out_pitch != k * pair else 0)], chunk_topk,
        tmp_row_bytes=[cp * 4, cp * 4, cp * pair, cp * pair])

    row_pairs = parts * k
    row_pitch = align_up(row_pairs * pair, UB_BLOCK)
    kp = align_up(k * 4, UB_BLOCK) // 4  # a row of k fp32 values, padded to 32 bytes

    def draw(nr, ub_in, ub_out, tmp, consts):
        pa, v, best = tmp
        merge, res = _merge_ops(nr, parts, k, k, parts * k, ub_in[0], pa)
        n = nr * kp
        ops = merge + [vop("gather", n, "fp32", v, res, flops=0)]  # the values out of the pairs
        ops += scalar_read()  # each row's max is its first pair
        ops += per_row(nr, kp * 4, lambda at: [vop("adds", kp, "fp32", at(v), at(v))])
        ops += [vop("exp", n, "fp32", v, v), vop("div", n, "fp32", v, v, ub_in[1]),
                vop("reduce_max", n, "fp32", best, v, out_n=2 * nr),
                vop("gather", nr, "int32", ub_out[0], res, flops=0)]  # vocab index of the winner
        return ops

    k2 = streaming_kernel(
        "top_k_draw", "top_k", hw, rows,
        [Stream(ws, row_pairs * pair, 0, 0, row_pitch if row_pitch != row_pairs * pair else 0),
         Stream(noise, k * 4, 0, 0, kp * 4 if kp * 4 != k * 4 else 0)],
        [Stream(tok, 4)], draw, tmp_row_bytes=[row_pitch, kp * 4, RECORD_BYTES])
    # one comparison per logit (a selection needs at least that) + the draw over k per row
    return vector_lowered("top_k", p, [k1, k2], rows * vocab + 4 * rows * k,
                    [TensorInfo("logits", p.shape, p.dtype), TensorInfo("noise", (*lead, k), "fp32")],
                    [TensorInfo("token", tuple(lead) or (1,), "int32")], workspace_bytes=units * k * pair)
