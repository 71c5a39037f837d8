"""The sweep CSV: its columns, written whole, or grown row by row while a sweep
runs so that it can be resumed.

DIR/sweep.csv is a plain CSV (a header line, one line per point: the parameters,
METRICS, status), readable as it is by csv, pandas or a spreadsheet. Beside it,
DIR/sweep.settings.json records what the rows were made with (workload, hardware
config and its content, step, passes, grid, npusim version), so that `--resume`
can refuse a CSV from other settings rather than mix two sweeps in one file.

While a sweep runs (a `Journal`), each finished row is appended to sweep.csv as one
whole line and flushed at once, in the order the points finish: a sweep killed
outright (SIGKILL, a lost machine) loses only the points in flight, and at most a
torn last line, which resume drops. When the sweep ends or is interrupted
(Ctrl-C, SIGTERM) the file is rewritten, atomically, in grid order. Nothing in DIR
changes until the first point finishes, so a sweep stopped before that leaves an
earlier result as it was. A sweep holds DIR (an advisory lock) from then on, or from
the start when DIR has an earlier sweep's files, until it ends: a second sweep in
DIR meanwhile is refused, not mixed in.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from npusim.errors import ConfigError
from npusim.outputs import OutputError, atomic_write, write_text

try:
    import fcntl
except ImportError:  # no advisory locks (Windows): two sweeps in one folder are not refused
    fcntl = None

METRICS = ("latency_us", "tokens_per_s", "hbm_read_bytes", "hbm_write_bytes", "l2_hit_rate", "peak_memory_bytes",
           "kernel_count")
CSV_NAME, SETTINGS_NAME = "sweep.csv", "sweep.settings.json"
PLOT_NAMES = ("sweep.png", "sweep.svg")  # made from the rows at the end: stale once new rows are written
STATUS_OK = "ok"  # a point that ran; any other status is the error of one that failed
LOST = "worker lost"  # a row whose worker died: a fact about the machine, not the point, so resume runs it again


def param_names(rows: Sequence[dict], params: Sequence[str] | None) -> list[str]:
    """The given parameter names, or the rows' keys that are not figures."""
    if params is not None:
        return list(params)
    return list(dict.fromkeys(k for r in rows for k in r if k not in (*METRICS, "status")))


def columns(rows: Sequence[dict], params: Sequence[str] | None = None) -> list[str]:
    """The CSV header: the parameters, METRICS, status."""
    return [*param_names(rows, params), *METRICS, "status"]


def _cells(row: Mapping[str, Any]) -> dict:
    return {k: ("" if v is None else v) for k, v in row.items()}


def write_csv(rows: Sequence[dict], path: str | Path, params: Sequence[str] | None = None) -> Path:
    """One line per row, in the rows' order; a value a point does not have is empty."""
    path = Path(path)
    with atomic_write(path, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns(rows, params), restval="")
        writer.writeheader()
        for r in rows:
            writer.writerow(_cells(r))
    return path


def point_key(point: Mapping[str, Any], params: Sequence[str]) -> tuple[str, ...]:
    """A point's parameters as the CSV writes them (str; empty where the point has none)."""
    return tuple("" if point.get(p) is None else str(point[p]) for p in params)


def settings_record(settings: Mapping[str, Any]) -> dict:
    """`settings` as they read back from JSON (tuples as lists, objects by repr)."""
    return json.loads(json.dumps(settings, default=repr, sort_keys=True))


def content_digest(value) -> str:
    """A short digest of a loaded config's content (the cache's key of it: a file it names,
    a workload's routing trace, by the file's content), so that a config file, or a file
    it reads, edited between a sweep and its resume counts as other settings."""
    from npusim.diskcache.keys import digest

    return digest(value)[:16]


def _number(text: str):
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def _figures(row: Mapping[str, str], where: str, cells: Sequence[str]) -> dict:
    """METRICS and status of a row read back: a point that ran has every figure, one that
    failed its error as its status (as run_point makes them)."""
    try:
        figures = {m: _number(row[m]) for m in METRICS}
    except ValueError:
        raise ConfigError(f"{where} has a figure that is not a number: {','.join(cells)[:80]}") from None
    if not row["status"]:
        raise ConfigError(f"{where} has no status (expected ok, or the error of a point that failed): "
                          f"{','.join(cells)[:80]}")
    missing = [m for m, v in figures.items() if v is None]
    if row["status"] == STATUS_OK and missing:
        raise ConfigError(f"{where} is ok but has no {missing[0]}: {','.join(cells)[:80]}")
    return figures | {"status": row["status"]}


class Journal:
    """DIR/sweep.csv while a sweep of `points` runs (see the module doc)."""

    def __init__(self, folder: str | Path, points: Sequence[dict], params: Sequence[str],
                 settings: Mapping[str, Any], resume: bool = False):
        self.folder = Path(folder)
        self.csv, self.settings_path = self.folder / CSV_NAME, self.folder / SETTINGS_NAME
        self.points, self.params, self.header = list(points), list(params), columns([], params)
        self.settings = settings_record(settings)
        self.file = None
        self.lock: int | None = None  # the folder, opened and locked while this sweep may write it
        self.started = False  # a row has been written to sweep.csv
        try:
            if self.folder.is_dir():  # an earlier sweep's files: read, or replaced, by this one only
                self._lock()
            self.earlier: dict[int, dict] = self._read() if resume and self.csv.exists() else {}
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        """Hold the folder for this sweep until close() (an advisory lock, let go when the
        process ends however it ends): two sweeps writing one folder at once - a second
        terminal's --overwrite or --resume - mixed their rows and settings."""
        if self.lock is not None or fcntl is None:
            return
        try:
            fd = os.open(self.folder, os.O_RDONLY)
        except OSError:  # a folder that cannot be opened is not written either: its writes say why
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"{self.folder}: another sweep is writing its files now (wait for it to end, or "
                              "give another --out)") from None
        except OSError:  # a file system without locks: as before
            os.close(fd)
            return
        self.lock = fd

    # ---- resume

    def _read(self) -> dict[int, dict]:
        """The rows an earlier run of these settings finished, by point index."""
        where = f"--resume: {self.csv}"
        if not self.settings_path.is_file():
            raise ConfigError(f"{where}: no {SETTINGS_NAME} beside it, so its settings are unknown; "
                              "give a new --out, or --overwrite to start again")
        try:
            stored = json.loads(self.settings_path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--resume: {self.settings_path}: unreadable ({e})") from None
        if not isinstance(stored, dict):
            raise ConfigError(f"--resume: {self.settings_path}: expected the JSON object of a sweep's settings, "
                              f"got {json.dumps(stored)[:60]}; give a new --out, or --overwrite to start again")
        if stored != self.settings:
            raise ConfigError(f"{where} was made with other settings ({_difference(stored, self.settings)}); "
                              "give a new --out, or --overwrite to start again")
        data = self.csv.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]  # a line cut short by a kill is dropped (its point runs again)
        if len(whole) < len(data):
            with open(self.csv, "r+b") as f:
                f.truncate(len(whole))
        try:
            # (a byte-order mark, as a spreadsheet saves one, is no part of the first column's name)
            lines = list(csv.reader(io.StringIO(whole.decode("utf-8-sig"), newline="")))
        except (UnicodeDecodeError, csv.Error) as e:
            raise ConfigError(f"{where}: not a sweep CSV ({e})") from None
        if not lines:
            return {}
        if lines[0] != self.header:
            raise ConfigError(f"{where}: its columns are not this sweep's ({','.join(lines[0])[:80]})")
        index = {point_key(p, self.params): i for i, p in enumerate(self.points)}
        found: dict[int, dict] = {}
        line_of: dict[int, int] = {}  # point index -> the line that holds its row
        for n, cells in enumerate(lines[1:], start=2):
            if not cells:  # a blank line (an editor's last one) holds no point
                continue
            row = dict(zip(self.header, cells))
            i = index.get(point_key(row, self.params)) if len(cells) == len(self.header) else None
            if i is None:
                raise ConfigError(f"{where}: line {n} is not a point of this grid: {','.join(cells)[:80]}")
            if row["status"].startswith(LOST):
                continue
            read = dict(self.points[i]) | _figures(row, f"{where}: line {n}", cells)
            if i in line_of and read != found[i]:  # two results of one point: which is the sweep's?
                raise ConfigError(f"{where}: line {n} holds the point of line {line_of[i]} again, with other "
                                  f"figures: {','.join(cells)[:80]}")
            line_of.setdefault(i, n)
            found[i] = read
        return found

    # ---- while running

    def add(self, row: dict) -> None:
        """Append one finished row as a whole line, flushed (the first one replaces
        an earlier sweep's files: CSV, settings, stale plots)."""
        line = io.StringIO(newline="")
        csv.DictWriter(line, fieldnames=self.header, restval="").writerow(_cells(row))
        try:
            if self.file is None:
                self._start()
            self.file.write(line.getvalue())
            self.file.flush()  # in the OS's hands: a killed process loses nothing written
        except OSError as e:
            raise OutputError(f"cannot write {self.csv}: {e.strerror or e}") from None

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock()
        if not self.earlier:
            # the settings go last: a kill in between leaves a CSV resume refuses, never a mix
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.settings_path)
            with atomic_write(self.csv, newline="") as f:
                csv.writer(f).writerow(self.header)
            write_text(self.settings_path, json.dumps(self.settings, indent=1, sort_keys=True) + "\n")
        for name in PLOT_NAMES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.folder / name)
        self.file = open(self.csv, "a", newline="")
        self.started = True

    def finish(self, rows: Sequence[dict]) -> Path | None:
        """Rewrite sweep.csv with `rows` (in grid order), atomically; None if no row was
        ever written (then an earlier sweep's files are left as they were)."""
        self._close_file()
        if not self.started and not self.earlier:
            return None
        return write_csv(rows, self.csv, self.params)

    def _close_file(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def close(self) -> None:
        """Close sweep.csv and let the folder go (another sweep may write it)."""
        self._close_file()
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


# the order settings are compared in: what a user typed first, then what it loaded
ORDER = ("workload", "hw", "overrides", "step", "grid", "workload_content", "hw_content", "npusim")


def _difference(stored: Mapping, now: Mapping, path: str = "") -> str:
    """The first setting that differs, as `key: X there, Y now` (values cut short)."""
    for key in sorted(set(stored) | set(now), key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k)):
        a, b = stored.get(key), now.get(key)
        if a != b:
            if isinstance(a, Mapping) and isinstance(b, Mapping):
                return _difference(a, b, f"{path}{key}.")
            there, now_ = ("unset" if key not in d else json.dumps(d[key])[:60] for d in (stored, now))
            return f"{path}{key}: {there} there, {now_} now"
    return "none"


__all__ = ["CSV_NAME", "Journal", "METRICS", "SETTINGS_NAME", "STATUS_OK", "columns", "content_digest", "point_key",
           "settings_record", "write_csv"]
