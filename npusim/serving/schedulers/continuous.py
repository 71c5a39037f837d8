"""Continuous batching as vLLM (v0) runs it: a step with new sequences is a prefill
of just those (one batch, padded to the longest: the decoder graph has no packed
prefill); otherwise every running sequence decodes one token."""

from __future__ import annotations

from npusim.serving.schedulers.iteration_level import IterationLevel
from npusim.serving.state import Work


class Continuous(IterationLevel):
    def next(self, now: float) -> Work | float | None:
        new = self.admit()
        if new:
            return Work.of(prefill=[(s, s.goal) for s in new])
        decoders = self.decoders()
        if not decoders:
            new = self.admit()  # preemption freed blocks
            return Work.of(prefill=[(s, s.goal) for s in new]) if new else None
        return Work.of(decode=decoders)


__all__ = ["Continuous"]
