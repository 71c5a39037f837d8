"""npusim calibrate --hccl: reading hccl_test's output, mapping its rows to npusim's
collectives, npusim's own hccl_test files read back exactly, and recovery of hidden
topology values from hccl_test output made by npusim itself (ground truth)."""

from pathlib import Path

import numpy as np
import pytest

from calibrate_check import assert_recovered
from npusim.calibrate import calibrate
from npusim.calibrate.hccl import map_hccl, read_hccl
from npusim.calibrate.model import op_time_us
from npusim.calibrate.opmap import Unmappable
from npusim.calibrate.report import overall
from npusim.calibrate.synth import decoder_mix, synthetic_hccl, synthetic_rows, write_profile
from npusim.hw import load_hw
from npusim.ops.collectives import KINDS
from npusim.ops.collectives.hccl_test import TESTS

HW = load_hw("ascend910b2")

# the CANN guide's layout (its spelling avg_time, the tool's first line, a shell prompt
# before the command); the times are made up
GUIDE = """\
# mpirun -n 8 ./bin/all_reduce_test -b 8K -e 32K -f 2 -d fp32 -o sum -p 8
the minbytes is 8192, maxbytes is 32768, iters is 20, warmup_iters is 5
data_size(Bytes): |   avg_time(us): | alg_bandwidth(GB/s): | check_result:
8192              |     30.50    |       0.25014        | success
local rank_id 3, check result failed, 16384             | 31.00          | 0.49221              | failed
16384             |     31.00    |       0.49221        | failed
32768             |     33.25    |       0.91782        | success
"""
# the binary's spelling, no command line: the options say what ran
BINARY = """\
data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:
1048576           | 12.00          | 81.38021             | NULL
"""


def test_reads_the_guide_layout_with_its_command_line(tmp_path):
    (tmp_path / "ar.txt").write_text(GUIDE)
    rows = read_hccl(tmp_path / "ar.txt")
    assert [(r.line, r.nbytes, r.duration_us, r.check) for r in rows] == [
        (4, 8192, 30.5, "success"), (6, 16384, 31.0, "failed"), (7, 32768, 33.25, "success")]
    assert {(r.test, r.devices, r.dtype, r.npus_per_node) for r in rows} == {("all_reduce_test", 8, "fp32", 8)}
    assert rows[0].where.endswith("ar.txt: row 4") and rows[0].op_type == "all_reduce_test (8 ranks)"
    m = map_hccl(rows[0], HW)
    assert (m.op, dict(m.params)) == ("all_reduce", dict(bytes=8192, devices=8, dtype="fp32"))
    with pytest.raises(Unmappable, match="check_result failed"):
        map_hccl(rows[1], HW)


def test_options_say_what_ran_when_the_file_does_not(tmp_path):
    (tmp_path / "ag.txt").write_text(BINARY)
    (row,) = read_hccl(tmp_path / "ag.txt", {"op": "all_gather", "devices": "4", "dtype": "bf16"})
    m = map_hccl(row, HW)
    assert (m.op, dict(m.params)) == ("all_gather", dict(bytes=1 << 20, devices=4, dtype="bf16"))
    assert row.dtype == "bfp16" and row.check == "NULL"
    (row,) = read_hccl(tmp_path / "ag.txt", {"op": "alltoall_test", "devices": "8"})  # the test's own name
    assert (map_hccl(row, HW).op, row.dtype) == ("all_to_all", "fp32")  # hccl_test's default -d


def test_a_table_without_pipes_is_read_by_its_column_names(tmp_path):
    (tmp_path / "rs.txt").write_text("mpirun -n 8 ./bin/reduce_scatter_test -b 64K -e 64K -d fp16\n"
                                     "data_size      avg_time(us)    alg_bandwidth(GB/s)    check_result\n"
                                     "65536          8.50            0.00718                success\n")
    (row,) = read_hccl(tmp_path / "rs.txt")
    assert (row.test, row.nbytes, row.duration_us, row.dtype, row.line) == (
        "reduce_scatter_test", 65536, 8.5, "fp16", 3)


@pytest.mark.parametrize("command, reason", [
    ("mpirun -n 8 ./bin/broadcast_test -b 1M -e 1M", "broadcast_test is not simulated"),
    ("mpirun -n 8 ./bin/all_reduce_test -b 1M -e 1M -d int8", "dtype int8"),
    ("mpirun -n 8 ./bin/all_reduce_test -b 1M -e 1M -p 4", r"servers of 4 NPUs \(-p 4\).*has 8 per server"),
])
def test_rows_npusim_cannot_simulate_say_why(command, reason, tmp_path):
    (tmp_path / "x.txt").write_text(command + "\n" + BINARY)
    (row,) = read_hccl(tmp_path / "x.txt")
    with pytest.raises(Unmappable, match=reason):
        map_hccl(row, HW)


def test_four_ranks_of_an_eight_card_server_are_one_node(tmp_path):
    (tmp_path / "x.txt").write_text("mpirun -np 4 ./bin/reduce_scatter_test -b 1M -e 1M -p 4 -n 20\n" + BINARY)
    (row,) = read_hccl(tmp_path / "x.txt")  # hccl_test's own -n (iterations) is not mpirun's
    assert dict(map_hccl(row, HW).params)["devices"] == 4


@pytest.mark.parametrize("kind", [k for k in KINDS if k in TESTS])
def test_npusim_op_profile_is_read_back_as_what_it_simulated(kind, tmp_path, capsys, monkeypatch):
    """`npusim op KIND --profile DIR` writes hccl_test's layout; reading it back maps each
    row to the same collective, whose simulated time is the time written (to its 0.01 us)."""
    from npusim.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["op", kind, "bytes=8KiB..256KiB", "devices=8", "dtype=fp32", "--profile", "prof"]) == 0
    assert f"prof/{ {'all_to_all': 'alltoall'}.get(kind, kind)}_test.txt" in capsys.readouterr().out
    (path,) = (tmp_path / "prof").iterdir()
    rows = read_hccl(path)
    assert [r.nbytes for r in rows] == [8192 << i for i in range(6)]
    for r in rows:
        m = map_hccl(r, HW)
        assert m.op == kind and dict(m.params)["dtype"] == "fp32"
        assert op_time_us(m.key, HW) == pytest.approx(r.duration_us, abs=0.005)


# Hidden from the fit: the four assumed topology fields, moved by 28-50%. The 8-rank
# runs (one server, Mesh) identify the HCCS link's bandwidth and start-up; the 16-rank
# ones (two servers, Ring at the NIC's pace) the NIC's - each to the 5% a fitted field
# must be pinned to, from 1 KiB (start-up bound) to 4 MiB (bandwidth bound).
HIDDEN = {"topology.link_bw_bytes_per_s": 4.0e10, "topology.link_latency_us": 3.0,
          "topology.nic_bw_bytes_per_s": 1.8e10, "topology.nic_latency_us": 13.0}
RUNS = (("all_reduce", 8), ("all_gather", 8), ("reduce_scatter", 8), ("all_reduce", 16), ("all_gather", 16))


@pytest.fixture(scope="module")
def recovered(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hccl")
    hidden = load_hw("ascend910b2", HIDDEN)
    sizes = [1 << 10 << i for i in range(13)]  # 1 KiB .. 4 MiB
    files = []
    for seed, (kind, devices) in enumerate(RUNS):
        name, text = synthetic_hccl(kind, sizes, devices, hidden, noise=0.03, seed=seed)
        files.append(folder / f"{devices}_{name}")
        files[-1].write_text(text)
    return calibrate(None, "ascend910b2", hccl=files)


def test_recovers_the_hidden_topology_within_10_percent(recovered):
    assert_recovered(recovered, HIDDEN)


def test_hccl_held_out_error_is_under_3_percent(recovered):
    e = overall(recovered)
    assert e["before"]["median"] > 0.15  # the hidden topology is really different
    assert e["held_out"]["median"] < 0.03
    assert not np.isnan(recovered.held_out_us).any()


def test_op_summary_and_hccl_rows_fit_together(tmp_path):
    """An 8-rank all_reduce alone cannot tell the link's start-up from the kernel start
    (every size pays both once per step); a profile of kernels pins the kernel start,
    and the two together recover both."""
    hidden = {"topology.link_latency_us": 3.0, "runtime.kernel_start_aiv_cycles": 12000}
    hw = load_hw("ascend910b2", hidden)
    name, text = synthetic_hccl("all_reduce", [8 << 10 << i for i in range(8)], 8, hw, seed=1)
    (tmp_path / name).write_text(text)
    specs = [s for s in decoder_mix(decode_batches=(1,), prompts=()) if s.op_type in ("RmsNorm", "Add", "Swiglu")]
    write_profile(synthetic_rows(specs, hw, repeats=2, seed=2), tmp_path / "op_summary.csv")
    fields = ["runtime.kernel_start_aiv_cycles", "topology.link_latency_us", "topology.link_bw_bytes_per_s"]
    alone = calibrate(None, "ascend910b2", fields, hccl=[tmp_path / name])
    assert any("mimicked" in e.reason for e in alone.excluded), alone.excluded
    both = calibrate(tmp_path / "op_summary.csv", "ascend910b2", fields, hccl=[tmp_path / name])
    assert_recovered(both, hidden)
    assert {"RmsNorm", "all_reduce_test (8 ranks)"} <= {m.row.op_type for m in both.mapped}


def test_the_readme_hccl_example_prints_what_the_readme_shows(tmp_path, capsys, monkeypatch):
    """The README's worked hccl_test example, in order in one folder: its `npusim op`
    commands write the files, its `npusim calibrate` prints what the README shows."""
    import shlex

    from npusim.cli import main
    from test_readme import _blocks, _shown

    ((command, shown),) = [s for s in _shown() if s[0].startswith("npusim calibrate --hccl")]
    writers = [line for block in _blocks("bash") for line in block.splitlines()
               if line.startswith("npusim op all_") and "--profile measured" in line]
    assert len(writers) == 2
    monkeypatch.chdir(tmp_path)
    for line in writers:
        assert main(shlex.split(line)[1:]) == 0
    capsys.readouterr()
    assert main(shlex.split(command)[1:]) == 0
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    for line in shown:
        assert line.rstrip() in printed, f"README shows {line!r}; it printed:\n" + "\n".join(printed)
