"""The teaching notebooks (notebooks/*.ipynb), each run in a fresh kernel.

- test_outputs: a fresh run of the notebook as committed completes, and its text outputs
  (stdout, text/plain, text/markdown, one placeholder per image) are what the committed
  notebook shows, numbers equal to their rounding; image bytes, stderr, execution counts
  and metadata are ignored. The notebook's last cell checks every number its text quotes.
- test_exercise: each exercise parameter, a line `NAME = VALUE  # exercise N: try ALT`,
  set to ALT: the notebook runs to the end (its checks skip what the text no longer
  describes) and the change shows in its outputs.
- test_structure: a notebook's asserts are in its last cell only, after the lesson (the
  idea, what to notice, an exercise with a parameter).

This replaces running the notebooks with nbmake (each would otherwise run twice). After a
change to the model, rewrite the committed outputs with

    .venv/bin/python tests/test_notebooks.py [notebooks/NN-name.ipynb ...]
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
TIMEOUT_S = 900  # per cell; the slowest notebook runs in well under a minute
# what the kernel runs with: figures drawn by the inline backend (matplotlib's Agg
# renderer, shown as PNG), a fixed hash seed (set and dict orders)
KERNEL_ENV = {"MPLBACKEND": "module://matplotlib_inline.backend_inline", "PYTHONHASHSEED": "0"}
REL_TOL = 1e-3  # numbers: equal within this share, or one unit in the last printed digit

EXERCISE = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*(?:, [A-Z][A-Z0-9_]*)*) = (?P<value>.+?)  "
                      r"# exercise (?P<ex>\w+): try (?P<alt>.+)$", re.M)
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?")


def execute(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell of `nb` in a fresh kernel started in notebooks/ (in place; a cell that
    raises fails with its traceback)."""
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute(env={**os.environ, **KERNEL_ENV})
    return nb


def text_outputs(nb: nbformat.NotebookNode) -> list[list[str]]:
    """Per code cell, what it showed as text: stdout (consecutive chunks joined), text/plain
    and text/markdown of results and displays, and "<image>" for each image."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        shown: list[str] = []
        stdout = False
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                if out.name == "stdout":
                    if stdout:
                        shown[-1] += out.text
                    else:
                        shown.append(out.text)
                    stdout = True
                continue
            stdout = False
            if out.output_type == "error":
                shown.append(f"<error {out.ename}: {out.evalue}>")
                continue
            data = out.get("data", {})
            shown.extend(data[kind] for kind in ("text/markdown", "text/plain") if kind in data)
            shown.extend("<image>" for kind in data if kind.startswith("image/"))
        cells.append(shown)
    return cells


def _unit(token: str) -> float:
    """One unit in the last printed digit of a number as printed ("1.25" -> 0.01, "3e+12" -> 1e12)."""
    mantissa, _, exponent = token.replace(",", "").lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def same_text(a: str, b: str) -> str | None:
    """None if `a` and `b` differ at most in whitespace and in numbers equal to their rounding,
    else a description of the first difference."""
    na, nb_ = NUMBER.findall(a), NUMBER.findall(b)
    words_a = " ".join(NUMBER.sub(" # ", a).split())
    words_b = " ".join(NUMBER.sub(" # ", b).split())
    if words_a != words_b or len(na) != len(nb_):
        return f"the text differs:\n--- committed\n{a}\n--- fresh run\n{b}"
    for x, y in zip(na, nb_):
        fx, fy = float(x.replace(",", "")), float(y.replace(",", ""))
        if abs(fx - fy) > max(REL_TOL * max(abs(fx), abs(fy)), _unit(x), _unit(y)) * (1 + 1e-9):
            return f"{x} (committed) against {y} (fresh run) in:\n{b}"
    return None


def exercise_lines(path: Path) -> list[tuple[str, str, str, str]]:
    """(cell source line, name, shipped value, value to try) of each exercise parameter."""
    nb = nbformat.read(path, as_version=4)
    return [(m.group(0), m.group("name"), m.group("value"), m.group("alt"))
            for cell in nb.cells if cell.cell_type == "code" for m in EXERCISE.finditer(cell.source)]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_outputs(path):
    committed = nbformat.read(path, as_version=4)
    fresh = execute(nbformat.read(path, as_version=4))
    old, new = text_outputs(committed), text_outputs(fresh)
    code_cells = [c.source for c in committed.cells if c.cell_type == "code"]
    for source, was, now in zip(code_cells, old, new):
        where = f"{path.name}, the cell starting {source.splitlines()[0]!r}"
        assert len(was) == len(now), (f"{where}: {len(was)} outputs committed, {len(now)} in a fresh run "
                                      f"(committed without outputs? rewrite them: see this file's docstring)")
        for a, b in zip(was, now):
            difference = same_text(a, b)
            assert difference is None, f"{where}: {difference}"


EXERCISES = [(path, line, name, alt) for path in PATHS for line, name, _, alt in exercise_lines(path)]


@pytest.mark.parametrize("path, line, name, alt", EXERCISES,
                         ids=[f"{p.stem[:2]}-{n.split(',')[0]}={a}" for p, _, n, a in EXERCISES])
def test_exercise(path, line, name, alt):
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and line in c.source]
    assert len(cells) == 1, f"{path.name}: {line!r} is in {len(cells)} cells"
    cells[0].source = cells[0].source.replace(line, f"{name} = {alt}  # the exercise's value")
    ran = text_outputs(execute(nb))
    shipped = text_outputs(nbformat.read(path, as_version=4))
    assert ran != shipped, f"{path.name}: {name} = {alt} changed no output: is the parameter used?"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_structure(path):
    nb = nbformat.read(path, as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), "a title and the idea first"
    assert re.search(r"^#+ What to notice", markdown, re.M), "a 'What to notice'"
    assert re.search(r"^#+ Exercise", markdown, re.M), "an exercise"
    assert exercise_lines(path), "an exercise parameter: `NAME = VALUE  # exercise N: try ALT`"
    assert nb.cells[-2].cell_type == "markdown" and nb.cells[-2].source.startswith("## Checks (for CI)")
    for cell in code[:-1]:
        assert not re.search(r"^\s*assert\b", cell.source, re.M), f"an assert in a teaching cell:\n{cell.source}"
    assert re.search(r"^\s*assert\b", code[-1].source, re.M), "the last cell checks the text's numbers"


def main(paths: list[str]) -> None:
    """Execute the notebooks (all, or those named) and save them with their outputs."""
    for name in paths or [str(p) for p in PATHS]:
        path = Path(name).resolve()
        nb = execute(nbformat.read(path, as_version=4))
        nbformat.write(nb, path)
        print(f"{path.name}: outputs written")


if __name__ == "__main__":
    main(sys.argv[1:])
