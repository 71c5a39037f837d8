"""The README's (and its manual pages') commands and example are real: the example is
npusim/demo.py and it runs."""

import os
import re
import shlex
from pathlib import Path

import pytest

import npusim.demo

ROOT = Path(__file__).resolve().parents[1]
# the README and the manual pages it links (docs/*.md), in its order: what a user reads
_PAGES = list(dict.fromkeys(re.findall(r"\]\((docs/[\w-]+\.md)\)", (ROOT / "README.md").read_text())))
README = "\n".join((ROOT / page).read_text() for page in ("README.md", *_PAGES))


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    commands = _blocks("bash")[0].strip().splitlines()
    assert len(commands) == 2
    assert "npusim" in commands[0] and "pytest" in commands[1]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert commands[1] in ci  # then the sanitizer run of the C engine (.ci/sanitize)


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


# README examples with their output shown that take over ~30 s to run, and why; every
# other one is run below and must print what the README shows. NPUSIM_README_SLOW=1 runs
# these too.
SLOW = {"npusim sweep": "12 K3 decode steps",
        "npusim serve --service seed-optimized --workload k3 ": "K3 serving on an empty cache prices bucketed "
                                                                 "prefills of up to 32 x 4096 tokens (hours)",
        "npusim calibrate --hccl": "the hccl_test example reads the files its `npusim op` commands write "
                                   "(tests/test_calibrate_hccl.py runs them in order)"}


def _shown() -> list[tuple[str, list[str]]]:
    """(command, the lines the README shows it printing) for each `$ npusim ...` block."""
    blocks, current = [], None  # fenced blocks without a language, in order
    for line in README.splitlines():
        if line.startswith("```"):
            if current is None:
                current = [] if line == "```" else False
            else:
                if current:
                    blocks.append(current)
                current = None
        elif current:
            current.append(line)
        elif current == [] and line:
            current.append(line)
    out = []
    for lines in blocks:
        if not lines[0].startswith("$ npusim"):
            continue
        lines = list(lines)
        command = lines.pop(0)[2:]
        while command.endswith("\\"):
            command = command[:-1] + lines.pop(0).strip()
        out.append((command, lines))
    return out


def test_readme_lists_its_slow_examples():
    commands = [c for c, _ in _shown()]
    assert len(commands) >= 3
    for prefix in SLOW:
        assert any(c.startswith(prefix) for c in commands), f"SLOW lists {prefix!r}, no longer in the README"


@pytest.mark.parametrize("command, lines", [s for s in _shown() if os.environ.get("NPUSIM_README_SLOW")
                                            or not s[0].startswith(tuple(SLOW))],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_readme_example_prints_what_the_readme_shows(command, lines, capsys, tmp_path, monkeypatch):
    from npusim.cli import main

    monkeypatch.chdir(tmp_path)  # anything it writes stays out of the checkout
    _link_data(tmp_path, command)
    main(shlex.split(command)[1:])
    captured = capsys.readouterr()
    printed = [line.rstrip() for line in (captured.out + captured.err).splitlines()]
    for line in lines:
        assert line.rstrip() in printed, f"README shows {line!r} for `{command}`; it printed:\n" + "\n".join(printed)


def _fast_commands() -> list[str]:
    """The README's one-line `npusim` commands that run in seconds: one operator, or the tiny decoder."""
    lines = [line for block in _blocks("bash") for line in block.splitlines() if line.startswith("npusim ")]
    return [line for line in lines if line.startswith("npusim op") or "k3-tiny" in line]


@pytest.mark.parametrize("command", _fast_commands())
def test_readme_fast_commands_run(command, tmp_path, monkeypatch, capsys):
    from npusim.cli import main

    assert len(_fast_commands()) >= 5
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command, comments=True)[1:]) == 0, capsys.readouterr().err


def test_readme_main_job_prints_what_the_readme_shows(capsys, tmp_path, monkeypatch):
    """The first command's npusim part (the K3 decode step, a few seconds) prints the
    block the README shows under "The K3 decoder, step by step", line for line."""
    from npusim.cli import main

    command = _blocks("bash")[0].strip().splitlines()[0].split("&& .venv/bin/")[-1]
    shown = README.split("```\nk3 decode on ascend910b2", 1)[1].split("```", 1)[0]
    shown = ("k3 decode on ascend910b2" + shown).strip().splitlines()
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(command)[1:]) == 0
    printed = capsys.readouterr().out.rstrip().splitlines()
    assert [line.rstrip() for line in printed] == [line.rstrip() for line in shown]


def test_the_fidelity_table_shows_what_the_shipped_config_gives():
    """"How close to silicon": the table benchmarks/fidelity.py printed on the shipped
    config; its `config` columns are what the shipped config gives on the public
    measurements now (its `fitted` and `held out` ones take the benchmark's minutes:
    k-fold fits)."""
    from npusim.calibrate.fidelity import as_shipped

    (block,) = [b for b in re.findall(r"```\n(family .*?)```", README, flags=re.S)]
    shown = {}
    for line in block.splitlines()[2:]:
        name, rows, *pcts = re.match(r"(.+?)\s+(\d+)\s+" + r"\s+".join([r"(\d+)%"] * 6) + r"\s*$", line).groups()
        shown[name.strip()] = (int(rows), int(pcts[0]), int(pcts[1]))
    now = {name: (rows, round(100 * med), round(100 * mx))
           for name, rows, med, mx in as_shipped(jobs=os.cpu_count() or 1)}
    assert shown == now


def test_the_readme_is_short():
    """The README starts with the user and sends the rest to docs/: about 300 lines."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def _prose(text: str) -> str:
    """`text` without its fenced blocks, inline code and link targets: what is read as prose."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def _held_out_table() -> dict[str, tuple[int, int, int]]:
    """The README's fidelity table: family -> (rows, held-out median %, held-out max %)."""
    (block,) = [b for b in re.findall(r"```\n(family .*?)```", README, flags=re.S)]
    table = {}
    for line in block.splitlines()[2:]:
        name, rows, *pcts = re.match(r"(.+?)\s+(\d+)\s+" + r"\s+".join([r"(\d+)%"] * 6) + r"\s*$", line).groups()
        table[name.strip()] = (int(rows), int(pcts[4]), int(pcts[5]))
    return table


def test_every_figure_in_the_readme_prose_is_checked():
    """The README's figures are in the outputs the tests above compare with a run; a figure
    in its prose is one of these, each checked against what it states."""
    from npusim.hw import load_hw

    readme = (ROOT / "README.md").read_text()
    target = "the held-out target (median 8%, max 25%)"
    met = {name for name, (rows, med, mx) in _held_out_table().items() if rows >= 5 and med <= 8 and mx <= 25}
    checks = {
        "64": lambda: load_hw("ascend910b2").dma.burst_bytes == 64,  # the 64-byte burst rule
        "1": lambda: "|simulated /\nmeasured - 1|" in readme,  # the error's formula
        "8%": lambda: f"Every family misses {target} except GEMM and copy" in readme and met == {"GEMM", "copy"},
        "25%": lambda: f"Every family misses {target} except GEMM and copy" in readme and met == {"GEMM", "copy"},
    }
    prose = _prose(readme)
    figures = set(re.findall(r"(?<![\w.\-/])\d[\d,]*(?:\.\d+)?%?(?!\w)", prose))
    unchecked = sorted(figures - set(checks))
    assert not unchecked, f"README prose quotes {unchecked}: show them in a checked output or add their check here"
    for figure in figures:
        assert checks[figure](), figure
    counted = {"notebooks": len(list((ROOT / "notebooks").glob("*.ipynb"))),
               "small c files": len(list((ROOT / "npusim" / "engine").glob("*.c")))}
    for word, what in re.findall(rf"\b({'|'.join(_WORDS)}) ({'|'.join(counted)})\b", prose.lower()):
        assert _WORDS.index(word) == counted[what], f"README says {word} {what}, there are {counted[what]}"


# number words the README counts things with ("fifteen notebooks"), by value
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
          "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def _skeleton(line: str) -> str:
    """A printed line with its numbers masked: what stays when the model moves."""
    return " ".join(_NUMBER.sub("#", line).split())


def _link_data(folder: Path, command: str) -> None:
    """A command naming a file from the checkout's root (npusim/data/...) finds it in `folder`."""
    if "npusim/data/" in command:
        (folder / "npusim").symlink_to(ROOT / "npusim")


def _printed(command: str, stderr: bool = True) -> list[str]:
    """The lines `command` prints (stdout, and stderr unless told not), run in a fresh folder."""
    import contextlib
    import io
    import tempfile

    from npusim.cli import main

    out = io.StringIO()
    err = out if stderr else io.StringIO()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        _link_data(Path(tmp), command)
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            main(shlex.split(command)[1:])
        finally:
            os.chdir(cwd)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def rewrite_shown(page: Path) -> list[str]:
    """Rewrite, in `page`, each line a `$ npusim` block shows (SLOW ones too when
    NPUSIM_README_SLOW is set) with the line the command prints now that has the same
    words and other numbers; the commands whose shown lines have no such line are
    returned (to rewrite by hand)."""
    text = page.read_text()
    unmatched = []
    for command, lines in _shown():
        if f"$ {command.split(' ', 1)[0]}" not in text or (command.startswith(tuple(SLOW))
                                                         and not os.environ.get("NPUSIM_README_SLOW")):
            continue
        block = "\n".join(["$ " + command, *lines])
        if block not in text and ("\n".join(lines) not in text or not lines):
            continue
        printed = _printed(command)
        by_skeleton: dict[str, list[str]] = {}
        for line in printed:
            by_skeleton.setdefault(_skeleton(line), []).append(line)
        new = []
        for line in lines:
            candidates = by_skeleton.get(_skeleton(line), [])
            # of the lines with its words, the one sharing most of its numbers (a row's key);
            # several sharing none: which row it was is not known
            shared = [len(set(_NUMBER.findall(line)) & set(_NUMBER.findall(c))) for c in candidates]
            if line.rstrip() in printed:
                new.append(line)
            elif candidates and (max(shared) > 0 or len(candidates) == 1):
                new.append(candidates.pop(shared.index(max(shared))))
            else:
                new.append(line)
                unmatched.append(f"{command}: {line}")
        text = text.replace("\n".join(lines), "\n".join(new), 1)
    page.write_text(text)
    return unmatched


def rewrite_main_job() -> None:
    """The README's block of the main job, as its command prints it now."""
    command = _blocks("bash")[0].strip().splitlines()[0].split("&& .venv/bin/")[-1]
    printed = "\n".join(_printed(command, stderr=False))
    text = (ROOT / "README.md").read_text()
    head, rest = text.split("```\nk3 decode on ascend910b2", 1)
    (ROOT / "README.md").write_text(head + "```\n" + printed.rstrip() + "\n```" + rest.split("```", 1)[1])


if __name__ == "__main__":  # after a change to the model: .venv/bin/python tests/test_readme.py [page.md ...]
    import sys

    if not sys.argv[1:]:
        rewrite_main_job()
    for name in sys.argv[1:] or ("README.md", *_PAGES):
        for miss in rewrite_shown(ROOT / name):
            print(f"{name}: not matched, rewrite by hand: {miss}")
