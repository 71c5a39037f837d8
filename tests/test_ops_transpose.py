"""The transpose operator (npusim.ops.transpose): its reference is numpy's transpose;
its lowering moves every element of x once to where the permutation puts it (read
off the kernels' copies), never beats its roofline, and pays the 64-byte burst rule
on rows shorter than a burst. Expected numbers come from the config."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import NpusimError
from npusim.hw import load_hw
from npusim.isa.program import Copy, CoreType, Loop, Mem, at
from npusim.ops import OPS, lower, simulate_op
from npusim.ops.transpose import collapse

HW = load_hw("ascend910b2")

# the public Transpose measurements' shapes (npusim/data/measured/vector.csv), and small ones
REAL = [
    ((2048, 2048), (1, 0), "fp32"), ((4096, 4096), (1, 0), "bf16"), ((8192, 8192), (1, 0), "int32"),
    ((4096, 8192), (1, 0), "int64"), ((363, 367, 373), (2, 0, 1), "int32"),
    ((3, 7, 11, 13, 1013), (4, 3, 2, 1, 0), "int64"),
]
SMALL = [
    ((5, 7), (1, 0), "fp32"), ((1000, 300), (1, 0), "fp16"), ((2048, 600), (1, 0), "fp32"),
    ((13, 17, 19), (2, 0, 1), "int32"), ((3, 7, 11, 13, 19), (4, 3, 2, 1, 0), "int64"),
    ((2, 3, 4, 5), (3, 1, 0, 2), "int8"), ((17, 16, 12, 12, 2), (3, 1, 2, 4, 0), "int8"),  # stacked tiles
    ((1, 6, 1, 9), (3, 2, 1, 0), "bf16"),
]


def _params(case) -> dict:
    shape, perm, dtype = case
    return {"shape": shape, "perm": perm, "dtype": dtype}


def _id(case) -> str:
    shape, perm, dtype = case
    return f"{'x'.join(map(str, shape))}-perm{''.join(map(str, perm))}-{dtype}"


@pytest.mark.parametrize("case", REAL + SMALL, ids=[_id(c) for c in REAL + SMALL])
def test_transpose_verifies_and_never_beats_its_roofline(case):
    lowered = lower("transpose", _params(case), HW)
    report = simulate_op(lowered, HW, trace="kernel")  # runs verify() on every kernel
    assert report.seconds >= report.roofline.time_s
    assert report.stats.gm_bytes >= lowered.min_gm_bytes
    assert lowered.outputs[0].shape == tuple(case[0][d] for d in case[1])


@pytest.mark.parametrize("case", SMALL, ids=[_id(c) for c in SMALL])
def test_reference_is_numpy_transpose(case):
    shape, perm, _ = case
    x = np.arange(np.prod(shape), dtype=np.float32)
    p = OPS["transpose"].params(**_params(case))
    y = OPS["transpose"].reference(p, {"x": x}, {}, None)["y"]
    want = np.empty(tuple(shape[d] for d in perm), np.float32)
    for idx in np.ndindex(*shape):
        want[tuple(idx[d] for d in perm)] = x.reshape(shape)[idx]
    assert np.array_equal(y, want)


def test_default_perm_swaps_the_last_two_dims():
    assert OPS["transpose"].params(shape=(2, 3, 4)).order == (0, 2, 1)


@pytest.mark.parametrize("shape, perm, dims, cperm", [
    ((363, 367, 373), (2, 0, 1), (363 * 367, 373), (1, 0)),  # dims 0, 1 stay together
    ((3, 7, 11, 13, 1013), (4, 3, 2, 1, 0), (3, 7, 11, 13, 1013), (4, 3, 2, 1, 0)),
    ((4, 1, 5, 6), (2, 3, 0, 1), (4, 30), (1, 0)),  # size-1 dims dropped
    ((2, 3, 4, 5), (2, 3, 1, 0), (2, 3, 20), (2, 1, 0)),
])
def test_collapse_merges_dims_that_stay_adjacent(shape, perm, dims, cperm):
    g = collapse(shape, perm)
    assert (g.dims, g.perm) == (dims, cperm)


def _copies(body, vars):
    """Every Copy of a program in execution order, with its addresses at that point."""
    for it in body:
        if isinstance(it, Loop):
            for v in range(it.count):
                yield from _copies(it.body, {**vars, it.var: v})
        elif isinstance(it, Copy):
            yield it, at(it.src_addr, vars), at(it.dst_addr, vars)


def _elements(copy: Copy, gm_addr: int, base: int, e: int) -> list[int]:
    stride = copy.stride(Mem.GM)
    return [(gm_addr + s * stride - base) // e + k for s in range(copy.segments) for k in range(copy.nbytes // e)]


@pytest.mark.parametrize("case", SMALL, ids=[_id(c) for c in SMALL])
def test_every_tile_stores_the_elements_it_loaded_where_the_permutation_puts_them(case):
    """Read off the kernel's copies: each tile loads a set of x elements and stores a set
    of y elements; the permutation must map the one onto the other, and the tiles
    together must write every element of y exactly once."""
    shape, perm, dtype = case
    (kernel,) = lower("transpose", _params(case), HW).kernels
    x, y = (t for t in kernel.gm)
    e = x.nbytes // int(np.prod(shape))
    y_of_x = np.empty(int(np.prod(shape)), np.int64)
    y_of_x[np.arange(y_of_x.size).reshape(shape).transpose(perm).ravel()] = np.arange(y_of_x.size)
    written = np.zeros(y_of_x.size, np.int64)

    def tile_done(loaded, stored):
        assert sorted(y_of_x[loaded]) == sorted(stored)
        np.add.at(written, stored, 1)

    for block in range(kernel.block_dim):
        loaded, stored = [], []
        for c, src, dst in _copies(kernel.program(CoreType.AIV, block).body, {"block": block}):
            if c.src is Mem.GM:
                if stored:  # a new tile
                    tile_done(loaded, stored)
                    loaded, stored = [], []
                loaded += _elements(c, src, x.addr, e)
            else:
                stored += _elements(c, dst, y.addr, e)
        tile_done(loaded, stored)
    assert (written == 1).all()


def test_rows_shorter_than_a_burst_waste_burst_bytes():
    """Full reverse of [3, 7, 11, 13, 101] int64: y's rows are x's dim 0, 3 elements (24
    bytes), each written as its own segment: each costs at least a whole burst. An
    aligned 2-D transpose of as many bytes wastes none."""
    shape = (3, 7, 11, 13, 101)
    n = int(np.prod(shape))
    short = simulate_op(lower("transpose", {"shape": shape, "perm": (4, 3, 2, 1, 0), "dtype": "int64"}, HW), HW,
                        trace="kernel").stats
    aligned = simulate_op(lower("transpose", {"shape": (256, 1024), "dtype": "int64"}, HW), HW, trace="kernel").stats
    row = 3 * 8
    print(f"\nshort rows: {short.wasted_burst_bytes:.0f} wasted bytes in {short.dma_segments} segments; "
          f"aligned: {aligned.wasted_burst_bytes:.0f} in {aligned.dma_segments}")
    assert aligned.wasted_burst_bytes == 0
    assert short.wasted_burst_bytes >= (n // 3) * (HW.dma.burst_bytes - row)


def test_time_grows_with_size():
    t = [simulate_op(lower("transpose", {"shape": (r, 2048), "dtype": "fp32"}, HW), HW, trace="kernel").seconds
         for r in (512, 2048)]
    assert t[1] > t[0]


@pytest.mark.parametrize("params, names", [
    ({"shape": (1, 4096)}, "nothing to transpose"),
    ({"shape": (4, 5, 6), "perm": (0, 1, 2)}, "nothing to transpose"),
    ({"shape": (4, 5, 6), "perm": (1, 0, 2)}, "innermost"),
    ({"shape": (4, 5, 6), "perm": (0, 1)}, "perm"),
    ({"shape": (4, 5), "perm": (0, 0)}, "perm"),
    ({"shape": (4096,)}, "shape"),
    ({"shape": (4, 5), "dtype": "fp64"}, "dtype"),
])
def test_bad_transposes_are_one_line_errors(params, names):
    with pytest.raises(NpusimError) as err:
        lower("transpose", params, HW)
    msg = str(err.value)
    assert "\n" not in msg and "transpose" in msg and names in msg


def test_no_tile_of_whole_bursts_fitting_ub_is_a_one_line_error():
    """A burst too long for a [burst x burst] tile in and out, double-buffered, to fit UB
    (512-byte bursts of fp32: 4 x 64 KiB): the tiling names both fields, not a TypeError."""
    hw = load_hw("ascend910b2", overrides={"dma.burst_bytes": 512})
    with pytest.raises(NpusimError) as err:
        lower("transpose", {"shape": (2048, 2048), "dtype": "fp32"}, hw)
    msg = str(err.value)
    assert "\n" not in msg and "dma.burst_bytes" in msg and "aiv.ub_bytes" in msg
