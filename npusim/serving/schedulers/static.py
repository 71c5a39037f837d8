"""Static batching: wait for max_batch requests (or the last ones), run them to completion."""

from __future__ import annotations

from npusim.serving.schedulers.request_level import RequestLevel
from npusim.serving.state import Seq


class Static(RequestLevel):
    """A batch of the first max_batch waiting requests, in arrival order. It is not
    checked against the memory before it starts: one that does not fit fails (the
    seed articles' baseline running out of device memory under load)."""

    def form(self, now: float) -> list[Seq] | float | None:
        n = self.cfg.max_batch
        if len(self.waiting) < n and not (self.flush and self.waiting):
            return None
        group = self.waiting[:n]
        if not self.fits(group):
            self.fail(group, now)
            return now  # look again at once
        return group


__all__ = ["Static"]
