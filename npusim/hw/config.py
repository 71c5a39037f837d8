"""The hardware config: frozen records that nest like the chip.

Every field carries its unit in its name and a help text; the YAML files in
hwconfigs/ give each value a source comment or mark it "assumed". Internal units
are cycles and bytes; the few host-side costs are in microseconds because that is
how they are measured (they are converted to cycles where they are used).
"""

from __future__ import annotations

import math

from attrs import field, frozen

from npusim.hw.parse import short

# The range of every number in a config: finite, and within bounds far outside any
# chip (assumed) so that products and quotients of fields (bytes over a rate, a rate
# over the clock, cycles to microseconds) stay finite floats.
MAX_VALUE = 1e18
MIN_POSITIVE_FLOAT = 1e-9


def _range_error(name: str, value, lo_open: bool) -> str | None:
    """What `value` breaks ('finite', '> 0', ...), worded as attrs' validators do, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"'{name}' must be finite: {value}"
    if lo_open and not value > 0:
        return f"'{name}' must be > 0: {short(value)}"
    if not lo_open and not value >= 0:
        return f"'{name}' must be >= 0: {short(value)}"
    if isinstance(value, float) and 0 < value < MIN_POSITIVE_FLOAT:
        return f"'{name}' must be >= {MIN_POSITIVE_FLOAT:g}: {value}"
    if value > MAX_VALUE:
        return f"'{name}' must be <= {MAX_VALUE:g}: {short(value)}"
    return None


def _positive(instance, attribute, value) -> None:
    bad = _range_error(attribute.name, value, True)
    if bad:
        raise ValueError(bad)


def _non_negative(instance, attribute, value) -> None:
    bad = _range_error(attribute.name, value, False)
    if bad:
        raise ValueError(bad)


def _at_most_one(instance, attribute, value) -> None:
    if not value <= 1:
        raise ValueError(f"'{attribute.name}' must be <= 1: {value}")


def _positive_values(instance, attribute, value: dict) -> None:
    """Every entry of a mapping field must be in range (named in the error like a field)."""
    for key, v in value.items():
        bad = _range_error(f"{attribute.name}.{key}", v, True)
        if bad:
            raise ValueError(bad)


# the most copies a pipe's DMA engine may hold (dma.outstanding; npusim/engine/_pipe.c's QUEUE_MAX)
DMA_QUEUE_MAX = 16
# the most flag ids per pipe pair (sync.flag_ids; npusim/engine/_pipe.c's FLAG_ID_MAX): far
# above any chip's (the 910B has 8), and the engine keeps one entry per id it meets
FLAG_IDS_MAX = 65536
# the largest L2 line and DMA burst (l2.line_bytes, dma.burst_bytes; npusim/engine/_l2.c's
# UNIT_MAX): far above any chip's (the 910B: 512 and 64), and the burst rounding walks up
# to this many segments of a transfer and counts its bytes in 64 bits
UNIT_BYTES_MAX = 1 << 20
# the largest cost a config may give in cycles (a start-up, a latency, cycles per repeat or
# per segment): 2^32, 2.4 s at 1.8 GHz, far above any chip's (the 910B's are below 10^4).
# The engine's clock is an int, exact up to 2^53 (npusim/engine/_pipe.c's EXACT): 2^21
# such costs in a row stay within it. hw/checks.py bounds what products of fields make.
CYCLES_MAX = 1 << 32


def _cycle_values(instance, attribute, value: dict) -> None:
    """Every entry of a mapping of cycle costs at most CYCLES_MAX (named like a field)."""
    for key, v in value.items():
        if not v <= CYCLES_MAX:
            raise ValueError(f"'{attribute.name}.{key}' must be <= {CYCLES_MAX} (2^32): {short(v)}")


# the most cube cores (chip.aic_count): 170 x the 910B's 24; the engine keeps each core's
# pipes and state (a few hundred bytes a core, with its AIVs)
AIC_COUNT_MAX = 4096
# the most vector cores per cube core (chip.aiv_per_aic; the 910B has 2): a MIX kernel's
# cross-core flag is kept at id x AIVs per AIC + source, below FLAG_IDS_MAX x this
# (npusim/engine/_pipe.c's FLAGS_MAX, 2^22)
AIV_PER_AIC_MAX = 64


def _at_most(bound: int, said: str = ""):
    """A validator: the value at most `bound` (a field-level limit the engine relies on;
    `said`: how the message also writes it, e.g. 2^32)."""
    shown = f"{bound} ({said})" if said else f"{bound}"

    def check(instance, attribute, value) -> None:
        if not value <= bound:
            raise ValueError(f"'{attribute.name}' must be <= {shown}: {short(value)}")

    return check


# A cube core's MTE2 converts ND rows to NZ on the way at its full rate only when the rows'
# GM pitch is a whole number of these (Ascend C best practices, "ND2NZ on the AIV cores":
# an inner axis not 256-byte aligned makes the on-the-way conversion use little of the
# bandwidth; CANN's MatMulV3 tiling converts such operands on the vector cores instead:
# npusim.ops.matmul_nd2nz); rows of at most this many bytes move whole
ND2NZ_ALIGN_BYTES = 256
# the smallest L2 line (l2.line_bytes; the 910B's is 512): GM transfers move 32-byte blocks
# (UB and L1 alignment), and a smaller line only multiplies the lines every transfer walks
# (with 1-byte lines, 512 x the 910B's: a collective of a few GiB no longer finishes)
LINE_BYTES_MIN = 32


# the most ways per L2 set (l2.ways; the 910B's is 16): the L2 model scans a set's ways on
# every line a transfer touches (npusim/engine/_l2.c), so a run's time grows with them: a
# k3-tiny decode step took 1 s at 4096 ways, 38 s at 65536, and a prefill did not end in 60 s
L2_WAYS_MAX = 4096


def _line_min(instance, attribute, value) -> None:
    if not value >= LINE_BYTES_MIN:
        raise ValueError(f"'{attribute.name}' must be >= {LINE_BYTES_MIN}: {short(value)}")


def _pos(help: str):
    return field(validator=_positive, metadata={"help": help})


def _nonneg(help: str):
    return field(validator=_non_negative, metadata={"help": help})


def _cyc(help: str):
    """A cost in cycles: >= 0 and at most CYCLES_MAX."""
    return field(validator=[_non_negative, _at_most(CYCLES_MAX, "2^32")], metadata={"help": help})


def _fraction(help: str):
    return field(validator=[_positive, _at_most_one], metadata={"help": help})


@frozen
class Chip:
    freq_hz: float = _pos("core clock; one simulated cycle is 1/freq_hz seconds")
    aic_count: int = field(validator=[_positive, _at_most(AIC_COUNT_MAX)], metadata={"help": (
        f"cube cores (AIC) on the die (at most {AIC_COUNT_MAX})")})
    aiv_per_aic: int = field(validator=[_positive, _at_most(AIV_PER_AIC_MAX)], metadata={"help": (
        f"vector cores (AIV) per cube core; a MIX block takes 1 AIC + this many AIV (at most {AIV_PER_AIC_MAX})")})


@frozen
class Fractal:
    """The cube's base block for one input dtype: one Mmad cycle computes m0 x n0 x k0 MACs."""

    m0: int = _pos("rows of A per fractal")
    n0: int = _pos("columns of B per fractal")
    k0: int = _pos("reduction depth per fractal")


@frozen
class CubeCore:
    """One AIC: pipes MTE2, MTE1, M, FIX, MTE3, S and buffers L1, L0A, L0B, L0C, BT, FB."""

    l1_bytes: int = _pos("L1 buffer")
    l0a_bytes: int = _pos("L0A buffer (left matrix)")
    l0b_bytes: int = _pos("L0B buffer (right matrix)")
    l0c_bytes: int = _pos("L0C buffer (accumulator)")
    bt_bytes: int = _pos("BT buffer (bias table)")
    fb_bytes: int = _pos("FB buffer (fixpipe parameters)")
    mmad_fractals: dict[str, Fractal] = field(metadata={"help": "cube base block per input dtype"})
    mmad_startup_cycles: int = _cyc("fixed cost of one Mmad instruction before its fractals")
    mte1_l0a_bytes_per_cycle: int = _pos("MTE1 rate L1 -> L0A")
    mte1_l0b_bytes_per_cycle: int = _pos("MTE1 rate L1 -> L0B (also used for L1 -> BT)")
    mte1_startup_cycles: int = _cyc("fixed cost of one MTE1 copy")
    fixpipe_bytes_per_cycle: int = _pos("FixPipe rate out of L0C (to L1, and cap of its GM port)")
    fixpipe_startup_cycles: int = _cyc("fixed cost of one FixPipe copy")
    gm_read_bytes_per_cycle: float = _pos("port cap of this core's reads from GM/L2 (MTE2)")
    gm_write_bytes_per_cycle: float = _pos("port cap of this core's writes to GM/L2 (MTE3, FIX)")


@frozen
class VectorCore:
    """One AIV: pipes MTE2, V, MTE3, S and the unified buffer UB."""

    ub_bytes: int = _pos("unified buffer")
    vector_repeat_bytes: int = _pos("bytes one vector repeat processes (128 fp16 lanes)")
    vector_startup_cycles: float = _cyc("fixed cost of one vector instruction (issue, and the wait for its "
                                        "result a dependent one makes); an instruction takes whole cycles")
    vector_cycles_per_repeat: dict[str, float] = field(
        validator=[_positive_values, _cycle_values],
        metadata={"help": "cycles per 256-byte repeat, per op kind (its cost factor)"},
    )
    gm_read_bytes_per_cycle: float = _pos("port cap of this core's reads from GM/L2 (MTE2)")
    gm_write_bytes_per_cycle: float = _pos("port cap of this core's writes UB -> GM (MTE3)")


@frozen
class Sync:
    flag_ids: int = field(validator=[_positive, _at_most(FLAG_IDS_MAX)], metadata={"help": (
        f"event ids per (src pipe, dst pipe) pair for SetFlag/WaitFlag (at most {FLAG_IDS_MAX})")})
    flag_latency_cycles: int = _cyc("from SetFlag on one pipe to the waiting pipe seeing it")
    pipe_barrier_cycles: int = _cyc("cost of PipeBarrier once the pipes have drained")
    sync_all_cycles: int = _cyc("cost of SyncAll once every core has arrived")
    cross_core_flag_latency_cycles: int = _cyc("AIC <-> AIV flag latency in MIX kernels (through GM)")


@frozen
class L2:
    l2_bytes: int = _pos("capacity of the shared memory-side cache")
    line_bytes: int = field(validator=[_positive, _line_min, _at_most(UNIT_BYTES_MAX)], metadata={"help": (
        f"cache line; hits, misses and write-backs are counted per line ({LINE_BYTES_MIN} to {UNIT_BYTES_MAX})")})
    ways: int = field(validator=[_positive, _at_most(L2_WAYS_MAX)], metadata={"help": (
        f"associativity: lines per set (LRU within a set; at most {L2_WAYS_MAX})")})
    bw_bytes_per_s: float = _pos("total bandwidth between L2 and all cores")


@frozen
class Hbm:
    hbm_bytes: int = _pos("device memory capacity")
    peak_bw_bytes_per_s: float = _pos("HBM peak bandwidth, read + write together")
    bw_efficiency: float = _fraction("fraction of the peak that streaming traffic sustains")


@frozen
class Dma:
    burst_bytes: int = field(validator=[_positive, _at_most(UNIT_BYTES_MAX)], metadata={"help": (
        f"GM traffic moves in aligned bursts of this size (the 64-byte rule; at most {UNIT_BYTES_MAX})")})
    startup_cycles: int = _cyc("fixed cost of one GM transfer (MTE2/MTE3/FixPipe to GM)")
    segment_cycles: float = _cyc("DMA engine time per segment of a cube core's strided transfer, overlapped with "
                                 "the data of the segments before it: a transfer takes at least segments x this")
    vector_segment_cycles: float = _cyc("the same for a vector core's strided transfer (a DataCopyPad of rows)")
    outstanding: int = field(validator=[_positive, _at_most(DMA_QUEUE_MAX)], metadata={"help": (
        "GM copies a pipe's DMA engine holds at once: a copy issued right behind another is requested while "
        "that one's data moves, so its start-up overlaps it (1: every copy pays its start-up after the one before)")})
    off_line_cost_bytes: float = field(default=0.0, validator=_non_negative, metadata={"help": (
        "bytes more a segment costs at the core's port when its GM start is not on an L2 line (one more line "
        "request; 0: alignment beyond the burst costs nothing)")})
    nd2nz_unaligned_bytes_per_cycle: float = field(default=0.0, validator=_non_negative, metadata={"help": (
        "a cube core's rate for a GM -> L1 copy of ND rows (converted to NZ on the way) whose GM pitch is not a "
        f"whole number of {ND2NZ_ALIGN_BYTES}-byte blocks (0: such copies run at the port's rate)")})

    def off_line_scale(self, seg_bytes: int, share: float) -> float:
        """The factor a copy's flow is slowed by when `share` of its segments (of
        seg_bytes, moved in whole bursts) start off an L2 line: each such one costs the
        port off_line_cost_bytes more."""
        if not share or not self.off_line_cost_bytes:
            return 1.0
        rounded = -(-seg_bytes // self.burst_bytes) * self.burst_bytes
        return rounded / (rounded + share * self.off_line_cost_bytes)

    def nd2nz_cap(self, segments: int, pitch: int) -> float:
        """The rate (bytes per cycle; 0: none) a cube core's GM -> L1 copy of `segments`
        rows `pitch` bytes apart in GM is held to: ND rows whose pitch is longer than
        ND2NZ_ALIGN_BYTES and not a whole number of them (an NZ operand's blocks are whole
        512-byte fractals: never held).
        # assumption: rows of 384 bytes, which MatMulV3 leaves on the DMA as it does the
        #   whole ones (matmul_nd2nz.ON_THE_WAY_BYTES), are held like any other off the
        #   alignment: no such row is measured"""
        if segments < 2 or pitch <= ND2NZ_ALIGN_BYTES or pitch % ND2NZ_ALIGN_BYTES == 0:
            return 0.0
        return self.nd2nz_unaligned_bytes_per_cycle

    def segment_cycles_of(self, cube: bool) -> float:
        """The DMA time per segment of a cube core's (`cube`) or a vector core's transfer."""
        return self.segment_cycles if cube else self.vector_segment_cycles


@frozen
class Runtime:
    eager_launch_us: float = _nonneg("host time to launch one kernel op by op (eager mode)")
    graph_launch_us: float = _nonneg("host time per kernel when replaying a captured graph")
    kernel_start_aic_cycles: int = _cyc("device-side cost from a cube-only (AIC) kernel reaching the head of its "
                                        "stream to its first block")
    kernel_start_aiv_cycles: int = _cyc("the same for a vector-only (AIV) kernel")
    kernel_start_mix_cycles: int = _cyc("the same for a mixed kernel (AIC and AIVs with cross-core flags)")
    block_start_cycles: int = _cyc("device-side cost to start one block on a free core")
    synchronize_us: float = _nonneg("host cost of one synchronize call, on top of the wait")
    event_us: float = _nonneg("host cost of one event record or stream-wait call")
    pcie_bw_bytes_per_s: float = _pos("host <-> device memcpy bandwidth")
    memcpy_startup_us: float = _nonneg("fixed latency of one host <-> device memcpy")
    kernel_compile_us: float = _nonneg("host time to compile one distinct kernel the first time a shape runs")

    def kernel_start_cycles(self, core_type: str) -> int:
        """The start cost of a kernel of `core_type` ("AIC", "AIV" or "MIX")."""
        return getattr(self, f"kernel_start_{core_type.lower()}_cycles")


# Intra-node topologies a config may name: every card wired to every other (an 8-card
# HCCS module), or each card to its two neighbours only.
TOPOLOGIES = ("full_mesh", "ring")


def _topology_kind(instance, attribute, value) -> None:
    if value not in TOPOLOGIES:
        raise ValueError(f"'{attribute.name}' must be in ({', '.join(TOPOLOGIES)}): {short(value)}")


@frozen
class Topology:
    """How devices are wired: cards per node (server) joined by HCCS links, nodes joined
    by one RoCE NIC per card. Collectives (npusim.ops.collectives) move their bytes
    over these links."""

    node_device_count: int = _pos("NPU cards in one node (server), joined by HCCS")
    node_count: int = _pos("nodes that can be used together; a plan may use up to node_device_count x node_count cards")
    intra_node: str = field(validator=_topology_kind, metadata={
        "help": "intra-node wiring: full_mesh (a direct link to every other card) or ring (links to the two neighbours)"})
    link_bw_bytes_per_s: float = _pos("one HCCS link, one direction")
    link_latency_us: float = _nonneg("start-up of one transfer step on a link (alpha in the cost formulas)")
    nic_bw_bytes_per_s: float = _pos("one card's NIC to other nodes, one direction")
    nic_latency_us: float = _nonneg("start-up of one transfer step between nodes")

    @property
    def links_per_device(self) -> int:
        """HCCS links each card has: one per other card in a full mesh, two in a ring."""
        if self.intra_node == "full_mesh":
            return self.node_device_count - 1
        return min(2, self.node_device_count - 1)

    @property
    def max_devices(self) -> int:
        return self.node_device_count * self.node_count

    def size_text(self) -> str:
        """How many devices it has, by field (for error messages)."""
        return (f"{self.max_devices} (topology.node_device_count {self.node_device_count} x "
                f"topology.node_count {self.node_count})")


@frozen
class HwConfig:
    name: str = field(metadata={"help": "config name, as in hwconfigs/NAME.yaml"})
    chip: Chip
    aic: CubeCore
    aiv: VectorCore
    sync: Sync
    l2: L2
    hbm: Hbm
    dma: Dma
    topology: Topology
    runtime: Runtime

    # ---- derived figures (cycles and bytes, the engine's units) ----

    @property
    def aiv_count(self) -> int:
        return self.chip.aic_count * self.chip.aiv_per_aic

    def cycles(self, seconds: float) -> float:
        return seconds * self.chip.freq_hz

    def us(self, cycles: float) -> float:
        return cycles / self.chip.freq_hz * 1e6

    @property
    def hbm_bytes_per_cycle(self) -> float:
        """Sustained HBM bandwidth in bytes per cycle (peak x efficiency)."""
        return self.hbm.peak_bw_bytes_per_s * self.hbm.bw_efficiency / self.chip.freq_hz

    @property
    def l2_bytes_per_cycle(self) -> float:
        return self.l2.bw_bytes_per_s / self.chip.freq_hz

    @property
    def pcie_bytes_per_cycle(self) -> float:
        return self.runtime.pcie_bw_bytes_per_s / self.chip.freq_hz
