"""Simulated op times as a function of the fitted fields: the model calibration fits.

The parameters are the log of each field's value over its value in the base config
(theta = 0 is the base config), so the fit works on relative changes and a value
never turns negative. Integer fields are rounded and efficiencies capped at 1, as the
config's validators require. Each distinct op (op type and parameters) is simulated
once per trial config and remembered, so a profile of thousands of rows costs as
many simulations as it has distinct ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from npusim.hw import HwConfig, load_hw
from npusim.calibrate.fields import value_of
from npusim.calibrate.timing import time_us
from npusim.ops.collectives import KINDS as COLLECTIVES
from npusim.ops.collectives.simulate import simulate_collective
from npusim.ops.registry import lower

OpKey = tuple  # Mapped.key: (npusim op type, ((param, value), ...), further ops, timing)


def op_time_us(key: OpKey, hw: HwConfig) -> float:
    """A measured row's simulated time, timed as its method measures it
    (npusim.calibrate.timing; msprof's Task Duration: from the first kernel reaching
    the head of its stream, the kernel start cost included, to the last kernel's end).
    A collective's, compared with hccl_test's aveg_time, is the same span over its
    kernels and transfer steps (npusim.ops.collectives.simulate)."""
    op, params, more, timing = key
    if op in COLLECTIVES:
        p = dict(params)
        return simulate_collective(op, p["bytes"], p["devices"], hw, dtype=p["dtype"]).us
    return time_us(((op, params), *more), timing, hw)


def kernel_count(key: OpKey, hw: HwConfig) -> int:
    """How many kernels npusim lowers a row's (non-collective) ops to."""
    op, params, more, _ = key
    return sum(len(lower(o, dict(p), hw).kernels) for o, p in ((op, params), *more))


class Model:
    """log op times of distinct ops under trial values of `fields` of `base`."""

    def __init__(self, base: HwConfig, fields: Sequence[str]):
        self.base = base
        self.fields = tuple(fields)
        self.v0 = np.array([float(value_of(base, f)) for f in self.fields])
        self.integer = [isinstance(value_of(base, f), int) for f in self.fields]
        self.cache: dict[tuple, float] = {}  # shared by with_fields(): its size is the simulations run

    def values(self, theta: np.ndarray) -> tuple:
        """The field values theta stands for, as the config holds them."""
        out = []
        for f, v0, integer, t in zip(self.fields, self.v0, self.integer, theta):
            v = v0 * math.exp(t)
            if f.endswith("_efficiency"):
                v = min(v, 1.0)  # a fraction of the peak
            out.append(max(0, round(v)) if integer else float(f"{v:.6g}"))
        return tuple(out)

    def snap(self, theta: np.ndarray) -> np.ndarray:
        """theta of the values the config can hold (rounded integers, capped efficiencies)."""
        return np.array([math.log(v / v0) if v > 0 and v0 > 0 else t
                         for v, v0, t in zip(self.values(theta), self.v0, theta)])

    def config(self, theta: np.ndarray) -> HwConfig:
        over = {f: v for f, v in zip(self.fields, self.values(theta)) if v != value_of(self.base, f)}
        return load_hw(self.base, over) if over else self.base

    @property
    def simulations(self) -> int:
        return len(self.cache)

    def with_fields(self, fields: Sequence[str]) -> Model:
        """The same model over other fields, sharing the simulations already done."""
        m = Model(self.base, fields)
        m.cache = self.cache
        return m

    def log_times(self, theta: np.ndarray, keys: Sequence[OpKey]) -> np.ndarray:
        # the cache is keyed by the values that differ from the base, so models over
        # other field subsets share it
        values = tuple((f, v) for f, v in zip(self.fields, self.values(theta)) if v != value_of(self.base, f))
        hw = None
        out = np.empty(len(keys))
        for i, key in enumerate(keys):
            ck = (values, key)
            if ck not in self.cache:
                hw = hw or self.config(theta)
                self.cache[ck] = op_time_us(key, hw)
            out[i] = math.log(self.cache[ck])
        return out

