"""Does a pass keep the numbers right? The functional check.

The baseline graph and the transformed graph both run with numpy as the device
would (fp16 storage, fp32 compute: npusim.graph.execute "device" mode), from the
same weights, inputs and KV cache; an FP32 reference (the baseline graph with
nothing rounded) is the yardstick. Per output - the logits, the KV caches after
the step (compared layer by layer whatever their layout), the sampled tokens -
the report gives the cosine similarity to the reference (pass: >= MIN_COSINE for
float outputs; integer outputs - the sampled token ids - must equal the
reference's, and every differing id is reported) and every tensor that left the
fp16 range (|x| > 65504) in a device run, which fails the check too: an fp16
device would have saturated.

The numpy runs hold every tensor of the graph in float32, so validate first
estimates the host memory they need and refuses, in one line, a workload that
would not fit (the full K3 needs tens of GiB; k3-tiny a few MiB).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

import attrs
import numpy as np
from attrs import frozen

from npusim.errors import NpusimError
from npusim.graph.build import build_decoder, host_inputs
from npusim.graph.execute import Execution, cosine, execute, logical_kv, packed_kv
from npusim.graph.ir import Graph
from npusim.outputs import err
from npusim.passes import apply
from npusim.workload import Workload, load_workload

MIN_COSINE = 0.999
DECODE_STEPS = 4  # decode steps of validate_passes' top-1 agreement (a few: each is two numpy runs)
# Host memory of the numpy runs per graph element: a float32 value held for the
# run, plus the float64 draw of the largest random weight (see _host_bytes).
_VALUE_BYTES = 4
_DRAW_BYTES = 8


@frozen
class OutputCheck:
    name: str
    baseline: float  # cosine to the reference (int outputs: fraction equal)
    transformed: float
    is_float: bool
    differing: tuple[int, ...] = ()  # int outputs: flat indices where the transformed run's values differ
    # an argmax's output: those of `differing` that are near ties (_near_ties), not counted as failures
    ties: tuple[int, ...] = ()

    @property
    def passed(self) -> bool:
        return self.transformed >= MIN_COSINE if self.is_float else set(self.differing) <= set(self.ties)

    def result(self) -> str:
        if self.is_float:
            return "ok" if self.passed else "FAIL"
        if not self.differing:
            return "ok (ids equal)"
        tied = f"near ties of the reference's top two, at {_shown(self.ties)}"
        if self.passed:
            return f"ok (ids differ only at {tied})"
        wrong = [i for i in self.differing if i not in self.ties]
        return f"FAIL ({len(wrong)} ids differ, at {_shown(wrong)}" + (f"; and at {tied})" if self.ties else ")")


def _shown(indices) -> str:
    return ", ".join(map(str, indices[:8])) + (", ..." if len(indices) > 8 else "")


@frozen
class Validation:
    passes: tuple[str, ...]
    checks: tuple[OutputCheck, ...]
    overflow: tuple[str, ...]  # tensors past the fp16 range in the transformed device run
    # decode: (tokens whose top-1 equals the FP32 reference's, tokens) over `steps` decode steps
    agreement: tuple[int, int] | None = None
    steps: int = 0
    # MoE layers: (layer, cosine of the FP32 run's permuted, grouped FFN output to a dense reference)
    moe: tuple[tuple[int, float], ...] = ()

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks) and not self.overflow and all(c >= MIN_COSINE for _, c in self.moe)

    def table(self) -> str:
        lines = [f"validate passes: {', '.join(self.passes) or 'none'} (cosine to the FP32 reference; "
                 f"pass >= {MIN_COSINE} for float outputs)",
                 f"  {'output':28s}{'baseline':>12s}{'transformed':>14s}  result"]
        for c in self.checks:
            lines.append(f"  {c.name:28s}{c.baseline:>12.6f}{c.transformed:>14.6f}  {c.result()}")
        lines.append("  fp16 overflow: " + (", ".join(self.overflow) if self.overflow else "none"))
        if self.moe:
            lines.append("  MoE layers, the permuted, grouped FFN vs a dense reference (every expert on every token, "
                         "a dense gate matrix), FP32 run: " + ", ".join(
                             f"L{i} {c:.6f} {'ok' if c >= MIN_COSINE else 'FAIL'}" for i, c in self.moe))
        if self.agreement:
            same, total = self.agreement
            lines.append(f"  top-1 tokens equal to the FP32 reference's over {self.steps} decode steps (each step "
                         f"fed the reference's tokens): {same}/{total} ({100 * same / total:.1f}%; reported, not "
                         "checked)")
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


def _outputs(graph: Graph, ex: Execution) -> dict[str, np.ndarray]:
    return {**ex.outputs, **logical_kv(graph, ex.kv)}


def validate(baseline: Graph, transform: Callable[[Graph], Graph], seed: int = 0, steps: int = 0) -> Validation:
    """Check `transform(baseline)` against an FP32 run of `baseline`; with `steps` (decode
    only), also the top-1 agreement over that many decode steps (decode_agreement)."""
    after = transform(baseline)
    moe = getattr(baseline.workload, "is_moe", False)
    ref_run = execute(baseline, "reference", seed, keep=moe)
    ref = _outputs(baseline, ref_run)
    base = _outputs(baseline, execute(baseline, "device", seed))
    run = execute(after, "device", seed)
    new = _outputs(after, run)
    argmax_of = {n.outputs["index"]: n.inputs["logits"] for n in baseline.nodes if n.op_type == "argmax"}
    checks = []
    for name, r in ref.items():
        if name not in new:  # the transform lost an output
            checks.append(OutputCheck(name, cosine(base[name], r), 0.0, True))
            continue
        if np.issubdtype(np.asarray(r).dtype, np.floating):
            checks.append(OutputCheck(name, cosine(base[name], r), cosine(new[name], r), True))
            continue
        differing = tuple(int(i) for i in np.flatnonzero(np.ravel(new[name]) != np.ravel(r)))
        scores = argmax_of.get(name)
        ties = _near_ties(differing, r, new[name], ref[scores], base[scores]) if scores in base else ()
        checks.append(OutputCheck(name, _equal_fraction(base[name], r), _equal_fraction(new[name], r), False,
                                  differing, ties))
    agreement = decode_agreement(baseline, transform, steps, seed) if steps and baseline.phase == "decode" else None
    return Validation(after.applied, tuple(checks), run.overflow, agreement, steps,
                      moe_checks(baseline, ref_run.values) if moe else ())


def _near_ties(differing: tuple[int, ...], ref_ids: np.ndarray, new_ids: np.ndarray, ref_scores: np.ndarray,
               base_scores: np.ndarray) -> tuple[int, ...]:
    """Of the rows of an argmax whose transformed id differs from the reference's, those
    where the reference's two scores are closer than twice the baseline device run's
    largest score error in that row: its own fp16 rounding could flip them as well (a
    margin of 0.0035 against an error of 0.0023: seed 19, k3-tiny, batch 8), so the
    flip says nothing about the passes."""
    ref_s = ref_scores.reshape(len(np.ravel(ref_ids)), -1)
    noise = np.abs(base_scores.reshape(ref_s.shape) - ref_s).max(axis=1)
    r, n = np.ravel(ref_ids), np.ravel(new_ids)
    return tuple(i for i in differing if 0 <= n[i] < ref_s.shape[1] and ref_s[i, r[i]] - ref_s[i, n[i]] <= 2 * noise[i])


def moe_checks(graph: Graph, values: dict[str, np.ndarray]) -> tuple[tuple[int, float], ...]:
    """(layer, cosine) of every MoE layer of a run of the builder's graph (`values`: its
    tensors): the layer's output against npusim.ops.moe.dense_moe on the same input
    plus the residual - the check that routing, permutation and combine are right."""
    from npusim.ops.moe import MoeGatingParams, dense_moe

    w = graph.workload
    out = []
    for i in range(w.layers):
        if not w.is_moe_layer(i):
            continue
        v = {k[len(f"L{i}."):]: x for k, x in values.items() if k.startswith(f"L{i}.")}
        n = v["ffn_norm_out"].shape[0]
        gp = MoeGatingParams(tokens=n, experts=w.experts, k=w.experts_per_token, dtype=w.dtype,
                             scoring=w.router_scoring, norm_topk=w.router_norm_topk)
        shared = tuple(v[f"w_{p}_shared"] for p in ("gate", "up", "down")) if w.shared_experts else None
        dense = dense_moe(v["ffn_norm_out"], v["w_router"], tuple(v[f"w_{p}_experts"] for p in ("gate", "up", "down")),
                          gp, shared) + v["x_attn"]
        out.append((i, cosine(v["out"], dense)))
    return tuple(out)


def decode_agreement(baseline: Graph, transform: Callable[[Graph], Graph], steps: int,
                     seed: int = 0) -> tuple[int, int]:
    """(equal, all) top-1 tokens of `steps` decode steps, the transformed graph's device
    run against the baseline's FP32 run. Step i is built at every length + i; each run
    keeps its own KV caches from step to step, and both are fed the reference's tokens
    (teacher forcing), so one early difference does not decide every later step."""
    w, lengths = baseline.workload, baseline.lengths
    tokens, caches = None, {"reference": None, "device": None}
    same = total = 0
    for i in range(steps):
        g = build_decoder(w, "decode", baseline.batch, [n + i for n in lengths])
        runs = {}
        for mode, graph in (("reference", g), ("device", transform(g))):
            kv = packed_kv(graph, caches[mode]) if caches[mode] is not None else None
            ex = execute(graph, mode, seed, inputs=host_inputs(graph, tokens, seed), kv=kv)
            caches[mode] = logical_kv(graph, ex.kv)
            runs[mode] = ex.outputs[graph.outputs[-1]]
        same += int(np.sum(runs["device"] == runs["reference"]))
        total += runs["reference"].size
        tokens = runs["reference"].reshape(-1, 1)
    return same, total


def _equal_fraction(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.ravel(a) == np.ravel(b)))


def _host_bytes(graph: Graph) -> int:
    """What one numpy run of `graph` holds at its peak: every tensor as float32, plus
    the float64 draw of its largest weight."""
    numels = [t.numel for t in graph.tensors.values()]
    return _VALUE_BYTES * sum(numels) + _DRAW_BYTES * max(numels, default=0)


def available_host_bytes() -> int | None:
    """Memory this process may still use: what the OS reports available, capped by
    the address-space limit (ulimit -v) when one is set. Where the OS does not say
    what is available (macOS has no SC_AVPHYS_PAGES) its physical memory stands for
    it; where it says neither (Windows has no os.sysconf) None: not known. Without the
    `resource` module (Windows) no limit is read."""
    avail = _sysconf_bytes("SC_AVPHYS_PAGES") or _sysconf_bytes("SC_PHYS_PAGES")
    limit = _address_space_limit()
    if limit is None or avail is None:
        return avail if limit is None else limit
    return min(avail, limit)


def _sysconf_bytes(pages: str) -> int | None:
    """os.sysconf(pages) in bytes; None where this OS does not have it."""
    try:
        n = os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no os.sysconf (Windows), a name this OS lacks (macOS)
        return None
    return n if n > 0 else None


def _address_space_limit() -> int | None:
    """The soft address-space limit (ulimit -v); None when unlimited or not POSIX."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    try:
        limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (AttributeError, ValueError, OSError):  # a platform without RLIMIT_AS
        return None
    return None if limit == resource.RLIM_INFINITY else limit


def check_host_memory(graph: Graph, runs: int = 2, limit: int | None = None) -> None:
    """Refuse, in one line, a validation whose numpy runs would not fit in host memory
    (`runs` of them alive at once: one run's outputs are kept while the next runs), or
    in `limit` bytes when given. Where the platform does not tell its memory (see
    available_host_bytes) and no `limit` is given, one warning line says the check was
    not made, and the runs go ahead."""
    need, have = runs * _host_bytes(graph), available_host_bytes()
    if have is None and limit is None:
        err(f"npusim: warning: validate: this platform does not report its free memory; not checked that the "
            f"numpy runs' {need / 2**30:.1f} GiB fit")
        return
    have = limit if have is None else have if limit is None else min(have, limit)
    if need > have:
        name = getattr(graph.workload, "name", "this workload")
        raise NpusimError(f"validate: {name} {graph.phase} batch {graph.batch} x {graph.context} needs about "
                          f"{need / 2**30:.1f} GiB of host memory for its numpy runs (every tensor in float32), "
                          f"{have / 2**30:.1f} GiB is available; validate a smaller workload (k3-tiny) or shape")


def validate_passes(workload: Workload | str = "k3-tiny", passes: str | Sequence[str] = "optimized",
                    phase: str = "decode", batch: int = 2, context=None, seed: int = 0, steps: int = DECODE_STEPS,
                    **options) -> Validation:
    """validate() of a pass pipeline on a workload's decoder (small shapes: numpy runs it).
    `options` go to the passes (fusion_rules, kv_layout, buckets, margin, quant, ...; None =
    default); `steps`: decode steps of the top-1 agreement (0: none; it needs room for
    the longer lengths, so it is skipped at the workload's max context)."""
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    if w.capacity_factor:  # numpy routes by the router's own scores: a cap on the timing draw's counts plays no part
        w = attrs.evolve(w, capacity_factor=0.0)
    options = {k: v for k, v in options.items() if v is not None}
    g = build_decoder(w, phase, batch, context if context is not None else min(64, w.max_context_tokens))
    check_host_memory(g)
    room = w.max_context_tokens - max(g.lengths)
    return validate(g, lambda x: apply(x, passes, **options), seed, min(steps, room + 1))


__all__ = ["MIN_COSINE", "OutputCheck", "Validation", "available_host_bytes", "check_host_memory", "pass_report",
           "validate", "validate_passes"]


# ------------------------------------------------------------------ what each pass did


def _layers(names) -> str:
    """Node names grouped by the decoder layer they start with ("L0.qkv" -> L0), the rest by name."""
    groups = dict.fromkeys(n.split(".", 1)[0] if re.match(r"L\d+\.", n) else n for n in names)
    return ", ".join(groups)


def _diff(before: Graph, after: Graph) -> list[str]:
    """What changed between two graphs, node by node: removed, added (with op), re-parametrised."""
    old = {n.name: n for n in before.nodes}
    new = {n.name: n for n in after.nodes}
    removed = [n for n in old if n not in new]
    added = [n for n in new if n not in old]
    changed = [n for n in new if n in old and (new[n].params, new[n].op_type) != (old[n].params, old[n].op_type)]
    lines = []
    if removed or added:
        ops = ", ".join(f"{op} x{count}" for op, count in _count(new[n].op_type for n in added).items())
        if not added:
            lines.append(f"{len(removed)} node(s) removed in {_layers(removed)}")
        else:
            lines.append(f"{len(removed)} node(s) replaced by {len(added)} ({ops}) in {_layers(removed or added)}")
    if changed:
        moves = _count(f"{k} {old[n].params.get(k)}->{new[n].params.get(k)}" for n in changed
                       for k in sorted(set(new[n].params) | set(old[n].params))
                       if new[n].params.get(k) != old[n].params.get(k))
        shown = ", ".join(list(moves)[:4]) + (", ..." if len(moves) > 4 else "")
        lines.append(f"{len(changed)} node(s) re-parametrised ({shown}) in {_layers(changed)}")
    return lines


def _count(items) -> dict:
    out: dict = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _rules_fired(graph: Graph, fusion_rules) -> list[str]:
    """The fusion rules that change `graph` when each runs alone (with the others off), and where."""
    from npusim.passes import fusion

    try:
        names = list(fusion.load_rules(fusion_rules))
    except NpusimError as e:
        return [f"rules not listed: {e}"]
    out = []
    for name in names:
        only = {other: False for other in names if other != name}
        try:
            after = fusion.fuse(graph, only if fusion_rules is None else fusion_rules | only)
        except (NpusimError, TypeError) as e:  # a rules file given by path: not merged here
            return [f"rules not tried one by one: {e}"]
        replaced = [n.name for n in graph.nodes if n.name not in {m.name for m in after.nodes}]
        if replaced:
            out.append(f"rule {name}: {len(replaced)} node(s) in {_layers(replaced)}")
    return out


def pass_report(graph: Graph, passes: str | Sequence[str] = "optimized", **options) -> str:
    """Which passes (and fusion rules) changed the graph, and where: the pipeline applied
    one pass at a time, each step's graph compared with the one before."""
    from npusim.passes import pass_names

    options = {k: v for k, v in options.items() if v is not None}
    lines = [f"passes on {graph.phase} (batch {graph.batch}): what each changed"]
    g = graph
    for name in pass_names(passes):
        after = apply(g, [name], **options)
        what = _diff(g, after) or ["no node changed (annotations only: streams, events, addresses)"]
        lines.append(f"  {name}: " + "; ".join(what))
        if name == "fusion":
            rules = options.get("fusion_rules")
            lines += [f"    {r}" for r in _rules_fired(g, rules if isinstance(rules, dict) else None)]
        g = after
    return "\n".join(lines)
