"""Compare simulated operators with the public measurements in
npusim/data/calibration/ascend910b.yaml (GEMM points and an HBM copy).

Only config fields marked "assumed" may be tuned to bring these closer; the table
this module prints is the evidence (benchmarks/calibrate.py searches, the
calibration test checks the committed config).
"""

from __future__ import annotations

import os
from pathlib import Path

from attrs import frozen

from npusim.errors import ConfigError
from npusim.hw import load_hw
from npusim.hw.load import read_yaml
from npusim.ops.registry import lower
from npusim.ops.roofline import simulate_op


def measurements_path() -> Path:
    """The calibration file: $NPUSIM_CALIBRATION, or the one shipped with npusim."""
    env = os.environ.get("NPUSIM_CALIBRATION")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / "data" / "calibration" / "ascend910b.yaml"


@frozen
class Point:
    name: str
    measured: float
    simulated: float
    unit: str

    @property
    def error(self) -> float:
        return self.simulated / self.measured - 1


def gemm_hw_name(data: dict) -> str:
    """The points' hw line says "use ascend910b1 with its 24 cores"."""
    return "ascend910b1"


def evaluate(overrides: dict | None = None, sizes: tuple[int, ...] | None = None,
             path: Path | None = None) -> list[Point]:
    """Simulate every calibration point (GEMMs whose m is in `sizes`, all if None)."""
    data = read_yaml(path or measurements_path())
    points = []
    gemm = data.get("gemm_fp16_in_fp32_out")
    if gemm is None:
        raise ConfigError(f"{path or measurements_path()}: missing key 'gemm_fp16_in_fp32_out'")
    hw = load_hw(gemm_hw_name(gemm), overrides)
    for p in gemm["points"]:
        if sizes and p["m"] not in sizes:
            continue
        low = lower("matmul", dict(m=p["m"], n=p["n"], k=p["k"], dtype="fp16", out_dtype="fp32"), hw)
        rep = simulate_op(low, hw, trace="kernel")
        points.append(Point(f"gemm {p['m']}x{p['n']}x{p['k']}", p["time_us"], rep.us, "us"))
    copy = data["hbm_copy"]
    hw = load_hw(copy["hw"], overrides)
    nbytes = copy["bytes_copied"]
    rep = simulate_op(lower("copy", dict(n=nbytes // 2, dtype="fp16"), hw), hw, trace="kernel")
    points.append(Point("hbm copy 256 MiB (read+write)", copy["measured_bw_bytes_per_s_read_plus_write"] / 1e12,
                        2 * nbytes / rep.seconds / 1e12, "TB/s"))
    return points


def table(points: list[Point]) -> str:
    lines = [f"{'point':34s} {'measured':>10s} {'simulated':>10s} {'error':>8s}"]
    for p in points:
        lines.append(f"{p.name:34s} {p.measured:8.1f} {p.unit:<2s}"[:47].ljust(47)
                     + f" {p.simulated:8.1f}   {100 * p.error:+6.1f}%" if p.unit == "us" else
                     f"{p.name:34s} {p.measured:7.3f} {p.unit} {p.simulated:7.3f} {p.unit} {100 * p.error:+6.1f}%")
    return "\n".join(lines)
