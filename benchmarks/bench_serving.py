"""Speed of the serving simulation: N Poisson requests through a service, wall
time of building the step-cost model (engine points; cached on disk after the
first run) and of the simulation itself, and the peak RSS (with --jobs, also that of
the largest worker process that priced engine points).

    .venv/bin/python benchmarks/bench_serving.py --workload k3 --rate 4 --requests 10000 [--jobs 2]
    .venv/bin/python benchmarks/bench_serving.py --workload k3-tiny --rate 800 --service-set host.pool_threads=32
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np

from npusim.hw.load import parse_set_args
from npusim.serving import StepCost, metrics, simulate, synthetic
from npusim.diskcache import open_store
from npusim.serving.service import load_service


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="k3-tiny")
    p.add_argument("--service", default="vllm-continuous")
    p.add_argument("--rate", type=float, default=500.0)
    p.add_argument("--requests", type=int, default=10000)
    p.add_argument("--prompt-lengths", default="uniform:16,400")
    p.add_argument("--output-lengths", default="fixed:64")
    p.add_argument("--service-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a service field, e.g. host.pool_threads=16")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="worker processes pricing engine points (npusim serve --jobs; default: the machine's CPUs)")
    a = p.parse_args()
    svc = load_service(a.service, parse_set_args(a.service_set))
    reqs = synthetic(a.requests, 0, "poisson", a.rate, prompt=a.prompt_lengths, output=a.output_lengths)
    cost = StepCost(a.workload, "ascend910b2", svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch,
                    store=open_store(), jobs=a.jobs)
    t0 = time.monotonic()
    simulate(reqs[:200], svc, cost)  # the engine points the load needs (most of them)
    t1 = time.monotonic()
    warm_runs = cost.engine_runs
    run = simulate(reqs, svc, cost)
    t2 = time.monotonic()
    m = metrics(run)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"{a.requests} requests of {a.workload} ({svc.name}) at {a.rate} req/s: step-cost warm-up {t1 - t0:.1f} s "
          f"({warm_runs} engine runs), simulation {t2 - t1:.1f} s for {len(run.steps)} steps "
          f"({cost.engine_runs - warm_runs} more engine runs); decode batch "
          f"mean {m['decode_batch']['mean']:.1f} (steps with decodes: "
          f"{np.mean([st.decode_batch for st in run.steps if st.decode_batch]):.1f}); peak RSS {rss:.0f} MiB"
          + (f" (largest worker {workers:.0f} MiB)" if workers else ""))


if __name__ == "__main__":
    main()
