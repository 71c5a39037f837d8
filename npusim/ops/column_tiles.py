"""Column-tiled streaming for elementwise row ops whose row is too long for UB.

`streaming_kernel` keeps whole rows in UB. An op that is elementwise along the row
(a gated activation: y[r, c] = act(gate[r, c]) * up[r, c]) does not need that: a
row can be cut into column chunks, each chunk loaded, computed and stored on its
own. `column_kernel` does this with the custom tile pipeline of npusim.ops.layout:
the units of work are (row, chunk) pairs, split in contiguous runs over the vector
cores, one double-buffered tile per unit; runs of chunks that move by constant
steps fold back into loops.

Ops keep `streaming_kernel` whenever a row fits (their timing is unchanged); this
path is only taken for rows that do not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import Mem
from npusim.ops.build import Buffers, align_up, capacity_text, cdiv
from npusim.ops.layout import gm_copy, pipeline_kernel, split_runs
from npusim.ops.vector import UB_BLOCK
from npusim.ops.vector_kernels import Stream

# work(n elements, UB address of each input chunk, of each output chunk, of each scratch chunk)
Work = Callable[[int, Sequence[int], Sequence[int], Sequence[int]], list]


def chunk_width(op: str, hw: HwConfig, cols: int, rows: int, elem_bytes: int, io_elem_bytes: int,
                tmp_elem_bytes: Sequence[int]) -> int:
    """Elements per column chunk: the widest chunk whose ping and pong input and
    output buffers plus the shared scratch fit UB, whole 32-byte UB blocks; then
    narrowed (not below one UB block) so that rows x chunks gives every vector core
    a unit of work, as a row-per-core split would for shorter rows."""
    step = UB_BLOCK // elem_bytes  # elements of one UB block in the op dtype (fp32 scratch stays aligned)
    n_bufs = 2 * len(tmp_elem_bytes) + 2  # io buffers per set, scratch: alignment padding of each
    per_elem = 2 * io_elem_bytes + sum(tmp_elem_bytes)
    fit = (hw.aiv.ub_bytes - UB_BLOCK * n_bufs) // per_elem // step * step
    if fit < step:
        raise ProgramError(f"op {op}: one {UB_BLOCK}-byte column chunk does not fit {capacity_text(hw, Mem.UB)}")
    chunks = max(cdiv(cols, fit), min(cdiv(hw.aiv_count, rows), cdiv(cols, step)))
    return min(fit, align_up(cdiv(cols, chunks), step))


def column_kernel(op: str, hw: HwConfig, rows: int, cols: int, elem_bytes: int, ins: Sequence[Stream],
                  outs: Sequence[Stream], work: Work, tmp_elem_bytes: Sequence[int]):
    """One AIV kernel streaming `rows` rows of `cols` elements (each stream's
    row_bytes = cols * elem_bytes at its offset and stride) in column chunks;
    tmp_elem_bytes: bytes per chunk element of each scratch region."""
    io = len(ins) + len(outs)
    w = chunk_width(op, hw, cols, rows, elem_bytes, io * elem_bytes, tmp_elem_bytes)
    chunks = cdiv(cols, w)
    buf = Buffers(hw, op)
    sets = [([buf.alloc(f"in{i}_{p}", Mem.UB, w * elem_bytes) for i in range(len(ins))],
             [buf.alloc(f"out{i}_{p}", Mem.UB, w * elem_bytes) for i in range(len(outs))]) for p in (0, 1)]
    tmp = [buf.alloc(f"tmp{i}", Mem.UB, w * b) for i, b in enumerate(tmp_elem_bytes)]

    def unit(r: int, c: int):
        width = min(w, cols - c * w)
        nbytes = width * elem_bytes
        n = align_up(nbytes, UB_BLOCK) // elem_bytes  # vector instructions cover whole UB blocks

        def at(s: Stream) -> int:
            return s.tensor.addr + s.offset + r * s.gm_pitch + c * w * elem_bytes

        def make(p: int):
            ub_in, ub_out = sets[p]
            loads = [gm_copy(Mem.GM, Mem.UB, at(s), ub, nbytes) for s, ub in zip(ins, ub_in)]
            stores = [gm_copy(Mem.UB, Mem.GM, ub, at(s), nbytes) for s, ub in zip(outs, ub_out)]
            return loads, work(n, ub_in, ub_out, tmp), stores
        return make

    per_core = []
    for lo, hi in split_runs(rows * chunks, hw.aiv_count):
        # one group per row touched: its chunks move by a constant step, rows by another
        groups = [[unit(r, c) for c in range(max(lo, r * chunks) - r * chunks, min(hi, (r + 1) * chunks) - r * chunks)]
                  for r in range(lo // chunks, cdiv(hi, chunks))]
        per_core.append(groups)
    tensors = {s.tensor.name: s.tensor for s in (*ins, *outs)}
    return pipeline_kernel(op, op, buf, per_core, list(tensors.values()))
