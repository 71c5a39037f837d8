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
from npusim.calibrate.timing import STEP, step_kernel_us, time_us
from npusim.diskcache.reads import recording, tracked
from npusim.ops.collectives import KINDS as COLLECTIVES
from npusim.ops.collectives.simulate import simulate_collective

OpKey = tuple  # Mapped.key: (npusim op type, ((param, value), ...), further ops, timing, kernel)


def op_time_us(key: OpKey, hw: HwConfig) -> float:
    """A measured row's simulated time, timed as its method measures it
    (npusim.calibrate.timing; msprof's Task Duration: from the first kernel reaching
    the head of its stream, the kernel start cost included, to the last kernel's end).
    A collective's, compared with hccl_test's aveg_time, is the same span over its
    kernels and transfer steps (npusim.ops.collectives.simulate)."""
    op, params, more, timing, kernel = key
    if op in COLLECTIVES:
        p = dict(params)
        return simulate_collective(op, p["bytes"], p["devices"], hw, dtype=p["dtype"]).us
    if op == STEP:
        p = dict(params)
        return step_kernel_us(p["step"], p["node"], kernel, hw, p["op"], p["params"])
    return time_us(((op, params), *more), timing, hw, kernel)


class Model:
    """log op times of distinct ops under trial values of `fields` of `base`.

    Each simulation runs on a config that records the fields it reads
    (npusim.diskcache.reads): a later trial that agrees with it on those fields takes
    the same branches and gets the same time, so it is reused, not run again (as the
    disk cache does) - a trial that moves the HBM efficiency does not re-run an op
    that never touches HBM, and a Jacobian column of a field no op reads costs nothing."""

    def __init__(self, base: HwConfig, fields: Sequence[str]):
        self.base = base
        self.fields = tuple(fields)
        self.v0 = np.array([float(value_of(base, f)) for f in self.fields])
        self.integer = [isinstance(value_of(base, f), int) for f in self.fields]
        # op key -> [(((field read, its value), ...), time us)]: shared by with_fields()
        self.cache: dict[tuple, list[tuple[tuple, float]]] = {}

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
        return sum(len(runs) for runs in self.cache.values())

    def with_fields(self, fields: Sequence[str]) -> Model:
        """The same model over other fields, sharing the simulations already done."""
        m = Model(self.base, fields)
        m.cache = self.cache
        return m

    def log_times(self, theta: np.ndarray, keys: Sequence[OpKey]) -> np.ndarray:
        changed = [f for f, v in zip(self.fields, self.values(theta)) if v != value_of(self.base, f)]
        hw = self.config(theta)
        now: dict[str, object] = {}  # read path -> its value in hw (where theta may have moved it)

        def current(path: str, base_value):
            """The value at a read path in this trial's config (a read of a table is of all of it)."""
            if path not in now:
                moved = any(c == path or c.startswith(path + ".") for c in changed)
                now[path] = value_of(hw, path) if moved else base_value
            return now[path]

        tracking = None
        out = np.empty(len(keys))
        for i, key in enumerate(keys):
            runs = self.cache.setdefault(key, [])
            us = next((t for reads, t in runs if all(current(f, v0) == v for f, v0, v in reads)), None)
            if us is None:
                tracking = tracking or tracked(hw)
                with recording() as read:
                    us = op_time_us(key, tracking)
                runs.append((tuple((f, value_of(self.base, f), value_of(hw, f)) for f in sorted(read)), us))
            out[i] = math.log(us)
        return out
