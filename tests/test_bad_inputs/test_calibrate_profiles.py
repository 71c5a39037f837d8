"""Bad-input catalogue, `npusim calibrate`: a profile that is not msprof's, misses a
column, has a bad duration or shape, is empty, or has no op npusim can simulate. Each
fails with one line naming the file, the row and the column; nothing is written."""

import pytest

from cli_check import fails_cleanly

HEADER = ("Op Name,OP Type,Task Type,Task Duration(us),Block Dim,Input Shapes,Input Data Types,Input Formats,"
          "Output Shapes,Output Data Types")
GOOD = 'mm,MatMulV2,AI_CORE,12.5,24,"8,512;512,256",FLOAT16;FLOAT16,ND;ND,"8,256",FLOAT16'


@pytest.mark.parametrize("text, expect", [
    ("OP Type,Core Type,Count,Total Time(us)\nMatMulV2,AI_CORE,3,30\n", r"op\.csv: row 1: missing column 'Op Name'"),
    ("time,value\n1,2\n", r"op\.csv: row 1: not an msprof op_summary CSV"),
    (HEADER.replace(",Input Shapes", "") + "\n", r"op\.csv: row 1: missing column 'Input Shapes'"),
    (HEADER + "\n" + GOOD.replace("12.5", "0"), r"op\.csv: row 2, column 'Task Duration\(us\)': expected a duration > 0"),
    (HEADER + "\n" + GOOD + "\n" + GOOD.replace("12.5", "-3"),
     r"op\.csv: row 3, column 'Task Duration\(us\)': expected a duration > 0 and at most .*, got '-3'"),
    (HEADER + "\n" + GOOD.replace("12.5", "1e308"),
     r"op\.csv: row 2, column 'Task Duration\(us\)': expected a duration > 0 and at most 3\.6e\+09 us \(an hour\), "
     r"got '1e308'"),
    (HEADER + "\n" + GOOD.replace("12.5", "N/A"), r"op\.csv: row 2, column 'Task Duration\(us\)': expected a number"),
    (HEADER + "\n" + GOOD.replace('"8,512;', '"8,x512;'), r"op\.csv: row 2, column 'Input Shapes': expected shapes"),
    (HEADER + "\n" + GOOD.replace('"8,256"', '"8,-1"'), r"op\.csv: row 2, column 'Output Shapes': negative dimension"),
    (HEADER + "\n", r"op\.csv: empty profile"),
    # float() and int() read '1_2.5' as 12.5 and '5_12' as 512: fitted as if measured so
    (HEADER + "\n" + GOOD.replace("12.5", "1_2.5"), r"op\.csv: row 2, column 'Task Duration\(us\)': expected a number, "
                                                    r"got '1_2\.5'$"),
    (HEADER + "\n" + GOOD.replace("8,512;512", "8,5_12;5_12"), r"op\.csv: row 2, column 'Input Shapes': expected shapes"),
    # an empty item was dropped: 8,,512 read as (8, 512), a shape the row never had
    (HEADER + "\n" + GOOD.replace('"8,512;', '"8,,512;'), r"op\.csv: row 2, column 'Input Shapes': expected shapes"),
    (HEADER + "\n" + GOOD.replace('"8,256"', '"8,256,"'), r"op\.csv: row 2, column 'Output Shapes': expected shapes"),
    ("", r"op\.csv: row 1: not an msprof op_summary CSV"),
    (HEADER + "\n" + GOOD.replace("MatMulV2", "Conv2D") + "\n" + GOOD.replace("AI_CORE", "AI_CPU"),
     r"op\.csv: none of its 2 rows maps to an npusim op .*row 2, column 'OP Type'"),
    # op types sharing a reason name it once (each repeated it: past 1,000 characters)
    (HEADER + "\n" + "\n".join(GOOD.replace("MatMulV2", t) for t in ("Conv2D", "Conv3D", "Pooling")),
     r"none of its 3 rows maps to an npusim op \(Conv2D x1, Conv3D x1, Pooling x1 \(op type not in the mapping "
     r"table\)\); first at"),
])
def test_bad_profile(text, expect, tmp_path, capsys):
    (tmp_path / "op.csv").write_text(text)
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--profile", tmp_path / "op.csv", "--out", out], capsys, expect, outputs=[out])


NOTED = HEADER + ",Output Formats,Method,Note,npusim Op,npusim Params,npusim Kernel"


def _noted(op_type: str, shapes: str, note: str, kernel: str = "", op: str = "", out: str = "1024,1024") -> str:
    n = shapes.count(";") + 1
    return (f'x,{op_type},AI_CORE,10.5,,"{shapes}",{";".join(["FLOAT16"] * n)},{";".join(["ND"] * n)},"{out}",'
            f'FLOAT16,ND,,"{note}",{op},,{kernel}')


@pytest.mark.parametrize("row, expect", [
    # the note's attributes, group list and kernel counts: a ValueError's traceback
    (_noted("Exp", "1024,1024", "attrs {base: abc}"), r"the note's attribute 'base': expected a finite number, got 'abc'"),
    (_noted("Exp", "1024,1024", "attrs {base}"), r"the note's attrs \{base\}: expected 'name: value' pairs, got 'base'"),
    (_noted("Exp", "1024,1024", "attrs {scale: inf}"), r"the note's attribute 'scale': expected a finite number"),
    (_noted("GroupedMatmul", "128,256;4,256,512;4,512", "group_list (cumulative) [32,,96, 128]",
            out="128,512"),
     r"the note's group_list \[32,,96, 128\]: expected cumulative row counts"),
    (_noted("Mul+Add", "1024,1024;1024,1024", "kernels: Mul×0 + Add×1"), r"the note's kernel list counts Mul×0"),
    # a list of 10^11 names (memory, then forever); 2,000 kernels ran for minutes
    (_noted("Mul+Add", "1024,1024;1024,1024", "kernels: Mul×99999999999 + Add×1"),
     r"100000000000 kernels in one row .* more than the 64 a row may sum"),
    # fitted as m=8 (A's rows), the output's 16 not read
    (_noted("MatMulV2", "8,512;512,256", "", out="16,256"), r"A \(8, 512\) has 8 rows, its output \(16, 256\) 16"),
    # priced as a copy of 16384 elements, twice the input's
    (_noted("Slice", "8,1024", "", out="8,2048"), r"Slice of \(8, 1024\) to \(8, 2048\): the output is larger than "
                                                   r"the input"),
    # '²'.isdigit() is True, int('²') a ValueError
    (_noted("MatMulV2", "8,512;512,256", "", kernel="²", op="matmul"),
     r"column 'npusim Kernel': expected the kernel's index \(0, 1, \.\.\.\), got '²'"),
])
def test_a_bad_note_or_kernel_column(row, expect, tmp_path, capsys):
    """A row's note (attributes, group list, kernel counts) and npusim Kernel column:
    one line naming the row's problem, within seconds, nothing written."""
    (tmp_path / "op.csv").write_text(NOTED + "\n" + row + "\n", encoding="utf-8")
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--profile", tmp_path / "op.csv", "--out", out], capsys,
                  r"op\.csv: none of its 1 rows maps to an npusim op \(.*" + expect, outputs=[out])


@pytest.mark.parametrize("row", [
    _noted("Relu", "800000000,5120000", "", out="800000000,5120000"),
    _noted("Mul+Add", "400000000,5120000;400000000,5120000", "", out="400000000,5120000"),
], ids=["one-kernel", "a-chain"])
def test_a_row_whose_tensors_do_not_fit_the_hbm(row, tmp_path, capsys):
    """Relu of 800000000 x 5120000 (8 PB): `npusim op` refuses it, calibrate lowered it
    with no HBM bound and simulated it for hours."""
    from kernels import deadline

    (tmp_path / "op.csv").write_text(NOTED + "\n" + row + "\n", encoding="utf-8")
    out = tmp_path / "my.yaml"
    with deadline(30):
        fails_cleanly(["calibrate", "--profile", tmp_path / "op.csv", "--out", out], capsys,
                      r"op\.csv: none of its 1 rows maps to an npusim op \(.* does not simulate on ascend910b2: op "
                      r"\w+: its tensors take at least \d+ bytes of GM .* more than hbm\.hbm_bytes 68719476736",
                      outputs=[out])


def test_a_tab_separated_profile_is_named_in_one_short_line(tmp_path, capsys):
    """Its whole header is one cell, and the error quoted all of it (thousands of characters)."""
    header = "\t".join(HEADER.split(",") + [f"extra column {i}" for i in range(60)])
    (tmp_path / "op.csv").write_text(header + "\n" + GOOD.replace(",", "\t") + "\n")
    out = tmp_path / "my.yaml"
    err = fails_cleanly(["calibrate", "--profile", tmp_path / "op.csv", "--out", out], capsys,
                        r"op\.csv: row 1: not an msprof op_summary CSV \(its header starts with 'Op Name\\tOP Type[^,]*'; "
                        r"expected columns Op Name, OP Type", outputs=[out])
    assert len(err) < 400, err


LONG = "Z" * 3000


@pytest.mark.parametrize("row, expect", [
    (GOOD.replace("MatMulV2", LONG), r"\(ZZZ+\.\.\.ZZZ+ \(3000 characters\) x1 \(op type not in the mapping table\)\)"),
    (GOOD.replace("AI_CORE", LONG),
     r"\(MatMulV2 x1 \(task type ZZZ+\.\.\.ZZZ+ \(only AI core tasks are simulated\) \(3\d{3} characters\)\)"),
    (GOOD.replace("FLOAT16;", LONG + ";"), r"\(MatMulV2 x1 \(dtype ZZZ+\.\.\.ZZZ+ not simulated \(3\d{3} characters\)\)"),
    (GOOD.replace("12.5", "1" * 3000),
     r"row 2, column 'Task Duration\(us\)': expected a duration > 0 .* got '1+\.\.\.1+'$"),
    (GOOD.replace("12.5", "x" * 3000), r"row 2, column 'Task Duration\(us\)': expected a number, got 'x+\.\.\.x+'$"),
    (GOOD.replace('"8,512;', '"8,x' + ",1" * 3000 + ";"),
     r"row 2, column 'Input Shapes': expected shapes .* got '8,x,1"),
    (GOOD.replace('"8,512;', '"8,-512' + ",1" * 3000 + ";"),
     r"row 2, column 'Input Shapes': negative dimension in '8,-512"),
], ids=["op-type", "task-type", "dtype", "duration", "not-a-duration", "shape", "negative-shape"])
def test_a_cell_of_thousands_of_characters_is_quoted_short(row, expect, tmp_path, capsys):
    """A cell of 3,000 characters was quoted whole: an error line as long."""
    (tmp_path / "op.csv").write_text(HEADER + "\n" + row + "\n")
    out = tmp_path / "my.yaml"
    err = fails_cleanly(["calibrate", "--profile", tmp_path / "op.csv", "--out", out], capsys, expect, outputs=[out])
    assert len(err) < 600, err


def test_a_folder_without_op_summary_files(tmp_path, capsys):
    (tmp_path / "op_statistic_0.csv").write_text("OP Type,Count\n")
    fails_cleanly(["calibrate", "--profile", tmp_path, "--out", tmp_path / "my.yaml"], capsys,
                  r"no op_summary\*\.csv file in this folder")


@pytest.mark.parametrize("data, expect", [
    (b"\xff\xfe\x00\x81 not text", r"op\.csv: (not UTF-8 text \(byte 0xff|row 1: not an msprof)"),
    # a Latin-1 profile: was "not a text CSV file", which it is
    (HEADER.encode() + "\nmm,MatMulV2,AI_CORE,12.5,24,\"8,512;512,256\",FLOAT16;FLOAT16,ND;ND,\"8,256\",FLOAT16 \u00e9\n"
     .encode("latin-1"), r"op\.csv: not UTF-8 text \(byte 0xe9; expected msprof's op_summary CSV, which is UTF-8\)$"),
])
def test_a_binary_or_non_utf8_file(data, expect, tmp_path, capsys):
    (tmp_path / "op.csv").write_bytes(data)
    fails_cleanly(["calibrate", "--profile", tmp_path / "op.csv", "--out", tmp_path / "my.yaml"], capsys, expect)


@pytest.mark.parametrize("argv, expect", [
    (["--fields", "l2.ways"], r"--fields l2\.ways: not a field ascend910b2 marks \"assumed\""),
    (["--fields", "chip.freq_hz"], r"--fields chip\.freq_hz: not a field"),
    # it listed every fittable field: one line of 2,800 characters
    (["--fields", "dma.startup"], r"--fields dma\.startup: not a field ascend910b2 marks \"assumed\" with a cost unit "
                                  r"\(did you mean 'dma\.startup_cycles'\?\) \(56 fittable, in aic, aiv, dma, hbm, runtime, "
                                  r"sync, topology: aic\.mmad_startup_cycles, [^)]*, \.\.\.\)$"),
    (["--folds", "1"], r"--folds: expected 2 or more"),
    (["--out", "my.json"], r"--out my\.json: expected a \.yaml path"),
    # argparse kept the last --profile: op.csv's rows were left out of the fit without a word
    (["--profile", "op2.csv"], r"--profile given 2 times \(op\.csv, op2\.csv\): give it once, a CSV or a folder"),
])
def test_bad_arguments(argv, expect, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "op.csv").write_text(HEADER + "\n" + GOOD + "\n")
    (tmp_path / "op2.csv").write_text(HEADER + "\n" + GOOD + "\n")
    args = ["calibrate", "--profile", "op.csv", "--out", "my.yaml", *argv]
    fails_cleanly(args, capsys, expect, outputs=[tmp_path / "my.yaml"])


# ---- --hccl: hccl_test's output

COMMAND = "# mpirun -n 8 ./bin/all_reduce_test -b 8K -e 16K -f 2 -d fp16 -p 8\n"
TABLE = "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:\n"
ROW = "8192              | 9.94           | 0.76724              | NULL\n"


@pytest.mark.parametrize("text, extra, expect", [
    ("time,value\n1,2\n", [], r"ar\.txt: row 1: not hccl_test output \(no header line like 'data_size\(Bytes\): \|"),
    (COMMAND + TABLE, [], r"ar\.txt: row 2: no rows under the hccl_test header"),
    (COMMAND + TABLE + ROW.replace("9.94 ", "abc "), [],
     r"ar\.txt: row 3, column 'aveg_time\(us\)': expected a time in us > 0, got 'abc'"),
    (COMMAND + TABLE + ROW + ROW.replace("9.94 ", "0.00 "), [],
     r"ar\.txt: row 4, column 'aveg_time\(us\)': expected a time in us > 0, got '0.00'"),
    (COMMAND + TABLE + ROW.replace("9.94 ", "-2.5 "), [], r"row 3, column 'aveg_time\(us\)'.*got '-2.5'"),
    # fitted (the config written, every error 100%): op_summary's durations had these bounds, hccl_test's not
    (COMMAND + TABLE + ROW.replace("9.94 ", "1e300 "), [],
     r"ar\.txt: row 3, column 'aveg_time\(us\)': expected a time from 0\.001 us \(1 ns\) to 3\.6e\+09 us \(an hour\), "
     r"got '1e300'$"),
    (COMMAND + TABLE + ROW.replace("9.94 ", "1e-9 "), [], r"row 3, column 'aveg_time\(us\)': expected a time from .* "
                                                         r"got '1e-9'$"),
    (COMMAND + TABLE + "8192 | 9.94\n", [], r"ar\.txt: row 3, column 'alg_bandwidth\(GB/s\)': missing"),
    (COMMAND + TABLE + ROW.replace("9.94 ", "9_94 "), [], r"row 3, column 'aveg_time\(us\)'.*got '9_94'$"),
    (COMMAND + TABLE + ROW.replace("0.76724 ", "fast    "), [],
     r"row 3, column 'alg_bandwidth\(GB/s\)': expected a bandwidth >= 0, got 'fast'"),
    (TABLE + ROW, [], r"ar\.txt: row 1: no command line above the table .* give op= after the file"),
    (TABLE + ROW, ["op=all_reduce"], r"ar\.txt: row 1: .* give devices= after the file"),
    (COMMAND + TABLE + ROW, ["devices=16"], r"ar\.txt: row 2: its command line says devices 8, --hccl devices= says 16"),
    (COMMAND + TABLE + ROW, ["ranks=8"], r"--hccl .*ar\.txt: unknown option 'ranks' \(expected op=, devices=, dtype=\)"),
    (COMMAND + TABLE + ROW, ["devices=8", "devices=4"], r"--hccl .*ar\.txt: devices= given twice \(devices=8, devices=4\)$"),
    (COMMAND + TABLE + ROW, ["devices8"], r"--hccl .*ar\.txt: expected KEY=VALUE after the file .* got 'devices8'"),
    (TABLE + ROW, ["op=broadcast", "devices=8"], r"op=broadcast: expected one of all_reduce, "),
    (TABLE + ROW, ["op=all_reduce", "devices=1"], r"devices=1: expected an integer of 2 or more"),
    # '²'.isdigit() is True, int('²') a ValueError: a traceback
    (TABLE + ROW, ["op=all_reduce", "devices=²"], r"devices=²: expected an integer of 2 or more"),
    (COMMAND.replace("-n 8", "-n ²") + TABLE + ROW, [], r"ar\.txt: row 2: no command line above the table says which "
                                                        r"test ran on how many ranks .* give devices= after the file"),
    # a garbled size: the row was skipped as a note ("no rows under the hccl_test header"), or 81.5 read as 81
    *[(COMMAND + TABLE + ROW.replace("8192 ", size), [],
       rf"ar\.txt: row 3, column 'data_size\(Bytes\)': expected a whole number of bytes > 0, got '{size.strip()}'$")
      for size in ("-8192", "81.5 ", "0x2000")],
    # mpirun -n 0: ZeroDivisionError in the collective's simulation
    (COMMAND.replace("-n 8", "-n 0") + TABLE + ROW, [],
     r"ar\.txt: row 1: its command line runs 0 ranks \(mpirun -n\): expected 1 or more$"),
    (COMMAND.replace("fp16", "int8") + TABLE + ROW, [],
     r"ar\.txt: none of its 1 rows maps to an npusim op \(all_reduce_test \(8 ranks\) x1 \(dtype int8 .*row 3$"),
])
def test_bad_hccl_output(text, extra, expect, tmp_path, capsys):
    (tmp_path / "ar.txt").write_text(text)
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--hccl", tmp_path / "ar.txt", *extra, "--out", out], capsys, expect, outputs=[out])


def test_hccl_file_missing_or_binary_and_nothing_to_fit(tmp_path, capsys):
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--hccl", tmp_path / "none.txt", "--out", out], capsys,
                  r"none\.txt: cannot read: No such file", outputs=[out])
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00\x81")
    fails_cleanly(["calibrate", "--hccl", tmp_path / "bin.txt", "--out", out], capsys,
                  r"bin\.txt: not UTF-8 text \(byte 0xff; expected hccl_test's output\)", outputs=[out])
    fails_cleanly(["calibrate", "--out", out], capsys, r"nothing to fit: give --profile .* and/or --hccl",
                  outputs=[out])


@pytest.mark.parametrize("step, expect", [
    ("{not json", r"npusim_step\.json is not JSON"),
    ('["k3-tiny"]', r"npusim_step\.json: expected a JSON object with the step's 'workload'"),
    ('{"workload": "k3-tiny", "tilings": [1, 2]}', r"npusim_step\.json: key 'tilings': expected an object"),
    # a tiling of no node of the step was not used, without a word
    ({"tilings": {"L0.down_proj ": {"base_k": 64}}}, r"the profile's step file: key 'tilings': 'L0\.down_proj ' is not "
                                                    r"a node of the step \(its 26 nodes run with the tilings of their "
                                                    r"own names\)"),
])
def test_a_broken_step_file(step, expect, tmp_path, capsys):
    """A step profile's rows are timed in the step its npusim_step.json names: a file
    that is not what `npusim run --profile` writes is refused as it is read."""
    import json

    from npusim.cli import main

    d = tmp_path / "prof"
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--profile", str(d)]) == 0
    if isinstance(step, dict):  # a change to the step file written
        written = json.loads((d / "npusim_step.json").read_text())
        step = json.dumps(written | {k: written.get(k, {}) | v for k, v in step.items()})
    (d / "npusim_step.json").write_text(step)
    capsys.readouterr()
    # --jobs 1: the runs are counted in this process (workers would each count their own)
    fails_cleanly(["calibrate", "--profile", d, "--out", tmp_path / "my.yaml", "--jobs", "1"], capsys, expect,
                  outputs=[tmp_path / "my.yaml"])


@pytest.mark.parametrize("key", ["batch", "passes"])
def test_a_step_file_without_a_key_of_the_step(key, tmp_path, capsys):
    """Without 'batch' the step ran again at run_decoder's batch 1, without 'passes' on the
    baseline passes: the fit went on against kernels that never ran (its errors 0.1-0.5%)."""
    import json

    from npusim.cli import main

    d = tmp_path / "prof"
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--profile", str(d)]) == 0
    step = json.loads((d / "npusim_step.json").read_text())
    del step[key]
    (d / "npusim_step.json").write_text(json.dumps(step))
    capsys.readouterr()
    # --jobs 1: the runs are counted in this process (workers would each count their own)
    fails_cleanly(["calibrate", "--profile", d, "--out", tmp_path / "my.yaml", "--jobs", "1"], capsys,
                  rf"npusim_step\.json: missing key '{key}' \(npusim run --profile writes the step's workload, "
                  r"phase, batch, context, passes\)$", outputs=[tmp_path / "my.yaml"])


def test_a_step_file_of_another_batch(tmp_path, capsys):
    """The step file edited to batch 4 beside a CSV of batch 2: every row was fitted to a
    kernel of batch 4 without a word (its shapes twice the row's)."""
    import json

    from npusim.cli import main

    d = tmp_path / "prof"
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--profile", str(d)]) == 0
    step = json.loads((d / "npusim_step.json").read_text())
    (d / "npusim_step.json").write_text(json.dumps(step | {"batch": 4}))
    capsys.readouterr()
    # --jobs 1: the runs are counted in this process (workers would each count their own)
    fails_cleanly(["calibrate", "--profile", d, "--out", tmp_path / "my.yaml", "--jobs", "1"], capsys,
                  r"prof: none of its \d+ rows maps to an npusim op \(.*decoder step does not simulate on ascend910b2: "
                  r"the step runs node '[\w.+]+' with shape \[4, 256\], the row's npusim Params say \[2, 256\] \(the "
                  r"step file of another run\?\)", outputs=[tmp_path / "my.yaml"])


def test_a_step_that_fails_runs_once(tmp_path, capsys, monkeypatch):
    """A step file whose step fails (batch 10^9) ran the step again for each row of it:
    K3's profile of 389 rows took 6 minutes to say so."""
    import json

    from npusim.cli import main
    from npusim.runtime import decoder

    d = tmp_path / "prof"
    assert main(["run", "--workload", "k3-tiny", "--batch", "2", "--context", "64", "--profile", str(d)]) == 0
    step = json.loads((d / "npusim_step.json").read_text())
    (d / "npusim_step.json").write_text(json.dumps(step | {"batch": 10 ** 9}))
    capsys.readouterr()
    runs, real = [], decoder.run_decoder

    def counted(*args, **kw):
        runs.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(decoder, "run_decoder", counted)
    # --jobs 1: the runs are counted in this process (workers would each count their own)
    fails_cleanly(["calibrate", "--profile", d, "--out", tmp_path / "my.yaml", "--jobs", "1"], capsys,
                  r"prof: none of its 26 rows maps to an npusim op \(.*batch 1000000000 is more than the 65536 "
                  r"sequences a step may have", outputs=[tmp_path / "my.yaml"])
    assert len(runs) == 1, len(runs)


# ---- outputs (issue 35): never onto --hw's file or its base chain, checked before the fit, all or none

HCCL = COMMAND + TABLE + ROW + ROW.replace("8192 ", "16384").replace("9.94 ", "10.94")


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A working folder with hwconfigs/mylab.yaml (base: ascend910b2), mylab2.yaml
    (base: mylab) and an hccl_test output; the configs' bytes, to check they are untouched."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hwconfigs").mkdir()
    (tmp_path / "hwconfigs" / "mylab.yaml").write_text("base: ascend910b2\nname: mylab\n")
    (tmp_path / "hwconfigs" / "mylab2.yaml").write_text("base: mylab\nname: mylab2\n")
    (tmp_path / "h.txt").write_text(HCCL)
    return {p: p.read_bytes() for p in (tmp_path / "hwconfigs").iterdir()}


@pytest.mark.parametrize("hw, out, expect", [
    ("mylab", "hwconfigs/mylab.yaml", r"--out hwconfigs/mylab\.yaml: the same file as the input of --hw \("),
    ("mylab", "./hwconfigs/../hwconfigs/mylab.yaml", r"the same file as the input of --hw \("),
    ("mylab2", "hwconfigs/mylab.yaml", r"--out hwconfigs/mylab\.yaml: the same file as the input of --hw's base "
                                       r".*hwconfigs/mylab\.yaml"),
    ("hwconfigs/mylab2.yaml", "hwconfigs/mylab.yaml", r"the same file as the input of --hw's base"),
    ("mylab", "first/mylab.yaml", r"--out first/mylab\.yaml: the name 'mylab' \(of --hw or its base chain\) would "
                                  r"then find it instead of .*hwconfigs/mylab\.yaml: the calibrated config would load "
                                  r"itself"),
    ("mylab2", "first/mylab.yaml", r"the name 'mylab' .* would then find it"),
], ids=["its-file", "its-file-dotted", "its-base", "its-base-hw-a-path", "found-first", "its-base-found-first"])
def test_out_onto_the_calibrated_config_or_its_base_chain(hw, out, expect, lab, tmp_path, capsys, monkeypatch):
    """`calibrate --hw mylab --out hwconfigs/mylab.yaml` would replace the user's config by
    `base: mylab` (a chain looping to itself): refused in one line before the fit, --hw
    given by name or by path, --out on its file, on a file of its base chain, or where
    the name would find --out first (a folder searched before hwconfigs/)."""
    (tmp_path / "first").mkdir()
    monkeypatch.setenv("NPUSIM_HWCONFIGS", str(tmp_path / "first"))
    monkeypatch.setattr("npusim.calibrate.session.calibrate", lambda *a: pytest.fail("fitted before the check"))
    fails_cleanly(["calibrate", "--hccl", "h.txt", "--hw", hw, "--out", out], capsys, expect,
                  outputs=[tmp_path / "first" / "mylab.yaml"])
    assert {p: p.read_bytes() for p in (tmp_path / "hwconfigs").iterdir()} == lab


def test_a_calibrated_config_by_name_beside_its_base_loads(lab, tmp_path, capsys):
    from npusim.cli import main
    from npusim.hw import load_hw

    assert main(["calibrate", "--hccl", "h.txt", "--hw", "mylab2", "--out", "hwconfigs/mylab3.yaml"]) == 0
    assert "wrote hwconfigs/mylab3.yaml" in capsys.readouterr().out
    assert load_hw("mylab3").name == "mylab3"
    assert {p: p.read_bytes() for p in (tmp_path / "hwconfigs").iterdir() if p.name != "mylab3.yaml"} == lab


@pytest.mark.parametrize("argv, expect", [
    (["--json", "/proc/x/c.json"], r"--json /proc/x/c\.json: cannot be written"),
    (["--plot", "/proc/x/p"], r"--plot \(calibration\.png\) /proc/x/p/calibration\.png: cannot be written"),
    (["--out", "/proc/x/my.yaml"], r"--out /proc/x/my\.yaml: cannot be written"),
    (["--json", "/dev/full"], r"--json /dev/full: cannot be written: No space left on device"),
    (["--json", "p/calibration.svg", "--plot", "p"], r"--plot \(calibration\.svg\) p/calibration\.svg: the same file "
                                                     r"as the output of --json"),
], ids=["json", "plot", "out", "full", "json-in-plot"])
def test_outputs_checked_before_the_fit(argv, expect, lab, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("npusim.calibrate.session.calibrate", lambda *a: pytest.fail("fitted before the check"))
    fails_cleanly(["calibrate", "--hccl", "h.txt", "--hw", "mylab", "--out", "my.yaml", *argv], capsys, expect,
                  outputs=[tmp_path / "my.yaml", tmp_path / "p"])


@pytest.mark.parametrize("argv, expect", [
    (["--json", "prof/PROF_1/op_summary_1.csv"], r"--json prof/PROF_1/op_summary_1\.csv: the same file as the input of "
                                                 r"--profile prof/PROF_1/op_summary_1\.csv"),
    (["--json", "prof/npusim_step.json"],
     r"--json prof/npusim_step\.json: the same file as the input of --profile prof/npusim_step\.json"),
], ids=["a-csv-of-the-folder", "the-step-file-beside-one"])
def test_an_output_onto_a_file_of_the_profile_folder(argv, expect, tmp_path, capsys, monkeypatch):
    """--profile DIR reads every op_summary*.csv under DIR (and the step file beside each):
    `--json DIR/.../op_summary_1.csv` replaced the user's measurements by the report."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prof" / "PROF_1").mkdir(parents=True)
    (tmp_path / "prof" / "op_summary_0.csv").write_text(HEADER + "\n" + GOOD + "\n")
    (tmp_path / "prof" / "npusim_step.json").write_text("{}")
    (tmp_path / "prof" / "PROF_1" / "op_summary_1.csv").write_text(HEADER + "\n" + GOOD + "\n")
    before = {p: p.read_bytes() for p in (tmp_path / "prof").rglob("*") if p.is_file()}
    monkeypatch.setattr("npusim.calibrate.session.calibrate", lambda *a: pytest.fail("fitted before the check"))
    fails_cleanly(["calibrate", "--profile", "prof", "--out", "my.yaml", *argv], capsys, expect,
                  outputs=[tmp_path / "my.yaml"])
    assert {p: p.read_bytes() for p in (tmp_path / "prof").rglob("*") if p.is_file()} == before


def test_ctrl_c_between_two_outputs_leaves_none(lab, tmp_path, capsys, monkeypatch):
    """Ctrl-C after the config is written, before the JSON report: neither is left, and
    the message says so."""
    from npusim.cli import main

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr("npusim.calibrate.command.write_json", interrupted)
    code = main(["calibrate", "--hccl", "h.txt", "--hw", "mylab", "--out", "out/my.yaml", "--json", "my.json"])
    err = capsys.readouterr().err
    assert code == 130 and err.strip() == "npusim: interrupted (no partial output left)", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.txt", "hwconfigs"]
