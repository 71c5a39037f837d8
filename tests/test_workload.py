"""Workloads: the shipped files give DESIGN.md's K3 figures and the public models'
sizes, every field has a help text and every YAML value a comment, Hugging Face
config.json files load, and every bad or inconsistent file is one ConfigError line
naming the file and the key (as that file spells it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from npusim.errors import ConfigError
from npusim.workload import Workload, load_workload

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
TINY_TEXT = (WORKLOADS / "k3-tiny.yaml").read_text()
KiB = 1024


# ---- the shipped workloads


def test_k3_matches_design():
    """DESIGN.md: 5.99 B parameters, 11.98 GB in FP16, 512 KiB of KV cache per token."""
    w = load_workload("k3")
    assert (w.layers, w.hidden_size, w.heads, w.kv_heads, w.head_dim) == (32, 4096, 32, 32, 128)
    assert (w.ffn_size, w.vocab_size, w.max_context_tokens, w.dtype) == (8448, 64000, 8192, "fp16")
    assert not w.tie_embeddings and not w.qkv_bias
    assert round(w.param_count / 1e9, 2) == 5.99
    assert w.param_count == 5_993_926_656  # 32 x 170,926,080 + 2 x 64000 x 4096 + 4096
    assert w.weight_bytes == 2 * w.param_count
    assert abs(w.weight_bytes / 1e9 - 11.98) < 0.01  # 11.988 GB
    assert w.kv_bytes_per_token == 512 * KiB
    # DESIGN.md: batch 32 x context 8192 of KV cache alone is 128 GiB, past a 64 GiB HBM
    assert w.kv_bytes(32, 8192) == 128 * 2**30


@pytest.mark.parametrize("name, params, kv_per_token", [
    ("llama2-7b", 6_738_415_616, 512 * KiB),  # the published 6.74 B
    ("qwen2.5-7b", 7_615_616_512, 56 * KiB),  # 7.62 B with the Q/K/V biases; GQA: 4 K/V heads
    ("yi-1.5-6b", 6_061_035_520, 64 * KiB),  # the published 6.06 B; GQA: 4 K/V heads
    ("k3-tiny", None, 2 * 2 * 2 * 64 * 2),
])
def test_public_and_tiny_workloads(name, params, kv_per_token):
    w = load_workload(name)
    assert w.name == name
    if params is not None:
        assert w.param_count == params
    assert w.kv_bytes_per_token == kv_per_token


def test_k3_tiny_is_k3_shaped_with_gqa():
    big, tiny = load_workload("k3"), load_workload("k3-tiny")
    same = ("norm", "mlp", "tie_embeddings", "qkv_bias", "dtype", "norm_eps", "rope_theta")
    assert {k: getattr(tiny, k) for k in same} == {k: getattr(big, k) for k in same}
    assert tiny.kv_heads < tiny.heads and tiny.group == 2


def test_weight_shapes_are_linear_out_in():
    w = load_workload("qwen2.5-7b")
    s = w.layer_weight_shapes()
    assert s["wq"] == (3584, 3584) and s["wk"] == s["wv"] == (512, 3584) and s["wo"] == (3584, 3584)
    assert s["bq"] == (3584,) and s["bk"] == (512,)
    assert s["w_gate"] == s["w_up"] == (18944, 3584) and s["w_down"] == (3584, 18944)
    shapes = w.weight_shapes()
    assert shapes["embed"] == shapes["lm_head"] == (152064, 3584) and "L27.wq" in shapes


def test_tied_embeddings_count_once(tmp_path):
    p = tmp_path / "tied.yaml"
    p.write_text(TINY_TEXT.replace("tie_embeddings: false", "tie_embeddings: true"))
    tied, untied = load_workload(p), load_workload("k3-tiny")
    assert untied.param_count - tied.param_count == 1000 * 256
    assert "lm_head" not in tied.weight_shapes()


def test_every_field_has_help_and_every_value_a_comment():
    for f in attrs.fields(Workload):
        assert f.metadata.get("help"), f.name
    for path in WORKLOADS.glob("*.yaml"):
        for line in path.read_text().splitlines():
            if re.match(r"^\w+:", line) and not line.startswith("name:"):
                assert "#" in line, f"{path.name}: no comment on '{line}'"


def test_summary_mentions_the_design_figures():
    text = load_workload("k3").summary()
    assert "5.994 B" in text and "11.988 GB" in text and "512 KiB per token" in text


def test_name_path_and_overrides(tmp_path):
    by_path = load_workload(WORKLOADS / "k3.yaml")
    assert by_path == load_workload("k3")
    assert load_workload("k3", {"layers": 2, "kv_heads": "8"}).kv_heads == 8
    with pytest.raises(ConfigError, match=r"no config named 'k4'.*k3-tiny"):
        load_workload("k4")
    with pytest.raises(ConfigError, match=r"k3\.yaml \(--workload-set\): unknown key 'layer'"):
        load_workload("k3", {"layer": 2})
    with pytest.raises(ConfigError, match=r"k3\.yaml \(--workload-set\): key 'heads': 5 does not divide hidden_size"):
        load_workload("k3", {"heads": 5})
    # the name defaults to the file's stem
    p = tmp_path / "mine.yaml"
    p.write_text(TINY_TEXT.replace("name: k3-tiny\n", ""))
    assert load_workload(p).name == "mine"


# ---- bad YAML workloads: one line naming the file and the key


def _edit(text: str, key: str, value: str | None) -> str:
    """Replace key's line (value None: drop it; key not present: add it)."""
    pattern = re.compile(rf"^{key}:.*$", re.M)
    if value is None:
        return pattern.sub("", text)
    line = f"{key}: {value}"
    return pattern.sub(line, text) if pattern.search(text) else text + line + "\n"


BAD_YAML = [
    ("hiden_size", "256", r"unknown key 'hiden_size'"),
    ("layers", None, r"missing key 'layers'"),
    ("heads", "four", r"key 'heads': expected an integer, got 'four'"),
    ("norm_eps", "tiny", r"key 'norm_eps': expected a number, got 'tiny'"),
    ("tie_embeddings", "1", r"key 'tie_embeddings': expected true or false, got 1"),
    ("dtype", "16", r"key 'dtype': expected a string, got 16"),
    ("layers", "0", r"key 'layers': expected a value > 0, got 0"),
    ("rope_theta", "-1.0", r"key 'rope_theta': expected a value > 0, got -1.0"),
    ("heads", "3", r"key 'heads': 3 does not divide hidden_size 256"),
    ("kv_heads", "3", r"key 'kv_heads': 3 does not divide heads 4"),
    ("kv_heads", "8", r"key 'kv_heads': 8 does not divide heads 4"),
    ("head_dim", "31", r"key 'head_dim': RoPE rotates pairs of elements: expected an even value, got 31"),
    ("dtype", "fp32", r"key 'dtype': expected one of fp16, bf16, got 'fp32'"),
    ("norm", "layer_norm", r"key 'norm': expected one of rms_norm, got 'layer_norm'"),
    ("mlp", "gelu", r"key 'mlp': expected one of swiglu, moe, got 'gelu'"),
]


@pytest.mark.parametrize("key, value, message", BAD_YAML, ids=[f"{k}={v}" for k, v, _ in BAD_YAML])
def test_bad_yaml_is_one_line_naming_file_and_key(tmp_path, key, value, message):
    p = tmp_path / "bad.yaml"
    p.write_text(_edit(TINY_TEXT, key, value))
    with pytest.raises(ConfigError) as e:
        load_workload(p)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(f"{p}: "), text
    assert re.search(message, text), text


@pytest.mark.parametrize("content, message", [
    ("", "expected a mapping at the top level, got an empty file"),
    ("- 1\n- 2\n", "expected a mapping at the top level"),
    ("layers: [1,\n", "not valid YAML"),
])
def test_unreadable_yaml(tmp_path, content, message):
    p = tmp_path / "bad.yaml"
    p.write_text(content)
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        load_workload(p)
    assert str(e.value).startswith(str(p)) and "\n" not in str(e.value)


# ---- Hugging Face config.json

LLAMA2_HF = {  # meta-llama/Llama-2-7b-hf config.json
    "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
    "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000,
}
QWEN_HF = {  # Qwen/Qwen2.5-7B config.json (the keys the decoder uses)
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "model_type": "qwen2",
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 152064,
}


def _hf(tmp_path, data: dict, folder: str = "Llama-2-7b-hf") -> Path:
    d = tmp_path / folder
    d.mkdir(exist_ok=True)
    p = d / "config.json"
    p.write_text(json.dumps(data))
    return p


def test_hf_config_loads_like_the_shipped_yaml(tmp_path):
    w = load_workload(_hf(tmp_path, LLAMA2_HF))
    assert w.name == "Llama-2-7b-hf"
    assert attrs.evolve(w, name="llama2-7b") == load_workload("llama2-7b")
    q = load_workload(_hf(tmp_path, QWEN_HF, "Qwen2.5-7B"))
    assert attrs.evolve(q, name="qwen2.5-7b") == load_workload("qwen2.5-7b")  # qkv_bias from model_type
    assert q.group == 7 and q.dtype == "bf16"


def test_hf_defaults(tmp_path):
    data = {k: v for k, v in LLAMA2_HF.items() if k not in ("num_key_value_heads", "torch_dtype",
                                                            "tie_word_embeddings")}
    w = load_workload(_hf(tmp_path, data))
    assert (w.kv_heads, w.dtype, w.tie_embeddings, w.rope_theta) == (32, "fp16", False, 10000.0)


BAD_HF = [
    ("num_hidden_layers", None, r"missing key 'num_hidden_layers'"),
    ("hidden_size", "4096", r"key 'hidden_size': expected an integer, got '4096'"),
    ("tie_word_embeddings", "false", r"key 'tie_word_embeddings': expected true or false, got 'false'"),
    ("num_key_value_heads", 5, r"key 'num_key_value_heads': 5 does not divide num_attention_heads 32"),
    ("num_attention_heads", 30, r"key 'num_attention_heads': 30 does not divide hidden_size 4096"),
    ("head_dim", 63, r"key 'head_dim': RoPE rotates pairs of elements: expected an even value, got 63"),
    ("intermediate_size", 0, r"key 'intermediate_size': expected a value > 0, got 0"),
    ("torch_dtype", "float32", r"key 'torch_dtype': expected one of float16, bfloat16, got 'float32'"),
    ("hidden_act", "gelu", r"key 'hidden_act': expected 'silu'"),
]


@pytest.mark.parametrize("key, value, message", BAD_HF, ids=[f"{k}={v}" for k, v, _ in BAD_HF])
def test_bad_hf_config_names_the_hf_key(tmp_path, key, value, message):
    data = dict(LLAMA2_HF)
    if value is None:
        del data[key]
    else:
        data[key] = value
    p = _hf(tmp_path, data)
    with pytest.raises(ConfigError) as e:
        load_workload(p)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"{p}: "), text
    assert re.search(message, text), text


def test_hf_config_not_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{'hidden_size': 1")
    with pytest.raises(ConfigError, match=r"config\.json: line 1 not valid JSON"):
        load_workload(p)


def test_direct_construction_is_checked_too():
    w = load_workload("k3-tiny")
    with pytest.raises(ValueError, match="kv_heads"):
        attrs.evolve(w, kv_heads=3)
