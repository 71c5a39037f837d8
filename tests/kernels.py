"""Small kernel builders and run helpers shared by the engine tests (tests/test_engine_*.py).

Every builder takes the HwConfig the test runs on, declares whole-buffer local
allocations so verify() passes, and keeps GM addresses burst- and line-aligned
unless the caller asks otherwise. Nothing here computes an expected number: the
tests derive those from the config themselves.
"""

from __future__ import annotations

import contextlib
import math
import signal


from npusim.engine.host import Launch, Synchronize
from npusim.engine.run import RunResult, run
from npusim.hw import HwConfig
from npusim.isa import (
    Buffer,
    Copy,
    CoreType,
    GmTensor,
    Kernel,
    Loop,
    Mem,
    Pipe,
    Program,
    SetFlag,
    VecOp,
    WaitFlag,
    addr,
)

GM, UB, L1, L0A, L0B, L0C = Mem.GM, Mem.UB, Mem.L1, Mem.L0A, Mem.L0B, Mem.L0C
MTE1, MTE2, MTE3, FIX, M, V, S = Pipe.MTE1, Pipe.MTE2, Pipe.MTE3, Pipe.FIX, Pipe.M, Pipe.V, Pipe.S

# GM regions the tests use; far apart so no two share an L2 line.
GM_A = 0x1000_0000
GM_B = 0x2000_0000
GM_C = 0x3000_0000


def ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b)


# ------------------------------------------------------------------ programs and kernels


def ub_program(hw: HwConfig, body) -> Program:
    """An AIV program with the whole UB declared as one buffer."""
    return Program(body, [Buffer("ub", UB, 0, hw.aiv.ub_bytes)])


def cube_program(hw: HwConfig, body) -> Program:
    """An AIC program with every cube buffer declared whole."""
    return Program(body, [
        Buffer("l1", L1, 0, hw.aic.l1_bytes),
        Buffer("l0a", L0A, 0, hw.aic.l0a_bytes),
        Buffer("l0b", L0B, 0, hw.aic.l0b_bytes),
        Buffer("l0c", L0C, 0, hw.aic.l0c_bytes),
    ])


def aiv_kernel(hw: HwConfig, body, block_dim: int = 1, name: str = "aiv", gm=()) -> Kernel:
    """An AIV kernel: one program shared by every block (gm: the GmTensors it declares)."""
    return Kernel(name, CoreType.AIV, block_dim, aiv=[ub_program(hw, body)], gm=gm, op_type=name)


def aiv_kernel_per_block(hw: HwConfig, bodies: list, name: str = "aiv_blocks") -> Kernel:
    """An AIV kernel with one program per block."""
    return Kernel(name, CoreType.AIV, len(bodies), aiv=[ub_program(hw, b) for b in bodies], op_type=name)


def aic_kernel(hw: HwConfig, body, block_dim: int = 1, name: str = "aic") -> Kernel:
    return Kernel(name, CoreType.AIC, block_dim, aic=[cube_program(hw, body)], op_type=name)


def mix_kernel(hw: HwConfig, aic_body, aiv_body, block_dim: int = 1, name: str = "mix") -> Kernel:
    return Kernel(name, CoreType.MIX, block_dim, aic=[cube_program(hw, aic_body)],
                  aiv=[ub_program(hw, aiv_body)], op_type=name)


def read_kernel(hw: HwConfig, gm: int, nbytes: int, *, block_dim: int = 1, block_step: int = 0,
                segments: int = 1, gm_stride: int | None = None, ub_stride: int | None = None,
                repeat: int = 1, name: str = "read") -> Kernel:
    """Each block copies GM -> UB (`segments` pieces of `nbytes`), `repeat` times in a row.
    Block b reads from gm + b * block_step."""
    src = addr(gm, block=block_step)
    copy = Copy(GM, UB, src, 0, nbytes, segments, gm_stride, ub_stride)
    return aiv_kernel(hw, [copy] * repeat, block_dim, name)


def vec_kernel(hw: HwConfig, op: str, n: int, count: int = 1, block_dim: int = 1, name: str = "vec") -> Kernel:
    """Compute only: `count` vector ops over n fp16 elements, no GM traffic."""
    body = [Loop("i", count, [VecOp(op, n, dst=0, srcs=(0,))])] if count > 1 else [VecOp(op, n, dst=0, srcs=(0,))]
    return aiv_kernel(hw, body, block_dim, name)


def pipeline_kernel(hw: HwConfig, tile: int, iters: int, double: bool, op: str = "add",
                    name: str | None = None, block_dim: int = 1, block_step: int = 0) -> Kernel:
    """copy-in (MTE2) -> vector op (V) -> copy-out (MTE3) over `iters` tiles of `tile` bytes (fp16).

    double=True: ping-pong slots 0/1 in UB; MTE3->MTE2 flags say a slot is free
    again (primed before the loop, drained after), MTE2->V its input is in, V->MTE3
    its output is ready; `iters` must be even (the loop body does a ping then a pong).
    double=False: one slot; the copy-in of tile j+1 waits for the copy-out of tile j.
    Block b works on the tiles `b * block_step` bytes further on (0: all on the same)."""
    n = tile // 2
    src, dst = GM_A, GM_B
    inp, out = 0, 2 * tile  # UB: two input slots, then two output slots

    def stage(slot: int, gm_step: dict) -> list:
        gm_step = {**gm_step, "block": block_step}
        return [
            WaitFlag(MTE3, MTE2, slot),
            Copy(GM, UB, addr(src + slot * tile, **gm_step), inp + slot * tile, tile),
            SetFlag(MTE2, V, slot),
            WaitFlag(MTE2, V, slot),
            VecOp(op, n, dst=out + slot * tile, srcs=(inp + slot * tile,)),
            SetFlag(V, MTE3, slot),
            WaitFlag(V, MTE3, slot),
            Copy(UB, GM, out + slot * tile, addr(dst + slot * tile, **gm_step), tile),
            SetFlag(MTE3, MTE2, slot),
        ]

    if double:
        assert iters % 2 == 0
        body = [SetFlag(MTE3, MTE2, 0), SetFlag(MTE3, MTE2, 1),
                Loop("j", iters // 2, stage(0, {"j": 2 * tile}) + stage(1, {"j": 2 * tile})),
                WaitFlag(MTE3, MTE2, 0), WaitFlag(MTE3, MTE2, 1)]
    else:
        body = [SetFlag(MTE3, MTE2, 0), Loop("j", iters, stage(0, {"j": tile})), WaitFlag(MTE3, MTE2, 0)]
    span = (block_dim - 1) * block_step + iters * tile
    gm = [GmTensor("src", src, span), GmTensor("dst", dst, span)]
    return aiv_kernel(hw, body, block_dim, name or ("double" if double else "single"), gm)


# ------------------------------------------------------------------ running


def run_on_device(calls, hw: HwConfig, dedup: bool = True, trace: str = "instr",
                  group_sizes: list | None = None) -> RunResult:
    """npusim.engine.run.run() with block grouping switchable (dedup=False: one by one).
    If `group_sizes` is a list, the number of blocks each GM transfer stood for (its
    group's size) is appended to it."""

    def count_groups(device) -> None:
        transfer = device.memory.transfer

        def counting_transfer(addrs, *args, **kwargs):
            group_sizes.append(len(addrs))
            return transfer(addrs, *args, **kwargs)

        device.memory.transfer = counting_transfer

    return run(calls, hw, trace, dedup, count_groups if group_sizes is not None else None)


def simulate_on_device(kernel: Kernel, hw: HwConfig, dedup: bool = True, trace: str = "instr") -> RunResult:
    return run_on_device([Launch(kernel, 0), Synchronize()], hw, dedup, trace)


def whole_run(result: RunResult) -> str:
    """Everything a run gives, written with its types (repr tells 3 from 3.0): what the
    tests holding C code to the Python it replaced compare."""
    return repr((result.cycles, result.host_launch_cycles, result.host_wait_cycles, result.kernels, result.trace))


def intervals(result: RunResult, core: str | None = None, pipe: str | None = None,
              name: str | None = None) -> list[tuple]:
    """Instruction intervals (core, pipe, name, start, end, kernel id), filtered, in start order."""
    return sorted((iv for iv in result.trace.intervals
                   if (core is None or iv[0] == core) and (pipe is None or iv[1] == pipe)
                   and (name is None or iv[2] == name)), key=lambda iv: (iv[3], iv[0]))


def block_start(result: RunResult, core: str) -> float:
    """When the (first) block on `core` started running its program (after block start-up)."""
    return min(span[3] for span in result.trace.block_spans if span[0] == core)


class Hung(Exception):
    """A case that did not end in time (not an OSError, which npusim's main() would report)."""


@contextlib.contextmanager
def deadline(seconds: float = 60):
    """Fail instead of hanging (pytest-timeout is not installed): SIGALRM after `seconds`."""
    def on_alarm(signum, frame):
        raise Hung(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
