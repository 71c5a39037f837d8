"""The copy op the HBM calibration point is compared with."""

import pytest

from npusim.hw import load_hw
from npusim.ops import lower, simulate_op

HW = load_hw("ascend910b2")


@pytest.mark.parametrize("n", [1, 100, 4096, 1 << 20, 3 * (1 << 20) + 7])
def test_copy_verifies_and_never_beats_its_roofline(n):
    r = simulate_op(lower("copy", dict(n=n), HW), HW, trace="kernel")
    assert r.seconds >= r.roofline.time_s
    assert r.stats.gm_read_bytes >= 2 * n and r.stats.gm_write_bytes >= 2 * n


def test_large_copy_is_memory_bound():
    r = simulate_op(lower("copy", dict(n=32 << 20), HW), HW, trace="kernel")
    assert r.bound == "HBM"
