"""Read hccl_test output (the table of npusim.ops.collectives.hccl_test) into HcclRow
records, one measured collective per message size, and map each to the npusim
collective that does the same transfer.

hccl_test prints no command line, so which test ran on how many ranks comes from a
command line in the file (`mpirun -n 8 ./bin/all_reduce_test -b 8K -e 1G -f 2 -p 8`,
as a shell log or `tee` keeps it, `#` or `$` before it or not; `npusim op ...
--profile` writes one) or from options given with the file (op=all_reduce devices=8
dtype=fp16). The rank count is mpirun's -n (or -np); the dtype hccl_test's -d
(fp32 when not given); -p, the NPUs per server, must agree with the config's topology
when the ranks span servers. A file may hold several tables: each takes the last
command line above its header. Lines that are neither (the tool's own notes,
warnings, a rank's "check result failed" line) are skipped. Every bad value is one
ProfileError naming the file, the row (its line in the file) and the column.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from attrs import frozen

from npusim.calibrate.opmap import Mapped, Unmappable
from npusim.calibrate.profile import MAX_DURATION_US, MIN_DURATION_US, ProfileError
from npusim.errors import ConfigError
from npusim.hw import HwConfig
from npusim.hw.parse import input_file, plain
from npusim.ops.collectives.hccl_test import ALL_TESTS, DEFAULT_DTYPE, DTYPES, HEADER, TESTS

OPTIONS = ("op", "devices", "dtype")
KIND_OF_TEST = {test: kind for kind, test in TESTS.items()}
NPUSIM_DTYPE = {name: dtype for dtype, name in DTYPES.items()}
# the columns read, by the start of their name in the header (the time column: the
# binary's aveg_time or the guide's avg_time)
COLUMNS = {"data_size": ("data_size",), "time": ("aveg_time", "avg_time"), "bandwidth": ("alg_bandwidth",),
           "check": ("check_result",)}
FAILED = "failed"
_MPI_RANKS = ("-n", "-np", "--np", "--n")
_TEST_NAME = re.compile(r"(?:^|/)(" + "|".join(ALL_TESTS) + r")$")
# a table row's first cell: a number of any form (a garbled size is refused as a row,
# not skipped as a note: "-8192" or "81.5" made the table look empty), unlike a log's
# timestamp or a note's first word
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|0[xX][0-9a-fA-F]+")


@frozen
class HcclRow:
    """One message size of an hccl_test table: the collective measured and its time."""

    file: str
    line: int  # its line in the file
    test: str  # the hccl_test executable: all_reduce_test, ...
    devices: int  # ranks (mpirun -n)
    dtype: str  # hccl_test's -d name: fp16, fp32, bfp16, int8, ...
    npus_per_node: int | None  # -p, if given
    nbytes: int  # data_size
    duration_us: float  # aveg_time
    check: str  # check_result

    @property
    def op_type(self) -> str:
        """How the report groups it: the test and its ranks."""
        return f"{self.test} ({self.devices} ranks)"

    @property
    def op_name(self) -> str:
        return f"{self.test}_{self.nbytes}"

    @property
    def where(self) -> str:
        return f"{self.file}: row {self.line}"


@frozen
class _Setup:
    """What a table measured: from the command line above it and the options."""

    test: str | None = None
    devices: int | None = None
    dtype: str | None = None
    npus_per_node: int | None = None


def _command(line: str) -> _Setup | None:
    """The setup a command line names, or None if the line runs no hccl_test."""
    try:
        words = shlex.split(line.lstrip("#$ "))
    except ValueError:  # an unbalanced quote: not a command line we can read
        words = line.lstrip("#$ ").split()
    at = next((i for i, w in enumerate(words) if _TEST_NAME.search(w)), None)
    if at is None:
        return None

    def value(opts: list[str], names: tuple[str, ...]) -> str | None:
        for i, w in enumerate(opts[:-1]):
            if w in names:
                return opts[i + 1]
        return None

    devices, dtype, per_node = value(words[:at], _MPI_RANKS), value(words[at + 1:], ("-d", "--datatype")), \
        value(words[at + 1:], ("-p", "--npus"))
    return _Setup(_TEST_NAME.search(words[at])[1], _int(devices), dtype or DEFAULT_DTYPE, _int(per_node))


def _int(text: str | None) -> int | None:
    # not '²': isdigit() says yes, int() raises (a traceback on `mpirun -n ²` or devices=²)
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


def _options(path: Path, options: Mapping[str, str]) -> _Setup:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        expected = ", ".join(f"{o}=" for o in OPTIONS)
        raise ConfigError(f"--hccl {path}: unknown option '{unknown[0]}' (expected {expected})")
    op = options.get("op")
    test = TESTS.get(op, op)
    if op is not None and test not in KIND_OF_TEST:
        raise ConfigError(f"--hccl {path}: op={op}: expected one of {', '.join(TESTS)} (or its hccl_test name: "
                          f"{', '.join(TESTS.values())})")
    devices = options.get("devices")
    if devices is not None and (_int(devices) or 0) < 2:
        raise ConfigError(f"--hccl {path}: devices={devices}: expected an integer of 2 or more")
    dtype = options.get("dtype")
    return _Setup(test, _int(devices), DTYPES.get(dtype, dtype))


def _merge(path: Path, line: int, found: _Setup | None, given: _Setup) -> _Setup:
    """The table's setup: the command line's, the options filling what it does not say;
    a disagreement between them is an error."""
    found = found or _Setup()
    out = {}
    for name, option in (("test", "op"), ("devices", "devices"), ("dtype", "dtype")):
        a, b = getattr(found, name), getattr(given, name)
        if a is not None and b is not None and a != b:
            raise ProfileError(f"{path}: row {line}: its command line says {name} {a}, --hccl {option}= says {b}")
        out[name] = a if a is not None else b
    if out["test"] is None or out["devices"] is None:
        missing = "op" if out["test"] is None else "devices"
        raise ProfileError(f"{path}: row {line}: no command line above the table says which test ran on how many "
                           f"ranks (e.g. 'mpirun -n 8 ./bin/all_reduce_test ...'): give {missing}= after the file, "
                           f"as in --hccl {path} op=all_reduce devices=8")
    return _Setup(out["test"], out["devices"], out["dtype"] or DEFAULT_DTYPE, found.npus_per_node)


def _header(cells: list[str]) -> dict[str, int] | None:
    """Column index of each of COLUMNS, if these cells are an hccl_test header."""
    names = [c.strip().rstrip(":").strip().lower() for c in cells]
    out = {}
    for key, starts in COLUMNS.items():
        out[key] = next((i for i, n in enumerate(names) if n.startswith(starts)), None)
    return out if all(out[k] is not None for k in ("data_size", "time")) else None


def _split(line: str) -> list[str]:
    return [c.strip() for c in line.split("|")] if "|" in line else line.split()


def read_hccl(path: str | Path, options: Mapping[str, str] | None = None) -> list[HcclRow]:
    """Every row of every hccl_test table in the file at `path`."""
    path = Path(path)
    given = _options(path, options or {})
    input_file(path, f"--hccl {path}", error=ProfileError)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:  # a binary file, or text in another encoding
        raise ProfileError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x}; expected hccl_test's "
                           "output)") from None
    except OSError as e:
        raise ProfileError(f"{path}: cannot read: {e.strerror or e}") from None
    rows: list[HcclRow] = []
    command, columns, names, setup, header_line = None, None, [], None, 0
    for n, line in enumerate(text.splitlines(), start=1):
        found = _command(line)
        if found is not None:
            if found.devices is not None and found.devices < 1:  # it divided by zero in the simulation
                raise ProfileError(f"{path}: row {n}: its command line runs {found.devices} ranks (mpirun -n): "
                                   f"expected 1 or more")
            command = found
            continue
        cells = _split(line)
        head = _header(cells)
        if head is not None:
            columns, names, header_line = head, [c.rstrip(":").strip() for c in cells], n
            setup = _merge(path, n, command, given)
            continue
        if columns is None or not cells or not _NUMBER.fullmatch(cells[0]):
            continue  # not a row of a table
        rows.append(_row(path, n, cells, columns, names, setup))
    if columns is None:
        raise ProfileError(f"{path}: row 1: not hccl_test output (no header line like '{HEADER}')")
    if not rows:
        raise ProfileError(f"{path}: row {header_line}: no rows under the hccl_test header (an empty table)")
    return rows


def _row(path: Path, line: int, cells: list[str], columns: dict[str, int], names: list[str],
         setup: _Setup) -> HcclRow:
    def cell(key: str) -> str:
        i = columns[key]
        if i >= len(cells) or not cells[i]:
            raise ProfileError(f"{path}: row {line}, column '{names[i]}': missing (the row has {len(cells)} cells)")
        return cells[i]

    def number(key: str, what: str, positive: bool = True) -> float:
        text = cell(key)
        try:
            value = plain(float, text)  # not '8_192', which float() reads
        except ValueError:
            value = float("nan")
        if not (value > 0 if positive else value >= 0) or value == float("inf"):
            raise ProfileError(f"{path}: row {line}, column '{names[columns[key]]}': expected {what}, got '{text}'")
        return value

    nbytes = number("data_size", "a whole number of bytes > 0")
    if not nbytes.is_integer():
        raise ProfileError(f"{path}: row {line}, column '{names[columns['data_size']]}': expected a whole number of "
                           f"bytes > 0, got '{cell('data_size')}'")
    nbytes = int(nbytes)
    us = number("time", "a time in us > 0")
    if not MIN_DURATION_US <= us <= MAX_DURATION_US:  # as an op_summary row's: a unit slip or garbage
        raise ProfileError(f"{path}: row {line}, column '{names[columns['time']]}': expected a time from "
                           f"{MIN_DURATION_US:g} us (1 ns) to {MAX_DURATION_US:g} us (an hour), got '{cell('time')}'")
    if columns["bandwidth"] is not None:  # read to refuse a garbled row; the time is what is fitted
        number("bandwidth", "a bandwidth >= 0", positive=False)
    check = cell("check") if columns["check"] is not None and columns["check"] < len(cells) else ""
    return HcclRow(str(path), line, setup.test, setup.devices, setup.dtype, setup.npus_per_node, nbytes, us, check)


def map_hccl(row: HcclRow, hw: HwConfig) -> Mapped:
    """The npusim collective of a measured row, or Unmappable with the reason."""
    if row.test not in KIND_OF_TEST:
        raise Unmappable(f"{row.test} is not simulated (npusim has {', '.join(TESTS.values())})")
    if row.dtype not in NPUSIM_DTYPE:
        raise Unmappable(f"dtype {row.dtype} (-d) not simulated (-d {', '.join(NPUSIM_DTYPE)} are)")
    if row.check.lower() == FAILED:
        raise Unmappable("check_result failed: the collective computed a wrong result, its time is not fitted")
    per_node, node = row.npus_per_node, hw.topology.node_device_count
    if per_node is not None and row.devices > per_node and per_node != node:
        raise Unmappable(f"{row.devices} ranks on servers of {per_node} NPUs (-p {per_node}), but {hw.name} has "
                         f"{node} per server (topology.node_device_count)")
    params = dict(bytes=row.nbytes, devices=row.devices, dtype=NPUSIM_DTYPE[row.dtype])
    return Mapped(row, KIND_OF_TEST[row.test], tuple(sorted(params.items())))
