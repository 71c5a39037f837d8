"""The committed config against public measurements (npusim/data/calibration):
every GEMM point and the HBM copy within 15%. Prints the table (pytest -s)."""

import pytest

from npusim.ops.calibration import evaluate, measurements_path, table

TOLERANCE = 0.15


@pytest.fixture(scope="module")
def points():
    assert measurements_path().is_file(), f"no calibration data at {measurements_path()}"
    return evaluate()


def test_calibration_table(points):
    print("\n" + table(points))
    assert len(points) == 5


@pytest.mark.parametrize("index", range(5))
def test_point_within_tolerance(points, index):
    p = points[index]
    assert abs(p.error) <= TOLERANCE, f"{p.name}: simulated {p.simulated:.3f} vs measured {p.measured:.3f} {p.unit}"
