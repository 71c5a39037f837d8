"""Synchronisation in the engine: flags, PipeBarrier, SyncAll, MIX cross-core flags,
and deadlocks that stop with an error naming who waits on what (never a hang)."""

from __future__ import annotations

import math

import pytest

from kernels import (
    FIX,
    GM,
    GM_A,
    GM_C,
    L0C,
    M,
    MTE2,
    MTE3,
    S,
    UB,
    V,
    aiv_kernel,
    aiv_kernel_per_block,
    block_start,
    ceil_div,
    deadline,
    intervals,
    mix_kernel,
    simulate_on_device,
)
from npusim.engine import Launch, RecordEvent, Synchronize, WaitEvent, run, simulate
from npusim.errors import DeadlockError
from npusim.hw import load_hw
from npusim.isa import (
    Copy,
    CrossSetFlag,
    CrossWaitFlag,
    Loop,
    Mmad,
    PipeBarrier,
    Scalar,
    SetFlag,
    SyncAll,
    VecOp,
    WaitFlag,
    verify,
)

HW = load_hw("ascend910b2")


def vec_cost(hw, op: str, n: int) -> int:
    repeats = ceil_div(n * 2, hw.aiv.vector_repeat_bytes)  # fp16
    return math.ceil(hw.aiv.vector_startup_cycles + repeats * hw.aiv.vector_cycles_per_repeat[op])  # whole cycles


# ------------------------------------------------------------------ flags


def test_flag_orders_two_pipes_with_its_latency():
    n = 4096
    k = aiv_kernel(HW, [VecOp("exp", n, dst=0), SetFlag(V, MTE3, 0), WaitFlag(V, MTE3, 0),
                        Copy(UB, GM, 0, GM_A, 2 * n)])
    r = simulate(k, HW)
    (vec,) = intervals(r, "AIV0", "V", "exp")
    (out,) = intervals(r, "AIV0", "MTE3", "UB->GM")
    (wait,) = intervals(r, "AIV0", "MTE3", "WaitFlag V->MTE3 #0")
    assert out[3] == vec[4] + HW.sync.flag_latency_cycles
    assert (wait[3], wait[4]) == (vec[3], out[3])
    s = r.kernels[0].stats
    assert s.wait_cycles["AIV.MTE3"] == out[3] - vec[3]


def test_flags_are_counting_fifo():
    """Two sets before any wait: the two waits take them in order, neither blocks long."""
    k = aiv_kernel(HW, [SetFlag(S, V, 1), Scalar(100), SetFlag(S, V, 1),
                        WaitFlag(S, V, 1), VecOp("add", 128, dst=0), WaitFlag(S, V, 1), VecOp("add", 128, dst=0)])
    r = simulate(k, HW)
    a, b = intervals(r, "AIV0", "V", "add")
    t0 = block_start(r, "AIV0")
    lat = HW.sync.flag_latency_cycles
    assert a[3] == t0 + lat
    assert b[3] == max(a[4], t0 + 100 + lat)


# ------------------------------------------------------------------ PipeBarrier


def barrier_kernel(slow: int, n: int):
    return aiv_kernel(HW, [Scalar(slow), VecOp("add", n, dst=0), PipeBarrier(),
                           VecOp("add", n, dst=0), Copy(GM, UB, GM_A, 0, 4096), Scalar(3)])


def test_pipe_barrier_all_waits_for_the_slowest_pipe():
    slow, n = 1000, 4096
    r = simulate(barrier_kernel(slow, n), HW)
    t0 = block_start(r, "AIV0")
    release = t0 + max(slow, vec_cost(HW, "add", n)) + HW.sync.pipe_barrier_cycles
    first, second = intervals(r, "AIV0", "V", "add")
    assert first[3] == t0
    assert second[3] == release
    (copy,) = intervals(r, "AIV0", "MTE2", "GM->UB")
    assert copy[3] == release
    s_ivs = intervals(r, "AIV0", "S", "Scalar")
    assert [iv[3] for iv in s_ivs] == [t0, release]


def test_stats_after_a_pipe_barrier_are_not_scaled_by_the_wait():
    slow, n = 1000, 4096
    r = simulate(barrier_kernel(slow, n), HW)
    s = r.kernels[0].stats
    barrier = HW.sync.pipe_barrier_cycles  # the barrier's own cost is busy time of every pipe
    assert s.busy_cycles["AIV.S"] == slow + 3 + barrier
    assert s.busy_cycles["AIV.V"] == 2 * vec_cost(HW, "add", n) + barrier
    assert s.flops == 2 * n
    assert s.dma_segments == 1


def test_stats_after_sync_all_are_not_scaled_by_the_wait():
    n = 4096
    k = aiv_kernel_per_block(HW, [[Scalar(100 * (b + 1)), SyncAll(), VecOp("add", n, dst=0)] for b in range(2)])
    s = simulate(k, HW).kernels[0].stats
    assert s.busy_cycles["AIV.V"] == 2 * (vec_cost(HW, "add", n) + HW.sync.sync_all_cycles)
    assert s.flops == 2 * n


# ------------------------------------------------------------------ SyncAll


@pytest.mark.parametrize("blocks", [2, 5])
def test_sync_all_releases_every_block_after_the_last_arrives(blocks):
    n = 1024
    delays = [100 * (b + 1) for b in range(blocks)]
    k = aiv_kernel_per_block(HW, [[Scalar(d), SyncAll(), VecOp("add", n, dst=0)] for d in delays])
    r = simulate(k, HW)
    t0 = block_start(r, "AIV0")
    release = t0 + max(delays) + HW.sync.sync_all_cycles
    ivs = intervals(r, pipe="V", name="add")
    assert sorted(iv[0] for iv in ivs) == [f"AIV{b}" for b in range(blocks)]
    assert all(iv[3] == release for iv in ivs)
    assert r.kernels[0].cycles == release - r.kernels[0].start + vec_cost(HW, "add", n)


@pytest.mark.parametrize("dedup", [True, False])
def test_sync_all_with_a_shared_program_and_grouping(dedup):
    blocks, n = 6, 1024
    k = aiv_kernel(HW, [Scalar(50), SyncAll(), VecOp("add", n, dst=0), SyncAll(), Scalar(7)], block_dim=blocks)
    r = simulate_on_device(k, HW, dedup=dedup)
    t0 = block_start(r, "AIV0")
    first = t0 + 50 + HW.sync.sync_all_cycles
    second = first + vec_cost(HW, "add", n) + HW.sync.sync_all_cycles
    assert {iv[3] for iv in intervals(r, pipe="V", name="add")} == {first}
    assert {iv[3] for iv in intervals(r, pipe="S", name="Scalar") if iv[3] > t0} == {second}


# ------------------------------------------------------------------ MIX


def mix_produce_consume(hw, m=64, n=64, k=64):
    """AIC: Mmad, FixPipe C to GM, then tell the AIVs; each AIV waits, then reads C."""
    c_bytes = m * n * 4
    aic = [Mmad(m, n, k), SetFlag(M, FIX, 0), WaitFlag(M, FIX, 0),
           Copy(L0C, GM, 0, GM_C, c_bytes), CrossSetFlag(FIX, 0)]
    aiv = [CrossWaitFlag(MTE2, 0), Copy(GM, UB, GM_C, 0, c_bytes)]
    return mix_kernel(hw, aic, aiv), c_bytes


def test_mix_aiv_reads_after_aic_write_plus_cross_core_latency():
    hw = HW
    kernel, c_bytes = mix_produce_consume(hw)
    r = simulate(kernel, hw)
    (mm,) = intervals(r, "AIC0", "M", "Mmad")
    (fix,) = intervals(r, "AIC0", "FIX", "L0C->GM")
    assert fix[3] == mm[4] + hw.sync.flag_latency_cycles
    # FixPipe to GM = DMA start-up + FixPipe start-up + bytes / min(port, FixPipe, L2,
    # one burst-rounded segment per dma.segment_cycles); C is one segment
    segment_rate = -(-c_bytes // hw.dma.burst_bytes) * hw.dma.burst_bytes / hw.dma.segment_cycles
    fix_rate = min(hw.aic.gm_write_bytes_per_cycle, hw.aic.fixpipe_bytes_per_cycle, hw.l2_bytes_per_cycle,
                   segment_rate)
    assert fix_rate < segment_rate  # one long segment: its DMA time does not bind
    assert fix[4] - fix[3] == (hw.dma.startup_cycles + hw.aic.fixpipe_startup_cycles
                               + ceil_div(c_bytes, fix_rate))
    reads = intervals(r, pipe="MTE2", name="GM->UB")
    per = hw.chip.aiv_per_aic
    assert [iv[0] for iv in reads] == [f"AIV{s}" for s in range(per)]  # AIC0's own AIVs
    for iv in reads:
        assert iv[3] == fix[4] + hw.sync.cross_core_flag_latency_cycles
    s = r.kernels[0].stats
    assert s.l2_hit_bytes == per * c_bytes  # C was written into L2 by the FixPipe
    assert s.hbm_read_bytes == 0


def test_mix_aic_waits_for_every_aiv():
    n = 8192
    aic = [CrossWaitFlag(M, 1), Mmad(16, 16, 16)]
    aiv = [VecOp("exp", n, dst=0), CrossSetFlag(V, 1)]
    r = simulate(mix_kernel(HW, aic, aiv), HW)
    vecs = intervals(r, pipe="V", name="exp")
    assert len(vecs) == HW.chip.aiv_per_aic
    (mm,) = intervals(r, "AIC0", "M", "Mmad")
    assert mm[3] == max(iv[4] for iv in vecs) + HW.sync.cross_core_flag_latency_cycles


@pytest.mark.parametrize("dedup", [True, False])
def test_mix_blocks_take_an_aic_with_its_own_aivs(dedup):
    kernel, _ = mix_produce_consume(HW)
    blocks = 3
    kernel = type(kernel)(kernel.name, kernel.core_type, blocks, aic=kernel.aic, aiv=kernel.aiv)
    r = simulate_on_device(kernel, HW, dedup=dedup)
    per = HW.chip.aiv_per_aic
    cores = {iv[0] for iv in r.trace.intervals}
    assert cores == {f"AIC{c}" for c in range(blocks)} | {f"AIV{v}" for v in range(blocks * per)}


# ------------------------------------------------------------------ deadlocks


def test_flag_cycle_between_two_pipes_is_a_deadlock_naming_core_pipe_and_flag():
    k = aiv_kernel(HW, [
        WaitFlag(MTE2, V, 0), SetFlag(V, MTE2, 0), VecOp("add", 128, dst=0),
        WaitFlag(V, MTE2, 0), SetFlag(MTE2, V, 0), Copy(GM, UB, GM_A, 0, 64),
    ])
    verify(k, HW)  # counts balance: only running it shows the cycle
    with deadline(5), pytest.raises(DeadlockError) as e:
        simulate(k, HW)
    msg = str(e.value)
    assert "AIV0 V waits on WaitFlag MTE2->V #0" in msg
    assert "AIV0 MTE2 waits on WaitFlag V->MTE2 #0" in msg


def test_cross_core_cycle_in_a_mix_kernel_is_a_deadlock():
    aic = [CrossWaitFlag(M, 1), CrossSetFlag(M, 0)]
    aiv = [CrossWaitFlag(V, 0), CrossSetFlag(V, 1)]
    k = mix_kernel(HW, aic, aiv)
    verify(k, HW)
    with deadline(5), pytest.raises(DeadlockError) as e:
        simulate(k, HW)
    msg = str(e.value)
    assert "AIC0 M waits on CrossWaitFlag #1" in msg
    assert "AIV0 V waits on CrossWaitFlag #0" in msg


def test_wait_on_an_event_never_recorded_is_a_deadlock_naming_stream_and_event():
    k = aiv_kernel(HW, [Scalar(10)])
    with deadline(5), pytest.raises(DeadlockError) as e:
        run([Launch(k, 0), WaitEvent("never", 1), Launch(k, 1), Synchronize()], HW)
    msg = str(e.value)
    assert "stream 1" in msg and "WaitEvent 'never'" in msg


def test_event_recorded_later_on_another_stream_is_not_a_deadlock():
    k = aiv_kernel(HW, [Scalar(10)])
    with deadline(5):
        r = run([WaitEvent("e", 1), Launch(k, 1), Launch(k, 0), RecordEvent("e", 0), Synchronize()], HW)
    on = {rec.stream: rec for rec in r.kernels}
    assert on[1].start > on[0].end  # stream 1 waited for stream 0's record


def test_a_barrier_counts_as_one_instruction_not_one_per_pipe():
    body = [SyncAll(), PipeBarrier(), Loop("i", 3, [Scalar(1)])]
    s = simulate(aiv_kernel(HW, body, block_dim=2), HW).kernels[0].stats
    assert s.instructions == 2 * 5
