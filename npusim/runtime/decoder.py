"""One call from a workload to a simulated step: build, transform, check memory, run.

    run_decoder("k3", "ascend910b2", phase="decode", batch=8, context=4096, passes="optimized")

and the pass-by-pass comparison `compare` makes of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Integral
from typing import Any

import attrs
from attrs import frozen

from npusim.diskcache import DiskCache
from npusim.diskcache.compute import cached
from npusim.diskcache.keys import options_key
from npusim.errors import ConfigError
from npusim.graph.build import build_decoder, step_lengths
from npusim.graph.ir import Graph
from npusim.hw import HwConfig, load_hw
from npusim.hw.parse import short
from npusim.parallel.plan import Plan, check_plan, device_kv_bytes, device_weight_bytes, devices_to_fit
from npusim.passes import apply, pass_names
from npusim.runtime.compile import LoweringCache
from npusim.runtime.memory import MemoryBreakdown, OutOfMemoryError, place, size
from npusim.runtime.run import GraphRun, run_graph
from npusim.step_flags import fast_forward_key
from npusim.workload import Workload, load_workload


@frozen
class Step:
    """What to simulate: a workload's phase at a batch and lengths, after passes."""

    workload: Workload
    phase: str = "decode"
    batch: int = 1
    lengths: Any = None  # one int for every sequence, one per sequence, or None (the builder's default)
    passes: Any = "baseline"  # a pipeline name, a comma list or a sequence of pass names
    options: Mapping[str, Any] = {}  # pass options: fusion_rules, kv_layout
    tp: int = 1  # tensor-parallel degree: the graph is one device's shard (npusim.parallel)
    sp: int = 1  # sequence-parallel degree (prefill)
    ep: int = 1  # expert-parallel degree (a MoE decoder; attention data parallel)

    def graph(self, batch: int | None = None, lengths=None, hw: HwConfig | None = None) -> Graph:
        g = build_decoder(self.workload, self.phase, batch or self.batch,
                          self.lengths if lengths is None else lengths, tp=self.tp, sp=self.sp, ep=self.ep)
        return apply(g, self.passes, **dict(self.options), hw=hw)


def _check_args(workload=None, phase="decode", batch=1, context=None, passes="baseline", **named) -> None:
    """TypeError or ConfigError naming the argument of the public API that is wrong,
    before anything deep inside trips on it."""
    if not isinstance(workload, (Workload, str, os.PathLike)):
        raise TypeError(f"workload: expected a Workload, a name or a path, got {short(workload)}")
    if "hw" in named and not isinstance(named["hw"], (HwConfig, str, os.PathLike)):
        raise TypeError(f"hw: expected an HwConfig, a config name or a path, got {short(named['hw'])}")
    if not isinstance(phase, str) or phase not in ("decode", "prefill"):
        raise ConfigError(f"phase: expected 'decode' or 'prefill', got {short(phase)}")
    if isinstance(batch, bool) or not isinstance(batch, Integral):
        raise TypeError(f"batch: expected a positive integer, got {short(batch)}")
    several = isinstance(context, Iterable) and not isinstance(context, (str, bytes, Mapping))
    ints = context if several else (context,)
    if context is not None and any(isinstance(x, bool) or not isinstance(x, Integral) for x in ints):
        raise TypeError(f"context: expected an integer or a sequence of integers (one per sequence), "
                        f"got {short(context)}")
    pass_names(passes)  # its TypeError / ConfigError names the argument
    if named.get("overrides") is not None and not isinstance(named["overrides"], Mapping):
        raise TypeError(f"overrides: expected a mapping {{'key.path': value}} or None, got {short(named['overrides'])}")
    for key in ("memo",):
        if key in named and not isinstance(named[key], bool):
            raise TypeError(f"{key}: expected True or False, got {short(named[key])}")


def step(workload: Workload | str, phase: str = "decode", batch: int = 1, context=None,
         passes: str | Sequence[str] = "baseline", **options) -> Step:
    """`options`: pass options (fusion_rules, kv_layout, buckets, margin); None = the pass's default."""
    _check_args(workload, phase, batch, context, passes)
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    return Step(w, phase, batch, context, passes, {k: v for k, v in options.items() if v is not None})


def run_decoder(workload: Workload | str, hw: HwConfig | str = "ascend910b2", phase: str = "decode",
                batch: int = 1, context=None, passes: str | Sequence[str] = "baseline", *,
                overrides: Mapping[str, Any] | None = None, memo: bool = True, trace: str = "kernel",
                cache: LoweringCache | None = None, progress: Callable[[int, int], None] | None = None,
                store: DiskCache | None = None, counters: bool = True, tp: int = 1, sp: int = 1,
                devices: int | None = None, ep: int = 1, exact: bool = True, **options) -> GraphRun:
    """Simulate one step of a decoder. `context`: the context length of each sequence
    in decode (the new token included), the prompt length in prefill; an int or one
    per sequence. `options` go to the passes (fusion_rules, kv_layout, buckets,
    margin). `cache`: lowerings to reuse and fill across calls (see LoweringCache).
    `store`: the on-disk cache the step is served from or stored into (npusim.diskcache).
    counters=False: no bandwidth samples in the trace (they only feed a Chrome trace; on a long
    prefill they are most of the simulation's memory and half its time).
    exact=True: no kernel fast-forwarded (npusim.engine.fastforward; its key in `store` says which).
    `tp` / `sp` / `ep` / `devices`: a parallel plan (npusim.parallel.Plan); the run is one
    device's, its peers symmetric, and memory is checked per device.
    Raises OutOfMemoryError, with the breakdown and the largest batch and context
    that fit, when the step does not fit in the device memory."""
    _check_args(workload, phase, batch, context, passes, hw=hw, overrides=overrides, memo=memo)
    for key in ("pp", "microbatches"):
        if key in options:
            raise ConfigError(f"--{key}: a pipelined step is run by `npusim run` (npusim.parallel.pipeline)")
    hw = load_hw(hw, overrides)
    s = step(workload, phase, batch, context, passes, **options)
    plan = check_plan(Plan(tp, sp, devices, ep), s.workload, hw)
    s = attrs.evolve(s, tp=plan.tp, sp=plan.sp, ep=plan.ep)
    inputs = (s.workload, s.phase, s.batch, s.lengths, pass_names(s.passes), options_key(dict(s.options)), memo,
              trace, counters, s.tp, s.sp) + ((s.ep,) if s.ep > 1 else ()) + fast_forward_key(exact) \
        if store is not None else None
    return cached(store, "step", inputs, hw, lambda hw: _run_step(s, hw, memo, trace, cache, progress, counters,
                                                                   exact))


def _run_step(s: Step, hw: HwConfig, memo: bool, trace: str, cache: LoweringCache | None,
              progress: Callable[[int, int], None] | None, counters: bool = True, exact: bool = True) -> GraphRun:
    """run_decoder once its arguments are checked and loaded."""
    # Weights and KV cache are a lower bound of what the graph needs: a step they
    # alone do not fit is refused before its graph is built (which may be large).
    ctx = max(step_lengths(s.workload, s.phase, s.batch, s.lengths))
    least = MemoryBreakdown(_least_weight_bytes(s), device_kv_bytes(s.workload, s.batch, ctx, s.tp), 0, 0,
                            hw.hbm.hbm_bytes)
    if not least.fits:
        weights = "INT8 weights at least" if "quantize" in pass_names(s.passes) else "weights"
        need = (f"{weights} {size(least.weights_bytes)} + KV cache {size(least.kv_bytes)} alone need "
                f"{size(least.total_bytes)} of {size(least.capacity_bytes)}")
        raise OutOfMemoryError(_oom_message(s, s.batch, ctx, hw, need), least)
    graph = s.graph(hw=hw)
    try:
        return run_graph(graph, hw, memo=memo, trace=trace, cache=cache, progress=progress, counters=counters,
                         exact=exact)
    except OutOfMemoryError as e:  # say what would fit
        raise OutOfMemoryError(_oom_message(s, graph.batch, graph.context, hw, e.breakdown.line()),
                               e.breakdown) from None


def _least_weight_bytes(s: Step) -> int:
    """A lower bound of one device's weight bytes before its graph is built: its shard
    of the checkpoint, or one byte per parameter of it when the quantize pass runs (INT8)."""
    held = device_weight_bytes(s.workload, s.tp, s.ep)
    return held // s.workload.dtype_bytes if "quantize" in pass_names(s.passes) else held


def _most(free: int, per: int) -> int:
    """How many `per`-byte pieces fit in `free` bytes."""
    return max(free, 0) // per


def _largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest n in 1 .. hi with fits(n) (fits is monotone), or 0."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _oom_message(s: Step, batch: int, ctx: int, hw: HwConfig, need: str) -> str:
    def fits(batch: int | None = None, length: int | None = None) -> bool:
        lengths = length if length is not None else s.lengths
        return place(s.graph(batch=batch, lengths=lengths, hw=hw), hw.hbm.hbm_bytes).breakdown.fits

    # weights and KV cache alone bound the search (fewer, smaller graphs to build)
    w, tp = s.workload, s.tp
    free = hw.hbm.hbm_bytes - _least_weight_bytes(s)
    best_batch = _largest(lambda b: fits(batch=b), min(batch - 1, _most(free, device_kv_bytes(w, 1, ctx, tp))))
    best_ctx = _largest(lambda n: fits(length=n), min(ctx - 1, _most(free, device_kv_bytes(w, batch, 1, tp))))
    where = f"{hw.name}'s memory" if tp == 1 else f"the memory of one of {tp} {hw.name} devices (--tp {tp})"
    if s.ep > 1:
        where = f"the memory of one of {s.ep} {hw.name} devices (--ep {s.ep}{f' --tp {tp}' if tp > 1 else ''})"
    need_tp = devices_to_fit(w, batch, ctx, hw, lambda tp: _least_weight_bytes(attrs.evolve(s, tp=tp)))
    fit = [f"on {need_tp} devices (--tp {need_tp})"] if need_tp and need_tp > tp and s.ep == 1 else []
    if w.is_moe and tp == 1:  # or with the experts placed by expert parallelism (each device its own batch)
        need_ep = next((ep for ep in range(s.ep + 1, min(w.experts, hw.topology.max_devices) + 1)
                        if w.experts % ep == 0 and _least_weight_bytes(attrs.evolve(s, ep=ep))
                        + device_kv_bytes(w, batch, ctx, 1) <= hw.hbm.hbm_bytes), None)
        fit += [f"with the experts over {need_ep} devices (--ep {need_ep})"] if need_ep else []
    more = f"; weights and KV cache fit {' or '.join(fit)}" if fit else ""
    return (f"{w.name} {s.phase} batch {batch} x context {ctx} does not fit in {where}: {need}; "
            f"the largest batch that fits at context {ctx} is {best_batch}, "
            f"the largest context that fits at batch {batch} is {best_ctx}{more}")


@frozen
class Comparison:
    """Runs of the same step: each named pipeline (or, with compare's `sides`, one
    pipeline on each side: two configs, two sets of overrides, two fusion-rules files),
    and - when the first pipeline is the baseline - the passes added one at a time in
    pipeline order (`steps`: pass name -> the run with it and every earlier pass of the
    last pipeline on; empty otherwise, as a pass's gain is measured from the baseline)."""

    runs: dict[str, GraphRun]
    steps: dict[str, GraphRun]


SIDE_KEYS = ("hw", "overrides", "fusion_rules")  # what one side of compare's `sides` may change


def compare(workload: Workload | str, hw: HwConfig | str = "ascend910b2", phase: str = "decode", batch: int = 1,
            context=None, pipelines: Sequence[str] = ("baseline", "optimized"), *,
            overrides: Mapping[str, Any] | None = None, memo: bool = True,
            progress: Callable[[int, int], None] | None = None, store: DiskCache | None = None,
            counters: bool = True, sides: Mapping[str, Mapping[str, Any]] | None = None, **options) -> Comparison:
    """Each pipeline, and, when the first is the baseline, the last one's passes added
    one at a time (a run already made for a pipeline is reused).

    `sides` ({name: {"hw": ..., "overrides": {...}, "fusion_rules": path}}, two or
    more): instead, ONE pipeline once per side, each side's hw (default `hw`), its
    overrides on top of `overrides`, its fusion rules (default the `fusion_rules`
    option); `runs` is keyed by side name and `steps` is empty.

    `progress(runs done, runs in all)` is called as each distinct run starts and at the
    end; the runs share one LoweringCache (keyed by the config's value) and `store` (the
    on-disk cache, see run_decoder)."""
    if isinstance(pipelines, str) or not isinstance(pipelines, Sequence):
        raise TypeError(f"pipelines: expected a sequence of pipelines, e.g. ('baseline', 'optimized'), "
                        f"got {short(pipelines)}")
    if not pipelines:
        raise ConfigError("pipelines: expected at least one pipeline, got none")
    for p in pipelines:
        _check_args(workload, phase, batch, context, p, hw=hw, overrides=overrides, memo=memo)
    cache = LoweringCache()
    if sides is not None:
        return _compare_sides(workload, hw, phase, batch, context, pipelines, overrides, sides, cache,
                              dict(memo=memo, store=store, counters=counters), progress, options)
    hw = load_hw(hw, overrides)
    done: dict[tuple[str, ...], GraphRun] = {}
    order = pass_names(pipelines[-1]) if not pass_names(pipelines[0]) else ()
    total = len({pass_names(p) for p in pipelines} | {order[:i + 1] for i in range(len(order))})

    def run(passes) -> GraphRun:
        key = pass_names(passes)
        if key not in done:
            if progress:
                progress(len(done), total)
            done[key] = run_decoder(workload, hw, phase, batch, context, key, memo=memo, cache=cache, store=store,
                                     counters=counters, **options)
        return done[key]

    runs = {p: run(p) for p in pipelines}
    comparison = Comparison(runs, {name: run(order[:i + 1]) for i, name in enumerate(order)})
    if progress:
        progress(total, total)
    return comparison


def _compare_sides(workload, hw, phase, batch, context, pipelines, overrides, sides, cache, run_options, progress,
                   options) -> Comparison:
    """compare(..., sides=...): one pipeline on each side."""
    if not isinstance(sides, Mapping) or len(sides) < 2:
        raise ConfigError(f"sides: expected at least two sides to compare, got {short(sides)}")
    if len(pipelines) != 1:
        raise ConfigError(f"pipelines: comparing sides ({', '.join(map(str, sides))}) runs ONE pipeline, got "
                          f"{len(pipelines)}: {', '.join(pipelines)}")
    for name, side in sides.items():
        if not isinstance(side, Mapping) or set(side) - set(SIDE_KEYS):
            raise ConfigError(f"sides[{name!r}]: expected a mapping of {', '.join(SIDE_KEYS)}, got {short(side)}")
        _check_args(workload, phase, batch, context, pipelines[0], hw=side.get("hw", hw),
                    overrides=side.get("overrides"))
    configs = {}
    for name, side in sides.items():
        config = load_hw(side.get("hw", hw), overrides)
        if side.get("overrides"):
            try:
                config = load_hw(config, side["overrides"])
            except ConfigError as e:  # the side's own overrides are wrong: name the side
                raise ConfigError(f"{name}: {e}") from None
        configs[name] = (config, side.get("fusion_rules") or options.get("fusion_rules"))
    names = list(configs)
    for i, a in enumerate(names):  # a value spelt otherwise, or the config's own: two runs of one step
        same = next((b for b in names[i + 1:] if configs[b] == configs[a]), None)
        if same is not None:
            raise ConfigError(f"sides {a} and {same}: the same config and fusion rules once loaded, nothing to "
                              "compare (give two different ones)")
    runs = {}
    for i, (name, (config, rules)) in enumerate(configs.items()):
        if progress:
            progress(i, len(sides))
        opts = options | ({"fusion_rules": rules} if rules else {})
        runs[name] = run_decoder(workload, config, phase, batch, context, pipelines[0], cache=cache, **run_options,
                                 **opts)
    if progress:
        progress(len(sides), len(sides))
    return Comparison(runs, {})


__all__ = ["Comparison", "Step", "compare", "run_decoder", "step"]
