"""The public 910B measurements shipped with npusim (npusim/data/measured): every row is
simulated (none is left unmapped), and what the shipped config predicts for the decode
GEMVs. The per-family table is benchmarks/fidelity.py's (the README's shipped columns:
tests/test_readme.py)."""

from __future__ import annotations

import pytest

from npusim.calibrate.fidelity import DATA, FAMILIES, measured_files
from npusim.calibrate.model import Model, op_time_us
from npusim.calibrate.opmap import map_row
from npusim.calibrate.profile import read_csv
from npusim.calibrate.session import map_rows, read_measurements
from npusim.hw import load_hw

HW = load_hw("ascend910b2")


@pytest.fixture(scope="module")
def measured():
    """(rows read, rows mapped, rows not) of every shipped measurement, each simulated once."""
    rows, _ = read_measurements(measured_files(), ())
    return (rows, *map_rows(rows, Model(HW, ())))


def test_every_measured_row_maps_to_a_simulated_op(measured):
    rows, mapped, unmapped = measured
    assert unmapped == [] and len(mapped) == len(rows) >= 250
    assert (DATA / "README.md").is_file() and (DATA / "facts.md").is_file()  # the sources ship with the data


def _gemvs():
    return [r for r in read_csv(DATA / "gemm.csv") if r.method == "K-msprof-op" and r.input_shapes[0][0] == 1]


# how far a decode GEMV's weight rate is from silicon's today: the target is 10%,
# met by the largest (1 x 4096 x 14336, 2%); the two smaller ones stream 20-26% slower,
# as the cube kernel's start (8.4 us, fitted on small GEMMs) and the lockstep start-ups
# of the cores (identical blocks start together and stay together in the engine) are a
# larger share of them. README, "Where npusim is still off".
GEMV_RATE_TOLERANCE = 0.25


@pytest.mark.parametrize("row", _gemvs(), ids=lambda r: r.op_name)
def test_a_decode_gemv_streams_its_weights_near_silicons_rate(row):
    """M = 1: the kernel streams the weights once; its rate (weight bytes over the op time,
    kernel start included as msprof's duration has it) against silicon's. Before this
    calibration it was 26-45% off: HBM's sustained rate was fitted to a copy whose writes
    the L2 absorbed (0.66 of peak; the copy timed as its loop measures it, write-backs and
    all, and the GEMVs put it at 0.79), a GEMV split K and paid a second kernel to zero its
    output, and each transfer's DMA segments were start-ups the data waited for."""
    (k, n) = row.input_shapes[1]
    weight_bytes = k * n * 2
    simulated = op_time_us(map_row(row).key, HW)
    measured_rate, rate = weight_bytes / row.duration_us, weight_bytes / simulated
    assert rate == pytest.approx(measured_rate, rel=GEMV_RATE_TOLERANCE), (row.op_name, rate / 1e6,
                                                                           measured_rate / 1e6)


def test_the_families_cover_every_row(measured):
    from npusim.calibrate.fidelity import families

    assert set(families(measured[1])) == set(FAMILIES)


def _errors(rows, hw) -> list[float]:
    """simulated / measured - 1 of each row on `hw`."""
    return [op_time_us(map_row(r).key, hw) / r.duration_us - 1 for r in rows]


def test_a_dma_queue_brings_the_gemvs_near_silicon_and_leaves_large_gemms_fast():
    """With dma.outstanding 4 (back-to-back copies pay their start-up once) the decode
    GEMVs come near silicon's rate, but the large GEMMs come out fast: the serial
    start-ups stand in for cube-side losses npusim does not model, which is why the
    shipped config keeps 1. docs/fidelity.md states these figures (this test prints them)."""
    from pathlib import Path

    queued = load_hw("ascend910b2", overrides={"dma.outstanding": 4})
    gemv = [abs(e) for e in _errors(_gemvs(), queued)]
    large = [r for r in read_csv(DATA / "gemm.csv") + read_csv(DATA / "quant_matmul.csv")
             if r.op_type.startswith("MatMul") and dict(map_row(r).params)["m"] >= 2048]
    gemm = _errors(large, queued)
    assert len(gemv) == 3 and len(large) >= 6 and all(e < 0 for e in gemm)
    said = (f"With `--set dma.outstanding=4` the three decode GEMVs land within {min(gemv):.0%}-{max(gemv):.0%} "
            f"of silicon, but the {len(large)} GEMMs with M >= 2048 come out {-max(gemm):.0%}-{-min(gemm):.0%} fast")
    readme = " ".join((Path(__file__).parents[1] / "docs" / "fidelity.md").read_text().split())
    assert said in readme, said
    from npusim.hw.derived import cube_peak_flops_per_s

    (square,) = [r for r in large if r.input_shapes[0] == (4096, 4096) and dict(map_row(r).params)["dtype"] == "fp16"]
    flops, peak = 2 * 4096**3, cube_peak_flops_per_s(queued, "fp16") / 1e6
    shares = (flops / square.duration_us / peak, flops / op_time_us(map_row(square).key, queued) / peak)
    said = f"large GEMMs reach about {shares[0]:.0%} of the cube's peak, npusim's {shares[1]:.0%} with the queue"
    assert said in readme, said
