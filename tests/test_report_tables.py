"""Profile tables (msprof's columns), stall breakdowns and Chrome traces."""

from __future__ import annotations

import csv
import json
from collections import defaultdict

import pytest

from npusim.hw import load_hw
from npusim.report import chrome_trace, memory_timeline
from npusim.report.tables import (
    NPUSIM_COLUMNS, STATISTIC_COLUMNS, SUMMARY_COLUMNS, stalls, statistic_table, write_tables,
)
from npusim.runtime.decoder import run_decoder
from trace_check import check_trace

HW = load_hw("ascend910b2")


@pytest.fixture(scope="module", params=["baseline", "optimized"])
def step(request):
    return run_decoder("k3-tiny", HW, "decode", 2, [64, 40], request.param, trace="instr", memo=False)


def _read(path):
    with open(path, newline="") as f:
        r = csv.reader(f)
        header = next(r)
        return header, [dict(zip(header, row)) for row in r]


def test_csv_headers_and_totals(step, tmp_path):
    summary, statistic = write_tables(step.result, tmp_path, step.graph)
    header, rows = _read(summary)
    assert tuple(header[:len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS
    assert tuple(header[len(SUMMARY_COLUMNS):len(SUMMARY_COLUMNS) + len(NPUSIM_COLUMNS)]) == NPUSIM_COLUMNS
    assert len(rows) == len(step.result.kernels)
    s_header, s_rows = _read(statistic)
    assert tuple(s_header) == STATISTIC_COLUMNS
    by_type = defaultdict(lambda: [0, 0.0])
    for r in rows:
        by_type[(r["OP Type"], r["Task Type"])][0] += 1
        by_type[(r["OP Type"], r["Task Type"])][1] += float(r["Task Duration(us)"])
    for r in s_rows:
        count, total = by_type[(r["OP Type"], r["Core Type"])]
        assert int(r["Count"]) == count
        assert float(r["Total Time(us)"]) == pytest.approx(total, rel=1e-4)
    assert sum(float(r["Ratio(%)"]) for r in s_rows) == pytest.approx(100, abs=0.01)
    matmul = next(r for r in rows if r["OP Type"] == "matmul")
    assert matmul["Task Type"] == "AI_CORE" and float(matmul["aic_cube_ratio"]) > 0
    assert matmul["Input Shapes"].count(";") >= 1 and "DT_FLOAT16" in matmul["Input Data Types"]
    print("\n" + statistic_table(step.result))


def test_stall_breakdowns_sum_to_100(step):
    for k in step.result.kernels:
        for st in stalls(k.stats):
            parts = (st.work, st.data, st.flag, st.idle)
            assert sum(parts) == pytest.approx(100)
            assert all(p >= -1e-6 for p in parts), (k.name, st)
            # busy (the utilisation the text and the ratio columns show) = work + data wait
            assert st.busy == pytest.approx(100 * k.stats.utilisation(st.pipe), abs=1e-9), (k.name, st)
    assert any(st.flag > 0 for k in step.result.kernels for st in stalls(k.stats))


def test_trace_is_valid_and_has_flows_and_counters(step):
    trace = chrome_trace(step.result, memory_timeline(step))
    json.dumps(trace)
    check_trace(trace)
    phases = {e["ph"] for e in trace["traceEvents"]}
    assert {"X", "M", "C", "s", "f"} <= phases
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert "memory in use GiB" in names and "HBM GB/s" in names
    cats = {e["cat"] for e in trace["traceEvents"] if e["ph"] == "s"}
    assert cats == {"launch", "flag"}


def test_trace_level_sets_the_size():
    sizes = {}
    for level in ("kernel", "block", "instr"):
        run = run_decoder("k3-tiny", HW, "decode", 2, 64, "optimized", trace=level, memo=False)
        trace = chrome_trace(run.result)
        check_trace(trace)
        sizes[level] = len(json.dumps(trace))
    print(f"\ntrace bytes by level: {sizes}")
    assert sizes["kernel"] < sizes["block"] < sizes["instr"]


def test_k3_decode_trace_at_kernel_level_is_small():
    run = run_decoder("k3", HW, "decode", 8, 4096, "optimized", trace="kernel")
    size = len(json.dumps(chrome_trace(run.result, memory_timeline(run))))
    print(f"\nk3 decode step, kernel-level trace: {size / 1e6:.2f} MB")
    assert size < 20e6


def test_a_memoised_trace_names_each_span_by_its_own_kernel():
    import attrs

    from npusim.workload import load_workload

    five = attrs.evolve(load_workload("k3-tiny"), layers=5)
    run = run_decoder(five, HW, "decode", 2, 64, "optimized", trace="block")
    assert run.memo
    names = {k.id: k.name for k in run.result.kernels}
    assert len(names) == len(run.result.kernels)  # ids stay unique
    for core, kernel, block, start, end, kid in run.result.trace.block_spans:
        assert names[kid] == kernel


def test_a_memoised_layer_adds_its_spans_to_an_instruction_trace_not_its_instructions():
    """Issue 35, finding 17: an instruction trace of a memoised step held every copied
    layer's instructions again (K3, batch 8 at 4096 tokens: 1.48 GB of trace and 9.3 GB
    of memory, from 0.13 GB). A copied layer adds its kernel and block spans, as at block
    level; its instructions are its pattern's, stored and written once."""
    import attrs

    from npusim.workload import load_workload

    size, stored = {}, {}
    for layers in (4, 8):
        workload = attrs.evolve(load_workload("k3-tiny"), layers=layers)
        for level in ("block", "instr"):
            run = run_decoder(workload, HW, "decode", 2, 64, "optimized", trace=level)
            assert run.memo
            trace = chrome_trace(run.result)
            check_trace(trace)
            size[level, layers] = len(json.dumps(trace))
        stored[layers] = len(run.result.trace.intervals)
        kernels = len(run.result.kernels)
    grew = {level: size[level, 8] - size[level, 4] for level in ("block", "instr")}
    print(f"\nk3-tiny, 4 more layers: {grew['block']:,} more bytes at block level, {grew['instr']:,} at instr level")
    assert stored[8] == stored[4]  # the same kernels simulated
    assert 0 < grew["instr"] < 2 * grew["block"]  # their block spans and a note on each (copying them: 16x)
    assert size["instr", 8] < 5 * size["block", 8]
    assert size["instr", 8] / kernels < 20_000  # bytes per kernel: 12,000 (copying them: 44,000)


@pytest.mark.parametrize("passes", ["optimized", "fusion,sync,streams"])
def test_a_memoised_trace_runs_a_stream_one_item_at_a_time(passes):
    """Issue 35, finding 18: on K3-sized layers a copied layer's first wait began before
    the copy before it had ended on its stream (in the pattern it began when layer 0,
    which runs differently, ended), and every copy's waits and records were named after
    layer 1. A stream's spans follow one another, named as the full simulation names them."""
    import attrs

    from npusim.workload import load_workload

    k3 = attrs.evolve(load_workload("k3"), layers=5)
    memo, full = (run_decoder(k3, HW, "decode", 8, 8192, passes, memo=m, counters=False) for m in (True, False))
    assert memo.memo
    trace = chrome_trace(memo.result)
    check_trace(trace)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    streams = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and names[e["pid"]].startswith("stream "):
            streams[e["pid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    assert len(streams) == 2
    for spans in streams.values():
        spans.sort(key=lambda s: (s[0], s[1]))
        for before, after in zip(spans, spans[1:]):
            assert after[0] >= before[1] - 1e-6, (before, after)
    full_names = sorted(e["name"] for e in chrome_trace(full.result)["traceEvents"] if e.get("cat") == "stream")
    assert sorted(s[2] for spans in streams.values() for s in spans) == full_names
    assert {"wait L2.qkv_proj", "wait L3.qkv_proj", "record L3.kv_cache_write"} <= set(full_names)


def test_kernel_level_counters_keep_the_bytes_moved():
    """Averaging link samples over windows (kernel-level traces) moves no bytes in time
    by more than a window and keeps the total."""
    from npusim.report.trace import _averaged

    def moved(samples, upto):
        return sum(r * (min(n, upto) - c) for (c, r), (n, _) in zip(samples, samples[1:]) if c < upto)

    samples = [(0.0, 2.0), (3.5, 0.0), (10.0, 5.0), (10.5, 1.0), (31.0, 0.0)]
    out = _averaged(samples, 4.0)
    assert moved(out, 31.0) == pytest.approx(moved(samples, 31.0))
    for t in (4.0, 8.0, 12.0, 24.0):
        assert moved(out, t) == pytest.approx(moved(samples, t))  # equal at every window edge
    assert all(a[0] < b[0] for a, b in zip(out, out[1:]))
