"""Cross-field checks of a hardware config: values each in range (the records check
that) may still not fit together. Each rule here is one the engine or the lowerings
rely on; a config that breaks one would fail later with a KeyError deep inside, or
give a silently wrong number.
"""

from __future__ import annotations

import attrs

from npusim.hw.config import HwConfig
from npusim.hw.parse import short

# The most lines the L2 model holds (l2.l2_bytes / l2.line_bytes): 43 x the 910B's 393,216.
# It keeps 13 bytes per line in numpy arrays, and 72 bytes per set of scratch in C
# (npusim/engine/l2cache.py, _l2.c): about 190 MB at this bound, up to 1.4 GB with one way.
L2_LINES_MAX = 1 << 24
# Tags are 32-bit (npusim/engine/_l2.c): the L2 names lines below 2^31 x its sets, and
# every GM address a run uses (GM_BASE up to GM_BASE + hbm.hbm_bytes) must be among them.
L2_TAGS = 1 << 31
# The longest one step of a kernel or of the host may take, in cycles: an instruction
# over a whole buffer (a copy at its port, a vector op over all of UB), a host call
# configured in microseconds at the clock. 2^40, 10 min at 1.8 GHz: 8,192 of them in a
# row stay within 2^53, where the engine's int clock is exact (npusim/engine/_pipe.c).
STEP_CYCLES_MAX = 1 << 40

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

# The flag ids per pipe pair the lowerings use: FlashAttention's cube holds its Q, K, V
# and P tiles in ping-pong L1 buffers, each pair on its own MTE2 <-> MTE1 ids
# (npusim/ops/attention/flash_tiling.py: _Q, _K, _V, _P = 0, 2, 4, 6), ids 0 to 7.
REQUIRED_FLAG_IDS = 8

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
    if not hw.name.strip():  # every report would name the config as ''
        return "name", f"expected the config's name, got {short(hw.name)}"
    if hw.sync.flag_ids < REQUIRED_FLAG_IDS:
        return "sync.flag_ids", (f"expected a value >= {REQUIRED_FLAG_IDS} (the lowerings use ids 0 to "
                                 f"{REQUIRED_FLAG_IDS - 1}: FlashAttention's L1 buffer pairs), got {hw.sync.flag_ids}")
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
    bad = _cube_buffer_too_small(hw)
    if bad:
        return bad
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
    lines = hw.l2.l2_bytes // hw.l2.line_bytes
    if lines > L2_LINES_MAX:
        return "l2.l2_bytes", (f"{hw.l2.l2_bytes} is {lines} lines of l2.line_bytes {hw.l2.line_bytes}, more than "
                               f"the {L2_LINES_MAX} (2^24) the L2 model holds")
    bad = _beyond_l2_tags(hw, lines) or _step_too_long(hw)
    if bad:
        return bad
    for dtype in REQUIRED_FRACTALS:
        if dtype not in aic.mmad_fractals:
            return f"aic.mmad_fractals.{dtype}", "missing (the cube peaks and rooflines are quoted in it)"
    from npusim.ops.matmul_tiling import MAX_BASE_M, MAX_BASE_N  # here: the ops package imports npusim.hw

    for dtype, f in aic.mmad_fractals.items():  # the tiling choosers cut tiles of whole fractals up to these
        for dim, n, most in (("m0", f.m0, MAX_BASE_M), ("n0", f.n0, MAX_BASE_N)):
            if n > most:
                return f"aic.mmad_fractals.{dtype}.{dim}", (f"{n} is larger than the {most} the largest tile has "
                                                            "(a tile is whole fractals)")
    bad = _fractal_off_the_grid(aic.mmad_fractals)
    if bad:
        return bad
    for op in REQUIRED_VECTOR_OPS:
        if op not in aiv.vector_cycles_per_repeat:
            return f"aiv.vector_cycles_per_repeat.{op}", "missing (a lowering issues this vector op)"
    return None


# The rows and columns of the cube's data layout: L1, L0A and L0B hold 16 x 16 fractal
# blocks, and the matmul lowerings cut tiles and move L1 -> L0 copies in whole ones
# (npusim/ops/matmul_program.py; balanced_base_m rounds base_m to 16 rows).
LAYOUT_BLOCK = 16


def _fractal_off_the_grid(fractals: dict) -> tuple[str, str] | None:
    """The first fractal dimension the lowerings' tiles cannot be cut in: m0 must divide
    the 16-row blocks tiles are rounded to, n0 be whole 16-column blocks (a tile is whole
    fractals and L0B is filled in 16-column blocks), k0 divide the base_k slice of
    SLICE_BYTES the choosers take (as powers of two: tile sizes are)."""
    from npusim.isa.program import DTYPE_BYTES  # here: the isa package imports npusim.hw
    from npusim.ops.matmul import CUBE_DTYPES  # here: the ops package imports npusim.hw
    from npusim.ops.matmul_tiling import MAX_BASE_N, SLICE_BYTES

    for dtype, f in fractals.items():
        key = f"aic.mmad_fractals.{dtype}"
        if dtype not in CUBE_DTYPES:
            return key, f"unknown dtype (expected one of {', '.join(CUBE_DTYPES)})"
        if not _power_of_two(f.m0) or f.m0 > LAYOUT_BLOCK:
            return f"{key}.m0", (f"expected a power of two <= {LAYOUT_BLOCK} (tiles are cut in {LAYOUT_BLOCK}-row "
                                 f"blocks), got {f.m0}")
        if f.n0 % LAYOUT_BLOCK or not _power_of_two(f.n0 // LAYOUT_BLOCK):
            return f"{key}.n0", (f"expected {LAYOUT_BLOCK} x a power of two up to {MAX_BASE_N} (tiles and L0B "
                                 f"copies are whole {LAYOUT_BLOCK}-column blocks), got {f.n0}")
        most = SLICE_BYTES // DTYPE_BYTES[dtype]
        if not _power_of_two(f.k0) or f.k0 > most:
            return f"{key}.k0", (f"expected a power of two <= {most} (a base_k slice is {SLICE_BYTES} bytes of "
                                 f"{dtype} deep), got {f.k0}")
    return None


def _cube_buffer_too_small(hw: HwConfig) -> tuple[str, str] | None:
    """The first cube buffer smaller than the largest matmul tile the tiling choosers cut
    needs (they pick tiles up to MAX_BASE_M x MAX_BASE_N over base_k slices of SLICE_BYTES
    and L1 chunks of STEP_K slices, all double-buffered, whatever the buffer sizes)."""
    # here: the ops package imports npusim.hw
    from npusim.ops.matmul_tiling import MAX_BASE_M, MAX_BASE_N, SLICE_BYTES, STEP_K

    row = MAX_BASE_N * 4  # an fp32 row of bias (BT) or of per-channel scales (FB)
    chunk = SLICE_BYTES * STEP_K  # bytes of K in an L1 chunk
    need = (("aic.l0a_bytes", 2 * MAX_BASE_M * SLICE_BYTES, f"two {MAX_BASE_M}-row slices of A, {SLICE_BYTES} B deep"),
            ("aic.l0b_bytes", 2 * MAX_BASE_N * SLICE_BYTES,
             f"two {MAX_BASE_N}-column slices of B, {SLICE_BYTES} B deep"),
            ("aic.l0c_bytes", MAX_BASE_M * row, f"a {MAX_BASE_M} x {MAX_BASE_N} tile's fp32 accumulators"),
            ("aic.bt_bytes", row, f"a {MAX_BASE_N}-column tile's fp32 bias"),
            ("aic.fb_bytes", row, f"a {MAX_BASE_N}-column tile's fp32 scales"),
            ("aic.l1_bytes", 2 * (MAX_BASE_M + MAX_BASE_N) * chunk + 2 * row,
             f"two chunks of A and of B, {chunk} B of K each, and the bias and scale rows"))
    for key, least, what in need:
        have = getattr(hw.aic, key.partition(".")[2])
        if have < least:
            return key, (f"expected a value >= {least} (the largest matmul tile the tiling choosers cut needs "
                         f"{what}), got {have}")
    return None


def gm_named_bytes(hw: HwConfig) -> int:
    """The GM addresses the L2 model can name, [0, this): 2^31 tags x its sets x l2.line_bytes
    (verify() keeps every GM access of a kernel inside them)."""
    lines = hw.l2.l2_bytes // hw.l2.line_bytes  # as npusim/engine/memory.py sizes the L2
    sets = max(1, lines // hw.l2.ways)  # as npusim/engine/l2cache.py divides them
    return L2_TAGS * sets * hw.l2.line_bytes


def _beyond_l2_tags(hw: HwConfig, lines: int) -> tuple[str, str] | None:
    """GM (GM_BASE + hbm.hbm_bytes) past the lines the L2's 32-bit tags name."""
    from npusim.ops.registry import GM_BASE  # here: the ops package imports npusim.hw

    sets = max(1, lines // hw.l2.ways)  # as npusim/engine/l2cache.py divides them
    named = gm_named_bytes(hw)
    if GM_BASE + hw.hbm.hbm_bytes > named:
        return "hbm.hbm_bytes", (f"{hw.hbm.hbm_bytes} bytes from GM address {GM_BASE} reach past the {named} the "
                                 f"L2's 32-bit tags name (2^31 x {sets} sets x l2.line_bytes {hw.l2.line_bytes})")
    return None


def _step_too_long(hw: HwConfig) -> tuple[str, str] | None:
    """The first (key, what is wrong) of a step longer than STEP_CYCLES_MAX: a copy of a
    whole buffer at a port, a vector instruction over all of UB, a host cost at the clock."""
    aic, aiv = hw.aic, hw.aiv
    # (rate key, rate, buffer key, buffer bytes): the largest copy each port moves is a buffer's
    ports = (("aic.gm_read_bytes_per_cycle", aic.gm_read_bytes_per_cycle, "aic.l1_bytes", aic.l1_bytes),
             ("aic.gm_write_bytes_per_cycle", aic.gm_write_bytes_per_cycle, "aic.l1_bytes", aic.l1_bytes),
             ("aic.mte1_l0a_bytes_per_cycle", aic.mte1_l0a_bytes_per_cycle, "aic.l0a_bytes", aic.l0a_bytes),
             ("aic.mte1_l0b_bytes_per_cycle", aic.mte1_l0b_bytes_per_cycle, "aic.l0b_bytes", aic.l0b_bytes),
             ("aic.fixpipe_bytes_per_cycle", aic.fixpipe_bytes_per_cycle, "aic.l0c_bytes", aic.l0c_bytes),
             ("aiv.gm_read_bytes_per_cycle", aiv.gm_read_bytes_per_cycle, "aiv.ub_bytes", aiv.ub_bytes),
             ("aiv.gm_write_bytes_per_cycle", aiv.gm_write_bytes_per_cycle, "aiv.ub_bytes", aiv.ub_bytes))
    for key, rate, buffer, nbytes in ports:
        if nbytes / rate > STEP_CYCLES_MAX:
            return key, (f"{short(rate)}: a copy of {buffer} {nbytes} takes {nbytes / rate:.3g} cycles, more than "
                         f"the {STEP_CYCLES_MAX} (2^40) one step may take")
    # the shared links (bytes per second, at the clock): the least any of them moves is one
    # burst (1e-9 B/s of HBM made a k3-tiny step 6.6e24 cycles, reported as 3.6e21 us)
    links = (("hbm.peak_bw_bytes_per_s", hw.hbm.peak_bw_bytes_per_s, hw.hbm.bw_efficiency),
             ("l2.bw_bytes_per_s", hw.l2.bw_bytes_per_s, 1),
             ("runtime.pcie_bw_bytes_per_s", hw.runtime.pcie_bw_bytes_per_s, 1),
             ("topology.link_bw_bytes_per_s", hw.topology.link_bw_bytes_per_s, 1),
             ("topology.nic_bw_bytes_per_s", hw.topology.nic_bw_bytes_per_s, 1))
    for key, rate, efficiency in links:
        cycles = hw.dma.burst_bytes / (rate * efficiency) * hw.chip.freq_hz
        if cycles > STEP_CYCLES_MAX:
            at = f" x hbm.bw_efficiency {efficiency:g}" if efficiency != 1 else ""
            return key, (f"{short(rate)}{at}: a burst of dma.burst_bytes {hw.dma.burst_bytes} takes {cycles:.3g} "
                         f"cycles at chip.freq_hz {hw.chip.freq_hz:g}, more than the {STEP_CYCLES_MAX} (2^40) one "
                         "step may take")
    # a GM copy whose segments (each at least one burst) all start off an L2 line is slowed
    # by up to 1 + dma.off_line_cost_bytes / dma.burst_bytes (Dma.off_line_scale)
    slowest = max((nbytes / rate, key, buffer, nbytes) for key, rate, buffer, nbytes in ports if "gm_" in key)
    slowed = slowest[0] * (1 + hw.dma.off_line_cost_bytes / hw.dma.burst_bytes)
    if slowed > STEP_CYCLES_MAX:
        return "dma.off_line_cost_bytes", (
            f"{short(hw.dma.off_line_cost_bytes)}: a copy of {slowest[2]} {slowest[3]} at {slowest[1]} whose "
            f"bursts of dma.burst_bytes {hw.dma.burst_bytes} each start off an L2 line takes {slowed:.3g} cycles, "
            f"more than the {STEP_CYCLES_MAX} (2^40) one step may take")
    repeats = -(-aiv.ub_bytes // aiv.vector_repeat_bytes)
    op, per = max(aiv.vector_cycles_per_repeat.items(), key=lambda kv: kv[1], default=("", 0))
    if aiv.vector_startup_cycles + repeats * per > STEP_CYCLES_MAX:
        return f"aiv.vector_cycles_per_repeat.{op}", (
            f"{short(per)}: a vector op over aiv.ub_bytes {aiv.ub_bytes} ({repeats} repeats of "
            f"aiv.vector_repeat_bytes {aiv.vector_repeat_bytes}) takes {aiv.vector_startup_cycles + repeats * per:.3g} "
            f"cycles, more than the {STEP_CYCLES_MAX} (2^40) one step may take")
    # host-side costs in microseconds (every *_us field), converted to cycles at chip.freq_hz where used
    for section in ("runtime", "topology"):
        for f in attrs.fields(type(getattr(hw, section))):
            if not f.name.endswith("_us"):
                continue
            key, us = f"{section}.{f.name}", getattr(getattr(hw, section), f.name)
            if us * hw.chip.freq_hz / 1e6 > STEP_CYCLES_MAX:
                return key, (f"{short(us)} us is {us * hw.chip.freq_hz / 1e6:.3g} cycles at chip.freq_hz "
                             f"{hw.chip.freq_hz:g}, more than the {STEP_CYCLES_MAX} (2^40) one step may take")
    return None
