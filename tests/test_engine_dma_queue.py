"""The DMA queue (dma.outstanding; npusim/engine/_pipe.c's top comment, the Python
statement in tests/pipe_reference.py): a pipe's DMA engine holds up to `outstanding`
copies, so a copy issued right behind another one (nothing between them took time) is
requested while that one's data moves and its start-up overlaps it. Closed forms on
one vector core, each copy bound by its port (HBM and L2 far faster), every expected
number derived from the config."""

from __future__ import annotations

import pytest

from kernels import GM_A, MTE2, S, UB, aiv_kernel, ceil_div, intervals, simulate_on_device
from npusim.errors import ConfigError
from npusim.hw import load_hw
from npusim.isa import Copy, Mem, Scalar, SetFlag, WaitFlag

BASE = {"dma.startup_cycles": 100, "dma.vector_segment_cycles": 0, "hbm.bw_efficiency": 1.0,
        "sync.flag_latency_cycles": 0}


def hw_with(**over):
    hw = load_hw("ascend910b2", overrides={**BASE, **over})
    assert hw.aiv.gm_read_bytes_per_cycle < min(hw.hbm_bytes_per_cycle, hw.l2_bytes_per_cycle)
    return hw


def reads(n: int, nbytes: int) -> list:
    """`n` reads of `nbytes` from distinct lines (every one an L2 miss), one after the other."""
    return [Copy(Mem.GM, UB, GM_A + i * (nbytes + 4096), 0, nbytes) for i in range(n)]


def copies(hw, body) -> list[tuple[float, float]]:
    r = simulate_on_device(aiv_kernel(hw, body), hw)
    return [(iv[3], iv[4]) for iv in intervals(r, "AIV0", "MTE2", "GM->UB")]


@pytest.mark.parametrize("outstanding", [1, 2, 4])
def test_back_to_back_long_copies_pay_their_start_up_once(outstanding):
    """Copies whose data takes longer than a start-up: with a queue every copy after the
    first starts moving data the cycle the one before ends; without, each pays its own."""
    hw = hw_with(**{"dma.outstanding": outstanding})
    nbytes = 65536
    data = ceil_div(nbytes, hw.aiv.gm_read_bytes_per_cycle)
    startup = hw.dma.startup_cycles
    assert data > startup
    ivs = copies(hw, reads(3, nbytes))
    t0 = ivs[0][0]
    for k, (start, end) in enumerate(ivs):
        assert start == ivs[k - 1][1] if k else start == t0  # each is issued as the one before ends
        first_or_serial = k == 0 or outstanding == 1
        assert end - start == (startup if first_or_serial else 0) + data
    assert ivs[-1][1] - t0 == (3 * startup if outstanding == 1 else startup) + 3 * data


def test_short_copies_hide_only_what_the_copy_before_moves():
    """Copies shorter than a start-up, queue of 2: each is requested when the one before
    begins to move data, so their data starts are one start-up apart (not start-up +
    data, as without the queue)."""
    hw = hw_with(**{"dma.outstanding": 2})
    nbytes = 2048
    data = ceil_div(nbytes, hw.aiv.gm_read_bytes_per_cycle)
    startup = hw.dma.startup_cycles
    assert data < startup
    ivs = copies(hw, reads(4, nbytes))
    t0 = ivs[0][0]
    ends = [end - t0 for _, end in ivs]
    assert ends == [startup + data + k * startup for k in range(4)]
    serial = copies(hw_with(**{"dma.outstanding": 1}), reads(4, nbytes))
    assert serial[-1][1] - serial[0][0] == 4 * (startup + data)


@pytest.mark.parametrize("flag_at", ["before the data", "during the data", "after the copy"])
def test_a_wait_between_copies_holds_the_request_back(flag_at):
    """MTE2 waits for a flag the scalar pipe sets at `x` between two long copies: the
    second copy is not requested before the flag is seen, so its data starts at the
    later of the first copy's end and x + start-up (a blocked wait breaks the run)."""
    hw = hw_with(**{"dma.outstanding": 4})
    nbytes = 65536
    data = ceil_div(nbytes, hw.aiv.gm_read_bytes_per_cycle)
    startup = hw.dma.startup_cycles
    x = {"before the data": startup // 2, "during the data": startup + data - startup // 2,
         "after the copy": startup + data + 50}[flag_at]
    first, second = reads(2, nbytes)
    ivs = copies(hw, [first, Scalar(x), SetFlag(S, MTE2, 0), WaitFlag(S, MTE2, 0), second])
    t0 = ivs[0][0]
    end1 = startup + data
    assert ivs[0][1] - t0 == end1
    assert ivs[1][1] - t0 == max(end1, x + startup) + data
    assert ivs[1][1] - t0 > end1 + data if flag_at != "before the data" else ivs[1][1] - t0 == end1 + data


@pytest.mark.parametrize("value, expected", [(0, "> 0"), (17, "<= 16")])
def test_the_queue_is_bounded(value, expected):
    """The C walk holds the last 16 data starts: a longer queue is refused where it is given."""
    with pytest.raises(ConfigError, match=f"dma.outstanding.*{expected}"):
        hw_with(**{"dma.outstanding": value})
