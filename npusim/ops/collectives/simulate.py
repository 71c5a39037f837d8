"""One collective on the engine, alone: what `npusim op all_reduce bytes=64MiB devices=8`
prints, in the form hccl_test prints it (data size, time, algorithm bandwidth).

hccl_test's algorithm bandwidth is the buffer size over the time, in GB of 2**30
bytes; its bus bandwidth scales that by what each rank's links must carry relative
to the buffer (all_reduce 2 (p-1)/p, reduce_scatter / all_gather / all_to_all
(p-1)/p, send_recv 1), so that it compares with a link's bandwidth whatever the
algorithm.
"""

from __future__ import annotations

import re

from attrs import frozen

from npusim.engine.host import Launch, Synchronize
from npusim.engine.run import RunResult, run
from npusim.errors import ConfigError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES
from npusim.ops.collectives.algorithms import formula_us
from npusim.ops.collectives.hccl_test import GB
from npusim.ops.collectives.lower import launch_order, transfer
from npusim.ops.registry import lower

_BUS_FACTOR = {"all_reduce": lambda p: 2 * (p - 1) / p, "reduce_scatter": lambda p: (p - 1) / p,
               "all_gather": lambda p: (p - 1) / p, "all_to_all": lambda p: (p - 1) / p, "send_recv": lambda p: 1.0}
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_bytes(text: str, where: str = "bytes") -> int:
    """'64MiB', '1K', '4096' -> bytes (binary units, as hccl_test's -b/-e take them)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m[2].upper() not in _UNITS:
        raise ConfigError(f"{where}: expected a size such as 4096, 64KiB or 1GiB, got {text!r}")
    return int(m[1]) * _UNITS[m[2].upper()]


@frozen
class CollectiveReport:
    kind: str
    algo: str
    nbytes: int
    devices: int
    dtype: str
    us: float  # from the first task reaching the device to the last one ending
    formula_us: float  # the HCCL user guide's alpha-beta-gamma cost
    result: RunResult

    @property
    def algbw_gb_s(self) -> float:
        return self.nbytes / (self.us * 1e-6) / GB if self.us else 0.0

    @property
    def busbw_gb_s(self) -> float:
        return self.algbw_gb_s * _BUS_FACTOR[self.kind](self.devices)

    def line(self) -> str:
        return (f"{self.nbytes:>14d} {self.us:>14.2f} {self.algbw_gb_s:>14.4f} {self.busbw_gb_s:>14.4f} "
                f"{self.formula_us:>14.2f}")


HEADER = f"{'data_size(B)':>14} {'aveg_time(us)':>14} {'alg_bw(GB/s)':>14} {'bus_bw(GB/s)':>14} {'formula(us)':>14}"


def simulate_collective(kind: str, nbytes: int, devices: int, hw: HwConfig, algo: str = "auto",
                        dtype: str = "fp16", trace: str = "kernel") -> CollectiveReport:
    """Run one collective of `nbytes` (rounded up to whole elements per rank) on rank 0 of
    `devices` symmetric ranks, its tasks captured (graph-mode launches) on one stream."""
    e = DTYPE_BYTES[dtype]
    elements = max(devices, -(-nbytes // (e * devices)) * devices)
    low = lower(kind, dict(elements=elements, dtype=dtype, devices=devices, algo=algo), hw)
    calls, sends = [], 0
    for i in launch_order(low):
        if isinstance(i, int):
            calls.append(Launch(low.kernels[i], 0, "graph"))
        else:
            calls.append(transfer(low.tiling, i, f"{kind}/send{sends}", 0, "graph"))
            sends += 1
    result = run(calls + [Synchronize()], hw, trace)
    ks = result.kernels
    us = hw.us(max(k.end for k in ks) - min(k.queued for k in ks))
    return CollectiveReport(kind, low.tiling.algo, elements * e, devices, dtype, us,
                            formula_us(kind, low.tiling.algo, elements * e, devices, hw), result)
