"""The runtime: the layer memo against the full simulation, the memory check, the
weight-read floor, the run / compare / validate commands and the JSON contract."""

from __future__ import annotations

import json

import attrs
import pytest

from npusim.cli import main
from npusim.graph import build_decoder
from npusim.hw import load_hw
from npusim.passes import apply
from npusim.report.step import floor_of, floor_weight_bytes, step_json
from npusim.runtime import LoweringCache, OutOfMemoryError, place, run_graph
from npusim.runtime.compile import kernel_name, lower_node, tilings_of, tilings_pinned
from npusim.runtime.decoder import run_decoder
from npusim.workload import load_workload

HW = load_hw("ascend910b2")
FOUR_LAYERS = attrs.evolve(load_workload("k3-tiny"), layers=4)
SIX_LAYERS = attrs.evolve(load_workload("k3-tiny"), layers=6)


@pytest.mark.parametrize("workload", [FOUR_LAYERS, SIX_LAYERS], ids=["4 layers", "6 layers"])
@pytest.mark.parametrize("phase, lengths", [("decode", 64), ("decode", [64, 30]), ("prefill", 32)])
@pytest.mark.parametrize("passes", ["baseline", "optimized", "fusion,sync,streams"])
def test_layer_memo_matches_the_full_simulation(workload, phase, lengths, passes):
    g = apply(build_decoder(workload, phase, 2, lengths), passes)
    memo, full = run_graph(g, HW, memo=True), run_graph(g, HW, memo=False)
    assert memo.memo and not full.memo
    m, f = memo.result, full.result
    print(f"\n{workload.layers} layers {phase} {passes}: memo {m.us:.2f} us vs full {f.us:.2f} us "
          f"({m.us / f.us - 1:+.3%}); HBM {m.stats.hbm_read_bytes:.0f} vs {f.stats.hbm_read_bytes:.0f}")
    assert m.cycles == pytest.approx(f.cycles, rel=0.01)
    for what in ("gm_read_bytes", "gm_write_bytes", "flops", "dma_segments"):
        assert getattr(m.stats, what) == pytest.approx(getattr(f.stats, what), rel=0.01), what
    # HBM bytes depend on what the L2 holds when a replicated layer would have run: on these
    # few-MB steps a layer's activations hit or miss differently, ~1% of the total
    for what in ("hbm_read_bytes", "hbm_write_bytes"):
        assert getattr(m.stats, what) == pytest.approx(getattr(f.stats, what), rel=0.05), what
    assert m.host_launch_cycles == pytest.approx(f.host_launch_cycles, rel=0.01)
    assert m.host_wait_cycles == pytest.approx(f.host_wait_cycles, rel=0.01, abs=HW.cycles(1e-6))
    assert sorted(r.name for r in m.kernels) == sorted(r.name for r in f.kernels)


@pytest.mark.parametrize("passes", ["sync,launch,streams", "optimized"])
def test_memo_matches_at_k3_shapes(passes):
    """Four K3-sized layers: split-K GEMVs (a zero-fill kernel before each), real
    weights that miss in the L2, two streams."""
    k3 = attrs.evolve(load_workload("k3"), layers=4)
    g = apply(build_decoder(k3, "decode", 1, 512), passes)
    m, f = run_graph(g, HW, memo=True).result, run_graph(g, HW, memo=False).result
    print(f"\nk3 x 4 layers decode {passes}: memo {m.us:.1f} us vs full {f.us:.1f} us ({m.us / f.us - 1:+.3%}), "
          f"HBM read {m.stats.hbm_read_bytes / 1e9:.3f} vs {f.stats.hbm_read_bytes / 1e9:.3f} GB")
    assert m.cycles == pytest.approx(f.cycles, rel=0.01)
    assert m.stats.hbm_read_bytes == pytest.approx(f.stats.hbm_read_bytes, rel=0.01)


@pytest.mark.parametrize("memo", [True, False], ids=["memo", "full"])
def test_every_kernel_record_names_its_node_and_layer(memo):
    """The owner a record carries is the node it was launched for - replicated layers
    too - and its name is made from it, never parsed from it."""
    g = apply(build_decoder(SIX_LAYERS, "decode", 2, 64), "optimized")
    run = run_graph(g, HW, memo=memo)
    assert run.memo == memo
    nodes = {n.name: n for n in g.nodes}
    compiled = {c.node.name: c for c in run.compiled}
    seen = set()
    for r in run.result.kernels:
        node = run.node(r)
        assert node is nodes[r.owner.node] and r.owner.layer == node.layer
        c = compiled[run.pattern.get(node.name, node.name)]
        own = c.lowered.kernels[r.owner.index].name
        assert r.name == kernel_name(node.name, own, len(c.kernels) > 1)
        assert run.kernel(r).op_type == r.op_type
        seen.add(node.name)
    assert seen == {n.name for n in g.nodes}  # every node of every layer ran (or was replicated)
    assert sorted({r.owner.layer for r in run.result.kernels} - {None}) == list(range(6))
    if memo:  # layers 2 .. 4 were replicated from layer 1
        assert {nodes[n].layer for n in run.pattern} == {2, 3, 4}
        assert all(nodes[p].layer == 1 for p in run.pattern.values())


def test_the_kernel_of_a_record_is_the_one_the_run_lowered_at_its_addresses():
    g = apply(build_decoder(SIX_LAYERS, "decode", 2, 64), "optimized")
    run = run_graph(g, HW)
    addresses = place(g, HW.hbm.hbm_bytes).addresses
    for r in run.result.kernels:
        if r.owner.node in run.pattern:
            continue
        node = run.node(r)
        bound = {local: addresses[t] for local, t in (node.inputs | node.outputs).items()}
        gm = {t.name: t.addr for t in run.kernel(r).gm if t.name in bound}
        assert gm and all(gm[k] == bound[k] for k in gm), r.name


def test_lowering_cache_is_keyed_by_config_value_and_bounded():
    g = apply(build_decoder(FOUR_LAYERS, "decode", 2, 64), "optimized")
    cache = LoweringCache(max_entries=10_000)
    a = run_graph(g, HW, cache=cache)
    filled = len(cache)
    assert 0 < filled <= len(a.compiled)  # (nodes lowering alike at the same addresses share an entry)
    b = run_graph(g, load_hw("ascend910b2"), cache=cache)  # an equal config, another object: all hits
    assert len(cache) == filled
    assert all(x.lowered is y.lowered for x, y in zip(a.compiled, b.compiled))
    assert b.result.cycles == a.result.cycles
    other = load_hw("ascend910b2", {"chip.aic_count": 20})
    run_graph(g, other, cache=cache)  # another config: lowered again
    assert len(cache) == 2 * filled
    small = LoweringCache(max_entries=3)
    c = run_graph(g, HW, cache=small)
    assert len(small) == 3 and c.result.cycles == a.result.cycles
    with pytest.raises(ValueError):
        LoweringCache(max_entries=0)


def test_a_run_without_a_cache_lowers_alike_nodes_once_with_the_same_result(monkeypatch):
    """run_graph with no cache keeps one of its own: nodes with equal parameters at equal
    addresses share a lowering, and the step is the one lowering every node afresh gives."""
    g = apply(build_decoder(FOUR_LAYERS, "prefill", 2, 64), "optimized")
    shared = run_graph(g, HW)
    assert len({id(c.lowered) for c in shared.compiled}) < len(shared.compiled)
    monkeypatch.setattr(LoweringCache, "lower", lambda self, *a: lower_node(*a))  # every node afresh
    afresh = run_graph(g, HW)
    assert len({id(c.lowered) for c in afresh.compiled}) == len(afresh.compiled)
    assert [(r.name, r.start, r.end, r.stats) for r in shared.result.kernels] == \
        [(r.name, r.start, r.end, r.stats) for r in afresh.result.kernels]


def test_pinned_tilings_lower_the_kernels_that_ran_on_another_config():
    """tilings_pinned: a step run again on a config where the chooser picks otherwise
    lowers each node with the tiling it ran with (npusim calibrate times profiles so)."""
    g = apply(build_decoder(FOUR_LAYERS, "decode", 2, 64), "optimized")
    ran = run_graph(g, HW)
    tilings = tilings_of(ran.compiled)
    assert tilings and all(isinstance(v, dict) for v in tilings.values())
    other = load_hw("ascend910b2", {"hbm.bw_efficiency": 0.3})  # the chooser weighs loads otherwise
    assert tilings_of(run_graph(g, other).compiled) != tilings
    cache = LoweringCache()
    with tilings_pinned(tilings):
        again = run_graph(g, other, cache=cache)
    assert tilings_of(again.compiled) == tilings
    assert tilings_of(run_graph(g, other, cache=cache).compiled) != tilings  # the pin is part of the cache key


def test_same_input_same_output():
    a = step_json(run_decoder(SIX_LAYERS, HW, "decode", 2, [64, 40], "optimized"))
    b = step_json(run_decoder(SIX_LAYERS, HW, "decode", 2, [64, 40], "optimized"))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_k3_that_does_not_fit_says_what_would():
    with pytest.raises(OutOfMemoryError) as e:
        run_decoder("k3", HW, "decode", batch=32, context=8192, passes="optimized")
    msg = str(e.value)
    print("\n" + msg)
    assert "\n" not in msg
    assert "KV cache 128.00 GiB" in msg and "weights 11.16 GiB" in msg and "of 64.00 GiB" in msg
    best = int(msg.split("largest batch that fits at context 8192 is ")[1].split(",")[0])
    # weights 11.16 GiB + 0.5 MiB of KV per token: 13 x 8192 tokens = 52 GiB fits, 14 x = 56 does not
    assert best == 13


@pytest.mark.parametrize("passes", ["baseline", "optimized"])
def test_decode_is_never_below_the_weight_read_floor(passes):
    run = run_decoder(SIX_LAYERS, HW, "decode", 1, 64, passes)
    f = floor_of(run)
    print(f"\n{passes}: {f.latency_us:.1f} us = {f.ratio:.2f} x floor {f.floor_us:.2f} us "
          f"(+ other HBM {f.other_hbm_us:.2f}, idle {f.idle_us:.1f}, kernels {f.kernel_excess_us:.1f})")
    assert run.latency_us >= f.floor_us
    embed = run.graph.tensors["embed"].nbytes  # gathered from, not read in full
    assert HW.us(floor_weight_bytes(run.graph) / HW.hbm_bytes_per_cycle) == pytest.approx(f.floor_us)
    assert floor_weight_bytes(run.graph) == run.memory.weights_bytes - embed or SIX_LAYERS.tie_embeddings
    assert f.floor_us + f.other_hbm_us + f.idle_us + f.kernel_excess_us == pytest.approx(run.latency_us)


# ---------------------------------------------------------------- the CLI


def test_run_prints_the_summary_and_writes_the_contract(capsys, tmp_path):
    out = tmp_path / "run.json"
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for word in ("latency", "tokens/s", "HBM traffic", "L2 hit rate", "peak memory", "kernels", "host",
                 "weight floor", "top op types"):
        assert word in text
    data = json.loads(out.read_text())
    for key in ("latency_us", "tokens_per_s", "hbm_read_bytes", "hbm_write_bytes", "l2_hit_rate",
                "peak_memory_bytes", "kernel_count", "host_launch_us", "host_wait_us", "ops", "by_type"):
        assert key in data, key
    for key in ("name", "type", "core_type", "block_dim", "start_us", "duration_us", "flops", "gm_bytes", "bound"):
        assert key in data["ops"][0], key
    assert data["kernel_count"] == len(data["ops"])
    assert sum(v["count"] for v in data["by_type"].values()) == data["kernel_count"]


def test_run_writes_tables_and_a_trace_at_the_level_asked(capsys, tmp_path):
    argv = ["run", "--workload", "k3-tiny", "--batch", "2", "--context", "300,97", "--passes", "optimized,buckets",
            "--margin", "16", "--profile", str(tmp_path), "--trace", str(tmp_path / "t.json"), "--trace-level", "block"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "context 512 for lengths 97..300" in text and "OP Type" in text
    assert (tmp_path / "op_summary.csv").exists() and (tmp_path / "op_statistic.csv").exists()
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "block" for e in trace)
    assert any(e.get("name") == "memory in use GiB" for e in trace)


def test_run_takes_a_fusion_rules_file(capsys, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("flash_attention: off\n")
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--fusion-rules", str(rules)]) == 0
    text = capsys.readouterr().out
    assert "kv_layout (skipped" in text and "softmax" in text


def test_compare_shows_each_pass(capsys):
    assert main(["compare", "--workload", "k3-tiny", "--batch", "2", "--context", "64"]) == 0
    text = capsys.readouterr().out
    print(text)
    for name in ("baseline", "optimized", "+ fusion", "+ layout", "+ kv_layout", "+ sync", "+ launch",
                 "+ streams", "+ memplan"):
        assert name in text


def test_validate_command(capsys):
    assert main(["validate", "--workload", "k3-tiny", "--passes", "optimized"]) == 0
    assert "PASSED" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["run", "--workload", "k3-tiny", "--passes", "fusoin"], "unknown pass or pipeline 'fusoin'"),
    (["run", "--workload", "nope"], "nope"),
    (["run", "--workload", "k3-tiny", "--context", "64,x"], "--context"),
    (["run", "--workload", "k3-tiny", "--passes", "optimized,buckets", "--buckets", "512,x"], "--buckets"),
    (["run", "--workload", "k3-tiny", "--batch", "2", "--context", "9999"], "exceeds"),
    (["run", "--workload", "k3", "--batch", "32", "--context", "8192"], "largest batch that fits"),
])
def test_bad_input_is_one_line(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def _tracks(result) -> dict[tuple[str, int], tuple[int, float]]:
    """Trace track (process name, thread) -> (spans on it, when its last span ends, µs)."""
    from npusim.report import chrome_trace
    events = chrome_trace(result)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    spans: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X":
            spans.setdefault((names[e["pid"]], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for track, ss in spans.items():  # spans on one track nest: each is disjoint from or inside an open one
        open_ends: list[float] = []
        for start, end in sorted(ss, key=lambda x: (x[0], -x[1])):
            while open_ends and open_ends[-1] <= start + 1e-6:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-6, track
            open_ends.append(end)
    return {track: (len(ss), max(end for _, end in ss)) for track, ss in spans.items()}


@pytest.mark.parametrize("passes", ["baseline", "optimized", "fusion,sync,streams"])
def test_memoised_trace_is_the_whole_timeline(passes):
    """Replicated layers and replayed kernels have their spans on every track (host,
    streams, kernels, cores), at their times: the trace ends at the step's latency
    and matches the full simulation's track by track."""
    g = apply(build_decoder(SIX_LAYERS, "decode", 2, 64), passes)
    memo, full = run_graph(g, HW, memo=True, trace="block"), run_graph(g, HW, memo=False, trace="block")
    assert memo.memo
    m, f = _tracks(memo.result), _tracks(full.result)
    assert set(m) == set(f)
    latency = memo.result.us
    assert max(end for _, end in m.values()) == pytest.approx(latency, rel=1e-9)
    assert m[("host", 0)][1] == pytest.approx(latency, rel=1e-9)
    for track in f:
        assert m[track][0] == f[track][0], track
        assert m[track][1] == pytest.approx(f[track][1], rel=0.01, abs=0.01 * full.result.us), track


def test_memoised_instruction_trace_fills_the_copies():
    """At instruction level each replicated or replayed kernel has its source's
    instructions moved to its start (Trace.intervals_of), kept once: the trace's own
    intervals are the simulated kernels' only."""
    g = apply(build_decoder(FOUR_LAYERS, "decode", 1, 64), "optimized")
    memo, full = run_graph(g, HW, memo=True, trace="instr"), run_graph(g, HW, memo=False, trace="instr")
    trace, f = memo.result.trace, full.result.trace.intervals
    stored = {i[5] for i in trace.intervals}
    assert stored.isdisjoint(trace.copies) and set(trace.copies) | stored == {r.id for r in memo.result.kernels}
    assert {source for source, _ in trace.copies.values()} <= stored
    m = [iv for r in memo.result.kernels for iv in trace.intervals_of(r.id)]
    assert len(m) == pytest.approx(len(f), rel=0.01)
    assert max(i[4] for i in m) == pytest.approx(max(i[4] for i in f), rel=0.01)
    for r in memo.result.kernels:  # each kernel's instructions lie inside its own span
        mine = trace.intervals_of(r.id)
        assert mine and min(i[3] for i in mine) >= r.start - 1e-6 and max(i[4] for i in mine) <= r.end + 1e-6, r.name
