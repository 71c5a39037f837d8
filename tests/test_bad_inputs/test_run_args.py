"""Bad-input catalogue, run arguments: a pass option without its pass, a tiling the
op would have to clamp."""

import pytest

from cli_check import fails_cleanly

from npusim.passes.rule_data import RULES_FILE

TINY = ["--workload", "k3-tiny", "--batch", "2", "--context", "64"]


@pytest.mark.parametrize("cmd", ["run", "compare", "validate"])
@pytest.mark.parametrize("argv, expect", [
    (["--buckets", "512"], r"--buckets is an option of the buckets pass"),
    (["--margin", "16"], r"--margin is an option of the buckets pass"),
    (["--passes", "baseline", "--fusion-rules", str(RULES_FILE)], r"--fusion-rules is an option of the fusion pass"),
    (["--passes", "fusion,memplan", "--kv-layout", "paged"], r"--kv-layout is an option of the kv_layout pass"),
])
def test_pass_option_without_its_pass(cmd, argv, expect, capsys):
    fails_cleanly([cmd, *TINY, *argv], capsys, expect)


@pytest.mark.parametrize("argv, expect", [
    (["matmul", "m=64", "n=64", "k=1024", "tiling.split_k=1000"], r"split_k=1000 exceeds the 16 base_k=64 slices"),
    (["matmul", "m=64", "n=64", "k=64", "tiling.split_k=2"], r"split_k=2 exceeds the 1 base_k=64 slices"),
])
def test_tiling_the_op_would_clamp(argv, expect, capsys):
    fails_cleanly(["op", *argv], capsys, expect)


@pytest.mark.parametrize("seed", ["-1", "-9999999999"])
def test_validate_negative_seed(seed, capsys):
    """numpy's generators take no negative seed: one line, not its traceback (issue 35)."""
    fails_cleanly(["validate", *TINY, f"--seed={seed}"], capsys, rf"--seed: expected a whole number >= 0, got {seed}")


@pytest.mark.parametrize("cmd", ["run", "compare", "sweep", "validate"])
@pytest.mark.parametrize("passes, expect", [
    ("fusion,fusion", r"--passes fusion,fusion: the pass fusion is named twice$"),
    ("fusion,,memplan", r"--passes fusion,,memplan: an empty item in the comma list"),
    ("fusion,", r"--passes fusion,: an empty item in the comma list"),
])
def test_passes_with_a_pass_twice_or_an_empty_item(cmd, passes, expect, capsys, tmp_path):
    """They ran as fusion and fusion,memplan: a pass left out between the commas went unnoticed."""
    out = ["--out", str(tmp_path / "sw"), "--set", "hbm.peak_bw_bytes_per_s=1e12,2e12"] if cmd == "sweep" else []
    fails_cleanly([cmd, *TINY, "--passes", passes, *out], capsys, expect)


def test_pipelined_run_reads_passes_as_run_does(capsys):
    """run --pp 2 --passes baseline,optimized ran the union; run without --pp refuses it."""
    fails_cleanly(["run", *TINY, "--pp", "2", "--passes", "baseline,optimized"], capsys,
                  r"--passes baseline,optimized: a comma list is ONE pipeline")


@pytest.mark.parametrize("cmd", ["run", "compare", "sweep", "validate"])
def test_fusion_rules_file_missing(cmd, capsys, tmp_path):
    """It was "/x/none.yaml: No such file or directory" (the cache's digest of the file
    reading it), or in validate "cannot read", the flag unnamed; a dangling link alike."""
    (tmp_path / "link.yaml").symlink_to(tmp_path / "gone.yaml")
    out = ["--out", str(tmp_path / "sw"), "--set", "batch=1,2"] if cmd == "sweep" else TINY
    for path in (tmp_path / "none.yaml", tmp_path / "link.yaml"):
        fails_cleanly([cmd, "--workload", "k3-tiny", *out, "--fusion-rules", path], capsys,
                      rf"^npusim: error: --fusion-rules {path}: no such file$", [tmp_path / "sw"])


@pytest.mark.parametrize("cmd", ["run", "compare", "validate"])
def test_negative_margin(cmd, capsys):
    """It was "buckets: expected positive bucket lengths and margin >= 0, got (512, 1024,
    2048, 4096), -1": the pass's words, the flag unnamed."""
    fails_cleanly([cmd, *TINY, "--passes", "optimized,buckets", "--margin", "-1"], capsys,
                  r"^npusim: error: --margin: expected a whole number of tokens >= 0, got -1$")


@pytest.mark.parametrize(("argv", "expect"), [
    (["run", *TINY[:2], "--set", "batch=2"],
     r"--set batch=2: batch is not a hardware field \(what --set sets\); give it as --batch 2$"),
    (["compare", *TINY[:2], "--set", "context=64"], r"--set context=64: .*; give it as --context 64$"),
    (["op", "batch_matmul", "--set", "batch=2"], r"--set batch=2: .*; an op's is a parameter: npusim op TYPE batch=2$"),
])
def test_a_step_knob_given_to_set_says_which_flag_takes_it(argv, expect, capsys):
    """`--set batch=2` is how a sweep's grid takes the knob; elsewhere it said 'unknown key'."""
    fails_cleanly(argv, capsys, expect)
