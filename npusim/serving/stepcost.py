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

- a mixed iteration (chunked prefill: prefill chunks beside decodes, or a chunk
  after the first of its prompt) by (decodes, chunks, longest chunk, context
  room), one engine step of graph.build's mixed phase: the decodes' and the
  chunks' tokens share one pass over the weights. Its shapes have the step's
  longest context; the fourth axis is that context less the longest chunk
  (the room the chunk's prefix has), or with buckets the bucket itself.

Each is a `Grid`: a rectilinear grid whose corner values come from the engine
(same hardware, passes and pass options as `npusim run`), evaluated only when a
query needs them, and multilinear between them (a step's cost is close to
multilinear in these axes: weights once, GEMM rows, KV read by batch x context,
chunk attention by chunks x chunk x context). Before a cell is trusted the
midpoint of each of its edges through the query's lower corner is simulated
too; where linear interpolation misses it by more than `tol`, the midpoint
becomes a knot of the grid and both halves of the edge are checked in turn
(the grid is refined where the error is large: a batched prefill's cost steps
up with each wave of tiles over the cores), down to cells one sequence and
`MIN_SPAN_TOKENS` tokens wide. With the buckets pass
on, lengths are rounded up to their bucket first: the graph has the bucket's
shapes, so the knots along the context axis are the buckets themselves and that
axis is never interpolated. bench_stepcost.py measures the error on steps the
model was not built from.

Engine runs are kept in memory and, when a store is given, on disk in npusim's
cache (npusim.diskcache: one entry per point, keyed by the workload, passes,
options, shape, the hardware fields the point's run read, npusim's model version
and POINT_SCHEME, so a change to what the engine or this model simulates, which
bumps one of them, invalidates it). With jobs > 1 the points a check reads
together (an edge's ends and midpoint, the two halves of a split edge, a cell's
corners) are priced at once in worker processes, and a worker they leave idle
prices ahead a smaller point a read below them would need next (a knot of the batch
axis read alone, as a step of the largest batch is, leaves one idle); the grid is
the same either way.

Modelling assumptions, here and not in the engine:
- steps are priced on a copy of the hardware whose HBM capacity is unbounded:
  a padded ragged batch holds batch x longest-context KV in its graph even when the
  paged cache the scheduler manages fits; whether a batch fits is the scheduler's
  question (blocks.py), not the pricing's. The capacity does not enter the timing.
- the decoder graph pads a part of a batch to its longest member: a mixed step's
  chunks to the longest chunk, every sequence to the longest context (graph.build).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from npusim.step_flags import fast_forward_key
from npusim.diskcache import DiskCache
from npusim.diskcache.compute import cached
from npusim.diskcache.keys import options_key
from npusim.hw import HwConfig, load_hw
from npusim.passes import pass_names
from npusim.passes.buckets import DEFAULT_BUCKETS, bucket_of, distinct_kernels
from npusim.runtime import MemoryBreakdown
from npusim.graph.build import build_decoder
from npusim.passes import apply
from npusim.pool import run_tasks
from npusim.runtime.run import run_graph
from npusim.serving.grid import Grid
from npusim.serving.state import Work
from npusim.workload import Workload, load_workload

# A length cell this narrow is not split further: one token, so that a step in the
# cost (a GEMM's rows crossing a tile, as a chunk of 171 x 3 tokens does 512) ends
# up between two adjacent knots, where no query falls between them (k3: a mixed
# step's chunk cells 8 tokens wide missed such a step by 8%, bench_stepcost.py)
MIN_SPAN_TOKENS = 1
# The relative error an edge midpoint may show before its cell is split. A batched
# prefill's cost is a sawtooth in the batch about 1% deep (K3, 4096 tokens: a batch of 9,
# 12 or 15 prompts costs 1.2% more per token than 8, 10 or 16; the GEMMs' and attention's
# tiles over the 24 cores), so at 0.5% every batch between two powers of two became an
# engine point: the K3 serve of docs/serving.md priced 137 of them, 41 at 2%, and its
# summary moved by at most 0.7% (TPOT P50). 2% is well inside the model's own error
# against silicon (README, "How close to silicon"); bench_stepcost.py --tol prints both.
DEFAULT_TOL = 0.02
# Bump when what a point simulates changes (_lengths, graph): cached points go stale. The
# model version in the cache key (npusim.model_version) versions what the engine simulates;
# this, what a grid point is made to simulate (tests/test_engine_regression.py records both).
POINT_SCHEME = 3


def _no_larger(k: tuple, than: tuple) -> bool:
    """Point k is of the same phase as `than` and no larger in any axis."""
    return k[0] == than[0] and all(a <= b for a, b in zip(k[1:], than[1:]))


class _NotStored(Exception):
    """A point asked of the store only (StepCost._simulate(engine=False)) is not there."""


@attrs.frozen
class Point:
    """One engine run: the step's latency and its device memory."""

    latency_us: float
    memory: MemoryBreakdown


class StepCost:
    """Step prices for one (workload, hardware, passes, options), from the engine.

    `max_batch`: the largest batch a scheduler runs (the grid's batch axis);
    `store`: the on-disk cache engine points persist in between runs (None: memory only);
    `on_point(key)`: called as the engine starts simulating a point, key = (phase, *shape)
    (a progress display: on K3 a large batched prefill takes minutes), for a worker too;
    `on_plan(keys)`: the points the grid is about to read that the engine will have to
    price (neither known nor in the store), as soon as it knows them; `on_priced(key,
    seconds)`: a point started is priced, in that many seconds of wall time (with workers,
    the batch's time shared among its points) - with on_point, what serve's display
    counts and its ETA comes from;
    `jobs`: worker processes that price points the grid reads together at once;
    `tp`: cards of a tensor-parallel group: each point is one card's sharded step with its
    collectives, as `npusim run --tp` prices it (one card simulated, its peers symmetric)."""

    def __init__(self, workload: Workload | str, hw: HwConfig | str = "ascend910b2", passes="optimized",
                 options: Mapping[str, Any] | None = None, max_batch: int = 32, tol: float = DEFAULT_TOL,
                 store: DiskCache | None = None, refine: bool = True,
                 on_plan: Callable[[list[tuple]], None] | None = None,
                 on_priced: Callable[[tuple, float], None] | None = None,
                 on_point: Callable[[tuple], None] | None = None, jobs: int = 1, tp: int = 1,
                 exact: bool = True):
        self.workload = workload if isinstance(workload, Workload) else load_workload(workload)
        self.hw = load_hw(hw)
        # priced on unbounded HBM capacity (module doc): only the memory check reads it
        self.pricing_hw = attrs.evolve(self.hw, hbm=attrs.evolve(self.hw.hbm, hbm_bytes=1 << 50))
        self.passes = pass_names(passes)
        self.options = {k: v for k, v in (options or {}).items() if v is not None}
        self.max_batch = max_batch
        self.store = store
        self.on_point = on_point
        self.on_plan, self.on_priced = on_plan, on_priced
        self.jobs = jobs
        self.tp = tp  # tensor-parallel degree: every point is one card's shard (graph.build_decoder(tp=))
        self.exact = exact  # True: no kernel of a point fast-forwarded (npusim.engine.fastforward; --exact)
        self.points: dict[tuple, Point] = {}  # (phase, its shape's numbers) -> the engine's run
        # points priced ahead on idle workers, not read yet: key -> (point, engine ran, seconds)
        self.ahead: dict[tuple, tuple[Point, bool, float]] = {}
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
        tokens = (1, MIN_SPAN_TOKENS)
        self.decode = self._grid(lambda b, n: ("decode", b, n), [batches, lengths], tol_, tokens,
                                 (False, self.bucketed))
        self.prefill = self._grid(lambda b, n: ("prefill", b, n), [powers, lengths], tol_, tokens,
                                  (False, self.bucketed))
        # mixed: (decodes, chunks, longest chunk, room: the context less the chunk, or its bucket).
        # Chunks from powers of two, as prefill: a corner with many long chunks is a long engine run
        chunk = sorted({2**i for i in range(int(math.log2(ctx)) + 1)} | {ctx})
        room = lengths if self.bucketed else sorted({0} | set(lengths))
        self.mixed = self._grid(lambda *x: ("mixed", *self._mixed_key(*x)), [[0, max_batch], powers, chunk, room],
                                tol_, (1, 1, MIN_SPAN_TOKENS, MIN_SPAN_TOKENS), (False, False, False, self.bucketed))
        self._kernels: dict[str, int] = {}

    def _grid(self, key: Callable[..., tuple], knots, tol: float, min_span, fixed) -> Grid:
        """A grid over the points key(*x) = (phase, *shape)."""
        return Grid(lambda *x: self.point(*key(*x)).latency_us, knots, tol, min_span, fixed,
                    prefetch=(lambda xs, below: self.prefetch([key(*x) for x in xs], [key(*x) for x in below]))
                    if self.jobs > 1 or self.on_plan is not None else None)

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
        n = self._longest(key)
        if phase == "decode" and batch > 1 and n > 1:
            return [n] + [n - 1] * (batch - 1)
        return n

    def _longest(self, key: int) -> int:
        """The longest sequence of a step whose length key is `key`."""
        return key if not self.bucketed else max(1, key - self.margin)

    def _mixed_key(self, decodes: int, chunks: int, chunk: int, room: int) -> tuple[int, int, int, int]:
        """A mixed grid point's shape: (decodes, chunks, longest chunk, context key)."""
        if self.bucketed:
            return decodes, chunks, min(chunk, self._longest(room)), room
        return decodes, chunks, chunk, min(chunk + room, self.workload.max_context_tokens)

    def _mixed_lengths(self, decodes: int, chunks: int, chunk: int, key: int) -> tuple[list[int], list[int]]:
        """A mixed point's (lengths, new tokens): its chunks end at the longest context,
        its decodes one token shorter (ragged, as a decode point)."""
        n = self._longest(key)
        return [max(1, n - 1)] * decodes + [n] * chunks, [1] * decodes + [chunk] * chunks

    # ---- engine points

    def point(self, phase: str, *shape: int) -> Point:
        k = (phase, *shape)
        if k not in self.points:
            self.points[k] = self._ahead_read(k) or self._simulate(k)
        return self.points[k]

    def _ahead_read(self, k: tuple) -> Point | None:
        """A point priced ahead (prefetch), now read: known from here on, and told to the
        display as priced, as it was when its worker ran it."""
        if k not in self.ahead:
            return None
        pt, ran, seconds = self.ahead.pop(k)
        self.engine_runs += ran
        if ran and self.on_point is not None:
            self.on_point(k)
        if ran and self.on_priced is not None:
            self.on_priced(k, seconds)
        return pt

    def prefetch(self, keys: Sequence[tuple], below: Sequence[tuple] = ()) -> None:
        """Price at once, in `jobs` worker processes, the points of `keys` neither known
        nor in the store, when that is two or more and jobs > 1; otherwise nothing (each
        is priced when first read). A point is the same either way: one engine run or
        its cached result, whichever process runs it (forked: a copy of this model). A
        point whose worker fails is left to be priced here when it is read. With on_plan,
        the points left to price are told to it first (jobs 1 too).

        Workers those points leave idle price points of `below` ahead (Grid._below: what
        a read below them needs next), each no larger in any axis than one of them, so
        no longer to price: kept aside and known only once the grid reads them. The
        grid, its points and the engine runs counted are the same with any `jobs`; a
        point priced ahead and never read is counted in `ahead` alone (and is in the store)."""
        if self.jobs < 2 and self.on_plan is None:
            return
        todo = []
        for k in dict.fromkeys(keys):
            if k not in self.points:
                known = self._ahead_read(k) or self._simulate(k, engine=False)
                if known is None:
                    todo.append(k)
                else:
                    self.points[k] = known
        if todo and self.on_plan is not None:
            self.on_plan(todo)
        if self.jobs < 2:
            return
        spare = [k for k in dict.fromkeys(below) if k not in self.points and k not in self.ahead and k not in todo
                 and any(_no_larger(k, t) for t in todo) and self._simulate(k, engine=False) is None]
        spare = spare[:max(0, self.jobs - len(todo))]
        if len(todo) + len(spare) < 2:
            return
        for k in todo:
            if self.on_point is not None:
                self.on_point(k)
        last = time.perf_counter()

        def done(i: int, result: tuple[Point, bool]) -> None:
            nonlocal last
            now = time.perf_counter()  # the batch's wall time, shared among its points as they finish
            if i >= len(todo):
                self.ahead[spare[i - len(todo)]] = (*result, now - last)
            else:
                self.points[todo[i]], ran = result
                self.engine_runs += ran
                if self.on_priced is not None:
                    self.on_priced(todo[i], now - last)
            last = now

        run_tasks(self._price_in_worker, [(k,) for k in todo + spare], self.jobs, done, lambda i, reason: None)

    def _price_in_worker(self, k: tuple) -> tuple[Point, bool]:
        """A worker's task: the point, and whether the engine ran for it (not the cache)."""
        self.on_point = self.on_plan = self.on_priced = None  # the parent tells its display
        runs = self.engine_runs
        return self._simulate(k), self.engine_runs > runs

    def graph(self, phase: str, *shape: int, hw: HwConfig | None = None):
        """The decoder graph of a point after the passes, as `npusim run` builds it."""
        if phase == "mixed":
            lengths, new_tokens = self._mixed_lengths(*shape)
            g = build_decoder(self.workload, "mixed", len(lengths), lengths, new_tokens=new_tokens, tp=self.tp)
        else:
            batch, key = shape
            g = build_decoder(self.workload, phase, batch, self._lengths(phase, batch, key), tp=self.tp)
        return apply(g, self.passes, **self.options, hw=hw or self.pricing_hw)

    def _simulate(self, k: tuple, engine: bool = True) -> Point | None:
        """The point from the engine, or from the store when a run with the same inputs
        made it; engine=False: from the store only (None if it is not there)."""

        def price(hw: HwConfig) -> Point:
            if not engine:
                raise _NotStored
            if self.on_point is not None:
                self.on_point(k)
            began = time.perf_counter()
            run = run_graph(self.graph(*k, hw=hw), hw, counters=False, exact=self.exact)
            self.engine_runs += 1
            if self.on_priced is not None:
                self.on_priced(k, time.perf_counter() - began)
            return Point(run.latency_us, run.memory)

        inputs = (self.workload, list(self.passes), options_key(dict(self.options)), list(k),
                  POINT_SCHEME) + ((self.tp,) if self.tp > 1 else ()) + fast_forward_key(self.exact) \
            if self.store is not None else None
        try:
            pt = cached(self.store, "serving-point", inputs, self.pricing_hw, price)
        except _NotStored:
            return None
        return Point(pt.latency_us, attrs.evolve(pt.memory, capacity_bytes=self.hw.hbm.hbm_bytes))

    # ---- prices

    def decode_us(self, batch: int, context: int) -> float:
        """A decode step of `batch` sequences whose longest context is `context` (new token included)."""
        return self.decode(batch, self.length_key(context))

    def prefill_us(self, batch: int, tokens: int) -> float:
        """A prefill of `batch` prompts padded to `tokens`."""
        return self.prefill(batch, self.length_key(tokens))

    def mixed_us(self, decodes: int, chunks: int, chunk: int, context: int) -> float:
        """A mixed step: `decodes` decode tokens beside `chunks` prefill chunks of at most
        `chunk` tokens, its longest sequence `context` tokens long after the step."""
        key = self.length_key(context)
        return self.mixed(decodes, chunks, chunk, key if self.bucketed else key - chunk)

    def work_us(self, work: Work) -> float:
        """One iteration: its prefill, its decode step, or one mixed step."""
        if work.mixed:
            return self.mixed_us(work.decode_batch, work.prefill_batch, work.prefill_tokens, work.context)
        if work.prefill_batch:
            return self.prefill_us(work.prefill_batch, work.prefill_tokens)
        return self.decode_us(work.decode_batch, work.decode_context)

    def shapes(self, work: Work) -> set[tuple]:
        """The shapes an iteration runs: a new shape's first run compiles its kernels."""
        if work.mixed:
            return {("mixed", work.decode_batch, work.prefill_batch, work.prefill_tokens,
                     self.length_key(work.context))}
        if work.prefill_batch:
            return {("prefill", work.prefill_batch, self.length_key(work.prefill_tokens))}
        return {("decode", work.decode_batch, self.length_key(work.decode_context))}

    def compile_us(self, phase: str) -> float:
        """First run of a new shape: distinct kernels x kernel_compile_us (as
        passes.buckets.first_run_compile_us), the kernels counted once per phase at a
        small shape (their number does not depend on the lengths)."""
        if phase not in self._kernels:
            small = {"mixed": (1, 1, 2, self.length_key(3))}.get(phase, (2, self.length_key(2)))
            self._kernels[phase] = distinct_kernels(self.graph(phase, *small))
        return self._kernels[phase] * self.hw.runtime.kernel_compile_us

    def kv_capacity_bytes(self, fraction: float) -> int:
        """KV-cache bytes the device holds beside the weights and the largest decode
        batch's activations and workspace (from the engine's MemoryBreakdown at
        max_batch), times `fraction`."""
        m = self.point("decode", self.max_batch, self.decode.knots[1][0]).memory
        free = self.hw.hbm.hbm_bytes - m.weights_bytes - m.activation_bytes - m.workspace_bytes
        return max(0, int(free * fraction))


__all__ = ["DEFAULT_TOL", "MIN_SPAN_TOKENS", "Grid", "Point", "StepCost"]
