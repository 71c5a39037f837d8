"""Iteration-level batching (Orca, vLLM): sequences join and leave the batch at
every step; their KV cache lives in paged blocks (blocks.py).

A sequence is admitted when a batch slot is free and the block manager has
blocks for its whole prefill; each decode step first gives every decoding
sequence the blocks its new token needs, and when there are none left it
preempts the most recently admitted sequence: its blocks are freed and it goes
back to the front of the queue, to be prefilled again over its prompt and the
tokens it had generated (preemption by recompute, vLLM's default). A request
whose prompt and output could never fit in the whole cache fails at once.
"""

from __future__ import annotations

from npusim.errors import ConfigError
from npusim.serving.blocks import BlockManager
from npusim.serving.schedulers import Scheduler
from npusim.serving.state import Seq, Work


class IterationLevel(Scheduler):
    def __init__(self, cfg, kv_capacity_tokens: int):
        super().__init__(cfg, kv_capacity_tokens)
        self.blocks = BlockManager(kv_capacity_tokens, cfg.block_tokens)
        if not self.blocks.total:  # every request would fail: a config slip, not a load
            raise ConfigError(f"scheduler.block_tokens={cfg.block_tokens}: the KV cache (scheduler.kv_memory_fraction "
                              f"{cfg.kv_memory_fraction:g} of the memory left) holds {kv_capacity_tokens} tokens, not "
                              "one block of that many")
        self.running: list[Seq] = []  # admitted, in admission order

    def add(self, seq: Seq, now: float) -> None:
        if self.blocks.blocks_for(seq.max_tokens) > self.blocks.total:
            seq.finish("oom", now)
        else:
            self.waiting.append(seq)

    def admit(self, limit: int | None = None) -> list[Seq]:
        """Move waiting sequences into the batch while slots and blocks last (FIFO);
        `limit`: at most this many."""
        new = []
        while self.waiting and len(self.running) < self.cfg.max_batch and (limit is None or len(new) < limit):
            s = self.waiting[0]
            goal = s.prompt + s.generated
            if not self.blocks.can_hold(s, goal):
                break
            self.waiting.pop(0)
            s.admit()
            self.blocks.grow(s, goal)
            self.running.append(s)
            new.append(s)
        return new

    def preempt(self, seq: Seq) -> None:
        self.blocks.release(seq)
        seq.decoding = False
        self.running.remove(seq)
        self.waiting.insert(0, seq)
        seq.preemptions += 1
        self.preemptions += 1

    def decoders(self) -> list[Seq]:
        """The decoding sequences, each holding the blocks its next token needs
        (preempting the latest admitted ones until they do)."""
        room = self.blocks.block_tokens
        for s in list(self.running):
            if not s.decoding or s.context <= s.blocks * room:  # preempted meanwhile, or room in its last block
                continue
            while not self.blocks.can_hold(s, s.context):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is s:
                    break
            if s.decoding:
                self.blocks.grow(s, s.context)
        return [s for s in self.running if s.decoding]

    def done(self, work: Work, end: float) -> None:
        for s in work.seqs:
            if s.status is not None and s in self.running:
                self.blocks.release(s)
                self.running.remove(s)

    def kv_tokens_used(self) -> int:
        return self.blocks.used_tokens

    def busy(self) -> bool:
        return bool(self.waiting or self.running)


__all__ = ["IterationLevel"]
