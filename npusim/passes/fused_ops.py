"""Builders: what a fused op needs that a rule's data cannot say - its parameters read
off the nodes it replaces, weights concatenated offline - registered by name with the
op types they make, so that a rule (fusion_rules.yaml, or a user's file) stays data
and names one: `build: concat_weights`.

A builder is `fn(match, parts, fields) -> fields`: `match` the rule's match
(npusim.passes.rule_match.Match: its nodes, its tensors, the graph being edited),
`parts` the nodes the fused entry lists (in order, a repeated node's all), `fields`
what the data gave (op, params, inputs, outputs); it returns them completed.
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import frozen

from npusim.graph.ir import Node, TensorSpec


@frozen
class Builder:
    name: str
    makes: tuple[str, ...]  # op types it may return
    fn: Callable[..., dict]


BUILDERS: dict[str, Builder] = {}


def register_builder(name: str, makes: tuple[str, ...] | str, fn: Callable | None = None):
    """Register `fn` as the builder `name` of the op types `makes` (a decorator without fn)."""

    def add(f: Callable) -> Callable:
        if name in BUILDERS:
            raise ValueError(f"fusion builder '{name}' registered twice")
        BUILDERS[name] = Builder(name, (makes,) if isinstance(makes, str) else tuple(makes), f)
        return f

    return add(fn) if fn is not None else add


@register_builder("attention", ("decode_attention", "flash_attention"))
def attention(match, parts: list[Node], fields: dict) -> dict:
    """The fused attention of a QK^T ... PV chain (parts: qk, pv): decode_attention for one
    query token per sequence (padding keys of a ragged batch: each sequence attends to its
    own length), else causal flash_attention ending at the cache's end (right padding of
    shorter prompts is hidden by causality)."""
    qk = parts[0]
    g, w = match.editor.base, match.editor.base.workload
    # shapes as the graph's tensors and this part's QK^T have them: a device of a parallel plan
    # holds fewer heads than the workload, and a mixed step's attention parts each have their
    # own batch and query tokens (graph.build). QK^T batches batch x kv_heads, m = group x seq
    heads = g.tensors[fields["inputs"]["q"]].shape[2]
    kv_heads = heads // w.group
    batch, seq, context = qk.args.batch // kv_heads, qk.args.m // w.group, qk.args.n
    common = dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=w.head_dim, dtype=w.dtype)
    if g.phase == "decode" or g.phase == "mixed" and seq == 1:
        return fields | dict(op="decode_attention", params=common | dict(context=context))
    return fields | dict(op="flash_attention", params=common | dict(seq_q=seq, seq_kv=context, causal=True))


@register_builder("concat_weights", "matmul")
def concat_weights(match, parts: list[Node], fields: dict) -> dict:
    """One GEMM over the parts' weights (and biases) concatenated along N offline, its
    output split back into the parts' tensors (n_parts) when it writes several."""
    ed, first = match.editor, parts[0]
    inputs = dict(fields["inputs"], b=_concat_weight(ed, [n.inputs["b"] for n in parts]))
    if first.args.bias:
        inputs["bias"] = _concat_weight(ed, [n.inputs["bias"] for n in parts])
    widths = tuple(n.args.n for n in parts)
    split = len(fields["outputs"]) > 1
    params = dict(first.params, n=sum(widths)) | (dict(n_parts=widths) if split else {})
    return fields | dict(params=params, inputs=inputs)


def _concat_weight(ed, names: list[str]) -> str:
    """A weight prepared offline as the concatenation of `names` along axis 0."""
    specs = [ed.tensors[t] for t in names]
    fused = "+".join(names)
    shape = (sum(s.shape[0] for s in specs), *specs[0].shape[1:])
    ed.derived[fused] = tuple(names)
    return ed.add_tensor(TensorSpec(fused, shape, specs[0].dtype, specs[0].format, "weight"))


__all__ = ["BUILDERS", "Builder", "register_builder"]
