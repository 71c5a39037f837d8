"""One call from a workload to a simulated step: build, transform, check memory, run.

    run_decoder("k3", "ascend910b2", phase="decode", batch=8, context=4096, passes="optimized")

and the pass-by-pass comparison `compare` makes of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import frozen

from npusim.graph.build import build_decoder
from npusim.graph.ir import Graph
from npusim.hw import HwConfig, load_hw
from npusim.passes import apply, pass_names
from npusim.runtime.memory import MemoryBreakdown, OutOfMemoryError, place
from npusim.runtime.run import GraphRun, run_graph
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

    def graph(self, batch: int | None = None, lengths=None, hw: HwConfig | None = None) -> Graph:
        g = build_decoder(self.workload, self.phase, batch or self.batch,
                          self.lengths if lengths is None else lengths)
        return apply(g, self.passes, **dict(self.options), hw=hw)


def step(workload: Workload | str, phase: str = "decode", batch: int = 1, context=None,
         passes: str | Sequence[str] = "baseline", **options) -> Step:
    """`options`: pass options (fusion_rules, kv_layout, buckets, margin); None = the pass's default."""
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    return Step(w, phase, batch, context, passes, {k: v for k, v in options.items() if v is not None})


def run_decoder(workload: Workload | str, hw: HwConfig | str = "ascend910b2", phase: str = "decode",
                batch: int = 1, context=None, passes: str | Sequence[str] = "baseline", *,
                overrides: Mapping[str, Any] | None = None, memo: bool = True, trace: str = "kernel",
                **options) -> GraphRun:
    """Simulate one step of a decoder. `context`: the context length of each sequence
    in decode (the new token included), the prompt length in prefill; an int or one
    per sequence. `options` go to the passes (fusion_rules, kv_layout, buckets,
    margin). Raises OutOfMemoryError, with the breakdown and the largest batch
    and context that fit, when the step does not fit in the device memory."""
    hw = load_hw(hw, overrides)
    s = step(workload, phase, batch, context, passes, **options)
    graph = s.graph(hw=hw)
    try:
        return run_graph(graph, hw, memo=memo, trace=trace)
    except OutOfMemoryError as e:  # say what would fit
        raise OutOfMemoryError(_oom_message(s, graph, hw, e.breakdown), e.breakdown) from None


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


def _oom_message(s: Step, graph: Graph, hw: HwConfig, need: MemoryBreakdown) -> str:
    def fits(batch: int | None = None, length: int | None = None) -> bool:
        lengths = length if length is not None else s.lengths
        return place(s.graph(batch=batch, lengths=lengths, hw=hw), hw.hbm.hbm_bytes).breakdown.fits

    ctx = graph.context
    best_batch = _largest(lambda b: fits(batch=b), graph.batch - 1)
    best_ctx = _largest(lambda n: fits(length=n), ctx - 1)
    return (f"{s.workload.name} {s.phase} batch {graph.batch} x context {ctx} does not fit in {hw.name}'s "
            f"memory: {need.line()}; the largest batch that fits at context {ctx} is {best_batch}, "
            f"the largest context that fits at batch {graph.batch} is {best_ctx}")


@frozen
class Comparison:
    """Runs of the same step: each named pipeline, and the passes added one at a
    time in pipeline order (`steps`: pass name -> the run with it and every
    earlier pass of the last pipeline on)."""

    runs: dict[str, GraphRun]
    steps: dict[str, GraphRun]


def compare(workload: Workload | str, hw: HwConfig | str = "ascend910b2", phase: str = "decode", batch: int = 1,
            context=None, pipelines: Sequence[str] = ("baseline", "optimized"), *,
            overrides: Mapping[str, Any] | None = None, memo: bool = True, **options) -> Comparison:
    """Each pipeline, and the last one's passes added one at a time (a run already
    made for a pipeline is reused)."""
    hw = load_hw(hw, overrides)
    done: dict[tuple[str, ...], GraphRun] = {}

    def run(passes) -> GraphRun:
        key = pass_names(passes)
        if key not in done:
            done[key] = run_decoder(workload, hw, phase, batch, context, key, memo=memo, **options)
        return done[key]

    runs = {p: run(p) for p in pipelines}
    order = pass_names(pipelines[-1])
    return Comparison(runs, {name: run(order[:i + 1]) for i, name in enumerate(order)})


__all__ = ["Comparison", "Step", "compare", "run_decoder", "step"]
