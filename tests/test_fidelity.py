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
# met by 1 x 4096 x 14336 (4% fast) and 1 x 8192 x 4096 (9% slow); 1 x 3584 x 4608
# streams 11% slower: the bodies run at the sustained HBM rate, and the smaller the
# weight, the more the cube kernel's start (7.5 us) weighs. README, "Where npusim is
# still off".
GEMV_RATE_TOLERANCE = 0.11


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


def test_the_dma_queue_brings_the_gemvs_nearer_and_the_large_gemms_stay_near():
    """dma.outstanding 4 (back-to-back copies pay their start-up once) against 1 (each
    copy waits for the start-up of the one before), the rest as shipped: each decode GEMV
    runs faster, and the GEMMs with M >= 2048 stay near it, held there by the
    cube's Mmad start-up fitted beside the queue (the serial start-ups used to stand in
    for it). docs/fidelity.md states these figures (this test prints them)."""
    from pathlib import Path

    serial = load_hw("ascend910b2", overrides={"dma.outstanding": 1})
    queued, alone = _errors(_gemvs(), HW), _errors(_gemvs(), serial)
    large = [r for r in read_csv(DATA / "gemm.csv") + read_csv(DATA / "quant_matmul.csv")
             if r.op_type.startswith("MatMul") and dict(map_row(r).params)["m"] >= 2048]
    gemm = [abs(e) for e in _errors(large, HW)]
    assert len(queued) == 3 and len(large) >= 6 and all(q < a for q, a in zip(queued, alone))  # each runs faster
    queued, alone = [abs(e) for e in queued], [abs(e) for e in alone]
    said = (f"the three decode GEMVs land within {min(queued):.0%}-{max(queued):.0%} of silicon "
            f"({min(alone):.0%}-{max(alone):.0%} without the queue), and the {len(large)} GEMMs with "
            f"M >= 2048 within {max(gemm):.0%}")
    page = " ".join((Path(__file__).parents[1] / "docs" / "fidelity.md").read_text().split())
    assert said in page, said
    from npusim.hw.derived import cube_peak_flops_per_s

    (square,) = [r for r in large if r.input_shapes[0] == (4096, 4096) and dict(map_row(r).params)["dtype"] == "fp16"]
    flops, peak = 2 * 4096**3, cube_peak_flops_per_s(HW, "fp16") / 1e6
    shares = (flops / square.duration_us / peak, flops / op_time_us(map_row(square).key, HW) / peak)
    said = f"4096^3 reaches {shares[0]:.0%} of the cube's peak on silicon, {shares[1]:.0%} in npusim"
    assert said in page, said


def test_the_w8a16_rows_are_off_as_docs_fidelity_says():
    """WeightQuantBatchMatmulV2: the rows CANN's multi-scale template takes (M <= 64, K and N
    multiples of 32) are lowered as it runs them (past K = 13696 or N = 32000 as its split-K
    kernel), the others as its Custom template (the AIVs antiquantise the weight into a
    workspace first); docs/fidelity.md states how many rows each template takes, their
    errors and what the deepest K's HBM traffic is, from these figures (this test prints them)."""
    from pathlib import Path

    from npusim.ops.matmul_msd import msd_applies
    from npusim.ops.matmul_msd_splitk import msd_splitk_applies
    from npusim.ops.registry import lower, spec
    from npusim.ops.roofline import simulate_op

    rows = [r for r in read_csv(DATA / "weight_quant_matmul.csv") if r.op_type == "WeightQuantBatchMatmulV2"]
    params = [dict(map_row(r).key[1]) for r in rows]
    msd = [msd_applies(spec("matmul").params(**q)) for q in params]
    split = [msd_splitk_applies(spec("matmul").params(**q)) for q in params]
    errors = _errors(rows, HW)
    inside = sorted(abs(e) for e, x in zip(errors, msd) if x)
    outside = sorted(e for e, x in zip(errors, msd) if not x)
    deep = [(q, e) for q, e, x in zip(params, errors, split) if x]
    q = max(deep, key=lambda d: d[0]["k"])[0]
    stats = simulate_op(lower("matmul", q, HW), HW, trace="kernel", counters=False).stats
    traffic = stats.hbm_read_bytes / (q["k"] * q["n"])  # HBM read over the int8 weight's bytes
    hit = stats.l2_hit_bytes / (stats.l2_hit_bytes + stats.l2_miss_bytes)
    said = (f"({len(inside)} of the {len(rows)} rows)",
            f"median error {inside[len(inside) // 2]:.0%}, max {inside[-1]:.0%}",
            "they come out " + " and ".join(f"{abs(e):.0%} {'slow' if e > 0 else 'fast'}" for e in outside),
            *(f"{d['m']} x {d['k']} x {d['n']} is {abs(e):.0%} {'slow' if e > 0 else 'fast'}" for d, e in deep),
            f"HBM traffic {traffic:.1f}x the weight, L2 hit rate {hit:.0%}")
    page = " ".join((Path(__file__).parents[1] / "docs" / "fidelity.md").read_text().split())
    for s in said:
        print(s)
    for s in said:
        assert s in page, s


def test_softmax_over_a_middle_dim_is_off_as_docs_fidelity_says():
    """The SoftmaxV2 rows along a middle dim map to a softmax along that dim (not the last)
    and come out as fast as docs/fidelity.md says (this test prints the figures)."""
    from pathlib import Path

    rows = [r for r in read_csv(DATA / "vector.csv") if r.op_type == "SoftmaxV2"
            and dict(map_row(r).key[1])["dim"] != -1 and len(r.input_shapes[0]) > 2]
    assert len(rows) == 3
    fast = sorted(-e for e in _errors(rows, HW))
    said = f"({len(rows)} rows)", f"come out {fast[0]:.0%} to {fast[-1]:.0%} fast"
    page = " ".join((Path(__file__).parents[1] / "docs" / "fidelity.md").read_text().split())
    print(said)
    for s in said:
        assert s in page, s


def test_a_causal_prefill_costs_silicon_more_per_score_as_docs_fidelity_says():
    """docs/fidelity.md's figures for the causal against the non-causal prefill rows of
    FusedInferAttentionScore, from the measured rows: each 128-row query block computes
    the keys up to its diagonal (CANN's prompt kernel), a non-causal one all of them."""
    from pathlib import Path

    def row(q: tuple, kv: tuple, dtype: str):
        (r,) = [r for r in read_csv(DATA / "attention.csv") if r.op_type == "FusedInferAttentionScore"
                and r.input_shapes[:2] == (q, kv) and r.input_dtypes[0] == dtype]
        return r

    causal = row((4, 1024, 32, 128), (4, 1024, 32, 128), "FLOAT16")
    full = row((4, 512, 64, 128), (4, 512, 8, 128), "BF16")
    b, s, n, _ = causal.input_shapes[0]
    causal_scores = b * n * sum(128 * 128 * (i + 1) for i in range(s // 128))
    b, s, n, _ = full.input_shapes[0]
    full_scores = b * n * s * s
    ratio = (causal.duration_us / causal_scores) / (full.duration_us / full_scores)
    causal_rows = [r for r in read_csv(DATA / "attention.csv")
                   if r.op_type == "FusedInferAttentionScore" and "sparse_mode 3" in r.note]
    errors = sorted(_errors(causal_rows, HW))
    page = " ".join((Path(__file__).parents[1] / "docs" / "fidelity.md").read_text().split())
    said = (f"about {ratio:.1f}x more per score", f"{causal.duration_us:.1f} us for its ~{causal_scores / 1e6:.0f}M "
            f"scores", f"{full.duration_us:.1f} us for {full_scores / 1e6:.0f}M",
            f"the {len(causal_rows)} causal rows land between {-errors[0]:.0%} fast and {errors[-1]:.0%} slow")
    print(said)
    for text in said:
        assert text in page, text


def test_rows_converted_on_the_way_off_the_alignment_are_off_as_docs_fidelity_says():
    """The rows a cube core's DMA converts to NZ on the way with a GM pitch off 256-byte blocks
    (hw.config.Dma.nd2nz_cap): GroupedMatmul's unaligned K and N, QuantBatchMatmulV3's B of
    1025-byte rows, the eager fp32 matmuls of 767 and 769; docs/fidelity.md states their
    errors as shipped and with the rate not modelled (this test prints them)."""
    from pathlib import Path

    before = load_hw("ascend910b2", overrides={"dma.nd2nz_unaligned_bytes_per_cycle": 0})

    def rows(csv: str, op: str, shape) -> list:
        found = [r for r in read_csv(DATA / csv) if r.op_type == op and shape(r.input_shapes)]
        assert found, (csv, op)
        return found

    def moved(found, word: str = "from {b} to {a}") -> str:
        (row,) = found
        b, a = _errors([row], before)[0], _errors([row], HW)[0]
        assert a != b  # the rule applies to this row
        return word.format(b=f"{abs(b):.0%}" + ("" if (b > 0) == (a > 0) else " fast" if b < 0 else " slow"),
                           a=f"{abs(a):.0%} {'slow' if a > 0 else 'fast'}")

    gmm_1023 = rows("grouped_matmul.csv", "GroupedMatmul", lambda s: s[0] == (2047, 1023))
    gmm_1040 = rows("grouped_matmul.csv", "GroupedMatmul", lambda s: s[0] == (512, 1040))
    qbmm_1025 = rows("quant_matmul.csv", "QuantBatchMatmulV3", lambda s: s[1] == (4096, 1025))
    eager = [rows("gemm.csv", "MatMul", lambda s, n=n: s[0] == (n, n) and s[1] == (n, n)) for n in (767, 769)]
    errs = [(_errors(e, before)[0], _errors(e, HW)[0]) for e in eager]
    said = (f"K = 1023, N = 2047 {moved(gmm_1023)}, K = 1040 {moved(gmm_1040)}",
            f"N = 1025 (B's rows of 1025 int8) {moved(qbmm_1025)}",
            "767^3 and 769^3 from " + " and ".join(f"{abs(b):.0%}" for b, _ in errs) + " fast to "
            + " and ".join(f"{abs(a):.0%} {'slow' if a > 0 else 'fast'}" for _, a in errs))
    page = " ".join((Path(__file__).parents[1] / "docs" / "fidelity.md").read_text().split())
    print(said)
    for s in said:
        assert s in page, s
