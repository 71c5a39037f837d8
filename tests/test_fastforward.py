"""Fast-forward (engine.fastforward): a kernel of many identical waves priced from a few
of them must stay within tolerance of the full simulation, say that it was priced that
way, and exact=True (the default; --fast-forward asks for the fast path) must give the engine's result without fast-forward, bit
for bit. Small cases (seconds); benchmarks/bench_fastforward.py measures the corpus."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from npusim.cli import main
from npusim.engine import fastforward as ff
from npusim.engine import fastforward_blocks as ffb
from npusim.engine import fastforward_rewrite as rewrite
from npusim.engine import run
from npusim.engine.host import Launch, Synchronize
from npusim.hw import load_hw
from npusim.isa.verify import verify
from npusim.ops.registry import lower
from npusim.ops.roofline import simulate_op

# A small L2 (8 MiB): a kernel reaches the steady occupancy of the cache after a few waves
# (fastforward.price measures from there), so cases of a fraction of a second fast-forward.
SMALL_L2 = {"l2.l2_bytes": 8 << 20}
HW = load_hw("ascend910b2", SMALL_L2)
# The targets for the fast path against the full simulation: 0.2% median and 1% max
# over the benchmark's corpus; every small case here must be within the max.
LATENCY_TOLERANCE = 0.01
# HBM read bytes: a wave's share of HBM moves with what the L2 holds (fastforward.FF_TRAFFIC_TOLERANCE);
# on these cases the extrapolation must still be within 2%.
TRAFFIC_TOLERANCE = 0.02

# (op, params): kernels with more than FF_MIN_SKIP waves to skip that simulate in well under a second
CASES = [
    ("rms_norm", {"shape": (49152, 4096)}),  # rows past MergeN's columns: 1024 a core, 2 a wave
    ("add", {"shape": (131072, 1024)}),  # 86 waves
]


def _op(op, params, exact):
    return simulate_op(lower(op, params, HW), HW, trace="kernel", counters=False, exact=exact)


@pytest.mark.parametrize("op,params", CASES, ids=[f"{o}-{i}" for i, (o, _) in enumerate(CASES)])
def test_fast_path_stays_within_tolerance_of_the_exact_one(op, params):
    exact, fast = _op(op, params, True), _op(op, params, False)
    assert all(k.skipped == 0 for k in exact.run.kernels)
    assert any(k.skipped >= ff.FF_MIN_SKIP for k in fast.run.kernels), "the case no longer fast-forwards"
    assert abs(fast.cycles / exact.cycles - 1) <= LATENCY_TOLERANCE
    for name in ("hbm_read_bytes", "l2_hit_bytes", "gm_read_bytes", "gm_write_bytes"):
        e, f = getattr(exact.stats, name), getattr(fast.stats, name)
        assert abs(f - e) <= TRAFFIC_TOLERANCE * max(e, 1), name
    assert fast.stats.instructions == exact.stats.instructions  # the waves left out are whole iterations
    assert abs(fast.stats.flops - exact.stats.flops) <= 1e-9 * max(exact.stats.flops, 1)


def test_exact_is_the_engine_without_fast_forward():
    """exact=True never consults the fast path: the same numbers as a device without one."""
    kernel = lower(*CASES[0], HW).kernels[0]
    calls = [Launch(kernel, 0), Synchronize()]
    a = run(calls, HW, "kernel", exact=True)
    b = run(calls, HW, "kernel", on_device=lambda d: setattr(d, "fast_forward", None))
    assert a.cycles == b.cycles and a.kernels[0].stats == b.kernels[0].stats and a.kernels[0].skipped == 0


def test_exact_reproduces_the_recorded_engine():
    """--exact is the engine as recorded, on the regression corpus's config: first with the
    engine before fast-forward existed (HEAD 87863f8), again when CASES[0] moved to long
    rows (MODEL_VERSION 6: short rows are packed and take few waves)."""
    hw = load_hw(str(Path(__file__).parent / "data" / "engine_regression_hw.yaml"), SMALL_L2)
    r = simulate_op(lower(*CASES[0], hw), hw, trace="kernel", counters=False, exact=True)
    assert (r.cycles, r.stats.hbm_read_bytes, r.stats.l2_hit_bytes) == (1_689_862.0, 402_661_376.0, 385_024.0)


def test_small_kernels_are_never_fast_forwarded():
    """Below FF_MIN_SKIP waves the default run is the exact one (the regression corpus relies on it)."""
    low = lower("rms_norm", {"shape": (8192, 1024)}, HW)
    assert ff.plan(ff.waves(low.kernels[0]))[2] < ff.FF_MIN_SKIP
    a, b = simulate_op(low, HW, trace="kernel"), simulate_op(low, HW, trace="kernel", exact=True)
    assert a.cycles == b.cycles and a.stats == b.stats


def test_truncated_kernels_verify_and_keep_their_head_and_tail():
    kernel = lower(*CASES[0], HW).kernels[0]
    loops = rewrite.repeat_loops(kernel)
    short = rewrite.truncated(kernel, 10)
    verify(short, HW)
    progs, before = short.aiv, kernel.aiv  # an AIV kernel
    assert progs and len(progs) == len(before)
    for (path, a), program, old in zip(loops[kernel.core_type], progs, before):
        b = program.body[path[0]]
        for i in path[1:]:
            b = b.body[i]
        assert b.count == a.count - 10 and b.var == a.var
        assert len(program.body) == len(old.body)  # head and tail kept


def test_no_steady_state_means_the_full_simulation(monkeypatch):
    """Increments that do not agree: the kernel is simulated in full, not extrapolated."""
    monkeypatch.setattr(ff, "_MEASURED", (("cycles", -1.0),))  # nothing is ever steady
    r = _op(*CASES[0], False)
    assert all(k.skipped == 0 for k in r.run.kernels)
    assert r.cycles == _op(*CASES[0], True).cycles


def test_l2_image_round_trips():
    """warm(l2_image(l2)) holds the same lines, dirty alike."""
    from npusim.engine.l2_image import l2_image, warm
    from npusim.engine.l2cache import L2Cache
    import numpy as np

    a, b = L2Cache(4096, 16), L2Cache(4096, 16)
    a.access(np.arange(1000, 3000, dtype=np.int64), False)
    a.access(np.arange(5000, 5600, dtype=np.int64), True)
    warm(b, l2_image(a))
    lines = np.arange(0, 8000, dtype=np.int64)
    held_a, held_b = a.find(lines) >= 0, b.find(lines) >= 0
    assert (held_a == held_b).all()
    assert a.dirty_lines() == b.dirty_lines()


def test_a_run_the_engine_refuses_means_the_full_simulation_and_a_snapshot_bug_shows():
    """measure prices a kernel in full when a truncated run fails (the engine refuses it) or its
    marks are not the waves' (a ValueError from snapshots); any other error is a bug and raised."""
    from npusim.engine.stats import KernelStats

    kernel = lower(*CASES[0], HW).kernels[0]

    def refused(*args):
        raise RuntimeError("deadlock")

    def ran(*args):
        return KernelStats(), [], None

    def bug(marks, n):
        raise KeyError("a snapshot bug")

    def not_waves(marks, n):
        raise ValueError("marked another count")

    assert ff.price(kernel, HW, None, refused) is None
    c = ff.waves(kernel)
    assert ff.measure(kernel, HW, None, ran, c, lambda n: kernel, ff.FF_MARKED, not_waves) is None
    with pytest.raises(KeyError, match="a snapshot bug"):
        ff.measure(kernel, HW, None, ran, c, lambda n: kernel, ff.FF_MARKED, bug)


def test_cli_fast_forwards_when_asked_and_says_so(tmp_path, capsys):
    args = ["op", "rms_norm", "shape=49152,4096", "--set", "l2.l2_bytes=8388608", "--no-cache"]
    j = tmp_path / "ff.json"
    assert main(args + ["--fast-forward", "--json", str(j)]) == 0
    out = capsys.readouterr().out
    assert "fast-forwarded" in out
    report = json.loads(j.read_text())
    assert report["fast_forwarded_kernels"] == 1 and report["ops"][0]["fast_forwarded_waves"] >= ff.FF_MIN_SKIP
    assert main(args + ["--json", str(j)]) == 0  # exact unless asked
    assert "fast-forwarded" not in capsys.readouterr().out
    report = json.loads(j.read_text())
    assert report["fast_forwarded_kernels"] == 0 and "fast_forwarded_waves" not in report["ops"][0]


def test_stats_arithmetic_keeps_integer_counters_integer():
    from npusim.engine.stats import KernelStats

    a = KernelStats(cycles=10.0, instructions=7, dma_segments=3, busy_cycles={"AIC.M": 4.0})
    b = KernelStats(cycles=2.0, instructions=2, dma_segments=1, busy_cycles={"AIC.M": 1.0, "AIC.FIX": 1.0})
    s = ff._add(a, b, 3.0)
    assert s.instructions == 13 and isinstance(s.instructions, int) and s.dma_segments == 6
    assert s.busy_cycles == {"AIC.FIX": 3.0, "AIC.M": 7.0} and s.cycles == 16.0
    assert attrs.evolve(s, cycles=0.0).cycles == 0.0


def test_the_kernel_after_a_fast_forwarded_one_finds_the_l2_as_in_the_exact_run():
    """A fast-forwarded kernel leaves the L2 as its measuring run did (its dirty output
    lines, its last inputs): the kernel after it, reading and evicting them, costs what it
    does after the exact run (the footprint of every tensor put through the L2 as read left
    the L2 clean: the add came out 4.4% fast)."""
    first, then = lower(*CASES[0], HW).kernels[0], lower("add", {"shape": (4096, 4096)}, HW).kernels[0]
    exact, fast = (run([Launch(first, 0), Launch(then, 0), Synchronize()], HW, "kernel", exact=e).kernels
                   for e in (True, False))
    assert fast[0].skipped and not exact[0].skipped
    assert abs(fast[1].stats.cycles / exact[1].stats.cycles - 1) < 0.005
    assert abs(fast[1].stats.hbm_write_bytes / exact[1].stats.hbm_write_bytes - 1) < 0.01


def test_a_marked_truncation_renames_its_loop_and_keeps_programs_shared():
    """truncated(..., var) calls the repeat loop and every address moving with it by the
    marked name (no other loop's ends are then taken for waves'), and blocks that ran one
    program still do (their truncated runs group them as the full kernel's did)."""
    from npusim.isa.program import Affine

    kernel = lower(*CASES[1], HW).kernels[0]
    short = rewrite.truncated(kernel, 10, ff.FF_MARKED)
    verify(short, HW)
    assert len({id(p) for p in short.aiv}) == len({id(p) for p in kernel.aiv})
    (path, loop), = {(p, lp.var) for p, lp in rewrite.repeat_loops(kernel)[kernel.core_type]}
    body = short.aiv[0].body[path[0]]
    for i in path[1:]:
        body = body.body[i]
    assert body.var == ff.FF_MARKED
    terms = {v for it in body.body for f in attrs.fields(it.__class__) if isinstance(getattr(it, f.name), Affine)
             for v, _ in getattr(it, f.name).terms}
    assert ff.FF_MARKED in terms and loop not in terms


# ---------------------------------------------------------------- waves of blocks (fastforward_blocks)

# A causal FlashAttention of 25 x 16 heads of 1024 tokens: 432 MIX blocks on 24 cube cores, 16
# waves of whole heads (4 programs, one per batch run of heads, at other addresses), then 2
# waves of blocks sharing the 16 heads left over (the tail, renumbered in a truncated kernel).
# On a 32 MiB L2 the 24 heads of a wave keep their K and V (512 KiB each) resident, as the
# real 192 MiB L2 does for the K3 prefill's heads of 4096 tokens (2 MiB each). (On the 8 MiB
# SMALL_L2 they do not fit: a wave's time then swings by +-8% with the thrashing, and the
# block-wave path simulates such a kernel in full: see the test after the next.)
FLASH_HW = load_hw("ascend910b2", {"l2.l2_bytes": 32 << 20})
FLASH = ("flash_attention", dict(batch=25, heads=16, kv_heads=16, head_dim=128, dtype="fp16", seq_q=1024,
                                 seq_kv=1024, causal=True, kv_layout="contiguous", layers=1, layer=0, block_tokens=128))


def _flash_kernel():
    return lower(*FLASH, FLASH_HW).kernels[0]


def test_block_waves_stay_within_tolerance_of_the_exact_run():
    low = lower(*FLASH, FLASH_HW)
    exact, fast = (simulate_op(low, FLASH_HW, trace="kernel", counters=False, exact=e) for e in (True, False))
    assert all(k.skipped == 0 for k in exact.run.kernels)
    assert any(k.skipped >= ffb.FF_MIN_BLOCK_SKIP for k in fast.run.kernels), "the case no longer fast-forwards"
    assert abs(fast.cycles / exact.cycles - 1) <= LATENCY_TOLERANCE
    assert abs(fast.stats.hbm_read_bytes / exact.stats.hbm_read_bytes - 1) <= TRAFFIC_TOLERANCE
    assert fast.stats.instructions == exact.stats.instructions
    assert abs(fast.stats.flops - exact.stats.flops) <= 1e-9 * exact.stats.flops


def _affines(value, out: list) -> list:
    """Every Affine in a program, in walk order (generic over the ISA's attrs records)."""
    if value.__class__ is ffb.Affine:
        out.append(value)
    elif value.__class__ is tuple:
        for v in value:
            _affines(v, out)
    elif attrs.has(value.__class__):
        for f in attrs.fields(value.__class__):
            _affines(getattr(value, f.name), out)
    return out


def test_truncated_block_waves_verify_and_keep_their_addresses():
    kernel, cores = _flash_kernel(), FLASH_HW.chip.aic_count
    w = ffb.block_waves(kernel, cores)
    assert w == 16 and kernel.block_dim == (w + 2) * cores
    keep = 3
    short = ffb.truncated(kernel, cores, w, keep)
    verify(short, FLASH_HW)
    assert short.block_dim == (keep + 2) * cores
    moved = 0
    for new in range(short.block_dim):
        old = new if new < keep * cores else new + (w - keep) * cores
        for kind in (ffb.CoreType.AIC, ffb.CoreType.AIV):
            a, b = _affines(kernel.program(kind, old), []), _affines(short.program(kind, new), [])
            assert [x.terms for x in a] == [y.terms for y in b]
            assert [x.at({**dict.fromkeys(dict(x.terms), 0), "block": old}) for x in a] == \
                   [y.at({**dict.fromkeys(dict(y.terms), 0), "block": new}) for y in b]
            moved += sum(1 for x in a if "block" in dict(x.terms)) if old != new else 0
    assert moved, "no renumbered block reads its addresses through `block`: the case tests nothing"
    # blocks that shared a Program still share one
    assert len({id(p) for p in short.aic}) <= len({id(p) for p in kernel.aic})


def test_alike_is_equality_up_to_addresses():
    from npusim.isa.program import Affine, Copy, Loop, Mem, Program

    def prog(src, nbytes=512):
        return Program([Loop("i", 4, [Copy(Mem.GM, Mem.UB, src, 0, nbytes)])])

    assert ffb.alike(prog(Affine(0x1000, (("block", 64),))), prog(Affine(0x9000, (("block", 64),))))
    assert ffb.alike(prog(0x1000), prog(0x2000))
    assert not ffb.alike(prog(Affine(0, (("block", 64),))), prog(Affine(0, (("block", 128),))))
    assert not ffb.alike(prog(0x1000), prog(0x1000, nbytes=1024))


def test_one_wave_kernels_take_the_loop_path_and_small_ones_neither():
    assert ffb.block_waves(lower(*CASES[0], HW).kernels[0], HW.aiv_count) == 0  # blocks in one wave
    small = lower("flash_attention", {**FLASH[1], "batch": 2}, FLASH_HW).kernels[0]
    assert not ffb.worth_trying(small, FLASH_HW)


def test_block_waves_that_drift_apart_are_simulated_in_full():
    """Waves whose K and V outgrow the L2 jitter by several percent as blocks drift apart:
    no steady state (FF_BLOCK_NOISE_SIGMAS), not extrapolated (it came out 3.3% off)."""
    hw = load_hw("ascend910b2", SMALL_L2)
    low = lower(*FLASH, hw)
    assert ffb.worth_trying(low.kernels[0], hw)
    r = simulate_op(low, hw, trace="kernel", counters=False, exact=False)
    assert all(k.skipped == 0 for k in r.run.kernels)


def test_readdressing_walks_every_field_that_can_hold_an_affine():
    """readdressed skips only fields of plain types: every field of an ISA record typed with
    an address, an Affine, a body or programs is walked (a new such field is too), and so
    every field alike lets differ as an address."""
    from npusim.isa import program

    records = [c for c in vars(program).values() if isinstance(c, type) and attrs.has(c) and c is not program.Affine]
    for cls in records:
        table = rewrite.record_fields(cls)
        assert [name for name, _ in table.every] == [f.name for f in attrs.fields(cls)]
        for f in attrs.fields(cls):
            may_hold = any(w in str(f.type) for w in ("Addr", "Affine", "Program")) or str(f.type) == "tuple"
            assert (f.name in table.walked) == may_hold, (cls.__name__, f.name, f.type)
        assert {name for name, address in table.every if address} <= set(table.walked), cls.__name__
    assert rewrite.record_fields(program.Copy).walked == ("src_addr", "dst_addr")
    assert rewrite.record_fields(program.SetFlag).walked == ()
    assert dict(rewrite.record_fields(program.VecOp).every)["scalar"] is False  # may hold an Affine, not an address


def test_a_probe_is_not_made_when_the_longest_block_leaves_nothing_to_gain():
    """An embedding of 131,072 tokens: 47 blocks iterate 124 times, the last 70; the waves
    are the shortest block's, and a run keeping n of them keeps n + 54 in the others, so
    no probe and measuring run can cost little enough: priced in full without a run."""
    from npusim.engine.fastforward_rewrite import repeat_loops

    kernel = lower("embedding", {"tokens": 131072, "vocab": 64000, "hidden": 4096, "dtype": "fp16"}, HW).kernels[0]
    counts = {loop.count for found in repeat_loops(kernel).values() for _, loop in found}
    assert ff.waves(kernel) == min(counts) and max(counts) - min(counts) > ff.waves(kernel) / 2
    assert ff.worth_trying(kernel, HW)  # the first look sees only the shortest block
    runs = []
    assert ff.price(kernel, HW, None, lambda *a: runs.append(a)) is None and runs == []



def test_a_probe_is_not_made_when_most_of_a_block_runs_outside_its_repeat_loop():
    """A causal FlashAttention whose heads are split over the cores (8 heads, 12,288 tokens
    on a 24-core device: every block in one wave) repeats its longest q tile's key steps,
    and its other q tiles' steps are most of the kernel: every run would keep them, so no
    run can cost little enough (the 32,768-token one ran 72% of itself for nothing before
    being simulated in full). Priced in full without a run."""
    kernel = lower("flash_attention", dict(batch=1, heads=8, kv_heads=8, seq_q=12288, seq_kv=12288, causal=True,
                                           head_dim=128), HW).kernels[0]
    assert kernel.block_dim <= rewrite.cores_of(kernel, HW) and ff.worth_trying(kernel, HW)
    assert ff.outside_waves(kernel) > ff.waves(kernel)
    runs = []
    assert ff.price(kernel, HW, None, lambda *a: runs.append(a)) is None and runs == []
    gemm = lower(*CASES[0], HW).kernels[0]
    assert ff.outside_waves(gemm) == 0  # a GEMM's partial first and last rows: FF_HEAD_TAIL_WAVES

@pytest.mark.parametrize("jitter", [0.0, 0.1])
def test_no_second_measuring_run_when_the_first_ones_waves_jitter_too_much(jitter):
    """No steady state after the first L2 fill: the next measuring run is made only if its
    mean wave, jittering as the first run's waves did, could price the waves it leaves out
    within FF_TOLERANCE; waves 10% apart cannot (a trend alone leaves the run to be made)."""
    from npusim.engine.stats import KernelStats

    c, first = 400, 20
    wave_lines = HW.l2.l2_bytes / first  # new lines a wave brings: the first fill at wave 20

    def duration(i: int) -> float:  # a trend (not steady) and, if asked, every other wave 10% longer
        return (1000.0 + 10.0 * i) * (1 + jitter * (i % 2))

    def snapshots(n: int, _marks, kept: int) -> list[KernelStats]:
        at, t = [], 0.0
        for i in range(kept):
            t += duration(i)
            at.append(KernelStats(cycles=t, l2_miss_bytes=wave_lines * (i + 1), hbm_read_bytes=1.0 + i,
                                  l2_hit_bytes=1.0 + i))
        return at

    runs = []

    def simulate(kept, on_device, mark):
        runs.append(kept)
        return KernelStats(cycles=1.0), kept, None

    out = ff.measure(None, HW, None, simulate, c, lambda n: n, "m", lambda marks, n: snapshots(n, marks, n))
    assert out is None  # never steady: a trend
    assert len(runs) == (2 if jitter else 3), runs
