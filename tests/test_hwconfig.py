"""Hardware configs: the four shipped files give DESIGN.md's figures, variants and
overrides change only what they name, every bad config is one line naming file,
key path and what was expected, and every field carries a unit, a help text and a
source comment."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from pathlib import Path

import attrs
import pytest
import yaml

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.hw import HwConfig, load_hw
from npusim.hw.derived import derive
from npusim.hw.load import find_file, parse_set_args

HWCONFIGS = Path(__file__).resolve().parents[1] / "hwconfigs"
B2_TEXT = (HWCONFIGS / "ascend910b2.yaml").read_text()
GiB, MiB = 1 << 30, 1 << 20


def leaves(hw: HwConfig) -> dict[str, object]:
    """{'chip.freq_hz': 1.8e9, 'aic.mmad_fractals.fp16.k0': 16, ...}"""
    out = {}

    def walk(d, prefix):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[prefix + k] = v

    walk(attrs.asdict(hw), "")
    return out


def leaves_of_yaml(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from leaves_of_yaml(v, f"{prefix}{k}.")
        else:
            yield prefix + k


# ---- the shipped configs ----

DESIGN_TABLE = {
    # name: (aic, aiv, clock Hz, HBM bytes, L2 bytes, fp16 cube peak TFLOPS)
    "ascend910b1": (24, 48, 1.85e9, 64 * GiB, 192 * MiB, 363.7),
    "ascend910b2": (24, 48, 1.80e9, 64 * GiB, 192 * MiB, 353.9),
    "ascend910b3": (20, 40, 1.80e9, 64 * GiB, 192 * MiB, 294.9),
    "ascend910b4": (20, 40, 1.50e9, 32 * GiB, 96 * MiB, 245.8),
}


@pytest.mark.parametrize("name", sorted(DESIGN_TABLE))
def test_config_matches_design_table(name):
    aic, aiv, freq, hbm, l2, tflops = DESIGN_TABLE[name]
    hw = load_hw(name)
    assert hw.name == name
    assert (hw.chip.aic_count, hw.aiv_count, hw.chip.freq_hz) == (aic, aiv, freq)
    assert (hw.hbm.hbm_bytes, hw.l2.l2_bytes) == (hbm, l2)
    assert derive(hw).cube_peak_flops_per_s["fp16"] / 1e12 == pytest.approx(tflops, abs=0.05)


def test_design_per_core_facts():
    hw = load_hw("ascend910b2")
    assert (hw.aic.l1_bytes, hw.aic.l0a_bytes, hw.aic.l0b_bytes, hw.aic.l0c_bytes) == (
        512 << 10, 64 << 10, 64 << 10, 128 << 10)
    assert (hw.aic.mte1_l0a_bytes_per_cycle, hw.aic.mte1_l0b_bytes_per_cycle) == (512, 256)
    assert (hw.aiv.ub_bytes, hw.aiv.vector_repeat_bytes, hw.aiv.gm_write_bytes_per_cycle) == (192 << 10, 256, 64)
    assert (hw.l2.line_bytes, hw.dma.burst_bytes) == (512, 64)
    f16, i8 = hw.aic.mmad_fractals["fp16"], hw.aic.mmad_fractals["int8"]
    assert (f16.m0, f16.n0, f16.k0, i8.m0, i8.n0, i8.k0) == (16, 16, 16, 16, 32, 16)
    assert [load_hw(f"ascend910b{i}").aic.fb_bytes for i in (1, 2, 3, 4)] == [2048, 1024, 2048, 2048]


def test_derived_figures_are_the_closed_forms():
    hw = load_hw("ascend910b2")
    d = derive(hw)
    f = 1.8e9
    assert d.cube_peak_flops_per_s["int8"] == pytest.approx(2 * d.cube_peak_flops_per_s["fp16"])
    assert d.vector_peak_ops_per_s["fp16"] == pytest.approx(48 * f * 128)  # add: 1 cycle per repeat
    assert d.vector_peak_ops_per_s["fp32"] == pytest.approx(48 * f * 64)
    assert d.hbm_sustained_bw_bytes_per_s == pytest.approx(1.6e12 * hw.hbm.bw_efficiency)
    assert d.cube_hbm_ridge_flops_per_byte == pytest.approx(24 * f * 16**3 * 2 / (1.6e12 * hw.hbm.bw_efficiency))
    assert d.cube_l2_ridge_flops_per_byte == pytest.approx(24 * f * 16**3 * 2 / 8e12)
    assert d.vector_hbm_ridge_ops_per_byte == pytest.approx(48 * f * 128 / (1.6e12 * hw.hbm.bw_efficiency))
    assert hw.hbm_bytes_per_cycle == pytest.approx(d.hbm_sustained_bw_bytes_per_s / f)


@pytest.mark.parametrize("name", ["ascend910b1", "ascend910b3", "ascend910b4"])
def test_variant_overrides_only_what_it_names(name):
    named = {k for k in leaves_of_yaml(yaml.safe_load((HWCONFIGS / f"{name}.yaml").read_text())) if k != "base"}
    base, variant = leaves(load_hw("ascend910b2")), leaves(load_hw(name))
    changed = {k for k in base if base[k] != variant[k]}
    assert changed and changed <= named
    assert "name" in changed


def test_variant_in_tmp_path(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("base: ascend910b2\nname: mine\nhbm:\n  bw_efficiency: 0.9\naic:\n  mmad_fractals:\n    int8: {n0: 16}\n")
    base, mine = leaves(load_hw("ascend910b2")), leaves(load_hw(p))
    assert {k for k in base if base[k] != mine[k]} == {"name", "hbm.bw_efficiency", "aic.mmad_fractals.int8.n0"}
    assert mine["hbm.bw_efficiency"] == 0.9 and mine["aic.mmad_fractals.int8.n0"] == 16
    # a path in base: is relative to the variant file
    (tmp_path / "sub.yaml").write_text("base: mine.yaml\nname: sub\n")
    assert load_hw(tmp_path / "sub.yaml").hbm.bw_efficiency == 0.9


def test_override_mapping_changes_a_field():
    base = leaves(load_hw("ascend910b2"))
    hw = load_hw("ascend910b2", {"chip.aic_count": 32, "aic.mmad_fractals.fp16.k0": "32"})
    new = leaves(hw)
    assert {k for k in base if base[k] != new[k]} == {"chip.aic_count", "aic.mmad_fractals.fp16.k0"}
    assert hw.chip.aic_count == 32 and hw.aic.mmad_fractals["fp16"].k0 == 32  # strings are read as YAML
    assert parse_set_args(["chip.aic_count = 32", "hbm.peak_bw_bytes_per_s=1.8e12"]) == {
        "chip.aic_count": "32", "hbm.peak_bw_bytes_per_s": "1.8e12"}
    assert load_hw("ascend910b2", {"hbm.peak_bw_bytes_per_s": "1.8e12"}).hbm.peak_bw_bytes_per_s == 1.8e12


B2 = str(find_file("ascend910b2", "hwconfigs"))  # as load_hw names it in messages


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hbm.bw_efficiency": 1.5}, "key 'hbm.bw_efficiency': expected a value <= 1, got 1.5"),
        ({"chip.aic_count": "24.5"}, "key 'chip.aic_count': expected an integer, got 24.5"),
        ({"aic.l1_bytes": 0}, "key 'aic.l1_bytes': expected a value > 0, got 0"),
        ({"chip.aic_cnt": 3}, "unknown key 'chip.aic_cnt' (did you mean 'aic_count'?)"),
        ({"bogus": 3}, "unknown key 'bogus'"),
        ({"aic.mmad_fractals.fp16.z0": 3}, "unknown key 'aic.mmad_fractals.fp16.z0'"),
        ({"chip": 3}, "key 'chip': expected a mapping, got 3"),
        ({"aiv.vector_cycles_per_repeat.exp": 0},
         "key 'aiv.vector_cycles_per_repeat.exp': expected a value > 0, got 0"),
    ],
)
def test_override_is_validated_like_a_file(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_hw("ascend910b2", overrides)
    assert str(e.value) == f"{B2} (--set): {message}"


# ---- bad configs: one line naming file, key path and what was expected ----


def b2_with(old: str, new: str) -> str:
    assert old in B2_TEXT, old
    return B2_TEXT.replace(old, new, 1)


def b2_with_block(first_line: str, new: str) -> str:
    """Replace the YAML block that starts at `first_line` (up to the next blank line)."""
    start = B2_TEXT.index(first_line)
    return B2_TEXT[:start] + new + B2_TEXT[B2_TEXT.index("\n\n", start) :]


FRACTAL_FP16 = "fp16: {m0: 16, n0: 16, k0: 16}"

BAD_FILES = {
    "unknown key, top level": (B2_TEXT + "bogus: 1\n", "unknown key 'bogus'"),
    "unknown key, nested": (
        b2_with("  aic_count: 24", "  aic_count: 24\n  aic_cnt: 3"),
        "unknown key 'chip.aic_cnt' (did you mean 'aic_count'?)"),
    "unknown key, in a fractal": (
        b2_with(FRACTAL_FP16, "fp16: {m0: 16, n0: 16, k0: 16, z0: 1}"), "unknown key 'aic.mmad_fractals.fp16.z0'"),
    "misspelt section": (b2_with("\ndma:", "\ndmx:"), "unknown key 'dmx' (did you mean 'dma'?)"),
    "string for a number": (
        b2_with("freq_hz: 1.8e9", "freq_hz: fast"), "key 'chip.freq_hz': expected a number, got 'fast'"),
    "string for an int": (
        b2_with("aic_count: 24", "aic_count: many"), "key 'chip.aic_count': expected an integer, got 'many'"),
    "float for an int": (
        b2_with("aic_count: 24", "aic_count: 24.5"), "key 'chip.aic_count': expected an integer, got 24.5"),
    "bool for an int": (
        b2_with("aic_count: 24", "aic_count: true"), "key 'chip.aic_count': expected an integer, got True"),
    "empty value": (b2_with("aic_count: 24", "aic_count:"), "key 'chip.aic_count': expected an integer, got None"),
    "mapping for a number": (
        b2_with("aic_count: 24", "aic_count: {a: 1}"), "key 'chip.aic_count': expected an integer, got {'a': 1}"),
    "list for a number": (
        b2_with("freq_hz: 1.8e9", "freq_hz: [1, 2]"), "key 'chip.freq_hz': expected a number, got [1, 2]"),
    "number for a section": (b2_with_block("dma:\n", "dma: 3"), "key 'dma': expected a mapping, got 3"),
    "list for a dict field": (
        B2_TEXT[: B2_TEXT.index("  mmad_fractals:")] + "  mmad_fractals: []\n"
        + B2_TEXT[B2_TEXT.index("  mmad_startup_cycles:") :],
        "key 'aic.mmad_fractals': expected a mapping, got []"),
    "string in a dict of numbers": (
        b2_with("    ln: 4", "    ln: slow"), "key 'aiv.vector_cycles_per_repeat.ln': expected a number, got 'slow'"),
    "int for the name": (b2_with("name: ascend910b2", "name: 3"), "key 'name': expected a string, got 3"),
    "zero size": (b2_with("l1_bytes: 524288", "l1_bytes: 0"), "key 'aic.l1_bytes': expected a value > 0, got 0"),
    "negative size": (b2_with("l2_bytes: 201326592", "l2_bytes: -1"), "key 'l2.l2_bytes': expected a value > 0, got -1"),
    "negative cycles": (
        b2_with("  segment_cycles: ", "  segment_cycles: -4 #"), "key 'dma.segment_cycles': expected a value >= 0, got -4"),
    # aic and aiv both have gm_read_bytes_per_cycle: the path must name the right one
    "zero rate, second of two same-named fields": (
        b2_with("gm_read_bytes_per_cycle: 110    # ini: l2_read_bandwidth 110 B/cycle per core\n  gm_write_bytes_per_cycle: 64",
                "gm_read_bytes_per_cycle: 0\n  gm_write_bytes_per_cycle: 64"),
        "key 'aiv.gm_read_bytes_per_cycle': expected a value > 0, got 0"),
    "zero in the second fractal": (
        b2_with("int8: {m0: 16, n0: 32, k0: 16}", "int8: {m0: 16, n0: 32, k0: 0}"),
        "key 'aic.mmad_fractals.int8.k0': expected a value > 0, got 0"),
    "efficiency above 1": (
        b2_with("bw_efficiency:", "bw_efficiency: 1.5  #"), "key 'hbm.bw_efficiency': expected a value <= 1, got 1.5"),
    "missing field": (b2_with("  aic_count: 24", ""), "missing key 'chip.aic_count'"),
    "missing section": (B2_TEXT[: B2_TEXT.index("\nruntime:")] + "\n", "missing key 'runtime'"),
    "missing key in a fractal": (
        b2_with(FRACTAL_FP16, "fp16: {m0: 16, n0: 16}"), "missing key 'aic.mmad_fractals.fp16.k0'"),
    "empty file": ("", "expected a mapping at the top level, got an empty file"),
    "list at the top level": ("- 1\n", "expected a mapping at the top level, got a list: [1]"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_config_is_one_line(tmp_path, case):
    text, message = BAD_FILES[case]
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_hw(p)
    assert str(e.value) == f"{p}: {message}"


def test_bad_yaml_syntax_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(b2_with("  aic_count: 24", "  aic_count: 24: x"))
    with pytest.raises(ConfigError) as e:
        load_hw(p)
    line = B2_TEXT.splitlines().index("  aic_count: 24              # ini: ai_core_cnt 24") + 1
    assert str(e.value).startswith(f"{p}: line {line} not valid YAML: ")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("base: ascend910b2\nchip:\n  aic_cnt: 3\n", "unknown key 'chip.aic_cnt' (did you mean 'aic_count'?)"),
        ("base: ascend910b2\nfoo: 3\n", "unknown key 'foo'"),
        ("base: ascend910b2\naic:\n  mmad_fractals:\n    fp8: {m0: 16}\n", "unknown key 'aic.mmad_fractals.fp8'"),
        ("base: ascend910b2\nchip:\n  aic_count: 2.5\n", "key 'chip.aic_count': expected an integer, got 2.5"),
        ("base: ascend910b2\nchip: 3\n", "key 'chip': expected a mapping, got 3"),
    ],
)
def test_bad_variant(tmp_path, text, message):
    p = tmp_path / "variant.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_hw(p)
    assert str(e.value) == f"{p}: {message}"


@pytest.mark.parametrize("base", ["nosuch", "nosuch.yaml", "3"])
def test_base_that_does_not_exist(tmp_path, base):
    p = tmp_path / "variant.yaml"
    p.write_text(f"base: {base}\nname: v\n")
    with pytest.raises(ConfigError) as e:
        load_hw(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: key 'base': expected ascend910b1, ascend910b2")
    assert msg.endswith(f"or a path to a .yaml file, got {base!r}" if base != "3" else "got 3")


def test_base_loop(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="'base' chain loops back"):
        load_hw(tmp_path / "a.yaml")


def test_unknown_config_name():
    with pytest.raises(ConfigError) as e:
        load_hw("ascend910z9")
    assert str(e.value).startswith("hwconfigs: no config named 'ascend910z9' (known: ascend910b1, ")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_hw(tmp_path / "nope.yaml")


@pytest.mark.parametrize("item", ["chip.aic_count", "=3", ""])
def test_set_without_equals(item):
    with pytest.raises(ConfigError) as e:
        parse_set_args([item])
    assert str(e.value) == f"--set {item}: expected key.path=value"


def test_set_value_bad_yaml():
    with pytest.raises(ConfigError, match=r"^--set chip.aic_count: line 1 not valid YAML"):
        load_hw("ascend910b2", {"chip.aic_count": "[24"})


def test_fast_yaml_loader_reads_every_shipped_file_as_the_reference_loader():
    """Configs are read with libyaml's parser when PyYAML has it; the pure-Python
    loader, whose errors the messages quote, must give the same data."""
    from npusim.hw.parse import _FastLoader, _Loader

    root = Path(__file__).resolve().parents[1]
    files = sorted(p for d in ("npusim", "hwconfigs", "workloads", "benchmarks") for p in (root / d).rglob("*.y*ml"))
    assert len(files) >= 10
    for path in files:
        text = path.read_text()
        assert yaml.load(text, Loader=_FastLoader) == yaml.load(text, Loader=_Loader), path


# ---- every field: a unit in its name, a help text, a source comment ----

UNIT_SUFFIXES = ("_bytes", "_hz", "_cycles", "_us", "_per_s", "_per_cycle", "_count", "_ids", "_per_aic")
DIMENSIONLESS = {
    "name": "the config's name",
    "bw_efficiency": "a fraction of the peak",
    "ways": "lines per set",
    "outstanding": "copies a pipe's DMA engine holds",
    "m0": "elements", "n0": "elements", "k0": "elements",
    "mmad_fractals": "a dict of Fractal records",
    "vector_cycles_per_repeat": "a dict of cycles per repeat",
    "intra_node": "a topology kind (full_mesh or ring)",
}


def config_fields(cls=HwConfig, prefix=""):
    """(key path, attrs field) for every field that is not a section, recursing into
    sections and into records held in dicts."""
    attrs.resolve_types(cls)
    for f in attrs.fields(cls):
        if attrs.has(f.type):
            yield from config_fields(f.type, f"{prefix}{f.name}.")
            continue
        yield prefix + f.name, f
        if typing.get_origin(f.type) is dict:
            value_type = typing.get_args(f.type)[1]
            if attrs.has(value_type):
                yield from config_fields(value_type, f"{prefix}{f.name}.*.")


def test_every_field_has_a_unit_and_help():
    fields = list(config_fields())
    assert len(fields) >= 50
    for path, f in fields:
        assert f.name.endswith(UNIT_SUFFIXES) or f.name in DIMENSIONLESS, f"{path}: no unit in the name"
        assert isinstance(f.metadata.get("help"), str) and f.metadata["help"].strip(), f"{path}: no help"
    assert {f.name for _, f in fields} >= set(DIMENSIONLESS)  # the exception list is not stale


KEY_LINE = re.compile(r"^( *)([A-Za-z_]\w*):(.*)$")


@pytest.mark.parametrize("path", sorted(HWCONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_value_has_a_source_comment(path):
    """Every field line carries a comment: a source, or "assumed" (what calibration may
    tune). The entries of a dict-valued field (fractals, vector cost factors) are covered
    by the comment on the field's own line; `name` and `base` are not hardware facts."""
    indents: list[int] = []  # indentation of the enclosing key lines
    checked = 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = KEY_LINE.match(line)
        if not m:
            assert not line.strip() or line.lstrip().startswith("#"), f"{path.name}:{n}: unexpected line {line!r}"
            continue
        indent, key, rest = len(m[1]), m[2], m[3]
        while indents and indents[-1] >= indent:
            indents.pop()
        depth = len(indents)
        indents.append(indent)
        value, comment = re.match(r"(.*?)(?:\s#(.*))?$", rest).groups(default="")
        is_field = depth == 1 or (depth == 0 and value.strip() and key not in ("name", "base"))
        if is_field:
            checked += 1
            assert comment.strip(), f"{path.name}:{n}: '{key}' has no source or 'assumed' comment"
    assert checked > 0


# ---- the CLI ----


def test_cli_hw_show(capsys):
    assert main(["hw", "show"]) == 0
    out = capsys.readouterr().out
    assert "353.9 TFLOPS" in out
    assert re.search(r"chip\.freq_hz +1\.8e9 +1800 MHz +core clock", out)
    assert "cube_hbm_ridge_flops_per_byte" in out and "hbm_sustained_bw_bytes_per_s" in out


def test_cli_hw_show_with_set(capsys):
    assert main(["hw", "show", "ascend910b3", "--set", "chip.aic_count=32", "--set", "hbm.bw_efficiency=0.5"]) == 0
    out = capsys.readouterr().out
    assert "471.9 TFLOPS" in out  # 32 x 1.8 GHz x 16^3 x 2
    assert re.search(r"hbm_sustained_bw_bytes_per_s +800 GB/s", out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["hw", "show", "ascend910b2", "--set", "chip.aic_cnt=3"], "unknown key 'chip.aic_cnt'"),
        (["hw", "show", "ascend910b2", "--set", "chip.aic_count=x"], "expected an integer, got 'x'"),
        (["hw", "show", "ascend910b2", "--set", "chip.aic_count"], "--set chip.aic_count: expected key.path=value"),
        (["hw", "show", "ascend910z9"], "no config named 'ascend910z9'"),
    ],
)
def test_cli_error_is_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("npusim: error: ") and captured.err.count("\n") == 1
    assert message in captured.err


def test_cli_process_exit_code():
    r = subprocess.run([sys.executable, "-m", "npusim", "hw", "show", "--set", "hbm.bw_efficiency=2"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().endswith("key 'hbm.bw_efficiency': expected a value <= 1, got 2")
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_overrides_apply_to_a_loaded_config():
    hw = load_hw("ascend910b2")
    over = {"hbm.peak_bw_bytes_per_s": 2.4e12, "chip.aic_count": 20}
    assert load_hw(hw, over) == load_hw("ascend910b2", over)
    assert load_hw(hw) is hw
    with pytest.raises(ConfigError, match="unknown key 'hbm.nope'"):
        load_hw(hw, {"hbm.nope": 1})


def test_a_config_written_for_an_earlier_release_still_loads(tmp_path):
    """A complete config from before the topology, the tanh rate, the DMA queue, the vector
    cores' own segment time and the kernel start by kind: it loads, each added field with
    the value that keeps the earlier meaning (docs/architecture.md names each), and a
    field it gives is kept."""
    from pathlib import Path

    from npusim.hw.compat import ADDED, RENAMED, SPLIT_FROM
    from npusim.hw.load import find_file, read_yaml

    data = read_yaml(find_file("ascend910b2", "hwconfigs"))
    del data["topology"]
    del data["aiv"]["vector_cycles_per_repeat"]["tanh"]
    del data["dma"]["outstanding"], data["dma"]["vector_segment_cycles"]
    for kind in ("aic", "aiv", "mix"):
        del data["runtime"][f"kernel_start_{kind}_cycles"]
    data["runtime"]["kernel_start_cycles"] = 9000
    data["dma"]["segment_cycles"] = 3
    path = tmp_path / "mylab.yaml"
    path.write_text(yaml.safe_dump(data))
    hw = load_hw(path)
    assert hw.topology.max_devices == 1 and hw.dma.outstanding == 1
    assert hw.aiv.vector_cycles_per_repeat["tanh"] == load_hw().aiv.vector_cycles_per_repeat["tanh"]
    assert hw.dma.vector_segment_cycles == 3
    assert {hw.runtime.kernel_start_aic_cycles, hw.runtime.kernel_start_aiv_cycles,
            hw.runtime.kernel_start_mix_cycles} == {9000}
    data["dma"]["outstanding"] = 2  # given: kept
    path.write_text(yaml.safe_dump(data))
    assert load_hw(path).dma.outstanding == 2
    docs = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    for field in [*ADDED, *RENAMED, *SPLIT_FROM]:
        assert f"`{field}`" in docs, field
