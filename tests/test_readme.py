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


def test_readme_example_is_the_demo_source():
    demo = Path(npusim.demo.__file__).read_text()
    assert _blocks("python")[0] == demo.split('"""', 2)[2].lstrip("\n")


def test_readme_example_runs_and_reports(capsys):
    namespace = {"__name__": "__main__"}
    exec(compile(_blocks("python")[0], "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert re.search(r"vector_add: \d+ cycles = [\d.]+ us on ascend910b2", out)
    assert re.search(r"achieved [\d.]+ TB/s", out)
    for pipe in ("AIV.MTE2", "AIV.V", "AIV.MTE3"):
        assert re.search(rf"{re.escape(pipe)}\s+busy\s+[\d.]+%", out)


def test_every_other_readme_python_block_runs():
    for block in _blocks("python")[1:]:
        exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
