"""Prefill/decode disaggregation (serving.disagg): decode instances that only decode
lower TPOT P99 under prefill-heavy load; each prompt's KV cache is priced on the
engine's links and counted in TTFT; `--pd` compares with colocated serving on the
same cards; a split that does not fit is one line."""

import json

import attrs
import pytest

from npusim.cli import main
from npusim.engine.host import Synchronize
from npusim.engine.links import LinkTransfer
from npusim.engine.run import run
from npusim.serving import StepCost, metrics, synthetic
from npusim.serving.disagg import KvTransfer
from npusim.serving.routers import make_router
from npusim.serving.service import HostConfig, SchedulerConfig, ServiceConfig, Slo
from npusim.serving.simulate import serve

PASSES = "optimized,buckets"
_points: dict = {}
HOST = HostConfig(preprocess_on="pool", pool_threads=4, tokenize_us=1000.0, postprocess_us_per_token=20.0,
                  step_overhead_us=200.0)


def cost(hw="ascend910b2", tp=1, max_batch=32) -> StepCost:
    """A fresh k3-tiny model that reuses the engine points earlier tests simulated."""
    sc = StepCost("k3-tiny", hw, PASSES, max_batch=max_batch, tp=tp)
    sc.points = _points.setdefault((tp, max_batch), {})
    return sc


def service(kind="continuous", max_batch=32, token_budget=512) -> ServiceConfig:
    return ServiceConfig("test", SchedulerConfig(kind, max_batch=max_batch, token_budget=token_budget), PASSES,
                         host=HOST, slo=Slo(ttft_ms=2000.0, tpot_ms=200.0), precompile=True)


def prefill_heavy(seed, rate=2000.0, n=300):
    """Long prompts, short outputs: a colocated replica stops its decodes for a prefill
    every few steps."""
    return synthetic(n, seed, "poisson", rate, prompt="uniform:300,480", output="fixed:16")


@pytest.mark.parametrize("seed", [1, 2])
def test_disaggregation_lowers_tpot_p99_under_prefill_heavy_load(seed):
    """Continuous batching: a colocated replica's decodes wait for each prefill step.
    (Chunked prefill hides those stalls in mixed steps; on k3-tiny disaggregation then
    does not lower TPOT: docs/serving.md.)"""
    reqs = prefill_heavy(seed)
    colocated = metrics(serve(reqs, service(), cost(), 4, "shortest-queue"))
    split = metrics(serve(reqs, service(), cost(), 4, "shortest-queue", (2, 2)))
    assert split["completed"] == colocated["completed"] == 300
    assert split["tpot"]["p99_ms"] < 0.85 * colocated["tpot"]["p99_ms"], (split["tpot"], colocated["tpot"])


@pytest.mark.parametrize("kind", ["continuous", "chunked"])
def test_decode_instances_only_decode_and_prefill_instances_only_prefill(kind):
    """A chunked scheduler's token budget above a full batch of prompts: no prompt is
    split in chunks (mixed steps take long to price)."""
    reqs = synthetic(300, 3, "poisson", 2000.0, prompt="uniform:100,120", output="fixed:16")
    run_ = serve(reqs, service(kind, token_budget=32 * 120), cost(), 4, "round-robin", (2, 2))
    roles = {r.index: r.role for r in run_.replicas}
    assert [r.role for r in run_.replicas] == ["prefill", "prefill", "decode", "decode"]
    assert [r.first_card for r in run_.replicas] == [0, 1, 2, 3]
    for st in run_.steps:
        if roles[st.replica] == "decode":
            assert st.prefill_tokens == 0 and st.decode_batch > 0
        else:
            assert st.decode_batch == 0 and st.prefill_tokens > 0
    assert all(s.status == "ok" and s.generated == 16 and len(s.token_us) == 16 for s in run_.seqs)
    assert sum(r.requests for r in run_.replicas if r.role == "prefill") == 300
    assert sum(r.requests for r in run_.replicas if r.role == "decode") == 300


def _engine_us(hw, nbytes, inter):
    step = run([LinkTransfer("kv_cache", "send_recv", nbytes, (1,), 2, inter, 0, "graph"), Synchronize()], hw)
    return hw.us(step.kernels[0].cycles)


def test_the_kv_transfer_is_priced_on_the_links_and_counted_in_ttft():
    """Each prompt's KV cache: one card's share (its K/V heads) as a send_recv on the
    engine, HCCS inside a node and the NIC between nodes; its first token arrives with it."""
    sc = cost()
    reqs = prefill_heavy(4, rate=200.0, n=40)
    hw = sc.hw
    split = serve(reqs, service(), sc, 2, "round-robin", (1, 1))
    per_token = sc.workload.kv_bytes_per_token
    for s in split.seqs:
        assert s.kv_transfer_us == pytest.approx(_engine_us(hw, s.prompt * per_token, False))
    # two nodes of one card: the decode instance is on the other node, the KV cache goes over the NIC
    one_per_node = attrs.evolve(hw, topology=attrs.evolve(hw.topology, node_device_count=1))
    far = serve(reqs, service(), cost(one_per_node), 2, "round-robin", (1, 1))
    for near_s, far_s in zip(split.seqs, far.seqs):
        assert far_s.kv_transfer_us == pytest.approx(_engine_us(hw, near_s.prompt * per_token, True))
        assert far_s.kv_transfer_us > near_s.kv_transfer_us
        # the same prefill; the first token later by the difference of the transfers
        assert far_s.token_us[0] - near_s.token_us[0] == pytest.approx(far_s.kv_transfer_us - near_s.kv_transfer_us)
    tp2 = KvTransfer(cost(tp=2))  # each of a tp-2 instance's cards sends half of a token's KV
    assert tp2.us(300, False) == pytest.approx(_engine_us(hw, 300 * per_token // 2, False))


def test_one_token_requests_are_answered_by_their_prefill_instance():
    reqs = synthetic(30, 5, "poisson", 200.0, prompt="uniform:16,200", output="fixed:1")
    r = serve(reqs, service(), cost(), 2, "round-robin", (1, 1))
    assert all(s.status == "ok" and s.kv_transfer_us is None for s in r.seqs)
    assert [x.requests for x in r.replicas] == [30, 0]


def test_kv_local_prefers_the_node_of_the_kv_cache_among_the_least_busy():
    class Held:
        def __init__(self, node, requests):
            self.node, self.load = node, (requests, 0)

        def outstanding(self, now):
            return self.load

    class Sent:
        kv_node = 1

    route = make_router("kv-local", prefilled=True).route
    assert route(Sent(), [Held(0, 2), Held(0, 1), Held(1, 1), Held(1, 3)], 0.0) == 2
    assert route(Sent(), [Held(0, 0), Held(1, 1)], 0.0) == 0  # a busier local one loses


SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--service", "vllm-continuous", "--requests", "100",
         "--rate", "2000", "--prompt-lengths", "uniform:300,480", "--output-lengths", "fixed:16"]


def test_pd_on_the_command_line_compares_with_colocated(tmp_path, capsys):
    out = tmp_path / "pd.json"
    assert main([*SERVE, "--cards", "4", "--pd", "2:2", "--router", "shortest-queue", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    m = json.loads(out.read_text())
    assert ("4 cards, P:D 2:2: prefill on 2 instances, decode on 2 instances, of tp 1; routers shortest-queue, then "
            "kv-local") in text
    assert "KV cache sent prefill -> decode: mean" in text
    assert [line.split() for line in text.splitlines() if line.strip().startswith("colocated")] == [
        ["colocated", "P:D", "2:2", "change"]]
    assert m["pd"]["prefill_cards"] == 2 and m["pd"]["kv_transfer"]["mean_ms"] > 0
    assert [r["role"] for r in m["replicas"]] == ["prefill", "prefill", "decode", "decode"]
    assert m["colocated"]["cards"] == 4 and "pd" not in m["colocated"]
    assert main([*SERVE, "--pd", "2:2", "--router", "shortest-queue", "--json", str(out)]) == 0  # cards: P + D
    assert json.loads(out.read_text()) == m


def test_the_comparison_keeps_its_columns_apart():
    """A 1 B/s NIC: TTFT 102400062.1 ms, 1651613.90 times colocated's, was printed as
    '102400062.11651613.90x'; every column now has a space before it, however wide."""
    from npusim.serving.command import compare_table

    stats = {k: {f"p{p}_ms": v for p in (50, 90, 99)} for k, v in (("ttft", 62.0), ("tpot", 0.7), ("e2e", 62.0))}
    a = {"service": "a", "requests_per_s": 1.0, "output_tokens_per_s": 1.0, "goodput_requests_per_s": 1.0,
         "completed": 5, "failed_oom": 0, "timed_out": 0} | stats
    b = a | {"ttft": {f"p{p}_ms": 102400062.1 for p in (50, 90, 99)}}
    table = compare_table(a, b, ("colocated", "P:D 8:8"))
    assert "TTFT P90 ms                     62.0       102400062.1 1651613.90x" in table.splitlines()
    assert all(len(line) == 64 for line in table.splitlines() if "TTFT" not in line)  # the usual widths


@pytest.mark.parametrize("argv, match", [
    (["--cards", "4", "--pd", "2:1"], "--pd 2:1 splits 3 cards, but --cards is 4 (P + D must be the cards)"),
    (["--cards", "4", "--tp", "2", "--pd", "1:3"], "--pd 1:3: --tp 2 does not divide the 1 prefill card "),
    (["--pd", "2"], "--pd: expected P:D, whole numbers of prefill and decode cards"),
    (["--pd", "0:2"], "--pd: expected P:D"),
    (["--pd", "a:b"], "--pd: expected P:D"),
    (["--pd", "1:1", "--pd-router", "nearest"], "--pd-router nearest: unknown router"),
    (["--pd-router", "round-robin"], "--pd-router round-robin: only --pd (and --plan's P:D splits) use it"),
    (["--pd", "1:1", "--service", "seed-optimized"], "--pd: service seed-optimized batches with 'dynamic', but a "
                                                     "decode instance takes requests whose prefill ran elsewhere"),
    (["--pd", "1:1", "--compare", "vllm-continuous", "seed-optimized"], "--compare: --pd compares"),
    (["--pd", "1:1", "--tp", "2"], "--pd 1:1: --tp 2 does not divide the 1 prefill card "),
])
def test_a_pd_split_that_does_not_fit_is_one_line(argv, match, capsys, monkeypatch):
    served = []
    monkeypatch.setattr("npusim.serving.command.serve", lambda *a: served.append(a))
    assert main([*SERVE, *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err
    assert not served


def test_a_pd_split_whose_instances_do_not_fit_a_card_is_one_line(capsys):
    """5 MB cards: a k3-tiny instance at batch 32 fits only as a tp-2 shard (as a replica does)."""
    argv = [*SERVE, "--no-cache", "--service-set", "scheduler.max_batch=32", "--set", "hbm.hbm_bytes=5000000"]
    assert main([*argv, "--pd", "1:1"]) == 2
    err = capsys.readouterr().err
    assert "a replica of k3-tiny on 1 card (--tp 1) does not fit a card" in err and err.count("\n") == 1
    assert main([*argv, "--pd", "2:2", "--tp", "2", "--requests", "20"]) == 0
