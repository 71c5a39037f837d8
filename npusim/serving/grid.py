"""A rectilinear grid of a function's values, evaluated lazily and refined where linear
interpolation misses (npusim.serving.stepcost's step prices; its module doc says how)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence


class Grid:
    """f(x_0, .., x_k) from engine points on a lazily evaluated, adaptively refined
    rectilinear grid (see the module doc). `knots`: the starting knots of each axis;
    `min_span`: the narrowest cell each axis is split to; `fixed`: the axes whose
    knots are the only values queried (buckets), never interpolated. Each value of the
    fixed axes is a grid of its own (a slice): the other axes are refined per slice, so
    a knot a cheap bucket needs (a batch where its cost steps) costs no engine run in an
    expensive one."""

    def __init__(self, f: Callable[..., float], knots: Sequence[Sequence[int]], tol: float,
                 min_span: Sequence[int], fixed: Sequence[bool] | None = None,
                 prefetch: Callable[[list[tuple[int, ...]], list[tuple[int, ...]]], None] | None = None):
        self.f, self.tol = f, tol
        # told the points about to be read together (a cell's corners, a split edge's two
        # halves' midpoints), so that it may price them at once, and the points a read
        # below them would need next (_below), which it may price ahead on a worker those
        # leave idle: StepCost.prefetch
        self._prefetch = prefetch or (lambda xs, below: None)
        self.start = [sorted(set(k)) for k in knots]
        self.min_span = tuple(min_span)
        self.fixed = tuple(fixed or [False] * len(self.start))
        self.slices: dict[tuple, list[list[int]]] = {}  # fixed axes' values -> every axis's knots there
        self.checked: set[tuple] = set()  # (axis, lo, hi, the other axes' lower corner)

    @property
    def knots(self) -> list[list[int]]:
        """Every axis's knots, over all slices."""
        return [sorted(set(k).union(*(s[axis] for s in self.slices.values()))) for axis, k in enumerate(self.start)]

    def prefetch(self, xs: list[tuple[int, ...]]) -> None:
        """Tell the prefetch hook the points `xs` about to be read, and those below them."""
        self._prefetch(xs, self._below(xs))

    def _below(self, xs: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """For each point of `xs` and each axis that is not fixed, the midpoint between the
        point and the knot below it there (when wider than the narrowest cell): the first
        point a check of that edge reads that is not a knot, were a query to fall below the
        point. No larger in any axis than the point, so no dearer to price (every axis -
        batch, tokens, chunks, context - adds work)."""
        out = []
        for x in xs:
            knots = self._slice(x)
            for axis, v in enumerate(x):
                i = bisect.bisect_left(knots[axis], v)
                if self.fixed[axis] or i == 0 or v - knots[axis][i - 1] <= self.min_span[axis]:
                    continue
                out.append((*x[:axis], (knots[axis][i - 1] + v) // 2, *x[axis + 1:]))
        return out

    def _slice(self, x: Sequence[int]) -> list[list[int]]:
        """The knots of the slice x lies in (its fixed axes' values)."""
        key = tuple(v for v, fixed in zip(x, self.fixed) if fixed)
        if key not in self.slices:
            self.slices[key] = [list(k) for k in self.start]
        return self.slices[key]

    @staticmethod
    def _bracket(knots: list[int], x: int) -> tuple[int, int]:
        i = bisect.bisect_left(knots, x)
        if i < len(knots) and knots[i] == x:
            return x, x
        if i == 0 or i == len(knots):
            raise ValueError(f"{x} outside the grid {knots[0]} .. {knots[-1]}")
        return knots[i - 1], knots[i]

    @staticmethod
    def _edge(axis: int, lo: int, hi: int, at: tuple[int, ...]) -> tuple:
        return axis, lo, hi, at[:axis] + at[axis + 1:]

    def _to_check(self, axis: int, lo: int, hi: int, at: tuple[int, ...]) -> bool:
        """Whether _split would check this edge: not yet checked, and wider than the narrowest cell."""
        return not (math.isinf(self.tol) or self._edge(axis, lo, hi, at) in self.checked
                    or hi - lo <= self.min_span[axis])

    def _split(self, axis: int, lo: int, hi: int, at: tuple[int, ...]) -> bool:
        """Check the edge lo..hi of `axis` (the other axes at the corner `at`) at its
        midpoint; add the midpoint as a knot (of at's slice) when linear interpolation
        misses it. True when a knot was added."""
        if not self._to_check(axis, lo, hi, at):
            return False
        mid = (lo + hi) // 2

        def on_edge(x: int) -> tuple[int, ...]:
            return (*at[:axis], x, *at[axis + 1:])

        self.prefetch([on_edge(lo), on_edge(hi), on_edge(mid)])
        f_lo, f_hi, f_mid = (self.f(*on_edge(x)) for x in (lo, hi, mid))
        guess = f_lo + (f_hi - f_lo) * (mid - lo) / (hi - lo)
        self.checked.add(self._edge(axis, lo, hi, at))
        if abs(guess - f_mid) <= self.tol * f_mid:
            return False
        bisect.insort(self._slice(at)[axis], mid)
        self.prefetch([on_edge((a + b) // 2) for a, b in ((lo, mid), (mid, hi)) if self._to_check(axis, a, b, at)])
        # where one midpoint missed, the cost is not smooth (wave quantisation, a tiling step):
        # both halves of the edge are checked at once, not only the one a query falls in
        self._split(axis, lo, mid, at)
        self._split(axis, mid, hi, at)
        return True

    def __call__(self, *x: int) -> float:
        knots = self._slice(x)
        while True:
            cell = [self._bracket(k, v) for k, v in zip(knots, x)]
            for axis, (lo, hi) in enumerate(cell):
                if self.fixed[axis] and lo != hi:
                    raise ValueError(f"{x[axis]} is not a knot of {knots[axis]}")
            corner = tuple(lo for lo, _ in cell)
            if not any(lo != hi and self._split(axis, lo, hi, corner) for axis, (lo, hi) in enumerate(cell)):
                break
        t = [0.0 if lo == hi else (v - lo) / (hi - lo) for (lo, hi), v in zip(cell, x)]
        corners = []  # multilinear: the cell's corners, weighted
        for side in itertools.product((0, 1), repeat=len(cell)):
            weight = math.prod(ti if s_ else 1.0 - ti for ti, s_ in zip(t, side))
            if weight:
                corners.append((weight, tuple(c[s_] for c, s_ in zip(cell, side))))
        self.prefetch([c for _, c in corners])
        total = 0.0
        for weight, corner in corners:
            total += weight * self.f(*corner)
        return total
