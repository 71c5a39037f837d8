"""The seed articles' dynamic batching: scan the queue every scan_period_ms; take the
oldest request and the next ones whose prompts stay within length_ratio of each
other (longest / shortest), as many as max_batch and the device memory allow;
launch when the batch is full or its oldest request has waited timeout_ms."""

from __future__ import annotations

import math

from npusim.serving.schedulers.request_level import RequestLevel
from npusim.serving.state import Seq


class Dynamic(RequestLevel):
    def form(self, now: float) -> list[Seq] | float | None:
        if not self.waiting:
            return None
        period = self.cfg.scan_period_ms * 1e3
        scan = math.ceil(now / period - 1e-9) * period  # the scans tick on a fixed period
        if scan > now:
            return scan
        oldest = self.waiting[0]
        if not self.fits([oldest]):
            self.fail([oldest], now)
            return now
        group, lo, hi = [oldest], oldest.prompt, oldest.prompt
        full = False
        ratio = self.cfg.length_ratio
        for s in self.waiting[1:]:
            if len(group) == self.cfg.max_batch:
                full = True
                break
            if ratio and max(hi, s.prompt) > ratio * min(lo, s.prompt):
                continue  # another length group
            if not self.fits(group + [s]):
                full = True  # the memory is full
                break
            group.append(s)
            lo, hi = min(lo, s.prompt), max(hi, s.prompt)
        full = full or len(group) == self.cfg.max_batch
        if full or self.flush or now - oldest.ready_us >= self.cfg.timeout_ms * 1e3:
            return group
        return scan + period


__all__ = ["Dynamic"]
