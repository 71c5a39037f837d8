"""Batching policies behind one small interface.

The serving loop hands a scheduler each request once it is tokenized (`add`),
asks it what the device runs next (`next`: a Work, a time to ask again, or None
to wait for the next request) and tells it when a step has ended (`done`, after
the loop has advanced the step's sequences). A request a scheduler gives up on
(a batch that does not fit) gets its status at once (Seq.finish).

    static      wait for max_batch requests, run them to completion (request-level)
    dynamic     the seed articles' batcher: scan, group by length, launch at max_batch or timeout
    continuous  iteration-level batching with a paged KV cache (Orca, vLLM)
    chunked     continuous + a token budget per step, prefills in chunks (Sarathi)
"""

from __future__ import annotations

from npusim.errors import ConfigError
from npusim.serving.service import SCHEDULERS, SchedulerConfig
from npusim.serving.state import Seq, Work


class Scheduler:
    """The interface, and the waiting queue every policy has."""

    def __init__(self, cfg: SchedulerConfig, kv_capacity_tokens: int):
        self.cfg = cfg
        self.kv_capacity_tokens = kv_capacity_tokens
        self.waiting: list[Seq] = []
        self.flush = False  # set by the loop once no more requests will come
        self.preemptions = 0

    def add(self, seq: Seq, now: float) -> None:
        self.waiting.append(seq)

    def next(self, now: float) -> Work | float | None:
        raise NotImplementedError

    def done(self, work: Work, end: float) -> None:
        """A step ended; its sequences have been advanced (finished ones have a status)."""

    def expire(self, now: float, limit_us: float | None) -> list[Seq]:
        """Waiting requests that have had no token for `limit_us` since arriving leave."""
        if limit_us is None:
            return []
        gone = [s for s in self.waiting if not s.generated and now - s.arrival_us > limit_us]
        if gone:
            self.waiting = [s for s in self.waiting if s not in gone]
        return gone

    def kv_tokens_used(self) -> int:
        """KV-cache tokens held now (what the occupancy timeline plots)."""
        return 0

    def busy(self) -> bool:
        """Work is in flight (the loop must not stop)."""
        return bool(self.waiting)


def make_scheduler(cfg: SchedulerConfig, kv_capacity_tokens: int) -> Scheduler:
    from npusim.serving.schedulers.chunked import Chunked
    from npusim.serving.schedulers.continuous import Continuous
    from npusim.serving.schedulers.dynamic import Dynamic
    from npusim.serving.schedulers.static import Static

    kinds = {"static": Static, "dynamic": Dynamic, "continuous": Continuous, "chunked": Chunked}
    if cfg.kind not in kinds:
        raise ConfigError(f"scheduler: unknown kind '{cfg.kind}' (expected one of {', '.join(SCHEDULERS)})")
    return kinds[cfg.kind](cfg, kv_capacity_tokens)


__all__ = ["Scheduler", "make_scheduler"]
