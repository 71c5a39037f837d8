"""Several devices: the topology in the config, collectives on the engine (closed
forms, HBM sharing, Mesh vs Ring), tensor-parallel runs (symmetric vs every rank,
the layer memo, memory per device) and sharded numerics."""

from __future__ import annotations

import math
import re

import attrs
import pytest

from npusim.engine import Launch, Synchronize, run
from npusim.engine.cycles import whole_cycles
from npusim.engine.links import HCCS, LinkTransfer
from npusim.errors import ConfigError
from npusim.graph import build_decoder
from npusim.hw import load_hw
from npusim.hw.config import Topology
from npusim.hw.load import find_file
from npusim.ops import OPS, lower
from npusim.ops.collectives.simulate import simulate_collective
from npusim.parallel.breakdown import comm_breakdown
from npusim.parallel.numerics import check_sharded
from npusim.parallel.pipeline import run_pipeline
from npusim.parallel.plan import device_weight_bytes, devices_to_fit
from npusim.parallel.ranks import every_rank_cycles
from npusim.passes import apply
from npusim.runtime.decoder import run_decoder
from npusim.runtime.memory import OutOfMemoryError, place
from npusim.runtime.run import run_graph
from npusim.workload import load_workload

HW = load_hw()
TINY = load_workload("k3-tiny")


def test_every_topology_field_has_help_and_a_source():
    text = find_file("ascend910b2", "hwconfigs").read_text()
    block = text[text.index("\ntopology:"):text.index("\nruntime:")]
    for f in attrs.fields(Topology):
        assert f.metadata["help"], f.name
        line = re.search(rf"^\s+{f.name}:.*$", block, re.M)
        assert line and "#" in line[0], f"topology.{f.name} has no source comment"


def test_link_bandwidth_is_a_normal_field():
    fast = load_hw(overrides={"topology.link_bw_bytes_per_s": "1.12e11"})
    assert fast.topology.link_bw_bytes_per_s == 1.12e11
    slow, quick = (simulate_collective("all_gather", 64 << 20, 8, h, "mesh") for h in (HW, fast))
    assert quick.us < 0.9 * slow.us
    # at twice the link rate 7 links in and out need more than the sustained HBM bandwidth:
    # the transfer is HBM bound (it reads what it sends and writes what it receives)
    step = next(r for r in quick.result.kernels if r.core_type == HCCS)
    hbm = fast.hbm.peak_bw_bytes_per_s * fast.hbm.bw_efficiency
    alpha_us = fast.topology.link_latency_us
    assert fast.us(step.cycles) == pytest.approx(alpha_us + 2 * 7 * (8 << 20) / hbm * 1e6, rel=0.01)


def test_a_transfer_step_takes_alpha_plus_bytes_over_a_link():
    """Closed form: alone, one mesh step to 7 peers is its start-up plus its bytes at one
    link's rate (each peer has its own link; HBM is not the bottleneck at 7 x 56 GB/s x 2)."""
    n = 32 << 20
    t = LinkTransfer("send", "all_gather", n, tuple(range(1, 8)), 8)
    res = run([t, Synchronize()], HW)
    rec = res.kernels[0]
    assert rec.core_type == HCCS
    alpha = whole_cycles(HW.cycles(HW.topology.link_latency_us * 1e-6))
    link = HW.topology.link_bw_bytes_per_s / HW.chip.freq_hz
    assert rec.cycles == pytest.approx(alpha + n / link, abs=1)
    assert rec.stats.hbm_read_bytes == rec.stats.hbm_write_bytes == 7 * n
    assert "HCCS" in res.trace.counters


def test_a_transfer_shares_hbm_with_a_kernel():
    """A big copy kernel on another stream slows the transfer down, and the transfer the copy
    (the copy, at HBM speed, overlaps a twentieth of the HCCS-bound transfer: it loses more)."""
    n = 64 << 20
    copy = lower("copy", dict(n=n // 2), HW).kernels[0]
    t = LinkTransfer("send", "all_gather", n, tuple(range(1, 8)), 8, stream=1, mode="graph")
    alone_t = run([t, Synchronize()], HW).kernels[0].cycles
    alone_k = run([Launch(copy, 0, "graph"), Synchronize()], HW).kernels[0].cycles
    both = {r.core_type: r.cycles for r in run([Launch(copy, 0, "graph"), t, Synchronize()], HW).kernels}
    assert both[HCCS] > alone_t
    assert both["AIV"] > 1.05 * alone_k


@pytest.mark.parametrize("nbytes", [TINY.hidden_size * 2 * 2, 64 << 20], ids=["k3-tiny decode", "64MiB"])
def test_mesh_beats_ring_in_a_full_mesh(nbytes):
    mesh, ring = (simulate_collective("all_reduce", nbytes, 8, HW, algo) for algo in ("mesh", "ring"))
    assert mesh.algo == "mesh" and ring.algo == "ring"
    assert mesh.us < ring.us
    assert simulate_collective("all_reduce", nbytes, 8, HW).algo == "mesh"  # HCCL's choice in a full mesh


def test_ring_topology_picks_ring():
    ring_hw = load_hw(overrides={"topology.intra_node": "ring"})
    assert simulate_collective("all_reduce", 1 << 20, 8, ring_hw).algo == "ring"


def test_large_mesh_all_reduce_is_near_the_hccl_formula():
    """The simulated Mesh all_reduce at 1 GiB is within 25% of the user guide's alpha-beta-gamma
    cost (the kernel reads every chunk once where the formula counts pairwise adds)."""
    r = simulate_collective("all_reduce", 1 << 30, 8, HW, "mesh")
    assert r.us == pytest.approx(r.formula_us, rel=0.25)


@pytest.mark.parametrize("phase, passes", [("decode", "baseline"), ("decode", "optimized"),
                                           ("prefill", "optimized")])
def test_symmetric_matches_every_rank(phase, passes):
    g = apply(build_decoder(TINY, phase, 2, 64, tp=2), passes, hw=HW)
    one = run_graph(g, HW, memo=False).result.cycles
    ranks = every_rank_cycles(g, HW, 2)
    for c in ranks:
        assert c == pytest.approx(one, rel=0.01)


def test_layer_memo_with_collectives():
    four = attrs.evolve(TINY, layers=4)
    g = apply(build_decoder(four, "decode", 2, 64, tp=2), "optimized", hw=HW)
    m, f = run_graph(g, HW, memo=True), run_graph(g, HW, memo=False)
    assert m.memo
    assert m.result.cycles == pytest.approx(f.result.cycles, rel=0.01)
    names = sorted(r.name for r in m.result.kernels if r.core_type == HCCS)
    assert names == sorted(r.name for r in f.result.kernels if r.core_type == HCCS)


def test_breakdown_of_a_tp_step():
    run1 = run_decoder(TINY, HW, "decode", 1, 64, "optimized")
    run2 = run_decoder(TINY, HW, "decode", 1, 64, "optimized", tp=2)
    b1, b2 = comm_breakdown(run1), comm_breakdown(run2)
    assert b1.comm_us == 0 and b1.devices == 1
    assert b2.devices == 2 and 0 < b2.exposed_us <= b2.comm_us < b2.latency_us
    assert 0 < b2.link_utilisation < 1


def test_k3_out_of_memory_on_one_device_fits_at_tp4():
    k3 = load_workload("k3")
    with pytest.raises(OutOfMemoryError, match=r"fit on 4 devices \(--tp 4\)"):
        run_decoder(k3, HW, "decode", 32, 8192, "optimized")
    assert devices_to_fit(k3, 32, 8192, HW) == 4
    assert place(build_decoder(k3, "decode", 32, 8192, tp=4), HW.hbm.hbm_bytes).breakdown.fits
    assert not place(build_decoder(k3, "decode", 32, 8192, tp=2), HW.hbm.hbm_bytes).breakdown.fits


@pytest.mark.parametrize("phase, passes", [("decode", "baseline"), ("decode", "optimized"),
                                           ("prefill", "optimized")])
def test_sharded_numerics_match_the_reference(phase, passes):
    check = check_sharded(TINY, 2, passes, phase, 2, 32)
    assert check.ranks_agree and check.cosine >= 0.999, check.line()


@pytest.mark.parametrize("tp, sp, batch", [(1, 2, 2), (2, 4, 1)])
def test_sequence_parallel_numerics_match_the_reference(tp, sp, batch):
    check = check_sharded(TINY, tp, "baseline", "prefill", batch, 64, sp=sp)
    assert check.passed, check.line()


def test_sequence_parallel_numerics_refuse_fused_causal_attention():
    with pytest.raises(ConfigError, match="fused causal attention is aligned to the last part"):
        check_sharded(TINY, 1, "fusion", "prefill", 1, 64, sp=2)


def test_sequence_parallel_prefill_gathers_kv_every_layer():
    run = run_decoder(TINY, HW, "prefill", 1, 256, "optimized", sp=4)
    gathers = [n for n in run.graph.nodes if n.op_type == "all_gather"]
    assert len(gathers) == 2 * TINY.layers and all(n.args.devices == 4 for n in gathers)
    b = comm_breakdown(run)
    assert b.devices == 4 and b.comm_us > 0
    assert run.tokens == 256  # the group's tokens: throughput counts the whole prompt


def test_sharded_numerics_can_fail(monkeypatch):
    """An all_reduce that does not sum (each rank keeps its partial) is caught."""
    keep = attrs.evolve(OPS["all_reduce"], reference=lambda p, x, specs, ctx: {"y": x["x"]})
    monkeypatch.setitem(OPS, "all_reduce", keep)
    check = check_sharded(TINY, 2, "baseline", "decode", 2, 32)
    assert not check.passed and check.cosine < 0.999


def test_tp_does_not_change_the_single_device_graph():
    a, b = build_decoder(TINY, "decode", 2, 64), build_decoder(TINY, "decode", 2, 64, tp=1)
    assert [n.name for n in a.nodes] == [n.name for n in b.nodes] and a.tensors == b.tensors
    assert not any(n.op_type == "all_reduce" for n in a.nodes)
    assert math.isclose(run_graph(a, HW).latency_us, run_graph(b, HW).latency_us)


def test_pipeline_of_one_stage_is_the_plain_step():
    plain = run_decoder(TINY, HW, "decode", 4, 64, "optimized")
    one = run_pipeline(TINY, HW, "decode", 4, 64, pp=1)
    assert one.latency_us == pytest.approx(plain.latency_us) and one.bubble_fraction == 0


def test_pipeline_schedule_and_handover():
    """(microbatches + pp - 1) stage slots plus the hand-overs; a hand-over is one link step:
    its start-up plus a micro-batch's activations at one link's rate."""
    r = run_pipeline(TINY, HW, "decode", 8, 64, pp=2, microbatches=4)
    assert r.stage.graph.batch == 2 and r.stage.graph.workload.layers == TINY.layers // 2
    assert r.latency_us == pytest.approx(5 * r.stage_us + r.handover_us)
    assert r.bubble_fraction == pytest.approx(1 / 5)
    nbytes = 2 * TINY.hidden_size * 2
    alpha = whole_cycles(HW.cycles(HW.topology.link_latency_us * 1e-6))
    assert HW.cycles(r.handover_us * 1e-6) == pytest.approx(alpha + nbytes / (HW.topology.link_bw_bytes_per_s
                                                                                / HW.chip.freq_hz), abs=1)
    # two stages of 8 cards each: the hand-over crosses nodes, over the slower NIC
    wide = attrs.evolve(TINY, heads=8, kv_heads=8, head_dim=32)
    assert run_pipeline(wide, HW, "decode", 8, 64, pp=2, tp=8).handover_us > r.handover_us


def test_op_command_prints_like_hccl_test(capsys, tmp_path):
    from npusim.cli import main

    out = tmp_path / "ar.json"
    assert main(["op", "all_reduce", "bytes=1KiB..4KiB", "devices=8", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "algorithm mesh" in lines[0] and "alg_bw(GB/s)" in lines[1]
    assert [int(line.split()[0]) for line in lines[2:-1]] == [1024, 2048, 4096]
    assert lines[-1] == f"wrote {out}"  # after hccl_test's table, the line naming the JSON
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [r["data_size_bytes"] for r in rows] == [1024, 2048, 4096]
    # hccl_test's GB: 2**30 bytes
    assert all(r["alg_bw_gb_s"] == pytest.approx(r["data_size_bytes"] / (r["latency_us"] * 1e-6) / 2**30)
               for r in rows)


def test_send_recv_is_one_step_to_the_next_rank():
    """send_recv: the whole buffer over one link (the NIC when the group spans nodes):
    alpha + n beta, nothing reduced; rank r receives rank r-1's buffer."""
    from npusim.ops.collectives.simulate import simulate_collective

    n = 1 << 24
    inside = simulate_collective("send_recv", n, 8, HW)
    across = simulate_collective("send_recv", n, 2 * HW.topology.node_device_count, HW)
    topo = HW.topology
    assert inside.algo == "p2p" and inside.us == pytest.approx(topo.link_latency_us + n / topo.link_bw_bytes_per_s
                                                              * 1e6, rel=0.01)
    assert across.us == pytest.approx(topo.nic_latency_us + n / topo.nic_bw_bytes_per_s * 1e6, rel=0.01)
    assert inside.busbw_gb_s == inside.algbw_gb_s


def test_devices_to_fit_takes_the_step_weights():
    """An INT8 step's hint counts its own weights: k3 at batch 14 x 8192 needs two FP16
    devices, but one device holds it with one byte per parameter."""
    w, hw = load_workload("k3"), load_hw("ascend910b2")
    assert devices_to_fit(w, 14, 8192, hw) == 2
    assert devices_to_fit(w, 14, 8192, hw, lambda tp: device_weight_bytes(w, tp) // w.dtype_bytes) == 1


@pytest.mark.parametrize("tp, sp", [(2, 1), (1, 2)])
def test_the_buckets_pass_rebuilds_the_same_shard(tp, sp):
    """buckets rebuilds the graph at the bucket's length: one device's shard still, with
    its collectives (it rebuilt the unsharded graph, so a TP step with buckets ran alone)."""
    from npusim.passes import apply

    g = build_decoder("k3-tiny", "prefill" if sp > 1 else "decode", 2, 300, tp=tp, sp=sp)
    bucketed = apply(g, "buckets")
    assert (bucketed.tp, bucketed.sp) == (tp, sp) and bucketed.context > g.context
    collectives = {n.op_type for n in bucketed.nodes} & set(OPS) - {n.op_type for n in build_decoder(
        "k3-tiny", g.phase, 2, 300).nodes}
    assert collectives and collectives == {n.op_type for n in g.nodes} - {n.op_type for n in build_decoder(
        "k3-tiny", g.phase, 2, 300).nodes}
