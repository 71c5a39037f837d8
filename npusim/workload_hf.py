"""What a Hugging Face config.json says, as a workload's fields (npusim.workload): the
keys read and their Workload names, the models whose features no key states, and
the architecture features npusim does not model, refused in one line (the same keys
refused in a workload YAML)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from npusim.errors import ConfigError
from npusim.hw.parse import parse_json, read_text, short


def _not_one(v: Any, d: Mapping) -> bool:
    """Given, and not 1 (true is no 1: a bool is refused, not read as a count or factor)."""
    return v is not None and (isinstance(v, bool) or v != 1)


# Architecture features some configs carry that the builder does not model: key ->
# (is it on?, what it is). A config with one on is refused rather than simulated as
# the dense decoder it is not. Keys as Hugging Face's config.json spells them (a
# workload YAML using one gets the same message).
UNSUPPORTED: dict[str, tuple[Callable[[Any, Mapping], bool], str]] = {
    "shared_expert_intermediate_size": (lambda v, d: v not in (None, 0),
                                        "a shared expert behind its own sigmoid gate (Qwen2-MoE)"),
    "decoder_sparse_step": (_not_one, "MoE layers only every few layers"),
    # DeepSeek-MoE's and Llama 4's spellings of it
    "moe_layer_freq": (_not_one, "MoE layers only every few layers"),
    "interleave_moe_layer_step": (_not_one, "MoE layers only every few layers"),
    "sliding_window": (lambda v, d: v is not None and d.get("use_sliding_window", True) is not False
                       and not (isinstance(v, int) and v >= d.get("max_position_embeddings", math.inf)),
                       "sliding-window attention"),
    "kv_lora_rank": (lambda v, d: v is not None, "multi-head latent attention (DeepSeek)"),
    "q_lora_rank": (lambda v, d: v is not None, "multi-head latent attention (DeepSeek)"),
    "mlp_bias": (lambda v, d: v not in (None, False), "a bias in the FFN projections"),
    "partial_rotary_factor": (_not_one, "RoPE on part of each head"),
    "layer_types": (lambda v, d: not (isinstance(v, list) and set(v) <= {"full_attention"}),
                    "layers of different attention types"),
    # a GPTQ/AWQ/FP8 checkpoint still says torch_dtype float16 or bfloat16: it was simulated
    # with 16-bit weights (3-4 times its weight bytes)
    "quantization_config": (lambda v, d: v is not None, "a GPTQ, AWQ or FP8 checkpoint's quantised weights"),
}

# Hugging Face config.json key -> Workload field (configs of Llama-style decoders:
# LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, ...).
HF_KEYS = {
    "hidden_size": "hidden_size",
    "num_hidden_layers": "layers",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "ffn_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_context_tokens",
    "rms_norm_eps": "norm_eps",
    "rope_theta": "rope_theta",
    "tie_word_embeddings": "tie_embeddings",
    "attention_bias": "qkv_bias",
    # mixture of experts (Qwen3-MoE's spelling; HF_MOE_ALIASES has the other models')
    "num_experts": "experts",
    "num_experts_per_tok": "experts_per_token",
    "moe_intermediate_size": "expert_ffn_size",
    "norm_topk_prob": "router_norm_topk",
    "n_shared_experts": "shared_experts",
    "first_k_dense_replace": "first_dense_layers",
    "scoring_func": "router_scoring",
}
# Other models' spellings of a MoE key: Mixtral's num_local_experts, DeepSeek's n_routed_experts.
HF_MOE_ALIASES = {"num_local_experts": "num_experts", "n_routed_experts": "num_experts"}
# Models whose attention normalises each head of Q and K (no config key says so).
HF_QK_NORM_MODELS = ("qwen3", "qwen3_moe")
HF_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
               "max_position_embeddings", "rms_norm_eps")
HF_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}
# Models whose Q/K/V projections always carry a bias (no attention_bias key in their config).
HF_QKV_BIAS_MODELS = ("qwen2",)


def refuse_unsupported(data: Mapping[str, Any], where: str) -> None:
    """A ConfigError "not supported: KEY" for the first architecture feature that is on."""
    for key, (on, what) in UNSUPPORTED.items():
        if key in data:
            try:
                enabled = on(data[key], data)
            except TypeError:  # a value of a type the rule does not expect: treat it as on
                enabled = True
            if enabled:
                raise ConfigError(f"{where}: not supported: {key} = {short(data[key])} ({what} is not modelled; "
                                  "npusim simulates dense decoders)")


_HF_NAME = {v: k for k, v in HF_KEYS.items()}
_MOE_FIELDS = ("experts", "experts_per_token", "expert_ffn_size", "router_norm_topk", "shared_experts",
               "first_dense_layers", "router_scoring")


def hf_name(field_name: str) -> str:
    return {"dtype": "torch_dtype"}.get(field_name) or _HF_NAME.get(field_name, field_name)


def from_hf(path: Path) -> tuple[dict, dict[str, str]]:
    """A Hugging Face config.json -> (the Workload's fields, field -> the key this file
    spells it with where that is not HF_KEYS' spelling). Keys the decoder does not
    need (architectures, token ids, ...) are ignored; the ones it needs must be there
    and have the right type; features it does not model are refused."""
    data = parse_json(read_text(path), str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    spelt = {}
    for alias, key in HF_MOE_ALIASES.items():
        if data.get(alias) is not None and data.get(key) is None:
            data[key] = data[alias]
            spelt[HF_KEYS[key]] = alias
        elif data.get(alias) is not None and data[alias] != data[key]:  # num_experts was kept silently
            raise ConfigError(f"{path}: key '{alias}': {short(data[alias])}, and {key} {short(data[key])}: two "
                              "counts of experts (expected one, or the same in both)")
    for key in HF_REQUIRED:
        if key not in data:
            raise ConfigError(f"{path}: missing key '{key}'")
    refuse_unsupported(data, str(path))
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{path}: key 'hidden_act': expected 'silu' (the SwiGLU FFN, the only one modelled), "
                          f"got {short(act)}")
    raw = {field_name: data[k] for k, field_name in HF_KEYS.items() if data.get(k) is not None}
    raw.setdefault("kv_heads", data["num_attention_heads"])  # HF's default: MHA
    rope = data.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"{path}: key 'rope_parameters': expected a mapping, got {short(rope)}")
    raw.setdefault("rope_theta", rope.get("rope_theta", 10000.0))  # HF's default
    raw.setdefault("tie_embeddings", False)  # Llama-style configs' default
    if data.get("model_type") in HF_QKV_BIAS_MODELS:
        raw["qkv_bias"] = True
    if data.get("model_type") in HF_QK_NORM_MODELS:
        raw["qk_norm"] = True
    experts = data.get("num_experts")
    if isinstance(experts, bool) or experts not in (None, 0, 1):  # true is no count: the type check says so
        raw |= _hf_moe(path, data, spelt)
    elif "expert_ffn_size" in raw:
        raise ConfigError(f"{path}: key 'moe_intermediate_size' without experts (expected num_experts, "
                          "num_local_experts or n_routed_experts too)")
    else:  # one expert or none (a config of a MoE family set up dense): its MoE keys say nothing
        raw = {k: v for k, v in raw.items() if k not in _MOE_FIELDS}
    dtype_key = "torch_dtype" if "torch_dtype" in data else "dtype"  # newer transformers write "dtype"
    if "dtype" in data and data.get("torch_dtype", data["dtype"]) != data["dtype"]:  # dtype was dropped silently
        raise ConfigError(f"{path}: key 'dtype': {short(data['dtype'])}, and torch_dtype {short(data['torch_dtype'])}: "
                          "two dtypes (expected one, or the same in both)")
    dtype = data.get(dtype_key, "float16")  # assumed fp16 when the config does not say
    if not isinstance(dtype, str) or dtype not in HF_DTYPES:
        raise ConfigError(f"{path}: key '{dtype_key}': expected one of {', '.join(HF_DTYPES)}, got {short(dtype)}")
    raw["dtype"] = HF_DTYPES[dtype]
    raw["name"] = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return raw, spelt


def _hf_moe(path: Path, data: Mapping[str, Any], spelt: dict[str, str]) -> dict:
    """The MoE fields HF_KEYS does not map one to one: the kind, Mixtral's expert size
    (its intermediate_size), the router's defaults, Qwen3-MoE's mlp_only_layers."""
    out: dict[str, Any] = {"mlp": "moe"}
    if data.get("moe_intermediate_size") is None:  # Mixtral: every FFN is an expert of intermediate_size
        out["expert_ffn_size"] = data["intermediate_size"]
        spelt["expert_ffn_size"] = "intermediate_size"
    # Mixtral renormalises its top-k (a softmax over the k chosen logits); Qwen3-MoE and
    # DeepSeek say so in norm_topk_prob (transformers' default for both: false)
    out.setdefault("router_norm_topk", data.get("norm_topk_prob", "num_local_experts" in data))
    dense = data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or dense != list(range(len(dense))) or any(isinstance(i, bool) for i in dense):
        raise ConfigError(f"{path}: key 'mlp_only_layers': expected the first layers [0, 1, ..] (dense layers "
                          f"elsewhere are not modelled), got {short(dense)}")
    if dense:
        out["first_dense_layers"] = len(dense)
        spelt["first_dense_layers"] = "mlp_only_layers"
    return out
