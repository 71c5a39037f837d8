"""docs/extending.md is a test: its blocks run in order in an empty folder, so the page
cannot go stale. ```python run: executed (one namespace for the page); ```yaml file=NAME:
written to NAME; ```console run: each `$ npusim ...` line runs in this process
(npusim.cli.main, exit 0), after the Python before it registered its op, rule and pass;
```diff: an edit to npusim, shown only. Whatever the page registers is removed again."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
KINDS = ("python run", "console run", "diff")


def blocks() -> list[tuple[str, str]]:
    """(info string, text) of every fenced block of the page, in order."""
    return re.findall(r"^```([^\n`]*)\n(.*?)^```$", PAGE.read_text(), flags=re.S | re.M)


@pytest.fixture
def registries():
    """The op, pass and fusion-builder registries as they were, after the test."""
    from npusim.ops import registry
    from npusim.passes import PASSES, PIPELINES
    from npusim.passes.fused_ops import BUILDERS

    saved = [(r, dict(r)) for r in (registry._registered(), PASSES, PIPELINES, BUILDERS)]
    yield
    for live, before in saved:
        live.clear()
        live.update(before)


def test_every_block_is_run_written_or_an_edit():
    found = blocks()
    assert len(found) >= 12
    for info, _ in found:
        assert info in KINDS or re.fullmatch(r"yaml file=[\w.-]+", info), f"a block the test does not run: {info!r}"
    # the six examples, each with code the test runs
    sections = re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]
    assert [s.splitlines()[0] for s in sections] == ["An operator", "A fusion rule", "A pass", "A hardware field",
                                                     "A workload", "A service"]
    for s in sections:
        assert "```python run" in s or "```console run" in s, s.splitlines()[0]


def test_the_page_runs(tmp_path, monkeypatch, capsys, registries):
    from npusim.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path / "cache"))  # a user op's steps stay out of the cache
    namespace = {"__name__": "__extending__"}
    ran = 0
    for info, text in blocks():
        if info.startswith("yaml file="):
            (tmp_path / info.split("=", 1)[1]).write_text(text)
        elif info == "python run":
            exec(compile(text, str(PAGE), "exec"), namespace)
            ran += 1
        elif info == "console run":
            for line in text.splitlines():
                assert line.startswith("$ npusim "), line
                code = main(shlex.split(line[2:])[1:])
                assert code == 0, f"`{line[2:]}` exited {code}:\n{capsys.readouterr().err}"
                ran += 1
    assert ran >= 12
    out = capsys.readouterr().out
    assert "silu_mul" in out and "PASSED" in out  # npusim op and npusim validate printed their reports


def test_the_yaml_only_rule_fuses_and_validates_from_the_command_line(tmp_path, monkeypatch, capsys):
    """Done when a rule defined only in a file fuses and the graph still validates: the
    page's gate_up_proj rule by itself, no Python registered."""
    from npusim.cli import main
    from npusim.graph import build_decoder
    from npusim.passes import fuse

    text = dict(blocks())["yaml file=ffn_rules.yaml"]
    rule = text.split("\nsilu_mul:")[0]  # swiglu off and the gate_up_proj rule
    path = tmp_path / "gate_up.yaml"
    path.write_text(rule)
    fused = fuse(build_decoder("k3-tiny", "decode", 2, 64), path)
    gemm = [n for n in fused.nodes if n.name == "L0.gate_up_proj"]
    assert len(gemm) == 1 and gemm[0].params["n_parts"] == (512, 512) and "swiglu" not in fused.count_by_type()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["validate", "--workload", "k3-tiny", "--fusion-rules", str(path), "--passes", "optimized"]) == 0
    assert "PASSED" in capsys.readouterr().out


# ---------------------------------------------------------------- rules as data, passes by name

TINY_RULE = """
my_scale_add:  # the built-in scale_add, defined again under another name
{default}
  match:
    - {{node: scale, op: scale, in: {{x: $x}}, out: {{y: $scaled}}}}
    - {{node: add, op: add, in: {{x1: $scaled, x2: $r}}, out: {{y: $y}}, commutative: [x1, x2]}}
  into:
    - {{node: "{{scale}}_mine", op: scale_add, params: $scale, in: {{x: $x, r: $r}}, out: {{y: $y}}}}
"""


def _prefill():
    from npusim.graph import build_decoder

    return build_decoder("k3-tiny", "prefill", 1, 16)


@pytest.mark.parametrize("default, fused", [("", True), ("  default: on", True), ("  default: off", False)])
def test_a_rule_a_user_file_defines_is_on_unless_it_says_off(tmp_path, default, fused):
    from npusim.passes import fuse

    path = tmp_path / "rules.yaml"
    path.write_text("flash_attention: off\nscale_add: off\n" + TINY_RULE.format(default=default))
    g = fuse(_prefill(), path)
    mine = [n for n in g.nodes if n.name.endswith("_mine")]
    assert len(mine) == (2 if fused else 0) and all(n.op_type == "scale_add" for n in mine)
    assert ("scale" in g.count_by_type()) != fused


def test_the_shipped_rules_as_a_user_file_give_the_same_graph(tmp_path):
    """A definition under a built-in's name replaces it in its place: the shipped file copied
    and edited is the starting point of a user's rules."""
    from npusim.passes import fuse
    from npusim.passes.fusion import RULES_FILE

    path = tmp_path / "copy.yaml"
    path.write_text(re.sub(r"^  default: on$", "  default: off", RULES_FILE.read_text(), count=1, flags=re.M))
    g, ref = fuse(_prefill(), path), fuse(_prefill(), {"flash_attention": False})  # the first rule, switched off
    assert "flash_attention" not in g.count_by_type() and g.nodes == ref.nodes and g.tensors == ref.tensors
    assert fuse(_prefill(), RULES_FILE).nodes == fuse(_prefill()).nodes


@pytest.mark.parametrize("edit, key", [
    (("op: scale,", "op: sclae,"), "rule 'my_scale_add': match.scale.op: unknown op type 'sclae' (did you mean 'scale'?)"),
    (("x1: $scaled", "x1: $scald"), "rule 'my_scale_add': match.add: shares no $tensor"),
    (('"{scale}_mine"', '"{scal}_mine"'), "rule 'my_scale_add': into[0].node: '{scal}' names no node"),
    (("params: $scale", "params: $scal"), "rule 'my_scale_add': into[0].params: expected $node"),
    (("r: $r}", "r: $q}"), "rule 'my_scale_add': into[0].in.r: '$q' names no tensor"),
    (("op: scale_add", "op: scale_mul"), "rule 'my_scale_add': into[0].op: unknown op type 'scale_mul'"),
    (("in: {x: $x, r", "in: {z: $x, r"), "rule 'my_scale_add': into[0].in.z: not an input of scale_add"),
    (("  match:", "  matches:"), "rule 'my_scale_add': matches: unknown key (did you mean 'match'?)"),
])
def test_a_malformed_rule_is_one_line_naming_the_file_the_rule_and_the_key(tmp_path, edit, key):
    from npusim.errors import ConfigError
    from npusim.passes import fuse

    path = tmp_path / "rules.yaml"
    text = TINY_RULE.format(default="")
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError) as e:
        fuse(_prefill(), path)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{path}: {key}")


def test_a_registered_pass_joins_no_pipeline_and_the_help_lists_it(registries):
    from npusim.passes import PASSES, PIPELINES, apply, pass_names, passes_help, register_pass

    def mark(graph):
        """Mark the graph."""
        import attrs

        return attrs.evolve(graph, applied=(*graph.applied, "mark"))

    optimized = PIPELINES["optimized"]
    register_pass("mark", mark)
    assert PIPELINES["optimized"] == optimized and "mark" not in pass_names("optimized")
    assert list(PASSES).index("mark") == list(PASSES).index("memplan") - 1
    assert pass_names("optimized,mark")[-2:] == ("mark", "memplan")
    assert apply(_prefill(), "optimized,mark").applied[-2:] == ("mark", "memplan")
    assert "mark" in passes_help() and "optimized (fusion, layout, kv_layout" in passes_help()
    from npusim.cli import build_parser

    run_help = " ".join(build_parser()._subparsers._group_actions[0].choices["run"].format_help().split())
    assert "memplan, mark" not in run_help and "mark, memplan" in run_help
