"""Closed-form checks of GM transfers: one DMA, many DMAs sharing HBM (the flow
model), the 64-byte burst rule and the per-segment DMA time. Every expected number
is derived from the config.

The rule (engine/compile.py, _copy): a transfer pays dma.startup_cycles once, then
its bytes flow at min(port, fair share of the links, one segment per segment time -
dma.vector_segment_cycles: these are vector cores' copies), where a segment is
`align_up(segment bytes, burst)` after back-to-back segments are merged into one. A
transfer of many short segments is held to `segments * vector_segment_cycles`; one
of long segments is not slowed."""

from __future__ import annotations

import pytest

from kernels import (
    GM,
    GM_A,
    MTE2,
    S,
    UB,
    aic_kernel,
    aiv_kernel,
    aiv_kernel_per_block,
    ceil_div,
    intervals,
    mix_kernel,
    read_kernel,
    simulate_on_device,
)
from npusim.engine import simulate
from npusim.hw import load_hw
from npusim.isa import Copy, Mem, Scalar, SetFlag, WaitFlag, addr

# Round, distinguishable start-ups; HBM at its peak so hbm_bytes_per_cycle is the peak;
# starts off an L2 line free (the burst rule alone; test_a_start_off_a_line_costs_the_port_more).
BASE = {"dma.startup_cycles": 100, "dma.vector_segment_cycles": 10, "hbm.bw_efficiency": 1.0,
        "dma.off_line_cost_bytes": 0}


def hw_with(**over):
    return load_hw("ascend910b2", overrides={**BASE, **over})


def the_interval(result, core="AIV0", pipe="MTE2"):
    (iv,) = intervals(result, core, pipe)
    return iv


def segment_cap(hw, seg_bytes: int) -> float:
    """Bytes/cycle the DMA engine's per-segment time allows: one burst-rounded
    segment per dma.vector_segment_cycles (overlapped with the data, not a start-up)."""
    return -(-seg_bytes // hw.dma.burst_bytes) * hw.dma.burst_bytes / hw.dma.vector_segment_cycles


def rounded(addr: int, nbytes: int, burst: int) -> int:
    """Bytes a segment [addr, addr+nbytes) moves once rounded out to aligned bursts."""
    lo = addr // burst * burst
    hi = -(-(addr + nbytes) // burst) * burst
    return hi - lo


# ------------------------------------------------------------------ one transfer


# per-cycle figures at 1.8 GHz: hbm 40 B/cycle = 7.2e10 B/s, l2 20 B/cycle = 3.6e10 B/s
@pytest.mark.parametrize("limit, over", [
    ("port", {}),
    ("hbm", {"hbm.peak_bw_bytes_per_s": 7.2e10}),
    ("l2", {"l2.bw_bytes_per_s": 3.6e10}),
])
def test_single_read_takes_startup_plus_bytes_over_slowest_link(limit, over):
    hw = hw_with(**over)
    nbytes = 65536
    port = hw.aiv.gm_read_bytes_per_cycle
    hbm, l2 = hw.hbm_bytes_per_cycle, hw.l2_bytes_per_cycle
    slowest = {"port": port, "hbm": hbm, "l2": l2}[limit]
    assert slowest == min(port, hbm, l2)  # the override made `limit` the bottleneck

    assert segment_cap(hw, nbytes) > slowest  # one long segment: the segment time does not bind

    r = simulate(read_kernel(hw, GM_A, nbytes), hw)
    _, _, name, start, end, _ = the_interval(r)
    assert name == "GM->UB"
    # transfer = startup + bytes / min(port, HBM, L2); one start-up, the segment overlapped
    assert end - start == hw.dma.startup_cycles + ceil_div(nbytes, slowest)

    # cold L2: the moved bytes cross the port on the L2 link, at min(port cap, L2); the
    # line fill HBM -> L2 does not cross the port, so it runs at the whole HBM rate
    hbm_rates = [rate for _, rate in r.trace.counters["HBM"] if rate]
    l2_rates = [rate for _, rate in r.trace.counters["L2"] if rate]
    assert hbm_rates == [pytest.approx(hbm)]
    assert l2_rates == [pytest.approx(min(port, l2))]
    s = r.kernels[0].stats
    assert s.hbm_read_bytes == s.l2_miss_bytes == s.gm_read_bytes == nbytes
    assert s.l2_hit_bytes == 0 and s.dma_segments == 1


@pytest.mark.parametrize("cost", [0, 512, 2048])
@pytest.mark.parametrize("offset", [0, 64, 256])
def test_a_start_off_a_line_costs_the_port_more(cost, offset):
    """A segment whose GM start is off an L2 line (burst-aligned or not) costs the port
    dma.off_line_cost_bytes more: its bytes flow at port x rounded / (rounded + cost)."""
    hw = hw_with(**{"dma.off_line_cost_bytes": cost})
    nbytes = 65536
    r = simulate(read_kernel(hw, GM_A + offset, nbytes), hw)
    _, _, _, start, end, _ = the_interval(r)
    assert GM_A % hw.l2.line_bytes == 0
    port = hw.aiv.gm_read_bytes_per_cycle
    moved = rounded(GM_A + offset, nbytes, hw.dma.burst_bytes)
    scale = moved / (moved + cost) if offset % hw.l2.line_bytes else 1.0
    assert port * scale < min(hw.hbm_bytes_per_cycle, hw.l2_bytes_per_cycle)  # the port binds
    assert end - start == pytest.approx(hw.dma.startup_cycles + moved / (port * scale), abs=1)


@pytest.mark.parametrize("base, steps, stride, share", [
    (0, (), 0, 0.0),  # one start, on a line
    (64, (), 0, 1.0),  # one start, off
    (0, (("k", 128),), 0, 0.75),  # starts 128 B apart: one in 4 on a line
    (0, (("k", 1024),), 2048, 0.0),  # every start on a line
    (32, (("k", 1024),), 2048, 1.0),  # every start off
    (0, (("k", 1024),), 2050, 255 / 256),  # segments 2050 B apart: starts on every even byte, 1 in 256 on a line
])
def test_the_share_of_starts_off_a_line(base, steps, stride, share):
    from npusim.isa.program import Affine, off_line_share

    a = Affine(base, steps) if steps else base
    assert off_line_share(a, 2 if stride else 1, stride, 512) == pytest.approx(share)


def test_single_write_goes_at_write_port_and_stays_in_l2():
    hw = hw_with()
    nbytes = 65536
    r = simulate(aiv_kernel(hw, [Copy(UB, GM, 0, GM_A, nbytes)]), hw)
    _, pipe, name, start, end, _ = the_interval(r, pipe="MTE3")
    assert name == "UB->GM"
    assert segment_cap(hw, nbytes) > hw.aiv.gm_write_bytes_per_cycle
    assert end - start == hw.dma.startup_cycles + ceil_div(
        nbytes, min(hw.aiv.gm_write_bytes_per_cycle, hw.l2_bytes_per_cycle))
    s = r.kernels[0].stats
    assert s.gm_write_bytes == nbytes
    assert s.hbm_write_bytes == 0 and s.hbm_read_bytes == 0  # write-back L2: nothing evicted yet


def test_kernel_time_is_block_start_plus_program():
    hw = hw_with(**{"runtime.block_start_cycles": 70})
    nbytes = 4096
    r = simulate(read_kernel(hw, GM_A, nbytes), hw)
    k = r.kernels[0]
    _, _, _, start, end, _ = the_interval(r)
    assert start == k.start + hw.runtime.block_start_cycles
    assert k.end == end
    assert segment_cap(hw, nbytes) > hw.aiv.gm_read_bytes_per_cycle
    assert k.cycles == hw.runtime.block_start_cycles + hw.dma.startup_cycles + ceil_div(
        nbytes, hw.aiv.gm_read_bytes_per_cycle)


# ------------------------------------------------------------------ many transfers share HBM


@pytest.mark.parametrize("dedup", [True, False])
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_n_cores_share_hbm_fairly(n, dedup):
    # HBM = 4 ports: 2 cores are port-limited, 4 exactly fill HBM, 8 and 16 are HBM-limited
    hw = hw_with(**{"hbm.peak_bw_bytes_per_s": 4 * 110 * 1.8e9, "aiv.gm_read_bytes_per_cycle": 110})
    port, hbm = hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle
    nbytes = 65536
    r = simulate_on_device(read_kernel(hw, GM_A, nbytes, block_dim=n, block_step=nbytes), hw, dedup=dedup)

    ivs = intervals(r, pipe="MTE2")
    assert sorted(iv[0] for iv in ivs) == sorted(f"AIV{i}" for i in range(n))
    assert len({(iv[3], iv[4]) for iv in ivs}) == 1  # every core the same share
    _, _, _, start, end, _ = ivs[0]
    share = min(port, hbm / n)
    assert segment_cap(hw, nbytes) > port  # one long segment each: only the links and ports share
    startup = hw.dma.startup_cycles
    assert end - start == startup + ceil_div(nbytes, share)
    if n * port >= hbm:  # HBM-limited: the whole copy takes n * bytes at the HBM rate
        assert end - start == startup + ceil_div(n * nbytes, hbm)
    # achieved bandwidth never beats the link, and the link is never over-subscribed
    flow_cycles = end - start - startup
    assert n * nbytes / flow_cycles <= hbm
    samples = r.trace.counters["HBM"]
    assert samples and max(rate for _, rate in samples) <= hbm * (1 + 1e-12)
    # the fills are not capped by the ports: they always take the whole HBM; the port
    # caps show on the L2 link, where the moved bytes cross them
    assert max(rate for _, rate in samples) == pytest.approx(hbm)
    l2_samples = r.trace.counters["L2"]
    assert max(rate for _, rate in l2_samples) == pytest.approx(min(n * port, hw.l2_bytes_per_cycle))
    assert r.kernels[0].stats.hbm_read_bytes == n * nbytes


def test_late_flow_shares_then_finishes_alone():
    """Max-min fair sharing when flows start at different times: block 0 starts at
    once, block 1 `delay` cycles later; HBM is slower than one port."""
    hw = hw_with(**{"dma.startup_cycles": 0, "dma.vector_segment_cycles": 0, "sync.flag_latency_cycles": 0,
                    "hbm.peak_bw_bytes_per_s": 100 * 1.8e9})
    cap = hw.hbm_bytes_per_cycle
    assert cap < hw.aiv.gm_read_bytes_per_cycle
    nbytes, delay = 64000, 200
    copy = Copy(GM, UB, GM_A, 0, nbytes)
    late = Copy(GM, UB, GM_A + nbytes, 0, nbytes)
    k = aiv_kernel_per_block(hw, [
        [copy],
        [Scalar(delay), SetFlag(S, MTE2, 0), WaitFlag(S, MTE2, 0), late],
    ])
    for dedup in (True, False):
        r = simulate_on_device(k, hw, dedup=dedup)
        (a,) = intervals(r, "AIV0", "MTE2", "GM->UB")
        (b,) = intervals(r, "AIV1", "MTE2", "GM->UB")
        t0 = a[3]
        assert b[3] - t0 == delay
        # A alone at `cap` for `delay`, then both at cap/2 until A is done; then B alone
        a_end = delay + (nbytes - cap * delay) / (cap / 2)
        b_end = a_end + (nbytes - (a_end - delay) * cap / 2) / cap
        assert a[4] - t0 == pytest.approx(a_end)
        assert b[4] - t0 == pytest.approx(b_end)
        assert b_end == pytest.approx(2 * nbytes / cap)  # work-conserving


def test_water_filling_gives_a_capped_flow_its_cap_and_the_rest_to_others():
    """A MIX block: the AIC reads with a small port cap, its two AIVs with a large one,
    all at once, through an L2 link slower than the three ports together. Max-min
    fairness on the L2 link (where the port caps apply): the AIC gets its cap, the
    AIVs split what is left. HBM is fast: the (uncapped) line fills end well before."""
    aic_cap, aiv_cap, l2 = 30, 110, 150
    hw = hw_with(**{"dma.startup_cycles": 0, "dma.vector_segment_cycles": 0,
                    "aic.gm_read_bytes_per_cycle": aic_cap, "aiv.gm_read_bytes_per_cycle": aiv_cap,
                    "l2.bw_bytes_per_s": l2 * 1.8e9})
    assert hw.l2_bytes_per_cycle == l2
    aiv_rate = (l2 - aic_cap) / 2
    assert aic_cap < aiv_rate < aiv_cap
    span = 1024  # sizes (whole lines) chosen so that everyone ends together at `span`
    aic_bytes, aiv_bytes = aic_cap * span, int(aiv_rate * span)
    assert aic_bytes % hw.l2.line_bytes == 0 and aiv_bytes % hw.l2.line_bytes == 0
    assert aiv_bytes / (hw.hbm_bytes_per_cycle / 3) < span  # the fills are not what limits
    # each AIV of the block reads its own region (`sub` moves the address)
    k = mix_kernel(hw, [Copy(GM, Mem.L1, GM_A, 0, aic_bytes)],
                   [Copy(GM, UB, addr(GM_A + 0x100000, sub=0x100000), 0, aiv_bytes)])
    r = simulate(k, hw)
    (c,) = intervals(r, "AIC0", "MTE2")
    v = intervals(r, pipe="MTE2", name="GM->UB")
    assert [iv[0] for iv in v] == ["AIV0", "AIV1"]
    for iv in [c, *v]:
        assert iv[4] - iv[3] == span
    assert max(rate for _, rate in r.trace.counters["L2"]) == pytest.approx(l2)


@pytest.mark.parametrize("core, pitch, rows, held", [
    ("AIC", 2046, 64, True),  # ND rows of 1023 fp16: a pitch off 256-byte blocks
    ("AIC", 2046, 1, False),  # one row: nothing converted row by row
    ("AIC", 2048, 64, False),  # a pitch of whole 256-byte blocks
    ("AIC", 200, 64, False),  # short rows move whole
    ("AIV", 2046, 64, False),  # the vector cores' copies into UB convert nothing
])
def test_nd_rows_off_the_conversion_alignment_move_at_the_nd2nz_rate(core, pitch, rows, held):
    """A cube core's GM -> L1 copy of ND rows (converted to NZ on the way) whose GM pitch is
    longer than 256 bytes and not a whole number of 256-byte blocks moves at
    dma.nd2nz_unaligned_bytes_per_cycle (hw.config.Dma.nd2nz_cap); rows back to back count
    as rows (the pitch is theirs), the same copy on a vector core or of aligned rows does not."""
    rate = 13
    hw = hw_with(**{"dma.nd2nz_unaligned_bytes_per_cycle": rate, "dma.segment_cycles": 0,
                    "dma.vector_segment_cycles": 0})
    nbytes = min(pitch // 32 * 32, 1024)  # each row's share copied (a tile's columns), rows `pitch` apart
    copy = Copy(GM, Mem.L1 if core == "AIC" else UB, GM_A, 0, nbytes, rows, pitch, nbytes)
    port = (hw.aic if core == "AIC" else hw.aiv).gm_read_bytes_per_cycle
    assert rate < min(port, hw.hbm_bytes_per_cycle, hw.l2_bytes_per_cycle)
    r = simulate(aic_kernel(hw, [copy]) if core == "AIC" else aiv_kernel(hw, [copy]), hw)
    (iv,) = intervals(r, f"{core}0", "MTE2")
    took = iv[4] - iv[3] - hw.dma.startup_cycles
    if held:  # the bursts each row moves (rows off a burst move the bursts they touch)
        moved = sum(rounded(GM_A + i * pitch, nbytes, hw.dma.burst_bytes) for i in range(rows))
        assert took == pytest.approx(moved / rate, abs=1)
    else:
        assert took < rows * nbytes / (2 * rate)


def test_hbm_fill_is_not_capped_by_the_port():
    """One core, HBM faster than its port: the line fill runs at the HBM rate and ends
    early; the transfer takes the port time (the L2 side, capped by the port)."""
    hw = hw_with()
    port, hbm = hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle
    assert hbm > port
    nbytes = 65536
    r = simulate(read_kernel(hw, GM_A, nbytes), hw)
    _, _, _, start, end, _ = the_interval(r)
    assert segment_cap(hw, nbytes) > port
    flows_start = start + hw.dma.startup_cycles
    assert end == flows_start + ceil_div(nbytes, port)
    # HBM busy at its full rate from the start of the flows until the fill is done
    busy = [(t, rate) for t, rate in r.trace.counters["HBM"]]
    assert [t for t, rate in busy if rate] == [flows_start]
    assert [rate for _, rate in busy if rate] == [pytest.approx(hbm)]
    assert min(t for t, rate in busy if t > flows_start and not rate) == flows_start + ceil_div(nbytes, hbm)
    assert r.kernels[0].stats.hbm_read_bytes == nbytes


# ------------------------------------------------------------------ the 64-byte rule


def test_misaligned_start_moves_extra_bursts_and_takes_longer():
    hw = hw_with()
    burst, port = hw.dma.burst_bytes, hw.aiv.gm_read_bytes_per_cycle
    nbytes = 65536
    off = burst // 2
    aligned = simulate(read_kernel(hw, GM_A, nbytes), hw)
    shifted = simulate(read_kernel(hw, GM_A + off, nbytes), hw)

    moved = rounded(GM_A + off, nbytes, burst)
    assert moved == nbytes + burst  # half a burst wasted at each end
    s = shifted.kernels[0].stats
    assert s.gm_read_bytes == moved
    assert s.wasted_burst_bytes == moved - nbytes
    assert s.misaligned_segments == 1
    a = aligned.kernels[0].stats
    assert a.wasted_burst_bytes == 0 and a.misaligned_segments == 0

    # one segment: its DMA time (65536 B per segment_cycles) is far above the port, so
    # the extra burst is paid at the port rate
    assert segment_cap(hw, nbytes) > port
    startup = hw.dma.startup_cycles
    ta, ts = the_interval(aligned), the_interval(shifted)
    assert ta[4] - ta[3] == startup + ceil_div(nbytes, port)
    assert ts[4] - ts[3] == startup + ceil_div(moved, port)
    assert ts[4] - ts[3] > ta[4] - ta[3]


def test_unaligned_end_only_is_one_misaligned_segment():
    hw = hw_with()
    burst = hw.dma.burst_bytes
    nbytes = 100 * burst + burst // 4
    s = simulate(read_kernel(hw, GM_A, nbytes), hw).kernels[0].stats
    assert s.wasted_burst_bytes == rounded(GM_A, nbytes, burst) - nbytes == burst - burst // 4
    assert s.misaligned_segments == 1


def test_fragmented_copy_pays_per_segment_and_rounded_bytes():
    """64 pieces of 100 bytes, 256 apart: each moves its 128 rounded-out bytes, and the
    DMA engine spends segment_cycles on each, so the copy's bytes flow at one
    128-byte segment per segment_cycles (below the port). The same bytes in one
    segment run at the port rate: the fragmented copy is slower."""
    hw = hw_with()
    burst, port = hw.dma.burst_bytes, hw.aiv.gm_read_bytes_per_cycle
    segs, seg_bytes, stride, ub_stride = 64, 100, 256, 128
    frag = simulate(read_kernel(hw, GM_A, seg_bytes, segments=segs, gm_stride=stride, ub_stride=ub_stride), hw)
    whole = simulate(read_kernel(hw, GM_A, segs * seg_bytes), hw)

    moved = sum(rounded(GM_A + i * stride, seg_bytes, burst) for i in range(segs))
    s = frag.kernels[0].stats
    assert s.gm_read_bytes == moved
    assert s.wasted_burst_bytes == moved - segs * seg_bytes
    assert s.misaligned_segments == segs  # each ends mid-burst
    assert s.dma_segments == segs
    # transfer = startup + moved / min(port, align_up(100, 64) / segment_cycles)
    cap = segment_cap(hw, seg_bytes)
    assert cap < port
    _, _, _, start, end, _ = the_interval(frag)
    assert end - start == hw.dma.startup_cycles + ceil_div(moved, cap)
    # aligned starts: every segment moves exactly its burst-rounded bytes, so the
    # segments are what hold it, one per segment_cycles
    assert moved == segs * -(-seg_bytes // burst) * burst
    assert end - start == hw.dma.startup_cycles + segs * hw.dma.vector_segment_cycles
    _, _, _, start_w, end_w, _ = the_interval(whole)
    assert segment_cap(hw, segs * seg_bytes) > port
    assert end_w - start_w == hw.dma.startup_cycles + ceil_div(segs * seg_bytes, port)
    assert end - start > end_w - start_w


@pytest.mark.parametrize("limit, over", [
    ("port", {}),
    ("hbm", {"hbm.peak_bw_bytes_per_s": 7.2e10}),  # 40 B/cycle at 1.8 GHz
])
def test_short_segments_are_held_to_segment_cycles_long_ones_run_at_the_link_rate(limit, over):
    """The same 16 KiB three ways, cold L2, one start-up each:
    - 256 one-burst segments, 128 apart: the DMA engine's segment_cycles per segment
      hold the flow to 64 B per segment_cycles, below the port and HBM, so the data
      takes exactly segments * segment_cycles after the start-up;
    - 4 segments of 4 KiB (whole lines), 8 KiB apart: the segment time (4 KiB per
      segment_cycles) is far above the links, so the copy runs at min(port, HBM) as
      one contiguous read would;
    - 256 one-burst segments back to back: merged into one 16 KiB segment, so the
      segment time does not hold it either."""
    hw = hw_with(**over)
    burst, line = hw.dma.burst_bytes, hw.l2.line_bytes
    port, hbm = hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle
    rate = {"port": port, "hbm": hbm}[limit]
    assert rate == min(port, hbm, hw.l2_bytes_per_cycle)
    total = 16384

    short_segs, short_bytes = 256, burst
    assert segment_cap(hw, short_bytes) < rate
    short = simulate(read_kernel(hw, GM_A, short_bytes, segments=short_segs, gm_stride=2 * burst,
                                 ub_stride=short_bytes), hw)
    s = short.kernels[0].stats
    assert s.gm_read_bytes == short_segs * short_bytes == total
    assert s.wasted_burst_bytes == 0 and s.dma_segments == short_segs
    # the line fills (every line of the 32 KiB span) run on HBM alongside and end first
    assert s.hbm_read_bytes == 2 * total and 2 * total / hbm < short_segs * hw.dma.vector_segment_cycles
    _, _, _, start, end, _ = the_interval(short)
    # transfer = startup + total / (burst / segment_cycles) = startup + segments * segment_cycles
    assert end - start == hw.dma.startup_cycles + short_segs * hw.dma.vector_segment_cycles

    long_segs, long_bytes = 4, 4096
    assert long_bytes % line == 0 and segment_cap(hw, long_bytes) > rate
    long = simulate(read_kernel(hw, GM_A, long_bytes, segments=long_segs, gm_stride=2 * long_bytes,
                                ub_stride=long_bytes), hw)
    s = long.kernels[0].stats
    assert s.gm_read_bytes == s.hbm_read_bytes == long_segs * long_bytes == total
    assert s.dma_segments == long_segs
    _, _, _, start, end, _ = the_interval(long)
    # transfer = startup + total / min(port, HBM): whole lines, so HBM fills the bytes moved
    assert end - start == hw.dma.startup_cycles + ceil_div(total, rate)
    assert end - start < hw.dma.startup_cycles + short_segs * hw.dma.vector_segment_cycles

    merged = simulate(read_kernel(hw, GM_A, short_bytes, segments=short_segs, gm_stride=short_bytes,
                                  ub_stride=short_bytes), hw)
    assert merged.kernels[0].stats.dma_segments == 1  # back-to-back: one segment of 16 KiB
    _, _, _, start_m, end_m, _ = the_interval(merged)
    assert end_m - start_m == hw.dma.startup_cycles + ceil_div(total, rate)


@pytest.mark.parametrize("burst", [64, 128, 256])
@pytest.mark.parametrize("offset, seg_bytes, segments, stride", [
    (32, 65536, 1, None),   # one misaligned contiguous piece
    (0, 100, 64, 192),      # strided pieces whose start residues cycle with the burst
    (96, 100, 10, 320),
    (0, 4000, 1, None),     # aligned start, ragged end
])
def test_burst_override_changes_the_waste_as_predicted(burst, offset, seg_bytes, segments, stride):
    hw = hw_with(**{"dma.burst_bytes": burst})
    step = seg_bytes if stride is None else stride
    ub_stride = None if segments == 1 else -(-seg_bytes // 32) * 32
    r = simulate(read_kernel(hw, GM_A + offset, seg_bytes, segments=segments, gm_stride=stride,
                             ub_stride=ub_stride), hw)
    starts = [GM_A + offset + i * step for i in range(segments)]
    moved = sum(rounded(a, seg_bytes, burst) for a in starts)
    mis = sum(1 for a in starts if a % burst or (a + seg_bytes) % burst)
    s = r.kernels[0].stats
    assert s.gm_read_bytes == moved
    assert s.wasted_burst_bytes == moved - segments * seg_bytes
    assert s.misaligned_segments == mis
    # transfer = startup + moved / min(port, align_up(seg_bytes, burst) / segment_cycles):
    # the moved bytes are the per-address rounded-out ones, the segment cap the size's
    _, _, _, start, end, _ = the_interval(r)
    assert end - start == hw.dma.startup_cycles + ceil_div(
        moved, min(hw.aiv.gm_read_bytes_per_cycle, segment_cap(hw, seg_bytes)))
