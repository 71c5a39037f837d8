"""Bad-input catalogue, round 10's hostile sweep (the kernel IR's is tests/test_kernel_hostile.py).
Each case is one line naming the file, rule or flag and what was expected; nothing runs."""

from __future__ import annotations

import pytest

from cli_check import fails_cleanly

ADD = "    - {node: a, op: add, in: {x1: $x, x2: $r}, out: {y: $y}}\n"
INTO = "    - {node: \"{a}_f\", op: add, params: $a, in: {x1: $x, x2: $r}, out: {y: $y}}\n"


def rule(name: str, yield_to: str) -> str:
    return f"{name}:\n  match:\n{ADD}  yield_to: [{yield_to}]\n  into:\n{INTO}"


# ---- fusion rules files: yield_to cycles

# Each was read and run: where the patterns met, every rule of the cycle yielded to the
# next and none fused, with no word of it (a rule yielding to itself never fused at all)
CYCLES = {
    "two rules": (rule("r1", "r2") + rule("r2", "r1"),
                  r"rules\.yaml: rule 'r1': yield_to: a cycle \(r1 -> r2 -> r1\): where their patterns meet, each "
                  r"yields to the next and none of them fuses$"),
    "itself": (rule("r1", "r1"), r"rules\.yaml: rule 'r1': yield_to: a cycle \(r1 -> r1\): it never fuses where it "
                                 r"matches$"),
    "a built-in's": (rule("swiglu", "qkv_proj"),  # qkv_proj yields to swiglu
                     r"rules\.yaml: rule 'swiglu': yield_to: a cycle \(swiglu -> qkv_proj -> swiglu\)"),
}


@pytest.mark.parametrize("case", list(CYCLES))
@pytest.mark.parametrize("command", ["validate", "compare"])
def test_a_fusion_rules_file_whose_yields_cycle(case, command, capsys, tmp_path):
    text, expect = CYCLES[case]
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    other = ["--fusion-rules", rules] if command == "validate" else [
        "--no-cache", "--passes", "optimized", "--fusion-rules", rules, "npusim/passes/fusion_rules.yaml"]
    fails_cleanly([command, "--workload", "k3-tiny", *other], capsys, expect)


def test_a_yield_cycle_given_to_apply_in_python():
    from npusim import apply, build_decoder, load_workload
    from npusim.errors import ConfigError

    graph = build_decoder(load_workload("k3-tiny"), "decode", 1, [16])
    rules = {"r1": {"match": [{"node": "a", "op": "add", "in": {"x1": "$x", "x2": "$r"}, "out": {"y": "$y"}}],
                    "yield_to": ["r1"],
                    "into": [{"node": "{a}_f", "op": "add", "params": "$a", "in": {"x1": "$x", "x2": "$r"},
                              "out": {"y": "$y"}}]}}
    with pytest.raises(ConfigError, match=r"rule 'r1': yield_to: a cycle \(r1 -> r1\): it never fuses"):
        apply(graph, "fusion", fusion_rules=rules)
