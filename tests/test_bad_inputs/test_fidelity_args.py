"""Bad-input catalogue, benchmarks/fidelity.py (a calibration of 75 minutes): a bad
flag is one line and exit status 2 within seconds, before anything is simulated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fails(args: list[str], expect: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fidelity.py"), *args], capture_output=True,
                       text=True, timeout=60, env=env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert expect in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args, expect", [
    (["--hw", "nope"], "fidelity.py: hwconfigs: no config named 'nope'"),
    (["--fields", "bogus"], "fidelity.py: --fields bogus: not a field ascend910b2 marks \"assumed\""),
])
def test_a_bad_config_or_field(args, expect):
    """Both were a ConfigError's traceback."""
    _fails(args, expect)


@pytest.mark.parametrize("args, expect", [
    (["--folds", "1"], "fidelity.py: --folds: expected 2 or more, got 1"),
    (["--folds", "-3"], "fidelity.py: --folds: expected 2 or more, got -3"),
    (["--fields", ","], "fidelity.py: --fields ,: expected a comma list of field names, got none"),
    (["--fields", "hbm.bw_efficiency,hbm.bw_efficiency"], "'hbm.bw_efficiency' given twice"),
])
def test_folds_and_fields_as_calibrate_checks_them(args, expect):
    """--folds 1 ran the 75-minute calibration to a table with no held-out error (npusim
    calibrate refuses it); --fields ',' asked for a field named ''."""
    _fails(args, expect)


@pytest.mark.parametrize("args, expect", [
    (["--json", "/proc/x/fidelity.json"], "fidelity.py: --json /proc/x/fidelity.json: cannot be written"),
    (["--json", "."], "fidelity.py: --json .: is a directory (expected a file path)"),
    (["--json", "/dev/full"], "fidelity.py: --json /dev/full: cannot be written: No space left on device"),
    (["--json", str(ROOT / "npusim" / "data" / "measured" / "gemm.csv")],
     "gemm.csv: the same file as the input of the measurements' gemm.csv"),
    (["--json", str(ROOT / "hwconfigs" / "ascend910b2.yaml")], "ascend910b2.yaml: the same file as the input of --hw"),
])
def test_json_is_checked_before_the_run(args, expect):
    """A --json that cannot be written failed after the 75 minutes, and one onto a
    measurement table or the config replaced it with the report."""
    _fails(args, expect)
