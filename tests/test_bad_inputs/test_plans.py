"""Bad-input catalogue, parallel plans and collectives: one line naming the flag and what was expected."""

import pytest

from cli_check import fails_cleanly

TINY = ["--workload", "k3-tiny", "--batch", "2", "--context", "64"]


@pytest.mark.parametrize("cmd", ["run", "compare", "validate"])
@pytest.mark.parametrize("argv, expect", [
    (["--tp", "3"], r"--tp 3 does not divide k3-tiny's heads 4"),
    (["--tp", "4"], r"--tp 4 does not divide k3-tiny's kv_heads 2"),
    (["--tp", "0"], r"--tp: expected a positive integer, got 0"),
    (["--tp", "2", "--devices", "4"], r"--devices 4 must equal --tp 2 x --sp 1 = 2"),
    (["--sp", "2"], r"--sp 2: sequence parallel splits a prefill's prompt; a decode step has one token"),
    (["--sp", "3", "--phase", "prefill"], r"--sp 3 must divide the prompt length evenly, got lengths 64"),
    (["--sp", "-1", "--phase", "prefill"], r"--sp: expected a positive integer, got -1"),
    (["--tp", "2", "--set", "topology.node_device_count=1", "--set", "topology.node_count=1"],
     r"2 devices, but ascend910b2's topology has 1"),
    (["--tp", "2", "--set", "topology.node_device_count=1"], r"--tp 2 spans nodes"),
])
def test_bad_plan(cmd, argv, expect, capsys):
    if cmd == "validate" and "--set" in argv:
        pytest.skip("validate takes no hardware overrides")
    fails_cleanly([cmd, *TINY, *argv], capsys, expect)


@pytest.mark.parametrize("argv, expect", [
    (["all_reduce", "bytes=64XB"], r"op all_reduce: parameter 'bytes': expected a size such as 4096, 64KiB or 1GiB, got '64XB'"),
    (["all_reduce", "devices=33"], r"33 devices, but the topology has 32"),
    (["all_reduce", "devices=16", "algo=mesh"], r"algo mesh needs every rank wired to every other"),
    (["all_reduce", "algo=tree"], r"'algo' must be in \(.auto., .mesh., .ring., .p2p.\) \(got 'tree'\)"),
    (["all_reduce", "algo=p2p"], r"all_reduce: algo p2p is send_recv's; expected mesh, ring or auto"),
    (["send_recv", "algo=mesh"], r"send_recv: one point-to-point step: algo must be auto or p2p, got 'mesh'"),
    (["send_recv", "--profile", "prof"], r"op send_recv --profile: hccl_test has no test for it"),
    (["all_reduce", "--trace", "t.json"], r"op all_reduce: --trace is for kernels"),
    (["all_reduce", "devices=x"], r"parameter 'devices' expects an integer, got 'x'"),
    (["all_reduce", "root=0"], r"unknown parameter 'root'"),
    # the help lists axis (the op's parameter); the command said "unknown parameter 'axis'"
    (["all_gather", "axis=1"], r"^npusim: error: op all_gather: 'axis' must be 0 here \(the buffer is 1-D"),
    (["all_to_all", "algo=ring"], r"only the mesh algorithm is modelled"),
    (["all_reduce", "bytes=1KiB..1B"], r"expected 1 <= first <= last"),
    # the messages named "op: bytes" (elements=0: bytes, a parameter not given)
    (["all_reduce", "elements=0"], r"^npusim: error: op all_reduce: 'elements' must be > 0: 0$"),
    (["all_reduce", "bytes=0"], r"^npusim: error: op all_reduce: parameter 'bytes': expected 1 <= first <= last"),
    (["all_gather", "elements=1.5"], r"^npusim: error: op all_gather: parameter 'elements': expected a size such"),
    # --check simulated and printed the timing table (exit 0) instead of checking anything
    (["all_reduce", "elements=1024", "--check"], r"op all_reduce --check: a collective's numerics need its peers"),
])
def test_bad_collective(argv, expect, capsys):
    fails_cleanly(["op", *argv], capsys, expect)


@pytest.mark.parametrize("cmd, argv, expect", [
    ("run", ["--pp", "3"], r"--pp 3 does not divide k3-tiny's layers 2"),
    ("run", ["--pp", "2", "--microbatches", "3"], r"--microbatches 3 does not divide the batch 2"),
    ("run", ["--microbatches", "2"], r"--microbatches is an option of a pipeline: give --pp N too"),
    ("run", ["--pp", "2", "--devices", "4"], r"--devices 4 must equal --tp 1 x --pp 2 = 2"),
    ("run", ["--pp", "2", "--sp", "2"], r"--pp with --sp: a pipeline of sequence-parallel stages is not modelled"),
    ("run", ["--pp", "0"], r"--pp: expected a positive integer, got 0"),
    ("run", ["--pp", "2", "--trace", "t.json"], r"--trace: a pipelined run \(--pp\) writes its summary and --json only"),
    ("compare", ["--pp", "2"], r"--pp: a pipelined step is run by `npusim run`"),
    ("validate", ["--pp", "2"], r"--pp: a pipeline's stages compute what the unsplit decoder does"),
])
def test_bad_pipeline(cmd, argv, expect, capsys):
    fails_cleanly([cmd, *TINY, *argv], capsys, expect)


@pytest.mark.parametrize("argv, expect", [
    (["--plans", "tp2x"], r"--plans tp2x: expected tpN, spN, epN or one comma list of them \(tp2,sp2; tp2,ep8\), got 'tp2x'"),
    (["--plans", "pp2"], r"--plans pp2: expected tpN, spN.*; a pipeline is run by npusim run --pp N"),
    (["--plans", "tp0"], r"--plans tp0: tp expects a positive degree, got 0"),
    (["--plans", "tp2,tp4"], r"--plans tp2,tp4: tp given twice in one plan"),
    (["--plans", "tp2", "tp2,sp1"], r"--plans tp2,sp1: the plan tp2 is given twice"),
    (["--plans", "tp1", "tp3"], r"--plans tp3: --tp 3 does not divide k3-tiny's heads 4"),
    (["--plans", "tp1", "sp2"], r"--plans sp2: --sp 2: sequence parallel splits a prefill's prompt"),
    (["--plans", "tp2", "--tp", "2"], r"--tp: with --plans each plan gives its own degrees"),
    (["--plans", "tp2", "--passes", "baseline", "optimized"],
     r"--passes baseline optimized: --plans compares plans under ONE pipeline"),
    (["--plans", "tp2", "--passes", "baseline,optimized"], r"a comma list is ONE pipeline"),
    (["--plans", "tp1", "--set", "hbm.hbm_bytes=3145728"], r"does not fit .* fit on 2 devices \(--tp 2\)"),
])
def test_bad_plans_of_compare(argv, expect, capsys, tmp_path):
    fails_cleanly(["compare", *TINY, *argv, "--json", tmp_path / "c.json"], capsys, expect,
                  outputs=[tmp_path / "c.json"])
