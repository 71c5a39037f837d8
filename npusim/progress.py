"""Progress with an ETA on stderr for long commands (sweeps, compare, serve), drawn by tqdm.

Shown when stderr is a terminal, or when forced (`--progress`); never when stderr
is captured (a pipe, a file, a test), unless forced. Nothing is ever written to
stdout."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

Progress = Callable[[int, int, int], None]  # (done, in all, failed)


def shown(force: bool | None, stream) -> bool:
    """Whether a display on `stream` is drawn: force True always, False never, None when
    it is a terminal (tqdm's rule for disable=None)."""
    return force if force is not None else not hasattr(stream, "isatty") or stream.isatty()


class progress_bar:
    """A callback bar(done, total, failed) that draws `what: 3/12 UNIT |###   | [00:14<00:42]`
    on stderr; with total None (work that finds its own size as it goes) a count,
    `what: 3 UNIT [00:14, note]`, `note` saying what is under way. close() ends the line
    (call it before printing after an interruption). force: True always, False never,
    None when `stream` (default stderr) is a terminal."""

    def __init__(self, what: str, unit: str, force: bool | None = None, stream=None):
        self.what, self.unit, self.force, self.stream = what, unit, force, stream
        self.bar = None

    def __call__(self, done: int, total: int | None, failed: int = 0, note: str = "") -> None:
        stream = self.stream or sys.stderr
        if not shown(self.force, stream):
            return  # not shown: tqdm is not even imported
        from tqdm import tqdm

        if self.bar is None:
            shape = ("{desc}: {n_fmt}/{total_fmt}{unit} |{bar}| [{elapsed}<{remaining}]{postfix}" if total is not None
                     else "{desc}: {n_fmt}{unit} [{elapsed}{postfix}]")
            self.bar = tqdm(total=total, desc=self.what, unit=f" {self.unit}", file=stream, dynamic_ncols=True,
                            bar_format=shape, **({} if total is not None else {"miniters": 1, "mininterval": 0}))
            # a count without a total redraws at every call: such steps are few and long (serve's
            # engine steps were, before pricing_progress), and tqdm's throttling, tuned to fast
            # loops, left the count of a burst of short steps, and the step under way, off the
            # screen for minutes
        if failed or note:
            self.bar.set_postfix_str(", ".join(x for x in (f"{failed} failed" if failed else "", note) if x),
                                     refresh=False)
        self.bar.update(done - self.bar.n)
        if total is not None and done >= total:
            self.close()

    def close(self) -> None:
        """End the line; a later call starts a new bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "progress_bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class pricing_progress:
    """What `npusim serve` shows while its step-cost model has the engine price steps:

        serve: 20/31 engine steps [06:10 elapsed, ~03:05 left (estimate: 18.5 s a step), prefill 14 x 4096]

    steps priced / steps known to be needed so far (the grid corners and the split cells'
    midpoints the model is about to read, and any step the engine starts: the total grows
    as the load reaches new shapes), the time since the first of them, an ETA for those
    known ones from the mean wall time per priced step (an estimate, and so labelled), the
    step under way; with --max-rate, the rate being probed and the bracket around the
    highest sustainable one (`probing 12.5 req/s in [10, 20]`: met at 10, missed at 20; `?`:
    not found yet). Its methods are StepCost's on_plan, on_point and on_priced hooks.
    Drawn on `stream` (default stderr) as progress_bar decides (force, a terminal); close()
    ends the line and starts the count again (the next service's model)."""

    def __init__(self, what: str = "serve", force: bool | None = None, stream=None,
                 clock: Callable[[], float] = time.monotonic):
        self.what, self.force, self.stream, self.clock = what, force, stream, clock
        self.bar = None
        self._reset()

    def _reset(self) -> None:
        self.needed: dict[tuple, None] = {}  # every step known to be needed, in the order learnt
        self.running: dict[tuple, None] = {}  # started, not priced yet
        self.priced: set[tuple] = set()
        self.seconds = 0.0  # wall time of the priced steps
        self.began: float | None = None
        self.probe = ""

    @property
    def shown(self) -> bool:
        return shown(self.force, self.stream or sys.stderr)

    # ---- StepCost's hooks

    def planned(self, keys: Sequence[tuple]) -> None:
        """Steps the model is about to read that the engine will have to price."""
        new = [k for k in keys if k not in self.needed]
        if new:
            self.needed.update(dict.fromkeys(new))
            self._draw()

    def started(self, key: tuple) -> None:
        """The engine starts pricing `key`."""
        self.needed[key] = None
        self.running[key] = None
        self._draw()

    def step_priced(self, key: tuple, seconds: float) -> None:
        """`key` is priced, in `seconds` of wall time."""
        self.running.pop(key, None)
        self.needed[key] = None
        if key not in self.priced:
            self.priced.add(key)
            self.seconds += seconds
        self._draw()

    def probing(self, rate: float, lo: float | None, hi: float | None) -> None:
        """--max-rate probes `rate`; lo: the highest rate met so far, hi: the lowest missed (None: none yet)."""
        bracket = f" in [{_rate(lo)}, {_rate(hi)}]" if lo is not None or hi is not None else ""
        self.probe = f"probing {_rate(rate)} req/s{bracket}"
        self._draw()

    # ---- the line

    def line(self) -> str:
        """The line as drawn now (see the class doc)."""
        from tqdm import tqdm

        now = self.clock()
        parts = [f"{tqdm.format_interval(now - self.began if self.began is not None else 0)} elapsed"]
        done, total = len(self.priced), len(self.needed)
        if done and total > done:
            mean = self.seconds / done
            parts.append(f"~{tqdm.format_interval((total - done) * mean)} left (estimate: {_seconds(mean)} a step)")
        if self.probe:
            parts.append(self.probe)
        if self.running:
            phase, *shape = next(reversed(self.running))
            more = f" and {len(self.running) - 1} more" if len(self.running) > 1 else ""
            parts.append(f"{phase} {' x '.join(map(str, shape))}{more}")
        return f"{self.what}: {done}/{total} engine steps [{', '.join(parts)}]"

    def _draw(self) -> None:
        if self.began is None:  # the clock starts at the first event
            self.began = self.clock()
        stream = self.stream or sys.stderr
        if not shown(self.force, stream):
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=None, file=stream, dynamic_ncols=True, bar_format="{desc}", leave=True)
        self.bar.set_description_str(self.line(), refresh=True)  # every event: they are few and some long

    def close(self) -> None:
        """End the line (its last state stays on screen); the next event starts a new count."""
        if self.bar is not None:
            self.bar.set_description_str(self.line(), refresh=False)
            self.bar.close()
            self.bar = None
        self._reset()

    def __enter__(self) -> "pricing_progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rate(rate: float | None) -> str:
    return "?" if rate is None else f"{rate:.3g}"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s >= 1 else f"{s * 1e3:.0f} ms"


__all__ = ["Progress", "pricing_progress", "progress_bar", "shown"]
