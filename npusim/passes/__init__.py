"""Graph -> graph passes, each with a switch, registered by name, composed into pipelines.

`apply(graph, "optimized")` runs the passes PIPELINES["optimized"] names; "baseline" runs
none; a comma list ("fusion,memplan") runs those. Whatever is asked for runs in PASSES
order (a pass relies on the ones before it: the KV layout needs fused attention to read
the new layout, streams see the final nodes, the memory plan sees the final tensors and
which nodes run concurrently). Options go to the pass that takes them: `fusion_rules` (a
rules file or a mapping of switches and rule definitions), `kv_layout` (contiguous or
paged), `quant`, `quant_layers`, `smooth_alpha` (the quantize pass: W8A16 or W8A8, which
Linear layers, SmoothQuant's strength), `hw` (the config the graph will run on: the KV
row and pool alignment are its DMA burst; the default config's when not given).

`register_pass(name, fn, options)` adds a pass from user code (docs/extending.md); it
joins no pipeline until one names it (`--passes optimized,NAME`).

This module imports no pass: a built-in pass's module is imported when it runs (or when
one of its names below is read), so the command line can list the passes cheaply.
"""

from __future__ import annotations

import importlib
import reprlib
from collections.abc import Callable, Sequence

from attrs import frozen

from npusim.errors import ConfigError
from npusim.hw.parse import did_you_mean


@frozen
class PassSpec:
    """A pass: the function (graph, **options) -> graph, or "module:function" for a
    built-in one (imported when it runs), the options it takes, and one line of help."""

    name: str
    run: Callable | str
    options: tuple[str, ...]
    help: str

    def fn(self) -> Callable:
        if callable(self.run):
            return self.run
        module, _, attr = self.run.partition(":")
        return getattr(importlib.import_module(module), attr)


# name -> pass, in the order passes run
PASSES: dict[str, PassSpec] = {}


def register_pass(name: str, fn: Callable | str, options: Sequence[str] = (), *, before: str | None = "memplan",
                  help: str = "") -> PassSpec:
    """Register a pass `fn(graph, **options) -> graph` under `name`, running before the pass
    `before` (default memplan, which must see the final tensors; None: last). It joins no
    pipeline: ask for it (`--passes optimized,NAME`) or name it in PIPELINES."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"register_pass: a pass name is an identifier, got {reprlib.repr(name)}")
    if name in PASSES or name in PIPELINES:
        raise ConfigError(f"register_pass: '{name}' is already a {'pass' if name in PASSES else 'pipeline'}")
    if before is not None and before not in PASSES:
        raise ConfigError(f"register_pass {name}: before: unknown pass '{before}'{did_you_mean(before, PASSES)}")
    if not (callable(fn) or isinstance(fn, str) and ":" in fn):
        raise TypeError(f"register_pass {name}: expected a function or 'module:function', got {reprlib.repr(fn)}")
    doc = fn if isinstance(fn, str) else (fn.__doc__ or name)
    spec = PassSpec(name, fn, tuple(options), help or doc.strip().splitlines()[0])
    items = list(PASSES.items())
    at = len(items) if before is None else [k for k, _ in items].index(before)
    PASSES.clear()
    PASSES.update(items[:at] + [(name, spec)] + items[at:])
    return spec


PIPELINES: dict[str, tuple[str, ...]] = {}
for _name, _run, _options, _help in (
    # first: it rebuilds the graph at the bucket's length
    ("buckets", "npusim.passes.buckets:pad_to_bucket", ("buckets", "margin"), "pad to a shape bucket"),
    ("fusion", "npusim.passes.fusion:fuse", ("fusion_rules",), "fuse by the fusion rules"),
    ("layout", "npusim.passes.layout:propagate_layouts", (), "unify formats, drop TransData round trips"),
    # after fusion and layout: it quantises the fused projections and reads ND activations
    ("quantize", "npusim.passes.quantize:quantize", ("quant", "quant_layers", "smooth_alpha"), "INT8 weights"),
    ("kv_layout", "npusim.passes.kv_layout:change_kv_layout", ("kv_layout", "hw"), "one KV cache layout"),
    ("sync", "npusim.passes.schedule:sync_by_events", (), "events instead of a sync per op"),
    ("launch", "npusim.passes.schedule:graph_launch", (), "graph launch"),
    # a second stream pays only once the host neither blocks nor lags the device
    ("streams", "npusim.passes.schedule:assign_streams", (), "independent work on a second stream"),
    # last: it sees the final tensors and what runs concurrently
    ("memplan", "npusim.passes.memplan:plan_memory", ("hw",), "static memory pool with reuse"),
):
    register_pass(_name, _run, _options, before=None, help=_help)

# Each pipeline names its passes: a pass registered later joins none until named here or
# asked for. optimized: every pass that cannot make one step slower. Buckets trade a
# step's padding for fewer first-run compiles across steps, so they are asked for:
# "optimized,buckets"; quantize trades accuracy for speed and memory: "optimized,quantize".
PIPELINES.update(baseline=(), optimized=("fusion", "layout", "kv_layout", "sync", "launch", "streams", "memplan"))


def passes_help() -> str:
    """What --passes takes, from the registry: the pipelines and the passes."""
    pipelines = "; ".join(f"{name} ({', '.join(p) or 'no pass'})" for name, p in PIPELINES.items())
    return (f"a pipeline or ONE comma list of pipelines and passes making one pipeline (e.g. fusion,memplan or "
            f"optimized,buckets); pipelines: {pipelines}; passes, in the order they run: "
            + ", ".join(PASSES))


def pass_names(spec: str | Sequence[str]) -> tuple[str, ...]:
    """A pipeline name, a comma list or a sequence of pass names -> pass names in PASSES order."""
    if isinstance(spec, str):
        if spec in PIPELINES:
            return tuple(p for p in PASSES if p in PIPELINES[spec])
        spec = [s.strip() for s in spec.split(",") if s.strip()]
        if not spec:
            raise ConfigError(f"--passes: empty; expected {', '.join(PIPELINES)} or a comma list of passes")
    elif not isinstance(spec, Sequence) or not all(isinstance(s, str) for s in spec):
        raise TypeError(f"passes: expected a pipeline name, a comma list or a sequence of pass names, "
                        f"got {reprlib.repr(spec)}")
    names = set()
    for s in spec:
        if s in PIPELINES:
            names |= set(PIPELINES[s])
        elif s in PASSES:
            names.add(s)
        else:
            raise ConfigError(f"--passes: unknown pass or pipeline {reprlib.repr(s)}"
                              f"{did_you_mean(s, list(PIPELINES) + list(PASSES))} (pipelines: {', '.join(PIPELINES)}; "
                              f"passes: {', '.join(PASSES)})")
    return tuple(p for p in PASSES if p in names)


def check_options(pipelines: Sequence[str | Sequence[str]], options: dict) -> None:
    """Every pass option given (not None) is taken by a pass of one of `pipelines`:
    an option for a pass that does not run would be silently ignored."""
    running = {name for spec in pipelines for name in pass_names(spec)}
    for option, value in options.items():
        takers = [name for name, p in PASSES.items() if option in p.options]
        if value is not None and option != "hw" and not running & set(takers):
            raise ConfigError(f"--{option.replace('_', '-')} is an option of the {' or '.join(takers)} pass, which "
                              f"--passes does not include (add it: e.g. --passes optimized,{takers[0]})")


def apply(graph, passes: str | Sequence[str] = "optimized", **options):
    """The graph after the named passes (see pass_names), each given its options."""
    from npusim.graph.ir import Graph

    if not isinstance(graph, Graph):
        raise TypeError(f"graph: expected a Graph, got {reprlib.repr(graph)}")
    unknown = set(options) - {o for p in PASSES.values() for o in p.options}
    if unknown:
        raise ConfigError(f"apply: unknown pass option '{sorted(unknown)[0]}'")
    for name in pass_names(passes):
        p = PASSES[name]
        graph = p.fn()(graph, **{k: v for k, v in options.items() if k in p.options and v is not None})
    return graph


# names of the pass modules, imported when first read
_LAZY = {
    "DEFAULT_BUCKETS": "buckets", "pad_to_bucket": "buckets",
    "RULES": "fusion", "fuse": "fusion", "load_rules": "fusion",
    "KV_LAYOUTS": "kv_layout", "change_kv_layout": "kv_layout",
    "propagate_layouts": "layout",
    "MemoryPlan": "memplan", "plan_memory": "memplan",  # (quantize: the module; its function is quantize.quantize)
    "SYNC_POLICIES": "schedule", "Schedule": "schedule", "assign_streams": "schedule", "graph_launch": "schedule",
    "schedule_of": "schedule", "sync_by_events": "schedule",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = globals()[name] = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_BUCKETS", "KV_LAYOUTS", "PASSES", "PIPELINES", "RULES", "SYNC_POLICIES", "MemoryPlan", "PassSpec",
    "Schedule", "apply", "assign_streams", "change_kv_layout", "check_options", "fuse", "pad_to_bucket",
    "graph_launch", "load_rules", "pass_names", "passes_help", "plan_memory", "propagate_layouts",
    "register_pass", "schedule_of", "sync_by_events",
]
