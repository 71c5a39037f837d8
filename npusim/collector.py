"""How often the cyclic garbage collector runs while npusim works.

CPython collects its youngest generation every 700 allocations of container
objects, and every tenth of those collections the next generation too. A step makes
millions of short-lived events, tuples and closures, and its lowering hundreds of
thousands of instruction records, few of them in reference cycles: collecting every
700 walked them over and over - about a tenth of a K3 decode step's simulation and
a quarter of a 4096-token prefill's lowering. Objects without cycles are freed by
reference counting either way; what a rarer collection costs is the cyclic garbage
it leaves alive a little longer: a few MiB of peak memory (benchmarks/bench_step.py
prints the peak).

fewer_collections() is used around the engine's run and a step's lowering (for
library callers: notebooks, tests) and around the whole `npusim` program (npusim.__main__),
whose start-up, graph passes and cache reads allocate as much.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Allocations between two collections of the youngest generation (CPython's default: 700).
YOUNG_ALLOCATIONS = 50_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect the youngest generation every YOUNG_ALLOCATIONS allocations at most,
    within the block (a collector turned off stays off)."""
    young, *older = gc.get_threshold()
    if young:
        gc.set_threshold(max(young, YOUNG_ALLOCATIONS), *older)
    try:
        yield
    finally:
        gc.set_threshold(young, *older)


__all__ = ["YOUNG_ALLOCATIONS", "fewer_collections"]
