"""`npusim serve`: a load, one service (or two side by side), a summary and files.

Everything the command line gives is checked before the first step is priced: the
numbers (main, arrivals' bounds), the services, the load (drawn or read whole), and
the outputs (not an input, not each other, writable). The files are written all or
none (outputs.all_or_none) once every run has finished; stdout closing early (a
pager, `| head`) drops the rest of the summary, never the files."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from npusim.diskcache.command import add_cache_flags, store_of
from npusim.errors import ConfigError
from npusim.hw import load_hw
from npusim.hw.load import parse_set_args
from npusim.outputs import all_or_none, check_paths, check_writable, say, write_text
from npusim.serving.arrivals import (CV_RANGE, MAX_REQUESTS, MAX_SPAN_S, MAX_TOKENS, check_rate, check_requests,
                                     check_seed, load_trace, parse_ramp, synthetic)
from npusim.serving.report import metrics, requests_csv, summary, write_json
from npusim.serving.service import ServiceConfig, load_service, parse_slo
from npusim.serving.cluster import check_cluster
from npusim.serving.simulate import ServingRun, serve
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
    """The service's step-cost model; `bar` (progress.pricing_progress) counts the engine
    points it needs and prices (the points it will need only when the bar is drawn)."""
    return StepCost(args.workload, hw, svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch,
                    tol=args.tol, store=store_of(args), on_point=bar.started, on_priced=bar.step_priced,
                    on_plan=bar.planned if bar.shown else None, jobs=args.jobs, tp=args.tp)


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


def probe_load(args, rate: float):
    """--max-rate's load at `rate`: --requests Poisson requests, the same seed and lengths."""
    return synthetic(args.requests or 1000, args.seed, "poisson", rate, prompt=args.prompt_lengths,
                     output=args.output_lengths)


def check_max_rate(svc: ServiceConfig) -> None:
    if not any((svc.slo.ttft_ms, svc.slo.tpot_ms, svc.slo.e2e_ms)):
        raise ConfigError("--max-rate: the service sets no SLO: give --slo ttft_ms=...,tpot_ms=...")


def max_rate(svc: ServiceConfig, args, hw, bar, probes: int = 8) -> tuple[float, list[tuple[float, bool]]]:
    """The highest Poisson rate (requests/s) the service sustains, by bisection:
    from --rate, doubled or halved until the limit is bracketed, then `probes` halvings
    of the bracket. Every probe runs the same seed and request count. A service that
    meets the SLOs at every rate up to 2^20 x --rate is not loaded by so few requests:
    an error, not a rate."""
    check_max_rate(svc)
    cost = step_cost(svc, args, hw, bar)
    seen: list[tuple[float, bool]] = []
    n = args.requests or 1000
    slowest = 10 * n / MAX_SPAN_S  # a probe's load must arrive within MAX_SPAN_S (10x: a Poisson tail)

    def ok(rate: float) -> bool:
        bar.probing(rate, lo, hi)
        good = sustainable(metrics(serve(probe_load(args, rate), svc, cost, args.cards, args.router)), svc.slo)
        seen.append((rate, good))
        return good

    rate = check_rate(args.rate if args.rate is not None else 1.0)
    lo = hi = None  # the highest rate met, the lowest missed
    lo, hi = (rate, None) if ok(rate) else (None, rate)
    for _ in range(20):  # bracket: at most 2^20 x away from the first guess
        if lo is not None and hi is not None:
            break
        if hi is None:
            lo, hi = (lo * 2, None) if ok(lo * 2) else (lo, lo * 2)
        elif hi / 2 < slowest:
            break
        else:
            lo, hi = (hi / 2, hi) if ok(hi / 2) else (None, hi / 2)
    if hi is None:
        raise ConfigError(f"--max-rate: {svc.name} met the SLOs at every rate tried, up to {lo:.3g} req/s: {n} "
                          f"requests per probe do not load it (give more --requests)")
    if lo is None:
        return 0.0, seen
    for _ in range(probes):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, seen


def check_args(args) -> None:
    """The command line's numbers and combinations, before anything is loaded."""
    if args.requests is not None:
        check_requests(args.requests)
    check_seed(args.seed)
    if not 0 < args.tol < math.inf:
        raise ConfigError(f"--tol: expected a positive relative error, got {args.tol}")
    if args.jobs < 1:
        raise ConfigError(f"--jobs: expected a positive number of worker processes, got {args.jobs}")
    check_cluster(args.tp if args.cards is None else args.cards, args.tp, args.router)
    if args.max_rate:  # its probes are Poisson loads at rates of its choosing, each a run of its own
        unused = [flag for flag, given in (("--trace-file", args.trace_file), ("--ramp", args.ramp),
                                           (f"--arrival {args.arrival}", args.arrival not in (None, "poisson")))
                  if given]
        if unused:
            raise ConfigError(f"{unused[0]}: not used by --max-rate, whose probes are Poisson loads at the rates "
                              f"it tries (leave it out)")
        per_run = next((flag for flag in ("--csv", "--trace", "--plot") if getattr(args, flag[2:])), None)
        if per_run:
            raise ConfigError(f"{per_run}: --max-rate runs many probes, not one run to write (leave it out; "
                              f"--json writes the rate found and every probe)")


def outputs_of(args, services: list[ServiceConfig]) -> tuple[dict, dict]:
    """The files and folders the command writes, by the flag that asks for them (None:
    not asked for); with --compare, one per service, named after it."""
    files: dict = {"--json": args.json}
    folders: dict = {}
    if len(services) == 2 and services[0].name == services[1].name:
        asked = next((f for f in ("--json", "--csv", "--trace", "--plot") if getattr(args, f[2:])), None)
        if asked:
            raise ConfigError(f"--compare: both services are named '{services[0].name}', so their {asked} outputs "
                              f"would be one (give one of them another name: in its YAML)")
    one = len(services) == 1
    for svc in services:
        tag = "" if one else f" ({svc.name})"
        files[f"--csv{tag}"] = args.csv if one or not args.csv else _suffixed(args.csv, svc.name)
        files[f"--trace{tag}"] = args.trace if one or not args.trace else _suffixed(args.trace, svc.name)
        folders[f"--plot{tag}"] = args.plot if one or not args.plot else str(Path(args.plot) / svc.name)
    return files, folders


def inputs_of(args, names: list[str]) -> dict:
    """The files the command reads, by flag."""
    from npusim.hw.load import find_file
    from npusim.step_flags import inputs

    found = inputs(args)
    flags = ["--compare A", "--compare B"] if args.compare else ["--service"]
    found |= {flag: str(find_file(name, "services")) for flag, name in zip(flags, names)}
    found["--trace-file"] = args.trace_file
    for flag in ("--prompt-lengths", "--output-lengths"):
        kind, _, path = getattr(args, flag[2:].replace("-", "_")).partition(":")
        found[flag] = path if kind == "file" else None
    return found


def main(args) -> int:
    check_args(args)
    hw = load_hw(args.hw, parse_set_args(args.set))
    names = args.compare or [args.service]
    services = [load_service_args(n, args) for n in names]
    if args.max_rate:
        for svc in services:
            check_max_rate(svc)
        probe_load(args, check_rate(args.rate if args.rate is not None else 1.0))  # its lengths and seed, now
        requests = None
    else:
        requests = load_requests(args)
    files, folders = outputs_of(args, services)
    check_paths(files, inputs_of(args, names), folders)
    check_writable(files, folders)
    from npusim.progress import pricing_progress

    with pricing_progress("serve", args.progress) as bar:
        if args.max_rate:
            return _max_rates(args, hw, services, bar)
        return _serve(args, hw, services, requests, bar)


def _max_rates(args, hw, services: list[ServiceConfig], bar) -> int:
    import attrs

    found = {}
    for svc in services:
        rate, seen = max_rate(svc, args, hw, bar)
        bar.close()
        tried = ", ".join(f"{r:.3g}{'' if good else ' x'}" for r, good in seen)
        say(f"{svc.name}: highest sustainable rate {rate:.3g} req/s within {_slo_line(svc.slo)} "
            f"({args.requests or 1000} Poisson requests per probe; tried {tried}; x = missed)")
        found[svc.name] = {"service": svc.name, "max_rate_requests_per_s": rate, "slo": attrs.asdict(svc.slo),
                           "requests_per_probe": args.requests or 1000, "seed": args.seed,
                           "probes": [{"rate_requests_per_s": r, "sustained": good} for r, good in seen]}
    if args.json:
        with all_or_none():
            write_json(found[services[0].name] if len(services) == 1 else found, args.json)
    return 0


def _serve(args, hw, services: list[ServiceConfig], requests, bar) -> int:
    runs, results = [], []
    for svc in services:
        run = serve(requests, svc, step_cost(svc, args, hw, bar), args.cards, args.router)
        bar.close()
        runs.append(run)
        results.append(metrics(run))
        say(summary(results[-1]))
    if len(results) == 2:
        say("")
        say(compare_table(*results))
    plotted = []
    one = len(services) == 1
    with all_or_none():  # written once every run has finished: an interruption leaves none of them
        for svc, run in zip(services, runs):
            if args.csv:
                write_text(args.csv if one else _suffixed(args.csv, svc.name), requests_csv(run))
            if args.plot:
                from npusim.serving.plots import batch_and_kv, latency_cdf

                out = args.plot if one else str(Path(args.plot) / svc.name)
                paths = latency_cdf(run, out) + batch_and_kv(run, out)
                plotted.append(f"plots in {out}: " + ", ".join(dict.fromkeys(p.stem for p in paths)) + " (.png, .svg)")
            if args.trace:
                from npusim.serving.trace import write_trace

                write_trace(run, args.trace if one else _suffixed(args.trace, svc.name))
        if args.json:
            write_json(results[0] if one else {m["service"]: m for m in results}, args.json)
    for line in plotted:
        say(line)
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
    p.add_argument("--rate", type=float, help="requests per second (poisson, gamma, constant); the load must "
                   f"arrive within {MAX_SPAN_S:g} s")
    p.add_argument("--cv", type=float, default=1.0, help="gamma: coefficient of variation of the gaps (from "
                   f"{CV_RANGE[0]:g} to {CV_RANGE[1]:g})")
    p.add_argument("--ramp", metavar="START,STEP,EVERY_S,MAX", help="ramp: Locust-like stepped rate, e.g. "
                   "10,10,30,150")
    p.add_argument("--trace-file", metavar="PATH", help="replay requests from a CSV or JSONL file with arrival_s, "
                   "prompt_tokens, output_tokens")
    p.add_argument("--requests", type=int, help=f"requests to simulate, at most {MAX_REQUESTS} (default 1000; a "
                   "trace: its first N)")
    p.add_argument("--prompt-lengths", default="mix", metavar="SPEC", help="fixed:N, uniform:A,B, "
                   "lognormal:MEDIAN,SIGMA, mix (the seeds' 10%% < 128, 60%% 128-1024, 30%% > 1024) or file:PATH; "
                   f"whole token counts from 1 to {MAX_TOKENS} (a request longer than the workload's context is "
                   "rejected and counted)")
    p.add_argument("--output-lengths", default="fixed:64", metavar="SPEC", help="as --prompt-lengths")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic load (a whole number >= 0)")
    p.add_argument("--slo", metavar="KEY=MS,...", help="SLOs (ttft_ms, tpot_ms, e2e_ms, timeout_ms) over the "
                   "service's")
    p.add_argument("--max-rate", action="store_true", help="find the highest Poisson rate meeting the SLOs by "
                   "bisection (starting from --rate)")
    p.add_argument("--json", metavar="PATH", help="write the metrics as JSON (--max-rate: the rate found and its "
                   "probes)")
    p.add_argument("--csv", metavar="PATH", help="write one row per request")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace: steps, request lifetimes, batch and KV "
                   "counters")
    p.add_argument("--plot", metavar="DIR", help="write plots: latency CDF, batch and KV cache over time")
    p.add_argument("--cards", type=int, help="cards serving the load: --cards / --tp replicas of the service, "
                   "each on --tp cards, behind --router (default: --tp, one replica)")
    p.add_argument("--tp", type=int, default=1, help="cards per replica: each step is one card's tensor-parallel "
                   "shard with its all_reduces, priced as `npusim run --tp` prices a step")
    p.add_argument("--router", default="round-robin", metavar="NAME", help="which replica a request goes to as it "
                   "arrives: round-robin (in turn), shortest-queue (the fewest requests in the replica) or "
                   "least-loaded (the fewest prompt + output tokens in it)")
    add_cache_flags(p)
    p.add_argument("--tol", type=float, default=DEFAULT_TOL, help="step-cost model: relative error at which a "
                   "grid cell is split")
    p.add_argument("--jobs", type=int, default=1, help="worker processes pricing the step-cost model's engine "
                   "points at once (a split cell's two halves, a cell's corners); the results do not depend on it")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, help="count the steps the engine "
                   "simulates for the step-cost model, on stderr (default: only when stderr is a terminal)")


__all__ = ["add_arguments", "compare_table", "load_requests", "main"]
