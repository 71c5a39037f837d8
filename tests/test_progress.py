"""The progress displays: a count without a total shows every step as it starts;
serve's shows the engine steps priced of those known to be needed, the time, an ETA,
the step under way and --max-rate's probe - on stderr, never in stdout."""

import io
import re
import sys

import pytest

from npusim.cli import main
from npusim.progress import pricing_progress, progress_bar


def test_a_count_draws_every_call_at_once():
    """A count of few, long steps after bursts of short ones: the count and the step under
    way must be on screen while a long one runs, not held back by tqdm's throttling until
    the next call."""
    out = io.StringIO()
    bar = progress_bar("run", "kernels", force=True, stream=out)
    for i in range(1, 51):
        bar(i, None, note=f"prefill {i} x 512")
    drawn = out.getvalue()  # before close(), which would draw the last state anyway
    bar.close()
    assert "run: 50 kernels" in drawn and "prefill 50 x 512" in drawn


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pricing_line_counts_steps_and_gives_an_eta_from_the_mean_step():
    clock, out = Clock(), io.StringIO()
    bar = pricing_progress("serve", force=True, stream=out, clock=clock)
    bar.planned([("decode", 1, 64), ("decode", 2, 64)])
    assert bar.line() == "serve: 0/2 engine steps [00:00 elapsed]"
    bar.started(("decode", 1, 64))
    clock.now += 30
    bar.step_priced(("decode", 1, 64), 30.0)
    bar.planned([("decode", 2, 64), ("prefill", 4, 512)])  # one known already: 3 in all
    bar.started(("decode", 2, 64))
    clock.now += 20
    # mean 30 s a priced step, 2 still to price: an estimate of a minute
    assert bar.line() == ("serve: 1/3 engine steps [00:50 elapsed, ~01:00 left (estimate: 30.0 s a step), "
                          "decode 2 x 64]")
    bar.step_priced(("decode", 2, 64), 50.0)
    bar.started(("mixed", 0, 1, 16, 64))  # a step nobody planned (the KV capacity's): counted when it starts
    assert bar.line() == ("serve: 2/4 engine steps [00:50 elapsed, ~01:20 left (estimate: 40.0 s a step), "
                          "mixed 0 x 1 x 16 x 64]")
    bar.probing(12.5, 10.0, 20.0)
    assert "probing 12.5 req/s in [10, 20], mixed" in bar.line()
    bar.close()
    assert out.getvalue().endswith("\n") and "serve: 2/4 engine steps" in out.getvalue()
    assert bar.line() == "serve: 0/0 engine steps [00:00 elapsed]"  # the next service counts anew


def test_the_probe_names_its_bracket_as_far_as_it_is_known():
    bar = pricing_progress("serve", force=False)
    bar.probing(1.0, None, None)
    assert bar.line().endswith("[00:00 elapsed, probing 1 req/s]")
    bar.probing(4.0, 2.0, None)
    assert "probing 4 req/s in [2, ?]" in bar.line()
    bar.probing(0.25, None, 0.5)
    assert "probing 0.25 req/s in [?, 0.5]" in bar.line()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def engine_runs(monkeypatch):
    """The step-cost models `npusim serve` builds, to count their engine runs."""
    import npusim.serving.command as command

    made = []

    class Counted(command.StepCost):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)

    monkeypatch.setattr(command, "StepCost", Counted)
    return lambda: sum(m.engine_runs for m in made)


SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--rate", "5", "--prompt-lengths", "uniform:16,200"]


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.replace("\r", "\n").splitlines() if line.strip()]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_serve_on_a_terminal_shows_steps_priced_of_those_known(monkeypatch, capsys, engine_runs, jobs):
    """On a terminal (no --progress needed) serve draws its line on stderr: the points the
    model will need are counted before they are priced (a line with an ETA and no step
    under way: only the model's plan puts the count ahead then), workers' points are
    under way together, and the last line says every known step was priced, as many as
    the engine ran. stdout is what it is without a terminal. (Without buckets: the grid
    splits cells on the length axes too, and hands their points to the workers.)"""
    argv = SERVE + ["--requests", "2", "--service-set", "passes=optimized", "--jobs", jobs]
    assert main(argv) == 0
    plain = capsys.readouterr()
    assert plain.err == ""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    runs = engine_runs()
    assert main(argv) == 0
    assert capsys.readouterr().out == plain.out
    lines = _lines(terminal.getvalue())
    n = engine_runs() - runs
    assert n > 0 and lines[-1] == f"serve: {n}/{n} engine steps [{lines[-1].split('[')[1]}"
    ahead = [m for m in map(re.compile(r"serve: (\d+)/(\d+) engine steps \[\d\d:\d\d elapsed, ~\d\d:\d\d left "
                                       r"\(estimate: \d+(\.\d)? m?s a step\)(, (decode|prefill|mixed) [\d x]+)?"
                                       r"( and \d more)?\]$").match, lines) if m]
    assert ahead and all(int(m[1]) < int(m[2]) for m in ahead)
    assert any(m[0].endswith(" a step)]") for m in ahead)  # planned, none started yet
    under_way = [re.search(r", (decode|prefill) \d+ x \d+( and \d more)?\]$", line) for line in lines]
    assert any(under_way) and any(m and m[2] for m in under_way) == (jobs == "2")


def test_max_rate_names_each_rate_it_probes_and_its_bracket(monkeypatch, capsys):
    """--max-rate's line names the rate under test and the bracket so far; the rates drawn
    are the ones stdout says it tried, in order; with --no-progress nothing is drawn, even
    on a terminal, and stdout is the same."""
    argv = SERVE + ["--requests", "8", "--max-rate", "--slo", "ttft_ms=500,tpot_ms=50"]
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv + ["--no-progress"]) == 0
    quiet = capsys.readouterr().out
    assert terminal.getvalue() == ""
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out == quiet
    tried = [r.removesuffix(" x") for r in re.search(r"tried ([^;]+);", out)[1].split(", ")]
    drawn = [(m[1], m[2]) for m in map(re.compile(r".*probing ([\d.]+) req/s( in \[[\d.?]+, [\d.?]+\])?").match,
                                       _lines(terminal.getvalue())) if m]
    probes = [p for i, p in enumerate(drawn) if i == 0 or p != drawn[i - 1]]  # a probe is redrawn at each engine step
    assert [rate for rate, _ in probes] == tried
    assert probes[0][1] is None and all(bracket for _, bracket in probes[1:])  # the first probe has no bracket yet
    assert "?" not in probes[-1][1]  # the last ones bisect a bracket known at both ends
