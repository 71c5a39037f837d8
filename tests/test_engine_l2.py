"""The L2 as the engine uses it: re-reads that fit hit (and are faster when HBM is
the bottleneck), re-reads that do not fit miss, written data reads back from L2,
evicted dirty lines become HBM writes, and LRU order decides what stays. A miss
fills whole lines from HBM (not capped by the core's port); a read of lines whose
fill is still in flight waits for it."""

from __future__ import annotations

import memory_reference
import numpy as np

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels import (
    GM,
    GM_A,
    GM_B,
    GM_C,
    MTE2,
    MTE3,
    S,
    UB,
    aiv_kernel,
    aiv_kernel_per_block,
    ceil_div,
    intervals,
    read_kernel,
    simulate_on_device,
    whole_run,
)
from npusim.engine import Launch, Synchronize, memory, run, simulate
from npusim.engine._l2 import burst_cost
from npusim.engine.events import Environment
from npusim.engine.l2cache import L2Cache
from npusim.engine.memory import MemorySystem, _lines
from npusim.hw import load_hw
from npusim.isa import Copy, Loop, Scalar, SetFlag, WaitFlag, addr
from test_engine_pipe_walk import random_programs

# one copy at a time (dma.outstanding 1): each pays its start-up, as the closed forms count
BASE = {"dma.startup_cycles": 100, "dma.segment_cycles": 0, "dma.vector_segment_cycles": 0,
        "dma.outstanding": 1, "hbm.bw_efficiency": 1.0}


def hw_with(**over):
    return load_hw("ascend910b2", overrides={**BASE, **over})


def write_then(hw, write_at: int, nbytes: int, then: list) -> list:
    """UB -> GM at `write_at`, then (ordered after it by an MTE3 -> MTE2 flag) `then`."""
    return [Copy(UB, GM, 0, write_at, nbytes), SetFlag(MTE3, MTE2, 0), WaitFlag(MTE3, MTE2, 0), *then]


def test_second_read_of_a_resident_tensor_hits_and_is_faster():
    # HBM slower than the port, so a hit (L2 bandwidth) is visibly faster than a miss
    hw = hw_with(**{"hbm.peak_bw_bytes_per_s": 20 * 1.8e9})
    port, hbm, l2 = hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle, hw.l2_bytes_per_cycle
    assert hbm < port < l2
    nbytes = 32768
    assert nbytes <= hw.l2.l2_bytes
    r = simulate(read_kernel(hw, GM_A, nbytes, repeat=2), hw)
    first, second = intervals(r, "AIV0", "MTE2")
    assert first[4] - first[3] == hw.dma.startup_cycles + ceil_div(nbytes, hbm)
    assert second[4] - second[3] == hw.dma.startup_cycles + ceil_div(nbytes, min(port, l2))
    s = r.kernels[0].stats
    assert s.hbm_read_bytes == nbytes  # HBM read once
    assert s.l2_hit_bytes == nbytes and s.l2_miss_bytes == nbytes
    assert s.l2_hit_rate == pytest.approx(0.5)


def test_l2_persists_across_kernels():
    hw = hw_with()
    nbytes = 65536
    k = read_kernel(hw, GM_A, nbytes)
    r = run([Launch(k), Launch(k), Synchronize()], hw)
    a, b = r.kernels
    assert (a.stats.l2_hit_bytes, a.stats.hbm_read_bytes) == (0, nbytes)
    assert (b.stats.l2_hit_bytes, b.stats.hbm_read_bytes) == (nbytes, 0)


def test_tensor_larger_than_l2_misses_both_times_when_streamed_in_chunks():
    hw = hw_with(**{"l2.l2_bytes": 65536})
    chunk, chunks = 8192, 16
    total = chunk * chunks
    assert total == 2 * hw.l2.l2_bytes
    body = [Loop("p", 2, [Loop("c", chunks, [Copy(GM, UB, addr(GM_A, c=chunk), 0, chunk)])])]
    s = simulate(aiv_kernel(hw, body), hw).kernels[0].stats
    assert s.l2_hit_bytes == 0
    assert s.hbm_read_bytes == 2 * total


def test_tensor_larger_than_l2_misses_both_times_in_one_copy():
    hw = hw_with(**{"l2.l2_bytes": 65536})
    nbytes = 2 * hw.l2.l2_bytes
    s = simulate(read_kernel(hw, GM_A, nbytes, repeat=2), hw).kernels[0].stats
    assert s.l2_hit_bytes == 0
    assert s.hbm_read_bytes == 2 * nbytes


def test_written_tensor_reads_back_from_l2():
    hw = hw_with()
    nbytes = 16384
    body = write_then(hw, GM_A, nbytes, [Copy(GM, UB, GM_A, 0, nbytes)])
    r = simulate(aiv_kernel(hw, body), hw)
    s = r.kernels[0].stats
    assert s.l2_hit_bytes == nbytes
    assert s.hbm_read_bytes == 0 and s.hbm_write_bytes == 0
    (read,) = intervals(r, "AIV0", "MTE2", "GM->UB")
    (write,) = intervals(r, "AIV0", "MTE3", "UB->GM")
    assert read[3] == write[4] + hw.sync.flag_latency_cycles
    assert read[4] - read[3] == hw.dma.startup_cycles + ceil_div(
        nbytes, min(hw.aiv.gm_read_bytes_per_cycle, hw.l2_bytes_per_cycle))


def test_evicted_dirty_lines_are_written_to_hbm_and_clean_ones_are_not():
    line = 512
    hw = hw_with(**{"l2.l2_bytes": 16 * line})
    nbytes = hw.l2.l2_bytes  # fills the L2
    body = write_then(hw, GM_A, nbytes, [
        Copy(GM, UB, GM_B, 0, nbytes),  # evicts all of A, dirty
        Copy(GM, UB, GM_C, 0, nbytes),  # evicts all of B, clean
    ])
    r = simulate(aiv_kernel(hw, body), hw)
    s = r.kernels[0].stats
    assert s.hbm_write_bytes == nbytes
    assert s.hbm_read_bytes == 2 * nbytes


def test_partial_eviction_writes_back_only_the_evicted_lines():
    line = 512
    hw = hw_with(**{"l2.l2_bytes": 16 * line})
    body = write_then(hw, GM_A, 16 * line, [Copy(GM, UB, GM_B, 0, 4 * line)])
    s = simulate(aiv_kernel(hw, body), hw).kernels[0].stats
    assert s.hbm_write_bytes == 4 * line


def test_write_back_does_not_slow_the_read_that_triggers_it():
    """Evicted dirty lines go L2 -> HBM in the background: they take HBM bandwidth but
    do not cross the reading core's port, so the read that evicts them is not slower."""
    line = 512
    hw = hw_with(**{"l2.l2_bytes": 16 * line})
    port, hbm = hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle
    nbytes = hw.l2.l2_bytes
    assert 2 * port <= hbm  # HBM can carry the read and the write-back at full port rate
    body = write_then(hw, GM_A, nbytes, [Copy(GM, UB, GM_B, 0, nbytes)])
    r = simulate(aiv_kernel(hw, body), hw)
    assert r.kernels[0].stats.hbm_write_bytes == nbytes
    (read,) = intervals(r, "AIV0", "MTE2", "GM->UB")
    assert read[4] - read[3] == hw.dma.startup_cycles + ceil_div(nbytes, port)
    # the write-back is on the HBM link meanwhile: busy at full rate for as long as the
    # fill and the write-back take together (the fill alone would take half)
    samples = r.trace.counters["HBM"]
    busy = [t for t, rate in samples if rate]
    idle = min(t for t, rate in samples if t > busy[0] and not rate)
    assert idle - busy[0] == ceil_div(2 * nbytes, hbm)
    assert max(rate for _, rate in samples) == pytest.approx(hbm)


def test_lru_keeps_the_most_recent_tensor():
    line = 512
    hw = hw_with(**{"l2.l2_bytes": 3 * 8 * line})
    t = 8 * line
    far = 0x100000
    body = [Copy(GM, UB, GM_A + i * far, 0, t) for i in range(3)]  # A, B, C fill the L2
    body += [Copy(GM, UB, GM_A, 0, t)]                              # touch A again
    body += [Copy(GM, UB, GM_A + 3 * far, 0, t)]                    # D evicts the LRU one: B
    body += [Copy(GM, UB, GM_A, 0, t), Copy(GM, UB, GM_A + 2 * far, 0, t)]  # A and C still hit
    s = simulate(aiv_kernel(hw, body), hw).kernels[0].stats
    assert s.l2_hit_bytes == 3 * t
    assert s.hbm_read_bytes == 4 * t


def adjacent_tensor_body(t: int) -> list:
    """A, C, then B right after A in memory (the L2 holds three tensors: now full), D
    (evicts the least recently used: A), then C again: C must still be there."""
    return [
        Copy(GM, UB, GM_A, 0, t),          # A: oldest
        Copy(GM, UB, GM_C, 0, t),          # C
        Copy(GM, UB, GM_A + t, 0, t),      # B: right after A in memory; L2 is full
        Copy(GM, UB, GM_B, 0, t),          # D evicts the least recently used: A
        Copy(GM, UB, GM_C, 0, t),          # C must still be there
    ]


def test_lru_is_not_fooled_by_an_adjacent_tensor_of_another_owner():
    """Each access from its own kernel (another owner in the L2): B does not merge
    with A, so A stays the oldest and D evicts it."""
    line = 512
    hw = hw_with(**{"l2.l2_bytes": 30 * line})
    t = 10 * line
    kernels = [aiv_kernel(hw, [copy], name=f"k{i}") for i, copy in enumerate(adjacent_tensor_body(t))]
    r = run([Launch(k) for k in kernels] + [Synchronize()], hw)
    assert [k.stats.l2_hit_bytes for k in r.kernels] == [0, 0, 0, 0, t]


def test_lru_is_not_fooled_by_an_adjacent_tensor():
    line = 512
    hw = hw_with(**{"l2.l2_bytes": 30 * line})
    t = 10 * line
    s = simulate(aiv_kernel(hw, adjacent_tensor_body(t)), hw).kernels[0].stats
    assert s.l2_hit_bytes == t


def touch(c: L2Cache, first: int, end: int, write: bool, fill=None):
    """Access lines [first, end): (hit lines, lines written back, fills to wait for)."""
    hits, wb, waits, _, _ = c.access(np.arange(first, end, dtype=np.int64), write, None if fill is None else lambda: fill)
    return hits, 0 if wb is None else int(wb.sum()), waits


def test_l2cache_unit_lru_order_and_write_back():
    c = L2Cache(4, 16)
    assert touch(c, 0, 4, True)[:2] == (0, 0)
    assert touch(c, 0, 2, False)[:2] == (2, 0)  # lines 0,1 now newer than 2,3
    assert touch(c, 10, 12, False)[:2] == (0, 2)  # evicts dirty 2,3
    assert touch(c, 2, 4, False)[:2] == (0, 2)  # misses; evicts dirty 0,1
    assert c.dirty_lines() == 0


def test_every_cold_byte_delivered_was_read_from_hbm():
    hw = hw_with()
    burst, line = hw.dma.burst_bytes, hw.l2.line_bytes
    pieces = line // burst
    body = [Loop("i", pieces, [Copy(GM, UB, addr(GM_A, i=burst), 0, burst)])]  # one line, burst by burst
    s = simulate(aiv_kernel(hw, body), hw).kernels[0].stats
    assert s.gm_read_bytes == line
    assert s.hbm_read_bytes == line  # the first burst's miss fills the whole line
    assert s.l2_hit_bytes == line - burst  # the other bursts find it there


def test_run_ends_when_the_host_is_done_not_when_background_write_backs_drain():
    # a slow HBM; the second write evicts the first one's dirty lines
    hw = hw_with(**{"l2.l2_bytes": 65536, "hbm.peak_bw_bytes_per_s": 10 * 1.8e9, "runtime.synchronize_us": 0.0})
    nbytes = hw.l2.l2_bytes
    k = aiv_kernel(hw, [Copy(UB, GM, 0, GM_A, nbytes), Copy(UB, GM, 0, GM_B, nbytes)])
    r = simulate(k, hw)
    assert r.kernels[0].stats.hbm_write_bytes == nbytes
    host_done = max(end for _, _, _, end in r.trace.host_spans)
    assert host_done == r.kernels[0].end
    assert r.cycles == host_done


# ------------------------------------------------------------------ whole-line fills, waiting for fills


@pytest.mark.parametrize("offset, nbytes", [
    ("half line + half burst", "3 lines"),  # misaligned to bursts and lines: 4 lines
    ("one burst", "one burst"),             # a partial line: the whole line
    ("line - half burst", "one burst"),     # a burst across a line boundary: 2 lines
])
def test_a_read_miss_fills_whole_lines_from_hbm(offset, nbytes):
    # HBM slower than the port: the fill sets the transfer's time
    hw = hw_with(**{"hbm.peak_bw_bytes_per_s": 20 * 1.8e9})
    burst, line, port, hbm = hw.dma.burst_bytes, hw.l2.line_bytes, hw.aiv.gm_read_bytes_per_cycle, \
        hw.hbm_bytes_per_cycle
    assert hbm < port
    off = {"half line + half burst": line // 2 + burst // 2, "one burst": burst,
           "line - half burst": line - burst // 2}[offset]
    n = {"3 lines": 3 * line, "one burst": burst}[nbytes]
    a = GM_A + off
    moved = -(-(a + n) // burst) * burst - a // burst * burst
    lines = -(-(a + n) // line) - a // line
    r = simulate(read_kernel(hw, a, n), hw)
    s = r.kernels[0].stats
    assert s.gm_read_bytes == s.l2_miss_bytes == moved  # what crosses the port: whole bursts
    assert s.hbm_read_bytes == lines * line  # what HBM delivers: whole lines
    (iv,) = intervals(r, "AIV0", "MTE2")
    assert iv[4] - iv[3] == hw.dma.startup_cycles + ceil_div(max(lines * line / hbm, moved / port), 1)


@pytest.mark.parametrize("dedup", [True, False])
def test_blocks_reading_the_same_cold_data_wait_for_one_fill(dedup):
    """Two AIV blocks read the same cold tensor at once (block step 0). The first misses
    and fills it from HBM; the second finds the lines in L2 but still being filled, and
    waits: both end when the one fill ends, and HBM is read once."""
    hw = hw_with(**{"hbm.peak_bw_bytes_per_s": 20 * 1.8e9})
    port, hbm, l2 = hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle, hw.l2_bytes_per_cycle
    assert hbm < port and 2 * port <= l2  # the fill is the bottleneck, the L2 link is not
    nbytes = 65536
    r = simulate_on_device(read_kernel(hw, GM_A, nbytes, block_dim=2, block_step=0), hw, dedup=dedup)
    a, b = intervals(r, pipe="MTE2", name="GM->UB")
    assert {a[0], b[0]} == {"AIV0", "AIV1"}
    assert (a[3], a[4]) == (b[3], b[4])
    assert a[4] - a[3] == hw.dma.startup_cycles + ceil_div(nbytes, hbm)
    s = r.kernels[0].stats
    assert s.hbm_read_bytes == nbytes
    assert s.l2_hit_bytes == s.l2_miss_bytes == nbytes
    assert max(rate for _, rate in r.trace.counters["HBM"]) == pytest.approx(hbm)  # one fill, alone


def test_a_block_arriving_during_the_fill_waits_only_for_the_rest_of_it():
    """Block 1 reads block 0's tensor `delay` cycles after block 0 started (its fill is
    in flight): it ends when that fill ends, not a whole fill later, not at port speed."""
    hw = hw_with(**{"dma.startup_cycles": 0, "sync.flag_latency_cycles": 0,
                    "hbm.peak_bw_bytes_per_s": 20 * 1.8e9})
    port, hbm = hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle
    nbytes = 16384
    fill = ceil_div(nbytes, hbm)
    delay = fill // 2
    assert delay + ceil_div(nbytes, port) < fill  # at port speed it would end before the fill
    copy = Copy(GM, UB, GM_A, 0, nbytes)
    k = aiv_kernel_per_block(hw, [[copy], [Scalar(delay), SetFlag(S, MTE2, 0), WaitFlag(S, MTE2, 0), copy]])
    r = simulate(k, hw)
    (a,) = intervals(r, "AIV0", "MTE2", "GM->UB")
    (b,) = intervals(r, "AIV1", "MTE2", "GM->UB")
    assert b[3] - a[3] == delay
    assert a[4] - a[3] == fill
    assert b[4] == a[4]
    assert r.kernels[0].stats.hbm_read_bytes == nbytes


def test_a_hit_on_filled_lines_does_not_wait_for_the_owners_next_fill():
    hw = hw_with(**{"dma.startup_cycles": 0, "sync.flag_latency_cycles": 0,
                    "hbm.peak_bw_bytes_per_s": 20 * 1.8e9})
    port, hbm = hw.aiv.gm_read_bytes_per_cycle, hw.hbm_bytes_per_cycle
    t = 16384
    fill = ceil_div(t, hbm)
    delay = fill + fill // 2  # block 0's first tensor is in; its second one is being filled
    k = aiv_kernel_per_block(hw, [
        [Copy(GM, UB, GM_A, 0, t), Copy(GM, UB, GM_A + t, 0, t)],  # A, then B right after it
        [Scalar(delay), SetFlag(S, MTE2, 0), WaitFlag(S, MTE2, 0), Copy(GM, UB, GM_A, 0, t)],  # A again
    ])
    r = simulate(k, hw)
    first, second = intervals(r, "AIV0", "MTE2", "GM->UB")
    (late,) = intervals(r, "AIV1", "MTE2", "GM->UB")
    assert first[4] - first[3] == fill and late[3] > first[4]  # A was resident when block 1 asked
    assert r.kernels[0].stats.l2_hit_bytes == t
    assert late[4] - late[3] == ceil_div(t, port)  # a plain hit, at port speed


def test_l2cache_unit_a_hit_on_lines_being_filled_returns_that_fill():
    env = Environment()
    c = L2Cache(1024, 16)  # large: each access below is applied in one piece
    filling = env.event()
    assert touch(c, 0, 8, False, filling) == (0, 0, [])
    assert touch(c, 4, 12, False, env.event()) == (4, 0, [filling])  # 4..7 are on their way
    filling.succeed()
    env.run()
    assert touch(c, 0, 8, False, env.event()) == (8, 0, [])  # they have arrived


def test_l2cache_unit_lines_already_filled_are_not_in_flight_again():
    env = Environment()
    c = L2Cache(1024, 16)
    first = env.event()
    touch(c, 0, 8, False, first)
    first.succeed()
    env.run()
    touch(c, 8, 16, False, env.event())  # the owner's stream goes on; this fill is in flight
    assert touch(c, 0, 8, False, env.event()) == (8, 0, [])  # 0..7 arrived with `first`


def test_l2cache_unit_one_access_twice_the_capacity_misses_every_line_the_second_time():
    c = L2Cache(64, 16)
    for _ in range(2):
        hits, written_back, _ = touch(c, 0, 128, True)
        assert hits == 0
    assert written_back == 128  # every dirty line of the first pass, and the second's front half
    assert c.dirty_lines() == 64


def test_l2cache_unit_lines_a_32_bit_tag_cannot_name_are_refused():
    """A slot keeps its line's tag (the line divided by the sets) in 32 bits: the last
    line is 2^31 x sets - 1, and one past it is an error, not a silently wrong hit."""
    c = L2Cache(64, 16)  # 4 sets
    last = (1 << 31) * c.sets - 1
    assert touch(c, last, last + 1, False)[0] == 0 and touch(c, last, last + 1, False)[0] == 1
    assert c.find(np.array([last, last + 1], np.int64)).tolist()[1] == -1
    for line in (last + 1, -1):
        with pytest.raises(ValueError, match="L2 core: line number"):
            c.access(np.array([line], np.int64), False)


# ------------------------------------------------------------------ the array L2 against a plain one


class PlainL2:
    """The L2's rules written out line by line, for comparison with L2Cache (whose
    line walk is C). Per piece
    of `sets` lines: hits are decided against the state at its start and refresh
    their line; then, per set, the r-th miss takes the r-th least recently used way
    (lowest way first among equals), and past `ways` misses only the last `ways` stay."""

    def __init__(self, cache: L2Cache):
        self.set_of, self.sets, self.ways = cache.set_of, cache.sets, cache.ways
        self.tag = [[-1] * self.ways for _ in range(self.sets)]
        self.use = [[0] * self.ways for _ in range(self.sets)]
        self.dirty = [[False] * self.ways for _ in range(self.sets)]
        self.clock = 0

    def access(self, lines: list[int], write: bool) -> tuple[int, list[bool]]:
        hits, wb = 0, []
        for lo in range(0, len(lines), self.sets):
            piece_hits, piece_wb = self._piece(lines[lo:lo + self.sets], write)
            hits += piece_hits
            wb += piece_wb
        return hits, wb

    def _piece(self, lines: list[int], write: bool) -> tuple[int, list[bool]]:
        sets = self.set_of(np.array(lines, np.int64)).tolist()
        wb = [False] * len(lines)
        misses: dict[int, list[int]] = {}
        for i, (line, s) in enumerate(zip(lines, sets)):
            if line in self.tag[s]:
                way = self.tag[s].index(line)
                self.use[s][way] = self.clock + 1 + i
                self.dirty[s][way] |= write
            else:
                misses.setdefault(s, []).append(i)
        hits = len(lines) - sum(len(m) for m in misses.values())
        for s, idx in misses.items():
            lru = sorted(range(self.ways), key=lambda way: (self.use[s][way], way))
            dropped = max(len(idx) - self.ways, 0)
            for i in idx[:dropped]:
                wb[i] = write  # evicted by a later miss of the same piece
            for i, way in zip(idx[dropped:], lru):
                wb[i] = self.dirty[s][way]
                self.tag[s][way], self.use[s][way], self.dirty[s][way] = lines[i], self.clock + 1 + i, write
        self.clock += len(lines)
        return hits, wb


def random_accesses(rng: np.random.Generator, capacity: int, far: int, count: int):
    """`count` (lines, write) accesses: contiguous runs, strided pieces and scattered
    lines, some of them `far` lines away (another tensor), some in descending or
    shuffled order."""
    for _ in range(count):
        kind = rng.integers(3)
        first = int(rng.integers(4 * capacity))
        if kind == 0:
            lines = np.arange(first, first + int(rng.integers(1, 3 * capacity)))
        elif kind == 1:
            seg = int(rng.integers(1, 8))
            stride = seg + int(rng.integers(0, 64))
            lines = (first + np.arange(int(rng.integers(1, 40)))[:, None] * stride + np.arange(seg)).ravel()
        else:
            lines = np.unique(rng.integers(0, 4 * capacity, int(rng.integers(1, capacity))))
        if rng.random() < 0.2:
            lines = lines + far
        order = rng.random()
        if order < 0.1:
            lines = lines[::-1]
        elif order < 0.15:
            lines = rng.permutation(lines)
        yield lines.astype(np.int64), bool(rng.random() < 0.3)


def _alike_on_random_accesses(c: L2Cache, capacity: int, seed: int) -> PlainL2:
    """150 random accesses (some to another tensor, far away) on `c` and on the plain
    rules: the same hits and write-backs each time. Returns the plain model, to compare states."""
    plain = PlainL2(c)
    for lines, write in random_accesses(np.random.default_rng(seed), capacity, 1 << 20, 150):
        hits, wb, _, _, _ = c.access(lines, write)
        plain_hits, plain_wb = plain.access(lines.tolist(), write)
        assert hits == plain_hits
        assert (np.zeros(len(lines), bool) if wb is None else wb).tolist() == plain_wb
    return plain


# ways a multiple of 8 up to 64 take the C walk's AVX2 search and LRU scan (on a CPU with AVX2); 1, 4, 6 and 75
# the plain loops
@pytest.mark.parametrize("capacity, ways", [(4, 16), (48, 16), (64, 8), (256, 16), (100, 4), (1024, 16), (512, 1),
                                            (60, 6), (600, 72)])
def test_l2cache_matches_the_plain_rules_on_random_accesses(capacity, ways):
    c = L2Cache(capacity, ways)
    plain = _alike_on_random_accesses(c, capacity, seed=capacity * 100 + ways)
    # a slot's tag is its line divided by the number of sets (-1: empty)
    assert c.tags.tolist() == [t // c.sets if t >= 0 else -1 for row in plain.tag for t in row]
    assert c.last_use.tolist() == [u for row in plain.use for u in row]
    assert c.dirty_lines() == sum(d for row in plain.dirty for d in row)


def repeating_accesses(rng: np.random.Generator, sets: int, pool: int, count: int):
    """`count` (lines, write) accesses whose pieces (`sets` lines each) hold distinct lines
    but share lines with each other: a line repeats across the pieces of one access."""
    for _ in range(count):
        pieces = [rng.choice(pool, sets, replace=False)]
        for _ in range(int(rng.integers(1, 4))):
            again = rng.choice(np.unique(np.concatenate(pieces)), (sets + 1) // 2, replace=False)
            new = rng.choice(np.setdiff1d(np.arange(pool), again), sets - len(again), replace=False)
            pieces.append(rng.permutation(np.concatenate([again, new])))
        pieces[-1] = pieces[-1][:int(rng.integers(1, sets + 1))]
        yield np.concatenate(pieces).astype(np.int64), bool(rng.random() < 0.3)


@pytest.mark.parametrize("capacity, ways", [(64, 16), (64, 8), (60, 6), (48, 1)])
def test_l2cache_matches_the_plain_rules_on_lines_repeated_across_pieces(capacity, ways):
    """A line given again in a later piece of the same access (the engine's transfers give
    each line once; the core takes any) hits what the earlier piece placed, as the plain
    rules say, and makes it dirty if written: the same hits, write-backs and state."""
    c = L2Cache(capacity, ways)
    plain = PlainL2(c)
    repeated = 0
    for lines, write in repeating_accesses(np.random.default_rng(capacity + ways), c.sets, 2 * capacity, 120):
        repeated += len(lines) - len(np.unique(lines))
        hits, wb, _, _, _ = c.access(lines, write)
        plain_hits, plain_wb = plain.access(lines.tolist(), write)
        assert hits == plain_hits
        assert (np.zeros(len(lines), bool) if wb is None else wb).tolist() == plain_wb
    assert repeated > 100
    assert c.tags.tolist() == [t // c.sets if t >= 0 else -1 for row in plain.tag for t in row]
    assert c.last_use.tolist() == [u for row in plain.use for u in row]
    assert c.dirty_lines() == sum(d for row in plain.dirty for d in row)


def _order(values) -> list[int]:
    """Each value's rank among the distinct values (equal values, equal ranks)."""
    distinct = sorted(set(values))
    return [distinct.index(v) for v in values]


@pytest.mark.parametrize("capacity, ways", [(48, 16), (64, 8), (60, 6), (4, 16)])
def test_l2cache_re_ranking_last_uses_changes_no_choice(capacity, ways):
    """Last uses are 32-bit, each set's re-ranked when the clock outgrows them: with the
    smallest bound allowed (re-ranked every access or two) every hit and write-back is
    the plain rules', and each set's last uses are in the plain model's order."""
    sets = max(1, capacity // ways)
    use_max = sets + capacity // sets
    c = L2Cache(capacity, ways, use_max=use_max)
    plain = _alike_on_random_accesses(c, capacity, seed=capacity * 10 + ways)
    assert c.clock > 10 * use_max and c.last_use.max() <= use_max  # it re-ranked, many times
    for s in range(c.sets):
        assert _order(c.last_use[s * c.ways:(s + 1) * c.ways].tolist()) == _order(plain.use[s])
    assert c.dirty_lines() == sum(d for row in plain.dirty for d in row)


def test_lines_of_a_group_are_its_members_lines_shifted():
    """MemorySystem computes a transfer shape's lines once and shifts them (by the line
    of its first byte, which the L2 walk adds): the same lines and members as computing
    them for the actual addresses."""
    hw = hw_with()
    mem = MemorySystem(Environment(), hw, record=False)
    line = hw.l2.line_bytes
    cases = [([GM_A + 96], 4000, 3, 5000), ([GM_A + 96 + 7 * line], 4000, 3, 5000),
             ([GM_A, GM_A + 64 * line, GM_A + 128 * line], 2048, 2, 8192),
             ([GM_A + 8 * line + 32, GM_A + 72 * line + 32], 64, 4, 96),
             ([GM_B + 2 * line, GM_B], 1024, 1, 1024)]  # members in descending order
    for addrs, nbytes, segments, stride in cases:
        for _ in range(2):  # computed, then from the cache
            pattern, member, shared, first = mem._lines_of(addrs, nbytes, segments, stride)
            lines = pattern + first
            expect_lines, expect_member, expect_shared = _lines(addrs, nbytes, segments, stride, line)
            assert shared == expect_shared == 0  # members whole lines apart share none
            assert lines.tolist() == expect_lines.tolist()
            assert member.tolist() == expect_member.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_a_long_touch_walked_from_its_tail_leaves_the_l2_as_the_whole_walk(seed):
    """MemorySystem.touch walks a range longer than touch_lines() from its last
    touch_lines() lines: every set then holds the same lines in the same LRU order, with
    the same dirty bits and none in flight, as walking all of it - from an L2 holding
    dirty lines, lines in flight and lines of the range itself."""
    from npusim.engine.l2_image import l2_image
    from npusim.engine.l2cache import _ARRIVED

    hw = hw_with(**{"l2.l2_bytes": 64 * 512, "l2.ways": 4})  # 16 sets of 4 ways
    rng = np.random.default_rng(seed)
    env = Environment()
    cut, whole = MemorySystem(env, hw, record=False), MemorySystem(env, hw, record=False)
    keep, line = cut.touch_lines(), hw.l2.line_bytes
    for _ in range(40):  # the same history on both: reads (some filling, not arrived), writes
        first, n = int(rng.integers(0, 400)), int(rng.integers(1, 24))
        write, fill = bool(rng.integers(2)), env.event() if rng.integers(2) else None
        for mem in (cut, whole):
            mem.l2.access(np.arange(first, first + n, dtype=np.int64), write, None if fill is None else lambda: fill)
    start = int(rng.integers(0, 200)) * line + int(rng.integers(0, line))
    nbytes = int(rng.integers(keep + 1, 3 * keep)) * line + int(rng.integers(0, line))
    write = bool(seed % 2)
    cut.touch(start, nbytes, write)
    whole.l2.access(_lines([start], nbytes, 1, 0, line)[0], write)
    (lines_c, dirty_c), (lines_w, dirty_w) = l2_image(cut.l2), l2_image(whole.l2)
    assert lines_c.tolist() == lines_w.tolist() and dirty_c.tolist() == dirty_w.tolist()
    assert len(lines_c) == 64 and (cut.l2.fill == _ARRIVED).all() and (whole.l2.fill == _ARRIVED).all()
    assert cut.l2.clock < whole.l2.clock  # it did walk fewer lines


@pytest.mark.parametrize("ways", [8, 6])
def test_l2cache_misses_of_a_set_take_its_ways_least_recent_first_up_to_the_largest_last_use(ways):
    """Several misses in one set of a piece take its least recently used ways in order,
    the lowest way first among equals, also among ways last used at 2^31 - 1 (the largest
    last use, which the C walk's selection of ways (ways a multiple of 8) has to tell from
    a way it already took): as the plain rules do."""
    c = L2Cache(8 * ways, ways)  # 8 sets: the four misses below are one piece
    plain = PlainL2(c)
    top = np.iinfo(np.int32).max
    c.last_use[:ways] = top
    c.last_use[3] = 5
    plain.use[0] = c.last_use[:ways].tolist()
    lines = np.arange(256, dtype=np.int64)
    lines = lines[c.set_of(lines) == 0][:4]
    hits, _, _, _, _ = c.access(lines, False)
    plain_hits, _ = plain.access(lines.tolist(), False)
    assert hits == plain_hits == 0
    assert c.tags.tolist() == [t // c.sets if t >= 0 else -1 for row in plain.tag for t in row]
    assert [c.tags[w] for w in (3, 0, 1, 2)] == (lines // c.sets).tolist()


# ------------------------------------------------------------------ transfers (_l2.c Mover) against Python


@given(st.integers(-(1 << 50), 1 << 50), st.integers(0, 1 << 20), st.integers(0, 300),
       st.integers(-(1 << 30), 1 << 30), st.integers(1, 1 << 20))
def test_burst_rounding_is_the_python_rule_for_any_burst_address_and_stride(addr, nbytes, segments, stride, burst):
    """Beyond the shapes test_engine_transfer draws: negative addresses and strides (floor
    division and modulo as Python's), bursts that are not powers of two up to the most, no
    segments or no bytes (a negative size is refused: test_engine_hostile)."""
    assert burst_cost(addr, nbytes, segments, stride, burst) == memory_reference.burst_cost(
        addr, nbytes, segments, stride, burst)


# (monkeypatch's changes are undone within each example)
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(random_programs())
def test_random_programs_transfer_as_in_python(monkeypatch, program):
    """The C transfer and its Python statement (tests/memory_reference.py) on random programs
    (test_engine_pipe_walk.random_programs: strided and misaligned segments, groups of
    blocks, an L2 of 16 KiB that misses and evicts): every kernel record, counter, trace
    interval and link sample agrees, value and type."""
    kernel, hw = program
    started = whole_run(simulate_on_device(kernel, hw))
    with monkeypatch.context() as m:
        m.setattr(memory, "Mover", memory_reference.Mover)
        assert whole_run(simulate_on_device(kernel, hw)) == started
