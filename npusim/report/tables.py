"""Profile tables as msprof writes them: op_summary.csv (one row per kernel) and
op_statistic.csv (totals per op type), plus each kernel's stall breakdown.

A task's duration is what msprof's Task Duration holds: from the kernel reaching the
head of its stream to its end - the kernel start (the device's fixed cost per
kernel, by kind) included, as a small kernel's measured duration includes it
(npusim/data/measured/facts.md); npusim's own breakdowns say "kernel starts +
kernels" apart. npusim's columns name the op each kernel was lowered from, its
parameters (`npusim Op`, `npusim Params`, JSON) and the kernel's place among the
op's (`npusim Kernel`), so `npusim calibrate` times a row of npusim's own profile as
exactly that kernel of that op.

Column names follow msprof's where it has one; npusim's own columns come after.
Ratios are busy cycles of a pipe over the cycles its cores held the kernel's
blocks (msprof's aic_*_ratio / aiv_*_ratio): a pipe is *busy* while it works or
waits for its data. The stall breakdown splits each pipe's share of that
residency into work (its own cost: start-ups, bytes at its port rate,
compute), data (a data mover waiting for shared bandwidth or HBM beyond its
transfers' unloaded time; work + data = busy), flag (blocked on a
SetFlag/WaitFlag, barrier or cross-core flag) and idle (nothing to do), which
sum to 100%.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
from attrs import frozen

from npusim.engine.device import KernelRecord
from npusim.engine.run import RunResult
from npusim.engine.stats import KernelStats
from npusim.ops.registry import Lowered
from npusim.ops.roofline import bound_of
from npusim.outputs import atomic_write

SUMMARY_COLUMNS = (
    "Op Name", "OP Type", "Task Type", "Task Start Time(us)", "Task Duration(us)", "Task Wait Time(us)",
    "Block Dim", "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types",
    "Output Formats", "aicore_time(us)", "total_cycles", "aic_cube_ratio", "aic_mte1_ratio", "aic_mte2_ratio",
    "aic_fixpipe_ratio", "aic_scalar_ratio", "aiv_vec_ratio", "aiv_mte2_ratio", "aiv_mte3_ratio",
)
# npusim's dtypes and formats as msprof names them (GE's DataType and Format enums);
# BSND is a layout of an ND tensor, not a storage format
MSPROF_DTYPES = {"fp16": "DT_FLOAT16", "bf16": "DT_BF16", "fp32": "DT_FLOAT", "int8": "DT_INT8", "uint8": "DT_UINT8",
                 "int16": "DT_INT16", "int32": "DT_INT32"}
MSPROF_FORMATS = {"ND": "ND", "NZ": "FRACTAL_NZ", "BSND": "ND"}
_TENSOR_COLUMNS = ("Shapes", "Data Types", "Formats")
NPUSIM_COLUMNS = ("FLOPs", "GM Bytes", "HBM Bytes", "L2 Hit Rate", "Wasted Burst Bytes", "Bound", "Stream",
                  "npusim Op", "npusim Params", "npusim Node", "npusim Kernel")
STATISTIC_COLUMNS = ("OP Type", "Core Type", "Count", "Total Time(us)", "Avg Time(us)", "Min Time(us)",
                     "Max Time(us)", "Ratio(%)")
_RATIOS = {"aic_cube_ratio": "AIC.M", "aic_mte1_ratio": "AIC.MTE1", "aic_mte2_ratio": "AIC.MTE2",
           "aic_fixpipe_ratio": "AIC.FIX", "aic_scalar_ratio": "AIC.S", "aiv_vec_ratio": "AIV.V",
           "aiv_mte2_ratio": "AIV.MTE2", "aiv_mte3_ratio": "AIV.MTE3"}
_TASK_TYPES = {"AIC": "AI_CORE", "AIV": "AI_VECTOR_CORE", "MIX": "MIX_AIC"}
STALLS = ("work", "data", "flag", "idle")
# what write_tables writes into its folder: the tables, and for a decoder step the step
# itself (STEP_FILE: what ran, for `npusim calibrate` to run it again)
TABLE_FILES = ("op_summary.csv", "op_statistic.csv", "npusim_step.json")
STEP_FILE = TABLE_FILES[2]


@frozen
class Stall:
    """One pipe's share of its kernel's core residency, in % (sums to 100;
    work + data is the pipe's busy share, its utilisation)."""

    pipe: str  # "AIC.MTE2", ...
    work: float
    data: float
    flag: float
    idle: float

    @property
    def busy(self) -> float:
        return self.work + self.data


def stalls(stats: KernelStats) -> list[Stall]:
    out = []
    for pipe in sorted(set(stats.busy_cycles) | set(stats.wait_cycles)):
        total = stats.core_cycles.get(pipe.split(".")[0], 0)
        if not total:
            continue
        data = stats.data_wait_cycles.get(pipe, 0.0)
        work = stats.busy_cycles.get(pipe, 0.0) - data
        flag = stats.wait_cycles.get(pipe, 0.0)
        shares = [100 * work / total, 100 * data / total, 100 * flag / total]
        out.append(Stall(pipe, *shares, 100 - sum(shares)))
    return out


def tensor_columns(inputs: Sequence, outputs: Sequence) -> dict[str, str]:
    """Input/Output Shapes, Data Types and Formats as msprof lists them ("8,4096;4096,4096",
    DT_FLOAT16, FRACTAL_NZ): ';' between tensors, ',' in a shape. Tensors: anything with
    shape, dtype and format (a graph's TensorSpec, a lowered op's TensorInfo)."""
    out = {}
    for side, specs in (("Input", inputs), ("Output", outputs)):
        values = (";".join(",".join(map(str, t.shape)) for t in specs), ";".join(MSPROF_DTYPES[t.dtype] for t in specs),
                  ";".join(MSPROF_FORMATS[t.format] for t in specs))
        out |= {f"{side} {col}": v for col, v in zip(_TENSOR_COLUMNS, values)}
    return out


def _node_tensors(graph) -> dict[str, tuple[list, list, str, dict]]:
    """(input specs, output specs, op type, params) of every node of `graph`, by node name."""
    if graph is None:
        return {}
    return {n.name: ([graph.tensors[t] for t in n.inputs.values()], [graph.tensors[t] for t in n.outputs.values()],
                     n.op_type, n.params) for n in graph.nodes}


def task_cycles(k: KernelRecord) -> float:
    """A task's duration as msprof's Task Duration holds it (see the module doc)."""
    return k.end - k.queued


def summary_rows(result: RunResult, graph=None, op: Lowered | None = None) -> list[dict]:
    """op_summary rows in start order; a kernel launched for a node of `graph` (its
    record's owner) lists that node's tensors and parameters, a kernel of `op` (npusim
    op) the op's. Task Start Time: the kernel reaching its stream's head; Task Wait
    Time: from the end of the previous task on the same stream to that."""
    hw = result.hw
    nodes = _node_tensors(graph)
    own = (op.inputs, op.outputs, op.op_type, attrs.asdict(op.params)) if op is not None else ((), (), "", {})
    rows, last_end = [], {}
    first_id = min((k.id for k in result.kernels), default=0)
    for k in sorted(result.kernels, key=lambda r: (r.start, r.id)):
        ins, outs, op_type, params = nodes.get(k.owner.node, ((), (), "", {})) if k.owner is not None else own
        index = k.owner.index if k.owner is not None else k.id - first_id  # its place among its op's kernels
        s = k.stats
        wait = k.queued - last_end.get(k.stream, k.queued)
        last_end[k.stream] = k.end
        row = {
            "Op Name": k.name, "OP Type": k.op_type, "Task Type": _TASK_TYPES.get(k.core_type, k.core_type),
            "Task Start Time(us)": hw.us(k.queued), "Task Duration(us)": hw.us(task_cycles(k)),
            "Task Wait Time(us)": hw.us(max(wait, 0.0)), "Block Dim": k.block_dim, **tensor_columns(ins, outs),
            "aicore_time(us)": hw.us(k.cycles), "total_cycles": k.cycles,
        }
        row |= {col: s.utilisation(pipe) for col, pipe in _RATIOS.items()}
        row |= {"FLOPs": s.flops, "GM Bytes": s.gm_bytes, "HBM Bytes": s.hbm_read_bytes + s.hbm_write_bytes,
                "L2 Hit Rate": s.l2_hit_rate, "Wasted Burst Bytes": s.wasted_burst_bytes, "Bound": bound_of(s, hw, k.cycles),
                "Stream": k.stream, "npusim Op": op_type, "npusim Params": json.dumps(params, sort_keys=True) if op_type else "",
                "npusim Node": k.owner.node if k.owner is not None else "", "npusim Kernel": index if op_type else ""}
        row |= {f"{st.pipe} {what}(%)": getattr(st, what) for st in stalls(s) for what in STALLS}
        rows.append(row)
    return rows


def statistic_rows(result: RunResult) -> list[dict]:
    """op_statistic rows: per (op type, core type), largest total first."""
    hw = result.hw
    groups: dict[tuple[str, str], list[KernelRecord]] = {}
    for k in result.kernels:
        groups.setdefault((k.op_type, _TASK_TYPES.get(k.core_type, k.core_type)), []).append(k)
    total = sum(hw.us(task_cycles(k)) for k in result.kernels) or 1.0
    rows = []
    for (op, core), ks in groups.items():
        times = [hw.us(task_cycles(k)) for k in ks]
        rows.append({"OP Type": op, "Core Type": core, "Count": len(ks), "Total Time(us)": sum(times),
                     "Avg Time(us)": sum(times) / len(ks), "Min Time(us)": min(times), "Max Time(us)": max(times),
                     "Ratio(%)": 100 * sum(times) / total})
    return sorted(rows, key=lambda r: (-r["Total Time(us)"], r["OP Type"]))


def write_csv(rows: Sequence[dict], path: str | Path, columns: Iterable[str]) -> Path:
    """Rows under `columns` first, then any further keys they have, in first-seen order."""
    columns = list(columns)
    for r in rows:
        columns += [k for k in r if k not in columns]
    path = Path(path)
    with atomic_write(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return path


def write_tables(result: RunResult, directory: str | Path, graph=None, op: Lowered | None = None,
                 step: dict | None = None) -> tuple[Path, ...]:
    """op_summary.csv and op_statistic.csv into `directory` (created); `graph`: the
    graph the kernels were launched for, or `op`: the one op they are (their tensors
    fill the shape columns); `step`: the decoder step that ran (run_decoder's arguments
    but the config), written as STEP_FILE."""
    d = Path(directory)  # created by atomic_write (an all_or_none block that fails removes it again)
    written = (write_csv(summary_rows(result, graph, op), d / TABLE_FILES[0], SUMMARY_COLUMNS + NPUSIM_COLUMNS),
               write_csv(statistic_rows(result), d / TABLE_FILES[1], STATISTIC_COLUMNS))
    if step is not None:
        with atomic_write(d / STEP_FILE) as f:
            json.dump(step, f, indent=1, sort_keys=True)
        written += (d / STEP_FILE,)
    else:  # the tables are no longer that step's
        (d / STEP_FILE).unlink(missing_ok=True)
    return written


def statistic_table(result: RunResult, top: int = 10) -> str:
    """The hotspot table for the console."""
    rows = statistic_rows(result)
    width = max([len(r["OP Type"]) for r in rows[:top]] + [len("OP Type")]) + 2
    lines = [f"  {'OP Type':{width}s}{'Core Type':>16s}{'Count':>7s}{'Total(us)':>13s}{'Avg(us)':>11s}"
             f"{'Min(us)':>11s}{'Max(us)':>11s}{'Ratio(%)':>10s}"]
    for r in rows[:top]:
        lines.append(f"  {r['OP Type']:{width}s}{r['Core Type']:>16s}{r['Count']:>7d}{r['Total Time(us)']:>13,.1f}"
                     f"{r['Avg Time(us)']:>11,.2f}{r['Min Time(us)']:>11,.2f}{r['Max Time(us)']:>11,.2f}"
                     f"{r['Ratio(%)']:>10.1f}")
    if len(rows) > top:
        rest = rows[top:]
        kernels = sum(r["Count"] for r in rest)
        lines.append(f"  ... and {len(rest)} more ({kernels} kernel{'s' * (kernels != 1)}, "
                     f"{sum(r['Total Time(us)'] for r in rest):,.1f} us, {sum(r['Ratio(%)'] for r in rest):.1f}%)")
    return "\n".join(lines)


__all__ = ["MSPROF_DTYPES", "MSPROF_FORMATS", "NPUSIM_COLUMNS", "STALLS", "STATISTIC_COLUMNS", "STEP_FILE", "SUMMARY_COLUMNS",
           "TABLE_FILES", "Stall", "stalls", "statistic_rows", "statistic_table", "summary_rows", "task_cycles",
           "tensor_columns",
           "write_csv", "write_tables"]
