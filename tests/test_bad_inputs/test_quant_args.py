"""Bad-input catalogue, the quantize pass: its options without the pass, values out of
range, a layer that is not there, a workload's planted outliers out of range."""

import pytest

from cli_check import fails_cleanly, one_line_error

from npusim.errors import ConfigError
from npusim.workload import load_workload

TINY = ["--workload", "k3-tiny", "--batch", "2", "--context", "64"]


@pytest.mark.parametrize("cmd", ["run", "compare", "validate"])
@pytest.mark.parametrize("argv, expect", [
    (["--quant", "w8a8"], r"--quant is an option of the quantize pass"),
    (["--passes", "optimized", "--quant-layers", "all"], r"--quant-layers is an option of the quantize pass"),
    (["--smooth-alpha", "0.5"], r"--smooth-alpha is an option of the quantize pass"),
])
def test_quant_option_without_the_pass(cmd, argv, expect, capsys):
    fails_cleanly([cmd, *TINY, *argv], capsys, expect)


@pytest.mark.parametrize("argv, expect", [
    (["--quant", "w8a16", "--smooth-alpha", "0.5"], r"--smooth-alpha: SmoothQuant migrates .* W8A8"),
    (["--quant", "w8a8", "--smooth-alpha", "0"], r"--smooth-alpha: expected a number in \(0, 1\], got 0.0"),
    (["--quant", "w8a8", "--smooth-alpha", "nan"], r"--smooth-alpha: expected a number in \(0, 1\]"),
    (["--quant-layers", "q_proj,foo"], r"--quant-layers: no Linear layer named 'q_proj'.*qkv_proj"),
    (["--quant-layers", ","], r"--quant-layers: expected no-head, all or a comma list"),
])
def test_quant_values(argv, expect, capsys):
    fails_cleanly(["validate", *TINY, "--passes", "optimized,quantize", *argv], capsys, expect)


@pytest.mark.parametrize("overrides, expect", [
    ({"outlier_channels": [3, 256]}, r"key 'outlier_channels': expected channels in 0 .. hidden_size - 1 = 255, got 256"),
    ({"outlier_channels": [-1]}, r"key 'outlier_channels': expected channels in 0 .. "),
    ({"outlier_scale": 0}, r"key 'outlier_scale': expected a finite value > 0"),
    ({"outlier_scale": float("inf")}, r"key 'outlier_scale': expected a finite value > 0"),
    # ran as without it, silently
    ({"outlier_scale": 30}, r"key 'outlier_scale': 30.0 multiplies the norm gains of outlier_channels, and none are "
                            r"given$"),
])
def test_bad_outliers(overrides, expect):
    one_line_error(lambda: load_workload("k3-tiny", overrides), ConfigError, expect)


@pytest.mark.parametrize("alpha", ["0", "-1", "1e300"])
def test_op_smooth_alpha_out_of_range(alpha, capsys):
    """op quantize_per_token smooth_alpha=-1 simulated (and --check ran): the pass's
    --smooth-alpha range, (0, 1], holds for the op's parameter too."""
    fails_cleanly(["op", "quantize_per_token", "rows=8", "hidden=64", "smooth=true", f"smooth_alpha={alpha}"],
                  capsys, r"op quantize_per_token: 'smooth_alpha' must be a number in \(0, 1\], got ")


@pytest.mark.parametrize("cmd", ["run", "validate"])
@pytest.mark.parametrize("layers, expect", [
    ("o_proj,o_proj", r"--quant-layers o_proj,o_proj: 'o_proj' is named twice$"),
    ("o_proj,,down_proj", r"--quant-layers o_proj,,down_proj: an empty item in the comma list$"),
])
def test_quant_layers_twice_or_with_an_empty_item(cmd, layers, expect, capsys, tmp_path):
    """They ran as o_proj and o_proj,down_proj: a name left out between the commas went unnoticed."""
    argv = [cmd, *TINY, "--passes", "optimized,quantize"]
    if cmd == "run":  # a step cached under the list must not answer for it
        from npusim.cli import main

        argv += ["--cache-dir", str(tmp_path / "cache")]
        assert main([*argv, "--quant-layers", "o_proj,down_proj"]) == 0
        capsys.readouterr()
    fails_cleanly([*argv, "--quant-layers", layers], capsys, expect)
