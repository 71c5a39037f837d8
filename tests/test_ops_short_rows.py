"""Many short rows per instruction: RMSNorm (CANN's MergeN) and DynamicQuant keep a tile
of rows in UB and cover them with each vector instruction (or, for DynamicQuant's
unaligned rows, with each DMA), so a core's instruction count follows its tiles, not
its rows; the functional interpreter checks the packed programs against numpy."""

import pytest

from npusim.hw import load_hw
from npusim.isa.program import Copy, CoreType, Mem, Pipe, SetFlag, VecOp
from npusim.isa.walk import unroll
from npusim.ops import lower
from npusim.passes.validate_kernels import check_op

HW = load_hw("ascend910b2")


def _block0(op: str, params: dict) -> list:
    """Every instruction block 0 of the op's (one) kernel runs, in order."""
    low = lower(op, params, HW)
    (kernel,) = low.kernels
    body = kernel.program(CoreType.AIV, 0).body
    return [i for i, _ in unroll(body, {"block": 0, "sub": 0}, 10 ** 6)]


def _rows_of_block0(params: dict) -> int:
    """Rows block 0 takes (the op's rows over the vector cores, rounded up)."""
    rows = params["rows"] if "rows" in params else 1
    for d in params.get("shape", (1,))[:-1]:
        rows *= d
    return -(-rows // HW.aiv_count)


def _count(instrs, cls) -> int:
    return sum(1 for i in instrs if i.__class__ is cls)


# short rows, several tiles a core: (op, params)
PACKED = [("rms_norm", dict(shape=(48 * 300, 128), dtype="fp32")),
          ("rms_norm", dict(shape=(48 * 200, 96), dtype="fp16")),
          ("add_rms_norm", dict(shape=(48 * 200, 64), dtype="bf16"))]


@pytest.mark.parametrize("op, params", PACKED, ids=[f"{o}-{p['shape'][-1]}" for o, p in PACKED])
def test_short_rows_take_fewer_vector_instructions_than_rows(op, params):
    """The old lowering issued two or more instructions per row (a scalar-operand Muls per
    row, a reduce per row); packed, each instruction covers a tile of rows."""
    instrs = _block0(op, params)
    rows = _rows_of_block0(params)
    tiles = _count([i for i in instrs if i.__class__ is Copy and i.dst is Mem.UB], Copy)
    assert 1 < tiles < rows  # several tiles, each of many rows
    assert _count(instrs, VecOp) < rows


@pytest.mark.parametrize("op, params", PACKED, ids=[f"{o}-{p['shape'][-1]}" for o, p in PACKED])
def test_packed_rows_need_no_scalar_round_trip(op, params):
    """A row's statistic stays in a 32-byte block the next instruction reads: no V -> S flag."""
    instrs = _block0(op, params)
    assert not [i for i in instrs if i.__class__ is SetFlag and i.src is Pipe.V and i.dst is Pipe.S]


@pytest.mark.parametrize("op, params", [
    ("rms_norm", dict(shape=(2, 3, 17, 128), dtype="fp32")),
    ("rms_norm", dict(shape=(37, 373), dtype="fp16")),  # rows padded to 32 bytes in UB
    ("rms_norm", dict(shape=(300, 8), dtype="bf16")),  # more rows a tile than one instruction repeats
    ("add_rms_norm", dict(shape=(37, 373), dtype="bf16")),
    ("add_rms_norm", dict(shape=(64, 1000), dtype="fp32")),
    ("add_rms_norm", dict(shape=(64, 4096), dtype="fp16")),  # rows past MergeN: one reduction a row
    ("add_rms_norm", dict(shape=(37, 4099), dtype="bf16")),
])
def test_packed_rows_match_numpy(op, params):
    """The interpreter runs the packed programs: the statistic blocks, the strided reductions
    and the broadcasts give numpy's result. (Padded rows failed before: the reductions read
    the never-loaded padding.)"""
    c = check_op(op, params, HW)
    assert c.status == "pass", c.row()


def test_rms_norm_instructions_follow_tiles_not_rows():
    """Twice the rows a core (the same tile): twice the tiles, the same instructions a tile."""
    def per_tile(rows: int) -> float:
        b = _block0("rms_norm", dict(shape=(48 * rows, 128), dtype="fp32"))
        tiles = _count([i for i in b if i.__class__ is Copy and i.dst is Mem.UB], Copy) - 1  # not gamma's load
        return _count(b, VecOp) / tiles

    assert per_tile(300) == per_tile(600)


@pytest.mark.parametrize("hidden", [373, 100])
def test_dynamic_quant_moves_a_tile_of_unaligned_rows_per_dma(hidden):
    """Rows CANN's MultiRow kernel does not take (not a multiple of 8, or under 128) still
    move many to a DMA (dynamic_quant_db.h); the vector work stays one row at a time."""
    params = dict(rows=48 * 200, hidden=hidden)
    instrs = _block0("quantize_per_token", params)
    rows = _rows_of_block0(params)
    loads = [i for i in instrs if i.__class__ is Copy and i.dst is Mem.UB]
    assert 1 < len(loads) < rows / 10
    assert not [i for i in instrs if i.__class__ is SetFlag and i.src is Pipe.V and i.dst is Pipe.S]
    assert _count(instrs, VecOp) >= 5 * rows  # a row's cast, abs, max, scale and casts


def test_add_rms_norm_of_long_rows_reduces_each_row_by_itself():
    """Past MERGE_MAX_COLS CANN's AddRmsNorm leaves MergeN (add_rms_norm_tiling.cpp): each row
    is summed by the halving adds, not by one reduction over the tile's rows."""
    from npusim.ops.rowwise import MERGE_MAX_COLS

    def reductions(cols: int) -> int:
        params = dict(shape=(48 * 64, cols), dtype="fp16")
        return sum(1 for i in _block0("add_rms_norm", params) if i.__class__ is VecOp and i.op == "reduce_sum")

    rows = _rows_of_block0(dict(shape=(48 * 64, 1)))
    assert reductions(MERGE_MAX_COLS + 48) == rows
    assert reductions(1024) < rows
