"""Bad hardware configs and `--set` overrides: each is one clean error naming the
file and key path, at load time, before anything runs; none hangs or writes output.
Also: the cross-field rules hold for the shipped configs, and the list of vector ops
a config must cost is the list the lowerings use."""

from __future__ import annotations

import math
import re
from pathlib import Path

import attrs
import pytest
from cli_check import fails_cleanly, one_line_error

from npusim.errors import ConfigError, ProgramError
from npusim.hw import load_hw
from npusim.hw.checks import REQUIRED_FLAG_IDS, REQUIRED_VECTOR_OPS, inconsistency
from npusim.hw.load import find_file, parse_set_args

HWCONFIGS = Path(__file__).resolve().parents[2] / "hwconfigs"
B2 = re.escape(str(find_file("ascend910b2", "hwconfigs")))
SET = B2 + r" \(--set\): "

# ---- --set: every value checked like a file's (key path, range, cross-field)

BAD_SETS = {
    # not finite / out of range
    "inf rate": (["l2.bw_bytes_per_s=.inf"], SET + r"key 'l2.bw_bytes_per_s': expected a finite number, got inf"),
    "1e400 rate": (["l2.bw_bytes_per_s=1e400"], r"key 'l2.bw_bytes_per_s': expected a finite number, got inf"),
    "nan rate": (["hbm.peak_bw_bytes_per_s=.nan"], r"key 'hbm.peak_bw_bytes_per_s': expected a finite number"),
    "-inf latency": (["runtime.eager_launch_us=-.inf"], r"key 'runtime.eager_launch_us': expected a finite number"),
    "inf clock": (["chip.freq_hz=.inf"], r"key 'chip.freq_hz': expected a finite number"),
    "inf int": (["chip.aic_count=.inf"], r"key 'chip.aic_count': expected an integer, got inf"),
    "1e400 int": (["aic.l1_bytes=1e400"], r"key 'aic.l1_bytes': expected an integer, got inf"),
    "huge int": (["hbm.hbm_bytes=" + "9" * 400], r"key 'hbm.hbm_bytes': expected a value <= 1e\+18, got 9+\.\.\.9+$"),
    "too many digits": (["hbm.hbm_bytes=" + "9" * 5000],
                        r"--set hbm.hbm_bytes: not valid YAML: a number with too many"),
    "tiny clock": (["chip.freq_hz=1e-300"], r"key 'chip.freq_hz': expected a value >= 1e-09, got 1e-300"),
    "huge rate": (["l2.bw_bytes_per_s=1e30"], r"key 'l2.bw_bytes_per_s': expected a value <= 1e\+18, got 1e\+30"),
    "inf cost factor": (["aiv.vector_cycles_per_repeat.exp=.inf"],
                        r"key 'aiv.vector_cycles_per_repeat.exp': expected a finite number, got inf"),
    "zero cost factor": (["aiv.vector_cycles_per_repeat.add=0"],
                         r"key 'aiv.vector_cycles_per_repeat.add': expected a value > 0, got 0"),
    "negative cycles": (["dma.startup_cycles=-1"], r"key 'dma.startup_cycles': expected a value >= 0, got -1"),
    "zero cores": (["chip.aic_count=0"], r"key 'chip.aic_count': expected a value > 0, got 0"),
    "efficiency above 1": (["hbm.bw_efficiency=1.01"], r"key 'hbm.bw_efficiency': expected a value <= 1, got 1.01"),
    "zero fractal": (["aic.mmad_fractals.fp16.k0=0"], r"key 'aic.mmad_fractals.fp16.k0': expected a value > 0"),
    # issue 35: values whose products the engine could not hold exactly, or allocate
    "cycles beyond 2^32": (["dma.startup_cycles=1e18"],
                           SET + r"key 'dma.startup_cycles': expected a value <= 4294967296 \(2\^32\), got 1e\+18$"),
    "cycles per repeat beyond 2^32": (["aiv.vector_cycles_per_repeat.exp=1e18"],
                                      r"key 'aiv.vector_cycles_per_repeat.exp': expected a value <= 4294967296"),
    "a vector op over UB beyond 2^40": (["aiv.vector_cycles_per_repeat.exp=4294967296"],
                                        r"key 'aiv.vector_cycles_per_repeat.exp': 4294967296.0: a vector op over "
                                        r"aiv.ub_bytes 196608 \(768 repeats .*\) takes 3.3e\+12 cycles, more than the "
                                        r"1099511627776 \(2\^40\) one step may take$"),
    "a copy at a slow port beyond 2^40": (["aic.gm_read_bytes_per_cycle=1e-9"],
                                          r"key 'aic.gm_read_bytes_per_cycle': 1e-09: a copy of aic.l1_bytes 524288 "
                                          r"takes 5.24e\+14 cycles, more than the 1099511627776 \(2\^40\)"),
    # an OverflowError traceback from the engine's pipe walk ("a copy of 1.4e+16 cycles ... beyond 2^53")
    "off-line bursts slowing a copy beyond 2^40": (["dma.off_line_cost_bytes=1e18"],
                                                   SET + r"key 'dma.off_line_cost_bytes': 1e\+18: a copy of aic.l1_bytes "
                                                   r"524288 at aic.gm_write_bytes_per_cycle whose bursts of "
                                                   r"dma.burst_bytes 64 each start off an L2 line takes 9.53e\+19 "
                                                   r"cycles, more than the 1099511627776 \(2\^40\)"),
    "a host cost beyond 2^40 cycles": (["runtime.graph_launch_us=1e18"],
                                       r"key 'runtime.graph_launch_us': 1e\+18 us is 1.8e\+21 cycles at chip.freq_hz "
                                       r"1.8e\+09, more than the 1099511627776 \(2\^40\) one step may take$"),
    "a fast clock makes a host cost too long": (["chip.freq_hz=1e18"],
                                                r"key 'runtime.eager_launch_us': [\d.]+ us is [\d.]+e\+13 cycles at "
                                                r"chip.freq_hz 1e\+18"),
    "L2 lines beyond the model": (["l2.l2_bytes=1e18"],
                                  SET + r"key 'l2.l2_bytes': 1000000000000000000 is 1953125000000000 lines of "
                                  r"l2.line_bytes 512, more than the 16777216 \(2\^24\) the L2 model holds$"),
    "HBM past the L2's tags": (["hbm.hbm_bytes=1e18"],
                               r"key 'hbm.hbm_bytes': 1000000000000000000 bytes from GM address 1073741824 reach past "
                               r"the 27021597764222976 the L2's 32-bit tags name \(2\^31 x 24576 sets x l2.line_bytes "
                               r"512\)$"),
    "too many cube cores": (["chip.aic_count=4097"], r"key 'chip.aic_count': expected a value <= 4096, got 4097$"),
    "too many vector cores per cube core": (["chip.aiv_per_aic=65"],
                                            r"key 'chip.aiv_per_aic': expected a value <= 64, got 65$"),
    # each line access scans its set's ways: 65536 took a k3-tiny decode step 38 s (1 s at 16)
    "too many L2 ways": (["l2.ways=4097"], SET + r"key 'l2.ways': expected a value <= 4096, got 4097$"),
    "line below 32 bytes": (["l2.line_bytes=16", "dma.burst_bytes=16"],
                            r"key 'l2.line_bytes': expected a value >= 32, got 16$"),
    "fractal wider than a tile": (["aic.mmad_fractals.fp16.n0=512"],
                                  r"key 'aic.mmad_fractals.fp16.n0': 512 is larger than the 256 the largest tile has"),
    "fractal taller than a tile": (["aic.mmad_fractals.int8.m0=256"],
                                   r"key 'aic.mmad_fractals.int8.m0': 256 is larger than the 128"),
    # accepted once, then a verify error naming an instruction (or a tiling) deep in a run's lowering
    "fewer flag ids than the lowerings use": (["sync.flag_ids=7"],
                                              SET + r"key 'sync.flag_ids': expected a value >= 8 \(the lowerings use "
                                              r"ids 0 to 7: FlashAttention's L1 buffer pairs\), got 7$"),
    "fractal one column wide": (["aic.mmad_fractals.fp16.n0=1"],
                                SET + r"key 'aic.mmad_fractals.fp16.n0': expected 16 x a power of two up to 256 "
                                r"\(tiles and L0B copies are whole 16-column blocks\), got 1$"),
    "fractal of 48 columns": (["aic.mmad_fractals.int8.n0=48"], r"key 'aic.mmad_fractals.int8.n0': expected 16 x a"),
    "fractal of 24 rows": (["aic.mmad_fractals.fp16.m0=24"],
                           r"key 'aic.mmad_fractals.fp16.m0': expected a power of two <= 16 \(tiles are cut in "
                           r"16-row blocks\), got 24$"),
    "fractal of 32 rows": (["aic.mmad_fractals.bf16.m0=32"], r"key 'aic.mmad_fractals.bf16.m0': expected a power"),
    "fractal 3 deep": (["aic.mmad_fractals.fp16.k0=3"],
                       r"key 'aic.mmad_fractals.fp16.k0': expected a power of two <= 64 \(a base_k slice is 128 "
                       r"bytes of fp16 deep\), got 3$"),
    "fractal deeper than a slice": (["aic.mmad_fractals.fp32.k0=64"],
                                    r"key 'aic.mmad_fractals.fp32.k0': expected a power of two <= 32 "),
    "L0C below the largest tile": (["aic.l0c_bytes=65536"],
                                   SET + r"key 'aic.l0c_bytes': expected a value >= 131072 \(the largest matmul tile "
                                   r"the tiling choosers cut needs a 128 x 256 tile's fp32 accumulators\), got 65536$"),
    "L0A below the largest tile": (["aic.l0a_bytes=16384"], r"key 'aic.l0a_bytes': expected a value >= 32768 "),
    "L0B below the largest tile": (["aic.l0b_bytes=32768"], r"key 'aic.l0b_bytes': expected a value >= 65536 "),
    "BT below the largest tile": (["aic.bt_bytes=512"], r"key 'aic.bt_bytes': expected a value >= 1024 "),
    "FB below the largest tile": (["aic.fb_bytes=512"], r"key 'aic.fb_bytes': expected a value >= 1024 "),
    "L1 below the largest tile": (["aic.l1_bytes=262144"],
                                  r"key 'aic.l1_bytes': expected a value >= 395264 \(.* two chunks of A and of B, "
                                  r"512 B of K each, and the bias and scale rows\), got 262144$"),
    # wrong types
    "string for a number": (["chip.freq_hz=fast"], r"key 'chip.freq_hz': expected a number, got 'fast'"),
    "list for a number": (["chip.freq_hz=[1, 2]"], r"key 'chip.freq_hz': expected a number, got \[1, 2\]"),
    "mapping for a number": (["chip.aic_count={a: 1}"], r"key 'chip.aic_count': expected an integer, got \{'a': 1\}"),
    "float for an int": (["chip.aic_count=2.5"], r"key 'chip.aic_count': expected an integer, got 2.5"),
    "bool for an int": (["chip.aic_count=true"], r"key 'chip.aic_count': expected an integer, got True"),
    "comma list for an int": (["chip.aic_count=1,2"], r"key 'chip.aic_count': expected an integer, got '1,2'"),
    "number for a section": (["chip=3"], r"key 'chip': expected a mapping, got 3"),
    "long string": (["chip.freq_hz=" + "x" * 5000], r"expected a number, got 'x+\.\.\.x+'$"),
    # unknown keys, with a suggestion
    "hbm.bw": (["hbm.bw=3"], SET + r"unknown key 'hbm.bw' \(did you mean 'bw_efficiency' or 'peak_bw_bytes_per_s'\?\)"),
    "misspelt field": (["chip.aic_cuont=3"], r"unknown key 'chip.aic_cuont' \(did you mean 'aic_count'\?\)"),
    "misspelt section": (["hmb.hbm_bytes=3"], r"unknown key 'hmb' \(did you mean 'hbm'\?\)"),
    "unknown fractal field": (["aic.mmad_fractals.fp16.z0=3"], r"unknown key 'aic.mmad_fractals.fp16.z0'"),
    "unknown, nothing close": (["zzzz=1"], SET + r"unknown key 'zzzz'$"),
    # cross-field rules
    "L0A larger than L1": (["aic.l0a_bytes=1048576"], r"key 'aic.l0a_bytes': 1048576 is larger than aic.l1_bytes"),
    "L0C larger than L1": (["aic.l0c_bytes=1048576"], r"key 'aic.l0c_bytes': .* larger than aic.l1_bytes"),
    "BT larger than L1": (["aic.bt_bytes=1048576"], r"key 'aic.bt_bytes': .* larger than aic.l1_bytes"),
    "L1 smaller than L0B": (["aic.l1_bytes=32768"], r"key 'aic.l0a_bytes': 65536 is larger than aic.l1_bytes 32768"),
    "UB unaligned": (["aiv.ub_bytes=1000"], r"key 'aiv.ub_bytes': expected a multiple of UB's 32-byte alignment"),
    "L0A unaligned": (["aic.l0a_bytes=65000"], r"key 'aic.l0a_bytes': expected a multiple of L0A's 512-byte"),
    "L1 unaligned": (["aic.l1_bytes=524289"], r"key 'aic.l1_bytes': expected a multiple of L1's 32-byte"),
    "500-byte lines": (["l2.line_bytes=500"], r"key 'l2.line_bytes': expected a power of two, got 500"),
    "burst not a power of two": (["dma.burst_bytes=96"], r"key 'dma.burst_bytes': expected a power of two, got 96"),
    "repeat not a power of two": (["aiv.vector_repeat_bytes=200"], r"key 'aiv.vector_repeat_bytes': expected a power"),
    "line below burst": (["l2.line_bytes=32"], r"key 'l2.line_bytes': 32 is smaller than dma.burst_bytes 64"),
    "burst above line": (["dma.burst_bytes=1024"], r"key 'l2.line_bytes': 512 is smaller than dma.burst_bytes 1024"),
    "L2 smaller than a line": (["l2.l2_bytes=256"], r"key 'l2.l2_bytes': 256 holds less than one set"),
    "L2 smaller than a set": (["l2.l2_bytes=4096"], r"key 'l2.l2_bytes': 4096 holds less than one set of l2.ways 16"),
    "too many ways": (["l2.ways=4096", "l2.l2_bytes=1048576"],
                      r"key 'l2.l2_bytes': .* holds less than one set of l2.ways 4096"),
    # the --set syntax
    "key given twice": (["chip.aic_count=3", "chip.aic_count=4"], r"--set chip.aic_count: given twice \('3' and '4'\)"),
    "section then field": (["chip={aic_count: 3}", "chip.aic_count=4"],
                           r"--set chip.aic_count: 'aic_count' is set twice"),
    "field then section": (["chip.aic_count=4", "chip={aic_count: 3}"], r"--set chip: 'chip' is set twice"),
    # merged as no change, and reported as the what-if '(--set chip={})'
    "empty mapping": (["chip={}"], r"--set chip: an empty mapping sets no field \(expected a value, or "
                                   r"\{field: value, \.\.\.\}\)$"),
    "an empty mapping inside": (["aic={mmad_fractals: {}}"], r"--set aic: an empty mapping sets no field"),
    "empty name": (["name="], SET + r"key 'name': expected the config's name, got ''$"),  # reported as ''
    # a k3-tiny step of 6.6e24 cycles, reported as 3.6e21 us
    "a burst on a slow link beyond 2^40": (["hbm.peak_bw_bytes_per_s=1e-9"],
                                           SET + r"key 'hbm.peak_bw_bytes_per_s': 1e-09 x hbm.bw_efficiency 0.\d+: a "
                                           r"burst of dma.burst_bytes 64 takes 1.\d+e\+20 cycles at chip.freq_hz "
                                           r"1.8e\+09, more than the 1099511627776 \(2\^40\) one step may take$"),
    "a burst on slow PCIe beyond 2^40": (["runtime.pcie_bw_bytes_per_s=1e-9"],
                                         r"key 'runtime.pcie_bw_bytes_per_s': 1e-09: a burst of dma.burst_bytes 64 "),
    "a burst on a slow HCCS link beyond 2^40": (["topology.link_bw_bytes_per_s=1e-3"],
                                                r"key 'topology.link_bw_bytes_per_s': 0.001: a burst of"),
    "no equals": (["chip.aic_count"], r"--set chip.aic_count: expected key.path=value"),
    "no key": (["=3"], r"--set =3: expected key.path=value"),
    "bad YAML value": (["chip.aic_count=[24"], r"--set chip.aic_count: line 1 not valid YAML"),
    "alias in a value": (["chip.aic_count=*a"], r"--set chip.aic_count: .*not valid YAML"),
    # YAML 1.1's other spellings of numbers were read silently: 010 as 8, 1:0 as 60, 1_0 as 10
    "octal int": (["chip.aic_count=010"], SET + r"key 'chip.aic_count': expected an integer, got '010'$"),
    "base-60 int": (["chip.aic_count=1:0"], r"key 'chip.aic_count': expected an integer, got '1:0'$"),
    "int with '_'": (["chip.aic_count=1_0"], r"key 'chip.aic_count': expected an integer, got '1_0'$"),
    "hex int": (["chip.aic_count=0x18"], r"key 'chip.aic_count': expected an integer, got '0x18'$"),
    "float with '_'": (["chip.freq_hz=1_800e6"], r"key 'chip.freq_hz': expected a number, got '1_800e6'$"),
    "base-60 float": (["chip.freq_hz=30:0.0"], r"key 'chip.freq_hz': expected a number, got '30:0.0'$"),
}


@pytest.mark.parametrize("case", sorted(BAD_SETS))
def test_bad_set_is_one_clean_error(case, capsys):
    sets, expect = BAD_SETS[case]
    fails_cleanly(["hw", "show", *(x for s in sets for x in ("--set", s))], capsys, expect)


@pytest.mark.parametrize("case", ["inf rate", "L2 smaller than a set", "key given twice", "hbm.bw",
                                  "cycles beyond 2^32", "L2 lines beyond the model", "HBM past the L2's tags",
                                  "a host cost beyond 2^40 cycles", "fewer flag ids than the lowerings use",
                                  "fractal one column wide", "L0C below the largest tile"])
def test_bad_set_stops_a_run_before_it_writes(case, capsys, tmp_path):
    sets, expect = BAD_SETS[case]
    out = tmp_path / "out.json"
    fails_cleanly(["run", "--workload", "k3-tiny", "--batch", "1", "--context", "16", "--json", out,
                   *(x for s in sets for x in ("--set", s))], capsys, expect, [out])


# each at its bound: accepted, and a tiny op and (True) a decode step run to the end
AT_THE_BOUNDS = {
    "cycles": (["dma.startup_cycles=4294967296", "aiv.vector_startup_cycles=4294967296",
                "aic.mmad_startup_cycles=4294967296", "runtime.kernel_start_aiv_cycles=4294967296"], True),
    "L2 lines": (["l2.l2_bytes=8589934592"], True),  # 2^24 lines of 512 bytes
    "L2 lines, one way": (["l2.l2_bytes=8589934592", "l2.ways=1"], True),
    # one set of 16 lines: its tags name 2^31 x 512 bytes, GM from 2^30
    "HBM the L2's tags name": (["l2.l2_bytes=8192", "l2.ways=16", "hbm.hbm_bytes=1098437885952"], True),
    "cube cores": (["chip.aic_count=4096"], True),
    "vector cores per cube core": (["chip.aiv_per_aic=64"], False),  # (FlashAttention's kernel is written for 2)
    "host costs": (["runtime.graph_launch_us=610839.79", "runtime.eager_launch_us=610839.79"], True),  # 2^40 cycles
    "32-byte lines": (["l2.line_bytes=32", "dma.burst_bytes=32"], True),
    "L2 ways": (["l2.ways=4096"], True),
    # the least the lowerings take (hw/checks.py): flag ids, cube buffers, fractals at each end
    "flag ids and cube buffers": (["sync.flag_ids=8", "aic.l1_bytes=395264", "aic.l0a_bytes=32768",
                                   "aic.l0b_bytes=65536", "aic.l0c_bytes=131072", "aic.bt_bytes=1024",
                                   "aic.fb_bytes=1024"], True),
    "small fractals": (["aic.mmad_fractals.fp16.m0=1", "aic.mmad_fractals.fp16.n0=16", "aic.mmad_fractals.fp16.k0=1"],
                       True),
    "large fractals": (["aic.mmad_fractals.fp16.m0=16", "aic.mmad_fractals.fp16.n0=256",
                        "aic.mmad_fractals.fp16.k0=64"], True),
}


@pytest.mark.parametrize("case", sorted(AT_THE_BOUNDS))
def test_values_at_the_bounds_run_to_the_end(case, capsys):
    from npusim.cli import main

    values, step = AT_THE_BOUNDS[case]
    sets = [x for s in values for x in ("--set", s)]
    for op in (["rms_norm", "shape=8,64"], ["matmul", "m=64", "n=128", "k=256"]):
        assert main(["op", *op, *sets, "--no-cache"]) == 0, capsys.readouterr().err
    if step:
        assert main(["run", "--workload", "k3-tiny", "--batch", "1", "--context", "16", *sets, "--no-cache"]) == 0
        assert "latency" in capsys.readouterr().out


@pytest.mark.parametrize("aivs", [1, 3])
def test_flash_attention_refuses_other_than_two_aivs_per_aic(aivs, capsys):
    """Its AIV program halves a q tile's rows: one AIV left half of them undone (a silently
    short step), three wrote past O (a verify error naming an instruction)."""
    fails_cleanly(["run", "--workload", "k3-tiny", "--batch", "1", "--context", "16", "--set",
                   f"chip.aiv_per_aic={aivs}"], capsys,
                  r"node 'L0.attention': op decode_attention \(run as flash_attention on the cube\): its MIX kernel splits each q tile's rows between 2 AIVs "
                  rf"per AIC, and chip.aiv_per_aic is {aivs}$")


@pytest.mark.parametrize("chip, hbm, expect", [
    # ran and printed 1.6 TB/s peak for vectors 10^6 times the HBM
    ("{aic_count: 24}", 1024, r"over 48 AIV cores take 1\.10 GiB of GM, more than hbm\.hbm_bytes 1024 \(1\.00 KiB\)$"),
    # ran for hours (262,144 blocks)
    ("{aic_count: 4096, aiv_per_aic: 64}", 1 << 36, r"over 262144 AIV cores take 6000\.00 GiB of GM, more than "),
])
def test_demo_on_a_config_its_vectors_do_not_fit(chip, hbm, expect, tmp_path, capsys):
    p = tmp_path / "hw.yaml"
    p.write_text(f"base: ascend910b2\nchip: {chip}\nhbm: {{hbm_bytes: {hbm}}}\n")
    fails_cleanly(["demo", "--hw", p], capsys, re.escape(f"demo --hw {p}: the vector add's x, y and z ") + expect,
                  seconds=10)


def test_demo_on_a_config_its_tiles_do_not_fit(tmp_path, capsys):
    """It said "kernel 'vector_add', all blocks, AIV: buffer 'pong' [0x6000, 0xc000) needs 49152 bytes of UB
    but AIV has 32768", naming neither the config nor the key."""
    p = tmp_path / "hw.yaml"
    p.write_text("base: ascend910b2\naiv: {ub_bytes: 32768}\n")
    fails_cleanly(["demo", "--hw", p], capsys, re.escape(f"demo --hw {p}: the vector add's ping and pong tiles take "
                                                         "49152 bytes of UB, more than aiv.ub_bytes 32768") + "$")


# ---- config files

B2_TEXT = (HWCONFIGS / "ascend910b2.yaml").read_text()


def b2_with(old: str, new: str) -> str:
    assert old in B2_TEXT, old
    return B2_TEXT.replace(old, new, 1)


def _nest(depth: int) -> str:
    return "x: " + "[" * depth + "]" * depth + "\n"


def _alias_bomb(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


BAD_FILES = {
    "inf in a file": (b2_with("bw_bytes_per_s: 8.0e12", "bw_bytes_per_s: .inf"),
                      r"key 'l2.bw_bytes_per_s': expected a finite number, got inf"),
    "1e400 in a file": (b2_with("peak_bw_bytes_per_s: 1.6e12", "peak_bw_bytes_per_s: 1e400"),
                        r"key 'hbm.peak_bw_bytes_per_s': expected a finite number, got inf"),
    "nan in a file": (b2_with("freq_hz: 1.8e9", "freq_hz: .nan"), r"key 'chip.freq_hz': expected a finite number"),
    "duplicate key": (b2_with("  aic_count: 24", "  aic_count: 24\n  aic_count: 20"),
                      r"line \d+ not valid YAML: duplicate key 'aic_count'"),
    "duplicate section": (B2_TEXT + "dma:\n  burst_bytes: 64\n", r"not valid YAML: duplicate key 'dma'"),
    "duplicate fractal": (b2_with("    int8: {", "    fp16: {m0: 16, n0: 16, k0: 16}\n    int8: {"),
                          r"duplicate key 'fp16'"),
    "missing fp16 fractal": (b2_with("    fp16: {m0: 16, n0: 16, k0: 16}\n", ""),
                             r"key 'aic.mmad_fractals.fp16': missing \(the cube peaks"),
    "unknown fractal dtype": (b2_with("    int8: {", "    fp8: {m0: 16, n0: 32, k0: 32}\n    int8: {"),
                              r"key 'aic.mmad_fractals.fp8': unknown dtype \(expected one of fp16, bf16, fp32, "
                              r"int8\)$"),
    "missing vector op": (re.sub(r"\n    exp: [^\n]*", "", B2_TEXT, count=1),
                          r"key 'aiv.vector_cycles_per_repeat.exp': missing \(a lowering issues this vector op\)"),
    "unknown key, suggestion": (b2_with("  aic_count: 24", "  aic_count: 24\n  aiv_count: 48"),
                                r"unknown key 'chip.aiv_count' \(did you mean 'aic_count'\?\)"),
    "alias bomb": (_alias_bomb(), r"more than 100,000 values once YAML aliases are expanded"),
    "recursive alias": ("a: &a [1, *a]\n", r"a value contains itself"),
    "nested too deep (parser)": (_nest(3000), r"nested deeper than 32 levels"),
    "nested too deep (walk)": (_nest(40), r"nested deeper than 32 levels"),
    "larger than 1 MiB": ("# " + "x" * (1 << 20) + "\n", r"more than the 1,048,576 a config may have"),
    "huge list value": (b2_with("freq_hz: 1.8e9", "freq_hz: [" + ", ".join(["1"] * 5000) + "]"),
                        r"key 'chip.freq_hz': expected a number, got \[1, 1, 1, 1, \.\.\.\]$"),
    "long unknown key": (B2_TEXT + "k" * 1000 + ": 1\n", r"unknown key 'k+\.\.\.k+'$"),
    "top-level list": ("- 1\n- 2\n", r"expected a mapping at the top level, got a list: \[1, 2\]"),
    "top-level long string": ("x" * 5000 + "\n", r"got a str: 'x+\.\.\.x+'$"),
    "empty file": ("", r"expected a mapping at the top level, got an empty file"),
    "not YAML": ("chip: [1,\n", r"line \d+ not valid YAML"),
    "tab indentation": ("chip:\n\taic_count: 3\n", r"not valid YAML"),
    "binary": ("\x00\x01\x02", r"not valid YAML|cannot read"),
    "octal int in a file": (b2_with("  aic_count: 24", "  aic_count: 030"),  # was 24 cores
                            r"key 'chip.aic_count': expected an integer, got '030'$"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_is_one_clean_error(case, tmp_path, capsys):
    text, expect = BAD_FILES[case]
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    # an alias bomb or deep nesting must fail fast
    fails_cleanly(["hw", "show", p], capsys, re.escape(str(p)) + r"(:| )" + r".*" + expect, seconds=10)


def test_undecodable_file(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_bytes(b"chip: \xff\xfe\n")
    fails_cleanly(["hw", "show", p], capsys, re.escape(str(p)) + r": cannot read")


# ---- base: chains

def _chain(tmp_path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path / next(iter(files))


BAD_CHAINS = {
    "error in the base names the base": (
        {"top.yaml": "base: mid.yaml\nname: top\n", "mid.yaml": "base: ascend910b2\nchip:\n  aic_count: many\n"},
        "mid.yaml", r"key 'chip.aic_count': expected an integer, got 'many'"),
    "range error in the base names the base": (
        {"top.yaml": "base: mid.yaml\nname: top\n", "mid.yaml": "base: ascend910b2\nl2:\n  bw_bytes_per_s: .inf\n"},
        "mid.yaml", r"key 'l2.bw_bytes_per_s': expected a finite number"),
    "cross-field error in the base names the base": (
        {"top.yaml": "base: mid.yaml\nname: top\n", "mid.yaml": "base: ascend910b2\nl2:\n  line_bytes: 500\n"},
        "mid.yaml", r"key 'l2.line_bytes': expected a power of two"),
    "unknown key in the base names the base": (
        {"top.yaml": "base: mid.yaml\nname: top\n", "mid.yaml": "base: ascend910b2\nchip:\n  aic_cnt: 3\n"},
        "mid.yaml", r"unknown key 'chip.aic_cnt' \(did you mean 'aic_count'\?\)"),
    "YAML error in the base names the base": (
        {"top.yaml": "base: mid.yaml\n", "mid.yaml": "chip: [1,\n"}, "mid.yaml", r"line 2 not valid YAML"),
    "the variant's own error names the variant": (
        {"top.yaml": "base: mid.yaml\nchip:\n  aic_count: 2.5\n", "mid.yaml": "base: ascend910b2\n"},
        "top.yaml", r"key 'chip.aic_count': expected an integer, got 2.5"),
    "a loop": ({"a.yaml": "base: b.yaml\n", "b.yaml": "base: a.yaml\n"}, "a.yaml", r"'base' chain loops back"),
    "a self loop": ({"a.yaml": "base: a.yaml\n"}, "a.yaml", r"'base' chain loops back"),
    "too deep": ({f"v{i}.yaml": f"base: v{i + 1}.yaml\n" for i in range(12)} | {"v12.yaml": "base: ascend910b2\n"},
                 "v8.yaml", r"'base' chain deeper than 8 files"),
    "base not a string": ({"a.yaml": "base: [1, 2]\n"}, "a.yaml", r"key 'base': expected .* got \[1, 2\]"),
    "base missing": ({"a.yaml": "base: nosuch.yaml\n"}, "a.yaml", r"key 'base': expected ascend910b1"),
    "base empty": ({"a.yaml": "base:\nchip: {aic_count: 8}\n"}, "a.yaml",  # said "missing key 'name'"
                   r"key 'base': expected ascend910b1, .* or a path to a \.yaml file, got None$"),
}


@pytest.mark.parametrize("case", sorted(BAD_CHAINS))
def test_bad_base_chain_names_the_file_at_fault(case, tmp_path, capsys):
    files, at_fault, expect = BAD_CHAINS[case]
    top = _chain(tmp_path, files)
    fails_cleanly(["hw", "show", top], capsys, re.escape(str(tmp_path / at_fault)) + ": " + expect)


# ---- what is valid stays valid, and the rules are the engine's

@pytest.mark.parametrize("path", sorted(HWCONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_configs_pass_every_rule(path):
    assert inconsistency(load_hw(path)) is None


def test_aliases_and_merge_keys_within_limits_load(tmp_path):
    p = tmp_path / "v.yaml"
    p.write_text("base: ascend910b2\nchip: &c\n  aic_count: 20\naic:\n  mmad_fractals:\n"
                 "    fp16: &f {m0: 16, n0: 16, k0: 16}\n    bf16: *f\n")
    assert load_hw(p).chip.aic_count == 20


def test_extreme_rates_in_range_run_to_the_end(capsys):
    """1 B/s of L2 bandwidth (a what-if at the edge of the range) finishes: the flow
    model moves time forward even where the float clock is coarser than a cycle."""
    from npusim.cli import main

    assert main(["run", "--workload", "k3-tiny", "--batch", "1", "--context", "16", "--passes", "baseline",
                 "--set", "l2.bw_bytes_per_s=1", "--set", "hbm.peak_bw_bytes_per_s=1e18"]) == 0
    assert "latency" in capsys.readouterr().out


def test_required_vector_ops_are_what_the_lowerings_use():
    """Every op type lowers and verifies with only REQUIRED_VECTOR_OPS costed, and
    dropping any one of them makes some lowering fail verify() (none is spare)."""
    from npusim.isa import verify
    from npusim.ops import OPS, lower

    hw = load_hw()

    def with_ops(ops) -> object:
        costs = {k: v for k, v in hw.aiv.vector_cycles_per_repeat.items() if k in ops}
        return attrs.evolve(hw, aiv=attrs.evolve(hw.aiv, vector_cycles_per_repeat=costs))

    def used_by_some_lowering(ops) -> set[str]:
        hw_ = with_ops(ops)
        failing = set()
        for t in sorted(OPS):
            try:
                for k in lower(t, {}, hw_).kernels:
                    verify(k, hw_)
            except Exception:  # noqa: BLE001 - any failure counts: it needs a missing op
                failing.add(t)
        return failing

    assert used_by_some_lowering(REQUIRED_VECTOR_OPS) == set()
    # ops issued only under non-default parameters are not seen here; the source scan below finds them
    import npusim.ops

    src = "\n".join(p.read_text() for p in Path(npusim.ops.__file__).parent.rglob("*.py"))
    literal = set(re.findall(r"(?:VecOp|vop)\(\s*\"(\w+)\"", src))
    assert literal <= set(REQUIRED_VECTOR_OPS), literal - set(REQUIRED_VECTOR_OPS)


def test_required_flag_ids_are_what_the_lowerings_use():
    """Every op type lowers and verifies with REQUIRED_FLAG_IDS flag ids, and some does not
    with one fewer (the bound is not above what is needed)."""
    from npusim.isa import verify
    from npusim.ops import OPS, lower

    hw = load_hw()

    def failing(flag_ids: int) -> set[str]:
        hw_ = attrs.evolve(hw, sync=attrs.evolve(hw.sync, flag_ids=flag_ids))
        out = set()
        for t in sorted(OPS):
            try:
                for k in lower(t, {}, hw_).kernels:
                    verify(k, hw_)
            except ProgramError:
                out.add(t)
        return out

    assert failing(REQUIRED_FLAG_IDS) == set()
    assert "flash_attention" in failing(REQUIRED_FLAG_IDS - 1)


def test_required_fractal_is_what_derived_figures_quote():
    from npusim.hw.derived import derive

    hw = load_hw()
    only_fp16 = attrs.evolve(hw, aic=attrs.evolve(hw.aic, mmad_fractals={"fp16": hw.aic.mmad_fractals["fp16"]}))
    assert derive(only_fp16).cube_peak_flops_per_s.keys() == {"fp16"}


def test_every_number_has_a_bound():
    """No float field accepts inf, nan or a value whose quotients overflow."""
    for key in ("chip.freq_hz", "l2.bw_bytes_per_s", "hbm.peak_bw_bytes_per_s", "runtime.pcie_bw_bytes_per_s",
                "aic.gm_read_bytes_per_cycle", "runtime.eager_launch_us"):
        for bad in (math.inf, -math.inf, math.nan, 1e300):
            one_line_error(lambda: load_hw("ascend910b2", {key: bad}), ConfigError, re.escape(f"key '{key}'"))


def test_set_args_reject_repeats_before_anything_loads():
    one_line_error(lambda: parse_set_args(["a.b=1", "a.b = 2"]), ConfigError, r"--set a.b: given twice")


@pytest.mark.parametrize("kind", ["hwconfigs", "workloads"])
def test_a_config_folder_variable_naming_no_folder_is_refused(kind, tmp_path, monkeypatch):
    """$NPUSIM_HWCONFIGS (or _WORKLOADS) naming no folder: the shipped config of the same
    name was loaded instead, silently."""
    missing = tmp_path / "gone"
    monkeypatch.setenv("NPUSIM_" + kind.upper(), str(missing))
    from npusim.hw.load import find_file
    one_line_error(lambda: find_file("ascend910b2" if kind == "hwconfigs" else "k3", kind), ConfigError,
                   rf"NPUSIM_{kind.upper()}: .*gone is not a folder")


@pytest.mark.parametrize("flag, kind", [("--hw", "hwconfigs"), ("--workload", "workloads")])
@pytest.mark.parametrize("name", ["a" * 300, "x/" * 2100 + "k3.yaml"], ids=["long-name", "long-path"])
def test_a_name_no_file_system_could_hold_is_refused_short(flag, kind, name, capsys):
    """--hw (or --workload) of 300 characters: 'File name too long' after the whole name,
    thousands of characters for a longer one; now one short line naming the kind."""
    err = fails_cleanly(["run", flag, name], capsys, rf"{kind}: expected a config name or a path .* "
                                                   r"\(\d+ characters\): longer than a file's name or path can be")
    assert len(err) < 300
