"""Bad-input catalogue, round 8's hostile sweep. Each case is one line naming the flag,
file or key and what was expected; nothing runs and nothing is written."""

from __future__ import annotations

import pytest

from cli_check import fails_cleanly

STEP = ["--batch", "1", "--context", "16", "--no-cache"]
SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--requests", "5", "--rate", "10"]


# ---- serve: services


@pytest.mark.parametrize("ratio", ["0.5", "0.999", "1e-30"])
def test_a_length_ratio_below_one(ratio, capsys, tmp_path):
    """No two prompts were ever within it (not even two of one length): every dynamic
    batch was a single request, and the run reported it as a result."""
    out = tmp_path / "o.json"
    fails_cleanly([*SERVE, "--service-set", f"scheduler.length_ratio={ratio}", "--json", out], capsys,
                  r"seed-optimized\.yaml \(--service-set\): key 'scheduler': 'length_ratio' must be 0 \(no grouping\) "
                  rf"or at least 1 \(longest / shortest prompt of a batch\): {ratio}", outputs=[out])


# ---- calibrate


@pytest.mark.parametrize("duration", ["1e-300", "0.0009"])
def test_a_profile_row_shorter_than_a_nanosecond(duration, capsys, tmp_path):
    """It was fitted: every error was printed as a 300-digit percentage, and the config written."""
    from npusim.cli import main

    d = tmp_path / "prof"
    assert main(["run", "--workload", "k3-tiny", *STEP, "--profile", str(d)]) == 0
    csv = d / "op_summary.csv"
    lines = csv.read_text().splitlines()
    column = lines[0].split(",").index("Task Duration(us)")
    cells = lines[1].split(",")
    cells[column] = duration
    csv.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    capsys.readouterr()
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--profile", d, "--out", out], capsys,
                  rf"op_summary\.csv: row 2, column 'Task Duration\(us\)': expected a duration of at least 0\.001 us "
                  rf"\(1 ns, msprof's resolution\), got '{duration}'$", outputs=[out])


def test_a_negative_zero_in_a_config_reads_as_zero():
    """--set runtime.kernel_compile_us=-0.0 printed 'compiles 16 kernels: -0 ms'."""
    import math

    from npusim.hw import load_hw

    hw = load_hw("ascend910b2", {"runtime.kernel_compile_us": -0.0})
    assert hw.runtime.kernel_compile_us == 0.0 and math.copysign(1.0, hw.runtime.kernel_compile_us) == 1.0
