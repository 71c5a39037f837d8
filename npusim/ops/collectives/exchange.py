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


def enter(groups: dict[str, tuple[Exchange, int]]) -> None:
    """Make this thread a rank: op type -> (the exchange of its group for that collective,
    its rank in it); e.g. all_reduce over the tensor-parallel group, all_gather over the
    sequence-parallel one."""
    _here.groups = dict(groups)


def leave() -> None:
    _here.groups = None


def current(op_type: str) -> tuple[Exchange, int]:
    """(exchange, rank) of this thread for `op_type`; ValueError outside a multi-rank run."""
    groups = getattr(_here, "groups", None)
    if not groups or op_type not in groups:
        raise ValueError("a collective needs its peers: run the ranks' graphs with npusim.parallel.numerics")
    return groups[op_type]
