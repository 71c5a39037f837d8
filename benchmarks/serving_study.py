"""The seed articles' service study: seed-baseline against seed-optimized under a
Locust-like ramp with the seeds' length mix, and an ablation that takes one
factor of the optimised service back to the baseline's at a time and gives each
factor's share of the gain (its loss when removed / the sum of the losses).

    .venv/bin/python benchmarks/serving_study.py                     # k3, ramp 10,10,30,150
    .venv/bin/python benchmarks/serving_study.py --workload k3-tiny --prompt-lengths uniform:16,400 \\
        --ramp 50,50,2,500 --requests 2000

Engine points persist in the step-cost cache (npusim serve's), so a second run is fast.
"""

from __future__ import annotations

import argparse

import attrs

from npusim.serving import StepCost, metrics, simulate
from npusim.serving.arrivals import parse_ramp, synthetic
from npusim.diskcache import open_store
from npusim.serving.service import load_service


def factors(base, opt) -> dict:
    """Name -> the optimised service with that one factor set back to the baseline's."""
    kernel_passes = ("fusion", "layout", "kv_layout", "streams", "memplan")

    def passes(drop=(), add=()) -> str:
        names = [p for p in ("buckets", "fusion", "layout", "kv_layout", "sync", "launch", "streams", "memplan")
                 if p in opt_passes and p not in drop or p in add]
        return ",".join(names) or "baseline"

    from npusim.passes import pass_names

    opt_passes = pass_names(opt.passes)
    return {
        "batching": attrs.evolve(opt, scheduler=base.scheduler),
        "kernel passes": attrs.evolve(opt, passes=passes(drop=kernel_passes)),
        "graph launch": attrs.evolve(opt, passes=passes(drop=("launch",))),
        "event callbacks": attrs.evolve(opt, passes=passes(drop=("sync",))),
        "buckets": attrs.evolve(opt, passes=passes(drop=("buckets",))),
        "pre-processing thread": attrs.evolve(opt, host=attrs.evolve(opt.host,
                                                                     preprocess_on=base.host.preprocess_on)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="k3")
    p.add_argument("--hw", default="ascend910b2")
    p.add_argument("--ramp", default="10,10,30,150", help="START,STEP,EVERY_S,MAX (the seeds' Locust ramp)")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--prompt-lengths", default="mix")
    p.add_argument("--output-lengths", default="fixed:64")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    reqs = synthetic(a.requests, a.seed, "ramp", ramp=parse_ramp(a.ramp), prompt=a.prompt_lengths,
                     output=a.output_lengths)
    base, opt = load_service("seed-baseline"), load_service("seed-optimized")
    runs = {"seed-baseline": base, "seed-optimized": opt} | {f"- {k}": v for k, v in factors(base, opt).items()}
    rows = {}
    for name, svc in runs.items():
        cost = StepCost(a.workload, a.hw, svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch,
                        store=open_store())
        rows[name] = metrics(simulate(reqs, svc, cost))
        m = rows[name]
        print(f"{name:26s} e2e P50/P90/P99 {m['e2e']['p50_ms'] or 0:9.0f} {m['e2e']['p90_ms'] or 0:9.0f} "
              f"{m['e2e']['p99_ms'] or 0:9.0f} ms  {m['requests_per_s']:7.2f} req/s  completed {m['completed']}, "
              f"failed {m['failed_oom'] + m['timed_out']}, rejected {m['rejected']}", flush=True)
    o, b = rows["seed-optimized"], rows["seed-baseline"]
    print(f"\nthroughput x{o['requests_per_s'] / b['requests_per_s']:.2f}, P99 {b['e2e']['p99_ms']:.0f} -> "
          f"{o['e2e']['p99_ms']:.0f} ms")
    for metric, get in (("P99 end-to-end", lambda m: m["e2e"]["p99_ms"]),
                        ("throughput", lambda m: -m["requests_per_s"])):
        loss = {k[2:]: get(m) - get(o) for k, m in rows.items() if k.startswith("- ")}
        total = sum(max(v, 0) for v in loss.values()) or 1.0
        print(f"share of the gain in {metric} (loss when the factor is removed / sum of losses): "
              + ", ".join(f"{k} {100 * max(v, 0) / total:.0f}%" for k, v in loss.items()))


if __name__ == "__main__":
    main()
