"""Fusion: replace chains of small kernels by one fused kernel each.

The rules are data (fusion_rules.yaml: each a pattern of op types and how their
tensors connect, and the fused op(s) it becomes), run by one matcher and rewriter
(npusim.passes.rule_match). The built-in ones, in the order they apply:
- flash_attention: QK^T -> scale -> [mask add] -> softmax -> PV becomes one
  flash_attention (prefill, causal) or decode_attention (decode) kernel: no S x S
  scores in GM.
- scale_add: scale -> add becomes one scale_add (the unfused chain's scale and mask).
- qkv_proj: projections reading one input become one GEMM over their weights
  concatenated offline, writing the parts as separate tensors (matmul n_parts).
- swiglu: gate and up projections -> silu -> mul become one GEMM over [gate; up]
  and one swiglu kernel.
- add_rms_norm: a residual add whose sum an rms_norm reads becomes one
  add_rms_norm kernel writing both the sum and the norm.

A rules file (--fusion-rules PATH) switches rules (`swiglu: off`) and may define new
ones in the same form (on unless they say `default: off`), applied after the built-in
ones in the order the file gives them (docs/extending.md). What data cannot say - the
concatenated weights, the attention kernel's shapes - is a builder registered with the
fused op type (npusim.passes.fused_ops).

Each rule is a pattern over the graph's dataflow, not over node names, so it
applies to any decoder the builder makes (and leaves alone what does not match).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from npusim.graph.ir import Graph
from npusim.hw.parse import read_yaml
from npusim.passes.graph_edit import Editor
from npusim.passes.rule_data import RULES_FILE, Rule, builtin_names, read_rules

RULES = builtin_names()  # the built-in rules, in the order they apply


@functools.cache
def _builtin() -> dict[str, Rule]:
    return read_rules(read_yaml(RULES_FILE), str(RULES_FILE))


def load_rules(rules: str | Path | Mapping | None = None) -> dict[str, Rule]:
    """The rules in the order they apply, each on or off: the built-in ones, then `rules`
    (a rules file, or its content as a mapping) over them."""
    if rules is None:
        return dict(_builtin())
    if isinstance(rules, Mapping):
        return read_rules(rules, "fusion_rules", _builtin())
    return read_rules(read_yaml(Path(rules)), str(rules), _builtin())


def fuse(graph: Graph, fusion_rules: str | Path | Mapping | None = None) -> Graph:
    """The graph with every switched-on rule applied wherever its pattern matches.
    fusion_rules: a rules file (switches and definitions over the built-in rules) or a
    mapping of the same."""
    from npusim.passes.rule_match import apply_rule

    rules = load_rules(fusion_rules)
    ed = Editor(graph)
    for rule in rules.values():
        if rule.on:
            apply_rule(rule, ed, rules)
    return ed.graph("fusion")


__all__ = ["RULES", "RULES_FILE", "fuse", "load_rules"]
