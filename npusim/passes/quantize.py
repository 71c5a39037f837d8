"""Quantize: INT8 weights (W8A16) or INT8 weights and activations (W8A8).

Which matmuls: the Linear layers (matmul nodes reading a weight as B, trans_b,
and a MoE layer's expert GEMMs: grouped_matmul nodes reading a weight [E, n, k]
with trans_b) chosen by `quant_layers`:
- "no-head" (the default): every Linear layer but the LM head (the matmul writing
  a graph output), whose logits are the most sensitive to rounding;
- "all": every Linear layer;
- a comma list of projection names, matched against the node name with or without
  its layer prefix ("o_proj,down_proj", "L0.qkv_proj", "lm_head", "experts_down_proj").
A weight some other node also reads (a tied embedding table) stays as it is.

W8A16 (`quant="w8a16"`): the weight is stored int8 [n, k] with an fp32 scale per
output channel (max |row| / 127, computed offline from the FP16 weight); the matmul
widens it to fp16 on the way to L0B and FixPipe multiplies by the scales. An
expert weight [E, n, k] gets a scale per expert and output channel, [E, n].

W8A8 (`quant="w8a8"`): as W8A16, and each activation a quantised matmul reads is
quantised per token at run time (quantize_per_token: int8 values and an fp32 scale
per row, once per activation however many matmuls read it); the matmul runs
int8 x int8 on the cube and writes fp32 with the weight scales applied; a
token_dequant per output applies the token scales (and a bias) and writes the
model dtype. `smooth_alpha` (0 < alpha <= 1, W8A8 only) adds SmoothQuant's
migration: the quantise kernel multiplies the activation by 1 / s per channel and
the weight is stored as W * s, with s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) taken
offline from a calibration run (npusim.graph.quant_values). Experts stay in the
model dtype under W8A8 (the grouped matmul has no int8 x int8 path): "no-head" and
"all" leave them out, and naming one in `quant_layers` is refused in one line.

The values (int8 weights, scales, smoothing factors) are made by the executor
from the FP weights, as a checkpoint converter would: the graph only says which
tensors are quantised and how (their dtype, the scale and smooth tensors beside them).
"""

from __future__ import annotations

import attrs

from npusim.errors import ConfigError
from npusim.graph.ir import Graph, Node, TensorSpec
from npusim.graph.quant_values import WEIGHT_INPUT
from npusim.hw.parse import first_repeated
from npusim.passes.graph_edit import Editor

QUANT_MODES = ("w8a16", "w8a8")
LAYER_CHOICES = ("no-head", "all")


def quantize(graph: Graph, quant: str = "w8a16", quant_layers: str = "no-head",
             smooth_alpha: float | None = None) -> Graph:
    """The graph with the chosen Linear layers quantised (see the module docstring)."""
    if quant not in QUANT_MODES:
        raise ConfigError(f"--quant: expected one of {', '.join(QUANT_MODES)}, got {quant!r}")
    if smooth_alpha is not None:
        if quant != "w8a8":
            raise ConfigError(f"--smooth-alpha: SmoothQuant migrates activation outliers of W8A8; --quant {quant} "
                              "keeps activations in fp16 (use --quant w8a8)")
        if isinstance(smooth_alpha, bool) or not isinstance(smooth_alpha, (int, float)) or not 0 < smooth_alpha <= 1:
            raise ConfigError(f"--smooth-alpha: expected a number in (0, 1], got {smooth_alpha!r}")
    ed = Editor(graph)
    chosen = _chosen(ed, quant_layers)
    if quant == "w8a8":
        chosen = _dense_only(chosen, quant_layers)
    acts: dict[str, tuple[str, str]] = {}  # source activation -> (int8 tensor, token scales)
    for node in chosen:
        if quant == "w8a16":
            new = [_int8_weight(ed, node)]
        else:
            new = _w8a8(ed, node, acts, smooth_alpha)
        ed.replace([node], new)
    return ed.graph("quantize")


def _linear(ed: Editor, n: Node) -> bool:
    """A matmul reading a weight (trans_b) as B, or a grouped matmul reading expert
    weights (trans_b), that only nodes of its own op type read, not yet quantised."""
    if n.op_type not in WEIGHT_INPUT or not n.args.trans_b or n.args.weight_dtype == "int8" or n.args.dtype == "int8":
        return False
    w = n.inputs[WEIGHT_INPUT[n.op_type]]
    return ed.tensors[w].kind == "weight" and all(r.op_type == n.op_type for r in ed.readers(w))


def _dense_only(chosen: list[Node], layers: str) -> list[Node]:
    """W8A8's choice: the matmuls; an expert GEMM named in --quant-layers is refused."""
    experts = [n.name for n in chosen if n.op_type == "grouped_matmul"]
    if experts and layers not in LAYER_CHOICES:
        raise ConfigError(f"--quant-layers: '{experts[0]}' is a MoE expert GEMM (grouped_matmul), which --quant w8a8 "
                          "does not quantise (it has no int8 x int8 path); use --quant w8a16 for experts")
    return [n for n in chosen if n.op_type != "grouped_matmul"]


def layer_names(layers: str) -> list[str]:
    """--quant-layers as a comma list of projection names (not no-head or all): refused
    if empty, with an empty item (o_proj,,down_proj: a name left out) or a name twice.
    The command line checks it as it reads the flag, before a cached step could answer."""
    names = [s.strip() for s in layers.split(",")] if isinstance(layers, str) else []
    if not any(names):
        raise ConfigError(f"--quant-layers: expected {', '.join(LAYER_CHOICES)} or a comma list of projection "
                          f"names, got {layers!r}")
    if "" in names:
        raise ConfigError(f"--quant-layers {layers}: an empty item in the comma list")
    twice = first_repeated(names)
    if twice is not None:
        raise ConfigError(f"--quant-layers {layers}: '{twice}' is named twice")
    return names


def _chosen(ed: Editor, layers: str) -> list[Node]:
    linear = [n for n in ed.nodes if _linear(ed, n)]
    outputs = set(ed.base.outputs)
    if layers == "all":
        return linear
    if layers == "no-head":
        return [n for n in linear if not set(n.outputs.values()) & outputs]
    names = layer_names(layers)
    picked = []
    for want in names:
        hits = [n for n in linear if n.name == want or n.name.split(".", 1)[-1] == want]
        if not hits:
            known = sorted({n.name.split(".", 1)[-1] for n in linear})
            raise ConfigError(f"--quant-layers: no Linear layer named '{want}' in this graph (its Linear layers: "
                              f"{', '.join(known)}; or {', '.join(LAYER_CHOICES)})")
        picked += hits
    return [n for n in linear if n in picked]


def _int8_weight(ed: Editor, node: Node, **params) -> Node:
    """The node reading its weight as int8 with per-channel scales (W8A16 unless params
    say more): a Linear weight [n, k] gets scales [n], expert weights [E, n, k] get [E, n]."""
    w = node.inputs[WEIGHT_INPUT[node.op_type]]
    spec = ed.tensors[w]
    ed.tensors[w] = attrs.evolve(spec, dtype="int8")
    scale = ed.add_tensor(TensorSpec(f"{w}.scale", spec.shape[:-1], "fp32", kind="weight"))
    return attrs.evolve(node, params=dict(node.params, weight_dtype="int8", **params),
                        inputs=dict(node.inputs, scale=scale))


def _w8a8(ed: Editor, node: Node, acts: dict[str, tuple[str, str]], alpha: float | None) -> list[Node]:
    """[quantize_per_token (first reader of the activation only), the int8 matmul, a token_dequant per output]."""
    p = node.args
    src = ed.source(node.inputs["a"])  # the ND activation a TransData copy was made of
    out: list[Node] = []
    if src not in acts:
        rows, hidden = p.m, p.k
        q = ed.add_tensor(TensorSpec(f"{src}.int8", (rows, hidden), "int8"))
        s = ed.add_tensor(TensorSpec(f"{src}.token_scale", (rows,), "fp32"))
        ins = {"x": src}
        if alpha is not None:
            ins["smooth"] = ed.add_tensor(TensorSpec(f"{src}.smooth", (hidden,), "fp32", kind="weight"))
        out.append(Node(f"{src}.quantize", "quantize_per_token",
                        dict(rows=rows, hidden=hidden, dtype=p.dtype, smooth=alpha is not None)
                        | ({"smooth_alpha": float(alpha)} if alpha is not None else {}),
                        ins, {"y": q, "scale": s}, node.layer))
        acts[src] = (q, s)
    q, s = acts[src]
    mm = _int8_weight(ed, node, dtype="int8", out_dtype="fp32", format_a="ND", bias=False)
    biases = _biases(ed, node)
    widths = p.n_parts or (p.n,)
    outs, dequants = {}, []
    for (local, final), width, bias in zip(sorted(node.outputs.items()), widths, biases):
        acc = ed.add_tensor(TensorSpec(f"{final}.acc", (p.m, width), "fp32"))
        outs[local] = acc
        ins = {"c": acc, "scale": s} | ({"bias": bias} if bias else {})
        dequants.append(Node(f"{final}.dequant", "token_dequant",
                             dict(rows=p.m, cols=width, dtype=ed.tensors[final].dtype, bias=bias is not None),
                             ins, {"y": final}, node.layer))
    mm = attrs.evolve(mm, inputs={k: v for k, v in dict(mm.inputs, a=q).items() if k != "bias"}, outputs=outs)
    return out + [mm] + dequants


def _biases(ed: Editor, node: Node) -> list[str | None]:
    """The bias of each output part: a fused bias's originals (re-declared: each is made from its own name)."""
    parts = len(node.args.n_parts) or 1
    if not node.args.bias:
        return [None] * parts
    b = node.inputs["bias"]
    if parts == 1:
        return [b]
    originals = ed.derived.get(b)
    if originals is None or len(originals) != parts:
        raise ConfigError(f"quantize: cannot split the bias '{b}' of '{node.name}' into its {parts} parts")
    widths = node.args.n_parts
    return [ed.add_tensor(TensorSpec(o, (w,), ed.tensors[b].dtype, kind="weight")) for o, w in zip(originals, widths)]


__all__ = ["LAYER_CHOICES", "QUANT_MODES", "quantize"]
