"""The step-cost model: what one serving iteration takes, priced by the engine.

Simulating every iteration of a serving run with the cycle-level engine would
take hours, so the model prices steps at chosen points and interpolates:

- a decode step by (batch, context): the context of its longest sequence, since
  the decoder graph of a ragged batch has the shapes of its longest sequence
  (graph.build: the lowering reads and writes at the longest length);
- a prefill by (batch, prompt tokens), the prompts padded to the longest. (Pricing
  a batch as the sum of its prompts' single prefills was tried and rejected: on
  k3-tiny, launch-bound, it is 4-5x too slow. The price: an engine point of a
  large batched prefill takes minutes to simulate on K3.)

Each phase is a `Surface`: a rectilinear grid over (batch, length) whose corner
values come from `run_decoder` (same hardware, passes and pass options as
`npusim run`), evaluated only when a query needs them, and bilinear between
them. Before a cell is trusted its edge midpoints are simulated too; where
linear interpolation misses one by more than `tol`, the midpoint becomes a knot
of the grid (the grid is refined where the error is large), down to cells one
batch and `MIN_SPAN_TOKENS` tokens wide. With the buckets pass on, lengths are
rounded up to their bucket first: the graph has the bucket's shapes, so the
knots along the length axis are the buckets themselves and only the batch axis
is interpolated. bench_stepcost.py measures the error on steps the model was
not built from.

Engine runs are kept in memory and, when a store is given, on disk in npusim's
cache (npusim.diskcache: one entry per point, keyed by the workload, passes,
options, shape, the hardware fields the point's run read and npusim's version,
so a change to the engine invalidates it).

Modelling assumptions, here and not in the engine:
- steps are priced on a copy of the hardware whose HBM capacity is unbounded:
  a padded ragged batch holds batch x longest-context KV in its graph even when the
  paged cache the scheduler manages fits; whether a batch fits is the scheduler's
  question (blocks.py), not the pricing's. The capacity does not enter the timing.
- a mixed iteration (prefill chunks beside decodes, chunked prefill) is priced as
  the prefill of its chunks plus the decode step: the graph builder has no mixed
  step yet. This counts the weight reads and launches twice (too slow) and leaves
  out the chunk's attention to the earlier part of its prompt (too fast).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from npusim.diskcache import DiskCache
from npusim.diskcache.compute import cached
from npusim.diskcache.keys import options_key
from npusim.hw import HwConfig, load_hw
from npusim.passes import pass_names
from npusim.passes.buckets import DEFAULT_BUCKETS, bucket_of, distinct_kernels
from npusim.runtime import MemoryBreakdown
from npusim.runtime.decoder import run_decoder, step
from npusim.serving.state import Work
from npusim.workload import Workload, load_workload

MIN_SPAN_TOKENS = 8  # a length cell narrower than this is not split further
DEFAULT_TOL = 0.005  # relative error an edge midpoint may show before its cell is split
POINT_SCHEME = 2  # bump when what a point simulates changes (_lengths): cached points go stale


@attrs.frozen
class Point:
    """One engine run: the step's latency and its device memory."""

    latency_us: float
    memory: MemoryBreakdown


class Surface:
    """f(batch, length) from engine points on a lazily evaluated, adaptively refined
    rectilinear grid (see the module doc). `lengths_fixed`: the length knots are
    the only lengths queried (buckets), so that axis is never interpolated."""

    def __init__(self, f: Callable[[int, int], float], batches: list[int], lengths: list[int], tol: float,
                 lengths_fixed: bool = False):
        self.f, self.tol, self.lengths_fixed = f, tol, lengths_fixed
        self.b = sorted(set(batches))
        self.l = sorted(set(lengths))
        self.checked: set[tuple[str, int, int, int]] = set()  # (axis, lo, hi, at the other axis's knot)

    @staticmethod
    def _bracket(knots: list[int], x: int) -> tuple[int, int]:
        i = bisect.bisect_left(knots, x)
        if i < len(knots) and knots[i] == x:
            return x, x
        if i == 0 or i == len(knots):
            raise ValueError(f"{x} outside the grid {knots[0]} .. {knots[-1]}")
        return knots[i - 1], knots[i]

    def _split(self, axis: str, lo: int, hi: int, at: int) -> bool:
        """Check the edge lo..hi of `axis` (at the other axis's knot `at`) at its
        midpoint; add the midpoint as a knot when linear interpolation misses it.
        True when a knot was added."""
        key = (axis, lo, hi, at)
        min_span = 1 if axis == "b" else MIN_SPAN_TOKENS
        if key in self.checked or hi - lo <= min_span:
            return False
        mid = (lo + hi) // 2
        pt = (lambda x: (x, at)) if axis == "b" else (lambda x: (at, x))
        f_lo, f_hi, f_mid = self.f(*pt(lo)), self.f(*pt(hi)), self.f(*pt(mid))
        guess = f_lo + (f_hi - f_lo) * (mid - lo) / (hi - lo)
        self.checked.add(key)
        if abs(guess - f_mid) <= self.tol * f_mid:
            return False
        knots = self.b if axis == "b" else self.l
        bisect.insort(knots, mid)
        return True

    def __call__(self, batch: int, length: int) -> float:
        while True:
            b0, b1 = self._bracket(self.b, batch)
            l0, l1 = self._bracket(self.l, length)
            if self.lengths_fixed and l0 != l1:
                raise ValueError(f"length {length} is not a knot of {self.l}")
            if b0 != b1 and self._split("b", b0, b1, l0):
                continue
            if l0 != l1 and self._split("l", l0, l1, b0):
                continue
            break
        tb = 0.0 if b0 == b1 else (batch - b0) / (b1 - b0)
        tl = 0.0 if l0 == l1 else (length - l0) / (l1 - l0)
        f = self.f
        low = f(b0, l0) + tl * (f(b0, l1) - f(b0, l0)) if tl else f(b0, l0)
        if not tb:
            return low
        high = f(b1, l0) + tl * (f(b1, l1) - f(b1, l0)) if tl else f(b1, l0)
        return low + tb * (high - low)


class StepCost:
    """Step prices for one (workload, hardware, passes, options), from the engine.

    `max_batch`: the largest batch a scheduler runs (the grid's batch axis);
    `store`: the on-disk cache engine points persist in between runs (None: memory only)."""

    def __init__(self, workload: Workload | str, hw: HwConfig | str = "ascend910b2", passes="optimized",
                 options: Mapping[str, Any] | None = None, max_batch: int = 32, tol: float = DEFAULT_TOL,
                 store: DiskCache | None = None, refine: bool = True):
        self.workload = workload if isinstance(workload, Workload) else load_workload(workload)
        self.hw = load_hw(hw)
        # priced on unbounded HBM capacity (module doc): only the memory check reads it
        self.pricing_hw = attrs.evolve(self.hw, hbm=attrs.evolve(self.hw.hbm, hbm_bytes=1 << 50))
        self.passes = pass_names(passes)
        self.options = {k: v for k, v in (options or {}).items() if v is not None}
        self.max_batch = max_batch
        self.store = store
        self.points: dict[tuple[str, int, int], Point] = {}
        self.engine_runs = 0  # points simulated in this process (not from the disk cache)
        self.bucketed = "buckets" in self.passes
        self.buckets = tuple(self.options.get("buckets", DEFAULT_BUCKETS))
        self.margin = int(self.options.get("margin", 0))
        ctx = self.workload.max_context_tokens
        # the batch axis is refined where a midpoint check misses. Decode starts from its
        # ends; prefill from powers of two, since a large batched prefill takes minutes of
        # engine time on K3 and a few prompts at once must not need one simulated
        batches = [1, max_batch]
        powers = sorted({min(2**i, max_batch) for i in range(max_batch.bit_length() + 1)})
        if self.bucketed:
            lengths = sorted({self.length_key(n) for n in range(1, ctx + 1)})  # every bucket a step can have
        else:  # powers of 4 to start with: a short step never needs a long corner simulated
            lengths = sorted({4**i for i in range(int(math.log(ctx, 4)) + 1)} | {ctx})
        tol_ = tol if refine else float("inf")
        self.decode = Surface(lambda b, n: self.point("decode", b, n).latency_us, batches, lengths, tol_,
                              self.bucketed)
        self.prefill = Surface(lambda b, n: self.point("prefill", b, n).latency_us, powers, lengths, tol_,
                               self.bucketed)
        self._kernels: dict[str, int] = {}

    # ---- shapes

    def length_key(self, length: int) -> int:
        """The length a step's graph has: its bucket (capped at the max context) with
        the buckets pass, else the length itself.
        # assumption: a padded batch never grows past the model's max context (its
        # sequences each fit, and the padded cache is allocated at most that long)"""
        length = min(length, self.workload.max_context_tokens)
        if not self.bucketed:
            return length
        return max(min(bucket_of(length, self.buckets, self.margin), self.workload.max_context_tokens), length)

    def _lengths(self, phase: str, batch: int, key: int):
        """The lengths a point is simulated at: in decode a ragged batch (one sequence
        at the longest context, the rest one token shorter: serving batches are ragged);
        with buckets the longest sequence that still gets this bucket."""
        n = key if not self.bucketed else max(1, key - self.margin)
        if phase == "decode" and batch > 1 and n > 1:
            return [n] + [n - 1] * (batch - 1)
        return n

    # ---- engine points

    def point(self, phase: str, batch: int, key: int) -> Point:
        k = (phase, batch, key)
        if k not in self.points:
            self.points[k] = self._simulate(k)
        return self.points[k]

    def _simulate(self, k: tuple[str, int, int]) -> Point:
        """The point from the engine, or from the store when a run with the same inputs made it."""
        phase, batch, key = k

        def price(hw: HwConfig) -> Point:
            run = run_decoder(self.workload, hw, phase, batch, self._lengths(phase, batch, key), self.passes,
                              counters=False, **self.options)
            self.engine_runs += 1
            return Point(run.latency_us, run.memory)

        inputs = (self.workload, list(self.passes), options_key(dict(self.options)), list(k),
                  self._lengths(phase, batch, key), POINT_SCHEME) if self.store is not None else None
        pt = cached(self.store, "serving-point", inputs, self.pricing_hw, price)
        return Point(pt.latency_us, attrs.evolve(pt.memory, capacity_bytes=self.hw.hbm.hbm_bytes))

    # ---- prices

    def decode_us(self, batch: int, context: int) -> float:
        """A decode step of `batch` sequences whose longest context is `context` (new token included)."""
        return self.decode(batch, self.length_key(context))

    def prefill_us(self, batch: int, tokens: int) -> float:
        """A prefill of `batch` prompts padded to `tokens`."""
        return self.prefill(batch, self.length_key(tokens))

    def work_us(self, work: Work) -> float:
        """One iteration: its prefill, its decode step, or both (a mixed iteration:
        the sum, the module doc's assumption)."""
        us = self.prefill_us(work.prefill_batch, work.prefill_tokens) if work.prefill_batch else 0.0
        if work.decode_batch:
            us += self.decode_us(work.decode_batch, work.decode_context)
        return us

    def shapes(self, work: Work) -> set[tuple[str, int, int]]:
        """The shapes an iteration runs: a new shape's first run compiles its kernels."""
        out = set()
        if work.prefill_batch:
            out.add(("prefill", work.prefill_batch, self.length_key(work.prefill_tokens)))
        if work.decode_batch:
            out.add(("decode", work.decode_batch, self.length_key(work.decode_context)))
        return out

    def compile_us(self, phase: str) -> float:
        """First run of a new shape: distinct kernels x kernel_compile_us (as
        passes.buckets.first_run_compile_us), the kernels counted once per phase at a
        small shape (their number does not depend on the lengths)."""
        if phase not in self._kernels:
            s = step(self.workload, phase, 2, self._lengths(phase, 2, self.length_key(2)), self.passes,
                     **self.options)
            self._kernels[phase] = distinct_kernels(s.graph())
        return self._kernels[phase] * self.hw.runtime.kernel_compile_us

    def kv_capacity_bytes(self, fraction: float) -> int:
        """KV-cache bytes the device holds beside the weights and the largest decode
        batch's activations and workspace (from the engine's MemoryBreakdown at
        max_batch), times `fraction`."""
        m = self.point("decode", self.max_batch, self.decode.l[0]).memory
        free = self.hw.hbm.hbm_bytes - m.weights_bytes - m.activation_bytes - m.workspace_bytes
        return max(0, int(free * fraction))


__all__ = ["DEFAULT_TOL", "MIN_SPAN_TOKENS", "Point", "StepCost", "Surface"]
