"""Fusion: replace chains of small kernels by one fused kernel each.

Rules (switched in fusion_rules.yaml, or a user file with the same keys):
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

Each rule is a pattern over the graph's dataflow, not over node names, so it
applies to any decoder the builder makes (and leaves alone what does not match).
"""

from __future__ import annotations

from pathlib import Path

from npusim.errors import ConfigError
from npusim.graph.ir import Graph, Node, TensorSpec
from npusim.hw.load import read_yaml
from npusim.kvcache import KV_CACHE_NAMES
from npusim.passes.graph_edit import Editor

RULES_FILE = Path(__file__).with_name("fusion_rules.yaml")
RULES = ("flash_attention", "scale_add", "qkv_proj", "swiglu", "add_rms_norm")  # the order they apply in


def load_rules(path: str | Path | None = None) -> dict[str, bool]:
    """The rule switches: the defaults file, then `path`'s entries over them."""
    rules = check_rules(read_yaml(RULES_FILE), RULES_FILE)
    if path is not None:
        rules |= check_rules(read_yaml(Path(path)), path)
    return rules


def check_rules(data: dict, where) -> dict[str, bool]:
    """`data` if every key is a rule and every value on or off; else a one-line error."""
    for key, value in data.items():
        if key not in RULES:
            raise ConfigError(f"{where}: unknown fusion rule '{key}' (rules: {', '.join(RULES)})")
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: rule '{key}' must be on or off, got {value!r}")
    return dict(data)


def fuse(graph: Graph, fusion_rules: str | Path | dict | None = None) -> Graph:
    """The graph with every switched-on rule applied wherever its pattern matches.
    fusion_rules: a rules file (its entries over the defaults) or a dict of switches."""
    if isinstance(fusion_rules, dict):
        switches = load_rules() | check_rules(fusion_rules, "fusion_rules")
    else:
        switches = load_rules(fusion_rules)
    ed = Editor(graph)
    for rule in RULES:
        if switches[rule]:
            _APPLY[rule](ed)
    return ed.graph("fusion")


def _layer_prefix(node: Node) -> str:
    return f"L{node.layer}." if node.layer is not None else ""


# ---------------------------------------------------------------- attention


def _attention_chains(ed: Editor):
    """(qk, scale-ish nodes, softmax, pv) for every QK^T ... PV chain."""
    for qk in [n for n in ed.nodes if n.op_type == "batch_matmul" and n.args.trans_b]:
        chain, t = [], qk.outputs["c"]
        while True:
            nxt = ed.only_reader(t)
            if nxt is None or nxt.op_type not in ("scale", "add", "scale_add", "softmax"):
                break
            chain.append(nxt)
            t = nxt.outputs["y"]
            if nxt.op_type == "softmax":
                break
        if not chain or chain[-1].op_type != "softmax":
            continue
        pv = ed.only_reader(t)
        if pv is not None and pv.op_type == "batch_matmul" and not pv.args.trans_b:
            yield qk, chain[:-1], chain[-1], pv


def _flash_attention(ed: Editor) -> None:
    g, w = ed.base, ed.base.workload
    for qk, scaling, softmax, pv in list(_attention_chains(ed)):
        q, k_cache, v_cache, o = qk.inputs["a"], qk.inputs["b"], pv.inputs["b"], pv.outputs["c"]
        # shapes as the graph's tensors and this part's QK^T have them: a device of a parallel plan
        # holds fewer heads than the workload, and a mixed step's attention parts each have their
        # own batch and query tokens (graph.build). QK^T batches batch x kv_heads, m = group x seq
        heads = g.tensors[q].shape[2]
        kv_heads = heads // w.group
        batch, seq, context = qk.args.batch // kv_heads, qk.args.m // w.group, qk.args.n
        common = dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=w.head_dim, dtype=w.dtype)
        name = qk.name.removesuffix("qk") + "attention"
        if g.phase == "decode" or g.phase == "mixed" and seq == 1:
            # padding keys of a ragged batch: each sequence attends to its own length
            node = Node(name, "decode_attention", common | dict(context=context),
                        {"q": q, **_kv_inputs(k_cache, v_cache)}, {"o": o}, qk.layer)
        else:  # causal, ending at the cache's end; right padding of shorter prompts is hidden by causality
            node = Node(name, "flash_attention", common | dict(seq_q=seq, seq_kv=context, causal=True),
                        {"q": q, **_kv_inputs(k_cache, v_cache)}, {"o": o}, qk.layer)
        ed.replace([qk, *scaling, softmax, pv], [node])


def _kv_inputs(k_cache: str, v_cache: str) -> dict[str, str]:
    """The attention op's GM names of a per-layer K and V cache."""
    return dict(zip(KV_CACHE_NAMES["per_layer"], (k_cache, v_cache)))


def _scale_add(ed: Editor) -> None:
    for sc in [n for n in ed.nodes if n.op_type == "scale"]:
        add = ed.only_reader(sc.outputs["y"])
        if add is None or add.op_type != "add":
            continue
        other = add.inputs["x2"] if add.inputs["x1"] == sc.outputs["y"] else add.inputs["x1"]
        node = Node(sc.name + "_add", "scale_add", dict(sc.params),
                    {"x": sc.inputs["x"], "r": other}, {"y": add.outputs["y"]}, sc.layer)
        ed.replace([sc, add], [node])


# ---------------------------------------------------------------- projections


def _projection_groups(ed: Editor) -> list[list[Node]]:
    """Matmuls (Linear, trans_b) reading the same input (or TransData copies of it), in order."""
    groups: dict[str, list[Node]] = {}
    for n in ed.nodes:
        if n.op_type == "matmul" and n.args.trans_b and not n.args.n_parts:
            groups.setdefault(ed.source(n.inputs["a"]), []).append(n)
    return [g for g in groups.values() if len(g) > 1]


def _concat_weight(ed: Editor, names: list[str], fused: str) -> str:
    """A weight prepared offline as the concatenation of `names` along axis 0."""
    specs = [ed.tensors[t] for t in names]
    shape = (sum(s.shape[0] for s in specs), *specs[0].shape[1:])
    ed.derived[fused] = tuple(names)
    return ed.add_tensor(TensorSpec(fused, shape, specs[0].dtype, specs[0].format, "weight"))


def _fused_matmul(ed: Editor, group: list[Node], name: str, outputs: dict[str, str], split: bool) -> Node:
    first = group[0]
    weights = [n.inputs["b"] for n in group]
    inputs = {"a": first.inputs["a"], "b": _concat_weight(ed, weights, "+".join(weights))}
    if first.args.bias:
        biases = [n.inputs["bias"] for n in group]
        inputs["bias"] = _concat_weight(ed, biases, "+".join(biases))
    widths = tuple(n.args.n for n in group)
    params = dict(first.params, n=sum(widths)) | (dict(n_parts=widths) if split else {})
    return Node(name, "matmul", params, inputs, outputs, first.layer)


def _compatible(group: list[Node]) -> bool:
    keys = ("m", "k", "dtype", "out_dtype", "bias", "format_a", "format_b", "weight_dtype")
    return all(getattr(n.args, k) == getattr(group[0].args, k) for n in group for k in keys)


def _swiglu_of(ed: Editor, group: list[Node]) -> tuple[Node, Node, Node, Node] | None:
    """(gate, up, silu, mul) if a pair of the group feeds silu(gate) * up."""
    for gate in group:
        silu = ed.only_reader(gate.outputs["c"])
        if silu is None or silu.op_type != "silu":
            continue
        mul = ed.only_reader(silu.outputs["y"])
        if mul is None or mul.op_type != "mul":
            continue
        other = mul.inputs["x2"] if mul.inputs["x1"] == silu.outputs["y"] else mul.inputs["x1"]
        up = next((n for n in group if n.outputs["c"] == other and ed.only_reader(other) is mul), None)
        if up is not None:
            return gate, up, silu, mul
    return None


def _qkv_proj(ed: Editor) -> None:
    for group in _projection_groups(ed):
        if _swiglu_of(ed, group) is not None or not _compatible(group):
            continue  # gate / up belong to the swiglu rule
        outputs = {f"c{i}": n.outputs["c"] for i, n in enumerate(group)}
        node = _fused_matmul(ed, group, _layer_prefix(group[0]) + "qkv_proj", outputs, split=True)
        ed.replace(group, [node])


def _swiglu(ed: Editor) -> None:
    for group in _projection_groups(ed):
        found = _swiglu_of(ed, group)
        if found is None or not _compatible([found[0], found[1]]):
            continue
        gate, up, silu, mul = found
        m, f = gate.args.m, gate.args.n
        prefix = _layer_prefix(gate)
        gate_up = ed.add_tensor(TensorSpec(prefix + "gate_up", (m, 2 * f), ed.tensors[gate.outputs["c"]].dtype))
        mm = _fused_matmul(ed, [gate, up], prefix + "gate_up_proj", {"c": gate_up}, split=False)
        act = Node(prefix + "swiglu", "swiglu", dict(shape=(m, 2 * f), dtype=silu.args.dtype),
                   {"x": gate_up}, {"y": mul.outputs["y"]}, gate.layer)
        ed.replace([gate, up, silu, mul], [mm, act])


# ---------------------------------------------------------------- norms


def _add_rms_norm(ed: Editor) -> None:
    for add in [n for n in ed.nodes if n.op_type == "add"]:
        s = add.outputs["y"]
        norm = next((n for n in ed.readers(s) if n.op_type == "rms_norm" and n.inputs["x"] == s), None)
        if norm is None or norm.args.shape != add.args.shape:
            continue
        node = Node(add.name + "+" + norm.name.rsplit(".", 1)[-1], "add_rms_norm", dict(norm.params),
                    {"x": add.inputs["x1"], "residual": add.inputs["x2"], "gamma": norm.inputs["gamma"]},
                    {"x_sum": s, "y": norm.outputs["y"]}, add.layer)
        ed.replace([add, norm], [node])


_APPLY = {
    "flash_attention": _flash_attention,
    "scale_add": _scale_add,
    "qkv_proj": _qkv_proj,
    "swiglu": _swiglu,
    "add_rms_norm": _add_rms_norm,
}

__all__ = ["RULES", "RULES_FILE", "fuse", "load_rules"]
