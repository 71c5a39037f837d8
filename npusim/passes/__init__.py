"""Graph -> graph passes, each with a switch, composed into pipelines.

`apply(graph, "optimized")` runs every pass but buckets in PASSES order;
"baseline" runs none; a comma list ("fusion,memplan") runs those, still in PASSES order (a pass
relies on the ones before it: the KV layout needs fused attention to read the
new layout, streams see the final nodes, the memory plan sees the final tensors
and which nodes run concurrently). Options go to the pass that takes them: `fusion_rules` (a rules file or
a dict of switches), `kv_layout` (contiguous or paged), `quant`, `quant_layers`, `smooth_alpha` (the
quantize pass: W8A16 or W8A8, which Linear layers, SmoothQuant's strength), `hw` (the config the graph
will run on: the KV row and pool alignment are its DMA burst; the default config's
when not given).
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Sequence

from npusim.errors import ConfigError
from npusim.graph.ir import Graph
from npusim.hw.parse import did_you_mean
from npusim.passes.buckets import DEFAULT_BUCKETS, pad_to_bucket
from npusim.passes.fusion import RULES, fuse, load_rules
from npusim.passes.kv_layout import KV_LAYOUTS, change_kv_layout
from npusim.passes.layout import propagate_layouts
from npusim.passes.memplan import MemoryPlan, plan_memory
from npusim.passes.quantize import quantize
from npusim.passes.schedule import SYNC_POLICIES, Schedule, assign_streams, graph_launch, schedule_of, sync_by_events

# name -> (pass, options it takes), in pipeline order
PASSES: dict[str, tuple[Callable[..., Graph], tuple[str, ...]]] = {
    "buckets": (pad_to_bucket, ("buckets", "margin")),  # first: it rebuilds the graph at the bucket's length
    "fusion": (fuse, ("fusion_rules",)),
    "layout": (propagate_layouts, ()),
    # after fusion and layout: it quantises the fused projections and reads ND activations
    "quantize": (quantize, ("quant", "quant_layers", "smooth_alpha")),
    "kv_layout": (change_kv_layout, ("kv_layout", "hw")),
    "sync": (sync_by_events, ()),
    "launch": (graph_launch, ()),
    # a second stream pays only once the host neither blocks nor lags the device
    "streams": (assign_streams, ()),
    "memplan": (plan_memory, ("hw",)),  # last: it sees the final tensors and what runs concurrently
}
# optimized: every pass that cannot make one step slower. Buckets trade a step's padding
# for fewer first-run compiles across steps, so they are asked for: "optimized,buckets";
# quantize trades accuracy for speed and memory, so it is asked for too: "optimized,quantize".
PIPELINES = {"baseline": (), "optimized": tuple(p for p in PASSES if p not in ("buckets", "quantize"))}


def pass_names(spec: str | Sequence[str]) -> tuple[str, ...]:
    """A pipeline name, a comma list or a sequence of pass names -> pass names in PASSES order."""
    if isinstance(spec, str):
        if spec in PIPELINES:
            return PIPELINES[spec]
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
        takers = [name for name, (_, takes) in PASSES.items() if option in takes]
        if value is not None and option != "hw" and not running & set(takers):
            raise ConfigError(f"--{option.replace('_', '-')} is an option of the {' or '.join(takers)} pass, which "
                              f"--passes does not include (add it: e.g. --passes optimized,{takers[0]})")


def apply(graph: Graph, passes: str | Sequence[str] = "optimized", **options) -> Graph:
    """The graph after the named passes (see pass_names), each given its options."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph: expected a Graph, got {reprlib.repr(graph)}")
    unknown = set(options) - {o for _, opts in PASSES.values() for o in opts}
    if unknown:
        raise ConfigError(f"apply: unknown pass option '{sorted(unknown)[0]}'")
    for name in pass_names(passes):
        fn, takes = PASSES[name]
        graph = fn(graph, **{k: v for k, v in options.items() if k in takes and v is not None})
    return graph


__all__ = [
    "DEFAULT_BUCKETS", "KV_LAYOUTS", "PASSES", "PIPELINES", "RULES", "SYNC_POLICIES", "MemoryPlan", "Schedule", "apply",
    "assign_streams", "change_kv_layout", "check_options", "fuse", "pad_to_bucket", "graph_launch", "load_rules", "pass_names",
    "plan_memory", "propagate_layouts", "quantize", "schedule_of", "sync_by_events",
]
