"""Figures derived from a hardware config: peaks, bandwidths and roofline ridge points.

These are what a roofline plot draws and what `npusim hw show` prints; they are
closed-form products of config fields, so the engine never beats them.
"""

from __future__ import annotations

from attrs import field, frozen

from npusim.errors import ConfigError
from npusim.hw.config import HwConfig
from npusim.isa.program import DTYPE_BYTES

# the vector dtypes the vector peak is quoted for
VECTOR_DTYPES = ("fp16", "fp32")


def _help(help: str):
    return field(metadata={"help": help})


def mmad_fractal(hw: HwConfig, dtype: str):
    """The cube's base block (m0, n0, k0) for `dtype` operands. A config need only give
    fp16's (hw.checks); a kernel on another dtype (a bf16 workload, int8 with W8A8)
    asks here, and a config without it is one ConfigError naming the key."""
    try:
        return hw.aic.mmad_fractals[dtype]
    except KeyError:
        raise ConfigError(f"{hw.name}: missing key 'aic.mmad_fractals.{dtype}' (the cube's base block for {dtype} "
                          f"operands, which this step's matmuls have)") from None


def cube_peak_flops_per_s(hw: HwConfig, dtype: str) -> float:
    """Every AIC doing one full Mmad fractal per cycle: aic_count x freq x m0*n0*k0 MACs x 2."""
    f = mmad_fractal(hw, dtype)
    return hw.chip.aic_count * hw.chip.freq_hz * f.m0 * f.n0 * f.k0 * 2


def vector_peak_ops_per_s(hw: HwConfig, elem_bytes: int, op: str = "add") -> float:
    """Every AIV issuing back-to-back repeats of `op`: aiv_count x freq x lanes / cycles per repeat."""
    try:
        cycles = hw.aiv.vector_cycles_per_repeat[op]
    except KeyError:
        raise ConfigError(f"{hw.name}: missing key 'aiv.vector_cycles_per_repeat.{op}'") from None
    lanes = hw.aiv.vector_repeat_bytes / elem_bytes
    return hw.aiv_count * hw.chip.freq_hz * lanes / cycles


@frozen
class Derived:
    cube_peak_flops_per_s: dict[str, float] = _help(
        "cube peak per input dtype (int8: integer ops): aic_count x freq x m0*n0*k0 x 2"
    )
    vector_peak_ops_per_s: dict[str, float] = _help(
        "elementwise add per dtype: aiv_count x freq x repeat_bytes/elem_bytes / cycles per repeat"
    )
    hbm_peak_bw_bytes_per_s: float = _help("HBM peak, read + write")
    hbm_sustained_bw_bytes_per_s: float = _help("HBM peak x bw_efficiency: what streaming traffic gets")
    l2_bw_bytes_per_s: float = _help("L2 bandwidth shared by all cores")
    pcie_bw_bytes_per_s: float = _help("host <-> device memcpy bandwidth")
    cube_hbm_ridge_flops_per_byte: float = _help("fp16 cube peak / HBM sustained: below this a kernel is HBM bound")
    cube_l2_ridge_flops_per_byte: float = _help("fp16 cube peak / L2: below this a kernel is bound even on L2 hits")
    vector_hbm_ridge_ops_per_byte: float = _help("fp16 vector peak / HBM sustained")


def derive(hw: HwConfig) -> Derived:
    cube = {dtype: cube_peak_flops_per_s(hw, dtype) for dtype in hw.aic.mmad_fractals}
    vector = {dtype: vector_peak_ops_per_s(hw, DTYPE_BYTES[dtype]) for dtype in VECTOR_DTYPES}
    hbm_sustained = hw.hbm.peak_bw_bytes_per_s * hw.hbm.bw_efficiency
    cube_fp16 = cube_peak_flops_per_s(hw, "fp16")
    return Derived(
        cube_peak_flops_per_s=cube,
        vector_peak_ops_per_s=vector,
        hbm_peak_bw_bytes_per_s=hw.hbm.peak_bw_bytes_per_s,
        hbm_sustained_bw_bytes_per_s=hbm_sustained,
        l2_bw_bytes_per_s=hw.l2.bw_bytes_per_s,
        pcie_bw_bytes_per_s=hw.runtime.pcie_bw_bytes_per_s,
        cube_hbm_ridge_flops_per_byte=cube_fp16 / hbm_sustained,
        cube_l2_ridge_flops_per_byte=cube_fp16 / hw.l2.bw_bytes_per_s,
        vector_hbm_ridge_ops_per_byte=vector["fp16"] / hbm_sustained,
    )
