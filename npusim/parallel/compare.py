"""One step under several parallel plans, side by side (`npusim compare --plans tp1 tp2 tp4`).

A plan is one word: tpN, spN, epN (a MoE decoder), or one comma list of them (tp2,sp2;
tp2,ep8) - as a pipeline of `--passes` is one word, a name or one comma list. Each plan's step is run as `run`
runs it (one device simulated, its peers symmetric), under one pipeline; a plan that
does not fit its devices' memory is shown as such, with the memory message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from attrs import frozen

from npusim.errors import ConfigError
from npusim.hw import HwConfig, load_hw
from npusim.parallel.breakdown import comm_breakdown, plan_json
from npusim.parallel.plan import Plan, check_plan
from npusim.report.step import step_json, step_title
from npusim.runtime.compile import LoweringCache
from npusim.runtime.decoder import run_decoder
from npusim.runtime.memory import OutOfMemoryError, size
from npusim.runtime.run import GraphRun
from npusim.workload import Workload, load_workload

_PART = re.compile(r"(tp|sp|ep)([0-9]+)")  # ASCII digits: not tp２
SYNTAX = "tpN, spN, epN or one comma list of them (tp2,sp2; tp2,ep8)"


def parse_plan(spec: str) -> Plan:
    """A plan as `--plans` takes it (see the module doc)."""
    degrees: dict[str, int] = {}
    for part in spec.split(","):
        m = _PART.fullmatch(part.strip())
        if m is None:
            hint = "; a pipeline is run by npusim run --pp N" if part.strip().startswith("pp") else ""
            raise ConfigError(f"--plans {spec}: expected {SYNTAX}, got '{part}'{hint}")
        axis, n = m[1], int(m[2])
        if axis in degrees:
            raise ConfigError(f"--plans {spec}: {axis} given twice in one plan")
        if n < 1:
            raise ConfigError(f"--plans {spec}: {axis} expects a positive degree, got {n}")
        degrees[axis] = n
    return Plan(degrees.get("tp", 1), degrees.get("sp", 1), ep=degrees.get("ep", 1))


def parse_plans(specs: Sequence[str]) -> dict[str, Plan]:
    """Plan name (Plan.name) -> plan, in the order given; each plan once."""
    out: dict[str, Plan] = {}
    for spec in specs:
        plan = parse_plan(spec)
        if plan.name in out:
            raise ConfigError(f"--plans {spec}: the plan {plan.name} is given twice")
        out[plan.name] = plan
    return out


@frozen
class PlanComparison:
    """Each plan's run, or the memory error of a plan that does not fit (in the order given)."""

    plans: dict[str, Plan]
    runs: dict[str, GraphRun | OutOfMemoryError]

    @property
    def fitted(self) -> dict[str, GraphRun]:
        return {k: r for k, r in self.runs.items() if isinstance(r, GraphRun)}

    @property
    def base(self) -> str | None:
        """The plan speed-ups are taken over: the first that fits."""
        return next(iter(self.fitted), None)

    def speedup(self, name: str) -> float:
        return self.fitted[self.base].latency_us / self.fitted[name].latency_us

    def curve(self) -> list[tuple[str, int, float, float]]:
        """(plan, devices, latency µs, communication share) of each plan that fits: what npusim.parallel.plots.plan_scaling draws."""
        return [(k, self.plans[k].world, r.latency_us, comm_breakdown(r).comm_share) for k, r in self.fitted.items()]


def compare_plans(workload: Workload | str, hw: HwConfig | str = "ascend910b2", phase: str = "decode",
                  batch: int = 1, context=None, passes="optimized", plans: Sequence[str] = ("tp1", "tp2"), *,
                  overrides=None, memo: bool = True, progress: Callable[[int, int], None] | None = None,
                  store=None, counters: bool = True, **options) -> PlanComparison:
    """The step under each plan (`plans`: as --plans takes them), under one pipeline.
    Every plan is checked before anything runs; a plan's error names it."""
    if isinstance(plans, str) or not plans:
        raise ConfigError(f"--plans: expected one or more plans ({SYNTAX}), got {plans!r}")
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    hw = load_hw(hw, overrides)
    parsed = parse_plans(plans)
    for name, plan in parsed.items():
        _named(name, lambda: check_plan(plan, w, hw))
    cache = LoweringCache()
    runs: dict[str, GraphRun | OutOfMemoryError] = {}
    for i, (name, plan) in enumerate(parsed.items()):
        if progress:
            progress(i, len(parsed))
        try:
            runs[name] = _named(name, lambda: run_decoder(w, hw, phase, batch, context, passes, memo=memo,
                                                          cache=cache, store=store, counters=counters,
                                                          tp=plan.tp, sp=plan.sp, ep=plan.ep, **options))
        except OutOfMemoryError as e:
            runs[name] = e
    if progress:
        progress(len(parsed), len(parsed))
    if not any(isinstance(r, GraphRun) for r in runs.values()):
        raise runs[name]  # the plan with the most devices says how many would fit
    return PlanComparison(parsed, runs)


def _named(name: str, call):
    """call(), its ConfigError naming the plan at fault (a memory error passes as it is)."""
    try:
        return call()
    except OutOfMemoryError:
        raise
    except ConfigError as e:
        raise ConfigError(f"--plans {name}: {e}") from None


_ROWS = (  # label, the cell of a plan's column from (comparison, plan name, its run, its communication)
    ("latency (us)", lambda c, k, r, b: f"{r.latency_us:,.1f}"),
    ("tokens/s", lambda c, k, r, b: f"{r.tokens_per_s * c.plans[k].replicas:,.1f}"),
    ("speed-up over {base}", lambda c, k, r, b: f"{c.speedup(k):.2f}x"),
    ("communication (us)", lambda c, k, r, b: f"{b.comm_us:,.1f}"),
    ("communication share", lambda c, k, r, b: f"{100 * b.comm_share:.1f}%"),
    ("exposed comm. (us)", lambda c, k, r, b: f"{b.exposed_us:,.1f}"),
    ("link utilisation", lambda c, k, r, b: f"{100 * b.link_utilisation:.2f}%"),
    ("memory per device", lambda c, k, r, b: size(r.memory.total_bytes)),
)
NO_FIT = "does not fit"


def plans_table(c: PlanComparison, overrides=None) -> str:
    """The plans side by side (a column each), then what the rows mean and the plans that do not fit."""
    fitted = c.fitted
    comm = {k: comm_breakdown(r) for k, r in fitted.items()}
    w = max(len(NO_FIT) + 2, *(len(k) + 2 for k in c.plans))
    lines = [step_title(next(iter(fitted.values())), overrides), "",
             f"  {'':22s}" + "".join(f"{k:>{w}s}" for k in c.plans),
             f"  {'devices':22s}" + "".join(f"{p.world:>{w}d}" for p in c.plans.values())]
    for label, get in _ROWS:
        cells = [get(c, k, fitted[k], comm[k]) if k in fitted else NO_FIT for k in c.plans]
        lines.append(f"  {label.format(base=c.base):22s}" + "".join(f"{v:>{w}s}" for v in cells))
    lines += ["", "  one device simulated per plan, its peers symmetric; communication: time in collectives; exposed:",
              "  the part no compute kernel overlaps; links: bytes sent / the device's links at full rate for the step"]
    if any(p.replicas > 1 for p in c.plans.values()):
        lines.append("  tokens/s: of every batch the plan's devices run (an expert-parallel plan runs one per data-parallel group)")
    lines += [f"  {k}: {r}" for k, r in c.runs.items() if k not in fitted]
    return "\n".join(lines)


def plans_json(c: PlanComparison) -> dict:
    """Each plan's report (run's JSON, the plan and its communication, the speed-up), or its memory error."""
    out = {}
    for k, r in c.runs.items():
        if isinstance(r, GraphRun):
            out[k] = {"fits": True, **step_json(r), **plan_json(r), "speedup": c.speedup(k)}
        else:
            out[k] = {"fits": False, "plan": c.plans[k].as_json(), "error": str(r)}
    return {"plans": out, "speedup_over": c.base}
