"""The lowered-program IR and its checker."""

from npusim.isa.program import (
    ALIGN_BYTES, CORE_MEMS, CORE_PIPES, COPY_PIPE, DTYPE_BYTES, Addr, Affine, Buffer, Copy, CoreType,
    CrossSetFlag, CrossWaitFlag, GmTensor, Instr, Kernel, Loop, Mem, Mmad, Pipe, PipeBarrier, Program, Scalar,
    SetFlag, SyncAll, VecOp, WaitFlag, addr, at,
)
from npusim.isa.verify import verify

__all__ = [
    "ALIGN_BYTES", "CORE_MEMS", "CORE_PIPES", "COPY_PIPE", "DTYPE_BYTES", "Addr", "Affine",
    "Buffer", "Copy", "CoreType", "CrossSetFlag", "CrossWaitFlag", "GmTensor", "Instr", "Kernel",
    "Loop", "Mem", "Mmad", "Pipe", "PipeBarrier", "Program", "Scalar", "SetFlag", "SyncAll",
    "VecOp", "WaitFlag", "addr", "at", "verify",
]
