"""Routers: which replica of a cluster a request goes to, as it arrives.

A router is a small class in a registry keyed by its name (`--router NAME`). The
cluster asks it once per request, at the request's arrival, with the replicas in
index order; it answers a replica's index. What a replica holds at that moment
comes from `Replica.outstanding(now)`: the requests routed to it and not finished
by `now`, and their tokens (prompt + output), exact at the arrival time (a
replica's steps that end later do not count yet). Ties go to the lowest index, so
a run is deterministic.

    round-robin     the replicas in turn, whatever they hold
    shortest-queue  the fewest requests in the replica (waiting or running): join the shortest queue
    least-loaded    the fewest tokens in the replica (its requests' prompt + output tokens):
                    a long request weighs more than a short one
    kv-local        prefill -> decode (disagg.py): the fewest requests in the decode instance,
                    as shortest-queue, and among those a decode instance on the node the
                    prompt's KV cache was prefilled on (Seq.kv_node: the transfer goes over
                    HCCS, not the NIC between nodes)

Add one with `@router("name")` on a class with `route(seq, replicas, now) -> int`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from npusim.errors import ConfigError
from npusim.serving.state import Seq


class Loaded(Protocol):
    """What a router reads of a replica."""

    node: int  # the node of its first card (topology.node_device_count cards a node)

    def outstanding(self, now: float) -> tuple[int, int]:
        """(requests, tokens) routed to it and not finished by `now` (µs)."""


class Router(Protocol):
    def route(self, seq: Seq, replicas: Sequence[Loaded], now: float) -> int: ...


ROUTERS: dict[str, Callable[[], Router]] = {}
# the routers that read where a request was prefilled (Seq.kv_node): a decode side's (--pd-router) only
PREFILLED_ONLY: set[str] = set()


def router(name: str, prefilled_only: bool = False):
    """Register a router class under `name`; `prefilled_only`: it routes prefilled requests
    to a decode side only (it reads Seq.kv_node, which an arriving request has not)."""

    def register(cls):
        ROUTERS[name] = cls
        if prefilled_only:
            PREFILLED_ONLY.add(name)
        return cls

    return register


@router("round-robin")
class RoundRobin:
    def __init__(self) -> None:
        self.turn = 0

    def route(self, seq: Seq, replicas: Sequence[Loaded], now: float) -> int:
        k = self.turn % len(replicas)
        self.turn += 1
        return k


@router("shortest-queue")
class ShortestQueue:
    def route(self, seq: Seq, replicas: Sequence[Loaded], now: float) -> int:
        return min(range(len(replicas)), key=lambda k: (replicas[k].outstanding(now)[0], k))


@router("least-loaded")
class LeastLoaded:
    def route(self, seq: Seq, replicas: Sequence[Loaded], now: float) -> int:
        return min(range(len(replicas)), key=lambda k: (replicas[k].outstanding(now)[1], k))


@router("kv-local", prefilled_only=True)
class KvLocal:
    def route(self, seq: Seq, replicas: Sequence[Loaded], now: float) -> int:
        return min(range(len(replicas)), key=lambda k: (replicas[k].outstanding(now)[0],
                                                        replicas[k].node != seq.kv_node, k))


def make_router(name: str, flag: str = "--router", prefilled: bool = False) -> Router:
    """The router called `name`; `flag`: the option that named it, for the error. `prefilled`:
    it routes prefilled requests to a decode side (any router may), else arriving requests
    (one in PREFILLED_ONLY may not: the error lists those that may)."""
    names = sorted(ROUTERS if prefilled else set(ROUTERS) - PREFILLED_ONLY)
    if name in PREFILLED_ONLY and not prefilled:
        raise ConfigError(f"{flag} {name}: picks the decode instance of a prefilled request; give it to "
                          f"--pd-router ({flag} picks the replica an arriving request goes to: one of {', '.join(names)})")
    if name not in names:
        raise ConfigError(f"{flag} {name}: unknown router (expected one of {', '.join(names)})")
    return ROUTERS[name]()


__all__ = ["PREFILLED_ONLY", "ROUTERS", "Router", "make_router", "router"]
