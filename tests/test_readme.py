"""The README's commands and example are real: the example is npusim/demo.py and it runs."""

import re
from pathlib import Path

import npusim.demo

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    commands = _blocks("bash")[0].strip().splitlines()
    assert len(commands) == 2
    assert "npusim" in commands[0] and "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == commands[1]


def _demo_block() -> str:
    (block,) = [b for b in _blocks("python") if "def vector_add" in b]
    return block


def test_readme_opens_with_the_k3_decode_run():
    main_job = _blocks("bash")[0].strip().splitlines()[0]
    assert "npusim run" in main_job and "--workload k3 " in main_job and "--phase decode" in main_job


def test_readme_example_is_the_demo_source():
    demo = Path(npusim.demo.__file__).read_text()
    assert _demo_block() == demo.split('"""', 2)[2].lstrip("\n")


def test_readme_example_runs_and_reports(capsys):
    namespace = {"__name__": "__main__"}
    exec(compile(_demo_block(), "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert re.search(r"vector_add: \d+ cycles = [\d.]+ us on ascend910b2", out)
    assert re.search(r"achieved [\d.]+ TB/s", out)
    for pipe in ("AIV.MTE2", "AIV.V", "AIV.MTE3"):
        assert re.search(rf"{re.escape(pipe)}\s+busy\s+[\d.]+%", out)


def test_every_other_readme_python_block_runs():
    for block in (b for b in _blocks("python") if b != _demo_block()):
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
