"""Error of the serving step-cost model against direct engine simulation.

For each workload and pass pipeline: build a StepCost from random training
steps (it refines its grid where its own checks miss), then price random steps
it was not built from and simulate each of them directly (build_decoder, the
passes and run_graph on the same hardware, as `npusim run`):

- decode steps: a batch of random contexts (ragged);
- prefills: a batch of random prompt lengths (with buckets: bucketed prefills);
- mixed steps (chunked prefill): random decodes beside 1-3 prefill chunks of a
  random size within a token budget, each chunk after a random prefix.

Each test step is priced twice:

- as `npusim serve` prices it: the model checks the cell the step falls in (the
  midpoints of its edges) and refines it where they miss, as it does on every
  step of a serving run. A step that becomes a point of the model this way (its
  shape is simulated) is not counted: it is exact by construction;
- frozen: by the model as it was before that step, no check (the grid's plain
  interpolation, for cells no step had reached), on every step whose shape the
  model did not hold.

Each shape the model prices is tested once: its steps get one price (and with
buckets, whose graphs are padded to the bucket, one engine latency), so repeats
would only weight the figures toward common shapes.

Prints the median and max relative error per kind and overall, for each.

    .venv/bin/python benchmarks/bench_stepcost.py                      # k3-tiny
    .venv/bin/python benchmarks/bench_stepcost.py --workload k3 --test 30
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from npusim.diskcache import open_store
from npusim.graph.build import build_decoder
from npusim.passes import apply
from npusim.runtime.run import run_graph
from npusim.serving.stepcost import DEFAULT_TOL, StepCost

KINDS = ("decode", "prefill", "mixed")
WAYS = ("as served", "frozen")  # how a test step is priced (module doc)
# draws in a row of a kind that all fell on model points or tested shapes before the kind
# is left short (with buckets most decode and prefill shapes are knots of the model)
EXHAUSTED = 1000


def draw(rng: np.random.Generator, kind: str, max_batch: int, top: int, budget: int) -> dict:
    """A random step: the direct graph's (phase, lengths, new_tokens)."""
    if kind in ("decode", "prefill"):
        b = int(rng.integers(1, max_batch + 1))
        n = int(rng.integers(2, top + 1))
        lengths = [n] + [int(x) for x in rng.integers(1, n + 1, b - 1)]  # ragged, the longest first
        return dict(phase=kind, lengths=lengths, new_tokens=None)
    chunks = int(rng.integers(1, 4))
    decodes = int(rng.integers(0, max_batch - chunks + 1))
    sizes = [int(x) for x in rng.integers(2, max(3, (budget - decodes) // chunks) + 1, chunks)]
    ends = [int(rng.integers(c, top + 1)) for c in sizes]  # a random prefix before each chunk
    contexts = [int(x) for x in rng.integers(1, top + 1, decodes)]
    return dict(phase="mixed", lengths=contexts + ends, new_tokens=[1] * decodes + sizes)


def model_key(sc: StepCost, step: dict) -> tuple:
    """The model's grid point for the step (as StepCost.shapes names it) and its price."""
    ls, nt = step["lengths"], step["new_tokens"]
    if step["phase"] != "mixed":
        key = (step["phase"], len(ls), sc.length_key(max(ls)))
        return key, lambda: (sc.decode_us if step["phase"] == "decode" else sc.prefill_us)(len(ls), max(ls))
    d = sum(x == 1 for x in nt)
    c = max(nt)
    k = sc.length_key(max(ls))
    key = ("mixed", *sc._mixed_key(d, len(nt) - d, c, k if sc.bucketed else k - c))
    return key, lambda: sc.mixed_us(d, len(nt) - d, c, max(ls))


def direct(sc: StepCost, step: dict) -> float:
    g = build_decoder(sc.workload, step["phase"], len(step["lengths"]), step["lengths"],
                      new_tokens=step["new_tokens"])
    return run_graph(apply(g, sc.passes, **sc.options, hw=sc.pricing_hw), sc.pricing_hw).latency_us


def bench(workload: str, passes: str, max_batch: int, train: int, test: int, seed: int, max_len: int | None,
          budget: int | None, verbose: bool = False, cache: str | None = None, tol: float = DEFAULT_TOL) -> list[float]:
    rng = np.random.default_rng(seed)
    store = open_store(cache) if cache else None
    sc = StepCost(workload, "ascend910b2", passes, max_batch=max_batch, store=store, tol=tol)
    top = min(max_len or sc.workload.max_context_tokens, sc.workload.max_context_tokens)
    budget = budget or min(512, top)
    t0 = time.monotonic()
    for i in range(train):
        for kind in KINDS:
            model_key(sc, draw(rng, kind, max_batch, top, budget))[1]()
        if verbose:
            print(f"  training step {i + 1}/{train}: {len(sc.points)} engine points, {time.monotonic() - t0:.0f} s",
                  flush=True)
    built = time.monotonic() - t0
    print(f"{workload} passes {passes}: built from {len(sc.points)} engine points in {built:.0f} s "
          f"(decode knots {sc.decode.knots}; prefill knots {sc.prefill.knots}; mixed knots {sc.mixed.knots})",
          flush=True)
    errs: dict[str, dict[str, list[float]]] = {way: {k: [] for k in KINDS} for way in WAYS}
    seen = {k: 0 for k in KINDS}  # draws in a row that fell on a model point or a shape tested before
    tested: set[tuple] = set()  # the shapes of the steps tested so far (steps of one shape price alike)
    worst: tuple[float, dict] = (0.0, {})
    grids = (sc.decode, sc.prefill, sc.mixed)
    tol = sc.decode.tol
    t0 = time.monotonic()
    while sum(map(len, errs["as served"].values())) < test:
        # the kind with the fewest unseen steps drawn so far, among those still drawing new shapes
        live = [k for k in KINDS if seen[k] < EXHAUSTED]
        if not live:
            break
        kind = min(live, key=lambda k: len(errs["frozen"][k]))
        step = draw(rng, kind, max_batch, top, budget)
        key, price = model_key(sc, step)
        if key in sc.points or key in tested:
            seen[kind] += 1
            continue  # a step the model was built from, or one with the shape of a step tested before
        seen[kind] = 0
        tested.add(key)
        for grid in grids:
            grid.tol = float("inf")
        frozen = price()
        for grid in grids:
            grid.tol = tol
        served = price()
        true = direct(sc, step)
        errs["frozen"][kind].append(abs(frozen - true) / true)
        if key in sc.points:
            continue  # its own shape was simulated as the model checked its cell
        e = abs(served - true) / true
        errs["as served"][kind].append(e)
        worst = max(worst, (e, step), key=lambda x: x[0])
        if verbose:
            print(f"  {kind} {key}: engine {true:.1f} us, served {served:.1f} ({100 * (served - true) / true:+.3f}%), "
                  f"frozen {frozen:.1f} ({100 * (frozen - true) / true:+.3f}%)", flush=True)
    none = {"as served": "every unseen shape drawn was simulated as the model checked its cell",
            "frozen": "every shape drawn is a model point"}
    for way, by_kind in errs.items():
        print(f" {way}:")
        for kind, e in [*by_kind.items(), ("all", [e for v in by_kind.values() for e in v])]:
            if not e:
                print(f"  {kind:8s} no unseen step: {none[way]}")
                continue
            print(f"  {kind:8s} {len(e):3d} unseen steps: median error {100 * np.median(e):.3f}%, "
                  f"max {100 * max(e):.3f}%")
    ws = worst[1]
    print(f"  ({time.monotonic() - t0:.0f} s, the model now {len(sc.points)} engine points)" + (
          f" worst as served: {ws['phase']} lengths {ws['lengths'][:6]}{'...' if len(ws['lengths']) > 6 else ''} "
          f"new tokens {(ws['new_tokens'] or [])[-4:]}" if ws else ""), flush=True)
    return [e for v in errs["as served"].values() for e in v]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", action="append", help="default k3-tiny")
    p.add_argument("--passes", action="append", help="default baseline and optimized,buckets")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--train", type=int, default=20, help="random steps of each kind the model is built from")
    p.add_argument("--test", type=int, default=45,
                   help="random unseen steps, of distinct shapes, it is checked on as served (the kinds in turn)")
    p.add_argument("--max-len", type=int, help="longest context / prompt drawn (default the model's)")
    p.add_argument("--budget", type=int, help="token budget of a mixed step (default min(512, max len))")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--verbose", action="store_true", help="print the model's growth while it is built")
    p.add_argument("--tol", type=float, default=DEFAULT_TOL, help="the model's tolerance (npusim serve --tol)")
    p.add_argument("--cache-dir", dest="cache", help="npusim's cache folder: the model's points persist between runs")
    a = p.parse_args()
    for w in a.workload or ["k3-tiny"]:
        for passes in a.passes or ["baseline", "optimized,buckets"]:
            bench(w, passes, a.max_batch, a.train, a.test, a.seed, a.max_len, a.budget, a.verbose, a.cache, a.tol)


if __name__ == "__main__":
    main()
