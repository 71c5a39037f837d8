"""`npusim serve`: a load, one service (or two side by side), a summary and files."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from npusim.diskcache.command import add_cache_flags, store_of
from npusim.errors import ConfigError
from npusim.hw import load_hw
from npusim.hw.load import parse_set_args
from npusim.outputs import write_text
from npusim.serving.arrivals import check_rate, load_trace, parse_ramp, synthetic
from npusim.serving.report import metrics, requests_csv, summary, write_json
from npusim.serving.service import ServiceConfig, load_service, parse_slo
from npusim.serving.simulate import ServingRun, simulate
from npusim.serving.stepcost import DEFAULT_TOL, StepCost


def load_requests(args):
    """The load the arguments describe: a replayed trace file, or a synthetic one."""
    if args.trace_file:
        return load_trace(args.trace_file, args.requests)
    process = args.arrival or ("ramp" if args.ramp else "poisson")
    if process == "trace":
        raise ConfigError("--arrival trace: give --trace-file PATH")
    ramp = parse_ramp(args.ramp) if args.ramp else None
    if process == "ramp" and ramp is None:
        raise ConfigError("--arrival ramp: give --ramp START,STEP,EVERY_S,MAX")
    if process != "ramp":
        if args.rate is None:
            raise ConfigError(f"--rate: required with --arrival {process} (requests per second)")
        check_rate(args.rate)
    return synthetic(args.requests or 1000, args.seed, process, args.rate, args.cv, ramp, args.prompt_lengths,
                     args.output_lengths)


def load_service_args(name: str, args) -> ServiceConfig:
    import attrs

    svc = load_service(name, parse_set_args(args.service_set))
    if args.slo:
        svc = attrs.evolve(svc, slo=parse_slo(args.slo, svc.slo))
    return svc


def step_cost(svc: ServiceConfig, args, hw, bar) -> StepCost:
    """The service's step-cost model; `bar` counts the engine points it simulates."""
    started = itertools.count(1)

    def on_point(key: tuple) -> None:
        phase, *shape = key
        bar(next(started), None, note=f"{phase} {' x '.join(map(str, shape))}")

    return StepCost(args.workload, hw, svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch,
                    tol=args.tol, store=store_of(args), on_point=on_point, jobs=args.jobs)


def compare_table(a: dict, b: dict) -> str:
    """Two runs' headline figures side by side, with the change."""
    rows = [("requests/s", "requests_per_s", None), ("output tokens/s", "output_tokens_per_s", None),
            ("goodput req/s", "goodput_requests_per_s", None), ("completed", "completed", None),
            ("failed (OOM)", "failed_oom", None), ("timed out", "timed_out", None)]
    for key in ("ttft", "tpot", "e2e"):
        rows += [(f"{key.upper()} {p} ms", key, f"{p.lower()}_ms") for p in ("P50", "P90", "P99")]
    lines = [f"{'':18s}{a['service']:>18s}{b['service']:>18s}{'change':>10s}"]
    for label, key, sub in rows:
        va = a[key][sub] if sub else a[key]
        vb = b[key][sub] if sub else b[key]
        change = f"{vb / va:.2f}x" if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else "-"
        fa = "-" if va is None else f"{va:.1f}" if isinstance(va, float) else str(va)
        fb = "-" if vb is None else f"{vb:.1f}" if isinstance(vb, float) else str(vb)
        lines.append(f"{label:18s}{fa:>18s}{fb:>18s}{change:>10s}")
    return "\n".join(lines)


def sustainable(m: dict, slo) -> bool:
    """The run meets the SLOs as capacity searches use them (Vidur's): TTFT P90,
    TPOT P99 and end-to-end P90 within their limits, and no request lost."""
    checks = ((m["ttft"]["p90_ms"], slo.ttft_ms), (m["tpot"]["p99_ms"], slo.tpot_ms), (m["e2e"]["p90_ms"], slo.e2e_ms))
    lost = m["timed_out"] + m["failed_oom"]
    return not lost and all(limit is None or (v is not None and v <= limit) for v, limit in checks)


def max_rate(svc: ServiceConfig, args, hw, bar, probes: int = 8) -> tuple[float, list[tuple[float, bool]]]:
    """The highest Poisson rate (requests/s) the service sustains, by bisection:
    from --rate, doubled or halved until the limit is bracketed, then `probes` halvings
    of the bracket. Every probe runs the same seed and request count."""
    if not any((svc.slo.ttft_ms, svc.slo.tpot_ms, svc.slo.e2e_ms)):
        raise ConfigError("--max-rate: the service sets no SLO: give --slo ttft_ms=...,tpot_ms=...")
    cost = step_cost(svc, args, hw, bar)
    seen: list[tuple[float, bool]] = []

    def ok(rate: float) -> bool:
        reqs = synthetic(args.requests or 1000, args.seed, "poisson", rate, prompt=args.prompt_lengths,
                         output=args.output_lengths)
        good = sustainable(metrics(simulate(reqs, svc, cost)), svc.slo)
        seen.append((rate, good))
        return good

    rate = check_rate(args.rate if args.rate is not None else 1.0)
    lo, hi = (rate, None) if ok(rate) else (None, rate)
    for _ in range(20):  # bracket: at most 2^20 x away from the first guess
        if lo is not None and hi is not None:
            break
        if hi is None:
            lo, hi = (lo * 2, None) if ok(lo * 2) else (lo, lo * 2)
        else:
            lo, hi = (hi / 2, hi) if ok(hi / 2) else (None, hi / 2)
    if lo is None:
        return 0.0, seen
    for _ in range(probes):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, seen


def main(args) -> int:
    if args.requests is not None and args.requests < 1:
        raise ConfigError(f"--requests: expected a positive number of requests, got {args.requests}")
    if not args.tol > 0:
        raise ConfigError(f"--tol: expected a positive relative error, got {args.tol}")
    if args.jobs < 1:
        raise ConfigError(f"--jobs: expected a positive number of worker processes, got {args.jobs}")
    hw = load_hw(args.hw, parse_set_args(args.set))
    names = args.compare or [args.service]
    services = [load_service_args(n, args) for n in names]
    from npusim.progress import progress_bar

    with progress_bar("serve", "engine steps", args.progress) as bar:
        return _serve(args, hw, services, bar)


def _serve(args, hw, services: list[ServiceConfig], bar) -> int:
    if args.max_rate:
        for svc in services:
            rate, seen = max_rate(svc, args, hw, bar)
            bar.close()
            tried = ", ".join(f"{r:.3g}{'' if good else ' x'}" for r, good in seen)
            print(f"{svc.name}: highest sustainable rate {rate:.3g} req/s within {_slo_line(svc.slo)} "
                  f"({args.requests or 1000} Poisson requests per probe; tried {tried}; x = missed)")
        return 0
    requests = load_requests(args)
    results = []
    for svc in services:
        run = simulate(requests, svc, step_cost(svc, args, hw, bar))
        bar.close()
        m = metrics(run)
        results.append(m)
        print(summary(m))
        if args.csv:
            path = args.csv if len(services) == 1 else _suffixed(args.csv, svc.name)
            write_text(path, requests_csv(run))
        if args.plot:
            from npusim.serving.plots import batch_and_kv, latency_cdf

            out = args.plot if len(services) == 1 else str(Path(args.plot) / svc.name)
            paths = latency_cdf(run, out) + batch_and_kv(run, out)
            print(f"plots in {out}: " + ", ".join(dict.fromkeys(p.stem for p in paths)) + " (.png, .svg)")
        if args.trace:
            from npusim.serving.trace import write_trace

            write_trace(run, args.trace if len(services) == 1 else _suffixed(args.trace, svc.name))
    if len(results) == 2:
        print()
        print(compare_table(*results))
    if args.json:
        write_json(results[0] if len(results) == 1 else {m["service"]: m for m in results}, args.json)
    return 0


def _slo_line(slo) -> str:
    parts = [f"TTFT P90 <= {slo.ttft_ms:g} ms" if slo.ttft_ms else "", f"TPOT P99 <= {slo.tpot_ms:g} ms"
             if slo.tpot_ms else "", f"end-to-end P90 <= {slo.e2e_ms:g} ms" if slo.e2e_ms else ""]
    return ", ".join(p for p in parts if p)


def _suffixed(path: str, name: str) -> str:
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{name}{p.suffix}"))


def add_arguments(p) -> None:
    p.add_argument("--service", default="seed-optimized", help="service config name (services/) or path")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two service configs side by side on one load")
    p.add_argument("--service-set", action="append", metavar="KEY.PATH=VALUE",
                   help="override a service field (e.g. scheduler.max_batch=16)")
    p.add_argument("--workload", default="k3", help="workload name (workloads/) or path")
    p.add_argument("--hw", default="ascend910b2", help="hardware config name or path")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a hardware field")
    p.add_argument("--arrival", choices=("poisson", "gamma", "constant", "ramp", "trace"),
                   help="arrival process (default: trace with --trace-file, ramp with --ramp, else poisson)")
    p.add_argument("--rate", type=float, help="requests per second (poisson, gamma, constant)")
    p.add_argument("--cv", type=float, default=1.0, help="gamma: coefficient of variation of the gaps")
    p.add_argument("--ramp", metavar="START,STEP,EVERY_S,MAX", help="ramp: Locust-like stepped rate, e.g. "
                   "10,10,30,150")
    p.add_argument("--trace-file", metavar="PATH", help="replay requests from a CSV or JSONL file with arrival_s, "
                   "prompt_tokens, output_tokens")
    p.add_argument("--requests", type=int, help="requests to simulate (default 1000; a trace: its first N)")
    p.add_argument("--prompt-lengths", default="mix", metavar="SPEC", help="fixed:N, uniform:A,B, "
                   "lognormal:MEDIAN,SIGMA, mix (the seeds' 10%% < 128, 60%% 128-1024, 30%% > 1024) or file:PATH")
    p.add_argument("--output-lengths", default="fixed:64", metavar="SPEC", help="as --prompt-lengths")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic load")
    p.add_argument("--slo", metavar="KEY=MS,...", help="SLOs (ttft_ms, tpot_ms, e2e_ms, timeout_ms) over the "
                   "service's")
    p.add_argument("--max-rate", action="store_true", help="find the highest Poisson rate meeting the SLOs by "
                   "bisection (starting from --rate)")
    p.add_argument("--json", metavar="PATH", help="write the metrics as JSON")
    p.add_argument("--csv", metavar="PATH", help="write one row per request")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace: steps, request lifetimes, batch and KV "
                   "counters")
    p.add_argument("--plot", metavar="DIR", help="write plots: latency CDF, batch and KV cache over time")
    add_cache_flags(p)
    p.add_argument("--tol", type=float, default=DEFAULT_TOL, help="step-cost model: relative error at which a "
                   "grid cell is split")
    p.add_argument("--jobs", type=int, default=1, help="worker processes pricing the step-cost model's engine "
                   "points at once (a split cell's two halves, a cell's corners); the results do not depend on it")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, help="count the steps the engine "
                   "simulates for the step-cost model, on stderr (default: only when stderr is a terminal)")


__all__ = ["add_arguments", "compare_table", "load_requests", "main"]
