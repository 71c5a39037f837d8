"""npusim calibrate: the mapping table, the profile reader, and recovery of hidden
config values from a synthetic profile made by npusim itself (ground truth)."""

import functools
import time
from pathlib import Path

import numpy as np
import pytest

from calibrate_check import assert_recovered
from npusim.calibrate import calibrate
from npusim.calibrate.fields import fittable_fields
from npusim.calibrate.opmap import OPMAP, Unmappable, map_row
from npusim.calibrate.profile import read_profile
from npusim.calibrate.report import overall, to_json
from npusim.calibrate.synth import OpSpec, Tensor, _row, decoder_mix, synthetic_rows, write_profile
from npusim.calibrate.write import write_config
from npusim.hw import load_hw
from npusim.hw.load import read_yaml
from npusim.ops.registry import OPS

DATA = Path(__file__).resolve().parents[1] / "npusim" / "data" / "calibration"

# Hidden from the fit: three assumed fields moved by 24-40%. The decoder mix below
# identifies them: each kind of kernel pays its own start (the vector ops and the
# cube's), HBM efficiency sets the time of the ops heavy in bytes (the LM head, Cast,
# big GEMMs).
HIDDEN = {"hbm.bw_efficiency": 0.50, "runtime.kernel_start_aiv_cycles": 12600, "runtime.kernel_start_aic_cycles": 6500}
# Fitted but not claimed: the Mmad start-up (147 cycles as shipped) moves this mix's
# GEMMs, but at these shapes it is a fixed cost per cube kernel beside the kernel
# start, so the fit trades one for the other (hidden at 60 it comes back at 71-81);
# the public GEMMs of benchmarks/fidelity.py, from 1024^3 to 8192^3, pin it.
TRADED = ("aic.mmad_startup_cycles",)
# Not claimed: fields this mix does not pin to 10% (the calibration reports them as not
# fitted, with the reason): the DMA's time per segment (a transfer's segments overlap
# its data: these small shapes barely see them); cube, fixpipe and MTE1 start-ups and
# flag latencies move no op by 0.5% for a 20% change.


def test_every_table_entry_names_an_npusim_op():
    import npusim.ops  # noqa: F401  (registers the lowerings)

    assert len(OPMAP) >= 25
    for cann, (op, _) in OPMAP.items():
        assert op in OPS, f"{cann} -> {op}: not an npusim op"


def test_matmul_reads_m_n_k_and_a_linear_weight():
    spec = OpSpec("MatMulV2", (Tensor((8, 512)), Tensor((1536, 512))), (Tensor((8, 1536), "fp32"),))
    m = map_row(_row(spec, "x"))
    assert m.op == "matmul"
    assert dict(m.params) == dict(m=8, n=1536, k=512, dtype="fp16", out_dtype="fp32", trans_b=True)


def test_attention_and_rowwise_entries():
    q, kv = Tensor((2, 8, 1, 64)), Tensor((2, 2, 300, 64))
    m = map_row(_row(OpSpec("IncreFlashAttention", (q, kv, kv), (q,), "MIX_AIC"), "a"))
    assert (m.op, dict(m.params)) == ("decode_attention", dict(batch=2, heads=8, kv_heads=2, head_dim=64,
                                                               context=300, dtype="fp16"))
    m = map_row(_row(OpSpec("RmsNorm", (Tensor((2, 3, 512)), Tensor((512,))), (Tensor((2, 3, 512)),)), "r"))
    assert (m.op, dict(m.params)) == ("rms_norm", dict(shape=(6, 512), dtype="fp16"))


def _noted(spec: OpSpec, note: str):
    import attrs

    return attrs.evolve(_row(spec, "x"), note=note)


def test_reductions_read_their_dim_and_norms_their_weight():
    """A softmax runs along the dim its attributes give (CANN's SoftmaxV2 over a middle
    dim is another kernel than over the last); a norm over the dims its weight covers;
    ArgMax along another dim than the last is refused, not priced as the last."""
    x = Tensor((31, 67, 127, 257), "bf16")
    m = map_row(_noted(OpSpec("SoftmaxV2", (x,), (x,)), "F.softmax; attrs {dim: 2}"))
    assert (m.op, dict(m.params)) == ("softmax", dict(shape=x.shape, dtype="bf16", dim=-2))
    assert dict(map_row(_row(OpSpec("SoftmaxV2", (x,), (x,)), "s")).params)["dim"] == -1
    with pytest.raises(Unmappable, match="dim 4 is not a dim"):
        map_row(_noted(OpSpec("SoftmaxV2", (x,), (x,)), "attrs {dim: 4}"))
    with pytest.raises(Unmappable, match="only the last dim"):
        map_row(_noted(OpSpec("ArgMaxV2", (x,), (Tensor((31, 67, 257), "int32"),)), "attrs {dim: 2}"))
    norm = OpSpec("LayerNorm", (Tensor((4, 8, 512)), Tensor((8, 512)), Tensor((8, 512))), (Tensor((4, 8, 512)),))
    assert dict(map_row(_row(norm, "n")).params)["shape"] == (4, 4096)
    add_norm = OpSpec("AddRmsNorm", (Tensor((4, 8, 512)), Tensor((4, 8, 512)), Tensor((512,))), (Tensor((4, 8, 512)),))
    assert dict(map_row(_row(add_norm, "a")).params)["shape"] == (32, 512)
    with pytest.raises(Unmappable, match="not x's trailing dims"):
        map_row(_row(OpSpec("RmsNorm", (Tensor((4, 8, 512)), Tensor((8,))), (Tensor((4, 8, 512)),)), "r"))


@pytest.mark.parametrize("spec, reason", [
    (OpSpec("IncreFlashAttention", (Tensor((2, 1, 512)), Tensor((2, 300, 512))), (Tensor((2, 1, 512)),)), "BSH"),
    (OpSpec("Add", (Tensor((8, 512)), Tensor((1, 512))), (Tensor((8, 512)),)), "broadcast"),
    (OpSpec("Conv2D", (Tensor((1, 3, 8, 8)),), (Tensor((1, 3, 8, 8)),)), "not in the mapping table"),
    (OpSpec("MatMulV2", (Tensor((8, 512)),), (Tensor((8, 8)),), "AI_CPU"), "task type AI_CPU"),
])
def test_unmappable_rows_say_why(spec, reason):
    with pytest.raises(Unmappable, match=reason):
        map_row(_row(spec, "x"))


def test_fittable_fields_are_assumed_costs_only():
    fields = fittable_fields("ascend910b2")
    assert {"hbm.bw_efficiency", "dma.startup_cycles", "runtime.kernel_start_aiv_cycles"} <= set(fields)
    assert all("assumed" in c for c in fields.values())
    assert "l2.ways" not in fields  # assumed, but a structure, not a cost
    assert "chip.freq_hz" not in fields and "hbm.peak_bw_bytes_per_s" not in fields  # sourced
    # host-side: in neither a kernel's duration nor a collective's device time
    assert not any(f.startswith("runtime.") and f.endswith("_us") for f in fields)
    assert {"topology.link_latency_us", "topology.nic_latency_us"} <= set(fields)  # device-side: every step pays them


def test_the_gemm_example_csv_is_the_shared_measurements():
    points = read_yaml(DATA / "ascend910b.yaml")["gemm_fp16_in_fp32_out"]["points"]
    rows = read_profile(DATA / "gemm_op_summary.csv")
    assert [(r.input_shapes, r.duration_us) for r in rows] == [
        (((p["m"], p["k"]), (p["k"], p["n"])), p["time_us"]) for p in points]
    assert all(dict(map_row(r).params)["out_dtype"] == "fp32" for r in rows)


@pytest.fixture(scope="module")
def recovered(tmp_path_factory):
    """Calibrate the default config on a profile timed with the hidden values (+-3% noise)."""
    folder = tmp_path_factory.mktemp("prof")
    specs = decoder_mix(decode_batches=(1, 4, 16), prompts=(128, 256))
    rows = synthetic_rows(specs, load_hw("ascend910b2", HIDDEN), repeats=4, noise=0.03, seed=7)
    write_profile(rows, folder / "PROF_0" / "op_summary_0_1.csv")
    return calibrate(folder, "ascend910b2"), folder


def test_recovers_the_hidden_values_within_10_percent(recovered):
    assert_recovered(recovered[0], HIDDEN, free=TRADED)


def test_held_out_error_is_under_3_percent(recovered):
    cal, _ = recovered
    e = overall(cal)
    assert e["before"]["median"] > 0.15  # the hidden config is really different
    assert e["held_out"]["median"] < 0.03
    assert not np.isnan(cal.held_out_us).any()
    assert cal.folds == 5
    reasons = {e.field: e.reason for e in cal.excluded}
    assert "moves no op" in reasons["aic.fixpipe_startup_cycles"]


def test_worker_processes_give_what_one_process_gives(tmp_path):
    """--jobs: the ops a trial config has not met are simulated in worker processes; the
    fit, every row's errors and the simulations counted are one process's, bit for bit."""
    specs = decoder_mix(decode_batches=(1,), prompts=())
    rows = synthetic_rows(specs, load_hw("ascend910b2", HIDDEN), repeats=1, noise=0.03, seed=7)
    write_profile(rows, tmp_path / "PROF_0" / "op_summary_0_1.csv")
    fields = ["hbm.bw_efficiency", "runtime.kernel_start_aiv_cycles"]
    one, two = (calibrate(tmp_path, "ascend910b2", fields, folds=2, jobs=jobs) for jobs in (1, 2))
    assert one.fields and two.fields == one.fields
    for name in ("before_us", "after_us", "held_out_us"):
        assert np.array_equal(getattr(two, name), getattr(one, name), equal_nan=True), name
    assert two.simulations == one.simulations


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_trial_stops_at_the_first_op_that_fails(jobs, tmp_path, monkeypatch):
    """Model.log_times simulated every op the trial had not met before raising the first
    error: with thousands of ops, minutes of simulation whose times were thrown away. It
    now stops there, with the error and the simulations remembered one process's, however
    many --jobs."""
    import npusim.calibrate.model as model_module
    from npusim.calibrate.model import Model
    from npusim.errors import ConfigError

    ran = tmp_path / "ran"  # a file: the workers' simulations are counted too

    def op_time_us(key, hw):
        with open(ran, "a") as f:
            f.write(f"{key[0]}\n")
        if key[0] in ("op3", "op5"):
            raise ConfigError(f"{key[0]} does not simulate")
        time.sleep(0.1)  # the others take a while: a worker's failure is back before many more end
        return 1.0 + int(key[0][2:])

    monkeypatch.setattr(model_module, "op_time_us", op_time_us)
    keys = [(f"op{i}", (), (), "kernel", None) for i in range(12)]
    model = Model(load_hw("ascend910b2"), [], jobs=jobs)
    with pytest.raises(ConfigError, match="^op3 does not simulate$"):
        model.log_times(np.zeros(0), keys)
    simulated = ran.read_text().split()
    if jobs == 1:
        assert simulated == ["op0", "op1", "op2", "op3"]
    else:  # those already given to a worker end; how many more the other worker ends before the
        # failure is back is the machine's timing: far fewer than all of them
        assert set(simulated) >= {"op0", "op3"} and len(simulated) < len(keys) - 2
    assert model.simulations == 3  # op0 .. op2 remembered, as by one process
    assert set(model.failures(keys)) == {keys[3], keys[5]}  # failures still names every op that fails


def test_unmapped_rows_are_counted_and_listed(recovered):
    cal, _ = recovered
    counts = {u.op_type: u.count for u in cal.unmapped}
    assert counts == {"HcomAllReduce": 4, "ZerosLike": 4}
    assert cal.rows_read == len(cal.mapped) + 8
    data = to_json(cal)
    assert [u["op_type"] for u in data["unmapped"]] == ["HcomAllReduce", "ZerosLike"]
    assert len(data["rows"]) == len(cal.mapped)


def test_the_written_config_is_a_variant_that_loads(recovered, tmp_path):
    cal, _ = recovered
    path = write_config(cal, tmp_path / "my910b.yaml")
    text = path.read_text()
    assert "base: ascend910b2" in text
    hw = load_hw(path)
    assert hw.name == "my910b"
    for f in cal.fields:  # a nested field too (aiv.vector_cycles_per_repeat.reduce_sum: a dict's key)
        *parents, key = f.field.split(".")
        node = functools.reduce(getattr, parents, hw)
        assert (node[key] if isinstance(node, dict) else getattr(node, key)) == f.after
        line = next(line for line in text.splitlines() if line.strip().startswith(key + ":"))
        assert "# assumed; fitted from" in line and "median error" in line
    # a calibrated config can be calibrated again: its fitted fields stay "assumed"
    assert set(fittable_fields(path)) >= {f.field for f in cal.fields}


def test_the_command_writes_config_json_and_plot_and_run_uses_the_config(tmp_path, capsys, monkeypatch):
    """End to end on a tiny vector-op profile: `npusim calibrate` then `npusim run --hw` the result."""
    import json

    from npusim.cli import main

    x = Tensor((16, 512))
    specs = [OpSpec("RmsNorm", (Tensor((n, 512)), Tensor((512,))), (Tensor((n, 512)),), "AI_VECTOR_CORE")
             for n in (1, 64, 256)] + [OpSpec("Add", (x, x), (x,), "AI_VECTOR_CORE")]
    write_profile(synthetic_rows(specs, load_hw("ascend910b2", {"runtime.kernel_start_aiv_cycles": 7000}), repeats=3),
                  tmp_path / "op_summary.csv")
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "--profile", "op_summary.csv", "--out", "mine.yaml", "--json", "c.json",
                 "--plot", "plots", "--folds", "2"]) == 0
    out = capsys.readouterr().out
    shipped = load_hw("ascend910b2").runtime.kernel_start_aiv_cycles
    assert f"runtime.kernel_start_aiv_cycles  {shipped} -> " in out and "held-out median" in out
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["rows_mapped"] == 12 and data["folds"] == 2
    assert [f["field"] for f in data["fields"]] == ["runtime.kernel_start_aiv_cycles"]
    assert abs(data["fields"][0]["after"] / 7000 - 1) < 0.05
    assert (tmp_path / "plots" / "calibration.png").stat().st_size > 0
    assert main(["run", "--hw", "mine.yaml", "--workload", "k3-tiny", "--batch", "2", "--context", "64"]) == 0
    assert "k3-tiny decode on mine" in capsys.readouterr().out


# ops as `npusim op` takes them, each lowered to one kernel (npusim's op_summary lists
# kernels; a row of a many-kernel op is refused, see the last case)
ROUND_TRIP = [("matmul", ["m=8", "n=512", "k=256", "trans_b=true", "out_dtype=fp32", "format_b=NZ", "bias=true"]),
              ("matmul", ["m=64", "n=256", "k=128"]), ("batch_matmul", ["batch=4", "m=32", "n=64", "k=128"]),
              ("rms_norm", ["shape=16,512"]), ("add_rms_norm", ["shape=4,256"]), ("cast", ["shape=8,256"]),
              ("trans_data", ["shape=64,128"]), ("swiglu", ["shape=8,512"]), ("rope", ["shape=4,8,64"]),
              ("softmax", ["shape=8,1000"]), ("softmax", ["shape=4,300,20", "dim=1"])]


def test_npusim_op_profile_feeds_calibrate_and_maps_back_to_the_same_op(tmp_path, capsys, monkeypatch):
    """`npusim op ... --profile DIR` fills msprof's tensor columns from the lowered op;
    `npusim calibrate --profile` maps every row of them back to the op it came from."""
    import csv
    import json

    from npusim.cli import main
    from npusim.ops.registry import lower

    monkeypatch.chdir(tmp_path)
    for i, (op, params) in enumerate(ROUND_TRIP):
        assert main(["op", op, *params, "--profile", f"prof/{i}"]) == 0
    with open(tmp_path / "prof" / "0" / "op_summary.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert (row["Input Shapes"], row["Input Data Types"], row["Input Formats"]) == (
        "8,256;512,256;512", "DT_FLOAT16;DT_FLOAT16;DT_FLOAT", "ND;FRACTAL_NZ;ND")
    assert (row["Output Shapes"], row["Output Data Types"], row["Output Formats"]) == ("8,512", "DT_FLOAT", "ND")
    capsys.readouterr()
    assert main(["calibrate", "--profile", "prof", "--fields", "runtime.kernel_start_aiv_cycles", "--out", "my.yaml",
                 "--json", "c.json", "--folds", "2"]) == 0
    assert f"{len(ROUND_TRIP)} rows read, {len(ROUND_TRIP)} mapped" in capsys.readouterr().out
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["unmapped"] == [] and data["rows_mapped"] == len(ROUND_TRIP)
    hw = load_hw("ascend910b2")
    rows = {int(Path(r["file"]).parent.name): r for r in data["rows"]}
    for i, (op, params) in enumerate(ROUND_TRIP):
        mapped = map_row(read_profile(rows[i]["file"])[0])
        assert mapped.op == op
        wanted = lower(op, dict(p.split("=") for p in params), hw).params
        assert lower(mapped.op, dict(mapped.params), hw).params == wanted, (op, mapped.params)


def test_each_kernel_of_a_many_kernel_npusim_op_is_timed_as_that_kernel(tmp_path, capsys, monkeypatch):
    """npusim's op_summary lists kernels, naming the op each came from, its parameters
    and its place among the op's kernels: calibrate times each row as that kernel, so on
    the config that wrote the profile every row is reproduced."""
    import json

    from npusim.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["op", "decode_attention", "batch=1", "heads=4", "kv_heads=4", "head_dim=64", "context=256",
                 "--profile", "prof"]) == 0
    assert main(["op", "rms_norm", "shape=16,512", "--profile", "prof/norm"]) == 0
    capsys.readouterr()
    assert main(["calibrate", "--profile", "prof", "--out", "my.yaml", "--folds", "2", "--json", "c.json"]) == 0
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["unmapped"] == [] and data["rows_mapped"] == 3  # the attention's two kernels, the norm's one
    assert {r["op_type"] for r in data["rows"]} == {"decode_attention", "decode_attention_combine", "rms_norm"}
    assert all(abs(r["before_us"] / r["measured_us"] - 1) < 1e-3 for r in data["rows"])

def test_a_nested_fitted_field_is_written_nested():
    """A fitted cost factor (aiv.vector_cycles_per_repeat.mul) is written under its dict,
    not as a dotted key the loader refuses."""
    import yaml

    from npusim.calibrate.write import _yaml_lines

    tree = {"aiv": {"vector_startup_cycles": "80.5   # fitted", "vector_cycles_per_repeat": {"mul": "1.5   # fitted"}}}
    assert yaml.safe_load("\n".join(_yaml_lines(tree))) == {
        "aiv": {"vector_startup_cycles": 80.5, "vector_cycles_per_repeat": {"mul": 1.5}}}
