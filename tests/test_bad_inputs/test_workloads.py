"""Bad workloads (YAML and Hugging Face config.json) and step sizes: one clean error
naming the file and key, before a graph is built; unsupported architecture features
are refused by name rather than simulated as a dense decoder. A Hugging Face model
directory is accepted as --workload."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from cli_check import fails_cleanly, one_line_error

from npusim.errors import ConfigError
from npusim.workload import load_workload

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
TINY = (WORKLOADS / "k3-tiny.yaml").read_text()

LLAMA = {  # the keys of meta-llama/Llama-2-7b-hf's config.json the decoder reads, at k3-tiny's small size
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 256, "intermediate_size": 512,
    "max_position_embeddings": 1024, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
    "vocab_size": 1000,
}


def yaml_with(key: str, value: str | None) -> str:
    """k3-tiny's YAML with `key` set to `value` (a YAML snippet), added when absent, dropped for None."""
    pattern = re.compile(rf"^{re.escape(key)}:.*$", re.M)
    if value is None:
        return pattern.sub("", TINY)
    line = f"{key}: {value}"
    return pattern.sub(lambda _: line, TINY) if pattern.search(TINY) else TINY + line + "\n"


# ---- YAML workloads

BAD_YAML = {
    "list for layers": (yaml_with("layers", "[2, 3]"), r"key 'layers': expected an integer, got \[2, 3\]"),
    "list for hidden": (yaml_with("hidden_size", "[256]"), r"key 'hidden_size': expected an integer, got \[256\]"),
    "mapping for heads": (yaml_with("heads", "{a: 1}"), r"key 'heads': expected an integer, got \{'a': 1\}"),
    "list for eps": (yaml_with("norm_eps", "[1.0e-5]"), r"key 'norm_eps': expected a number"),
    "list for dtype": (yaml_with("dtype", "[fp16]"), r"key 'dtype': expected a string, got \['fp16'\]"),
    "list for the name": (yaml_with("name", "[a, b]"), r"key 'name': expected a string"),
    "empty name": (yaml_with("name", "' '"), r"key 'name': expected the model's name, got ' '$"),  # reported as ''
    "inf eps": (yaml_with("norm_eps", ".inf"), r"key 'norm_eps': expected a finite number, got inf"),
    "nan eps": (yaml_with("norm_eps", ".nan"), r"key 'norm_eps': expected a finite number, got nan"),
    "1e400 theta": (yaml_with("rope_theta", "1e400"), r"key 'rope_theta': expected a finite number, got inf"),
    "inf layers": (yaml_with("layers", ".inf"), r"key 'layers': expected an integer, got inf"),
    "10M layers": (yaml_with("layers", "10000000"), r"key 'layers': expected a value <= 1024 \(a sanity bound\)"),
    "huge hidden": (yaml_with("hidden_size", str(1 << 30)), r"key 'hidden_size': expected a value <= 1048576"),
    "huge vocab": (yaml_with("vocab_size", str(1 << 40)), r"key 'vocab_size': expected a value <= 16777216"),
    "huge context": (yaml_with("max_context_tokens", "9" * 30), r"key 'max_context_tokens': expected a value <="),
    "negative ffn": (yaml_with("ffn_size", "-1"), r"key 'ffn_size': expected a value > 0, got -1"),
    "duplicate key": (TINY + "layers: 4\n", r"not valid YAML: duplicate key 'layers'"),
    "unknown key, suggestion": (yaml_with("hiden_size", "256"),
                                r"unknown key 'hiden_size' \(did you mean 'hidden_size'\?\)"),
    "unknown key, suggestion 2": (yaml_with("num_layers", "2"),
                                  r"unknown key 'num_layers' \(did you mean 'layers'\?\)"),
    "MoE experts, HF spelling": (yaml_with("num_experts", "8"), r"unknown key 'num_experts' \(did you mean 'experts'\?\)"),
    "MoE top-k above experts": (yaml_with("mlp", "moe") + "experts: 4\nexperts_per_token: 5\nexpert_ffn_size: 64\n",
                                r"key 'experts_per_token': top-k 5 is more than the experts 4"),
    # was refused only once the graph was built: "node 'L0.rope_q': op rope: shape[-1]=48 (head_dim) must make ..."
    "head_dim 48 in fp16": (yaml_with("head_dim", "48"),
                            r"key 'head_dim': expected a multiple of 32 for fp16 \(RoPE rotates half heads of whole "
                            r"32-byte UB blocks; head_dim defaults to hidden_size / heads\), got 48$"),
    "head_dim 40 in bf16": (yaml_with("head_dim", "40").replace("dtype: fp16", "dtype: bf16"),
                            r"key 'head_dim': expected a multiple of 16 for bf16 .*, got 40$"),
    "sliding window": (yaml_with("sliding_window", "4096"), r"not supported: sliding_window = 4096 \(sliding-window"),
    "alias bomb": ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]\n" for p, c in zip("abcdef", "bcdefg")),
        r"more than 100,000 values"),
    "deep nesting": ("layers: " + "[" * 5000 + "]" * 5000 + "\n", r"nested deeper than 32 levels"),
    "top-level list": ("- layers\n", r"expected a mapping at the top level"),
    "not YAML": ("layers: [2,\n", r"line \d+ not valid YAML"),
    # YAML 1.1 read these as 8 and 60 layers
    "octal layers": (yaml_with("layers", "010"), r"key 'layers': expected an integer, got '010'$"),
    "base-60 layers": (yaml_with("layers", "1:0"), r"key 'layers': expected an integer, got '1:0'$"),
    # said "key '0': expected another type, got None" (the item's index, and no list)
    "a bool channel": (yaml_with("outlier_channels", "[true]"),
                       r"key 'outlier_channels': expected a list of integers, got \[True\]$"),
    "a channel twice": (yaml_with("outlier_channels", "[3, 7, 3]"),  # planted once, silently
                        r"key 'outlier_channels': channel 3 is named twice$"),
    "channels as a string": (yaml_with("outlier_channels", "'12'"),
                             r"key 'outlier_channels': expected a list of integers, got '12'$"),
}


@pytest.mark.parametrize("case", sorted(BAD_YAML))
def test_bad_yaml_workload_is_one_clean_error(case, tmp_path, capsys):
    text, expect = BAD_YAML[case]
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    out = tmp_path / "out.json"
    fails_cleanly(["run", "--workload", p, "--batch", "1", "--context", "16", "--json", out], capsys,
                  re.escape(str(p)) + r":.*" + expect, [out], seconds=10)


# ---- Hugging Face config.json

BAD_HF = {
    "Mixtral top-k above experts": ({"num_local_experts": 8, "num_experts_per_tok": 9},
                                    r"key 'num_experts_per_tok': top-k 9 is more than the num_local_experts 8"),
    "Qwen2-MoE shared expert": ({"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                                 "shared_expert_intermediate_size": 5632},
                                r"not supported: shared_expert_intermediate_size = 5632 \(a shared expert behind"),
    "DeepSeek MLA": ({"n_routed_experts": 64, "num_experts_per_tok": 6, "kv_lora_rank": 512},
                     r"not supported: kv_lora_rank = 512 \(multi-head latent attention"),
    "MoE FFN size without experts": ({"moe_intermediate_size": 1408},
                                     r"key 'moe_intermediate_size' without experts"),
    "MLA": ({"kv_lora_rank": 512}, r"not supported: kv_lora_rank = 512 \(multi-head latent attention"),
    "sliding window (Mistral)": ({"sliding_window": 256}, r"not supported: sliding_window = 256"),
    "sliding window on": ({"sliding_window": 256, "use_sliding_window": True}, r"not supported: sliding_window"),
    "FFN bias": ({"mlp_bias": True}, r"not supported: mlp_bias = True"),
    "partial RoPE": ({"partial_rotary_factor": 0.5}, r"not supported: partial_rotary_factor = 0.5"),
    # true/false read as 1/0: simulated as full RoPE, MoE in every layer, two dense layers, a dense FFN
    "partial RoPE true": ({"partial_rotary_factor": True}, r"not supported: partial_rotary_factor = True"),
    "sparse step true": ({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                          "decoder_sparse_step": True}, r"not supported: decoder_sparse_step = True"),
    "dense layers as bools": ({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                               "mlp_only_layers": [False, True]}, r"key 'mlp_only_layers': expected the first layers "
                                                                  r"\[0, 1, \.\.\] .*, got \[False, True\]$"),
    "experts true": ({"num_experts": True, "num_experts_per_tok": 1},
                     r"key 'num_experts': expected an integer, got True$"),
    "a quantised checkpoint": ({"quantization_config": {"quant_method": "awq", "bits": 4}},  # was fp16 weights
                               r"not supported: quantization_config = \{'bits': 4, 'quant_method': 'awq'\} \(a GPTQ, "
                               r"AWQ or FP8 checkpoint's quantised weights is not modelled"),
    # every layer was simulated as a MoE layer
    "DeepSeek-MoE's MoE layer frequency": ({"n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                                            "moe_layer_freq": 2}, r"not supported: moe_layer_freq = 2 \(MoE layers "
                                                                  r"only every few layers"),
    "Llama 4's interleaved MoE layers": ({"num_local_experts": 8, "num_experts_per_tok": 1,
                                          "interleave_moe_layer_step": 2},
                                         r"not supported: interleave_moe_layer_step = 2 \(MoE layers only"),
    "two counts of experts": ({"num_local_experts": 8, "num_experts": 4, "num_experts_per_tok": 2},  # ran with 4
                              r"key 'num_local_experts': 8, and num_experts 4: two counts of experts \(expected one, "
                              r"or the same in both\)$"),
    "two dtypes": ({"torch_dtype": "float16", "dtype": "bfloat16"},  # ran in fp16
                   r"key 'dtype': 'bfloat16', and torch_dtype 'float16': two dtypes \(expected one, or the same in "
                   r"both\)$"),
    "mixed layer types": ({"layer_types": ["sliding_attention", "full_attention"]}, r"not supported: layer_types"),
    "Infinity eps": ({"rms_norm_eps": float("inf")}, r"key 'rms_norm_eps': expected a finite number, got inf"),
    "NaN eps": ({"rms_norm_eps": float("nan")}, r"key 'rms_norm_eps': expected a finite number, got nan"),
    "Infinity theta": ({"rope_theta": float("inf")}, r"key 'rope_theta': expected a finite number"),
    "10M layers": ({"num_hidden_layers": 10000000}, r"key 'num_hidden_layers': expected a value <= 1024"),
    "list for layers": ({"num_hidden_layers": [32]}, r"key 'num_hidden_layers': expected an integer, got \[32\]"),
    "list for heads": ({"num_attention_heads": [4, 4]}, r"key 'num_attention_heads': expected an integer"),
    "list for eps": ({"rms_norm_eps": [1e-5]}, r"key 'rms_norm_eps': expected a number, got \[1e-05\]"),
    "list for dtype": ({"torch_dtype": ["float16"]}, r"key 'torch_dtype': expected one of float16, bfloat16"),
    "mapping for dtype": ({"torch_dtype": {"a": 1}}, r"key 'torch_dtype': expected one of float16, bfloat16"),
    "list for the activation": ({"hidden_act": ["silu"]}, r"key 'hidden_act': expected 'silu'"),
    "list for rope parameters": ({"rope_parameters": [1]}, r"key 'rope_parameters': expected a mapping, got \[1\]"),
    "string for tie": ({"tie_word_embeddings": "false"}, r"key 'tie_word_embeddings': expected true or false"),
    "huge list": ({"num_hidden_layers": list(range(5000))},
                  r"key 'num_hidden_layers': expected an integer, got \[0, 1, 2, 3, \.\.\.\]$"),
    "missing key": ({"num_hidden_layers": None}, r"missing key 'num_hidden_layers'"),
    "head_dim 48": ({"head_dim": 48}, r"key 'head_dim': expected a multiple of 32 for fp16 \(RoPE .*\), got 48$"),
    "head_dim 48 from hidden / heads": ({"hidden_size": 1536, "num_attention_heads": 32, "num_key_value_heads": 8},
                                        r"key 'head_dim': expected a multiple of 32 for fp16 \(.*; head_dim defaults to "
                                        r"hidden_size / num_attention_heads\), got 48$"),
}


def hf_dir(tmp_path, changes: dict, name: str = "Tiny-Llama") -> Path:
    data = {k: v for k, v in (LLAMA | changes).items() if v is not None}
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(data))
    return d


@pytest.mark.parametrize("case", sorted(BAD_HF))
def test_bad_hf_config_is_one_clean_error(case, tmp_path, capsys):
    changes, expect = BAD_HF[case]
    p = hf_dir(tmp_path, changes) / "config.json"
    fails_cleanly(["run", "--workload", p, "--batch", "1", "--context", "16"], capsys,
                  re.escape(str(p)) + r": " + expect)


BAD_JSON_TEXT = {
    "duplicate key": ('{"hidden_size": 256, "hidden_size": 512}', r"duplicate key 'hidden_size'"),
    "not JSON": ("{'hidden_size': 1", r"line 1 not valid JSON"),
    "deep nesting": ("[" * 100000 + "]" * 100000, r"nested deeper than 32 levels"),
    "top-level list": ("[1, 2]", r"expected a JSON object at the top level, got list"),
    "too many digits": ('{"hidden_size": ' + "9" * 5000 + "}", r"not valid JSON: a number with too many digits"),
    "larger than 1 MiB": ('{"x": "' + "y" * (1 << 20) + '"}',
                          r"1,048,\d+ characters, more than the 1,048,576 a config may have"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSON_TEXT))
def test_bad_json_text_is_one_clean_error(case, tmp_path, capsys):
    text, expect = BAD_JSON_TEXT[case]
    p = tmp_path / "config.json"
    p.write_text(text)
    fails_cleanly(["run", "--workload", p], capsys, re.escape(str(p)) + r": " + expect)


# ---- sizes of a step: refused before the graph is built

BAD_SIZES = {
    "batch 100M": (["--workload", "k3-tiny", "--batch", "100000000"],
                   r"argument --batch: expected at most the 65536 sequences a step may have, got 100000000"),
    "batch 0": (["--workload", "k3-tiny", "--batch", "0"],
                r"argument --batch: expected a whole number of sequences >= 1, got 0"),
    "negative batch": (["--workload", "k3-tiny", "--batch", "-3"],
                       r"argument --batch: expected a whole number of sequences >= 1, got -3"),
    # these two named build_decoder(k3-tiny, decode), not the flag
    "context 0": (["--workload", "k3-tiny", "--context", "0"], r"--context 0: lengths must be positive integers, got 0"),
    "context beyond the model": (["--workload", "k3-tiny", "--context", "100000000"], r"exceeds the workload's max"),
    "ragged context, wrong count": (["--workload", "k3-tiny", "--batch", "2", "--context", "3,4,5"],
                                    r"--context 3,4,5: 3 lengths for batch 2"),
    "KV cache of a PB": (["--workload", "k3", "--batch", "65536", "--context", "8192"],
                         r"does not fit in ascend910b2's memory: weights 11.16 GiB \+ KV cache 262144.00 GiB alone"),
}


@pytest.mark.parametrize("case", sorted(BAD_SIZES))
def test_step_too_large_fails_fast(case, capsys, tmp_path):
    args, expect = BAD_SIZES[case]
    out = tmp_path / "out.json"
    fails_cleanly(["run", *args, "--json", out], capsys, expect, [out], seconds=30)


def test_deep_model_that_cannot_fit_fails_before_building(tmp_path, capsys):
    """1000 layers of K3 (~320 GiB of weights): refused from the weights alone,
    without building (and running the passes over) a 1000-layer graph."""
    p = tmp_path / "deep.yaml"
    p.write_text(re.sub(r"^layers:.*$", "layers: 1000", (WORKLOADS / "k3.yaml").read_text(), flags=re.M))
    fails_cleanly(["run", "--workload", p], capsys, r"weights 319.35 GiB \+ KV cache .* alone need .* the largest "
                  r"batch that fits at context 8192 is 0", seconds=10)


# ---- values the loader takes whose kernels the config cannot run: the file and key named

BUILD_LIMITS = {  # (the YAML's changed lines, the flags, what the message holds after the file)
    "hidden_size 65536": ({"hidden_size": "65536"}, [],
                          r"key 'hidden_size' 65536, on ascend910b2: node 'embedding': op embedding: one row of "
                          r"hidden=65536 .* does not fit UB"),
    "heads 256 x head_dim 128": ({"hidden_size": "32768", "heads": "256", "head_dim": "128", "kv_heads": "8"}, [],
                                 r"keys 'heads' 256, 'head_dim' 128, on ascend910b2: node 'L0.rope_q': op rope: one "
                                 r"row needs"),
    "head_dim 2048": ({"head_dim": "2048"}, [],
                      r"keys 'heads' 4, 'head_dim' 2048, on ascend910b2: node 'L0.attention': op "
                      r"decode_attention \(run as flash_attention on the cube\): tiling does not fit L1"),
}


@pytest.mark.parametrize("case", sorted(BUILD_LIMITS))
def test_a_value_no_kernel_runs_names_the_file_and_key(case, tmp_path, capsys):
    """Said as 'node 'embedding': op embedding: one row of hidden=65536 ... does not fit UB':
    neither the workload file nor the key that made the row that long."""
    lines, flags, expect = BUILD_LIMITS[case]
    text = TINY
    for key, value in lines.items():
        text = re.sub(rf"^{key}:.*$", f"{key}: {value}", text, flags=re.M) if re.search(rf"^{key}:", text, re.M) \
            else text + f"{key}: {value}\n"
    p = tmp_path / "w.yaml"
    p.write_text(text)
    fails_cleanly(["run", "--workload", p, "--no-cache", *flags], capsys, "^npusim: error: " + re.escape(str(p))
                  + ": " + expect)


def test_a_value_no_kernel_runs_names_the_workload_set(capsys):
    fails_cleanly(["run", "--workload", "k3-tiny", "--workload-set", "hidden_size=65536", "--no-cache"], capsys,
                  r"k3-tiny\.yaml \(--workload-set\): key 'hidden_size' 65536, on ascend910b2: node 'embedding'")


def test_node_keys_know_every_node_of_the_built_graphs():
    """Every node the builder makes, under the passes, is known to node_keys but those whose
    shapes the step's lengths set as much (qk, pv, softmax, scale, mask)."""
    from npusim.graph.build import node_keys
    from npusim.hw import load_hw
    from npusim.runtime.decoder import step

    hw = load_hw("ascend910b2")
    unknown = set()
    for name, phase in (("k3-tiny", "decode"), ("k3-tiny-moe", "prefill")):
        for passes in ("baseline", "optimized"):
            unknown |= {n.name.split(".", 1)[-1] for n in step(name, phase, 2, 64, passes).graph(hw=hw).nodes
                        if not node_keys(n.name)}
    assert unknown <= {"qk", "pv", "softmax", "scale", "mask", "moe_init_routing", "moe_finalize_routing",
                       "shared_down_proj", "shared_gate_proj", "shared_up_proj", "shared_mul", "shared_silu",
                       "shared_down_proj.to_nz", "shared_gate_proj.to_nz", "shared_up_proj.to_nz"}, unknown


# ---- what must be accepted

def test_hf_model_directory_is_a_workload(tmp_path, capsys):
    from npusim.cli import main

    d = hf_dir(tmp_path, {})
    assert load_workload(d) == load_workload(d / "config.json")
    assert load_workload(d).name == "Tiny-Llama"
    assert main(["run", "--workload", str(d), "--batch", "1", "--context", "16", "--passes", "baseline"]) == 0
    assert "Tiny-Llama decode" in capsys.readouterr().out


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_head_dim_48_in_bf16_runs(tmp_path, capsys, phase):
    """bf16's RoPE computes in fp32: a half head of 24 elements is 96 bytes, whole UB blocks."""
    from npusim.cli import main

    d = hf_dir(tmp_path, {"head_dim": 48, "torch_dtype": "bfloat16"})
    assert main(["run", "--workload", str(d), "--batch", "1", "--context", "16", "--phase", phase,
                 "--no-cache"]) == 0, capsys.readouterr().err
    assert "latency" in capsys.readouterr().out


def test_a_directory_without_config_json_is_a_clean_error(tmp_path, capsys):
    (tmp_path / "empty-model").mkdir()
    fails_cleanly(["run", "--workload", tmp_path / "empty-model"], capsys,
                  r"empty-model: a directory without a config.json")


@pytest.mark.parametrize("off", [
    {"sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28},  # Qwen2.5's config
    {"sliding_window": None},  # Mistral v0.2 and later
    {"sliding_window": 4096, "use_sliding_window": False},
    {"sliding_window": 1024},  # a window covering the whole context changes nothing
    {"num_local_experts": 1}, {"num_experts": None}, {"mlp_bias": False}, {"partial_rotary_factor": 1.0},
    {"moe_layer_freq": 1}, {"interleave_moe_layer_step": 1},
    {"layer_types": ["full_attention", "full_attention"]}, {"rope_scaling": None},
], ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_features_that_are_off_are_accepted(tmp_path, off):
    assert load_workload(hf_dir(tmp_path, off)).layers == 2


def test_workload_override_suggests_a_field():
    one_line_error(lambda: load_workload("k3-tiny", {"hidden": 3}), ConfigError,
                   r"unknown key 'hidden' \(did you mean 'hidden_size'\?\)")


def test_param_count_does_not_list_every_layer():
    w = load_workload("k3")
    assert w.param_count == sum(math.prod(s) for s in w.weight_shapes().values())
