"""Simulated op times as a function of the fitted fields: the model calibration fits.

The parameters are the log of each field's value over its value in the base config
(theta = 0 is the base config), so the fit works on relative changes and a value
never turns negative. Integer fields are rounded and efficiencies capped at 1, as the
config's validators require. Each distinct op (op type and parameters) is simulated
once per trial config and remembered, so a profile of thousands of rows costs as
many simulations as it has distinct ops. With jobs > 1 the ops a trial has not met
are simulated in that many worker processes (npusim.pool), each op on its own: the
times, and the order they are remembered in, are those of one process.
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
from npusim.errors import NpusimError
from npusim.ops.collectives.simulate import simulate_collective
from npusim.pool import run_tasks

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

    def __init__(self, base: HwConfig, fields: Sequence[str], jobs: int = 1):
        self.base = base
        self.fields = tuple(fields)
        self.jobs = jobs
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
        m = Model(self.base, fields, self.jobs)
        m.cache = self.cache
        return m

    def log_times(self, theta: np.ndarray, keys: Sequence[OpKey]) -> np.ndarray:
        """log of the simulated time of each op of `keys` under theta; the error of the first
        (in the order of `keys`) that does not simulate, the ops after it not simulated."""
        errors, times = self._times(theta, keys, first_error=True)
        if errors:
            raise next(iter(errors.values()))
        return np.array([math.log(us) for us in times])

    def failures(self, keys: Sequence[OpKey]) -> dict[OpKey, NpusimError]:
        """The ops of `keys` that do not simulate on the base config, with the error; the
        others are simulated (in self.jobs workers) and remembered."""
        return self._times(np.zeros(len(self.fields)), keys)[0]

    def _times(self, theta: np.ndarray, keys: Sequence[OpKey],
               first_error: bool = False) -> tuple[dict[OpKey, NpusimError], list]:
        """The simulated time of each op of `keys` under theta (None where it failed), and
        the ops that failed, in the order of `keys`, with the error. `first_error`: stop at
        the first op that fails (the ops the trial has not met after it are not simulated,
        and their times are None)."""
        changed = [f for f, v in zip(self.fields, self.values(theta)) if v != value_of(self.base, f)]
        hw = self.config(theta)
        now: dict[str, object] = {}  # read path -> its value in hw (where theta may have moved it)

        def current(path: str, base_value):
            """The value at a read path in this trial's config (a read of a table is of all of it)."""
            if path not in now:
                moved = any(c == path or c.startswith(path + ".") for c in changed)
                now[path] = value_of(hw, path) if moved else base_value
            return now[path]

        def known(key: OpKey) -> float | None:
            return next((t for reads, t in self.cache.setdefault(key, [])
                         if all(current(f, v0) == v for f, v0, v in reads)), None)

        times = [known(key) for key in keys]
        missing = list(dict.fromkeys(key for key, us in zip(keys, times) if us is None))
        errors = {}
        for key, result in zip(missing, self._simulate(missing, hw, first_error)):
            if isinstance(result, NpusimError):
                errors[key] = result
            else:
                reads, us = result
                self.cache[key].append((tuple((f, value_of(self.base, f), v) for f, v in reads), us))
        return errors, [known(key) if us is None else us for key, us in zip(keys, times)]

    def _simulate(self, keys: Sequence[OpKey], hw: HwConfig, first_error: bool = False) -> list:
        """For each op of `keys` (_traced_time): the config fields its simulation read and
        its time, or the error; in self.jobs worker processes when there are two or more.
        `first_error`: the list ends at the first error (in the order of `keys`), the ops
        after it not simulated (in workers, those already running are left out), as one
        process would."""
        if self.jobs < 2 or len(keys) < 2:
            tracking = tracked(hw) if keys else None
            results = []
            for key in keys:
                results.append(_traced_time(key, hw, tracking))
                if first_error and isinstance(results[-1], NpusimError):
                    break
            return results
        results: list = [None] * len(keys)
        erred: list[int] = []

        def done(i: int, result) -> None:
            results[i] = result
            if isinstance(result, NpusimError):
                erred.append(i)

        def failed(i: int, reason: str) -> None:  # the worker died, or an error other than npusim's
            raise NpusimError(f"calibrate: simulating {keys[i][0]} in a worker process failed: {reason}")

        run_tasks(_traced_time, [(key, hw) for key in keys], self.jobs, done, failed,
                  lambda: first_error and bool(erred))
        if first_error:  # given out in order: every op before the first error has ended
            first = next((i for i, r in enumerate(results) if isinstance(r, NpusimError)), len(results))
            return results[:first + 1]
        return results


def _traced_time(key: OpKey, hw: HwConfig, tracking: HwConfig | None = None) -> tuple[tuple, float] | NpusimError:
    """op_time_us of `key` on hw and the fields of hw it read, ((path, value), ...) sorted;
    or the error that stopped it (`tracking`: tracked(hw), made once for many keys)."""
    try:
        with recording() as read:
            us = op_time_us(key, tracking or tracked(hw))
    except NpusimError as e:
        return e
    return tuple((f, value_of(hw, f)) for f in sorted(read)), us
