"""Regression corpus: the engine's answers, recorded before it was made faster.

Cycles and every counter of a dozen operators (as `npusim op` runs them) and of
k3-tiny decode and prefill steps (baseline and optimized pipelines), against
tests/data/engine_regression.json: every number must stay within 0.5% of the
recording (an approximation may move a figure that little; the test prints the
largest difference, 0 today: every case is bit-identical). Recorded before the
speed work of issue 12 and again, on purpose, for issue 34's model changes (the
DMA's segment time overlapping the data, kernel start by kind, the calibrated
config, decode GEMVs without split K, GQA decode on the cube, a kernel's blocks beginning
on a clock edge). Blocks that share L2 lines,
which the engine now groups where that is exact, are checked against simulating
every block by itself.
A change that is meant to move results re-records the file on purpose:

    python tests/test_engine_regression.py --record
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import pytest

DATA = Path(__file__).parent / "data" / "engine_regression.json"

# (label, op type, params): the shapes a decoder step uses, plus the corner cases of
# the lowerings (split-K, W8A16, causal flash attention, strided layouts).
OPS = [
    ("matmul_decode", "matmul", {"m": "8", "n": "4096", "k": "4096", "trans_b": "true"}),
    ("matmul_square", "matmul", {"m": "1024", "n": "1024", "k": "1024"}),
    ("matmul_prefill", "matmul", {"m": "512", "n": "2048", "k": "1024", "trans_b": "true"}),
    ("matmul_split_k", "matmul", {"m": "16", "n": "256", "k": "8192"}),
    ("matmul_w8a16", "matmul", {"m": "8", "n": "4096", "k": "4096", "weight_dtype": "int8", "trans_b": "true"}),
    ("rms_norm", "rms_norm", {"shape": "8,4096"}),
    ("swiglu", "swiglu", {"shape": "8,16896"}),
    ("rope", "rope", {"shape": "8,32,128"}),
    ("decode_attention", "decode_attention", {"batch": "4", "context": "1024"}),
    ("decode_attention_paged", "decode_attention", {"batch": "2", "context": "512", "kv_layout": "paged"}),
    ("flash_attention", "flash_attention", {"seq_q": "512", "seq_kv": "512", "heads": "8", "kv_heads": "8", "causal": "true"}),
    ("kv_cache_write", "kv_cache_write", {"batch": "4", "context": "1024", "layers": "4"}),
    ("trans_data", "trans_data", {"shape": "1024,1024"}),
    ("copy", "copy", {"n": "1048576"}),
    ("argmax", "argmax", {"shape": "8,64000"}),
]

# (label, phase, batch, context, passes) of k3-tiny steps.
STEPS = [
    ("decode_baseline", "decode", 2, 64, "baseline"),
    ("decode_optimized", "decode", 2, 64, "optimized"),
    ("prefill_baseline", "prefill", 1, 64, "baseline"),
    ("prefill_optimized", "prefill", 1, 64, "optimized"),
]


def _kernel(k) -> dict:
    return {"name": k.name, "stream": k.stream, "queued": k.queued, "start": k.start, "end": k.end,
            "stats": attrs.asdict(k.stats)}


def _result(r) -> dict:
    return {"cycles": r.cycles, "host_launch_cycles": r.host_launch_cycles, "host_wait_cycles": r.host_wait_cycles,
            "kernels": [_kernel(k) for k in r.kernels]}


def op_case(op_type: str, params: dict) -> dict:
    from npusim.hw import load_hw
    from npusim.ops import lower, simulate_op

    hw = load_hw("ascend910b2")
    return _result(simulate_op(lower(op_type, params, hw), hw, trace="kernel").run)


def step_case(phase: str, batch: int, context: int, passes: str) -> dict:
    from npusim.runtime.decoder import run_decoder

    return _result(run_decoder("k3-tiny", "ascend910b2", phase, batch, context, passes).result)


def _roundtrip(value):
    """What the JSON file holds for `value` (tuples become lists; floats round-trip exactly)."""
    return json.loads(json.dumps(value))


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(DATA.read_text())


# how far any number may move from the recording (the new grouping's assumption, see the module doc)
TOLERANCE = 0.005


def _worst(recorded, got, path: str = "") -> tuple[float, str]:
    """The largest relative difference between two JSON values, and where."""
    if isinstance(recorded, dict):
        assert set(recorded) == set(got), path
        return max((_worst(recorded[k], got[k], f"{path}.{k}") for k in recorded), default=(0.0, path))
    if isinstance(recorded, list):
        assert len(recorded) == len(got), path
        return max((_worst(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(recorded, got))), default=(0.0, path))
    if isinstance(recorded, (int, float)) and not isinstance(recorded, bool):
        return (abs(got - recorded) / abs(recorded) if recorded else abs(got)), path
    assert recorded == got, path
    return 0.0, path


@pytest.mark.parametrize("label,op_type,params", OPS, ids=[c[0] for c in OPS])
def test_op_as_recorded(recorded, label, op_type, params):
    worst, where = _worst(recorded["ops"][label], _roundtrip(op_case(op_type, params)))
    print(f"\n{label}: largest difference {100 * worst:.4f}% ({where})")
    assert worst <= TOLERANCE, where


@pytest.mark.parametrize("label,phase,batch,context,passes", STEPS, ids=[c[0] for c in STEPS])
def test_step_as_recorded(recorded, label, phase, batch, context, passes):
    worst, where = _worst(recorded["steps"][label], _roundtrip(step_case(phase, batch, context, passes)))
    print(f"\n{label}: largest difference {100 * worst:.4f}% ({where})")
    assert worst <= TOLERANCE, where


# (label, op type, params) whose blocks share L2 lines: decode attention's (q and their
# partial results, the partials written: not grouped) and an LM-head GEMM's (every
# block reads the same A: grouped)
SHARING = [("decode_attention", "decode_attention", {"batch": "4", "context": "1024"}, False),
           ("lm_head", "matmul", {"m": "8", "n": "64000", "k": "4096", "trans_b": "true"}, True)]


@pytest.mark.parametrize("label,op_type,params,grouped", SHARING, ids=[c[0] for c in SHARING])
def test_blocks_sharing_lines_run_as_every_block_by_itself(label, op_type, params, grouped):
    """Grouped or not, blocks that share L2 lines give what every block simulated by
    itself gives, bit for bit. As in a decoder step, the op's first input has just
    been written (it is in the L2)."""
    from npusim.engine import Launch, Synchronize, run
    from npusim.hw import load_hw
    from npusim.ops import lower
    from npusim.ops.vector_kernels import fill_kernel

    hw = load_hw("ascend910b2")
    kernels = lower(op_type, params, hw).kernels
    first_input = next(t for k in kernels for t in k.gm if t.name in ("q", "a"))
    calls = [Launch(k, 0, "graph") for k in [fill_kernel("write_input", hw, first_input, 1.0, "fp16"), *kernels]]
    calls.append(Synchronize())
    sizes = []

    def count(device):
        transfer = device.memory.transfer
        device.memory.transfer = lambda addrs, *a: sizes.append(len(addrs)) or transfer(addrs, *a)

    run(calls[:1] + calls[-1:], hw, "kernel", on_device=count)  # the write alone: its transfers come first
    written = len(sizes)
    assert _result(run(calls, hw, "kernel", on_device=count)) == _result(run(calls, hw, "kernel", dedup=False))
    assert (max(sizes[2 * written:]) > 1) == grouped



def test_groups_whose_inputs_outgrow_the_l2_are_run_again_block_by_block():
    """The attention chain's vector kernels read scores the L2 (3 MiB here) holds only in
    part, and evicts as they run: members of a group come apart (one misses what another
    hits). The run is simulated again with those kernels' blocks one at a time, and gives
    what simulating every block by itself gives, bit for bit."""
    from npusim.engine import Launch, Synchronize, run
    from npusim.hw import load_hw
    from npusim.ops import lower

    hw = load_hw("ascend910b2", overrides={"l2.l2_bytes": 3 << 20})
    params = dict(heads=8, kv_heads=8, head_dim=64, seq_q=512, seq_kv=512, causal=True)
    calls = [Launch(k, 0, "graph") for k in lower("attention_unfused", params, hw).kernels] + [Synchronize()]
    attempts = []
    grouped = run(calls, hw, "kernel", on_device=attempts.append)
    assert len(attempts) > 1 and attempts[-1].lone_from is not None
    assert _result(grouped) == _result(run(calls, hw, "kernel", dedup=False))


def record() -> None:
    data = {"ops": {label: op_case(t, p) for label, t, p in OPS},
            "steps": {label: step_case(*args) for label, *args in STEPS}}
    DATA.parent.mkdir(exist_ok=True)
    tmp = DATA.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(DATA)
    print(f"recorded {len(OPS)} ops and {len(STEPS)} steps in {DATA}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(__doc__)
    record()
