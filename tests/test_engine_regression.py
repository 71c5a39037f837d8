"""Regression corpus: the engine's answers, recorded before it was made faster.

Cycles and every counter of a dozen operators (as `npusim op` runs them), of
k3-tiny decode and prefill steps (baseline and optimized pipelines) and the step
prices of k3-tiny serving points (decode, prefill, mixed: what the step-cost model
prices and caches), against tests/data/engine_regression.json: every number must
stay within 0.5% of the recording (an approximation may move a figure that little;
the test prints the largest difference, 0 today: every case is bit-identical).
The cases run on the hardware config the file was recorded on, a copy kept beside it
(tests/data/engine_regression_hw.yaml): re-fitting the shipped config moves no case,
as it moves no cache entry (configs are keyed by value).

The corpus also guards the cache: cached results are keyed on
npusim.model_version.MODEL_VERSION, not on the source (docs/cache.md), and the file
records the MODEL_VERSION (and serving.stepcost.POINT_SCHEME) it was recorded
under. A result that differs from the recording at all while those are unchanged
fails test_results_change_only_with_the_model_version: every user's cache would
read the old result back as the new model's. Recorded before the
speed work of issue 12 and again, on purpose, for issue 34's model changes (the
DMA's segment time overlapping the data, kernel start by kind, the calibrated
config, decode GEMVs without split K, GQA decode on the cube, a kernel's blocks beginning
on a clock edge). Blocks that share L2 lines,
which the engine now groups where that is exact, are checked against simulating
every block by itself.
A change that is meant to move results bumps MODEL_VERSION and re-records the file
on purpose (the script refuses to record changed results under the old number):

    python tests/test_engine_regression.py --record
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import attrs
import pytest

DATA = Path(__file__).parent / "data" / "engine_regression.json"
# the hardware config the corpus was recorded on: a copy, so that an edit to the shipped
# configs (configs are cache-keyed by value) does not move the engine's corpus
HW = str(Path(__file__).parent / "data" / "engine_regression_hw.yaml")

# (label, op type, params): the shapes a decoder step uses, plus the corner cases of
# the lowerings (split-K, W8A16, causal flash attention, strided layouts).
OPS = [
    ("matmul_decode", "matmul", {"m": "8", "n": "4096", "k": "4096", "trans_b": "true"}),
    ("matmul_square", "matmul", {"m": "1024", "n": "1024", "k": "1024"}),
    ("matmul_prefill", "matmul", {"m": "512", "n": "2048", "k": "1024", "trans_b": "true"}),
    ("matmul_split_k", "matmul", {"m": "16", "n": "256", "k": "8192"}),
    ("matmul_unaligned_k", "matmul", {"m": "512", "n": "1024", "k": "1040"}),  # A converted to NZ by the AIVs
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


# (label, passes, point): k3-tiny serving points, priced as the step-cost model prices
# (and caches) them: phase and shape as StepCost.point takes them
SERVING = [
    ("decode", "optimized", ("decode", 2, 64)),
    ("prefill", "optimized", ("prefill", 2, 64)),
    ("mixed", "optimized", ("mixed", 1, 1, 16, 64)),
    ("decode_buckets", "optimized,buckets", ("decode", 2, 512)),
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

    hw = load_hw(HW)
    return _result(simulate_op(lower(op_type, params, hw), hw, trace="kernel").run)


def step_case(phase: str, batch: int, context: int, passes: str) -> dict:
    from npusim.runtime.decoder import run_decoder

    return _result(run_decoder("k3-tiny", HW, phase, batch, context, passes).result)


def serving_case(passes: str, point: tuple) -> dict:
    from npusim.serving.stepcost import StepCost

    pt = StepCost("k3-tiny", HW, passes, max_batch=2).point(*point)
    return {"latency_us": pt.latency_us, "memory": attrs.asdict(pt.memory)}


def _roundtrip(value):
    """What the JSON file holds for `value` (tuples become lists; floats round-trip exactly)."""
    return json.loads(json.dumps(value))


# section of the corpus -> (label -> the arguments of its case, the function)
CASES = {"ops": ({label: (t, p) for label, t, p in OPS}, op_case),
         "steps": ({label: tuple(args) for label, *args in STEPS}, step_case),
         "serving": ({label: (passes, point) for label, passes, point in SERVING}, serving_case)}


@functools.cache
def fresh(section: str, label: str):
    """A case's result as npusim computes it now, as the file would hold it (run once per session)."""
    cases, run = CASES[section]
    return _roundtrip(run(*cases[label]))


def changed_results(recorded: dict, results) -> list[str]:
    """'section.label' of every recorded case whose result `results(section, label)` differs
    from the recording at all (the cache would serve the recording)."""
    return [f"{section}.{label}" for section, (cases, _) in CASES.items() for label in cases
            if label in recorded.get(section, {}) and results(section, label) != recorded[section][label]]


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
    worst, where = _worst(recorded["ops"][label], fresh("ops", label))
    print(f"\n{label}: largest difference {100 * worst:.4f}% ({where})")
    assert worst <= TOLERANCE, where


@pytest.mark.parametrize("label,phase,batch,context,passes", STEPS, ids=[c[0] for c in STEPS])
def test_step_as_recorded(recorded, label, phase, batch, context, passes):
    worst, where = _worst(recorded["steps"][label], fresh("steps", label))
    print(f"\n{label}: largest difference {100 * worst:.4f}% ({where})")
    assert worst <= TOLERANCE, where


@pytest.mark.parametrize("label,passes,point", SERVING, ids=[c[0] for c in SERVING])
def test_serving_point_as_recorded(recorded, label, passes, point):
    worst, where = _worst(recorded["serving"][label], fresh("serving", label))
    print(f"\n{label}: largest difference {100 * worst:.4f}% ({where})")
    assert worst <= TOLERANCE, where


def test_results_change_only_with_the_model_version(recorded):
    """The cache keys simulated steps, operators and serving points on MODEL_VERSION and
    their inputs, not on npusim's source (docs/cache.md): a result that moved while
    MODEL_VERSION stayed what the corpus was recorded under would be read back, stale,
    from every cache that holds it. Any difference counts, not only one past TOLERANCE."""
    from npusim.model_version import MODEL_VERSION
    from npusim.serving.stepcost import POINT_SCHEME

    was, now = (recorded["model_version"], recorded["point_scheme"]), (MODEL_VERSION, POINT_SCHEME)
    assert was == now, (f"the corpus was recorded under MODEL_VERSION {was[0]}, POINT_SCHEME {was[1]}; npusim is at "
                        f"{now[0]}, {now[1]}: re-record it (python tests/test_engine_regression.py --record)")
    changed = changed_results(recorded, fresh)
    serving_only = changed and all(c.startswith("serving.") for c in changed)
    or_scheme = " (or, if only what a serving point simulates changed, serving.stepcost.POINT_SCHEME)"
    assert not changed, (f"results changed: bump npusim.model_version.MODEL_VERSION and re-record "
                         f"(python tests/test_engine_regression.py --record){or_scheme if serving_only else ''}; "
                         f"changed since MODEL_VERSION {MODEL_VERSION} was recorded: {', '.join(changed)}")


def test_the_version_guard_sees_a_changed_result(recorded):
    """The guard above compares exactly: a result moved by far less than TOLERANCE, or a
    counter added to a kernel's stats, is a change."""
    moved = json.loads(json.dumps(recorded))
    moved["ops"]["copy"]["cycles"] += 1
    moved["steps"]["decode_optimized"]["kernels"][0]["stats"]["new_counter"] = 0
    assert changed_results(moved, lambda section, label: recorded[section][label]) == ["ops.copy",
                                                                                       "steps.decode_optimized"]


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
    assert grouped.kept_together == 0 and grouped.fast_forward_note() == ""


def test_a_fast_run_keeps_groups_that_come_apart_together():
    """exact=False (--fast-forward): the same chain runs once, its groups kept as one
    where they come apart (each waits for its slowest member's fill), and says so; the
    latency stays within 1% of the exact run's (benchmarks/bench_fastforward.py measures
    whole steps), and every member's bytes are counted: HBM traffic within 2%."""
    from npusim.engine import Launch, Synchronize, run
    from npusim.hw import load_hw
    from npusim.ops import lower

    hw = load_hw("ascend910b2", overrides={"l2.l2_bytes": 3 << 20})
    params = dict(heads=8, kv_heads=8, head_dim=64, seq_q=512, seq_kv=512, causal=True)
    calls = [Launch(k, 0, "graph") for k in lower("attention_unfused", params, hw).kernels] + [Synchronize()]
    attempts = []
    fast = run(calls, hw, "kernel", on_device=attempts.append, exact=False)
    exact = run(calls, hw, "kernel")
    assert len(attempts) == 1 and fast.kept_together > 0
    assert "kept as one after" in fast.fast_forward_note()
    assert fast.cycles != exact.cycles and abs(fast.cycles / exact.cycles - 1) < 0.01
    s, e = fast.stats, exact.stats
    assert abs(s.hbm_read_bytes / e.hbm_read_bytes - 1) < 0.02


@pytest.mark.parametrize("bumped", ["nothing", "POINT_SCHEME"])
def test_record_refuses_changed_results_under_the_same_model_version(recorded, tmp_path, monkeypatch, bumped):
    """Re-recording without the bump would make the corpus agree with results the caches
    hold under the same number; a POINT_SCHEME bump covers serving points, not an operator."""
    this = sys.modules[__name__]

    old = json.loads(json.dumps(recorded))
    old["ops"]["copy"]["cycles"] += 1
    if bumped == "POINT_SCHEME":
        old["point_scheme"] -= 1
    monkeypatch.setattr(this, "DATA", tmp_path / "corpus.json")
    this.DATA.write_text(json.dumps(old))
    with pytest.raises(SystemExit, match=r"results changed under MODEL_VERSION \d+.*\(ops.copy\): bump"):
        this.record()
    assert json.loads(this.DATA.read_text()) == old
    old["model_version"] -= 1  # recorded under an older model: re-recorded
    this.DATA.write_text(json.dumps(old))
    this.record()
    assert json.loads(this.DATA.read_text()) == recorded


def record() -> None:
    """Record every case under the current MODEL_VERSION and POINT_SCHEME; refused when a
    case recorded under the same numbers gives another result now (bump first)."""
    from npusim.model_version import MODEL_VERSION
    from npusim.serving.stepcost import POINT_SCHEME

    data = {"model_version": MODEL_VERSION, "point_scheme": POINT_SCHEME,
            **{section: {label: fresh(section, label) for label in cases} for section, (cases, _) in CASES.items()}}
    if DATA.exists():
        old = json.loads(DATA.read_text())
        # a serving point is keyed on both numbers, a step or an operator on MODEL_VERSION only
        same = old.get("model_version") == MODEL_VERSION
        changed = [c for c in changed_results(old, lambda section, label: data[section][label])
                   if same and (not c.startswith("serving.") or old.get("point_scheme") == POINT_SCHEME)]
        if changed:
            sys.exit(f"record: results changed under MODEL_VERSION {MODEL_VERSION}, the number they were recorded "
                     f"under ({', '.join(changed)}): bump npusim.model_version.MODEL_VERSION first (caches would "
                     f"serve the old results as the new model's)")
    DATA.parent.mkdir(exist_ok=True)
    tmp = DATA.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(DATA)
    print(f"recorded {len(OPS)} ops, {len(STEPS)} steps and {len(SERVING)} serving points under MODEL_VERSION "
          f"{MODEL_VERSION} in {DATA}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(__doc__)
    record()
