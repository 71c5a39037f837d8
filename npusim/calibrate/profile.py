"""Read msprof's op_summary CSV files (one file, or every op_summary*.csv under a folder)
into ProfileRow records: one measured kernel each, with its shapes parsed.

Column names are msprof's (CANN "op_summary (Operator Details)"): Op Name, OP Type,
Task Type, Task Duration(us), Block Dim, Input Shapes, Input Data Types, Input Formats,
Output Shapes; Output Data Types and Output Formats are read when present. Shapes are
msprof's: ';' between tensors, ',' between dimensions, an empty entry for a scalar.
Every bad value is one ProfileError naming the file, the row (its line in the file)
and the column.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import attrs
from attrs import frozen

from npusim.errors import NpusimError
from npusim.hw.parse import input_file, plain, short
from npusim.report.tables import STEP_FILE

REQUIRED_COLUMNS = ("Op Name", "OP Type", "Task Type", "Task Duration(us)", "Block Dim", "Input Shapes",
                    "Input Data Types", "Input Formats", "Output Shapes")
# Method and Note: not msprof's; the public measurements (npusim/data/measured) give how
# each row was timed and the call's attributes (causal mask, layout, group list) there.
# npusim Op and npusim Params: npusim's own profiles name the op each kernel came from
OPTIONAL_COLUMNS = ("Output Data Types", "Output Formats", "Method", "Note", "npusim Op", "npusim Params",
                    "npusim Node", "npusim Kernel")
# a header with neither of these is not an op_summary table at all (op_statistic, a trace...)
IDENTIFYING_COLUMNS = ("OP Type", "Task Duration(us)")
PROFILE_GLOB = "op_summary*.csv"
# The longest task a profile row may time: an hour. A kernel or collective longer than
# that is a unit slip or garbage, and would drag the fit to it (log-time residuals).
MAX_DURATION_US = 3.6e9
# The shortest: 1 ns, the resolution msprof writes durations in (us to 3 decimals). A row
# shorter is garbage too: 1e-300 us made every fitted error a 300-digit percentage.
MIN_DURATION_US = 1e-3


# what every step file names (npusim run --profile): without one the step is run again
# with run_decoder's default for it, not as it ran
STEP_KEYS = ("workload", "phase", "batch", "context", "passes")


class ProfileError(NpusimError):
    """A profile file is missing, not msprof's op_summary, or has a bad value."""


@frozen
class ProfileRow:
    """One measured kernel of an op_summary table."""

    file: str
    line: int  # its line in the file (the header is line 1)
    op_name: str
    op_type: str  # CANN's op type, as msprof writes it (MatMulV2, RmsNorm, ...)
    task_type: str  # AI_CORE, AI_VECTOR_CORE, MIX_AIC, AI_CPU, HCCL, ...
    duration_us: float
    block_dim: str
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    input_formats: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...] = ()
    output_formats: tuple[str, ...] = ()
    method: str = ""  # how it was timed (npusim.calibrate.timing.METHODS); "" = a kernel time
    note: str = ""  # the source's description of the call (attributes msprof does not list)
    npusim_op: str = ""  # npusim's own profile: the op the kernel was lowered from
    npusim_params: str = ""  # ... its parameters (JSON)
    npusim_kernel: str = ""  # ... and which of its kernels this is (0, 1, ...)
    npusim_node: str = ""  # a decoder step's profile: the graph node the kernel was launched for
    step: str = ""  # ... and the step (STEP_FILE beside the CSV, JSON): the row is timed in it

    @property
    def where(self) -> str:
        return f"{self.file}: row {self.line}"


def profile_files(path: str | Path) -> list[Path]:
    """The op_summary files of `path`: the file itself, or every op_summary*.csv under
    a folder (msprof puts them in PROF_*/mindstudio_profiler_output/), sorted."""
    p = Path(path)
    if not p.exists():
        raise ProfileError(f"{p}: no such file or folder (expected an op_summary CSV or a folder of them)")
    if input_file(p, folder=True, error=ProfileError).is_file():
        return [p]
    files = sorted(f for f in p.rglob(PROFILE_GLOB) if f.is_file())
    if not files:
        raise ProfileError(f"{p}: no {PROFILE_GLOB} file in this folder (expected msprof's output)")
    return files


def read_profile(path: str | Path) -> list[ProfileRow]:
    """Every row of every op_summary file of `path`; an empty profile is an error."""
    files = profile_files(path)
    rows = [r for f in files for r in read_csv(f)]
    if not rows:
        raise ProfileError(f"{path}: empty profile (no op rows in {', '.join(map(str, files))})")
    return rows


def read_csv(path: Path) -> list[ProfileRow]:
    """The rows of one op_summary CSV; a decoder step's rows of npusim's own profile carry
    the step (its STEP_FILE, written beside the CSV by `npusim run --profile`)."""
    try:
        step_file = path.parent / STEP_FILE
        step = step_file.read_text() if step_file.is_file() else ""
        if step:
            _check_step(step, step_file)
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            _check_header(path, header)
            col = {name: header.index(name) for name in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if name in header}
            rows = []
            for cells in reader:
                if not any(c.strip() for c in cells):
                    continue
                row = _row(path, reader.line_num, cells, col)
                rows.append(attrs.evolve(row, step=step) if step and row.npusim_node else row)
            return rows
    except UnicodeDecodeError as e:  # a binary file, or text in another encoding (GBK, Latin-1)
        raise ProfileError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x}; expected msprof's op_summary "
                           "CSV, which is UTF-8)") from None
    except csv.Error as e:
        raise ProfileError(f"{path}: not a CSV file ({e})") from None
    except OSError as e:
        raise ProfileError(f"{path}: cannot read: {e.strerror or e}") from None


def _check_header(path: Path, header: list[str]) -> None:
    if not any(c in header for c in IDENTIFYING_COLUMNS):
        shown = ", ".join(short(h) for h in header[:4]) or "nothing"  # a cell may be a whole TSV header
        raise ProfileError(f"{path}: row 1: not an msprof op_summary CSV (its header starts with {shown}; "
                           f"expected columns {', '.join(REQUIRED_COLUMNS)})")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ProfileError(f"{path}: row 1: missing column '{missing[0]}'"
                           + (f" (and {len(missing) - 1} more: {', '.join(missing[1:])})" if len(missing) > 1 else ""))
    twice = next((c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if header.count(c) > 1), None)
    if twice:  # which of the two is the measurement? (the first would be read silently)
        at = [i + 1 for i, h in enumerate(header) if h == twice]
        raise ProfileError(f"{path}: row 1: column '{twice}' given twice (columns {at[0]} and {at[1]})")


def _row(path: Path, line: int, cells: list[str], col: dict[str, int]) -> ProfileRow:
    def cell(name: str) -> str:
        i = col.get(name)
        if i is None:
            return ""
        if i >= len(cells):
            raise ProfileError(f"{path}: row {line}, column '{name}': missing (the row has {len(cells)} cells)")
        return cells[i].strip().strip('"').strip()

    text = cell("Task Duration(us)")
    try:
        duration = plain(float, text)  # not '1_2.5' or '１２.５', which float() reads
    except ValueError:
        raise ProfileError(f"{path}: row {line}, column 'Task Duration(us)': expected a number, got {short(text)}") from None
    if not 0 < duration <= MAX_DURATION_US:
        raise ProfileError(f"{path}: row {line}, column 'Task Duration(us)': expected a duration > 0 and at most "
                           f"{MAX_DURATION_US:g} us (an hour), got {short(text)}")
    if duration < MIN_DURATION_US:
        raise ProfileError(f"{path}: row {line}, column 'Task Duration(us)': expected a duration of at least "
                           f"{MIN_DURATION_US:g} us (1 ns, msprof's resolution), got {short(text)}")
    return ProfileRow(
        file=str(path), line=line, op_name=cell("Op Name"), op_type=cell("OP Type"), task_type=cell("Task Type"),
        duration_us=duration, block_dim=cell("Block Dim"),
        input_shapes=parse_shapes(cell("Input Shapes"), f"{path}: row {line}, column 'Input Shapes'"),
        input_dtypes=_list(cell("Input Data Types")), input_formats=_list(cell("Input Formats")),
        output_shapes=parse_shapes(cell("Output Shapes"), f"{path}: row {line}, column 'Output Shapes'"),
        output_dtypes=_list(cell("Output Data Types")), output_formats=_list(cell("Output Formats")),
        method=cell("Method"), note=cell("Note"), npusim_op=cell("npusim Op"), npusim_params=cell("npusim Params"),
        npusim_node=cell("npusim Node"), npusim_kernel=cell("npusim Kernel"))


def _check_step(text: str, path: Path) -> None:
    """A step file is what `npusim run --profile` writes: a JSON object of run_decoder's
    arguments and the tilings the step ran with."""
    try:
        step = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path} is not JSON ({e.msg})") from None
    if not isinstance(step, dict) or not isinstance(step.get("workload"), str):
        raise ProfileError(f"{path}: expected a JSON object with the step's 'workload' (npusim run --profile)")
    tilings = step.get("tilings", {})
    if not isinstance(tilings, dict) or not all(isinstance(t, dict) for t in tilings.values()):
        raise ProfileError(f"{path}: key 'tilings': expected an object of node name -> tiling fields")
    missing = [key for key in STEP_KEYS if key not in step]
    if missing:  # the step would run again with run_decoder's default (batch 1): other kernels, other times
        raise ProfileError(f"{path}: missing key '{missing[0]}' (npusim run --profile writes the step's "
                           f"{', '.join(STEP_KEYS)})")


def _list(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(";")) if text else ()


def parse_shapes(text: str, where: str) -> tuple[tuple[int, ...], ...]:
    """msprof's "8,4096;4096,4096" -> ((8, 4096), (4096, 4096)); "" entries are scalars ()."""
    if not text or text.upper() in ("N/A", "NA"):
        return ()
    shapes = []
    for part in text.split(";"):
        dims = [d.strip() for d in part.split(",")] if part.strip() else []
        try:
            shape = tuple(plain(int, d) for d in dims)  # an empty item ("8,,512") is no dimension
        except ValueError:
            raise ProfileError(f"{where}: expected shapes like '8,4096;4096,4096', got {short(text)}") from None
        if any(d < 0 for d in shape):
            raise ProfileError(f"{where}: negative dimension in {short(text)} (a dynamic shape: profile a concrete run)")
        shapes.append(shape)
    return tuple(shapes)
