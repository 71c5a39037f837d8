"""Cross-field checks of a hardware config: values each in range (the records check
that) may still not fit together. Each rule here is one the engine or the lowerings
rely on; a config that breaks one would fail later with a KeyError deep inside, or
give a silently wrong number.
"""

from __future__ import annotations

from npusim.hw.config import HwConfig

# The cube dtype the derived peaks, the rooflines and the ridge points are quoted
# in; other dtypes are checked per program by verify() when a kernel uses them.
REQUIRED_FRACTALS = ("fp16",)

# Every vector op kind a lowering in npusim.ops issues (its cost factor is looked up
# per instruction). tests/test_bad_inputs/test_configs.py lowers every op type with
# only these costs in the config, so the list cannot fall behind the lowerings.
REQUIRED_VECTOR_OPS = (
    "abs", "add", "adds", "cast", "compare", "copy", "div", "dup", "exp", "gather", "max", "maxs", "mrgsort", "mul", "muls",
    "reduce_max", "reduce_sum", "relu", "rsqrt", "select", "sort32", "sub", "tanh",
)

# Buffers the cube core fills from (or drains into) L1: a tile of any of them must
# fit in L1, so none may be larger. L0A/L0B/BT/FB are loaded from L1 by MTE1; L0C is
# drained by FixPipe into L1 (or GM).
_FED_BY_L1 = ("l0a_bytes", "l0b_bytes", "l0c_bytes", "bt_bytes", "fb_bytes")


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def inconsistency(hw: HwConfig) -> tuple[str, str] | None:
    """(key path, what is wrong) for the first rule `hw` breaks, or None."""
    from npusim.isa.program import ALIGN_BYTES, Mem  # here: the isa package imports npusim.hw

    aic, aiv = hw.aic, hw.aiv
    for key in _FED_BY_L1:
        if getattr(aic, key) > aic.l1_bytes:
            return f"aic.{key}", (f"{getattr(aic, key)} is larger than aic.l1_bytes {aic.l1_bytes} "
                                  "(it is filled from L1)")
    sizes = {Mem.L1: ("aic.l1_bytes", aic.l1_bytes), Mem.L0A: ("aic.l0a_bytes", aic.l0a_bytes),
             Mem.L0B: ("aic.l0b_bytes", aic.l0b_bytes), Mem.L0C: ("aic.l0c_bytes", aic.l0c_bytes),
             Mem.BT: ("aic.bt_bytes", aic.bt_bytes), Mem.FB: ("aic.fb_bytes", aic.fb_bytes),
             Mem.UB: ("aiv.ub_bytes", aiv.ub_bytes)}
    for mem, (key, n) in sizes.items():
        if n % ALIGN_BYTES[mem]:
            return key, f"expected a multiple of {mem.name}'s {ALIGN_BYTES[mem]}-byte alignment, got {n}"
    for key, n in (("l2.line_bytes", hw.l2.line_bytes), ("dma.burst_bytes", hw.dma.burst_bytes),
                   ("aiv.vector_repeat_bytes", aiv.vector_repeat_bytes)):
        if not _power_of_two(n):
            return key, f"expected a power of two, got {n}"
    if hw.l2.line_bytes < hw.dma.burst_bytes:
        return "l2.line_bytes", (f"{hw.l2.line_bytes} is smaller than dma.burst_bytes {hw.dma.burst_bytes} "
                                 "(a burst must lie within one line)")
    if hw.l2.l2_bytes < hw.l2.ways * hw.l2.line_bytes:
        return "l2.l2_bytes", (f"{hw.l2.l2_bytes} holds less than one set of l2.ways {hw.l2.ways} x "
                               f"l2.line_bytes {hw.l2.line_bytes} = {hw.l2.ways * hw.l2.line_bytes}")
    for dtype in REQUIRED_FRACTALS:
        if dtype not in aic.mmad_fractals:
            return f"aic.mmad_fractals.{dtype}", "missing (the cube peaks and rooflines are quoted in it)"
    for op in REQUIRED_VECTOR_OPS:
        if op not in aiv.vector_cycles_per_repeat:
            return f"aiv.vector_cycles_per_repeat.{op}", "missing (a lowering issues this vector op)"
    return None
