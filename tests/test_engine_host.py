"""Host and streams (launch cost, synchronize, overlap on two streams, graph mode,
waves), determinism, and block grouping (Device(dedup=True)) against one process
per block (dedup=False)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from kernels import (
    GM,
    GM_A,
    GM_B,
    MTE2,
    UB,
    M,
    aic_kernel,
    aiv_kernel,
    ceil_div,
    mix_kernel,
    pipeline_kernel,
    read_kernel,
    run_on_device,
    vec_kernel,
)
from npusim.engine import HostWork, Launch, Memcpy, RecordEvent, Synchronize, WaitEvent, run
from npusim.errors import ProgramError
from npusim.hw import load_hw
from npusim.isa import Copy, CrossSetFlag, CrossWaitFlag, Mem, Mmad, VecOp, addr

# A small chip (4 AIC, 8 AIV) keeps the tests fast; round host costs.
SMALL = {"chip.aic_count": 4, "runtime.eager_launch_us": 10.0, "runtime.graph_launch_us": 1.0,
         "runtime.synchronize_us": 5.0, "runtime.event_us": 2.0}
HW = load_hw("ascend910b2", overrides=SMALL)


def host_cycles(hw, us: float) -> float:
    """us x freq in exact arithmetic (a float product can overshoot); host time is not
    rounded to whole cycles."""
    return float(Fraction(str(us)) * Fraction(hw.chip.freq_hz) / 10**6)


def vec_body_cycles(hw, op: str, n: int, count: int) -> int:
    repeats = ceil_div(n * 2, hw.aiv.vector_repeat_bytes)
    return count * math.ceil(hw.aiv.vector_startup_cycles + repeats * hw.aiv.vector_cycles_per_repeat[op])


def compute_kernel(hw, name: str, block_dim: int = 2, count: int = 100):
    """A kernel of pure vector work: its time is closed-form (block start + its ops); by
    default longer than an eager launch, so it still runs when the next one arrives."""
    n = 16384
    return (vec_kernel(hw, "exp", n, count, block_dim, name),
            hw.runtime.block_start_cycles + vec_body_cycles(hw, "exp", n, count))


# ------------------------------------------------------------------ host and streams


def test_one_stream_with_a_sync_after_each_launch_is_the_sum():
    hw = HW
    k1, c = compute_kernel(hw, "k1")
    k2, _ = compute_kernel(hw, "k2")
    L, S, K = host_cycles(hw, hw.runtime.eager_launch_us), host_cycles(hw, hw.runtime.synchronize_us), \
        hw.runtime.kernel_start_aiv_cycles
    assert K + c > S  # the host really waits
    r = run([Launch(k1, 0), Synchronize(), Launch(k2, 0), Synchronize()], hw)
    assert [k.cycles for k in r.kernels] == [c, c]
    # the synchronize call's own cost overlaps the device work it waits for
    assert r.cycles == 2 * (L + max(S, K + c))
    assert r.host_launch_cycles == 2 * L
    assert r.host_wait_cycles == 2 * (K + c - S)
    a, b = r.kernels
    assert b.start >= a.end + L  # the device idles while the host launches the next one


def test_two_streams_without_syncs_overlap():
    hw = HW
    k1, c = compute_kernel(hw, "k1")
    k2, _ = compute_kernel(hw, "k2")
    assert 2 * k1.block_dim <= hw.aiv_count  # they fit on the cores together
    L, S, K = host_cycles(hw, hw.runtime.eager_launch_us), host_cycles(hw, hw.runtime.synchronize_us), \
        hw.runtime.kernel_start_aiv_cycles
    serial = run([Launch(k1, 0), Synchronize(), Launch(k2, 0), Synchronize()], hw)
    r = run([Launch(k1, 0), Launch(k2, 1), Synchronize()], hw)
    a, b = sorted(r.kernels, key=lambda k: k.stream)
    assert b.start < a.end  # overlap
    assert (a.cycles, b.cycles) == (c, c)  # no shared resource: neither slows down
    assert r.cycles == 2 * L + K + c
    assert r.cycles < serial.cycles
    assert r.host_launch_cycles == 2 * L
    assert r.host_wait_cycles == r.cycles - 2 * L - S


def test_two_streams_that_do_not_fit_together_run_one_after_the_other():
    hw = HW
    k1, c = compute_kernel(hw, "k1", block_dim=hw.aiv_count)
    k2, _ = compute_kernel(hw, "k2", block_dim=hw.aiv_count)
    L, K = host_cycles(hw, hw.runtime.eager_launch_us), hw.runtime.kernel_start_aiv_cycles
    assert c > L  # k2 reaches the device while k1 still holds every core
    r = run([Launch(k1, 0), Launch(k2, 1), Synchronize()], hw)
    a, b = sorted(r.kernels, key=lambda k: k.stream)
    assert b.end == a.end + c
    assert r.cycles == L + K + 2 * c


def test_graph_mode_lowers_host_launch_time():
    hw = HW
    k1, c = compute_kernel(hw, "k1")
    k2, _ = compute_kernel(hw, "k2")
    G, K = host_cycles(hw, hw.runtime.graph_launch_us), hw.runtime.kernel_start_aiv_cycles
    eager = run([Launch(k1, 0), Launch(k2, 1), Synchronize()], hw)
    graph = run([Launch(k1, 0, "graph"), Launch(k2, 1, "graph"), Synchronize()], hw)
    assert graph.host_launch_cycles == 2 * G < eager.host_launch_cycles
    assert graph.cycles == 2 * G + K + c < eager.cycles


def test_host_costs_follow_the_runtime_config():
    hw = load_hw("ascend910b2", overrides={**SMALL, "runtime.eager_launch_us": 7.5, "runtime.synchronize_us": 0.5,
                                           "runtime.kernel_start_aiv_cycles": 0})
    k, c = compute_kernel(hw, "k", count=1)
    L, S = host_cycles(hw, 7.5), host_cycles(hw, 0.5)
    r = run([Launch(k, 0), Launch(k, 0), Launch(k, 0), Synchronize()], hw)
    assert r.host_launch_cycles == 3 * L
    assert r.cycles == 3 * L + max(S, c)


def test_event_orders_a_kernel_after_another_stream():
    hw = HW
    k1, c = compute_kernel(hw, "k1", count=80)
    k2, _ = compute_kernel(hw, "k2", count=80)
    L, E, K = host_cycles(hw, hw.runtime.eager_launch_us), host_cycles(hw, hw.runtime.event_us), \
        hw.runtime.kernel_start_aiv_cycles
    r = run([Launch(k1, 0), RecordEvent("e", 0), WaitEvent("e", 1), Launch(k2, 1), Synchronize()], hw)
    a, b = sorted(r.kernels, key=lambda k: k.stream)
    assert a.end == L + K + c
    assert 2 * L + 2 * E < a.end  # k2 reached stream 1 before the record: the wait is what holds it
    assert b.start == a.end + K
    assert r.cycles == b.end == L + 2 * K + 2 * c


def test_kernel_start_follows_the_kernels_kind():
    """Each kind of kernel (cube only, vector only, mixed) pays its own start: the time
    from reaching the stream's head to the first block."""
    hw = load_hw("ascend910b2", overrides={**SMALL, "runtime.kernel_start_aic_cycles": 700,
                                           "runtime.kernel_start_aiv_cycles": 300,
                                           "runtime.kernel_start_mix_cycles": 1100})
    kernels = {700: aic_kernel(hw, [Mmad(64, 64, 64)]), 300: vec_kernel(hw, "add", 128),
               1100: mix_kernel(hw, [Mmad(64, 64, 64)], [VecOp("add", 128, dst=0, srcs=(0,))])}
    for start, k in kernels.items():
        (rec,) = run([Launch(k, 0, "graph"), Synchronize()], hw).kernels
        assert rec.start - rec.queued == start, k.core_type


def test_memcpy_over_pcie():
    hw = HW
    nbytes = 4 << 20
    E, M0, S = (host_cycles(hw, hw.runtime.event_us), host_cycles(hw, hw.runtime.memcpy_startup_us),
                host_cycles(hw, hw.runtime.synchronize_us))
    r = run([Memcpy(nbytes, "h2d", 0), Synchronize()], hw)
    assert r.cycles == E + max(S, M0 + ceil_div(nbytes, hw.pcie_bytes_per_cycle))
    # the two directions are separate links: an H2D and a D2H on two streams overlap fully
    both = run([Memcpy(nbytes, "h2d", 0), Memcpy(nbytes, "d2h", 1), Synchronize()], hw)
    assert both.cycles == 2 * E + M0 + ceil_div(nbytes, hw.pcie_bytes_per_cycle)


def test_host_work_delays_the_next_launch():
    hw = HW
    k, c = compute_kernel(hw, "k", count=1)
    L, K, S = host_cycles(hw, hw.runtime.eager_launch_us), hw.runtime.kernel_start_aiv_cycles, \
        host_cycles(hw, hw.runtime.synchronize_us)
    H = host_cycles(hw, 20.0)
    r = run([HostWork(20.0), Launch(k, 0), Synchronize()], hw)
    assert r.kernels[0].start == H + L + K
    assert r.cycles == H + L + max(S, K + c)


@pytest.mark.parametrize("dedup", [True, False])
def test_block_dim_twice_the_cores_runs_in_two_waves(dedup):
    hw = HW
    one, c = compute_kernel(hw, "one", block_dim=hw.aiv_count, count=4)
    two, _ = compute_kernel(hw, "two", block_dim=2 * hw.aiv_count, count=4)
    r1 = run_on_device([Launch(one), Synchronize()], hw, dedup=dedup)
    r2 = run_on_device([Launch(two), Synchronize()], hw, dedup=dedup)
    assert r1.kernels[0].cycles == c
    assert r2.kernels[0].cycles == 2 * c
    spans = r2.trace.block_spans
    assert len(spans) == 2 * hw.aiv_count
    assert sorted({s[3] for s in spans}) == [r2.kernels[0].start + hw.runtime.block_start_cycles,
                                            r2.kernels[0].start + c + hw.runtime.block_start_cycles]


# ------------------------------------------------------------------ determinism


def busy_program(hw):
    """Two streams, events, shared HBM, L2 reuse and a MIX kernel: plenty of interleaving."""
    reader = read_kernel(hw, GM_A, 16384, block_dim=6, block_step=16384, repeat=3, name="reader")
    piped = pipeline_kernel(hw, 8192, 6, True)
    mm = mix_kernel(hw, [Mmad(64, 64, 64), CrossSetFlag(M, 0)],
                    [CrossWaitFlag(MTE2, 0), Copy(Mem.GM, Mem.UB, addr(GM_B, block=4096), 0, 4096)],
                    block_dim=2, name="mix")
    return [Launch(reader, 0), RecordEvent("r", 0), Launch(piped, 1), WaitEvent("r", 1), Launch(mm, 1),
            Launch(reader, 0, "graph"), Synchronize(1), Launch(piped, 0), Synchronize()]


def test_same_program_twice_gives_identical_results():
    hw = HW
    a = run(busy_program(hw), hw)
    b = run(busy_program(hw), hw)
    assert a.cycles == b.cycles
    assert a.kernels == b.kernels
    assert a.trace.intervals == b.trace.intervals
    assert a.trace.counters == b.trace.counters
    assert a.trace.host_spans == b.trace.host_spans
    assert a == b
    assert len(a.kernels) == 5 and a.trace.intervals


# ------------------------------------------------------------------ grouping (dedup)


def same_results(calls, hw, expect_groups: bool | None):
    """Run with and without grouping. expect_groups: whether the engine should group
    blocks here (checked unless None, so that a same-results test cannot pass only
    because nothing was grouped)."""
    sizes: list[int] = []
    grouped = run_on_device(calls, hw, dedup=True, group_sizes=sizes)
    single = run_on_device(calls, hw, dedup=False)
    assert sizes and expect_groups in (None, max(sizes) > 1)
    return grouped, single


def assert_same(grouped, single):
    assert [k.cycles for k in grouped.kernels] == [k.cycles for k in single.kernels]
    assert [k.stats for k in grouped.kernels] == [k.stats for k in single.kernels]
    assert grouped.cycles == single.cycles
    assert sorted(grouped.trace.intervals) == sorted(single.trace.intervals)


HBM_BOUND = {**SMALL, "hbm.peak_bw_bytes_per_s": 300 * 1.8e9, "hbm.bw_efficiency": 1.0}


@pytest.mark.parametrize("case", ["streaming", "waves", "pipeline", "mix", "misaligned base"])
def test_grouping_gives_the_same_stats_and_cycles(case):
    hw = load_hw("ascend910b2", overrides=HBM_BOUND)
    if case == "streaming":  # every block its own region, HBM-limited
        k = read_kernel(hw, GM_A, 32768, block_dim=hw.aiv_count, block_step=32768, repeat=2)
    elif case == "waves":
        k = read_kernel(hw, GM_A, 8192, block_dim=3 * hw.aiv_count, block_step=8192)
    elif case == "pipeline":  # every block its own tiles, in and out
        tile, iters = 8192, 4
        k = pipeline_kernel(hw, tile, iters, True, block_dim=5, block_step=iters * tile)
    elif case == "mix":
        k = mix_kernel(hw, [Mmad(64, 64, 64), Copy(Mem.L0C, Mem.GM, 0, addr(GM_B, block=16384), 16384)],
                       [Copy(Mem.GM, Mem.UB, addr(GM_A, block=8192, sub=4096), 0, 4096)], block_dim=hw.chip.aic_count)
    else:  # every block starts 32 bytes past a burst: same rounding for each
        k = read_kernel(hw, GM_A + 32, 4096, block_dim=hw.aiv_count, block_step=8192)
    grouped, single = same_results([Launch(k), Synchronize()], hw, expect_groups=True)
    assert_same(grouped, single)


def test_blocks_sharing_a_region_reuse_it_through_the_l2():
    """Block step 0 (every block on the same tiles, cold): the L2 reuse between blocks
    is what block by block gives, grouped or not."""
    hw = load_hw("ascend910b2", overrides=HBM_BOUND)
    k = pipeline_kernel(hw, 8192, 4, True, block_dim=5)
    grouped, single = same_results([Launch(k), Synchronize()], hw, expect_groups=None)
    assert_same(grouped, single)
    assert grouped.kernels[0].stats.l2_hit_bytes > 0


def test_grouping_same_results_when_all_blocks_read_the_same_cold_data():
    """Block step 0: the blocks behind the first wait for its fill."""
    hw = load_hw("ascend910b2", overrides={**HBM_BOUND, "hbm.peak_bw_bytes_per_s": 20 * 1.8e9})
    nbytes = 65536
    k = read_kernel(hw, GM_A, nbytes, block_dim=hw.aiv_count, block_step=0)
    grouped, single = same_results([Launch(k), Synchronize()], hw, expect_groups=None)
    assert_same(grouped, single)
    assert grouped.kernels[0].stats.hbm_read_bytes == nbytes


def test_grouping_same_results_when_blocks_share_l2_lines():
    """A block step of whole bursts but not whole lines: neighbouring blocks share lines."""
    hw = load_hw("ascend910b2", overrides=HBM_BOUND)
    step = 3 * hw.dma.burst_bytes  # 192 B: a whole number of bursts, not of lines
    assert step % hw.l2.line_bytes
    k = read_kernel(hw, GM_A, step, block_dim=hw.aiv_count, block_step=step, repeat=3)
    grouped, single = same_results([Launch(k), Synchronize()], hw, expect_groups=None)
    assert_same(grouped, single)


def test_blocks_sharing_lines_of_data_in_the_l2_are_grouped_in_waves():
    """Blocks 256 B apart (two to a line) reading data just written, in three waves:
    grouped (a group holds whole lines), with what block by block gives."""
    hw = load_hw("ascend910b2", overrides=HBM_BOUND)
    step, blocks = 256, 3 * hw.aiv_count
    write = aiv_kernel(hw, [Copy(UB, GM, 0, GM_A, step * blocks)], 1, "write")
    k = read_kernel(hw, GM_A, step, block_dim=blocks, block_step=step, repeat=2)
    grouped, single = same_results([Launch(write), Launch(k), Synchronize()], hw, expect_groups=True)
    assert_same(grouped, single)


@pytest.mark.parametrize("case", ["block steps differ", "bases differ"])
def test_grouping_same_results_when_accesses_of_different_blocks_overlap(case):
    hw = load_hw("ascend910b2", overrides={**HBM_BOUND, "hbm.peak_bw_bytes_per_s": 20 * 1.8e9})
    t = 4096
    if case == "block steps differ":  # block b's second read is block 2b's first
        body = [Copy(GM, UB, addr(GM_A, block=t), 0, t), Copy(GM, UB, addr(GM_A, block=2 * t), 0, t)]
    else:  # block b's second read is block b+1's first
        body = [Copy(GM, UB, addr(GM_A, block=2 * t), 0, t), Copy(GM, UB, addr(GM_A + 2 * t, block=2 * t), 0, t)]
    k = aiv_kernel(hw, body, block_dim=4)
    # a fix may group these correctly or decline to: either way the results must agree
    grouped, single = same_results([Launch(k), Synchronize()], hw, expect_groups=None)
    assert_same(grouped, single)


def test_host_cost_in_us_converts_without_float_overshoot():
    us = "1.12"
    hw = load_hw("ascend910b2", overrides={**SMALL, "runtime.graph_launch_us": float(us)})
    exact = Fraction(us) * Fraction(hw.chip.freq_hz) / 10**6  # cycles, in exact arithmetic
    assert exact.denominator == 1
    k, _ = compute_kernel(hw, "k", count=1)
    r = run([Launch(k, 0, "graph"), Synchronize()], hw)
    assert r.host_launch_cycles == exact


def test_host_time_is_not_rounded_to_chip_cycles():
    """At a 1 kHz clock a cycle is 1 ms: 30 launches of 1 µs still take 30 µs of host
    time (0.03 cycles), and 30 µs of host work queues the first kernel 30 µs later; the
    device starts it on its next clock edge."""
    hw = load_hw("ascend910b2", overrides={**SMALL, "chip.freq_hz": 1000, "runtime.kernel_start_aiv_cycles": 0})
    k, _ = compute_kernel(hw, "k", count=1)
    r = run([Launch(k, 0, "graph") for _ in range(30)] + [Synchronize()], hw)
    assert hw.us(r.host_launch_cycles) == pytest.approx(30.0, rel=1e-9)
    worked = run([HostWork(30.0), Launch(k, 0, "graph"), Synchronize()], hw)
    assert hw.us(worked.kernels[0].queued) == pytest.approx(31.0, rel=1e-9)
    assert worked.kernels[0].start == 1  # device work begins on the next clock edge


@pytest.mark.parametrize("level", ["kernel", "block"])
def test_trace_level_does_not_change_the_run(level):
    hw = HW
    full = run(busy_program(hw), hw, trace="instr")
    less = run(busy_program(hw), hw, trace=level)
    assert less.kernels == full.kernels
    assert less.cycles == full.cycles
    assert less.trace.counters == full.trace.counters
    assert less.trace.intervals == ()


@pytest.mark.parametrize(("call", "message"), [
    (Memcpy(1024, "H2D"), r"host call 0 \(Memcpy\): expected nbytes >= 1 and direction in h2d, d2h"),
    (Memcpy(0, "h2d"), r"host call 0 \(Memcpy\): expected nbytes >= 1"),
    (HostWork(-1.0), r"host call 0 \(HostWork\): us must be a finite number >= 0"),
    (HostWork(math.inf), r"host call 0 \(HostWork\): us must be a finite number >= 0"),
    ("launch", r"host call 0 \(str\): not a host call"),
])
def test_bad_host_calls_are_one_line_errors_before_anything_runs(call, message):
    with pytest.raises(ProgramError, match=message):
        run([call, Synchronize()], HW)


def test_bad_launch_mode_is_named():
    k, _ = compute_kernel(HW, "k", count=1)
    with pytest.raises(ProgramError, match=r"host call 1 \(Launch\): mode must be one of eager, graph, got 'lazy'"):
        run([Synchronize(), Launch(k, 0, "lazy")], HW)
