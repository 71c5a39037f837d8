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
     r"op\.csv: row 3, column 'Task Duration\(us\)': expected a duration > 0, got '-3'"),
    (HEADER + "\n" + GOOD.replace("12.5", "N/A"), r"op\.csv: row 2, column 'Task Duration\(us\)': expected a number"),
    (HEADER + "\n" + GOOD.replace('"8,512;', '"8,x512;'), r"op\.csv: row 2, column 'Input Shapes': expected shapes"),
    (HEADER + "\n" + GOOD.replace('"8,256"', '"8,-1"'), r"op\.csv: row 2, column 'Output Shapes': negative dimension"),
    (HEADER + "\n", r"op\.csv: empty profile"),
    ("", r"op\.csv: row 1: not an msprof op_summary CSV"),
    (HEADER + "\n" + GOOD.replace("MatMulV2", "Conv2D") + "\n" + GOOD.replace("AI_CORE", "AI_CPU"),
     r"op\.csv: none of its 2 rows maps to an npusim op .*row 2, column 'OP Type'"),
])
def test_bad_profile(text, expect, tmp_path, capsys):
    (tmp_path / "op.csv").write_text(text)
    out = tmp_path / "my.yaml"
    fails_cleanly(["calibrate", "--profile", tmp_path / "op.csv", "--out", out], capsys, expect, outputs=[out])


def test_a_folder_without_op_summary_files(tmp_path, capsys):
    (tmp_path / "op_statistic_0.csv").write_text("OP Type,Count\n")
    fails_cleanly(["calibrate", "--profile", tmp_path, "--out", tmp_path / "my.yaml"], capsys,
                  r"no op_summary\*\.csv file in this folder")


def test_a_binary_file(tmp_path, capsys):
    (tmp_path / "op.csv").write_bytes(b"\xff\xfe\x00\x81 not text")
    fails_cleanly(["calibrate", "--profile", tmp_path / "op.csv", "--out", tmp_path / "my.yaml"], capsys,
                  r"op\.csv: (not a text CSV|row 1: not an msprof)")


@pytest.mark.parametrize("argv, expect", [
    (["--fields", "l2.ways"], r"--fields l2\.ways: not a field ascend910b2 marks \"assumed\""),
    (["--fields", "chip.freq_hz"], r"--fields chip\.freq_hz: not a field"),
    (["--folds", "1"], r"--folds: expected 2 or more"),
    (["--out", "my.json"], r"--out my\.json: expected a \.yaml path"),
])
def test_bad_arguments(argv, expect, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "op.csv").write_text(HEADER + "\n" + GOOD + "\n")
    args = ["calibrate", "--profile", "op.csv", "--out", "my.yaml", *argv]
    fails_cleanly(args, capsys, expect, outputs=[tmp_path / "my.yaml"])
