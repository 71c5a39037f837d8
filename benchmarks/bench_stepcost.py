"""Error of the serving step-cost model against direct engine simulation.

For each workload and pass pipeline: build a StepCost from random training
steps (it refines its grid where its own checks miss), then price random steps
it was not built from - decode steps (batch, ragged contexts) and batched
prefills (batch, prompt length) - and simulate each of them directly with
run_decoder (same hardware, passes and options). Prints the median and max
relative error.

    .venv/bin/python benchmarks/bench_stepcost.py                      # k3-tiny
    .venv/bin/python benchmarks/bench_stepcost.py --workload k3 --test 30
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from npusim.runtime.decoder import run_decoder
from npusim.serving.stepcost import StepCost


def direct(sc: StepCost, phase: str, batch: int, length: int) -> float:
    lengths = [length] + [length - 1] * (batch - 1) if phase == "decode" and batch > 1 else length
    return run_decoder(sc.workload, sc.pricing_hw, phase, batch, lengths, sc.passes, **sc.options).latency_us


def bench(workload: str, passes: str, max_batch: int, train: int, test: int, seed: int, max_len: int | None) -> None:
    rng = np.random.default_rng(seed)
    sc = StepCost(workload, "ascend910b2", passes, max_batch=max_batch)
    top = min(max_len or sc.workload.max_context_tokens, sc.workload.max_context_tokens)
    t0 = time.monotonic()
    for _ in range(train):
        sc.decode_us(int(rng.integers(1, max_batch + 1)), int(rng.integers(2, top + 1)))
        sc.prefill_us(int(rng.integers(1, max_batch + 1)), int(rng.integers(2, top + 1)))
    built = time.monotonic() - t0
    print(f"{workload} passes {passes}: built from {sc.engine_runs} engine points in {built:.0f} s "
          f"(decode knots batch {sc.decode.b}, context {sc.decode.l}; prefill knots {sc.prefill.l})")
    errs = {"decode": [], "prefill": []}
    t0 = time.monotonic()
    while len(errs["decode"]) + len(errs["prefill"]) < test:
        phase = "decode" if len(errs["decode"]) <= len(errs["prefill"]) else "prefill"
        b = int(rng.integers(1, max_batch + 1))
        n = int(rng.integers(2, top + 1))
        key = (phase, b, sc.length_key(n))
        if key in sc.points or (not sc.bucketed and n in sc.decode.l):
            continue  # a step the model was built from
        est = sc.decode_us(b, n) if phase == "decode" else sc.prefill_us(b, n)
        if key in sc.points:
            continue  # pricing it simulated this very point: not unseen
        true = direct(sc, phase, b, n)
        errs[phase].append(abs(est - true) / true)
    every = errs["decode"] + errs["prefill"]
    for phase, e in errs.items():
        print(f"  {phase:8s} {len(e):3d} unseen steps: median error {100 * np.median(e):.3f}%, "
              f"max {100 * max(e):.3f}%")
    print(f"  all      {len(every):3d} unseen steps: median error {100 * np.median(every):.3f}%, max "
          f"{100 * max(every):.3f}%  ({time.monotonic() - t0:.0f} s; model now {sc.engine_runs} points)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", action="append", help="default k3-tiny")
    p.add_argument("--passes", action="append", help="default baseline and optimized,buckets")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--train", type=int, default=40, help="random steps the model is built from")
    p.add_argument("--test", type=int, default=40, help="random unseen steps it is checked on")
    p.add_argument("--max-len", type=int, help="longest context / prompt drawn (default the model's)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for w in a.workload or ["k3-tiny"]:
        for passes in a.passes or ["baseline", "optimized,buckets"]:
            bench(w, passes, a.max_batch, a.train, a.test, a.seed, a.max_len)


if __name__ == "__main__":
    main()
