"""Requests and when they arrive: arrival processes, length distributions, trace replay.

A load is a tuple of `Request`s sorted by arrival time. Synthetic loads draw
every random number from one numpy Generator seeded by the caller, in a fixed
order (arrival gaps first, then prompt lengths, then output lengths), so a seed
gives the same requests bit for bit. Replayed traces come from a CSV or JSONL
file with the columns `arrival_s, prompt_tokens, output_tokens`.

Processes (`arrival_times`):
- poisson: exponential gaps at `rate` requests/s;
- gamma: gamma gaps with mean 1/rate and coefficient of variation `cv`
  (cv = 1 is Poisson, > 1 is burstier);
- constant: one request every 1/rate s;
- ramp: Locust's stepped load - `start` requests/s, `step` more every `every` s,
  up to `max` (Poisson within each stage).

Lengths (`lengths`): "fixed:N", "uniform:A,B", "lognormal:MEDIAN,SIGMA", "mix"
(the seed articles' load) and "file:PATH" (sampled with replacement from the
integers in a file, one per line).

Bounds (what a load may be; each refused in one line naming the flag): at most
MAX_REQUESTS requests, lengths whole token counts from 1 to MAX_TOKENS, the last
arrival within MAX_SPAN_S, a trace or lengths file at most MAX_FILE_BYTES.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from attrs import frozen

from npusim.errors import ConfigError
from npusim.hw.parse import clipped, input_file, plain, plain_number, short

# The seed articles' length mix: 10% under 128 tokens, 60% 128-1024, 30% over 1024.
# Within a band lengths are uniform; the bottom of the first band (16) and the top of
# the last (4096) are not given by the seeds: assumed.
SEED_MIX = ((0.10, 16, 127), (0.60, 128, 1024), (0.30, 1025, 4096))

# Requests one run simulates: each is a Request and a Seq in memory (about 1 KiB),
# and the loop prices every step in Python, so a million takes minutes.
MAX_REQUESTS = 1_000_000
# Tokens of one prompt or output: 2^24, above any model's context (a request longer
# than the workload's context is rejected and counted); lengths stay exact in int64
# and float64 sums of them.
MAX_TOKENS = 1 << 24
# The last arrival, in seconds (about 32 years). The simulation keeps time in float64
# microseconds: up to 1e15 us a tick is 0.125 us, far below the shortest scan period
# (SchedulerConfig.scan_period_ms >= 0.1 ms), so every scan moves time on.
MAX_SPAN_S = 1e9
# A trace or lengths file, read whole: a device or a pipe (/dev/zero) is read up to this.
MAX_FILE_BYTES = 64 << 20
# --cv of gamma gaps: the shape 1/cv^2 stays a normal float and the gaps finite.
CV_RANGE = (1e-3, 1e3)


@frozen
class Request:
    """One request: when it arrives (s), its prompt and how many tokens it generates."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


# ---- arrival processes

@frozen
class Ramp:
    """Locust-style stepped load: `start` req/s, + `step` every `every_s`, capped at `max`."""

    start: float
    step: float
    every_s: float
    max: float

    def rate_at(self, t: float) -> float:
        stages = t / self.every_s
        if math.isinf(stages):  # a tiny EVERY_S or a huge t: past every stage (no int of inf)
            return self.max if self.step > 0 else self.start
        return min(self.start + self.step * math.floor(stages), self.max)


def parse_ramp(text: str) -> Ramp:
    """'START,STEP,EVERY_S,MAX' (e.g. 10,10,30,150) -> Ramp."""
    try:
        start, step, every, top = (plain(float, x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--ramp: expected START,STEP,EVERY_S,MAX (e.g. 10,10,30,150), got '{text}'") from None
    if not all(map(math.isfinite, (start, step, every, top))):
        raise ConfigError(f"--ramp: expected four finite numbers START,STEP,EVERY_S,MAX, got '{text}'")
    if start <= 0 or step < 0 or every <= 0 or top < start:
        raise ConfigError(f"--ramp: expected START > 0, STEP >= 0, EVERY_S > 0 and MAX >= START, got '{text}'")
    return Ramp(start, step, every, top)


def check_rate(rate: float, what: str = "--rate") -> float:
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ConfigError(f"{what}: expected a positive number of requests per second, got {rate!r}")
    return float(rate)


def check_requests(n, what: str = "--requests") -> int:
    """A number of requests one run may simulate: 1 to MAX_REQUESTS."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_REQUESTS:
        raise ConfigError(f"{what}: expected a number of requests from 1 to {MAX_REQUESTS}, got {n!r}")
    return int(n)


def check_seed(seed, what: str = "--seed") -> int:
    """A seed numpy's generators take: a whole number >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"{what}: expected a whole number >= 0, got {seed!r}")
    return int(seed)


def check_load(requests, what: str = "requests") -> tuple[Request, ...]:
    """A load given to serve() (the API: the command line's loads are checked as they are
    drawn or read): at least one Request, each within the bounds a drawn or read one has,
    an arrival from 0 to MAX_SPAN_S s and token counts from 1 to MAX_TOKENS. A nan arrival
    was never reached, and the serving loop waited for it forever."""
    if isinstance(requests, (str, bytes)) or not hasattr(requests, "__iter__"):
        raise TypeError(f"{what}: expected a sequence of Request, got {short(requests)}")
    load = tuple(requests)
    if not load:
        raise ConfigError(f"{what}: no requests (expected at least one Request)")
    for i, r in enumerate(load):
        if not isinstance(r, Request):
            raise TypeError(f"{what}[{i}]: expected a Request, got {short(r)}")
        t = r.arrival_s
        if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) or not 0 <= t <= MAX_SPAN_S:
            raise ConfigError(f"{what}[{i}]: arrival_s: expected a time from 0 to {MAX_SPAN_S:g} s, got {short(t)}")
        for name in ("prompt_tokens", "output_tokens"):
            n = getattr(r, name)
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_TOKENS:
                raise ConfigError(f"{what}[{i}]: {name}: expected a whole token count from 1 to {MAX_TOKENS}, got "
                                  f"{short(n)}")
    return load


def arrival_times(process: str, n: int, rng: np.random.Generator, rate: float | None = None, cv: float = 1.0,
                  ramp: Ramp | None = None) -> np.ndarray:
    """`n` arrival times in seconds from 0, sorted."""
    check_requests(n)
    if process == "ramp":
        if ramp is None:
            raise ConfigError("--arrival ramp: give --ramp START,STEP,EVERY_S,MAX")
        out, t = np.empty(n), 0.0
        for i in range(n):  # piecewise Poisson: a gap drawn at the current stage's rate
            t += rng.exponential(1.0 / ramp.rate_at(t))
            out[i] = t
        return out
    rate = check_rate(rate)
    if process == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif process == "gamma":
        if not CV_RANGE[0] <= cv <= CV_RANGE[1]:
            raise ConfigError(f"--cv: expected a coefficient of variation from {CV_RANGE[0]:g} to {CV_RANGE[1]:g}, "
                              f"got {cv}")
        shape = 1.0 / cv**2  # gamma with mean 1/rate: shape k = 1/cv^2, scale = 1/(rate k)
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    elif process == "constant":
        gaps = np.full(n, 1.0 / rate)
    else:
        raise ConfigError(f"--arrival: unknown process '{process}' (poisson, gamma, constant, ramp, trace)")
    return np.cumsum(gaps)


# ---- length distributions

def lengths(spec: str, n: int, rng: np.random.Generator, what: str = "--prompt-lengths") -> np.ndarray:
    """`n` token counts (1 to MAX_TOKENS) drawn from the distribution `spec` names."""
    kind, _, arg = spec.partition(":")

    def numbers(count: int, form: str) -> list[float]:
        try:
            vals = [plain(float, x) for x in arg.split(",")]
        except ValueError:
            vals = []
        if len(vals) != count:
            raise ConfigError(f"{what}: expected {kind}:{form}, got '{spec}'")
        return vals

    def tokens(*vals: float) -> None:  # nan, inf and 1e30 would become int64's minimum
        if not all(math.isfinite(v) and v == int(v) and 1 <= v <= MAX_TOKENS for v in vals):
            raise ConfigError(f"{what}: expected whole token counts from 1 to {MAX_TOKENS}, got '{spec}'")

    if kind == "fixed":
        (v,) = numbers(1, "N")
        tokens(v)
        out = np.full(n, v)
    elif kind == "uniform":
        lo, hi = numbers(2, "MIN,MAX")
        tokens(lo, hi)
        if not lo <= hi:
            raise ConfigError(f"{what}: expected 1 <= MIN <= MAX, got '{spec}'")
        out = rng.integers(int(lo), int(hi), n, endpoint=True)
    elif kind == "lognormal":
        median, sigma = numbers(2, "MEDIAN,SIGMA")
        if not (1 <= median <= MAX_TOKENS and 0 <= sigma < math.inf):
            raise ConfigError(f"{what}: expected 1 <= MEDIAN <= {MAX_TOKENS} and a finite SIGMA >= 0, got '{spec}'")
        with np.errstate(over="ignore"):
            out = np.maximum(1, np.round(rng.lognormal(math.log(median), sigma + 0.0, n)))  # -0 (numpy refuses it) as 0
        if not out.max() <= MAX_TOKENS:  # inf where exp() overflowed
            raise ConfigError(f"{what}: '{spec}' draws lengths up to {out.max():.3g} tokens, above the "
                              f"{MAX_TOKENS} a request may have (lower SIGMA)")
    elif kind == "mix" and not arg:
        probs = np.array([p for p, _, _ in SEED_MIX])
        band = rng.choice(len(SEED_MIX), n, p=probs / probs.sum())
        lo = np.array([b[1] for b in SEED_MIX])[band]
        hi = np.array([b[2] for b in SEED_MIX])[band]
        out = lo + np.floor(rng.random(n) * (hi - lo + 1))
    elif kind == "file" and arg:
        values = _empirical(Path(arg), what)
        out = rng.choice(values, n)
    else:
        raise ConfigError(f"{what}: expected fixed:N, uniform:MIN,MAX, lognormal:MEDIAN,SIGMA, mix or file:PATH, "
                          f"got '{spec}'")
    return out.astype(np.int64)


def read_text(path: Path, what: str) -> str:
    """A trace or lengths file's text, at most MAX_FILE_BYTES of it. A regular file
    (input_file): a named pipe would wait for a writer, a device might never end."""
    input_file(path, what)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ConfigError(f"{what}: more than {MAX_FILE_BYTES >> 20} MiB (the most a trace or lengths file "
                              f"may have)")
        return data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not part of the first column's name
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what}: cannot read: {e}") from None
    except OSError as e:  # its words, not its repr (which repeated the path)
        raise ConfigError(f"{what}: cannot read: {e.strerror or type(e).__name__}") from None


def _empirical(path: Path, what: str) -> np.ndarray:
    lines = read_text(path, f"{what}: {path}").split()
    values = []
    for i, x in enumerate(lines, 1):
        # more digits than MAX_TOKENS has: out of range, and past 4300 int() raised from inside
        digits = x.isascii() and x.isdigit() and len(x.lstrip("0")) <= len(str(MAX_TOKENS))
        if not digits or not 1 <= int(x) <= MAX_TOKENS:
            raise ConfigError(f"{what}: {path}: value {i}: expected a whole token count from 1 to {MAX_TOKENS}, "
                              f"got {clipped(x)!r}")
        values.append(int(x))
    if not values:  # the flag too: --prompt-lengths or --output-lengths, either may name a file
        raise ConfigError(f"{what}: {path}: no lengths in the file (expected whole token counts, one a line)")
    return np.array(values)


def synthetic(n: int, seed: int, process: str = "poisson", rate: float | None = None, cv: float = 1.0,
              ramp: Ramp | None = None, prompt: str = "mix", output: str = "fixed:64") -> tuple[Request, ...]:
    """`n` requests of a synthetic load, reproducible from `seed`."""
    rng = np.random.default_rng(check_seed(seed))
    times = arrival_times(process, n, rng, rate, cv, ramp)
    if not times[-1] <= MAX_SPAN_S:
        flag = "--ramp" if process == "ramp" else "--rate"
        who = "the one request" if n == 1 else f"the {n} requests"
        raise ConfigError(f"{flag}: {who} would arrive over {times[-1]:.3g} s, more than the "
                          f"{MAX_SPAN_S:g} s (about 32 years) a load may span (raise the rate or lower --requests)")
    p = lengths(prompt, n, rng, "--prompt-lengths")
    o = lengths(output, n, rng, "--output-lengths")
    return tuple(Request(i, float(times[i]), int(p[i]), int(o[i])) for i in range(n))


# ---- trace replay

COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


def load_trace(path: str | Path, limit: int | None = None, flag: str | None = None) -> tuple[Request, ...]:
    """Requests from a CSV (header row naming the columns) or JSONL file (one
    object per line) with arrival_s, prompt_tokens, output_tokens; arrivals must be
    sorted. `limit`: the first that many requests; `flag`: the option that named the
    file, for the error when it cannot be read."""
    path = Path(path)
    text = read_text(path, f"{flag} {path}" if flag else str(path))
    rows = _jsonl_rows(path, text) if path.suffix in (".jsonl", ".json") else _csv_rows(path, text)
    out: list[Request] = []
    for i, (where, row) in enumerate(rows):
        if limit is not None and i >= limit:
            break
        missing = [c for c in COLUMNS if c not in row or row[c] in (None, "")]
        if missing:
            raise ConfigError(f"{path}: {where}: missing column '{missing[0]}' (expected {', '.join(COLUMNS)})")
        t = _number(path, where, "arrival_s", row["arrival_s"], float)
        p = _number(path, where, "prompt_tokens", row["prompt_tokens"], int)
        o = _number(path, where, "output_tokens", row["output_tokens"], int)
        if t < 0 or p < 1 or o < 1:
            col, v, least = (("arrival_s", t, "a time >= 0") if t < 0 else ("prompt_tokens", p, "a count >= 1")
                             if p < 1 else ("output_tokens", o, "a count >= 1"))
            raise ConfigError(f"{path}: {where}: column '{col}': expected {least}, got {short(v)}")
        if t > MAX_SPAN_S or max(p, o) > MAX_TOKENS:
            col, v, top = (("arrival_s", t, f"{MAX_SPAN_S:g} s") if t > MAX_SPAN_S else
                           ("prompt_tokens", p, f"{MAX_TOKENS} tokens") if p > MAX_TOKENS else
                           ("output_tokens", o, f"{MAX_TOKENS} tokens"))
            raise ConfigError(f"{path}: {where}: column '{col}': expected at most {top}, got {short(v)}")
        if i >= MAX_REQUESTS:
            raise ConfigError(f"{path}: more than {MAX_REQUESTS} requests, the most a run simulates (give "
                              f"--requests N to replay the first N)")
        if out and t < out[-1].arrival_s:
            raise ConfigError(f"{path}: {where}: column 'arrival_s': arrivals must be sorted, {t} comes after "
                              f"{out[-1].arrival_s}")
        out.append(Request(i, t, p, o))
    if not out:
        raise ConfigError(f"{path}: no requests in the file")
    return tuple(out)


def _csv_rows(path: Path, text: str):
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None:
        raise ConfigError(f"{path}: empty file (expected a header row: {', '.join(COLUMNS)})")
    names = [f.strip() for f in reader.fieldnames]
    twice = next((c for c in COLUMNS if names.count(c) > 1), None)
    if twice:  # csv would keep the last one's values silently
        raise ConfigError(f"{path}: row 1: column '{twice}' given twice")
    for c in COLUMNS:
        if c not in names:
            raise ConfigError(f"{path}: row 1: missing column '{c}' (expected {', '.join(COLUMNS)})")
    for n, row in enumerate(reader, 2):
        if any(v.strip() for v in row.pop(None, ())):  # csv's key for values past the header's (a trailing comma: none)
            raise ConfigError(f"{path}: row {n}: more values than the header's {len(reader.fieldnames)} columns")
        yield f"row {n}", {(k or "").strip(): (v.strip() if isinstance(v, str) else v) for k, v in row.items()}


def _jsonl_rows(path: Path, text: str):
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: line {n}: not valid JSON: {e.msg}") from None
        except _Duplicate as e:  # json would keep the last one's value silently
            raise ConfigError(f"{path}: line {n}: key {e} given twice") from None
        except RecursionError:  # [[[[... thousands deep: a traceback from inside json
            raise ConfigError(f"{path}: line {n}: not valid JSON for a request: nested too deep") from None
        except ValueError:  # an integer of more digits than Python converts (4300): a traceback from inside json
            raise ConfigError(f"{path}: line {n}: not valid JSON for a request: a number with too many "
                              f"digits") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: line {n}: expected an object with {', '.join(COLUMNS)}")
        yield f"line {n}", row


class _Duplicate(Exception):
    """A key given twice in one JSON object (its repr is the message's)."""


def _no_duplicates(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(short(key))
        out[key] = value
    return out


def _number(path: Path, where: str, column: str, value, kind):
    try:
        if isinstance(value, bool):  # JSON's true is no count or time
            raise TypeError
        if isinstance(value, str) and not plain_number(value):  # '1_0', '１０': no count to take silently
            raise ValueError
        if kind is int and (isinstance(value, int) or isinstance(value, str) and value.strip().lstrip("+-").isdigit()
                            and len(value) < 4000):  # exact: 300 nines read through float said 1000...00540160
            return int(value) + 0
        v = (kind(float(value)) if kind is int else kind(value)) + 0  # -0.0 is 0.0 (the CSV said '-0.000000')
        if kind is int and float(value) != v:
            raise ValueError
        if not math.isfinite(v):
            raise ValueError
        return v
    except (TypeError, ValueError, OverflowError):  # OverflowError: 1e400 read as inf, made an int
        expected = "an integer" if kind is int else "a number"
        got = repr(clipped(value)) if isinstance(value, str) else short(value)  # a cell of 100,000 characters: as long
        raise ConfigError(f"{path}: {where}: column '{column}': expected {expected}, got {got}") from None


def offered_rate(requests: Sequence[Request]) -> float:
    """Requests per second the load offers over its arrival span."""
    span = requests[-1].arrival_s - requests[0].arrival_s
    return (len(requests) - 1) / span if span > 0 else float("inf")


__all__ = ["COLUMNS", "CV_RANGE", "MAX_FILE_BYTES", "MAX_REQUESTS", "MAX_SPAN_S", "MAX_TOKENS", "Ramp", "Request",
           "SEED_MIX", "arrival_times", "check_load", "check_rate", "check_requests", "check_seed", "lengths",
           "load_trace", "offered_rate", "parse_ramp", "read_text", "synthetic"]
