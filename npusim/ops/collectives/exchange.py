"""How the numpy references of collectives see the other ranks.

The numpy executor runs one graph; a sharded step is one graph per rank, run in
threads side by side (npusim.parallel.numerics), each thread knowing its rank and
the Exchange it shares with the others. A collective's reference puts its operand
in the exchange, waits for every rank's, and combines them in rank order, so the
result does not depend on thread timing.
"""

from __future__ import annotations

import threading

import numpy as np

# Seconds a rank waits for the others at a collective before the run is an error
# (a rank that stopped on an error aborts the exchange at once; this only bounds a bug).
WAIT_S = 600.0

_here = threading.local()


class Exchange:
    """Slots for `ranks` ranks' operands at one collective at a time."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.barrier = threading.Barrier(ranks, timeout=WAIT_S)
        self.slots: list = [None] * ranks

    def gather(self, rank: int, value: np.ndarray) -> list[np.ndarray]:
        """Every rank's `value`, in rank order (each rank calls it with its own)."""
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read them all
        return out

    def abort(self) -> None:
        self.barrier.abort()


def enter(exchange: Exchange, rank: int) -> None:
    """Make this thread rank `rank` of `exchange` (its collectives' references use it)."""
    _here.exchange, _here.rank = exchange, rank


def leave() -> None:
    _here.exchange = _here.rank = None


def current() -> tuple[Exchange, int]:
    """(exchange, rank) of this thread; ValueError outside a multi-rank run."""
    ex = getattr(_here, "exchange", None)
    if ex is None:
        raise ValueError("a collective needs its peers: run the ranks' graphs with npusim.parallel.numerics")
    return ex, _here.rank
