"""Continuous batching as vLLM (v0) runs it: a step with new sequences is a prefill
of just those (one batch, padded to the longest: the decoder graph has no packed
prefill); otherwise every running sequence decodes one token. A sequence whose KV
cache came with it (a disaggregated decode instance) needs no prefill: it joins
the decodes."""

from __future__ import annotations

from npusim.serving.schedulers.iteration_level import IterationLevel
from npusim.serving.state import Work


class Continuous(IterationLevel):
    def next(self, now: float) -> Work | float | None:
        new = [s for s in self.admit() if not s.decoding]
        if new:
            return Work.of(prefill=[(s, s.goal) for s in new])
        decoders = self.decoders()
        if not decoders:
            new = [s for s in self.admit() if not s.decoding]  # preemption freed blocks
            return Work.of(prefill=[(s, s.goal) for s in new]) if new else None
        return Work.of(decode=decoders)


__all__ = ["Continuous"]
