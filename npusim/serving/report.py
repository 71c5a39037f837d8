"""What a serving run measured: latency percentiles, throughput, goodput, failures,
batch size and KV occupancy over time - as a dict (the --json file), a text
summary and a per-request CSV.

Definitions (per completed request, times from its arrival):
- TTFT: arrival -> first token delivered; queueing delay: arrival -> start of its
  first step; end-to-end: arrival -> last token delivered;
- TPOT: (last token - first token) / (output tokens - 1), requests of 2+ tokens;
- inter-token latency: every gap between two successive tokens of a request;
- goodput: completed requests within every SLO the service sets, per second;
- disaggregated (disagg.py): TTFT includes the KV cache's transfer from the
  prefill instance to the decode instance, whose times `pd.kv_transfer` gives.
Rates divide by the span from the first arrival to the last event.
"""

from __future__ import annotations

import csv
import io

import attrs
import numpy as np

from npusim.hw.parse import counted
from npusim.serving.simulate import ServingRun
from npusim.serving.state import STATUSES

PERCENTILES = (50, 90, 99)
TIMELINE_POINTS = 100  # the JSON's batch / KV timeline: this many equal time bins


def _stats(values_us) -> dict:
    v = np.asarray(values_us, dtype=float) / 1e3
    if not v.size:
        return {"mean_ms": None} | {f"p{p}_ms": None for p in PERCENTILES}
    return {"mean_ms": float(v.mean())} | {f"p{p}_ms": float(np.percentile(v, p)) for p in PERCENTILES}


def _within(s, slo) -> bool:
    ttft = s.token_us[0] - s.arrival_us
    e2e = s.done_us - s.arrival_us
    tpot = (s.token_us[-1] - s.token_us[0]) / (len(s.token_us) - 1) if len(s.token_us) > 1 else 0.0
    return all(limit is None or value <= limit * 1e3
               for value, limit in ((ttft, slo.ttft_ms), (tpot, slo.tpot_ms), (e2e, slo.e2e_ms)))


def metrics(run: ServingRun) -> dict:
    """Every figure of the run, as plain JSON values (rounded to 1 ns: the JSON
    must be identical for identical runs)."""
    ok = [s for s in run.seqs if s.status == "ok"]
    first = min(s.arrival_us for s in run.seqs)
    last = max([s.done_us for s in run.seqs if s.done_us is not None] + [st.end_us for st in run.steps] + [first])
    span_s = max(last - first, 1e-9) / 1e6
    itl = [b - a for s in ok for a, b in zip(s.token_us, s.token_us[1:])]
    tpot = [(s.token_us[-1] - s.token_us[0]) / (len(s.token_us) - 1) for s in ok if len(s.token_us) > 1]
    counts = {st: sum(s.status == st for s in run.seqs) for st in STATUSES}
    out_tokens = sum(s.generated for s in ok)
    good = sum(_within(s, run.service.slo) for s in ok)
    batch = np.array([st.decode_batch for st in run.steps] or [0])
    kv = np.array([st.kv_tokens for st in run.steps] or [0]) / max(run.kv_capacity_tokens, 1)
    c = run.cost
    data = {
        "service": run.service.name,
        "scheduler": run.service.scheduler.kind,
        "workload": c.workload.name,
        "hw": c.hw.name,
        "passes": list(c.passes),
        "sync": "blocking" if run.blocking_sync else "events",
        "requests": len(run.seqs),
        "completed": counts["ok"],
        "rejected": counts["rejected"],
        "timed_out": counts["timeout"],
        "failed_oom": counts["oom"],
        "preemptions": run.preemptions,
        "duration_s": span_s,
        "requests_per_s": counts["ok"] / span_s,
        "output_tokens_per_s": out_tokens / span_s,
        "goodput_requests_per_s": good / span_s,
        "slo": attrs.asdict(run.service.slo),
        "slo_attainment": good / len(run.seqs),
        "ttft": _stats([s.token_us[0] - s.arrival_us for s in ok]),
        "tpot": _stats(tpot),
        "itl": _stats(itl),
        "e2e": _stats([s.done_us - s.arrival_us for s in ok]),
        "queueing": _stats([s.started_us - s.arrival_us for s in ok]),
        "steps": len(run.steps),
        "compile_s": sum(st.compile_us for st in run.steps) / 1e6,
        "decode_batch": {"mean": float(batch.mean()), "max": int(batch.max())},
        "kv_capacity_tokens": run.kv_capacity_tokens,
        "kv_occupancy": {"mean": float(kv.mean()), "max": float(kv.max())},
        "timeline": timeline(run),
        "step_cost": {"engine_points": len(c.points),
                      "decode_knots": dict(zip(("batch", "context"), c.decode.knots)),
                      "prefill_knots": dict(zip(("batch", "prompt"), c.prefill.knots)),
                      "mixed_knots": dict(zip(("decodes", "chunks", "chunk", "context_room"), c.mixed.knots))},
    }
    if run.cards > 1:  # a cluster: its shape and each replica's load (one card: the figures as they were)
        data |= {"cards": run.cards, "tp": run.tp, "router": run.router,
                 "replicas": [_replica(r, span_s) for r in run.replicas]}
    if run.pd:  # disaggregated: the split and the KV caches sent (the requests that went on to decode)
        data["pd"] = {"prefill_cards": run.pd[0], "decode_cards": run.pd[1],
                      "kv_transfer": _stats([s.kv_transfer_us for s in ok if s.kv_transfer_us is not None])}
    return _rounded(data)


def _replica(r, span_s: float) -> dict:
    return {"replica": r.index, "cards": list(range(r.first_card, r.first_card + r.tp)), "requests": r.requests,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "completed": r.completed,
            "steps": r.steps, "busy_s": r.busy_us / 1e6, "utilisation": r.busy_us / 1e6 / span_s,
            "kv_capacity_tokens": r.kv_capacity_tokens} | ({"role": r.role} if r.role else {})


def timeline(run: ServingRun, points: int = TIMELINE_POINTS) -> dict:
    """Mean decode batch and KV occupancy in equal time bins, weighted by step time."""
    if not run.steps:
        return {"t_s": [], "decode_batch": [], "kv_occupancy": []}
    t0, t1 = run.steps[0].start_us, max(st.end_us for st in run.steps)
    width = max(t1 - t0, 1e-9) / points
    w = np.zeros(points)
    b = np.zeros(points)
    k = np.zeros(points)
    for st in run.steps:
        i = min(int((st.start_us - t0) / width), points - 1)
        d = st.end_us - st.start_us
        w[i] += d
        b[i] += d * st.decode_batch
        k[i] += d * st.kv_tokens / max(run.kv_capacity_tokens, 1)
    safe = np.where(w > 0, w, 1)
    return {"t_s": [(t0 + (j + 0.5) * width) / 1e6 for j in range(points)],
            "decode_batch": list(b / safe), "kv_occupancy": list(k / safe)}


def _rounded(x):
    if isinstance(x, float):
        return round(x, 9)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    if isinstance(x, np.floating):
        return round(float(x), 9)
    return x


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _instances(n: int) -> str:
    return f"{n} instance{'s' if n > 1 else ''}"


def _us(ms) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def summary(m: dict) -> str:
    lines = [
        f"{m['service']} ({m['scheduler']} batching, sync {m['sync']}, passes {','.join(m['passes']) or 'none'}) "
        f"on {m['workload']} / {m['hw']}",
        f"  requests {m['requests']}: completed {m['completed']}, rejected {m['rejected']} (too long), "
        f"timed out {m['timed_out']}, failed (out of memory) {m['failed_oom']}; preemptions {m['preemptions']}",
        f"  throughput {m['requests_per_s']:.2f} req/s, {m['output_tokens_per_s']:.1f} output tokens/s over "
        f"{m['duration_s']:.1f} s; goodput {m['goodput_requests_per_s']:.2f} req/s "
        f"({100 * m['slo_attainment']:.1f}% within SLO)",
        f"  {'ms':14s}{'mean':>10s}{'P50':>10s}{'P90':>10s}{'P99':>10s}",
    ]
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "inter-token"), ("e2e", "end-to-end"),
                       ("queueing", "queueing")):
        s = m[key]
        # a space before each figure however wide (102400062.1 ms ran into the next as 102400062.1102400062.1)
        lines.append(f"  {label:14s}" + "".join(f" {_ms(s[k]):>9s}" for k in ("mean_ms", "p50_ms", "p90_ms",
                                                                              "p99_ms")))
    lines.append(f"  steps {m['steps']} (compiling {m['compile_s']:.2f} s); decode batch mean "
                 f"{m['decode_batch']['mean']:.1f}, max {m['decode_batch']['max']}; KV occupancy mean "
                 f"{100 * m['kv_occupancy']['mean']:.1f}%, max {100 * m['kv_occupancy']['max']:.1f}% of "
                 f"{m['kv_capacity_tokens']} tokens" + (" per replica" if "replicas" in m else ""))
    sc = m["step_cost"]
    lines.append(f"  step costs interpolated from {counted(sc['engine_points'], 'engine-simulated step')}")
    if "replicas" in m:
        lines += replica_lines(m)
    return "\n".join(lines)


def replica_lines(m: dict) -> list[str]:
    """A cluster's shape and each replica's load and utilisation (busy time / the run's span)."""
    n = len(m["replicas"])
    pd = m.get("pd")
    if pd:
        kv = pd["kv_transfer"]
        lines = [f"  {m['cards']} cards, P:D {pd['prefill_cards']}:{pd['decode_cards']}: "
                 f"prefill on {_instances(pd['prefill_cards'] // m['tp'])}, decode on "
                 f"{_instances(pd['decode_cards'] // m['tp'])}, of tp {m['tp']}; routers {m['router']}",
                 f"  KV cache sent prefill -> decode: mean {_us(kv['mean_ms'])} us, P99 {_us(kv['p99_ms'])} us "
                 f"(in TTFT)"]
    else:
        lines = [f"  {m['cards']} cards: {n} replica{'s' if n > 1 else ''} of tp {m['tp']}, router {m['router']}"]
    lines.append(f"  {'replica':>9s}{'cards':>8s}{'requests':>10s}{'prompt tok':>12s}{'output tok':>12s}{'busy s':>9s}"
                 f"{'utilisation':>13s}" + ("  role" if pd else ""))
    for r in m["replicas"]:
        c = r["cards"]
        cards = str(c[0]) if len(c) == 1 else f"{c[0]}-{c[-1]}"  # 9 wide from card 1000 ('5114088-4095')
        lines.append(f"  {r['replica']:>9d} {cards:>7s} {r['requests']:>9d} {r['prompt_tokens']:>11d}"
                     f" {r['output_tokens']:>11d} {r['busy_s']:>8.2f} {100 * r['utilisation']:>11.1f}%"
                     + (f"  {r['role']}" if pd else ""))
    return lines


# The SLOs as capacity searches check them (Vidur's): (words, metric, percentile, Slo field)
_SLO_CHECKS = (("TTFT P90", "ttft", "p90_ms", "ttft_ms"), ("TPOT P99", "tpot", "p99_ms", "tpot_ms"),
               ("end-to-end P90", "e2e", "p90_ms", "e2e_ms"))


def _checks(m: dict, slo) -> list[tuple[str, float | None, float]]:
    """(words, the run's value, the limit) of each SLO the service sets. A TPOT limit of a
    run whose completed requests all had one output token (no TPOT) is met, as goodput
    counts them (_within): it was 'TPOT P99 none > 200 ms; no rate meets these SLOs'."""
    return [(name, m[metric][pct], getattr(slo, field)) for name, metric, pct, field in _SLO_CHECKS
            if getattr(slo, field) is not None and not (metric == "tpot" and m[metric][pct] is None
                                                        and m["completed"])]


def _lost(m: dict) -> int:
    return m["timed_out"] + m["failed_oom"]


def sustainable(m: dict, slo) -> bool:
    """The run meets the SLOs as capacity searches use them (_SLO_CHECKS) within their
    limits, and no request lost."""
    return not _lost(m) and all(v is not None and v <= limit for _, v, limit in _checks(m, slo))


def missed(m: dict, slo) -> str:
    """What a run that is not `sustainable` missed, in words."""
    out = [f"{name} {'none' if v is None else f'{v:.4g} ms'} > {limit:g} ms" for name, v, limit in _checks(m, slo)
           if v is None or v > limit]
    lost = _lost(m)
    return ", ".join(out + [f"{counted(lost, 'request')} lost"] * bool(lost))


def slo_line(slo) -> str:
    """The SLOs as capacity searches check them, in words."""
    return ", ".join(f"{name} <= {getattr(slo, field):g} ms" for name, _, _, field in _SLO_CHECKS
                     if getattr(slo, field) is not None)


CSV_COLUMNS = ("id", "arrival_s", "prompt_tokens", "output_tokens", "status", "generated", "preemptions",
               "queueing_ms", "ttft_ms", "tpot_ms", "e2e_ms")


def requests_csv(run: ServingRun) -> str:
    """One row per request; on a cluster of several cards a last column names its replica."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cluster = run.cards > 1
    w.writerow(CSV_COLUMNS + (("replica",) if cluster else ()))
    for s in run.seqs:
        r = s.req

        def ms(v):
            return "" if v is None else f"{v / 1e3:.3f}"

        ttft = s.token_us[0] - s.arrival_us if s.token_us else None
        tpot = ((s.token_us[-1] - s.token_us[0]) / (len(s.token_us) - 1)) if len(s.token_us) > 1 else None
        e2e = s.done_us - s.arrival_us if s.status == "ok" else None
        queue = s.started_us - s.arrival_us if s.started_us is not None else None
        w.writerow((r.id, f"{r.arrival_s:.6f}", r.prompt_tokens, r.output_tokens, s.status, s.generated,
                    s.preemptions, ms(queue), ms(ttft), ms(tpot), ms(e2e))
                   + (("" if s.replica is None else s.replica,) if cluster else ()))
    return buf.getvalue()


__all__ = ["CSV_COLUMNS", "metrics", "missed", "replica_lines", "requests_csv", "slo_line", "summary", "sustainable",
           "timeline"]
