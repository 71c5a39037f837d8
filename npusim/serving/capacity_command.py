"""`npusim serve --max-rate` and `--plan`: the highest Poisson rate a service sustains
within its SLOs (bisection over probe loads), and the fewest cards that serve a rate
(the search of plan.py over cards x tp x replicas x P/D splits). npusim.serving.command
checks their flags and outputs and calls these."""

from __future__ import annotations

import argparse
import math

from npusim.errors import ConfigError, NpusimError
from npusim.hw.parse import counted
from npusim.outputs import all_or_none, say, write_json, wrote_line
from npusim.serving.arrivals import MAX_SPAN_S, check_rate, synthetic
from npusim.serving.cluster import MAX_CARDS
from npusim.serving.command import pd_of, step_cost
from npusim.serving.disagg import DECODE_SCHEDULERS
from npusim.serving.plan import Shape, plan_json, search, shapes, table
from npusim.serving.report import metrics, missed, slo_line, sustainable
from npusim.serving.service import ServiceConfig
from npusim.serving.simulate import serve
from npusim.step_flags import workload_sets
from npusim.workload import load_workload


def probe_load(args, rate: float):
    """--max-rate's load at `rate`: --requests Poisson requests, the same seed and lengths."""
    return synthetic(args.requests or 1000, args.seed, "poisson", rate, prompt=args.prompt_lengths,
                     output=args.output_lengths)


def check_probe_load(args, load, services: list[ServiceConfig]) -> None:
    """One-line ConfigError when every request of the probe load is longer than the
    workload's context: each probe rejects them all, and the search blamed the SLOs
    ('no rate meets these SLOs', 'loosen --slo, or give more --max-cards'); or when a
    service's only SLO is a TPOT limit and no request has a TPOT (one output token each):
    every load met it, and the search asked for more --requests."""
    flag = "--max-rate" if args.max_rate else "--plan"
    for svc in services:
        if not (svc.slo.ttft_ms or svc.slo.e2e_ms) and all(r.output_tokens == 1 for r in load):
            raise ConfigError(f"{flag}: {svc.name}'s only SLO is tpot_ms, but every request has one output token "
                              f"(--output-lengths {args.output_lengths}), so none has a TPOT to limit (give "
                              f"--slo ttft_ms=... or e2e_ms=..., or longer outputs)")
    context = load_workload(args.workload, workload_sets(args)).max_context_tokens
    if all(r.prompt_tokens + r.output_tokens > context for r in load):
        who, them = ("the one request", "it") if len(load) == 1 else (f"every one of the {len(load)} requests",
                                                                     "them all")
        raise ConfigError(f"{flag}: {who} (--prompt-lengths {args.prompt_lengths}, "
                          f"--output-lengths {args.output_lengths}) is longer than the workload's context of "
                          f"{context} tokens: each probe would reject {them} (give shorter lengths)")


def check_max_rate(svc: ServiceConfig) -> None:
    if not any((svc.slo.ttft_ms, svc.slo.tpot_ms, svc.slo.e2e_ms)):
        raise ConfigError("--max-rate: the service sets no SLO: give --slo ttft_ms=...,tpot_ms=...")


def max_rate(svc: ServiceConfig, args, hw, bar, probes: int = 8) -> tuple[float, list[tuple[float, bool]]]:
    """The highest Poisson rate (requests/s) the service sustains, by bisection:
    from --rate, doubled until the limit is bracketed, or, if --rate misses, halved
    three times, then down at once to the slowest load a probe may be (MAX_SPAN_S);
    then geometric bisections down to a 2x bracket and `probes` halvings of it. Every
    probe runs the same seed and request count. Two errors, not rates: a service that
    meets the SLOs at every rate up to 2^20 x --rate is not loaded by so few requests,
    and one that misses them at the slowest load has SLOs no rate meets (the message
    names what it missed) - unless it batches statically: its batch waits for max_batch
    requests, longer the slower they come, so the rates above --rate are tried first."""
    check_max_rate(svc)
    cost = step_cost(svc, args, hw, bar)
    seen: list[tuple[float, bool]] = []
    n = args.requests or 1000
    per_probe = "1 request per probe does" if n == 1 else f"{n} requests per probe do"
    slowest = 10 * n / MAX_SPAN_S  # a probe's load must arrive within MAX_SPAN_S (10x: a Poisson tail)
    last: dict = {}

    def ok(rate: float) -> bool:
        bar.probing(rate, lo, hi)
        last["m"] = metrics(serve(probe_load(args, rate), svc, cost, args.cards, args.router, pd_of(args),
                                  args.pd_router))
        good = sustainable(last["m"], svc.slo)
        seen.append((rate, good))
        return good

    rate = check_rate(args.rate if args.rate is not None else 1.0)
    lo = hi = None  # the highest rate met, the lowest missed
    lo, hi = (rate, None) if ok(rate) else (None, rate)
    for _ in range(20):  # bracket: at most 2^20 x above the first guess, and below float's largest
        if hi is not None or lo * 2 == math.inf:
            break
        lo, hi = (lo * 2, None) if ok(lo * 2) else (lo, lo * 2)
    if hi is None:
        raise ConfigError(f"--max-rate: {svc.name} met the SLOs at every rate tried, up to {lo:.3g} req/s: "
                          f"{per_probe} not load it (give more --requests)")
    for _ in range(3):  # a few halvings first: the limit is most often near the first guess
        if lo is not None or hi / 2 < slowest:
            break
        lo, hi = (hi / 2, hi) if ok(hi / 2) else (None, hi / 2)
    if lo is None:
        if hi <= slowest or not ok(slowest):
            why = missed(last["m"], svc.slo)  # at the slowest load
            if svc.scheduler.kind == "static":  # a batch waits for max_batch requests: slower loads wait longer,
                top, r = None, rate  # so a rate above the first may meet ('no rate meets' when --rate 1 met)
                for _ in range(40):
                    r *= 2
                    if r == math.inf or lo is None and r > rate * 2 ** 20:
                        break
                    if ok(r):
                        lo = r
                    elif lo is not None:
                        top = r
                        break
                if lo is not None and top is None:
                    raise ConfigError(f"--max-rate: {svc.name} met the SLOs at every rate tried above {rate:.3g} "
                                      f"req/s, up to {lo:.3g}: {per_probe} not load it (give more "
                                      f"--requests)")
                hi = top if lo is not None else hi
            if lo is None:
                raise ConfigError(f"--max-rate: {svc.name} misses {slo_line(svc.slo)} even at {min(hi, slowest):.3g} "
                                  f"req/s ({counted(n, 'request')} one at a time, unloaded): {why}; no rate meets "
                                  f"these SLOs")
        else:
            lo = slowest
    while hi > 2 * lo:  # geometric down to a 2x bracket: a few probes however wide the first
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    for _ in range(probes):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, seen


def check_plan_args(args) -> None:
    """--plan's combinations: one service, a Poisson rate, the most cards, and no flag it does not use."""
    if args.max_cards is None:
        raise ConfigError("--plan: give --max-cards C (the most cards the search may use)")
    if not 1 <= args.max_cards <= MAX_CARDS:
        raise ConfigError(f"--max-cards: expected a whole number of cards from 1 to {MAX_CARDS}, got {args.max_cards}")
    if args.rate is None:
        raise ConfigError("--plan: give --rate R (the Poisson load, requests per second, the cards must serve)")
    if args.backend is not None:
        from npusim.backends import BACKENDS

        if args.backend not in BACKENDS:
            raise ConfigError(f"--backend {args.backend}: unknown backend (expected one of: {', '.join(BACKENDS)})")
        if args.address is not None and args.backend != "ray":
            raise ConfigError(f"--address {args.address}: only the ray backend connects to a cluster "
                              f"(add --backend ray)")
    elif args.address is not None:
        raise ConfigError(f"--address {args.address}: only --backend ray connects to a cluster")
    unused = [flag for flag, given in (("--max-rate", args.max_rate), ("--compare", args.compare),
                                       (f"--pd {args.pd}", args.pd),
                                       ("--cards", args.cards is not None), (f"--tp {args.tp}", args.tp != 1),
                                       ("--trace-file", args.trace_file), ("--ramp", args.ramp),
                                       (f"--arrival {args.arrival}", args.arrival not in (None, "poisson")),
                                       ("--cv", args.cv is not None),  # was ignored: its probes are Poisson loads
                                       *((f, getattr(args, f[2:])) for f in ("--csv", "--trace", "--plot")))
              if given]
    if unused:
        raise ConfigError(f"{unused[0]}: not used by --plan, which serves a Poisson load at --rate on the clusters "
                          f"it tries, each of its own cards and tp (leave it out; --json writes every one)")


def max_rates(args, hw, services: list[ServiceConfig], bar) -> int:
    import attrs

    found = {}
    for svc in services:
        rate, seen = max_rate(svc, args, hw, bar)
        bar.close()
        tried = ", ".join(f"{r:.3g}{'' if good else ' x'}" for r, good in seen)
        say(f"{svc.name}: highest sustainable rate {rate:.3g} req/s within {slo_line(svc.slo)} "
            f"({counted(args.requests or 1000, 'Poisson request')} per probe; tried {tried}; x = missed)")
        found[svc.name] = {"service": svc.name, "max_rate_requests_per_s": rate, "slo": attrs.asdict(svc.slo),
                           "requests_per_probe": args.requests or 1000, "seed": args.seed,
                           "probes": [{"rate_requests_per_s": r, "sustained": good} for r, good in seen]}
    if args.json:
        with all_or_none():
            write_json(args.json, found[services[0].name] if len(services) == 1 else found)
        say(wrote_line([args.json]))
    return 0


def plan(args, hw, svc: ServiceConfig, bar) -> int:
    """The capacity planner (plan.py) on --max-rate's probe load at --rate: the candidates
    of a card count served one after another here, or at once on --backend."""
    load = probe_load(args, args.rate)
    if args.backend is None:
        points: dict[int, dict] = {}  # by tp: the engine points priced so far, shared by the candidates

        def serve_all(shapes_n: list[Shape]) -> list:
            return [serve_cluster(args, hw, svc, load, points, bar, shape) for shape in shapes_n]
    else:
        from npusim.backends import get_backend

        backend = get_backend(args.backend, args.jobs, args.address)
        # a worker prices its own engine points (or reads them from the cache), one at a time; a task is
        # serve_cluster itself with all it reads (Ray runs a module's function, not a closure)
        ctx = (argparse.Namespace(**(vars(args) | {"jobs": 1})), hw, svc, load, None, None)

        def serve_all(shapes_n: list[Shape]) -> list:
            out: list = [None] * len(shapes_n)
            lost: dict[int, str] = {}
            backend.run(serve_cluster, [(*ctx, shape) for shape in shapes_n], out.__setitem__, lost.__setitem__)
            if lost:
                i, why = min(lost.items())
                raise NpusimError(f"--plan: {shapes_n[i].name} on {counted(shapes_n[i].cards, 'card')} could not be "
                                  f"served on "
                                  f"--backend {args.backend}: {why}")
            return out

    w = load_workload(args.workload, workload_sets(args))
    split = svc.scheduler.kind in DECODE_SCHEDULERS  # P/D candidates: decode instances batch at iteration level
    found = search(serve_all, lambda n: shapes(n, w, hw, split), svc.slo, args.rate, args.max_cards,
                   monotone=svc.scheduler.kind != "static")
    bar.close()
    n = args.requests or 1000
    say(f"{svc.name} on {w.name} / {hw.name}: {counted(n, 'Poisson request')} at {args.rate:g} req/s (seed "
        f"{args.seed}), "
        f"router {args.router}" + (f", prefill -> decode {args.pd_router}" if split else "")
        + "; the best cluster of each card count tried (latencies in ms):")
    say(table(found))
    if args.json:
        with all_or_none():
            write_json(args.json, plan_json(found, service=svc.name, workload=w.name, hw=hw.name, requests=n,
                                            seed=args.seed, router=args.router,
                                            **({"pd_router": args.pd_router} if split else {})))
        tried = len(found.tried)
        say(f"wrote {args.json}: the answer, the frontier and "
            f"{'the one cluster' if tried == 1 else f'all {tried} clusters'} tried")
    return 0


def serve_cluster(args, hw, svc: ServiceConfig, load, points: dict | None, bar, shape: Shape) -> dict | str:
    """--plan's candidate `shape` serving `load`: its metrics, or why it does not fit a card.
    Each on a fresh step-cost model (its grid refined as for this cluster alone, so its
    figures are what `npusim serve` prints for it, whatever was tried before or beside it)
    that starts from `points` (by tp: the engine points priced so far in this process;
    None in a worker: its own, and the disk cache's). `bar`: the pricing display (None: none)."""
    from npusim.progress import pricing_progress

    cost = step_cost(svc, args, hw, bar or pricing_progress("serve", False), shape.tp)
    if points is not None:
        cost.points = points.setdefault(shape.tp, {})
    try:
        return metrics(serve(load, svc, cost, shape.cards, args.router, shape.pd, args.pd_router))
    except ConfigError as e:  # it does not fit a card: a candidate that misses, and why
        return str(e)


__all__ = ["check_max_rate", "check_plan_args", "check_probe_load", "max_rate", "max_rates", "plan", "probe_load",
           "serve_cluster"]
