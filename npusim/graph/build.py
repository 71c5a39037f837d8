"""The baseline decoder graph: every operator unfused, as an eager framework runs it.

    embedding
    per layer: rms_norm -> q, k, v matmuls (three GEMMs) -> rope(q), rope(k)
               -> kv_cache_write (per_layer cache) -> batch_matmul Q K^T -> scale
               -> [add mask] -> softmax -> batch_matmul P V -> o matmul -> add (residual)
               -> rms_norm -> gate, up matmuls -> silu -> mul -> down matmul -> add (residual)
               (a MoE layer's FFN: router, permute, grouped expert GEMMs, combine; the
               blocks are npusim.graph.blocks)
    [prefill, mixed: gather each sequence's last token]
    final rms_norm -> lm_head matmul -> argmax

Passes (fusion, layout, memory planning, KV layout, ...) start from this graph.

Conventions
- Activations are token-major, [batch x seq, ...]: seq = 1 in decode, the longest
  prompt in prefill. Weights are Linear weights [out, in], multiplied with trans_b.
- Q after RoPE and the attention output are BSND ([batch, seq, heads, head_dim]);
  the attention batch matmuls read / write them per head through strides. The K/V
  caches are per layer [batch, kv_heads, context, head_dim] (BNSD), written by
  kv_cache_write (which does the token-major -> head-major move) and read from there.
- GQA: the query heads sharing a K/V head are folded into the batch matmul's M:
  batch = batch x kv_heads, m = group x seq. Scores are [batch, heads, seq, context].
- Ragged batches: shapes use the longest length; `Graph.lengths` keeps each
  sequence's own. In decode a sequence of length L writes its new token at position
  L - 1 and attends to L keys; when lengths differ an additive mask hides each
  sequence's padding keys (the lowering writes and reads at the longest length: the
  cost of a padded batch). In prefill the causal mask also covers right padding.
- Mixed steps (chunked prefill): the decodes' and the chunks' tokens are the rows
  of one step ([1, tokens] where the others have [batch, seq]); attention has a
  part for each (build_decoder's doc).
- Host inputs: "tokens" (int32 ids), "rope_cos" / "rope_sin" ([tokens, head_dim],
  gathered at each token's position), "attn_mask" (prefill or ragged decode) and
  "last_index" (prefill). `host_inputs` computes them.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from npusim.errors import ConfigError
from npusim.graph.blocks import GraphBuilder, Layer, attention_block, ffn_block
from npusim.graph.ir import Graph
from npusim.workload import Workload, load_workload

# Added to the scores of hidden (query, key) pairs: exp() of it is 0 in fp16 and
# fp32, and it stays far from the fp16 limit when added to a score.
MASK_VALUE = -10000.0


# The dim tensor parallelism (Megatron) splits of each weight a layer may have: Q, K, V
# (and their biases), gate and up by output rows, O and down by input columns - in a MoE
# layer each expert's gate, up and down, and the shared experts', alike.
TP_SPLIT_DIMS = {"wq": 0, "wk": 0, "wv": 0, "bq": 0, "bk": 0, "bv": 0, "w_gate": 0, "w_up": 0, "wo": 1, "w_down": 1,
                 "w_gate_experts": 1, "w_up_experts": 1, "w_down_experts": 2,
                 "w_gate_shared": 0, "w_up_shared": 0, "w_down_shared": 1}


def shard_weight_shapes(w: Workload, tp: int = 1, ep: int = 1, layer: int | None = None) -> dict[str, tuple[int, ...]]:
    """One device's weights of layer `layer` (None: the last) under a parallel plan: each
    weight of TP_SPLIT_DIMS split along its dim over `tp`; under expert parallelism
    (`ep`) each expert weight holds experts / ep whole experts, and the shared experts
    stay whole (each device runs them on its own tokens); norms and the router replicated."""
    shapes = dict(w.layer_weight_shapes(layer))
    for name, shape in shapes.items():
        shape = list(shape)
        if ep > 1 and name.endswith("_experts"):
            shape[0] //= ep
        elif name in TP_SPLIT_DIMS and not (ep > 1 and name.endswith("_shared")):
            shape[TP_SPLIT_DIMS[name]] //= tp
        shapes[name] = tuple(shape)
    return shapes


def check_tp(w: Workload, tp: int) -> None:
    """ConfigError unless `tp` splits the heads, the K/V heads and the FFN (a MoE layer:
    each expert's FFN) evenly."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"--tp: expected a positive integer, got {tp!r}")
    dense = not w.is_moe or w.first_dense_layers > 0  # layers with the dense FFN
    sizes = (("heads", w.heads), ("kv_heads", w.kv_heads)) + ((("ffn_size", w.ffn_size),) if dense else ()) + (
        (("expert_ffn_size", w.expert_ffn_size),) if w.is_moe else ())
    for key, n in sizes:
        if n % tp:
            raise ConfigError(f"--tp {tp} does not divide {w.name}'s {key} {n}")


def check_ep(w: Workload, ep: int) -> None:
    """ConfigError unless `ep` splits the workload's routed experts evenly."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise ConfigError(f"--ep: expected a positive integer, got {ep!r}")
    if ep == 1:
        return
    if not w.is_moe:
        raise ConfigError(f"--ep {ep}: {w.name} has no experts to place (expert parallelism is for mlp: moe)")
    if w.experts % ep:
        raise ConfigError(f"--ep {ep} does not divide {w.name}'s experts {w.experts} (each device holds "
                          "experts / ep of them)")


def check_sp(w: Workload, phase: str, lengths: Sequence[int], sp: int) -> None:
    """ConfigError unless `sp` can split this step's sequences evenly (a prefill of equal prompts)."""
    if isinstance(sp, bool) or not isinstance(sp, int) or sp < 1:
        raise ConfigError(f"--sp: expected a positive integer, got {sp!r}")
    if sp == 1:
        return
    if phase != "prefill":
        raise ConfigError(f"--sp {sp}: sequence parallel splits a prefill's prompt; a decode step has one token")
    if len(set(lengths)) > 1 or lengths[0] % sp:
        raise ConfigError(f"--sp {sp} must divide the prompt length evenly, got lengths {_short_lengths(lengths)}")


def _short_lengths(lengths: Sequence[int]) -> str:
    return str(lengths[0]) if len(set(lengths)) == 1 else ",".join(map(str, lengths[:8]))


# the workload fields that shape each node the builder makes (by its name in a layer, 'L3.'
# and a pass's '.to_nz' or '+next' left off): a node whose kernel the config cannot run is
# named by them (runtime.compile). Nodes whose shapes are the step's as much (qk, softmax:
# the context length) are left out.
NODE_KEYS = {
    "embedding": ("hidden_size",), "last_token": ("hidden_size",), "attn_norm": ("hidden_size",),
    "ffn_norm": ("hidden_size",), "final_norm": ("hidden_size",), "attn_residual": ("hidden_size",),
    "ffn_residual": ("hidden_size",),
    "q_proj": ("hidden_size", "heads", "head_dim"), "o_proj": ("hidden_size", "heads", "head_dim"),
    "k_proj": ("hidden_size", "kv_heads", "head_dim"), "v_proj": ("hidden_size", "kv_heads", "head_dim"),
    "qkv_proj": ("hidden_size", "heads", "kv_heads", "head_dim"),
    "rope_q": ("heads", "head_dim"), "rope_k": ("kv_heads", "head_dim"), "kv_cache_write": ("kv_heads", "head_dim"),
    "attention": ("heads", "head_dim"),
    "gate_proj": ("hidden_size", "ffn_size"), "up_proj": ("hidden_size", "ffn_size"),
    "down_proj": ("hidden_size", "ffn_size"), "gate_up_proj": ("hidden_size", "ffn_size"), "swiglu": ("ffn_size",),
    "silu": ("ffn_size",), "mul": ("ffn_size",),
    "experts_gate_proj": ("hidden_size", "expert_ffn_size"), "experts_up_proj": ("hidden_size", "expert_ffn_size"),
    "experts_down_proj": ("hidden_size", "expert_ffn_size"), "experts_silu": ("expert_ffn_size",),
    "experts_mul": ("expert_ffn_size",), "router": ("hidden_size", "experts"), "moe_gating": ("experts",),
    "lm_head": ("hidden_size", "vocab_size"), "sample": ("vocab_size",),
}


def node_keys(name: str) -> tuple[str, ...]:
    """The workload fields that shape the node called `name` (NODE_KEYS); () if not known."""
    role = name.split(".", 1)[1] if name[:1] == "L" and name.split(".", 1)[0][1:].isdigit() and "." in name else name
    return NODE_KEYS.get(role.split("+", 1)[0].removesuffix(".to_nz"), ())


def build_decoder(workload: Workload | str, phase: str = "decode", batch: int = 1,
                  lengths: int | Sequence[int] | None = None, capacity: int | None = None,
                  new_tokens: Sequence[int] | None = None, tp: int = 1, sp: int = 1, ep: int = 1) -> Graph:
    """The baseline (unfused) graph of one decode step, one prefill or one mixed step.

    `workload`: a Workload or a name / path for load_workload. `phase`: "decode"
    (one new token per sequence; `lengths` = context length of each sequence
    including the new token), "prefill" (`lengths` = prompt lengths) or "mixed"
    (a chunked-prefill iteration: `new_tokens` per sequence, 1 for a decode and
    more for a prefill chunk, the decodes first; `lengths` = each sequence's
    context after the step, its chunk included). `lengths`: one int for every
    sequence or one per sequence (ragged); default: the workload's max context in
    decode, 128 tokens in prefill. Shapes use the longest length (or `capacity`, a
    shape bucket at least that long: the step then computes on padding, masked);
    the graph records every sequence's own.

    A mixed step runs its decode tokens and its chunks' tokens as the rows of one
    set of projections and FFN (one weight read for all of them); attention has
    two parts, the decodes' (one query each) and the chunks' (each chunk's
    queries over its cache, causal, ending at the chunk), each with its own KV
    cache and both writing their rows of one attention output.
    # assumption: both attention parts are shaped at the step's longest context
    # (one padded length, as a ragged decode batch), the chunks at the longest chunk

    `tp`: the graph of one device of a tensor-parallel group of `tp` (its shard of
    the heads and the FFN, an all_reduce after the O and down projections). `sp`:
    the graph of one device of a sequence-parallel prefill over `sp` devices: it
    holds 1/sp of each prompt's tokens and all_gathers every layer's K and V to
    attend over the whole prompt. The device simulated is the last: under the
    causal mask it attends to the most keys, so it is the slowest and sets the
    step's time.

    `ep`: the graph of one device of an expert-parallel group of `ep` (each runs its own
    `batch` sequences' attention - data parallel - and holds experts / ep of every MoE
    layer's experts; an all_to_all sends each token's rows to its experts' devices and
    one brings them back: npusim.graph.blocks.moe_ffn). With `tp` too, attention is
    tensor parallel in groups of `tp` devices (ep / tp groups, each its own `batch`
    sequences) and each device of a group sends its share of the group's tokens to
    the experts, the group all_gathering the layer's output after.
    """
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    check_tp(w, tp)
    check_ep(w, ep)
    lengths = step_lengths(w, phase, batch, lengths)
    chunks = _new_tokens(w, phase, batch, lengths, new_tokens)
    decode = phase == "decode"
    ctx = max(lengths)
    if capacity is not None:
        if capacity < ctx or capacity > w.max_context_tokens:
            raise ConfigError(f"build_decoder({w.name}, {phase}): capacity {capacity} must be between the longest "
                              f"length {ctx} and max_context_tokens {w.max_context_tokens}")
        ctx = capacity
    check_sp(w, phase, lengths, sp)
    h, d, nh, v = w.hidden_size, w.head_dim, w.heads // tp, w.vocab_size
    dt = w.dtype
    # the attention parts: (name prefix, sequences, new tokens each, masked)
    if phase == "mixed":
        n_dec = sum(x == 1 for x in chunks)
        dec_ragged = any(x < ctx for x in lengths[:n_dec])
        parts = [p for p in (("", n_dec, 1, dec_ragged), ("chunk_", batch - n_dec, max(chunks), True)) if p[1]]
        rows = (1, sum(pb * ps for _, pb, ps, _ in parts))  # [1, tokens]: the step's tokens as one sequence
    else:
        s = 1 if decode else ctx // sp  # new tokens per sequence (on this device)
        ragged = len(set(lengths)) > 1 or ctx > max(lengths)  # some sequence shorter than the shapes
        parts = [("", batch, s, not decode or ragged)]
        rows = (batch, s)
    n = rows[0] * rows[1]  # token-major rows

    b = GraphBuilder(w)
    tokens = b.tensor("tokens", (n,), "input", "int32")
    cos = b.tensor("rope_cos", (n, d), "input")
    sin = b.tensor("rope_sin", (n, d), "input")
    inputs = [tokens, cos, sin]
    for p, pb, ps, masked in parts:
        if masked:
            inputs.append(b.tensor(f"{p}attn_mask", (pb, nh, ps, ctx), "input"))
    gather = phase == "prefill" or n > batch  # only each sequence's last new token needs logits
    if gather:
        inputs.append(b.tensor("last_index", (batch,), "input", "int32"))

    embed = b.weight("embed", (v, h))
    x = b.tensor("embeddings", (n, h))
    b.node("embedding", "embedding", dict(tokens=n, vocab=v, hidden=h, dtype=dt),
           {"ids": tokens, "table": embed}, {"y": x})

    for i in range(w.layers):
        layer = Layer(b, i, n, tp, shard_weight_shapes(w, tp, ep, i), ep)
        x_attn = attention_block(layer, x, rows, parts, cos, sin, batch, ctx, sp, phase, _attention)
        x = ffn_block(w, i)(layer, x_attn)

    if gather:  # logits only for each sequence's last new token: a row gather
        last = b.tensor("last_hidden", (batch, h))
        b.node("last_token", "embedding", dict(tokens=batch, vocab=n, hidden=h, dtype=dt),
               {"ids": "last_index", "table": x}, {"y": last})
        x = last
    final = b.tensor("final_norm_out", (batch, h))
    b.node("final_norm", "rms_norm", dict(shape=(batch, h), dtype=dt, eps=w.norm_eps),
           {"x": x, "gamma": b.weight("final_norm", (h,))}, {"y": final})
    head = embed if w.tie_embeddings else b.weight("lm_head", (v, h), format="NZ")
    logits = b.tensor("logits", (batch, v), "output")
    b.matmul("lm_head", final, head, logits, batch, v, h, None)
    next_tokens = b.tensor("next_tokens", (batch,), "output", "int32")
    b.node("sample", "argmax", dict(shape=(batch, v), dtype=dt), {"logits": logits}, {"index": next_tokens})

    parted = tuple(f"L{i}.attn" for i in range(w.layers)) if len(parts) > 1 else ()
    return Graph(b.tensors, b.nodes, inputs, (logits, next_tokens), phase, batch, lengths, w,
                 capacity=capacity if capacity != max(lengths) else None, new_tokens=chunks,
                 written_in_parts=parted, tp=tp, sp=sp, ep=ep).check()


def _attention(b: GraphBuilder, P: str, i: int, q_rot: str, k_rot: str, val: str, attn: tuple[str, tuple],
               batch: int, s: int, ctx: int, masked: bool, mask: str, position: int, tp: int = 1,
               written: int | None = None) -> None:
    """One attention part, unfused: the new K and V into this part's per-layer caches
    [batch, kv_heads, ctx, head_dim], then QK^T, scale, [mask], softmax, PV into the
    attention output `attn` (name, shape; declared by the first part). Node and
    tensor names start with `P` (the layer's prefix and the part's). `tp`: the
    heads are this device's shard; `written`: tokens written into the cache (a
    sequence-parallel prefill's gathered prompt; default `s`)."""
    w, dt = b.w, b.w.dtype
    d, nh, kvh, g = w.head_dim, w.heads // tp, w.kv_heads // tp, w.group
    k_cache = b.tensor(P + "k_cache", (batch, kvh, ctx, d), "kv")
    v_cache = b.tensor(P + "v_cache", (batch, kvh, ctx, d), "kv")
    b.node(P + "kv_cache_write", "kv_cache_write",
           dict(batch=batch, kv_heads=kvh, head_dim=d, new_tokens=written or s, context=ctx, layers=w.layers,
                layer=i,
                position=position, layout="per_layer", dtype=dt),
           {"k": k_rot, "v": val}, {"k_cache": k_cache, "v_cache": v_cache}, i)
    scores_shape = (batch, nh, s, ctx)
    scores = b.tensor(P + "scores", scores_shape)
    b.node(P + "qk", "batch_matmul",
           dict(batch=batch * kvh, m=g * s, n=ctx, k=d, dtype=dt, out_dtype=dt, trans_b=True),
           {"a": q_rot, "b": k_cache}, {"c": scores}, i)
    scaled = b.tensor(P + "scores_scaled", scores_shape)
    b.node(P + "scale", "scale", dict(shape=scores_shape, dtype=dt, scale=1.0 / math.sqrt(d)),
           {"x": scores}, {"y": scaled}, i)
    if masked:
        masked_scores = b.tensor(P + "scores_masked", scores_shape)
        b.node(P + "mask", "add", dict(shape=scores_shape, dtype=dt),
               {"x1": scaled, "x2": mask}, {"y": masked_scores}, i)
        scaled = masked_scores
    probs = b.tensor(P + "probs", scores_shape)
    b.node(P + "softmax", "softmax", dict(shape=scores_shape, dtype=dt), {"x": scaled}, {"y": probs}, i)
    attn, attn_shape = attn
    if attn not in b.tensors:
        b.tensor(attn, attn_shape, format="BSND")
    b.node(P + "pv", "batch_matmul",
           dict(batch=batch * kvh, m=g * s, n=d, k=ctx, dtype=dt, out_dtype=dt, trans_b=False),
           {"a": probs, "b": v_cache}, {"c": attn}, i)


# Sequences in one step, at most (assumed): far above what a device batches, and
# low enough that a typo cannot make the builder list millions of lengths.
MAX_BATCH = 1 << 16


def step_lengths(w: Workload, phase: str, batch: int, lengths) -> tuple[int, ...]:
    """The checked length of each of a step's `batch` sequences (`lengths`: one for all,
    one each, or None for the phase's default)."""
    where = f"build_decoder({w.name}, {phase})"
    if phase not in ("decode", "prefill", "mixed"):
        raise ConfigError(f"{where}: phase must be decode or prefill (or mixed, with new_tokens), got {reprlib.repr(phase)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"{where}: batch must be a positive integer, got {batch!r}")
    if batch > MAX_BATCH:
        raise ConfigError(f"{where}: batch {batch} is more than the {MAX_BATCH} sequences a step may have")
    several = isinstance(lengths, Iterable) and not isinstance(lengths, (str, bytes, Mapping))
    if not (lengths is None or several or isinstance(lengths, (int, np.integer))):
        raise ConfigError(f"{where}: lengths must be an integer or one per sequence, got {type(lengths).__name__}")
    if lengths is None:
        lengths = w.max_context_tokens if phase == "decode" else min(128, w.max_context_tokens)
    if isinstance(lengths, (int, np.integer)) and not isinstance(lengths, bool):
        lengths = (int(lengths),) * batch
    lengths = tuple(lengths)
    if len(lengths) != batch:
        raise ConfigError(f"{where}: {len(lengths)} lengths for batch {batch}")
    for x in lengths:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
            raise ConfigError(f"{where}: lengths must be positive integers, got {x!r}")
        if x > w.max_context_tokens:
            raise ConfigError(f"{where}: length {x} exceeds the workload's max_context_tokens "
                              f"{w.max_context_tokens}")
    return tuple(int(x) for x in lengths)


def _new_tokens(w: Workload, phase: str, batch: int, lengths: tuple[int, ...], new_tokens) -> tuple[int, ...]:
    """A mixed step's new tokens per sequence, checked (() for the other phases)."""
    where = f"build_decoder({w.name}, {phase})"
    if phase != "mixed":
        if new_tokens is not None:
            raise ConfigError(f"{where}: new_tokens is for the mixed phase only")
        return ()
    several = isinstance(new_tokens, Iterable) and not isinstance(new_tokens, (str, bytes, Mapping))
    if not several or len(tuple(new_tokens)) != batch:
        raise ConfigError(f"{where}: new_tokens must list one count per sequence ({batch}), got "
                          f"{reprlib.repr(new_tokens)}")
    out = tuple(new_tokens)
    for x, n in zip(out, lengths):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 1 <= x <= n:
            raise ConfigError(f"{where}: new_tokens must be positive integers no longer than their "
                              f"sequence's length, got {x!r} for length {n}")
    if list(out) != sorted(out, key=lambda x: x > 1):
        raise ConfigError(f"{where}: new_tokens must list the decodes (1) before the prefill chunks, got "
                          f"{reprlib.repr(out)}")
    return tuple(int(x) for x in out)


# ================================================================ host inputs


def positions(graph: Graph) -> np.ndarray:
    """[batch, seq] position of each new token: L - 1 in decode, 0 .. seq - 1 in prefill."""
    if graph.phase == "decode":
        return np.array(graph.lengths, dtype=np.int64)[:, None] - 1
    return np.broadcast_to(np.arange(graph.seq), (graph.batch, graph.seq)).copy()


def rope_tables(pos: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [len(pos), head_dim] of the rotate-half RoPE: angle pos x theta^(-2j/d),
    each frequency repeated for both halves of the head (as Hugging Face's Llama)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.asarray(pos, dtype=np.float64).reshape(-1, 1) * inv_freq
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def attention_mask(graph: Graph) -> np.ndarray:
    """The additive mask [batch, heads, seq, context]: 0 where a query may see a key,
    MASK_VALUE where not (prefill: causal; decode: keys past the sequence's length)."""
    b, s, ctx = graph.batch, graph.seq, graph.context
    heads = graph.tensors["attn_mask"].shape[1] if "attn_mask" in graph.tensors else graph.workload.heads
    keys = np.arange(ctx)
    if graph.phase == "decode":
        visible = keys[None, None, :] < np.array(graph.lengths)[:, None, None]  # [b, 1, ctx]
    else:
        visible = np.broadcast_to(keys[None, None, :] <= np.arange(s)[None, :, None], (b, s, ctx))
    mask = np.where(visible, 0.0, MASK_VALUE).astype(np.float32)
    return np.broadcast_to(mask[:, None], (b, heads, s, ctx)).copy()  # this device's heads


def host_inputs(graph: Graph, tokens: np.ndarray | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Values of the graph's host inputs. `tokens` [batch, seq] ids (default: random
    from `seed`; prompt padding beyond a sequence's length is id 0)."""
    w = graph.workload
    if graph.phase == "mixed":
        raise ConfigError("host_inputs: a mixed step is priced, not executed (no functional reference for it)")
    if tokens is None:  # drawn for the real lengths only: padded shapes (a bucket) get the same ids
        real = 1 if graph.phase == "decode" else max(graph.lengths)
        drawn = np.random.default_rng([seed, 1]).integers(0, w.vocab_size, (graph.batch, real))
        tokens = np.zeros((graph.batch, graph.seq), dtype=np.int64)
        tokens[:, :real] = drawn
        if graph.phase == "prefill":
            tokens = np.where(np.arange(graph.seq)[None, :] < np.array(graph.lengths)[:, None], tokens, 0)
    tokens = np.asarray(tokens, dtype=np.int32).reshape(graph.batch, graph.seq)
    cos, sin = rope_tables(positions(graph).reshape(-1), w.head_dim, w.rope_theta)
    out = {"tokens": tokens.reshape(-1), "rope_cos": cos, "rope_sin": sin}
    if "attn_mask" in graph.inputs:
        out["attn_mask"] = attention_mask(graph)
    if "last_index" in graph.inputs:
        out["last_index"] = (np.arange(graph.batch) * graph.seq + np.array(graph.lengths) - 1).astype(np.int32)
    return {k: v for k, v in out.items() if k in graph.inputs}


def node_params(node: Node):
    """The node's parameter record (defaults filled in), as the lowering sees it: Node.args."""
    return node.args


__all__ = ["MASK_VALUE", "NODE_KEYS", "TP_SPLIT_DIMS", "attention_mask", "build_decoder", "check_ep", "check_sp", "check_tp",
           "host_inputs", "node_keys", "node_params", "positions", "rope_tables", "shard_weight_shapes", "step_lengths"]