"""The KV-cache layout: one frozen, hardware-free value that says where every token's
K and V live, shared by the writer and readers' lowerings (npusim.ops), the numpy
executor (npusim.graph.execute) and the kv_layout pass.

- per_layer:  per layer a K and a V tensor [batch, kv_heads, context, head_dim], each
              its own allocation (what a framework's list of per-layer caches is).
- contiguous: one tensor [batch, layers, kv_heads, context, row] for all layers, a
              token's K and V side by side in one row padded to `row_align_bytes`
              (the DMA burst of the config it runs on): one aligned segment per token
              and head carries both.
- paged:      K and V pools [num_blocks, kv_heads, block_tokens, head_dim] and a
              block table [batch, blocks per sequence] (int32) mapping each
              sequence's logical blocks to physical ones; blocks are handed out in a
              scattered order (a fixed permutation), as after a serving run's churn.

The layout knows shapes, byte offsets and numpy pack / unpack; which GM address a
tensor has is the caller's (npusim.ops.kv_cache.KvCache binds the tensors).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping

from attrs import frozen

# numpy is imported in the methods that use it: the command line imports this module
# for its names, and a command that never builds a KV layout need not load numpy

from npusim.isa.program import DTYPE_BYTES

KV_LAYOUTS = ("per_layer", "contiguous", "paged")
# what the kv_layout pass turns the builder's per_layer caches into (the CLI's --kv-layout)
PASS_KV_LAYOUTS = tuple(x for x in KV_LAYOUTS if x != "per_layer")
# GM names of a cache's tensors per layout: the same for the writer (kv_cache_write) and
# the readers, so a graph binds both to the same tensors
KV_CACHE_NAMES = {"per_layer": ("k_cache", "v_cache"), "contiguous": ("kv_cache",),
                  "paged": ("k_cache", "v_cache", "block_table")}
CACHE_TENSORS = tuple(dict.fromkeys(name for names in KV_CACHE_NAMES.values() for name in names))
BLOCK_TABLE_DTYPE = "int32"


@functools.cache  # a paged kernel's lowering asks it for every block load
def scatter_step(num_blocks: int) -> int:
    """The stride of the paged layout's block permutation: logical block i (counted over
    every sequence) lives in physical block i * step mod num_blocks. The step is coprime
    with num_blocks (so it is a permutation) and about half of it (so neighbours land
    far apart)."""
    return next(m for m in range(num_blocks // 2 + 1, 2 * num_blocks + 2) if math.gcd(m, num_blocks) == 1)


def physical_block(b: int, logical: int, max_blocks: int, num_blocks: int) -> int:
    """Physical block holding logical block `logical` of sequence b in the paged layout
    (what the block table says; the kernels and the executor's starting cache agree)."""
    return (b * max_blocks + logical) * scatter_step(num_blocks) % num_blocks


def row_bytes(head_dim: int, dtype: str, row_align_bytes: int) -> int:
    """Bytes of one token's row of the contiguous layout: its K and V, padded to row_align_bytes."""
    return -(-2 * head_dim * DTYPE_BYTES[dtype] // row_align_bytes) * row_align_bytes


@frozen
class KvLayout:
    """One layer's view of a KV cache: layout, geometry and (contiguous) the row padding.
    `row_align_bytes` matters only for the contiguous layout's shapes and offsets; the
    numpy pack / unpack read the row from the arrays they are given."""

    layout: str
    batch: int
    kv_heads: int
    context: int
    head_dim: int
    dtype: str = "fp16"
    layers: int = 1
    layer: int = 0
    block_tokens: int = 128
    row_align_bytes: int | None = None

    # ---- geometry

    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The logical shape of one layer's K (or V)."""
        return self.batch, self.kv_heads, self.context, self.head_dim

    @property
    def max_blocks(self) -> int:
        """Blocks per sequence (paged)."""
        return -(-self.context // self.block_tokens)

    @property
    def num_blocks(self) -> int:
        """Blocks in each paged pool: every sequence's."""
        return self.batch * self.max_blocks

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's row in the contiguous layout (K, V, padding)."""
        if self.row_align_bytes is None:
            raise ValueError("KvLayout: the contiguous row needs row_align_bytes")
        return row_bytes(self.head_dim, self.dtype, self.row_align_bytes)

    def tensor_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The layout's tensors by GM name -> (shape, dtype)."""
        b, h, s, d, dt = self.batch, self.kv_heads, self.context, self.head_dim, self.dtype
        if self.layout == "per_layer":
            return {"k_cache": ((b, h, s, d), dt), "v_cache": ((b, h, s, d), dt)}
        if self.layout == "contiguous":
            return {"kv_cache": ((b, self.layers, h, s, self.row_bytes // self.elem_bytes), dt)}
        pool = (self.num_blocks, h, self.block_tokens, d)
        return {"k_cache": (pool, dt), "v_cache": (pool, dt),
                "block_table": ((b, self.max_blocks), BLOCK_TABLE_DTYPE)}

    def tensor_bytes(self) -> dict[str, int]:
        """The layout's tensors by GM name -> bytes."""
        return {name: math.prod(shape) * DTYPE_BYTES[dt] for name, (shape, dt) in self.tensor_shapes().items()}

    def physical_block(self, b: int, logical: int) -> int:
        return physical_block(b, logical, self.max_blocks, self.num_blocks)

    def parts(self, start: int, n: int) -> dict[str, tuple[tuple[int, int], ...]]:
        """The (offset, bytes) parts of the cache tensors (the block table aside) that hold
        tokens start .. start + n - 1 of every sequence and head of this layer, adjacent
        parts merged: what a kernel reading or writing those tokens touches. A head's
        tokens lie head_stride() after the head before's (in every layout), so the runs
        are found per sequence and moved per head."""
        import numpy as np

        names = ("kv_cache",) if self.layout == "contiguous" else ("k_cache", "v_cache")
        runs = [(b, pos, take) for b in range(self.batch) for pos, take in self.runs(b, start, n)]
        nbytes = np.array([take for *_, take in runs], np.int64) * self.token_pitch()
        heads = np.arange(self.kv_heads, dtype=np.int64)[:, None] * self.head_stride()
        out = {}
        for name in names:
            which = "v" if name == "v_cache" else "k"
            first = np.array([self.token_offset(which, b, 0, pos)[1] for b, pos, _ in runs], np.int64)
            offsets = (heads + first).ravel()
            sizes = np.broadcast_to(nbytes, (self.kv_heads, len(runs))).ravel()
            order = np.argsort(offsets, kind="stable")
            offsets, sizes = offsets[order], sizes[order]
            # a part starts where the one before it does not end
            starts = np.flatnonzero(np.r_[True, offsets[1:] != offsets[:-1] + sizes[:-1]])
            out[name] = tuple(zip(offsets[starts].tolist(), np.add.reduceat(sizes, starts).tolist()))
        return out

    def token_pitch(self) -> int:
        """Bytes from one token of a head to the next inside a run (a block, when paged)."""
        return self.row_bytes if self.layout == "contiguous" else self.head_dim * self.elem_bytes

    def head_stride(self) -> int:
        """Bytes from one head's run of tokens to the next head's."""
        if self.layout == "per_layer":
            return self.context * self.head_dim * self.elem_bytes
        if self.layout == "contiguous":
            return self.context * self.row_bytes
        return self.block_tokens * self.head_dim * self.elem_bytes

    def token_offset(self, which: str, b: int, h: int, pos: int) -> tuple[str, int]:
        """(GM name, byte offset in it) of K ('k') or V ('v') of sequence b, head h, position pos."""
        e, d = self.elem_bytes, self.head_dim
        if self.layout == "per_layer":
            return f"{which}_cache", ((b * self.kv_heads + h) * self.context + pos) * d * e
        if self.layout == "contiguous":
            row = ((b * self.layers + self.layer) * self.kv_heads + h) * self.context + pos
            return "kv_cache", row * self.row_bytes + (d * e if which == "v" else 0)
        blk, off = divmod(pos, self.block_tokens)
        return f"{which}_cache", ((self.physical_block(b, blk) * self.kv_heads + h) * self.block_tokens + off) * d * e

    def runs(self, b: int, pos: int, n: int) -> list[tuple[int, int]]:
        """Tokens pos .. pos+n-1 of a sequence as (first position, tokens) runs, each
        contiguous in GM: one run, or one per paged block touched, in token order."""
        if self.layout != "paged":
            return [(pos, n)]
        out, bt = [], self.block_tokens
        while n > 0:
            take = min(n, bt - pos % bt)
            out.append((pos, take))
            pos, n = pos + take, n - take
        return out

    # ---- numpy values

    def block_table(self) -> np.ndarray:
        """Physical block of each sequence's logical blocks, [batch, max_blocks] int32."""
        import numpy as np
        return np.array([[self.physical_block(b, j) for j in range(self.max_blocks)]
                         for b in range(self.batch)], dtype=np.int32)

    def _paged_index(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pool block [batch, context], slot in the block [context]) of every logical token."""
        import numpy as np
        pos = np.arange(self.context)
        table = np.asarray(table).reshape(self.batch, self.max_blocks).astype(np.int64)
        return table[:, pos // self.block_tokens], pos % self.block_tokens

    def _rows(self, x: np.ndarray) -> np.ndarray:
        import numpy as np
        return np.asarray(x).reshape(self.batch, self.layers, self.kv_heads, self.context, -1)

    def _pool(self, x: np.ndarray) -> np.ndarray:
        import numpy as np
        return np.asarray(x).reshape(-1, self.kv_heads, self.block_tokens, self.head_dim)

    def unpack(self, phys: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Logical K, V [batch, kv_heads, context, head_dim] from the layout's tensors (by GM name)."""
        import numpy as np
        d = self.head_dim
        if self.layout == "per_layer":
            return tuple(np.asarray(phys[t]).reshape(self.shape) for t in ("k_cache", "v_cache"))
        if self.layout == "contiguous":
            rows = self._rows(phys["kv_cache"])[:, self.layer]
            return rows[..., :d], rows[..., d:2 * d]
        blk, slot = self._paged_index(phys["block_table"])
        # advanced indices around a slice: the result is [batch, context, kv_heads, head_dim]
        return tuple(self._pool(phys[t])[blk, :, slot, :].transpose(0, 2, 1, 3) for t in ("k_cache", "v_cache"))

    def pack(self, phys: Mapping[str, np.ndarray], k: np.ndarray, v: np.ndarray) -> dict[str, np.ndarray]:
        """The layout's cache tensors (copies of `phys`, by GM name) holding logical
        K and V; bytes outside this layer's tokens (other layers, row padding, unused
        block slots) keep their values. The block table is read, not written."""
        import numpy as np
        d = self.head_dim
        if self.layout == "per_layer":
            return {"k_cache": k.reshape(self.shape).copy(), "v_cache": v.reshape(self.shape).copy()}
        if self.layout == "contiguous":
            rows = self._rows(phys["kv_cache"]).copy()
            rows[:, self.layer, ..., :d], rows[:, self.layer, ..., d:2 * d] = k, v
            return {"kv_cache": rows}
        blk, slot = self._paged_index(phys["block_table"])
        out = {}
        for local, x in (("k_cache", k), ("v_cache", v)):
            pool = self._pool(phys[local]).copy()
            if len(pool) < self.num_blocks:
                raise ValueError(f"paged KV cache: a pool of {len(pool)} blocks, {self.num_blocks} needed")
            pool[blk, :, slot, :] = np.asarray(x).reshape(self.shape).transpose(0, 2, 1, 3)
            out[local] = pool
        return out


__all__ = ["CACHE_TENSORS", "KV_CACHE_NAMES", "KV_LAYOUTS", "PASS_KV_LAYOUTS", "KvLayout", "physical_block",
           "row_bytes", "scatter_step"]
