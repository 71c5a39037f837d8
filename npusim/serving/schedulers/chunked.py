"""Chunked prefill (Sarathi): every step has a budget of token_budget tokens. The
decoding sequences take one each; what is left goes to prefill chunks, first of
sequences already part-way through their prefill, then of newly admitted ones,
so a long prompt no longer stalls the decodes for a whole prefill. A step with
both, or a chunk continuing its prompt, is a mixed iteration: one step of
the decoder's mixed graph (graph.build)."""

from __future__ import annotations

from npusim.serving.schedulers.iteration_level import IterationLevel
from npusim.serving.state import Work


class Chunked(IterationLevel):
    def next(self, now: float) -> Work | float | None:
        decoders = self.decoders()
        budget = self.cfg.token_budget - len(decoders)
        chunks = []
        for s in self.running:  # part-way prefills first, in admission order
            if budget <= 0:
                break
            if not s.decoding:
                n = min(s.goal - s.prefilled, budget)
                chunks.append((s, n))
                budget -= n
        while budget > 0:
            new = self.admit(limit=1)
            if not new:
                break
            s = new[0]
            if s.decoding:  # its KV cache came with it (disaggregated): it decodes from the next step
                continue
            n = min(s.goal, budget)
            chunks.append((s, n))
            budget -= n
        if not chunks and not decoders:
            return None
        return Work.of(prefill=chunks, decode=decoders)


__all__ = ["Chunked"]
