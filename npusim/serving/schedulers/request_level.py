"""Request-level batching: a batch is formed once and runs to completion.

The prefill runs the whole batch padded to its longest prompt; then every decode
step runs the batch at its formed size (sequences that have finished stay in
the shapes as padding, as a framework with a fixed batch shape does) and at the
longest context, until its last sequence has all its tokens. The KV cache is one
contiguous tensor per batch, batch x (longest prompt + longest output) tokens,
reserved when the batch starts. How the batch is formed is the policy's
(`form`: static.py, dynamic.py).
"""

from __future__ import annotations

from npusim.serving.schedulers import Scheduler
from npusim.serving.state import Seq, Work


class RequestLevel(Scheduler):
    def __init__(self, cfg, kv_capacity_tokens: int):
        super().__init__(cfg, kv_capacity_tokens)
        self.batch: list[Seq] = []
        self.steps = 0  # decode steps the current batch has run

    @staticmethod
    def reservation(group: list[Seq]) -> int:
        """KV tokens a batch reserves: every sequence padded to the longest prompt + output."""
        return len(group) * (max(s.prompt for s in group) + max(s.output for s in group))

    def fits(self, group: list[Seq]) -> bool:
        return self.reservation(group) <= self.kv_capacity_tokens

    def form(self, now: float) -> list[Seq] | float | None:
        """The next batch (taken out of `waiting` by `next`), a time to look again, or None."""
        raise NotImplementedError

    def fail(self, group: list[Seq], now: float) -> None:
        """The batch's KV cache does not fit: its requests fail (out of device memory)."""
        for s in group:
            s.finish("oom", now)
            self.waiting.remove(s)

    def next(self, now: float) -> Work | float | None:
        if self.batch:
            live = [s for s in self.batch if s.status is None]
            pad = max(s.prompt for s in self.batch) + 1 + self.steps
            return Work.of(decode=live, pad_batch=len(self.batch), pad_context=pad)
        group = self.form(now)
        if not isinstance(group, list):
            return group
        for s in group:
            self.waiting.remove(s)
            s.admit()
        self.batch, self.steps = group, 0
        return Work.of(prefill=[(s, s.goal) for s in group])

    def done(self, work: Work, end: float) -> None:
        if all(s.status is not None for s in self.batch):
            self.batch = []
        elif work.decode:
            self.steps += 1

    def kv_tokens_used(self) -> int:
        return self.reservation(self.batch) if self.batch else 0

    def busy(self) -> bool:
        return bool(self.waiting or self.batch)


__all__ = ["RequestLevel"]
