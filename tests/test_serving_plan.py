"""The capacity planner (serving.plan): more cards never serve a load worse, the
search finds the fewest cards meeting an SLO (checked against every count below
it), `npusim serve --plan` prints the frontier and writes it, bad input is one line."""

import json
import signal

import pytest

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.hw import load_hw
from npusim.serving import StepCost, metrics, synthetic
from npusim.serving.disagg import DEFAULT_PD_ROUTER
from npusim.serving.plan import Shape, search, shapes, table
from npusim.serving.report import sustainable
from npusim.serving.service import HostConfig, SchedulerConfig, ServiceConfig, Slo
from npusim.serving.simulate import serve
from npusim.workload import load_workload

PASSES = "optimized,buckets"
_points: dict = {}
HOST = HostConfig(preprocess_on="pool", pool_threads=4, tokenize_us=1000.0, postprocess_us_per_token=20.0,
                  step_overhead_us=200.0)
SLO = Slo(ttft_ms=50.0, tpot_ms=10.0)


def cost(tp=1, max_batch=2) -> StepCost:
    """A fresh k3-tiny model that reuses the engine points earlier tests simulated."""
    sc = StepCost("k3-tiny", "ascend910b2", PASSES, max_batch=max_batch, tp=tp)
    sc.points = _points.setdefault((tp, max_batch), {})
    return sc


def service(kind="continuous", max_batch=2) -> ServiceConfig:
    return ServiceConfig("test", SchedulerConfig(kind, max_batch=max_batch), PASSES, host=HOST, slo=SLO,
                         precompile=True)


def load(seed=1, n=300, rate=300.0):
    """More than one k3-tiny card at 2 sequences a step serves: skewed outputs."""
    return synthetic(n, seed, "poisson", rate, prompt="uniform:16,256", output="lognormal:24,1.2")


@pytest.mark.parametrize("router", ["round-robin", "shortest-queue"])
@pytest.mark.parametrize("seed", [1, 2])
def test_more_cards_never_lower_goodput_at_equal_load(router, seed):
    """The planner's search rests on it (plan.py): one load, 1 to 6 cards of one replica
    each. The requests served within the SLO never fall; goodput (those per second of the
    run's span, which ends at its last token) falls by no more than the span's jitter once
    the cards serve the whole load (then it is the arrival rate, whatever the cards)."""
    reqs = load(seed)
    m = [metrics(serve(reqs, service(), cost(), n, router)) for n in range(1, 7)]
    within = [x["slo_attainment"] for x in m]
    goodput = [x["goodput_requests_per_s"] for x in m]
    assert all(a <= b for a, b in zip(within, within[1:])), within
    assert all(a <= b * 1.005 for a, b in zip(goodput, goodput[1:])), goodput
    assert goodput[-1] > 10 * goodput[0]  # the load is more than one card serves


def _serve_shape(reqs, svc):
    def run(shape: Shape) -> dict:
        return metrics(serve(reqs, svc, cost(shape.tp), shape.cards, "shortest-queue", shape.pd))

    return run


def _serve_all(reqs, svc):
    run = _serve_shape(reqs, svc)
    return lambda shapes: [run(s) for s in shapes]


@pytest.mark.parametrize("slo, rate", [(Slo(ttft_ms=50.0, tpot_ms=10.0), 300.0), (Slo(ttft_ms=20.0), 300.0),
                                       (Slo(e2e_ms=400.0), 150.0)])
def test_the_planner_returns_the_fewest_cards_meeting_the_slo(slo, rate):
    """Its bisection's answer meets the SLO, and no candidate on any fewer cards does
    (every count below it served in full, not only the ones the search tried)."""
    reqs, svc, w, hw = load(3, rate=rate), service(), load_workload("k3-tiny"), load_hw("ascend910b2")
    run = _serve_shape(reqs, svc)
    found = search(_serve_all(reqs, svc), lambda n: shapes(n, w, hw), slo, rate, 8)
    best = found.answer
    assert best.meets and sustainable(best.metrics, slo)
    assert len(found.frontier) < 8  # a search, not every count
    for n in range(1, best.shape.cards):
        assert not any(sustainable(run(s), slo) for s in shapes(n, w, hw)), n
    # the frontier: one row per card count tried, by cards, the answer marked in its table
    cards = [c.shape.cards for c in found.frontier]
    assert cards == sorted(set(cards)) and 8 in cards
    assert f"fewest cards: {best.shape.cards} ({best.shape.name})" in table(found)


def test_candidates_are_every_tp_and_split_the_workload_allows():
    w, hw = load_workload("k3-tiny"), load_hw("ascend910b2")  # 4 heads, 2 K/V heads: tp 1 or 2
    assert shapes(4, w, hw) == [Shape(4, 1), Shape(4, 2)]
    assert shapes(3, w, hw) == [Shape(3, 1)]
    assert shapes(4, w, hw, disaggregate=True)[2:] == [Shape(4, 1, (1, 3)), Shape(4, 1, (2, 2)),
                                                       Shape(4, 1, (3, 1)), Shape(4, 2, (2, 2))]


def test_an_impossible_slo_is_one_line_naming_the_best():
    w, hw = load_workload("k3-tiny"), load_hw("ascend910b2")
    with pytest.raises(ConfigError, match=r"--plan: no cluster of 4 cards meets TTFT P90 <= 0.001 ms at 300 "
                                          r"req/s: the best, 4 x tp 1, has TTFT P90 [\d.]+ ms") as e:
        search(_serve_all(load(1), service()), lambda n: shapes(n, w, hw), Slo(ttft_ms=0.001), 300.0, 4)
    assert "\n" not in str(e.value)


SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--service", "vllm-continuous", "--service-set",
         "scheduler.max_batch=2", "--requests", "200", "--prompt-lengths", "uniform:16,256", "--output-lengths",
         "lognormal:24,1.2", "--router", "shortest-queue"]


def test_plan_prints_the_frontier_and_writes_it(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = [*SERVE, "--plan", "--rate", "300", "--slo", "ttft_ms=50,tpot_ms=10", "--max-cards", "6",
            "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    p = json.loads(out.read_text())
    assert f"wrote {out}: the answer, the frontier and all {len(p['tried'])} clusters tried" in text
    assert f"fewest cards: {p['cards']} " in text and "meets" in text.splitlines()[1]
    assert p["cards"] == next(r["cards"] for r in p["frontier"] if r["meets"])
    assert all(not r["meets"] for r in p["frontier"] if r["cards"] < p["cards"])
    assert p["slo"]["ttft_ms"] == 50 and p["requests"] == 200 and p["router"] == "shortest-queue"
    assert p["pd_router"] == DEFAULT_PD_ROUTER  # the split clusters tried route prefill -> decode so
    # a continuous scheduler: the P/D splits are candidates too
    assert any(r["pd"] for r in p["tried"]) and all(set(r) >= {"cards", "tp", "replicas", "goodput_requests_per_s",
                                                               "ttft", "tpot", "meets"} for r in p["tried"])
    # each row is what `npusim serve` prints for that cluster alone, whatever the search tried before it
    row = next(r for r in p["frontier"] if r["cards"] == p["cards"])
    alone = tmp_path / "alone.json"
    split = ["--pd", "{}:{}".format(*row["pd"])] if row["pd"] else []
    assert main([*SERVE, "--rate", "300", "--slo", "ttft_ms=50,tpot_ms=10", "--cards", str(row["cards"]), "--tp",
                 str(row["tp"]), "--json", str(alone), *split]) == 0
    m = json.loads(alone.read_text())
    assert (m["goodput_requests_per_s"], m["ttft"], m["tpot"], m["e2e"]) == (
        row["goodput_requests_per_s"], row["ttft"], row["tpot"], row["e2e"])


@pytest.mark.parametrize("argv, match", [
    (["--plan", "--rate", "300", "--slo", "ttft_ms=fast", "--max-cards", "4"], "--slo ttft_ms: expected a number"),
    (["--plan", "--rate", "300", "--slo", "p99=3", "--max-cards", "4"], "--slo: expected KEY=MS with KEY one of"),
    (["--plan", "--rate", "300", "--slo", "ttft_ms=0.001", "--max-cards", "4"],
     "--plan: no cluster of 4 cards meets TTFT P90 <= 0.001 ms, TPOT P99 <= 200 ms at 300 req/s: the best"),
    (["--plan", "--rate", "300", "--slo", "ttft_ms=50"], "--plan: give --max-cards C"),
    (["--plan", "--slo", "ttft_ms=50", "--max-cards", "4"], "--plan: give --rate R"),
    (["--plan", "--rate", "300", "--max-cards", "0"], "--max-cards: expected a whole number of cards from 1"),
    (["--plan", "--rate", "300", "--max-cards", "4", "--cards", "2"], "--cards: not used by --plan"),
    (["--plan", "--rate", "300", "--max-cards", "4", "--csv", "x.csv"], "--csv: not used by --plan"),
    (["--plan", "--rate", "300", "--max-cards", "4", "--pd", "1:1"], "--pd 1:1: not used by --plan"),
    (["--plan", "--rate", "300", "--max-cards", "4", "--cv", "3"], "--cv: not used by --plan"),  # it was ignored
    (["--plan", "--rate", "300", "--max-cards", "4", "--service-set", "slo.ttft_ms=null", "--service-set",
      "slo.tpot_ms=null"], "--plan: the service sets no SLO"),
    (["--rate", "300", "--max-cards", "4"], "--max-cards: only --plan uses it"),
    (["--rate", "300", "--backend", "local"], "--backend: only --plan uses it"),
    (["--plan", "--rate", "300", "--max-cards", "4", "--backend", "slurm"], "--backend slurm: unknown backend"),
    (["--plan", "--rate", "300", "--max-cards", "4", "--backend", "local", "--address", "auto"],
     "--address auto: only the ray backend connects to a cluster"),
    # every request rejected at the door: 'no cluster meets ... (loosen --slo, or give more --max-cards)'
    (["--plan", "--rate", "300", "--max-cards", "4", "--prompt-lengths", "fixed:600"],
     "--plan: every one of the 200 requests (--prompt-lengths fixed:600, --output-lengths lognormal:24,1.2) is longer "
     "than the workload's context of 512 tokens"),
    # a dynamic service is not split: the router was ignored without a word
    (["--plan", "--rate", "300", "--max-cards", "4", "--service", "seed-optimized", "--pd-router", "round-robin"],
     "--pd-router round-robin: service seed-optimized batches with 'dynamic', so --plan tries no P:D split"),
])
def test_bad_plan_input_is_one_line(argv, match, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main([*SERVE, *argv]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err


def test_a_static_service_is_planned_from_one_card_up(capsys):
    """A static batch waits for max_batch requests, so 4 replicas (4 requests each) missed the
    TTFT limit one card meets: it said 'no cluster of 4 cards meets ... (give more --max-cards)'."""
    argv = ["serve", "--workload", "k3-tiny", "--no-cache", "--service", "seed-baseline", "--requests", "16",
            "--prompt-lengths", "fixed:50", "--output-lengths", "fixed:4", "--plan", "--rate", "10", "--max-cards",
            "4", "--slo", "tpot_ms=1000,ttft_ms=1500"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "fewest cards: 1 (1 x tp 1) meet TTFT P90 <= 1500 ms" in capsys.readouterr().out
    # every count from 1 up: 4096 would take about 40 minutes to refuse an SLO no count meets
    assert main(argv[:-3] + ["4096", "--slo", "ttft_ms=1", "--set", "topology.node_count=512"]) == 2  # 4096 cards
    assert "--max-cards 4096: more cards may serve this service worse" in capsys.readouterr().err


def test_plan_outputs_are_checked_before_the_search(tmp_path, capsys, monkeypatch):
    served = []
    monkeypatch.setattr("npusim.serving.capacity_command.serve", lambda *a: served.append(a))
    argv = [*SERVE, "--plan", "--rate", "300", "--max-cards", "4", "--json", "/proc/x/plan.json"]
    assert main(argv) == 2
    assert "--json /proc/x/plan.json: cannot be written" in capsys.readouterr().err and not served


SMALL = [*SERVE[:SERVE.index("--requests")], "--requests", "60", *SERVE[SERVE.index("--requests") + 2:], "--plan",
         "--rate", "150", "--slo", "ttft_ms=50,tpot_ms=10", "--max-cards", "3"]


@pytest.fixture
def ray_once():
    """One local Ray instance of 2 CPUs for the test: the backend uses it, instead of
    starting one for each card count the search serves."""
    ray = pytest.importorskip("ray", reason='the ray extra is not installed (pip install "npusim[ray]")')
    from npusim.backends.ray import OBJECT_STORE_BYTES

    held = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # Ray sets its own
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
             log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()
    for sig, handler in held.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_backend_serves_the_candidates_with_the_same_figures(backend, tmp_path, capsys, request):
    """Each candidate starts from a fresh step-cost model, so where it runs changes nothing."""
    if backend == "ray":
        request.getfixturevalue("ray_once")
    here, there = tmp_path / "here.json", tmp_path / "there.json"
    assert main([*SMALL, "--json", str(here)]) == 0
    assert main([*SMALL, "--json", str(there), "--backend", backend, "--jobs", "2"]) == 0
    assert json.loads(there.read_text()) == json.loads(here.read_text())
