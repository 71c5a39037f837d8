"""Synthetic measurements made by npusim itself: msprof profiles of a mix of decoder ops
in CANN's terms, timed on a given (possibly hidden) config through the same mapping
table and simulation calibration uses, and hccl_test output of collectives; both with
seeded multiplicative noise. Ground truth for the recovery tests and the speed benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
from attrs import frozen

from npusim.calibrate.model import op_time_us
from npusim.calibrate.opmap import Unmappable, map_row
from npusim.calibrate.profile import ProfileRow
from npusim.errors import NpusimError
from npusim.hw import HwConfig
from npusim.ops.collectives.command import hccl_test_output
from npusim.ops.collectives.simulate import simulate_collective
from npusim.report.tables import MSPROF_DTYPES, MSPROF_FORMATS, SUMMARY_COLUMNS, write_csv

# the op_summary columns a synthetic profile fills: msprof's, up to the output formats
COLUMNS = SUMMARY_COLUMNS[:SUMMARY_COLUMNS.index("Output Formats") + 1]


@frozen
class Tensor:
    shape: tuple[int, ...]
    dtype: str = "fp16"  # npusim's names (fp16, fp32, ...), written as msprof's
    format: str = "ND"  # npusim's (ND, NZ), written as msprof's


@frozen
class OpSpec:
    """One op as msprof lists it."""

    op_type: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    task_type: str = "AI_CORE"


def _row(spec: OpSpec, name: str) -> ProfileRow:
    return ProfileRow(file="<synthetic>", line=0, op_name=name, op_type=spec.op_type, task_type=spec.task_type,
                      duration_us=1.0, block_dim="", input_shapes=tuple(t.shape for t in spec.inputs),
                      input_dtypes=tuple(MSPROF_DTYPES[t.dtype] for t in spec.inputs),
                      input_formats=tuple(MSPROF_FORMATS[t.format] for t in spec.inputs),
                      output_shapes=tuple(t.shape for t in spec.outputs),
                      output_dtypes=tuple(MSPROF_DTYPES[t.dtype] for t in spec.outputs),
                      output_formats=tuple(MSPROF_FORMATS[t.format] for t in spec.outputs))


def decoder_mix(hidden: int = 512, heads: int = 8, kv_heads: int = 8, ffn: int = 1408, vocab: int = 8000,
                decode_batches: Sequence[int] = (1, 4, 16), context: int = 512,
                prompts: Sequence[int] = (128, 256)) -> list[OpSpec]:
    """The ops of one decoder layer plus the LM head, in CANN's names, for decode steps of
    each batch size (one new token per sequence over `context` cached tokens) and
    prefills of each prompt length. Small shapes: each simulates in milliseconds."""
    d = hidden // heads
    specs = []
    steps = [(b, b, "decode") for b in decode_batches] + [(p, 1, "prefill") for p in prompts]
    for tokens, batch, phase in steps:
        x = Tensor((tokens, hidden))

        def linear(n_out: int, k: int) -> OpSpec:
            return OpSpec("MatMulV2", (Tensor((tokens, k)), Tensor((n_out, k))), (Tensor((tokens, n_out)),))

        specs += [OpSpec("RmsNorm", (x, Tensor((hidden,))), (x,), "AI_VECTOR_CORE"),
                  linear((heads + 2 * kv_heads) * d, hidden)]
        seq = 1 if phase == "decode" else tokens
        q = Tensor((batch, seq, heads, d))
        specs.append(OpSpec("RotaryMul", (q, Tensor((1, seq, 1, d)), Tensor((1, seq, 1, d))), (q,), "AI_VECTOR_CORE"))
        if phase == "decode":
            kv = Tensor((batch, kv_heads, context, d))
            specs.append(OpSpec("IncreFlashAttention", (Tensor((batch, heads, 1, d)), kv, kv),
                                (Tensor((batch, heads, 1, d)),), "MIX_AIC"))
        else:
            qb, kv = Tensor((1, heads, seq, d)), Tensor((1, kv_heads, seq, d))
            specs.append(OpSpec("PromptFlashAttention", (qb, kv, kv), (qb,), "MIX_AIC"))
        specs += [linear(hidden, heads * d),
                  OpSpec("AddRmsNorm", (x, x, Tensor((hidden,))), (x, x), "AI_VECTOR_CORE"),
                  linear(2 * ffn, hidden),
                  OpSpec("Swiglu", (Tensor((tokens, 2 * ffn)),), (Tensor((tokens, ffn)),), "AI_VECTOR_CORE"),
                  linear(hidden, ffn),
                  OpSpec("Add", (x, x), (x,), "AI_VECTOR_CORE")]
        last = Tensor((batch, hidden))
        specs += [OpSpec("MatMulV2", (last, Tensor((vocab, hidden))), (Tensor((batch, vocab)),)),
                  OpSpec("Cast", (Tensor((batch, vocab)),), (Tensor((batch, vocab), "fp32"),), "AI_VECTOR_CORE")]
    # rows a real profile has that npusim does not simulate: counted, never fitted
    specs += [OpSpec("HcomAllReduce", (Tensor((16, hidden)),), (Tensor((16, hidden)),), "HCCL"),
              OpSpec("ZerosLike", (Tensor((16, hidden)),), (Tensor((16, hidden)),), "AI_VECTOR_CORE")]
    return specs


def synthetic_rows(specs: Sequence[OpSpec], hw: HwConfig, repeats: int = 1, noise: float = 0.03,
                   seed: int = 0) -> list[dict]:
    """op_summary rows of `specs`, each `repeats` times, timed on `hw` and multiplied by a
    seeded uniform factor in [1 - noise, 1 + noise]. Rows the mapping table does not
    map get a fixed time (they are not simulated)."""
    rng = np.random.default_rng(seed)
    times = {}
    rows = []
    for r in range(repeats):
        for i, spec in enumerate(specs):
            row = _row(spec, f"{spec.op_type}_{i}")
            if i not in times:
                try:
                    times[i] = op_time_us(map_row(row).key, hw)
                except (Unmappable, NpusimError):  # not simulated: its time is never compared
                    times[i] = 10.0
            us = times[i] * (1 + rng.uniform(-noise, noise))
            rows.append({"Op Name": f"{row.op_name}_{r}", "OP Type": spec.op_type, "Task Type": spec.task_type,
                         "Task Start Time(us)": "", "Task Duration(us)": us, "Task Wait Time(us)": "",
                         "Block Dim": "", "Input Shapes": _shapes(row.input_shapes),
                         "Input Data Types": ";".join(row.input_dtypes), "Input Formats": ";".join(row.input_formats),
                         "Output Shapes": _shapes(row.output_shapes), "Output Data Types": ";".join(row.output_dtypes),
                         "Output Formats": ";".join(row.output_formats)})
    return rows


def _shapes(shapes) -> str:
    return ";".join(",".join(map(str, s)) for s in shapes)


def write_profile(rows: Sequence[dict], path: str | Path) -> Path:
    return write_csv(rows, path, COLUMNS)


def synthetic_hccl(kind: str, sizes: Sequence[int], devices: int, hw: HwConfig, noise: float = 0.03, seed: int = 0,
                   dtype: str = "fp16") -> tuple[str, str]:
    """(file name, text) of hccl_test output for `kind` on `devices` ranks at each of
    `sizes`, timed on `hw` and multiplied by a seeded uniform factor in [1 - noise, 1 + noise]."""
    rng = np.random.default_rng(seed)
    reports = [simulate_collective(kind, n, devices, hw, dtype=dtype) for n in sizes]
    return hccl_test_output([attrs.evolve(r, us=r.us * (1 + rng.uniform(-noise, noise))) for r in reports], hw)
