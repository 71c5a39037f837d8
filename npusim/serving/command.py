"""`npusim serve`: a load, one service (or two side by side; with --pd, disaggregated
beside colocated on the same cards), a summary and files; --max-rate searches the
highest rate a service sustains, --plan the fewest cards that serve a rate (both in
capacity_command.py).

Everything the command line gives is checked before the first step is priced: the
numbers (main, arrivals' bounds), the services, the load (drawn or read whole), and
the outputs (not an input, not each other, writable). The files are written all or
none (outputs.all_or_none) once every run has finished; stdout closing early (a
pager, `| head`) drops the rest of the summary, never the files."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from npusim.diskcache.command import add_cache_flags, store_of
from npusim.step_flags import add_fast_forward_flag, add_workload_set, workload_of
from npusim.errors import ConfigError
from npusim.hw import load_hw
from npusim.hw.load import parse_set_args
from npusim.outputs import all_or_none, plots_line, say, say_all, write_json, write_text, wrote_line
from npusim.outputs_check import check_paths, check_writable
from npusim.pool import check_jobs
from npusim.serving.arrivals import (CV_RANGE, MAX_REQUESTS, MAX_SPAN_S, MAX_TOKENS, check_rate, check_requests,
                                     check_seed, load_trace, parse_ramp, synthetic)
from npusim.serving.report import metrics, requests_csv, summary
from npusim.serving.routers import make_router
from npusim.serving.service import ServiceConfig, load_service, parse_slo
from npusim.serving.cluster import check_cluster, check_topology
from npusim.serving.disagg import DECODE_SCHEDULERS, DEFAULT_PD_ROUTER, check_pd, parse_pd
from npusim.serving.plan import check_slo
from npusim.serving.simulate import serve
from npusim.serving.stepcost import DEFAULT_TOL, StepCost


# --cv not given: gamma gaps with cv 1 are exponential ones, a Poisson process's variability.
DEFAULT_CV = 1.0
DEFAULT_SEED = 0  # of a synthetic load (--seed)
DEFAULT_LENGTHS = {"--prompt-lengths": "mix", "--output-lengths": "fixed:64"}  # of a synthetic load
PLOT_NAMES = ("latency_cdf.png", "latency_cdf.svg", "batch_kv.png", "batch_kv.svg")  # what --plot DIR holds


def load_requests(args):
    """The load the arguments describe: a replayed trace file, or a synthetic one."""
    process = args.arrival or ("trace" if args.trace_file else "ramp" if args.ramp else "poisson")
    unused_by(process, args)
    if args.trace_file:
        return load_trace(args.trace_file, args.requests, "--trace-file")
    if process == "trace":
        raise ConfigError("--arrival trace: give --trace-file PATH")
    ramp = parse_ramp(args.ramp) if args.ramp else None
    if process == "ramp" and ramp is None:
        raise ConfigError("--arrival ramp: give --ramp START,STEP,EVERY_S,MAX")
    if process != "ramp":
        if args.rate is None:
            raise ConfigError(f"--rate: required with --arrival {process} (requests per second)")
        check_rate(args.rate)
    cv = DEFAULT_CV if args.cv is None else args.cv
    return synthetic(args.requests or 1000, args.seed, process, args.rate, cv, ramp, args.prompt_lengths,
                     args.output_lengths)


def unused_by(process: str, args) -> None:
    """One-line ConfigError for a load flag the arrival process would ignore (a --rate
    beside --ramp or a trace, a --cv beside anything but gamma): not a silent other load."""
    uses = {"--rate": process in ("poisson", "gamma", "constant"), "--ramp": process == "ramp",
            "--cv": process == "gamma", "--trace-file": process == "trace"}
    given = {"--rate": args.rate is not None, "--ramp": bool(args.ramp), "--cv": args.cv is not None,
             "--trace-file": bool(args.trace_file)}
    flag = next((f for f in uses if given[f] and not uses[f]), None)
    if flag:
        raise ConfigError(f"{flag}: not used by --arrival {process} (leave it out, or give the --arrival that uses it)")


def load_service_args(name: str, args) -> ServiceConfig:
    import attrs

    svc = load_service(name, parse_set_args(args.service_set, "--service-set"))
    if args.slo:
        # each --slo's keys: the last --slo alone was kept, the SLOs of the others dropped silently
        svc = attrs.evolve(svc, slo=parse_slo(",".join(args.slo), svc.slo))
    return svc


def step_cost(svc: ServiceConfig, args, hw, bar, tp: int | None = None) -> StepCost:
    """The service's step-cost model (replicas of `tp` cards, default --tp); `bar`
    (progress.pricing_progress) counts the engine points it needs and prices (the
    points it will need only when the bar is drawn)."""
    return StepCost(workload_of(args), hw, svc.passes, svc.pass_options(), max_batch=svc.scheduler.max_batch,
                    tol=args.tol, store=store_of(args), on_point=bar.started, on_priced=bar.step_priced,
                    on_plan=bar.planned if bar.shown else None, jobs=args.jobs or os.cpu_count() or 1,
                    tp=args.tp if tp is None else tp,
                    exact=getattr(args, "exact", True))


def compare_table(a: dict, b: dict, labels: tuple[str, str] | None = None) -> str:
    """Two runs' headline figures side by side, with the change; `labels`: their column
    heads (default: their services' names)."""
    rows = [("requests/s", "requests_per_s", None), ("output tokens/s", "output_tokens_per_s", None),
            ("goodput req/s", "goodput_requests_per_s", None), ("completed", "completed", None),
            ("failed (OOM)", "failed_oom", None), ("timed out", "timed_out", None)]
    for key in ("ttft", "tpot", "e2e"):
        rows += [(f"{key.upper()} {p} ms", key, f"{p.lower()}_ms") for p in ("P50", "P90", "P99")]
    la, lb = labels or (a["service"], b["service"])
    # a space before each column however wide its value (1.0e8 ms and 1651624.94x read as 102400062.11651624.94x)
    lines = [f"{'':18s}{la:>18s} {lb:>17s} {'change':>9s}"]
    for label, key, sub in rows:
        va = a[key][sub] if sub else a[key]
        vb = b[key][sub] if sub else b[key]
        change = f"{vb / va:.2f}x" if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else "-"
        fa = "-" if va is None else f"{va:.1f}" if isinstance(va, float) else str(va)
        fb = "-" if vb is None else f"{vb:.1f}" if isinstance(vb, float) else str(vb)
        lines.append(f"{label:18s}{fa:>18s} {fb:>17s} {change:>9s}")
    return "\n".join(lines)


def check_args(args) -> None:
    """The command line's numbers and combinations, before anything is loaded."""
    for flag, default in DEFAULT_LENGTHS.items():
        name = flag[2:].replace("-", "_")
        if args.trace_file and getattr(args, name) is not None:  # the trace's lengths were served, these not
            raise ConfigError(f"{flag}: not used by --trace-file, whose requests give their own lengths (leave it out)")
        setattr(args, name, getattr(args, name) or default)
    if args.requests is not None:
        check_requests(args.requests)
    if args.trace_file and args.seed is not None:  # the trace's requests were served, the seed drew nothing
        raise ConfigError("--seed: not used by --trace-file, whose requests are read, not drawn (leave it out)")
    args.seed = DEFAULT_SEED if args.seed is None else args.seed
    check_seed(args.seed)
    if not 0 < args.tol < math.inf:
        raise ConfigError(f"--tol: expected a positive relative error, got {args.tol}")
    check_jobs(args.jobs)
    pd = pd_of(args)
    if pd is not None:
        check_pd(pd, args.cards, args.tp)
    check_cluster(cards_of(args), args.tp, args.router)  # kv-local: a decode side's (--pd-router) only
    if pd is not None or args.plan:
        make_router(args.pd_router, "--pd-router", prefilled=True)
    elif args.pd_router != DEFAULT_PD_ROUTER:
        raise ConfigError(f"--pd-router {args.pd_router}: only --pd (and --plan's P:D splits) use it")
    if pd is not None:
        if args.compare:
            raise ConfigError("--compare: --pd compares disaggregated serving with colocated serving on the same "
                              "cards itself (leave --compare out)")
    if args.plan:
        from npusim.serving.capacity_command import check_plan_args

        check_plan_args(args)
    else:
        for flag, given in (("--max-cards", args.max_cards is not None), ("--backend", args.backend),
                            ("--address", args.address)):
            if given:
                raise ConfigError(f"{flag}: only --plan uses it (the serve of one cluster runs in this process)")
    if args.max_rate:  # its probes are Poisson loads at rates of its choosing, each a run of its own
        unused = [flag for flag, given in (("--trace-file", args.trace_file), ("--ramp", args.ramp),
                                           (f"--arrival {args.arrival}", args.arrival not in (None, "poisson")),
                                           ("--cv", args.cv is not None))
                  if given]
        if unused:
            raise ConfigError(f"{unused[0]}: not used by --max-rate, whose probes are Poisson loads at the rates "
                              f"it tries (leave it out)")
        per_run = next((flag for flag in ("--csv", "--trace", "--plot") if getattr(args, flag[2:])), None)
        if per_run:
            raise ConfigError(f"{per_run}: --max-rate runs many probes, not one run to write (leave it out; "
                              f"--json writes the rate found and every probe)")


def pd_of(args) -> tuple[int, int] | None:
    """--pd P:D as (P, D), or None."""
    return parse_pd(args.pd) if args.pd else None


def cards_of(args) -> int:
    """The cards serving the load: --cards, or P + D with --pd, or --tp (one replica)."""
    pd = pd_of(args)
    return args.cards if args.cards is not None else sum(pd) if pd else args.tp


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


def plot_files(folders: dict) -> dict:
    """The files each --plot folder will hold, by flag: no other output may be one of them
    (--json DIR/latency_cdf.png was replaced by the plot)."""
    return {f"{flag} ({name})": os.path.join(folder, name) for flag, folder in folders.items() if folder
            for name in PLOT_NAMES}


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
    from npusim.serving.capacity_command import check_max_rate, check_probe_load, max_rates, plan, probe_load

    check_args(args)
    hw = load_hw(args.hw, parse_set_args(args.set))
    # the cards asked for, on the topology's nodes (a cluster checks it too, when a run starts)
    if args.plan:
        check_topology("--max-cards", args.max_cards, hw)
    else:
        flag = "--cards" if args.cards is not None else f"--pd {args.pd}" if args.pd else f"--tp {args.tp}"
        check_topology(flag, cards_of(args), hw)
    names = args.compare or [args.service]
    services = [load_service_args(n, args) for n in names]
    if args.pd:
        check_pd(pd_of(args), args.cards, args.tp, services[0])
    if args.plan:
        check_slo(services[0].slo)
        kind = services[0].scheduler.kind
        if args.pd_router != DEFAULT_PD_ROUTER and kind not in DECODE_SCHEDULERS:  # it routed nothing, silently
            raise ConfigError(f"--pd-router {args.pd_router}: service {services[0].name} batches with '{kind}', so "
                              f"--plan tries no P:D split (only {', '.join(DECODE_SCHEDULERS)} services are split; "
                              f"leave it out)")
        check_probe_load(args, probe_load(args, check_rate(args.rate)), services)  # its lengths and seed, now
        requests = None
    elif args.max_rate:
        for svc in services:
            check_max_rate(svc)
        load = probe_load(args, check_rate(args.rate if args.rate is not None else 1.0))  # its lengths and seed, now
        check_probe_load(args, load, services)
        requests = None
    else:
        requests = load_requests(args)
    files, folders = outputs_of(args, services)  # two services of one name: their outputs would be one
    if args.compare and services[0] == services[1]:  # --service-set applies to both: one run twice
        raise ConfigError(f"--compare {' '.join(args.compare)}: the same service on both sides, nothing to compare "
                          f"(give two different ones)")
    check_paths(files | plot_files(folders), inputs_of(args, names), folders)
    check_writable(files, folders)
    check_writable(plot_files(folders))  # a folder in a plot's place failed after the run, without the flag
    from npusim.progress import pricing_progress

    with pricing_progress("serve", args.progress) as bar:
        if args.plan:
            return plan(args, hw, services[0], bar)
        if args.max_rate:
            return max_rates(args, hw, services, bar)
        return _serve(args, hw, services, requests, bar)


def _serve(args, hw, services: list[ServiceConfig], requests, bar) -> int:
    runs, results = [], []
    pd = pd_of(args)
    for svc in services:
        cost = step_cost(svc, args, hw, bar)
        run = serve(requests, svc, cost, args.cards, args.router, pd, args.pd_router)
        bar.close()
        runs.append(run)
        results.append(metrics(run))
        say(summary(results[-1]))
    if len(results) == 2:
        say("")
        say(compare_table(*results))
    if pd is not None:  # colocated on the same cards, beside it
        colocated = metrics(serve(requests, services[0], cost, sum(pd), args.router))
        bar.close()
        say("")
        say(compare_table(colocated, results[0], ("colocated", f"P:D {pd[0]}:{pd[1]}")))
        results[0] = results[0] | {"colocated": colocated}
    plotted, files = [], []
    one = len(services) == 1
    with all_or_none():  # written once every run has finished: an interruption leaves none of them
        for svc, run in zip(services, runs):
            if args.csv:
                files.append(write_text(args.csv if one else _suffixed(args.csv, svc.name), requests_csv(run)))
            if args.plot:
                from npusim.serving.plots import batch_and_kv, latency_cdf

                out = args.plot if one else str(Path(args.plot) / svc.name)
                paths = latency_cdf(run, out) + batch_and_kv(run, out)
                plotted.append(plots_line(out, paths))
            if args.trace:
                from npusim.serving.trace import write_trace

                path = args.trace if one else _suffixed(args.trace, svc.name)
                write_trace(run, path)
                files.append(path)
        if args.json:
            files.append(write_json(args.json, results[0] if one else {m["service"]: m for m in results}))
    say_all(([wrote_line(files)] if files else []) + plotted)
    return 0


def _suffixed(path: str, name: str) -> str:
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{name}{p.suffix}"))


def add_arguments(p) -> None:
    p.add_argument("--service", default="seed-optimized", help="service config name (services/) or path")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two service configs side by side on one load")
    p.add_argument("--service-set", action="append", metavar="KEY.PATH=VALUE",
                   help="override a service field (e.g. scheduler.max_batch=16)")
    p.add_argument("--workload", default="k3", help="workload name (workloads/) or path")
    add_workload_set(p)
    p.add_argument("--hw", default="ascend910b2", help="hardware config name or path")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a hardware field")
    p.add_argument("--arrival", choices=("poisson", "gamma", "constant", "ramp", "trace"),
                   help="arrival process (default: trace with --trace-file, ramp with --ramp, else poisson)")
    p.add_argument("--rate", type=float, help="requests per second (poisson, gamma, constant); the load must "
                   f"arrive within {MAX_SPAN_S:g} s")
    p.add_argument("--cv", type=float, help="gamma: coefficient of variation of the gaps (from "
                   f"{CV_RANGE[0]:g} to {CV_RANGE[1]:g}; default {DEFAULT_CV:g}, a Poisson process's)")
    p.add_argument("--ramp", metavar="START,STEP,EVERY_S,MAX", help="ramp: Locust-like stepped rate, e.g. "
                   "10,10,30,150")
    p.add_argument("--trace-file", metavar="PATH", help="replay requests from a CSV or JSONL file with arrival_s, "
                   "prompt_tokens, output_tokens")
    p.add_argument("--requests", type=int, help=f"requests to simulate, at most {MAX_REQUESTS} (default 1000; a "
                   "trace: its first N)")
    p.add_argument("--prompt-lengths", metavar="SPEC", help="fixed:N, uniform:A,B, "
                   "lognormal:MEDIAN,SIGMA, mix (the seeds' 10%% < 128, 60%% 128-1024, 30%% > 1024) or file:PATH; "
                   f"whole token counts from 1 to {MAX_TOKENS} (a request longer than the workload's context is "
                   f"rejected and counted); default {DEFAULT_LENGTHS['--prompt-lengths']}")
    p.add_argument("--output-lengths", metavar="SPEC", help="as --prompt-lengths; default "
                   f"{DEFAULT_LENGTHS['--output-lengths']}")
    p.add_argument("--seed", type=int, help=f"seed of the synthetic load (a whole number >= 0; default "
                   f"{DEFAULT_SEED})")
    p.add_argument("--slo", metavar="KEY=MS,...", action="append", help="SLOs (ttft_ms, tpot_ms, e2e_ms, timeout_ms) "
                   "over the service's (may be given more than once: --slo ttft_ms=50 --slo tpot_ms=10)")
    p.add_argument("--max-rate", action="store_true", help="find the highest Poisson rate meeting the SLOs by "
                   "bisection (starting from --rate)")
    p.add_argument("--pd", metavar="P:D", help="prefill/decode disaggregation: P cards of prefill instances and D of "
                   "decode instances (each of --tp cards; P + D = --cards), the KV cache of each prompt sent between "
                   "them over the topology's links; compared with colocated serving on the same cards")
    p.add_argument("--pd-router", default=DEFAULT_PD_ROUTER, metavar="NAME", help="--pd: which decode instance a "
                   "prefilled request goes to: kv-local (the fewest requests, then one on the prefill instance's "
                   "node) or any --router")
    p.add_argument("--plan", action="store_true", help="capacity planner: the fewest cards (up to --max-cards) "
                   "whose best cluster (cards x tp x replicas, and P:D splits with a continuous or chunked scheduler) "
                   "meets the SLOs at --rate; prints the frontier")
    p.add_argument("--max-cards", type=int, metavar="C", help="--plan: the most cards the search may use")
    p.add_argument("--backend", metavar="NAME", help="--plan: where the candidate clusters of a card count are "
                   "served at once: local (--jobs worker processes) or ray (a Ray cluster, --address); the figures "
                   "do not depend on it (default: one after another in this process)")
    p.add_argument("--address", metavar="ADDR", help="--backend ray: the cluster (auto, HOST:PORT or "
                   "ray://HOST:PORT; default: a local Ray instance of --jobs CPUs)")
    p.add_argument("--json", metavar="PATH", help="write the metrics as JSON (--max-rate: the rate found and its "
                   "probes; --plan: the answer, the frontier and every cluster tried)")
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
    add_fast_forward_flag(p)
    p.add_argument("--tol", type=float, default=DEFAULT_TOL, help="step-cost model: relative error at which a "
                   "grid cell is split")
    p.add_argument("--jobs", type=int, help="worker processes pricing the step-cost model's engine "
                   "points at once (a split cell's two halves, a cell's corners); with --plan --backend, those "
                   "serving candidate clusters at once (each pricing its own points); the results do not depend on "
                   "it (default: the machine's CPUs)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, help="count the steps the engine "
                   "simulates for the step-cost model, on stderr (default: only when stderr is a terminal)")


__all__ = ["add_arguments", "compare_table", "load_requests", "main"]
