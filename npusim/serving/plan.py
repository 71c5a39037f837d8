"""The capacity planner: the fewest cards that serve a load within the SLOs.

`npusim serve --plan --rate R --slo ttft_ms=...,tpot_ms=... --max-cards C` serves
one Poisson load (R requests/s: --max-rate's probe load, with its --requests,
--seed and lengths) on candidate clusters and finds the fewest cards on which one
of them meets the SLOs as capacity searches take them (report.sustainable: TTFT
P90, TPOT P99 and end-to-end P90 within their limits, no request lost).

The candidates on N cards (`shapes`): every tensor-parallel degree T dividing N
that the workload's heads and a node allow (parallel.plan.check_plan), as N / T
replicas behind the router; with disaggregation, also every split of the N cards
into P cards of prefill instances and D = N - P of decode instances, both
multiples of T (disagg.py). A candidate that does not fit a card (its weights
leave no room for KV cache) is kept, as missing, with the reason. The best on N
cards: one that meets the SLOs first, then the highest goodput, then the lowest
TTFT P99, then the lowest TPOT P99.

# assumption: more cards never serve a load worse (the best candidate on more cards
# has at least the goodput of the best on fewer: a replica more only takes load off
# the others); tests/test_serving_plan.py checks it on k3-tiny. Not so with static batching
# (a batch waits for max_batch requests, and a replica more gives each fewer): for a
# static service every count from 1 up is tried. On it rests the search:
C is tried first (when it misses, no fewer cards meet: one line says so), then 1, 2,
4, ... cards until a count meets, then bisection between the last count missed and
the first met: about 2 log2(C) card counts, not C.

The candidates of one card count are served together (`search`'s serve_all): one
after another in this process, or at once on a sweep backend (--backend local or
ray, command.py); each starts from a fresh step-cost model, so the figures do not
depend on where or in which order.

The frontier is every card count tried with its best candidate: cards against
goodput and P99, printed (`table`) and written with --json (`plan_json`).
"""

from __future__ import annotations

from collections.abc import Callable

from attrs import frozen

from npusim.errors import ConfigError
from npusim.hw import HwConfig
from npusim.hw.parse import counted
from npusim.parallel.plan import Plan, check_plan
from npusim.serving.report import slo_line, sustainable
from npusim.serving.service import Slo
from npusim.workload import Workload


@frozen
class Shape:
    """A cluster: `cards` cards in replicas of `tp` cards; `pd` (prefill cards, decode
    cards) when prefill and decode run on separate instances, None when colocated."""

    cards: int
    tp: int
    pd: tuple[int, int] | None = None

    @property
    def replicas(self) -> int:
        return self.cards // self.tp

    @property
    def name(self) -> str:
        if self.pd:
            return f"P:D {self.pd[0]}:{self.pd[1]}, tp {self.tp}"
        return f"{self.replicas} x tp {self.tp}"

    def as_json(self) -> dict:
        return {"cards": self.cards, "tp": self.tp, "replicas": self.replicas,
                "pd": list(self.pd) if self.pd else None}


@frozen
class Candidate:
    """One cluster served the load: its metrics (report.metrics; None when it does not
    fit a card, `why` says so) and whether it meets the SLOs."""

    shape: Shape
    metrics: dict | None
    meets: bool
    why: str = ""

    def rank(self) -> tuple:
        """Larger is better (see the module doc)."""
        if self.metrics is None:
            return (False, -1.0, 0.0, 0.0)
        m = self.metrics
        return (self.meets, m["goodput_requests_per_s"], -_or_inf(m["ttft"]["p99_ms"]), -_or_inf(m["tpot"]["p99_ms"]))


def _or_inf(v) -> float:
    return float("inf") if v is None else v


@frozen
class CapacityPlan:
    """Every candidate served, in the order tried, and what the search found."""

    rate: float
    slo: Slo
    max_cards: int
    tried: tuple[Candidate, ...]

    @property
    def frontier(self) -> list[Candidate]:
        """The best candidate of each card count tried, by cards."""
        best: dict[int, Candidate] = {}
        for c in self.tried:
            n = c.shape.cards
            if n not in best or c.rank() > best[n].rank():
                best[n] = c
        return [best[n] for n in sorted(best)]

    @property
    def answer(self) -> Candidate:
        """The best candidate on the fewest cards that meets the SLOs."""
        return next(c for c in self.frontier if c.meets)


def shapes(cards: int, workload: Workload, hw: HwConfig, disaggregate: bool = False) -> list[Shape]:
    """The candidates on `cards` cards (module doc), colocated ones first."""
    tps = []
    for tp in range(1, cards + 1):
        if cards % tp:
            continue
        try:
            check_plan(Plan(tp), workload, hw)
        except ConfigError:
            continue
        tps.append(tp)
    out = [Shape(cards, tp) for tp in tps]
    if disaggregate:
        out += [Shape(cards, tp, (p, cards - p)) for tp in tps for p in range(tp, cards, tp)]
    return out


# The most candidates served on one card count: each is a whole serve of the load, and the
# search serves about twice those of --max-cards in all (module doc). P:D splits grow with
# the cards (one per multiple of tp): 512 is every split of about 256 cards at tp 1, a
# few minutes of k3-tiny's 5-request probes; more is hours without a word.
MAX_CANDIDATES = 512
# The most cards a search that tries every count from 1 up (a static service) may have:
# counts x replicas grow as its square; an SLO 256 k3-tiny cards miss takes 9 s to refuse
# with 5 requests a probe, 4096 cards would take about 40 minutes.
MAX_SCANNED_CARDS = 256


def search(serve_all: Callable[[list[Shape]], list[dict | str]], shapes_of: Callable[[int], list[Shape]], slo: Slo,
           rate: float, max_cards: int, monotone: bool = True) -> CapacityPlan:
    """The fewest cards from 1 to `max_cards` meeting `slo` (module doc). `serve_all`
    serves the load on each of the shapes of one card count (in this process or on a
    backend, command.py) and returns, for each, its metrics or why it does not fit a
    card; `shapes_of(n)`: the candidates on n cards. An SLO no cluster of max_cards
    meets is a ConfigError naming the best one's figures. `monotone` False: more cards
    may serve the load worse (a static batch waits for max_batch requests, and a replica
    more gives each fewer), so every count from 1 up is tried until one meets."""
    check_slo(slo)
    most = len(shapes_of(max_cards))
    if most > MAX_CANDIDATES:
        raise ConfigError(f"--max-cards {max_cards}: {most} candidate clusters on {max_cards} cards (every tp and "
                          f"P:D split), more than the {MAX_CANDIDATES} the planner serves on one card count "
                          f"(lower --max-cards)")
    if not monotone and max_cards > MAX_SCANNED_CARDS:
        raise ConfigError(f"--max-cards {max_cards}: more cards may serve this service worse (a static batch waits "
                          f"for max_batch requests), so every count from 1 up is tried, at most {MAX_SCANNED_CARDS} "
                          f"(lower --max-cards)")
    tried: list[Candidate] = []
    best: dict[int, Candidate | None] = {}

    def meets(n: int) -> bool:
        if n not in best:
            shapes_n = shapes_of(n)
            found = [Candidate(shape, None, False, m) if isinstance(m, str)  # it does not fit a card, and why
                     else Candidate(shape, m, sustainable(m, slo)) for shape, m in zip(shapes_n, serve_all(shapes_n))]
            tried.extend(found)
            best[n] = max(found, key=Candidate.rank, default=None)
        return best[n] is not None and best[n].meets

    if not monotone:  # 4 cards missed where 1 met: 'no cluster of 4 cards meets ... (give more --max-cards)'
        if not any(meets(n) for n in range(1, max_cards + 1)):
            raise ConfigError(_impossible(best[max_cards], slo, rate, max_cards))
        return CapacityPlan(rate, slo, max_cards, tuple(tried))
    if not meets(max_cards):
        raise ConfigError(_impossible(best[max_cards], slo, rate, max_cards))
    lo, hi = 0, max_cards  # the most cards known to miss (0: none), the fewest known to meet
    n = 1
    while n < hi:
        if meets(n):
            hi = n
            break
        lo, n = n, 2 * n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return CapacityPlan(rate, slo, max_cards, tuple(tried))


def check_slo(slo: Slo) -> None:
    if not any((slo.ttft_ms, slo.tpot_ms, slo.e2e_ms)):
        raise ConfigError("--plan: the service sets no SLO: give --slo ttft_ms=...,tpot_ms=...")


def _impossible(best: Candidate | None, slo: Slo, rate: float, max_cards: int) -> str:
    cards = f"{max_cards} card{'s' if max_cards > 1 else ''}"
    what = f"--plan: no cluster of {cards} meets {slo_line(slo)} at {rate:g} req/s"
    if best is None or best.metrics is None:
        why = f": {best.why}" if best is not None else ""
        return f"{what}{why} (give more --max-cards)"
    m = best.metrics
    lost = m["timed_out"] + m["failed_oom"]
    return (f"{what}: the best, {best.shape.name}, has TTFT P90 {_ms(m['ttft']['p90_ms'])} ms, TPOT P99 "
            f"{_ms(m['tpot']['p99_ms'])} ms, end-to-end P90 {_ms(m['e2e']['p90_ms'])} ms"
            + (f" and lost {counted(lost, 'request')}" if lost else "") + " (loosen --slo, or give more --max-cards)")


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


COLUMNS = (("goodput", "goodput req/s"), ("attainment", "within SLO"), ("ttft_p90", "TTFT P90"),
           ("ttft_p99", "TTFT P99"), ("tpot_p99", "TPOT P99"), ("e2e_p99", "e2e P99"))


def table(p: CapacityPlan) -> str:
    """The frontier, one row per card count tried, and the answer."""
    lines = [f"{'cards':>6s}  {'cluster':22s}{'goodput req/s':>14s}{'within SLO':>12s}{'TTFT P90':>10s}"
             f"{'TTFT P99':>10s}{'TPOT P99':>10s}{'e2e P99':>10s}  meets"]
    for c in p.frontier:
        if c.metrics is None:
            lines.append(f"{c.shape.cards:>6d}  {c.shape.name:22s}  does not fit: {c.why}")
            continue
        m = c.metrics
        lines.append(f"{c.shape.cards:>6d}  {c.shape.name:22s}{m['goodput_requests_per_s']:>14.2f}"
                     f"{100 * m['slo_attainment']:>11.1f}%{_ms(m['ttft']['p90_ms']):>10s}"
                     f"{_ms(m['ttft']['p99_ms']):>10s}{_ms(m['tpot']['p99_ms']):>10s}{_ms(m['e2e']['p99_ms']):>10s}"
                     f"  {'yes' if c.meets else 'no'}")
    a = p.answer
    counts = len(p.frontier)
    lines.append(f"fewest cards: {a.shape.cards} ({a.shape.name}) meet {slo_line(p.slo)} at {p.rate:g} req/s; "
                 f"{counted(len(p.tried), 'cluster')} tried on {counted(counts, 'card count')}")
    return "\n".join(lines)


def _row(c: Candidate) -> dict:
    row = c.shape.as_json() | {"meets": c.meets}
    if c.metrics is None:
        return row | {"does_not_fit": c.why}
    m = c.metrics
    return row | {"goodput_requests_per_s": m["goodput_requests_per_s"], "slo_attainment": m["slo_attainment"],
                  "requests_per_s": m["requests_per_s"], "lost": m["timed_out"] + m["failed_oom"],
                  "ttft": m["ttft"], "tpot": m["tpot"], "e2e": m["e2e"]}


def plan_json(p: CapacityPlan, **about) -> dict:
    """The answer, the frontier and every candidate tried; `about`: the load and service."""
    import attrs

    return about | {"rate_requests_per_s": p.rate, "slo": attrs.asdict(p.slo), "max_cards": p.max_cards,
                    "cards": p.answer.shape.cards, "cluster": p.answer.shape.as_json(),
                    "frontier": [_row(c) for c in p.frontier], "tried": [_row(c) for c in p.tried]}


__all__ = ["CapacityPlan", "Candidate", "Shape", "check_slo", "plan_json", "search", "shapes", "table"]
