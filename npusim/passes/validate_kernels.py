"""Validate the lowering, not only the graph: `npusim validate --kernels`, `npusim op ... --check`.

An op is lowered at its (small) shape, its lowered kernels are run on real data by the
functional interpreter (npusim.isa.interpret: every copy, Mmad, vector instruction and
FixPipe of the programs the engine times), and what they leave in GM is compared with
the op's numpy reference. Inputs are random, rounded to their dtype, and laid out in
GM as the op stores them (a matmul weight in NZ: STORED_FORMS); the reference runs in
fp32 on the same rounded values.

An op whose programs the interpreter cannot run yet (an instruction whose operands the
IR does not carry) is reported "not checked: <why>", never passed.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import attrs
import numpy as np
from attrs import frozen

from npusim.errors import DeadlockError, NpusimError, ProgramError
from npusim.hw import HwConfig
from npusim.isa.interpret import POISON, Gm, NotInterpretable, run_kernel
from npusim.isa.program import DTYPE_BYTES
from npusim.isa.values import encode, decode, stored
from npusim.ops import lower
from npusim.ops.reference import RefContext
from npusim.ops.registry import spec

# Largest error allowed, relative to the output's largest magnitude, by output dtype:
# - fp16 (11 significant bits): inputs rounded to fp16, computed in fp32, the result
#   rounded once to fp16 (2^-11 relative) - a few intermediate fp16 roundings
#   (add_rms_norm's stored sum) and fp32 sums in another order stay under 2^-8;
#   a wrong tile or a dropped K slice is off by order 1.
# - bf16 (8 significant bits): the same argument, 2^-5.
# - fp32: only summation order differs (K up to a few thousand): 2^-16.
# - integers (ids, int32 accumulators): exact.
TOLERANCE = {"fp16": 2.0 ** -8, "bf16": 2.0 ** -5, "fp32": 2.0 ** -16, "int8": 0.0, "int32": 0.0, "int64": 0.0}
# The most elements (inputs and outputs together) an op may have to be checked: numpy
# runs every instruction of every core, so larger shapes take minutes.
MAX_ELEMENTS = 1 << 22


@frozen
class KernelCheck:
    """One op checked: its kernels, shape, worst errors and the verdict."""

    op: str
    kernels: str
    shape: str
    max_abs: float = math.nan
    max_rel: float = math.nan
    status: str = "pass"  # pass / FAIL / not checked
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"

    def row(self) -> str:
        err = "" if math.isnan(self.max_abs) else f"{self.max_abs:10.3g} {self.max_rel:10.3g}"
        verdict = self.status + (f": {self.reason}" if self.reason else "")
        return f"  {self.op:16s} {self.kernels:16s} {self.shape:44s} {err:21s}  {verdict}"


def table_header() -> str:
    return f"  {'op':16s} {'kernel':16s} {'shape':44s} {'max abs':>10s} {'max rel':>10s}  result"


# ------------------------------------------------------------------ GM images


def nz(x: np.ndarray) -> np.ndarray:
    """A [rows, cols] matrix in NZ: 16-column blocks of all (padded) rows, both dims padded to 16."""
    r, c = x.shape
    pad = np.zeros((-(-r // 16) * 16, -(-c // 16) * 16), dtype=x.dtype)
    pad[:r, :c] = x
    return pad.reshape(pad.shape[0], -1, 16).transpose(1, 0, 2)


def _matmul_form(p, name: str, info, values: np.ndarray) -> np.ndarray:
    """A matmul operand as it sits in GM: NZ operands as fractal blocks of the logical
    A [m, k] or B [k, n] (a trans_b weight is given as [n, k])."""
    if info.format != "NZ":
        return values
    if getattr(p, "batch", 1) != 1:
        raise NotInterpretable("a batched NZ operand has no GM image here yet")
    if name == "a":
        return nz(values.reshape(p.m, p.k))
    b = values.reshape(p.n, p.k).T if p.trans_b else values.reshape(p.k, p.n)
    return nz(b)


# op type -> fn(params, operand name, TensorInfo, values) -> the values in GM order
STORED_FORMS = {"matmul": _matmul_form, "batch_matmul": _matmul_form}


# ------------------------------------------------------------------ one op


def _random(shape: tuple, dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random values rounded to `dtype` (float: N(0, 1); int: small)."""
    if dtype in ("fp16", "bf16", "fp32"):
        return stored(rng.standard_normal(shape).astype(np.float32), dtype)
    return rng.integers(-8, 8, size=shape).astype(np.int64)


@frozen
class _Operand:
    name: str
    shape: tuple
    dtype: str
    format: str = "ND"


def _operands(op_type: str, low, hw: HwConfig, gm_names, rng) -> tuple[list[_Operand], list[_Operand], dict]:
    """(inputs, outputs, fixed input values) of the check: the op's listed operands that
    are GM tensors of its kernels, plus a KV cache op's cache tensors (read; and written
    by a cache writer), the block table holding the layout's own entries, plus what
    ASSUMED_INPUTS gives."""
    ins = [_Operand(t.name, tuple(t.shape), t.dtype, t.format) for t in low.inputs if t.name in gm_names]
    outs = [_Operand(t.name, tuple(t.shape), t.dtype, t.format) for t in low.outputs if t.name in gm_names]
    fixed = {}
    if op_type in ASSUMED_INPUTS:
        extra, fixed = ASSUMED_INPUTS[op_type][0](low.params, rng)
        ins += extra
    kv = spec(op_type).operands.kv if spec(op_type).operands else None
    if kv is not None:
        from npusim.ops.kv_cache import kv_row_align_bytes

        layout = low.params.kv_cache(kv_row_align_bytes(hw))
        cache = [_Operand(name, shape, dt) for name, (shape, dt) in layout.tensor_shapes().items()]
        ins = [t for t in ins if t.name not in {c.name for c in cache}] + cache
        if kv == "write":
            outs += [c for c in cache if c.name != "block_table"]
        if "block_table" in gm_names:
            fixed["block_table"] = layout.block_table()
    return ins, outs, fixed


def _embedding_inputs(p, rng) -> tuple[list, dict]:
    """Embedding gathers at addresses fixed when it is lowered (token ids are data; the
    IR's addresses are static): it is checked at the ids its lowering assumes, t *
    (vocab // tokens) mod vocab, over the whole table."""
    spread = max(1, p.vocab // p.tokens)
    table = _Operand("table", (p.vocab, p.hidden), p.dtype)
    return [table], {"ids": np.arange(p.tokens, dtype=np.int64) * spread % p.vocab,
                     "table": _random(table.shape, p.dtype, rng)}


# op type -> fn(params, rng) -> (operands to add, fixed input values): inputs the listed
# operands do not give as the kernels read them; and what the check then assumes
ASSUMED_INPUTS = {"embedding": (_embedding_inputs, "at the ids the lowering assumes")}

# Ops whose kernels reorder elements in UB by an instruction priced as a vector copy of
# its bytes (the IR carries no permutation): the interpreter would only copy them, and
# the reference's values would land elsewhere. Where every tile's elements go is tested
# on its own (tests/test_ops_transpose.py).
REORDERED_IN_UB = {
    "transpose": "its tiles are transposed in UB by instructions priced as vector copies (the IR carries no "
                 "permutation to run)",
    "trans_data": "its 32-byte blocks are reordered in UB by a vector copy (the IR carries no permutation to run)",
}


_SHOWN = ("m", "n", "k", "batch", "heads", "kv_heads", "new_tokens", "context", "seq_q", "seq_kv", "layer",
          "tokens", "vocab", "hidden")


def _describe(params) -> str:
    """The op's shape in a few words: its `shape`, or its size parameters."""
    if hasattr(params, "shape"):
        return "x".join(map(str, params.shape))
    return " ".join(f"{k}={getattr(params, k)}" for k in _SHOWN if hasattr(params, k))


def check_op(op_type: str, params, hw: HwConfig, seed: int = 0, tiling=None) -> KernelCheck:
    """Lower `op_type` at `params` (and `tiling`, if given), run its kernels on random
    data, compare with its reference."""
    s = spec(op_type)
    low = lower(op_type, params, hw, tiling)
    p = low.params
    names = ", ".join(dict.fromkeys(k.name for k in low.kernels))
    shape = _describe(p)
    elements = sum(math.prod(t.shape) for t in (*low.inputs, *low.outputs))
    if elements > MAX_ELEMENTS:
        raise NpusimError(f"check {op_type}: {elements} elements of operands, more than the {MAX_ELEMENTS} "
                          "the functional check runs (numpy executes every instruction); use a smaller shape")
    if s.reference is None:
        return KernelCheck(op_type, names, shape, status="not checked", reason="the op has no numpy reference")
    if op_type in REORDERED_IN_UB:
        return KernelCheck(op_type, names, shape, status="not checked", reason=REORDERED_IN_UB[op_type])
    try:
        outs, got, x = _run(op_type, p, low, hw, seed)
    except NotInterpretable as e:
        return KernelCheck(op_type, names, shape, status="not checked", reason=str(e))
    except (ProgramError, DeadlockError) as e:  # out of its memory, or waiting forever: a wrong program
        return KernelCheck(op_type, names, shape, status="FAIL", reason=str(e))
    specs = {t.name: SimpleNamespace(name=t.name, shape=tuple(t.shape), dtype=t.dtype, format=t.format)
             for t in (*low.inputs, *low.outputs)}
    ctx = RefContext(lengths=_lengths(p), phase="", store=stored)
    values = {k: v if np.issubdtype(v.dtype, np.integer) and k == "block_table" else v.astype(np.float32)
              for k, v in x.items()}
    try:
        ref = s.reference(p, values, specs, ctx)
    except KeyError as e:
        return KernelCheck(op_type, names, shape, status="not checked",
                           reason=f"its reference reads {e}, not a GM tensor of its kernels")
    missing = [name for name in ref if name not in got and name != "block_table"]
    if missing:
        return KernelCheck(op_type, names, shape, status="not checked",
                           reason=f"reference output {missing[0]!r} is not a GM tensor of its kernels")
    result = _compare(op_type, names, shape, outs, got, ref)
    if op_type in ASSUMED_INPUTS and not result.reason:
        result = attrs.evolve(result, reason=ASSUMED_INPUTS[op_type][1])
    return result


def _lengths(p) -> tuple[int, ...]:
    """Each sequence's length as the lowering assumes it: the whole context (a KV write
    at position -1 ends there; decode attention reads all of it)."""
    batch = getattr(p, "batch", 1)
    length = getattr(p, "context", None) or getattr(p, "seq_kv", None)
    return (length,) * batch if length else ()


def _run(op_type: str, p, low, hw: HwConfig, seed: int):
    """(outputs, their values, input values) of the lowered kernels run on random inputs."""
    tensors = {t.name: t for k in low.kernels for t in k.gm}
    if not tensors:
        raise NotInterpretable("the kernels name no GM tensors")
    rng = np.random.default_rng(seed)
    ins, outs, fixed = _operands(op_type, low, hw, tensors, rng)
    base = min(t.addr for t in tensors.values())
    gm = Gm(base, max(t.addr + t.nbytes for t in tensors.values()) - base)
    gm.data[:] = POISON  # an output element nobody writes reads back as NaN
    x = {t.name: fixed[t.name] if t.name in fixed else _random(t.shape, t.dtype, rng) for t in ins}
    form = STORED_FORMS.get(op_type)
    for t in ins:
        values = x[t.name]
        if form is not None:
            values = form(p, t.name, t, values)
        elif t.format != "ND":
            raise NotInterpretable(f"input {t.name!r} in format {t.format}: no GM image for it (STORED_FORMS)")
        raw = encode(values, t.dtype).reshape(-1)
        if raw.size > tensors[t.name].nbytes:
            raise NotInterpretable(f"input {t.name!r} has {raw.size} bytes, its GM tensor {tensors[t.name].nbytes}")
        gm.write(tensors[t.name].addr, raw)
    for kernel in low.kernels:
        run_kernel(kernel, hw, gm)
    got = {}
    for t in outs:
        raw = gm.read(tensors[t.name].addr, math.prod(t.shape) * DTYPE_BYTES[t.dtype])
        got[t.name] = decode(raw, t.dtype).reshape(t.shape)
    return outs, got, x


def _compare(op_type, names, shape, outputs, got, ref) -> KernelCheck:
    worst_abs = worst_rel = 0.0
    for t in outputs:
        r = np.asarray(ref[t.name], dtype=np.float64).reshape(t.shape)
        g = np.asarray(got[t.name], dtype=np.float64)
        if np.isnan(g).any() and not np.isnan(r).any():
            where = np.unravel_index(int(np.argmax(np.isnan(g))), g.shape)
            return KernelCheck(op_type, names, shape, math.inf, math.inf, "FAIL",
                               f"output {t.name!r} has NaN (an element never written, or read from unwritten "
                               f"memory) at {tuple(map(int, where))}")
        err = np.abs(g - r)
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        abs_err = float(np.max(err)) if err.size else 0.0
        rel = abs_err / scale if scale else abs_err
        tol = TOLERANCE.get(t.dtype, 0.0)
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel)
        if rel > tol:
            where = np.unravel_index(int(np.argmax(err)), err.shape)
            return KernelCheck(op_type, names, shape, worst_abs, worst_rel, "FAIL",
                               f"output {t.name!r} off by {abs_err:.3g} at {tuple(map(int, where))} "
                               f"({rel:.3g} of its largest value; {t.dtype} allows {tol:.3g})")
    return KernelCheck(op_type, names, shape, worst_abs, worst_rel)


@frozen
class StepCheck:
    """Every distinct kernel of a step checked: one KernelCheck per distinct (op, params)."""

    title: str
    checks: tuple[KernelCheck, ...]
    passes: str = ""  # what each pass changed (validate.pass_report)

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.checks)

    def table(self) -> str:
        lines = [self.passes] if self.passes else []
        tol = ", ".join(f"{dt} {t:.3g}" for dt, t in TOLERANCE.items() if dt in ("fp16", "bf16", "fp32"))
        lines += [f"{self.title} (kernels run by the functional interpreter vs the op's numpy reference; max rel = "
                  f"max abs / the output's largest value, allowed {tol}; integers exact)", table_header()]
        lines += [c.row() for c in self.checks]
        counts = _count_status(self.checks)
        lines.append(f"{counts.get('pass', 0)} passed, {counts.get('FAIL', 0)} failed, "
                     f"{counts.get('not checked', 0)} not checked")
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)


def _count_status(checks) -> dict:
    out: dict = {}
    for c in checks:
        out[c.status] = out.get(c.status, 0) + 1
    return out


def check_graph(graph, hw: HwConfig, seed: int = 0, seen: dict | None = None) -> tuple[KernelCheck, ...]:
    """check_op of every distinct (op type, parameters) among the graph's nodes, in node
    order, but those already in `seen` (op key -> check; updated)."""
    seen = {} if seen is None else seen
    out = []
    for node in graph.nodes:
        key = node.op_key()
        if key not in seen:
            seen[key] = check_op(node.op_type, node.params, hw, seed)
            out.append(seen[key])
    return tuple(out)


def check_step(workload="k3-tiny", passes="optimized", phases=("decode", "prefill"), batch: int = 2,
               context: int | None = None, hw: HwConfig | None = None, seed: int = 0, **options) -> StepCheck:
    """The distinct kernels of a workload's steps (each phase) after `passes`, checked;
    with what each pass changed."""
    from npusim.graph.build import build_decoder
    from npusim.hw import load_hw
    from npusim.passes import apply
    from npusim.passes.validate import pass_report
    from npusim.workload import Workload, load_workload

    hw = hw or load_hw("ascend910b2")
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    options = {k: v for k, v in options.items() if v is not None}
    checks, reports, seen = [], [], {}
    for phase in phases:
        g = build_decoder(w, phase, batch, context if context is not None else min(64, w.max_context_tokens))
        reports.append(pass_report(g, passes, **options))
        checks += check_graph(apply(g, passes, **options), hw, seed, seen)
    pipeline = passes if isinstance(passes, str) else ",".join(passes)
    title = f"validate kernels: {getattr(w, 'name', 'workload')} {'+'.join(phases)} batch {batch}, passes {pipeline}"
    return StepCheck(title, tuple(checks), "\n".join(reports))


__all__ = ["ASSUMED_INPUTS", "MAX_ELEMENTS", "REORDERED_IN_UB", "STORED_FORMS", "TOLERANCE", "KernelCheck",
           "StepCheck", "check_graph", "check_op", "check_step", "nz", "table_header"]
