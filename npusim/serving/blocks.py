"""The paged KV-cache block manager of the iteration-level schedulers (vLLM's).

The KV cache is `total` blocks of `block_tokens` tokens; a sequence holds
ceil(tokens / block_tokens) blocks, taken as its cache grows and all given back
when it finishes or is preempted. The capacity comes from the device memory
left beside the weights, activations and workspace (StepCost.kv_capacity_bytes).
"""

from __future__ import annotations

from npusim.serving.state import Seq


class BlockManager:
    def __init__(self, capacity_tokens: int, block_tokens: int):
        self.block_tokens = block_tokens
        self.total = capacity_tokens // block_tokens
        self.free = self.total

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def can_hold(self, seq: Seq, tokens: int) -> bool:
        """There are free blocks for `seq` to hold `tokens` tokens."""
        return self.blocks_for(tokens) - seq.blocks <= self.free

    def grow(self, seq: Seq, tokens: int) -> None:
        """Give `seq` blocks for `tokens` tokens (the caller checked can_hold)."""
        extra = self.blocks_for(tokens) - seq.blocks
        if extra > 0:
            if extra > self.free:
                raise RuntimeError("block manager: grow without free blocks")  # a scheduler bug, not input
            self.free -= extra
            seq.blocks += extra

    def release(self, seq: Seq) -> None:
        self.free += seq.blocks
        seq.blocks = 0

    @property
    def used_tokens(self) -> int:
        return (self.total - self.free) * self.block_tokens


__all__ = ["BlockManager"]
