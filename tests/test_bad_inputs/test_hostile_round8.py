"""Bad-input catalogue, round 8's hostile sweep. Each case is one line naming the flag,
file or key and what was expected; nothing runs and nothing is written."""

from __future__ import annotations

import pytest

from cli_check import fails_cleanly

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
