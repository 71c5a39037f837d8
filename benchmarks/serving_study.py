"""The seed articles' service study: seed-baseline against seed-optimized under a
Locust-like ramp with the seeds' length mix, and an ablation that takes one
factor of the optimised service back to the baseline's at a time and gives each
factor's share of the gain (its loss when removed / the sum of the losses).

    .venv/bin/python benchmarks/serving_study.py --jobs 2 --json study.json   # k3, ramp 10,10,30,150
    .venv/bin/python benchmarks/serving_study.py --cards 16 --tp 2   # the seeds' load on 8 replicas of 2 cards
    .venv/bin/python benchmarks/serving_study.py --workload k3-tiny --prompt-lengths uniform:16,400 \\
        --ramp 50,50,2,500 --requests 2000

Every service runs the same requests, on --cards cards (default 1) as --cards / --tp
replicas behind --router, as `npusim serve --cards` serves them. Engine points persist
in the step-cost cache (npusim serve's), so a second run is fast; on K3 the first run
prices bucketed prefills of up to 32 x 4096 tokens, minutes each. --jobs runs that many
services at once (worker processes sharing the cache). Each service's row is printed
(with when it ended and the CPU seconds its worker spent), and the JSON rewritten, as
soon as it is done. The services without buckets, which price a prefill at every prompt
length, start first; then the others in the table's order, so the factors whose engine
points the optimised service already has run after it.
"""

from __future__ import annotations

import argparse
import time

import attrs

from npusim.diskcache import open_store
from npusim.outputs import write_json
from npusim.passes import pass_names
from npusim.pool import run_tasks
from npusim.serving import StepCost, metrics, serve
from npusim.serving.routers import ROUTERS
from npusim.serving.stepcost import DEFAULT_TOL
from npusim.serving.arrivals import parse_ramp, synthetic
from npusim.serving.service import load_service

# What the seed articles measured with Locust (ms; requests/s at 100 RPS offered), for the table.
SEEDS = {"seed-baseline": {"p50": 420, "p90": 890, "p99": 1520, "qps": 82},
         "seed-optimized": {"p50": 158, "p90": 320, "p99": 540, "qps": 228}}


def factors(base, opt) -> dict:
    """Name -> the optimised service with that one factor set back to the baseline's."""
    kernel_passes = ("fusion", "layout", "kv_layout", "streams", "memplan")

    def passes(drop=(), add=()) -> str:
        names = [p for p in ("buckets", "fusion", "layout", "kv_layout", "sync", "launch", "streams", "memplan")
                 if p in opt_passes and p not in drop or p in add]
        return ",".join(names) or "baseline"

    opt_passes = pass_names(opt.passes)
    return {  # the first two price steps as the optimised service does; each later one needs its own
        "batching": attrs.evolve(opt, scheduler=base.scheduler),
        "pre-processing thread": attrs.evolve(opt, host=attrs.evolve(opt.host,
                                                                     preprocess_on=base.host.preprocess_on)),
        "event callbacks": attrs.evolve(opt, passes=passes(drop=("sync",))),
        "graph launch": attrs.evolve(opt, passes=passes(drop=("launch",))),
        "kernel passes": attrs.evolve(opt, passes=passes(drop=kernel_passes)),
        "buckets": attrs.evolve(opt, passes=passes(drop=("buckets",))),
    }


def run_service(svc, reqs, workload: str, hw: str, tol: float, cards: int, tp: int, router: str,
                exact: bool = True) -> tuple[dict, float]:
    """One service on the load, on `cards` cards of `tp`-card replicas: its metrics and the CPU
    seconds its worker spent on it (a worker's task)."""
    cpu = time.process_time()
    cost = StepCost(workload, hw, svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch, tol=tol,
                    store=open_store(), tp=tp, exact=exact)
    m = metrics(serve(reqs, svc, cost, cards, router))
    m.pop("timeline")
    return m, time.process_time() - cpu


def _row(name: str, m: dict) -> str:
    e, t = m["e2e"], m["ttft"]
    failed = m["failed_oom"] + m["timed_out"]
    return (f"{name:25s} {m['completed']:6d} {failed:6d} {m['rejected']:5d} {m['requests_per_s']:7.2f} "
            f"{m['output_tokens_per_s']:8.0f} {m['compile_s']:9.0f}  " + " ".join(f"{(v or 0):7.0f}" for v in
                                                        (e["p50_ms"], e["p90_ms"], e["p99_ms"],
                                                         t["p50_ms"], t["p90_ms"], t["p99_ms"])))


def shares(rows: dict, get) -> dict:
    """Each factor's loss when it alone is removed (get(removed) - get(optimized), positive =
    worse), and its share of the sum of the positive losses."""
    o = rows["seed-optimized"]
    loss = {k[2:]: get(m) - get(o) for k, m in rows.items() if k.startswith("- ")}
    total = sum(max(v, 0) for v in loss.values())
    return {k: {"loss": v, "share": max(v, 0) / total if total else 0.0} for k, v in loss.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="k3")
    p.add_argument("--hw", default="ascend910b2")
    p.add_argument("--ramp", default="10,10,30,150", help="START,STEP,EVERY_S,MAX (the seeds' Locust ramp)")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--prompt-lengths", default="mix")
    p.add_argument("--output-lengths", default="fixed:64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="services simulated at once (worker processes)")
    p.add_argument("--cards", type=int, default=1, help="cards each service runs on (--cards / --tp replicas)")
    p.add_argument("--tp", type=int, default=1, help="cards per replica (tensor parallel)")
    p.add_argument("--router", default="round-robin", choices=sorted(ROUTERS), help="how requests reach replicas")
    p.add_argument("--tol", type=float, default=DEFAULT_TOL,
                   help="step-cost model: relative error at which a grid cell is split (npusim serve --tol); "
                        "without buckets a prefill's cost is a staircase in the prompt length, and a tight "
                        "tolerance simulates many long prefills near its steps")
    p.add_argument("--factors", metavar="NAMES", help="the ablation's factors to run, comma-separated (default: "
                   "all; on K3 each factor that changes the passes prices its own prefills, an hour or more); "
                   "the shares are then of the factors run")
    p.add_argument("--fast-forward", action="store_true",
                   help="price big steps from a few of their waves, as npusim serve --fast-forward does")
    p.add_argument("--json", metavar="PATH", help="write every service's metrics and the shares as JSON")
    a = p.parse_args()
    ramp = parse_ramp(a.ramp)
    reqs = synthetic(a.requests, a.seed, "ramp", ramp=ramp, prompt=a.prompt_lengths, output=a.output_lengths)
    base, opt = load_service("seed-baseline"), load_service("seed-optimized")
    ablation = factors(base, opt)
    chosen = a.factors.split(",") if a.factors else list(ablation)
    if unknown := [f for f in chosen if f not in ablation]:
        p.error(f"--factors: unknown {', '.join(unknown)}; expected some of: {', '.join(ablation)}")
    runs = {"seed-baseline": base, "seed-optimized": opt} | {f"- {k}": ablation[k] for k in chosen}
    names = list(runs)
    # Longest first: the services without buckets price a prefill at each prompt length the mix
    # brings (the others at a few bucket sizes), so they are the longest tasks; started last,
    # one of them ran alone for the last third of the study. The rest keep their order (the
    # factors that reuse the optimised service's engine points run after it).
    order = sorted(range(len(names)), key=lambda i: "buckets" in pass_names(runs[names[i]].passes))
    span = reqs[-1].arrival_s
    load = vars(a) | {"span_s": span}
    print(f"{a.workload} on {a.hw}: {a.requests} requests over {span:.0f} s, ramp {ramp.start:g} req/s "
          f"+{ramp.step:g} every {ramp.every_s:g} s (at {ramp.rate_at(span):g} by the last arrival), prompts "
          f"{a.prompt_lengths}, outputs {a.output_lengths}, seed {a.seed}; {a.cards} card(s), replicas of {a.tp} "
          f"behind {a.router}; step costs within {100 * a.tol:g}% "
          "at each grid cell's checked midpoints")
    print(f"{'service':25s} {'done':>6s} {'failed':>6s} {'rej':>5s} {'req/s':>7s} {'tok/s':>8s} {'compile s':>9s}  "
          f"{'e2e P50':>7s} {'P90':>7s} {'P99':>7s} {'TTFT P50':>8s} {'P90':>6s} {'P99':>7s}  (ms)", flush=True)
    rows: dict = {}

    start = time.perf_counter()

    def done(j: int, result: tuple[dict, float]) -> None:
        i = order[j]
        rows[names[i]], cpu = result
        print(f"{_row(names[i], rows[names[i]])}  [ended at {time.perf_counter() - start:.0f} s, "
              f"{cpu:.0f} CPU s]", flush=True)
        if a.json:  # what is done so far, in the services' order
            write_json(a.json, {"load": load, "services": {n: rows[n] for n in names if n in rows}})

    def failed(j: int, why: str) -> None:
        raise SystemExit(f"{names[order[j]]}: {why}")

    run_tasks(run_service, [(runs[names[i]], reqs, a.workload, a.hw, a.tol, a.cards, a.tp, a.router,
                             not a.fast_forward) for i in order],
              a.jobs, done, failed)
    rows = {n: rows[n] for n in names}
    o, b = rows["seed-optimized"], rows["seed-baseline"]
    print(f"\nthroughput x{o['requests_per_s'] / b['requests_per_s']:.2f} ({b['requests_per_s']:.2f} -> "
          f"{o['requests_per_s']:.2f} req/s); end-to-end P50/P90/P99 "
          + "/".join(f"{b['e2e'][k]:.0f}" for k in ("p50_ms", "p90_ms", "p99_ms")) + " -> "
          + "/".join(f"{o['e2e'][k]:.0f}" for k in ("p50_ms", "p90_ms", "p99_ms")) + " ms")
    s = SEEDS
    print(f"the seeds (Locust, one card): x{s['seed-optimized']['qps'] / s['seed-baseline']['qps']:.2f} "
          f"({s['seed-baseline']['qps']} -> {s['seed-optimized']['qps']} req/s at 100 offered); P50/P90/P99 "
          + "/".join(str(s["seed-baseline"][k]) for k in ("p50", "p90", "p99")) + " -> "
          + "/".join(str(s["seed-optimized"][k]) for k in ("p50", "p90", "p99")) + " ms")
    gains = {"P99 end-to-end": shares(rows, lambda m: m["e2e"]["p99_ms"]),
             "throughput": shares(rows, lambda m: -m["requests_per_s"])}
    among = "" if len(chosen) == len(ablation) else f", of the {len(chosen)} factors run"
    for metric, sh in gains.items():
        print(f"share of the gain in {metric} (loss when the factor is removed / sum of losses{among}): "
              + ", ".join(f"{k} {100 * v['share']:.0f}%" for k, v in sh.items()))
    if a.json:
        write_json(a.json, {"load": load, "services": rows, "shares": gains})


if __name__ == "__main__":
    main()
