"""A service configuration: how a serving process runs the model.

services/NAME.yaml (or a path) -> a frozen ServiceConfig: the scheduler and its
knobs, the passes every step graph gets (as `npusim run --passes`), the host's
costs and the SLOs. Loaded like the hardware configs (cattrs, forbid_extra_keys):
a typo or a wrong type is one ConfigError line naming the file and key. Every
field has a help text; host costs no source gives are marked "assumed" in the
YAML files.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any

import attrs
from attrs import field, frozen, validators
from cattrs.errors import ForbiddenExtraKeysError

from npusim.errors import ConfigError
from npusim.hw.load import leaf_errors, find_file, parse_yaml, read_yaml
from npusim.hw.parse import clipped, plain, short, strict_converter
from npusim.kvcache import PASS_KV_LAYOUTS
from npusim.passes import PASSES, pass_names
from npusim.passes.buckets import out_of_order
from npusim.serving.arrivals import MAX_SPAN_S, MAX_TOKENS

SCHEDULERS = ("static", "dynamic", "continuous", "chunked")
PREPROCESS_ON = ("pool", "inference_thread")


def _f(help: str, default=None, validator=None):
    return field(default=default, validator=validator, metadata={"help": help})


def _shown(value) -> str:
    """A field's value as a message shows it: a string clipped, a number of more digits
    than a float holds as a float's (YAML's 1e300 made an int said in 301 digits), else
    short() (a list of thousands of items, a name of thousands of characters were said whole)."""
    if isinstance(value, str):
        return repr(clipped(value))
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(map(_shown, value[:4]))}{', ...' if len(value) > 4 else ''}]"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**16:
        try:
            return f"{value:.3g}"
        except OverflowError:  # past a float's range
            pass
    return short(value)


def _bound(op: str, limit: float):
    """attrs' gt/ge/le (the same message), the value said by _shown."""
    holds = {">": lambda v: v > limit, ">=": lambda v: v >= limit, "<=": lambda v: v <= limit}[op]

    def check(inst, attr, value):
        if not holds(value):
            raise ValueError(f"'{attr.name}' must be {op} {limit}: {_shown(value)}")

    return check


_pos = _bound(">", 0)
_nonneg = _bound(">=", 0)


def _opt(v):
    return validators.optional(v)


def _within(lo: float, hi: float, unit: str, why: str):
    """A number from `lo` to `hi` (nan and inf refused); `why` says why the bound is where it is."""

    def check(inst, attr, value):
        if not lo <= value <= hi:
            raise ValueError(f"'{attr.name}' must be from {lo:g} to {hi:g} {unit} ({why}): {_shown(value)}")

    return check


def _length_ratio(inst, attr, value):
    """0 (no grouping) or a longest / shortest ratio, at least 1: below 1 not even two
    prompts of one length group together, and every batch was a single request."""
    if not (value == 0 or value >= 1):
        raise ValueError(f"'{attr.name}' must be 0 (no grouping) or at least 1 (longest / shortest prompt of a "
                         f"batch): {_shown(value)}")


def _lengths(inst, attr, value):
    if value is not None and (not value or any(not 1 <= b <= MAX_BUCKET_TOKENS for b in value)):
        raise ValueError(f"'{attr.name}' must be a non-empty list of lengths from 1 to {MAX_BUCKET_TOKENS} tokens: "
                         f"{_shown(value)}")
    after = out_of_order(value) if value is not None else None
    if after:
        raise ValueError(f"'{attr.name}' must be strictly increasing lengths, got {after[1]} after {after[0]}: "
                         f"{_shown(value)}")


# A scheduler's largest batch. Serving prices a step of max_batch sequences before the
# first request (the KV room beside its activations) and at the step-cost grid's
# corners, whatever the load: on k3-tiny, 5 requests served with max_batch 1024 took
# 17.5 s on 2 cores, with 4096 not done in 100 s, with graph.build.MAX_BATCH (65,536) past
# 5 minutes. Serving engines batch hundreds of sequences, not thousands.
MAX_SCHEDULER_BATCH = 1024
# Bounds of the fields whose extremes would stall or overflow the serving loop.
# The dynamic scheduler's scan ticks must move float64 time on (any period >= 1 us
# does within arrivals.MAX_SPAN_S), and each is one pass of the loop while a batch
# waits: 0.1 ms keeps a waiting batch's scans to 10^4 per simulated second. At most an
# hour (a batcher that scans less often never batches).
SCAN_PERIOD_MS = (0.1, 3.6e6)
# The dynamic scheduler's timeout, in scans: a partial batch is scanned every scan_period_ms
# until it launches, each scan a pass of the loop (about 13 us on 2 cores), so a
# timeout of .inf with scans of 0.1 ms took minutes for 5 requests a minute apart (and
# years of scans for a slower load). At most 1000 scans a batch.
MAX_TIMEOUT_SCANS = 1000
# A host cost per request, token or step: at most 10 s (the fields are in us; more is a unit slip).
MAX_HOST_US = 1e7
# Threads of the tokenizer pool: one free time each is kept.
MAX_POOL_THREADS = 4096
# A bucket length (tokens): as a request's.
MAX_BUCKET_TOKENS = MAX_TOKENS
_host_us = _within(0, MAX_HOST_US, "us", "10 s; the field is in us")
# An SLO limit (ms): above 0, and finite (JSON has no inf) up to the longest a load may
# span (arrivals.MAX_SPAN_S): a longer limit limits nothing.
MAX_SLO_MS = MAX_SPAN_S * 1e3


def _timeout(inst, attr, value):
    """0 to MAX_TIMEOUT_SCANS scan periods (nan and inf refused)."""
    top = MAX_TIMEOUT_SCANS * inst.scan_period_ms
    if not 0 <= value <= top:
        raise ValueError(f"'{attr.name}' must be from 0 to {MAX_TIMEOUT_SCANS} x scan_period_ms ({top:g} ms: a "
                         f"waiting batch is scanned every scan_period_ms, each scan a pass of the serving loop): "
                         f"{_shown(value)}")


def _slo_ms(inst, attr, value):
    if not 0 < value <= MAX_SLO_MS:
        raise ValueError(f"'{attr.name}' must be above 0 and at most {MAX_SLO_MS:g} ms (the longest a load may "
                         f"span): {_shown(value)}")


@frozen
class SchedulerConfig:
    kind: str = _f("static (wait for max_batch, run to completion), dynamic (scan, group, launch at max_batch or "
                   "timeout), continuous (iteration level, paged KV) or chunked (continuous + a token budget)")
    max_batch: int = _f("most sequences in one batch (static: the batch it waits for)", 32,
                        _within(1, MAX_SCHEDULER_BATCH, "sequences", "the most a service's steps are priced at"))
    scan_period_ms: float = _f("dynamic: how often the queue is scanned (0.1 ms to an hour)", 5.0,
                               _within(*SCAN_PERIOD_MS, "ms", "0.1 ms to an hour"))
    timeout_ms: float = _f("dynamic: launch a partial batch once its oldest request waited this long (at most "
                           f"{MAX_TIMEOUT_SCANS} scan periods)", 10.0, _timeout)
    length_ratio: float = _f("dynamic: longest / shortest prompt allowed in one batch, at least 1 (0: no "
                             "grouping)", 2.0, _length_ratio)
    token_budget: int = _f("chunked: tokens per step (decodes count 1, the rest goes to prefill chunks)", 512,
                           _pos)
    block_tokens: int = _f("continuous, chunked: tokens per KV block of the paged block manager", 16,
                           _within(1, MAX_TOKENS, "tokens", "no request is longer"))
    kv_memory_fraction: float = _f("fraction of the device memory left after weights, activations and workspace "
                                   "that holds KV cache", 0.9, [_pos, _bound("<=", 1)])


@frozen
class HostConfig:
    preprocess_on: str = _f("where tokenization runs: pool (a thread pool beside the inference loop) or "
                            "inference_thread (the loop does it between steps)", "pool",
                            validators.in_(PREPROCESS_ON))
    pool_threads: int = _f("threads of the pre-processing pool", 4,
                           _within(1, MAX_POOL_THREADS, "threads", "a pool of threads, not a crowd"))
    tokenize_us: float = _f("host time to tokenize one request (at most 10 s)", 0.0,
                            _host_us)
    postprocess_us_per_token: float = _f("host time per generated token: sampling, detokenize, stream send (at "
                                         "most 10 s)", 0.0, _host_us)
    step_overhead_us: float = _f("framework time per step on the inference thread before its launches (at most "
                                 "10 s)", 0.0, _host_us)


@frozen
class Slo:
    ttft_ms: float | None = _f("time to first token limit (per request; goodput counts requests within all limits)",
                               None, _opt(_slo_ms))
    tpot_ms: float | None = _f("time per output token limit (mean gap after the first token)", None, _opt(_slo_ms))
    e2e_ms: float | None = _f("end-to-end latency limit", None, _opt(_slo_ms))
    timeout_ms: float | None = _f("a request still queued (no token yet) this long after arriving is dropped",
                                  None, _opt(_slo_ms))


def _plain_name(inst, attr, value):
    """A name that can be part of a file name: --compare writes --csv r-NAME.csv and
    --plot DIR/NAME/ ('a/b' was a traceback, '../x' a folder outside DIR)."""
    if isinstance(value, str) and (value.strip() in ("", ".", "..") or any(c in value for c in "/\\")
                                   or not value.isprintable()):
        raise ValueError(f"'{attr.name}' must be a plain name, without '/', '\\' or control characters, and not "
                         f"empty, '.' or '..' (--compare names its outputs after it): {_shown(value)}")


@frozen
class ServiceConfig:
    name: str = _f("service name (the file's stem when not given)", validator=_plain_name)
    scheduler: SchedulerConfig = _f("batching policy and its knobs")
    passes: str = _f("passes of every step graph, as npusim run --passes (e.g. optimized,buckets)", "optimized")
    buckets: list[int] | None = _f("shape buckets when the buckets pass is on (default 512,1024,2048,4096)", None,
                                   _lengths)
    margin: int | None = _f("buckets pass: headroom a sequence keeps in its bucket", None, _opt(_nonneg))
    kv_layout: str | None = _f("KV layout of the kv_layout pass: contiguous or paged", None)
    precompile: bool = _f("every shape is compiled (captured) before serving starts, as vLLM captures its graphs: "
                          "no first-run compile during the run", False)
    host: HostConfig = _f("the serving process's CPU", HostConfig())
    slo: Slo = _f("service-level objectives", Slo())

    def __attrs_post_init__(self):
        for key, value in (("scheduler", self.scheduler), ("scheduler.kind", getattr(self.scheduler, "kind", None))):
            if value is None:  # not a scheduler of None's
                raise ConfigError(f"service {self.name}: missing key '{key}' (the scheduler: kind, one of "
                                  f"{', '.join(SCHEDULERS)}, and its knobs)")
        if self.scheduler.kind not in SCHEDULERS:
            raise ConfigError(f"service {clipped(self.name)}: key 'scheduler.kind': unknown scheduler "
                              f"{_shown(self.scheduler.kind)} (expected one of {', '.join(SCHEDULERS)})")

    def pass_options(self) -> dict:
        return {k: v for k, v in dict(buckets=tuple(self.buckets) if self.buckets else None, margin=self.margin,
                                      kv_layout=self.kv_layout).items() if v is not None}


_conv = strict_converter()
# the fields of a ServiceConfig that are sections of their own (scheduler, host, slo)
SECTIONS = tuple(a.name for a in attrs.fields(attrs.resolve_types(ServiceConfig)) if attrs.has(a.type))


def _check_passes(svc: ServiceConfig, where: str, options: Collection[str] | None = None) -> None:
    """The service's passes are known, and each pass option of `options` (None: all) it
    gives is taken by one of them (`npusim run` refuses an option for a pass that does not
    run: it would be ignored silently)."""
    try:
        names = pass_names(svc.passes)
    except ConfigError as e:
        raise ConfigError(f"{where}: key 'passes': {str(e).removeprefix('--passes: ')}") from None
    if svc.kv_layout is not None and svc.kv_layout not in PASS_KV_LAYOUTS:
        raise ConfigError(f"{where}: key 'kv_layout': expected one of {', '.join(PASS_KV_LAYOUTS)}, "
                          f"got {_shown(svc.kv_layout)}")
    for key in svc.pass_options():
        if options is not None and key not in options:
            continue
        takers = [name for name, p in PASSES.items() if key in p.options]
        if not set(names) & set(takers):
            raise ConfigError(f"{where}: key '{key}' is an option of the {' or '.join(takers)} pass, which "
                              f"'passes' ({svc.passes}) does not include (add it, or leave the key out)")


# The scheduler knobs only some kinds read (the others: every kind).
KNOBS_OF = {"scan_period_ms": ("dynamic",), "timeout_ms": ("dynamic",), "length_ratio": ("dynamic",),
            "token_budget": ("chunked",), "block_tokens": ("continuous", "chunked")}


def _check_knobs(svc: ServiceConfig, raw: Mapping[str, Any], where: str, given: Collection[str] | None) -> None:
    """Each scheduler knob of `given` (None: all) the service sets is read by its kind:
    --service-set scheduler.token_budget=64 on a continuous service was ignored silently."""
    kind = svc.scheduler.kind
    for key in raw.get("scheduler") or {}:
        kinds = KNOBS_OF.get(key)
        if not kinds or kind in kinds or given is not None and not {"scheduler", f"scheduler.{key}"} & set(given):
            continue
        raise ConfigError(f"{where}: key 'scheduler.{key}' is read only by the {' and '.join(kinds)} scheduler"
                          f"{'s' if len(kinds) > 1 else ''}, but 'scheduler.kind' is {kind} (leave it out, or give "
                          f"the kind that reads it)")


def structure_service(raw: Mapping[str, Any], where: str, options: Collection[str] | None = None,
                      knobs: Collection[str] | None = None) -> ServiceConfig:
    """`raw` -> a ServiceConfig; a pass option of `options` (None: all) for a pass it does
    not run is refused, and a scheduler knob of `knobs` (None: all) its kind does not read."""
    svc = _structure(raw, where)
    _check_passes(svc, where, options)
    _check_knobs(svc, raw, where, knobs)
    return svc


def _structure(raw: Mapping[str, Any], where: str) -> ServiceConfig:
    for section in SECTIONS:  # cattrs would say only "argument of type 'NoneType' is not iterable"
        if section in raw and not isinstance(raw[section], Mapping):
            raise ConfigError(f"{where}: key '{section}': expected a mapping, got {short(raw[section])}")
    try:
        return _conv.structure(dict(raw), ServiceConfig)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except Exception as e:  # cattrs' error group: report the first leaf, an unknown key first
        errors = sorted(leaf_errors(e), key=lambda err: not isinstance(err[1], ForbiddenExtraKeysError))
        if not errors:
            raise ConfigError(f"{where}: {e}") from None
        path, exc, _ = errors[0]
        key = ".".join(path)
        if isinstance(exc, ForbiddenExtraKeysError):
            extra = sorted(map(str, exc.extra_fields))[0]
            raise ConfigError(f"{where}: unknown key '{key + '.' if key else ''}{extra}'") from None
        if isinstance(exc, KeyError):
            raise ConfigError(f"{where}: missing key '{key}'") from None
        if isinstance(exc, ConfigError):
            raise ConfigError(f"{where}: {exc}") from None
        # attrs' in_ validator raises ValueError(message, attribute, options, value) in the
        # record's __init__, so the path stops at the record: the field comes from the attribute
        if isinstance(exc, ValueError) and len(exc.args) == 4 and isinstance(exc.args[1], attrs.Attribute):
            _, field, options, value = exc.args
            key = ".".join((*path, field.name))
            raise ConfigError(f"{where}: key '{key}': expected one of {', '.join(map(str, options))}, "
                              f"got {_shown(value)}") from None
        raise ConfigError(f"{where}: key '{key}': {exc}" if key else f"{where}: {exc}") from None


def load_service(name_or_path: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> ServiceConfig:
    """services/NAME.yaml or a path; `overrides` {"scheduler.max_batch": 16, ...} (strings read as YAML)."""
    path = find_file(name_or_path, "services")
    raw = read_yaml(path)
    raw.setdefault("name", path.stem)
    where = str(path)
    for dotted in overrides or {}:  # scheduler.max_batch=4 then scheduler={kind: static}: the 4 was dropped silently
        outer = next((o for o in overrides if dotted.startswith(o + ".")), None)
        if outer is not None:  # as --set refuses it (hw.load.dotted_to_nested), in either order
            raise ConfigError(f"--service-set {dotted}: '{outer}' is set twice (by --service-set {outer} too)")
    for dotted, value in (overrides or {}).items():
        if isinstance(value, str):
            value = parse_yaml(value, f"--service-set {dotted}")
        d = raw
        *parents, last = dotted.split(".")
        for p in parents:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ConfigError(f"--service-set {dotted}: '{p}' is not a section")
        d[last] = value
        where = f"{path} (--service-set)"
    # --service-set passes=... that drops a pass leaves the file's options for it unused on
    # purpose (passes=optimized on seed-optimized: no buckets); an option set beside it is not
    # so does --service-set scheduler.kind=... with the file's knobs of the kind it had
    given = set(overrides or {})
    return structure_service(raw, where, given if "passes" in given else None,
                             given if "scheduler.kind" in given else None)


def parse_slo(text: str, base: Slo = Slo()) -> Slo:
    """'ttft_ms=2000,tpot_ms=200' -> Slo (fields not named keep `base`'s)."""
    import attrs

    values, given = attrs.asdict(base), set()
    if not text.replace(",", "").strip():  # ',' is not the option left out: the service's SLOs kept silently
        raise ConfigError(f"--slo {text}: expected KEY=MS,... with KEY one of {', '.join(values)}, got none")
    for item in (x for x in text.split(",") if x.strip()):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in values:
            raise ConfigError(f"--slo: expected KEY=MS with KEY one of {', '.join(values)}, got '{item}'")
        if key in given:
            raise ConfigError(f"--slo {key}: given twice")
        given.add(key)
        try:
            v = plain(float, value)
        except ValueError:
            raise ConfigError(f"--slo {key}: expected a number of milliseconds, got '{value}'") from None
        if not 0 < v <= MAX_SLO_MS:
            raise ConfigError(f"--slo {key}: expected a positive number of milliseconds, at most {MAX_SLO_MS:g} (the "
                              f"longest a load may span), got '{value}'")
        values[key] = v
    return Slo(**values)


__all__ = ["HostConfig", "PREPROCESS_ON", "SCHEDULERS", "SchedulerConfig", "ServiceConfig", "Slo", "load_service",
           "parse_slo", "structure_service"]
