"""The decoder being simulated: a frozen `Workload` loaded from workloads/NAME.yaml,
a path to such a file, or a Hugging Face `config.json`.

A workload is the model's architecture only (no batch, no lengths: those belong to
a run). Every field has a unit or meaning in its help text; the YAML files give
each value a source comment. A bad file is one ConfigError line naming the file
and the key - as the file spells it, so an HF config's errors name HF keys - and
what was expected: unknown, missing or wrongly typed keys, and values that do not
fit together (heads not dividing hidden_size, kv_heads not dividing heads, ...).

Derived figures (parameter count, weight bytes, KV-cache bytes per token, weight
shapes per layer) are properties, computed from the fields.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import field, frozen
from cattrs.errors import ForbiddenExtraKeysError

from npusim.errors import ConfigError
from npusim.hw.load import find_file, leaf_errors, possible_path
from npusim.hw.parse import did_you_mean, first_repeated, input_file, parse_yaml, read_yaml, short, strict_converter
from npusim.isa.program import DTYPE_BYTES
from npusim.workload_hf import from_hf, hf_name, refuse_unsupported

DEFAULT_WORKLOAD = "k3"

# The dtypes the decoder's operators take (the cube has no fp32 matmul input).
DTYPES = ("fp16", "bf16")
NORMS = ("rms_norm",)  # the builder models pre-norm RMSNorm only
MLPS = ("swiglu", "moe")  # a SwiGLU FFN, or a mixture of SwiGLU experts (npusim.graph.blocks)
ROUTER_SCORING = ("softmax", "sigmoid")  # what turns the router's logits into expert scores
# How a run's tokens are routed to experts (npusim.graph.routing): the router's
# choices depend on the data, which a timing run does not have, so they are drawn.
ROUTINGS = ("uniform", "zipf", "trace")

# Upper bounds of the size fields (assumed): far above any public decoder (the
# largest have ~130 layers, hidden ~25k, FFN ~100k, vocabularies ~256k, contexts
# ~10M tokens), and low enough that a typo cannot make the builder emit a graph of
# millions of nodes before the memory check can refuse it.
LIMITS = {"layers": 1024, "hidden_size": 1 << 20, "heads": 1 << 12, "kv_heads": 1 << 12, "ffn_size": 1 << 20,
          "vocab_size": 1 << 24, "max_context_tokens": 1 << 24, "head_dim": 1 << 12}
# Upper bounds of the MoE size fields (assumed, as LIMITS): public MoE decoders have
# up to a few hundred routed experts (DeepSeek-V3: 256) and route to at most ~16.
MOE_LIMITS = {"experts": 1 << 12, "experts_per_token": 1 << 8, "expert_ffn_size": 1 << 20, "shared_experts": 1 << 6}
# Zipf routing's exponent s: the weights r^-s of up to MOE_LIMITS["experts"] ranks stay
# normal floats up to here (beyond it they underflow to 0 and numpy warns); from far
# below it every token already picks the most popular experts.
MAX_ZIPF_EXPONENT = 64


def _help(text: str, **kw):
    return field(metadata={"help": text}, **kw)


def _default_head_dim(w: Workload) -> int:
    return w.hidden_size // w.heads if w.heads > 0 else 0


@frozen
class Workload:
    """A pre-norm decoder: embedding, `layers` x (RMSNorm, attention with RoPE
    and a KV cache, residual add, RMSNorm, FFN, residual add), final RMSNorm,
    LM head. The FFN is SwiGLU (mlp: swiglu) or a mixture of SwiGLU experts
    (mlp: moe: a router picks experts_per_token of `experts` for each token, plus
    `shared_experts` every token uses; the first `first_dense_layers` layers keep a
    dense SwiGLU FFN of ffn_size)."""

    name: str = _help("workload name (the file's stem when not given)")
    layers: int = _help("decoder layers")
    hidden_size: int = _help("elements per token of the residual stream")
    heads: int = _help("query heads")
    kv_heads: int = _help("K/V heads; fewer than heads is GQA (heads // kv_heads query heads share one)")
    ffn_size: int = _help("SwiGLU intermediate size: elements out of gate and up, into down")
    vocab_size: int = _help("tokens in the vocabulary: rows of the embedding and the LM head")
    max_context_tokens: int = _help("longest sequence (prompt + generated tokens) in tokens")
    norm_eps: float = _help("epsilon added to the mean square in RMSNorm")
    rope_theta: float = _help("RoPE base frequency (rotate-half form)")
    tie_embeddings: bool = _help("the LM head reuses the embedding table (no weight of its own)")
    dtype: str = _help("dtype of weights, activations and KV cache: fp16 or bf16")
    head_dim: int = _help("elements per head; default hidden_size // heads (a multiple of 32 in fp16, 16 in bf16: "
                          "RoPE rotates half heads of whole UB blocks)",
                          default=attrs.Factory(_default_head_dim, takes_self=True))
    qkv_bias: bool = _help("the Q, K and V projections add a bias (Qwen2 does)", default=False)
    norm: str = _help("normalisation: rms_norm (the only one modelled)", default="rms_norm")
    mlp: str = _help("FFN kind: swiglu, or moe (a mixture of SwiGLU experts)", default="swiglu")
    qk_norm: bool = _help("an RMSNorm over each head of Q and K before RoPE (Qwen3's q_norm, k_norm)",
                          default=False)
    experts: int = _help("routed experts per MoE layer (0 = a dense decoder)", default=0)
    experts_per_token: int = _help("experts a token is routed to (the router's top-k)", default=0)
    expert_ffn_size: int = _help("SwiGLU intermediate size of one expert (routed or shared)", default=0)
    shared_experts: int = _help("experts every token goes through besides its routed ones", default=0)
    router_scoring: str = _help("router scores from its logits: softmax (over all experts) or sigmoid",
                                default="softmax")
    router_norm_topk: bool = _help("the k chosen scores are divided by their sum (weights summing to 1)",
                                   default=True)
    first_dense_layers: int = _help("leading layers with a dense SwiGLU FFN of ffn_size instead of experts",
                                    default=0)
    # The run's routing draw, not the architecture: a timing run has no data to route
    # by, so each MoE layer's expert choices are drawn (npusim.graph.routing); set them
    # in a workload file or with load_workload's overrides ({"routing": "zipf"}). The
    # numpy checks route by the router's own scores.
    routing: str = _help("how tokens are routed in a timing run: uniform, zipf (skewed expert popularity) "
                         "or trace (routing_trace)", default="uniform")
    routing_zipf_exponent: float = _help("zipf routing: expert of popularity rank r drawn with weight r^-s "
                                         "(s = this)", default=1.0)
    # a file: the cache keys a step on its content too (diskcache.keys), not only its path
    routing_trace: str = field(metadata={"help": "trace routing: a YAML/JSON file (a relative path: in the workload "
                                                 "file's folder), per MoE layer a list of per-token lists of expert "
                                                 "ids", "file": True}, default="")
    routing_seed: int = _help("seed of the uniform and zipf routing draws", default=0)
    # Expert capacity as GShard and Switch define it: with it set, a layer's rows over
    # an expert's capacity are dropped (npusim.graph.routing says what they cost).
    capacity_factor: float = _help("expert capacity: each expert of a MoE layer takes at most ceil(this x "
                                   "tokens x experts_per_token / experts) rows, the rest dropped (0 = no cap)",
                                   default=0.0)
    # assumption (numpy checks only, no effect on timing): real LLMs carry a few
    # hidden channels with activations tens of times larger than the rest; random
    # weights do not, so they can be planted: every norm's gamma is multiplied by
    # outlier_scale in these channels (what makes INT8 activations lose accuracy).
    outlier_channels: tuple[int, ...] = _help("hidden channels whose norm gains are multiplied by "
                                              "outlier_scale in numpy runs (planted activation outliers)",
                                              default=(), converter=tuple)
    outlier_scale: float = _help("factor of the outlier channels' norm gains (1 = none)", default=1.0)

    def __attrs_post_init__(self):
        bad = _inconsistency(self, lambda k: k)
        if bad:
            raise _Inconsistent(self, bad[0], bad[1])

    # ---- derived shapes

    @property
    def q_size(self) -> int:
        """Elements of a token's queries (heads x head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Elements of a token's keys, and of its values, in one layer (kv_heads x head_dim)."""
        return self.kv_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per K/V head (1 = MHA)."""
        return self.heads // self.kv_heads

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_moe(self) -> bool:
        return self.mlp == "moe"

    def is_moe_layer(self, layer: int) -> bool:
        """Layer `layer` has experts (not one of the first dense layers)."""
        return self.is_moe and layer >= self.first_dense_layers

    @property
    def moe_layers(self) -> int:
        return sum(map(self.is_moe_layer, range(self.layers)))

    def layer_weight_shapes(self, layer: int | None = None) -> dict[str, tuple[int, ...]]:
        """Weights of decoder layer `layer` (None: the last, a MoE layer in a MoE
        decoder), Linear layout [out, in] (matmuls take them trans_b); an expert
        weight is [experts, out, in]."""
        h, q, kv, f = self.hidden_size, self.q_size, self.kv_size, self.ffn_size
        shapes = {"attn_norm": (h,), "wq": (q, h), "wk": (kv, h), "wv": (kv, h)}
        if self.qkv_bias:
            shapes |= {"bq": (q,), "bk": (kv,), "bv": (kv,)}
        if self.qk_norm:
            shapes |= {"q_norm": (self.head_dim,), "k_norm": (self.head_dim,)}
        shapes |= {"wo": (h, q), "ffn_norm": (h,)}
        if not self.is_moe_layer(self.layers - 1 if layer is None else layer):
            return shapes | {"w_gate": (f, h), "w_up": (f, h), "w_down": (h, f)}
        e, fe = self.experts, self.expert_ffn_size
        shapes |= {"w_router": (e, h), "w_gate_experts": (e, fe, h), "w_up_experts": (e, fe, h),
                   "w_down_experts": (e, h, fe)}
        if self.shared_experts:
            fs = self.shared_experts * fe
            shapes |= {"w_gate_shared": (fs, h), "w_up_shared": (fs, h), "w_down_shared": (h, fs)}
        return shapes

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight: embedding, per layer "L{i}.<name>", final norm, LM head (unless tied)."""
        out = {"embed": (self.vocab_size, self.hidden_size)}
        for i in range(self.layers):
            out |= {f"L{i}.{k}": s for k, s in self.layer_weight_shapes(i).items()}
        out["final_norm"] = (self.hidden_size,)
        if not self.tie_embeddings:
            out["lm_head"] = (self.vocab_size, self.hidden_size)
        return out

    # ---- derived sizes

    @property
    def layer_params(self) -> int:
        """Parameters of the last layer (in a MoE decoder: a MoE layer, every expert counted)."""
        return sum(_numel(s) for s in self.layer_weight_shapes().values())

    @property
    def param_count(self) -> int:
        """Parameters of the whole model (a tied LM head counted once): weight_shapes()
        counted without listing every layer's weights."""
        table = self.vocab_size * self.hidden_size
        dense = self.layers - self.moe_layers
        layers = self.moe_layers * self.layer_params + (
            dense * sum(_numel(s) for s in self.layer_weight_shapes(0).values()) if dense else 0)
        return table * (1 if self.tie_embeddings else 2) + layers + self.hidden_size

    @property
    def active_param_count(self) -> int:
        """Parameters one token uses: param_count less the routed experts it is not sent to."""
        idle = self.experts - self.experts_per_token
        return self.param_count - self.moe_layers * idle * 3 * self.hidden_size * self.expert_ffn_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights at `dtype` (the checkpoint's size)."""
        return self.param_count * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token adds, over all layers: 2 (K and V) x layers x kv_heads x head_dim x dtype."""
        return 2 * self.layers * self.kv_size * self.dtype_bytes

    def kv_bytes(self, batch: int, tokens: int) -> int:
        """KV-cache bytes of `batch` sequences of `tokens` tokens each."""
        return batch * tokens * self.kv_bytes_per_token

    def summary(self) -> str:
        """A few lines for a notebook or the CLI."""
        attn = "MHA" if self.group == 1 else f"GQA, {self.group} query heads per K/V head"
        ffn = f"SwiGLU FFN {self.ffn_size}"
        if self.is_moe:
            ffn = (f"MoE FFN: {self.experts_per_token} of {self.experts} experts x {self.expert_ffn_size}"
                   + (f" + {self.shared_experts} shared" if self.shared_experts else "")
                   + (f", first {self.first_dense_layers} layers dense {self.ffn_size}"
                      if self.first_dense_layers else ""))
        active = f", {_count(self.active_param_count)} active per token" if self.is_moe else ""
        return "\n".join([
            f"{self.name}: {self.layers} layers, hidden {self.hidden_size}, {self.heads} heads x {self.head_dim} "
            f"({self.kv_heads} K/V heads: {attn}), {ffn}, vocab {self.vocab_size}"
            f"{' (tied)' if self.tie_embeddings else ''}, {self.dtype}, context up to {self.max_context_tokens}",
            f"  parameters {_count(self.param_count)} ({_count(self.layer_params)} per layer{active}), "
            f"weights {_bytes(self.weight_bytes)}",
            f"  KV cache {_bytes(self.kv_bytes_per_token)} per token, "
            f"{_bytes(self.kv_bytes(1, self.max_context_tokens))} per sequence at full context",
        ])


def _count(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _bytes(n: int) -> str:
    """Decimal GB (as model sizes are quoted) and binary units beside it."""
    if n >= 1e9:
        return f"{n / 1e9:.3f} GB ({n / 2**30:.2f} GiB)"
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class _Inconsistent(ValueError):
    """Raised in Workload.__init__; the loader re-words it with the file's key names."""

    def __init__(self, workload: Workload, key: str, message: str):
        super().__init__(f"key '{key}': {message}")
        self.workload, self.key = workload, key


def _inconsistency(w: Workload, nm: Callable[[str], str]) -> tuple[str, str] | None:
    """(key, what is wrong) for the first value out of range or not fitting the others;
    `nm` spells a field name as the source file does."""
    if not w.name.strip():  # every report would name the model as ''
        return "name", f"expected the model's name, got {short(w.name)}"
    for key, limit in LIMITS.items():
        if getattr(w, key) <= 0:
            return key, f"expected a value > 0, got {short(getattr(w, key))}"
        if getattr(w, key) > limit:
            return key, f"expected a value <= {limit} (a sanity bound), got {short(getattr(w, key))}"
    for key in ("norm_eps", "rope_theta"):
        if not math.isfinite(getattr(w, key)):
            return key, f"expected a finite number, got {getattr(w, key)!r}"
        if not getattr(w, key) > 0:
            return key, f"expected a value > 0, got {getattr(w, key)!r}"
    if w.hidden_size % w.heads:
        return "heads", f"{w.heads} does not divide {nm('hidden_size')} {w.hidden_size}"
    # heads x head_dim may differ from hidden_size (Qwen3-30B-A3B: 32 x 128 = 4096 on a
    # hidden size of 2048): Q and the attention output are heads x head_dim wide, wo maps back
    if w.head_dim % 2:
        return "head_dim", f"RoPE rotates pairs of elements: expected an even value, got {w.head_dim}"
    if w.kv_heads > w.heads or w.heads % w.kv_heads:
        return "kv_heads", f"{w.kv_heads} does not divide {nm('heads')} {w.heads}"
    bad = [c for c in w.outlier_channels if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < w.hidden_size]
    if bad:
        return "outlier_channels", f"expected channels in 0 .. {nm('hidden_size')} - 1 = {w.hidden_size - 1}, " \
                                   f"got {short(bad[0])}"
    twice = first_repeated(w.outlier_channels)
    if twice is not None:  # planted once all the same: the list is not the one meant
        return "outlier_channels", f"channel {twice} is named twice"
    if not (math.isfinite(w.outlier_scale) and w.outlier_scale > 0):
        return "outlier_scale", f"expected a finite value > 0, got {w.outlier_scale!r}"
    if w.outlier_scale != 1 and not w.outlier_channels:  # planted nowhere: the numpy run as without it
        return "outlier_scale", f"{w.outlier_scale!r} multiplies the norm gains of outlier_channels, and none are given"
    for key, allowed in (("dtype", DTYPES), ("norm", NORMS), ("mlp", MLPS), ("router_scoring", ROUTER_SCORING),
                         ("routing", ROUTINGS)):
        if getattr(w, key) not in allowed:
            return key, f"expected one of {', '.join(allowed)}, got {short(getattr(w, key))}"
    from npusim.ops.rowwise import rope_head_dim_step  # here: the ops package is not needed to read a workload

    step = rope_head_dim_step(w.dtype)
    if w.head_dim % step:
        return "head_dim", (f"expected a multiple of {step} for {w.dtype} (RoPE rotates half heads "
                            f"of whole 32-byte UB blocks; head_dim defaults to {nm('hidden_size')} / {nm('heads')}), "
                            f"got {w.head_dim}")
    return _moe_inconsistency(w, nm)


def _moe_inconsistency(w: Workload, nm: Callable[[str], str]) -> tuple[str, str] | None:
    """(key, what is wrong) for the first MoE field out of range or not fitting the others."""
    for key, limit in MOE_LIMITS.items():
        if getattr(w, key) < 0:
            return key, f"expected a value >= 0, got {short(getattr(w, key))}"
        if getattr(w, key) > limit:
            return key, f"expected a value <= {limit} (a sanity bound), got {short(getattr(w, key))}"
    if not (math.isfinite(w.capacity_factor) and w.capacity_factor >= 0):
        return "capacity_factor", f"expected a finite value >= 0 (0 = no cap), got {w.capacity_factor!r}"
    if not w.is_moe:
        # routing and its trace, too: routing=zipf on a dense FFN ran as if not given
        moe = [k for k in (*MOE_LIMITS, "capacity_factor", "first_dense_layers", "routing_trace", "routing_seed")
               if getattr(w, k)]
        moe += ["routing"] if w.routing != "uniform" else []
        moe += ["routing_zipf_exponent"] if w.routing_zipf_exponent != 1.0 else []
        return (moe[0], "set for a dense FFN (mlp: swiglu); experts need mlp: moe") if moe else None
    for key in ("experts", "experts_per_token", "expert_ffn_size"):
        if getattr(w, key) < 1:
            return key, f"expected a value > 0 for a MoE FFN (mlp: moe), got {short(getattr(w, key))}"
    if w.experts_per_token > w.experts:
        return "experts_per_token", (f"top-k {w.experts_per_token} is more than the {nm('experts')} "
                                     f"{w.experts} it picks from")
    if not 0 <= w.first_dense_layers <= w.layers:
        return "first_dense_layers", f"expected 0 .. {nm('layers')} {w.layers}, got {w.first_dense_layers}"
    if not 0 <= w.routing_zipf_exponent <= MAX_ZIPF_EXPONENT:  # nan and inf too
        return "routing_zipf_exponent", (f"expected a value from 0 to {MAX_ZIPF_EXPONENT} (a sanity bound), got "
                                         f"{w.routing_zipf_exponent!r}")
    if w.routing != "zipf" and w.routing_zipf_exponent != 1.0:  # routing: zipf forgotten: drawn uniformly, silently
        return "routing_zipf_exponent", f"shapes routing: zipf only, got routing: {w.routing}"
    if w.routing_seed < 0:  # numpy's generators take no negative seed
        return "routing_seed", f"expected a whole number >= 0, got {w.routing_seed!r}"
    if (w.routing == "trace") != bool(w.routing_trace):
        return "routing_trace", ("expected a file for routing: trace" if w.routing == "trace"
                                 else f"a trace file needs routing: trace, got routing: {w.routing}")
    return None


# ================================================================ loading


_converter = strict_converter()
_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
             tuple[int, ...]: "a list of integers"}
_FIELD_TYPES = {f.name: f.type for f in attrs.fields(attrs.resolve_types(Workload))}


def load_workload(name_or_path: str | os.PathLike = DEFAULT_WORKLOAD,
                  overrides: Mapping[str, Any] | None = None) -> Workload:
    """Load a workload by name (workloads/NAME.yaml, looked up like hwconfigs), a
    path to a YAML file, or a Hugging Face config.json or the model directory
    holding it; `overrides` {"field": value} (string values read as YAML scalars)
    change fields for a what-if."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"workload: expected a name, a path or a Workload, got {short(name_or_path)}")
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"overrides: expected a mapping {{'field': value}} or None, got {short(overrides)}")
    for key in overrides or ():  # {1: 2} said "unknown key ''", {None: 2} "unknown key 'on'"
        if not isinstance(key, str):
            raise TypeError(f"overrides: expected field names (strings) as keys, got {short(key)}")
    if not str(name_or_path):  # Path("") is the current folder
        raise ConfigError("workload: expected a name or a path, got an empty string")
    if possible_path(name_or_path, "workloads").is_dir():  # a Hugging Face model directory
        if not (Path(name_or_path) / "config.json").is_file():
            raise ConfigError(f"{name_or_path}: a directory without a config.json (expected a workload YAML, "
                              "a Hugging Face config.json or the model directory holding it)")
        name_or_path = Path(name_or_path) / "config.json"
    path = find_file(name_or_path, "workloads")
    spelt_trace = None  # routing_trace as the workload file spells a relative path
    if path.suffix == ".json":
        raw, spelt = from_hf(path)
        nm = lambda k: spelt.get(k) or hf_name(k)  # noqa: E731
    else:
        raw, nm = read_yaml(path), (lambda k: k)
        refuse_unsupported(raw, str(path))
        raw.setdefault("name", path.stem)
        trace = raw.get("routing_trace")
        if isinstance(trace, str) and trace and not os.path.isabs(trace):  # as hw's base: the file's folder's
            raw["routing_trace"] = os.path.join(path.parent, trace)
            spelt_trace = trace
    where = str(path)
    if overrides:
        where += " (--workload-set)"
        for key, value in overrides.items():
            if key not in _FIELD_TYPES:
                raise ConfigError(f"{where}: unknown key '{short(key)[1:-1]}'{did_you_mean(key, _FIELD_TYPES)}")
            raw[key] = parse_yaml(value, f"--workload-set {key}") if isinstance(value, str) and value.strip() else value
        nm = _names_for_overrides(nm, overrides)
        if "routing_trace" in overrides:  # given on the command line: the working folder's
            spelt_trace = None
    w = structure_workload(raw, where, nm)
    _check_trace_file(w, where, nm, spelt_trace)
    _SOURCES[w] = (where, nm)
    return w


# where each loaded workload was read (its file, '(--workload-set)' if changed) and how that
# file spells its keys, for errors found once its graph is built (source_of)
_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def source_of(w: Workload) -> tuple[str, Callable[[str], str]] | None:
    """(the file `w` was loaded from, a field name -> the key that file spells it by), or None
    for a workload made in code."""
    return _SOURCES.get(w)


def _check_trace_file(w: Workload, where: str, nm: Callable[[str], str], spelt: str | None) -> None:
    """routing: trace's file there, and a regular file, refused in the loader's words (the
    file and key; `spelt`: a relative path as the workload file gave it, read in its folder):
    found missing while the step was built, it was 'routing_trace: no file ../m/t.yaml',
    neither the workload file nor how the path was resolved said."""
    if w.routing != "trace":
        return
    shown = spelt or w.routing_trace
    if spelt:
        shown += f" (a relative path is read in the workload file's folder: {w.routing_trace})"
    key = f"{where}: key '{nm('routing_trace')}'"
    input_file(w.routing_trace, f"{key}: {shown}")
    if not os.path.exists(w.routing_trace):
        raise ConfigError(f"{key}: no file {shown}")


def _names_for_overrides(nm: Callable[[str], str], overrides: Mapping[str, Any]) -> Callable[[str], str]:
    return lambda k: k if k in overrides else nm(k)


def structure_workload(raw: Mapping[str, Any], where: str, nm: Callable[[str], str] = lambda k: k) -> Workload:
    """A Workload from a mapping of its fields; errors are one ConfigError line
    naming `where` and the key (spelt by `nm`)."""
    try:
        return _converter.structure(dict(raw), Workload)
    except Exception as e:  # cattrs gathers type, missing-key and __init__ errors into a group
        errors = list(leaf_errors(e))
        errors.sort(key=lambda err: not isinstance(err[1], ForbiddenExtraKeysError))
        path, exc, type_ = errors[0]
        if isinstance(exc, ForbiddenExtraKeysError):
            extra = sorted(map(str, exc.extra_fields))[0]
            raise ConfigError(f"{where}: unknown key '{short(extra)[1:-1]}'{did_you_mean(extra, _FIELD_TYPES)}") \
                from None
        if isinstance(exc, KeyError):
            raise ConfigError(f"{where}: missing key '{nm(path[-1])}'") from None
        if isinstance(exc, _Inconsistent):
            key, message = _inconsistency(exc.workload, nm)
            raise ConfigError(f"{where}: key '{nm(key)}': {message}") from None
        key = path[0] if path else "?"  # a list's field, not the index of its bad item
        expected = _EXPECTED.get(_FIELD_TYPES.get(key), "another type")
        raise ConfigError(f"{where}: key '{nm(key)}': expected {expected}, got {short(raw.get(key))}") from None
