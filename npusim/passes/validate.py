"""Does a pass keep the numbers right? The functional check.

The baseline graph and the transformed graph both run with numpy as the device
would (fp16 storage, fp32 compute: npusim.graph.execute "device" mode), from the
same weights, inputs and KV cache; an FP32 reference (the baseline graph with
nothing rounded) is the yardstick. Per output - the logits, the KV caches after
the step (compared layer by layer whatever their layout), the sampled tokens -
the report gives the cosine similarity to the reference (pass: >= MIN_COSINE for
float outputs) and every tensor that left the fp16 range (|x| > 65504) in a
device run, which fails the check too: an fp16 device would have saturated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from attrs import frozen

from npusim.graph.build import build_decoder
from npusim.graph.execute import Execution, cosine, execute, logical_kv
from npusim.graph.ir import Graph
from npusim.passes import apply
from npusim.workload import Workload, load_workload

MIN_COSINE = 0.999


@frozen
class OutputCheck:
    name: str
    baseline: float  # cosine to the reference (int outputs: fraction equal)
    transformed: float
    is_float: bool

    @property
    def passed(self) -> bool:
        return not self.is_float or self.transformed >= MIN_COSINE


@frozen
class Validation:
    passes: tuple[str, ...]
    checks: tuple[OutputCheck, ...]
    overflow: tuple[str, ...]  # tensors past the fp16 range in the transformed device run

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks) and not self.overflow

    def table(self) -> str:
        lines = [f"validate passes: {', '.join(self.passes) or 'none'} (cosine to the FP32 reference; "
                 f"pass >= {MIN_COSINE} for float outputs)",
                 f"  {'output':28s}{'baseline':>12s}{'transformed':>14s}  result"]
        for c in self.checks:
            kind = "" if c.is_float else "  (ids equal)"
            lines.append(f"  {c.name:28s}{c.baseline:>12.6f}{c.transformed:>14.6f}  "
                         f"{'ok' if c.passed else 'FAIL'}{kind}")
        lines.append("  fp16 overflow: " + (", ".join(self.overflow) if self.overflow else "none"))
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


def _outputs(graph: Graph, ex: Execution) -> dict[str, np.ndarray]:
    return {**ex.outputs, **logical_kv(graph, ex.kv)}


def validate(baseline: Graph, transform: Callable[[Graph], Graph], seed: int = 0) -> Validation:
    """Check `transform(baseline)` against an FP32 run of `baseline`."""
    after = transform(baseline)
    ref = _outputs(baseline, execute(baseline, "reference", seed))
    base = _outputs(baseline, execute(baseline, "device", seed))
    run = execute(after, "device", seed)
    new = _outputs(after, run)
    checks = []
    for name, r in ref.items():
        if name not in new:  # the transform lost an output
            checks.append(OutputCheck(name, cosine(base[name], r), 0.0, True))
            continue
        is_float = np.issubdtype(np.asarray(r).dtype, np.floating)
        score = cosine if is_float else (lambda a, b: float(np.mean(np.asarray(a) == np.asarray(b))))
        checks.append(OutputCheck(name, score(base[name], r), score(new[name], r), is_float))
    return Validation(after.applied, tuple(checks), run.overflow)


def validate_passes(workload: Workload | str = "k3-tiny", passes: str | Sequence[str] = "optimized",
                    phase: str = "decode", batch: int = 2, context=None, seed: int = 0, **options) -> Validation:
    """validate() of a pass pipeline on a workload's decoder (small shapes: numpy runs it).
    `options` go to the passes (fusion_rules, kv_layout, buckets, margin; None = default)."""
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    options = {k: v for k, v in options.items() if v is not None}
    g = build_decoder(w, phase, batch, context if context is not None else min(64, w.max_context_tokens))
    return validate(g, lambda x: apply(x, passes, **options), seed)


__all__ = ["MIN_COSINE", "OutputCheck", "Validation", "validate", "validate_passes"]
