"""Bad-input catalogue, `npusim serve` (round 9): cards beyond the hardware's topology,
counts of one in messages, trace files a JSON parser chokes on, and values of
thousands of characters quoted whole. Each a one-line error before any step is priced."""

import pytest

from cli_check import fails_cleanly, one_line_error
from npusim.errors import ConfigError
from npusim.serving import StepCost
from npusim.serving.cluster import Cluster
from npusim.serving.service import SchedulerConfig, ServiceConfig

SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--requests", "5"]
TOPOLOGY = r"but ascend910b2's topology has 32 \(topology.node_device_count 8 x topology.node_count 4\): give at most 32"


# ---- cards beyond the topology: --cards 64 served 64 replicas, 32 of them on nodes the config has not


@pytest.mark.parametrize("argv, expect", [
    (["--rate", "10", "--cards", "33"], rf"--cards: 33 cards, {TOPOLOGY}"),
    (["--rate", "10", "--cards", "64", "--tp", "2"], rf"--cards: 64 cards, {TOPOLOGY}"),
    (["--rate", "10", "--service", "vllm-continuous", "--pd", "20:20"], rf"--pd 20:20: 40 cards, {TOPOLOGY}"),
    (["--rate", "10", "--plan", "--max-cards", "33"], rf"--max-cards: 33 cards, {TOPOLOGY}"),
    (["--rate", "10", "--tp", "2", "--set", "topology.node_device_count=1", "--set", "topology.node_count=1"],
     r"--tp 2: 2 cards, but ascend910b2's topology has 1 "),
])
def test_serve_more_cards_than_the_topology_has(argv, expect, capsys):
    fails_cleanly([*SERVE, *argv], capsys, expect, seconds=10)


def test_serve_a_cluster_of_more_cards_than_the_topology_has():
    """The API's door: a decode side's cards follow the prefill side's."""
    svc = ServiceConfig("t", SchedulerConfig("continuous", max_batch=8), "optimized")
    cost = StepCost("k3-tiny", "ascend910b2", "optimized", max_batch=8)
    one_line_error(lambda: Cluster(svc, cost, 33), ConfigError, r"cards: 33 cards, but ascend910b2's topology has 32")
    one_line_error(lambda: Cluster(svc, cost, 4, role="decode", first_index=30), ConfigError,
                   r"cards: 34 cards, but ascend910b2's topology has 32")


# ---- a count of one is one request, card, cluster, step: '1 requests per probe do not load it'


def test_counted():
    from npusim.hw.parse import counted

    assert [counted(n, "request") for n in (0, 1, 2)] == ["0 requests", "1 request", "2 requests"]
    assert counted(1, "card count") == "1 card count" and counted(3, "box", "boxes") == "3 boxes"


@pytest.mark.parametrize("argv, expect", [
    (["--rate", "1e-10", "--requests", "1"], r"--rate: the one request would arrive over .* s, more than the 1e\+09"),
    (["--rate", "10", "--requests", "1", "--max-rate", "--prompt-lengths", "fixed:600"],
     r"--max-rate: the one request \(--prompt-lengths fixed:600, --output-lengths fixed:64\) is longer than the "
     r"workload's context of 512 tokens: each probe would reject it \("),
    (["--rate", "10", "--service", "vllm-continuous", "--pd", "2:1", "--tp", "2"],
     r"--pd 2:1: --tp 2 does not divide the 1 decode card \(each"),
])
def test_serve_a_count_of_one_in_an_error(argv, expect, capsys):
    fails_cleanly([*SERVE, *argv], capsys, expect, seconds=10)


def test_serve_a_count_of_one_in_the_summary(capsys):
    """One request, longer than the context: rejected, and the step-cost model priced one point."""
    from npusim.cli import main

    assert main([*SERVE, "--requests", "1", "--rate", "10", "--prompt-lengths", "fixed:600"]) == 0
    out = capsys.readouterr().out
    assert "step costs interpolated from 1 engine-simulated step\n" in out


def test_serve_max_rate_of_one_request_per_probe(capsys):
    fails_cleanly([*SERVE, "--requests", "1", "--rate", "100", "--max-rate"], capsys,
                  r"up to 1\.05e\+08 req/s: 1 request per probe does not load it \(give more --requests\)$", seconds=20)


def test_serve_plan_of_one_cluster(capsys, tmp_path):
    from npusim.cli import main

    out = tmp_path / "plan.json"
    assert main([*SERVE, "--requests", "1", "--rate", "10", "--plan", "--max-cards", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert ": 1 Poisson request at 10 req/s (seed 0)" in text
    assert "; 1 cluster tried on 1 card count\n" in text
    assert f"wrote {out}: the answer, the frontier and the one cluster tried\n" in text


def test_serve_one_request_lost_in_words():
    from npusim.serving.report import missed
    from npusim.serving.service import Slo

    m = {"timed_out": 1, "failed_oom": 0, "ttft": {"p90_ms": 5.0}, "tpot": {"p99_ms": 1.0}, "e2e": {"p90_ms": 9.0},
         "completed": 0}
    assert missed(m, Slo(ttft_ms=1.0)) == "TTFT P90 5 ms > 1 ms, 1 request lost"
    assert missed(m | {"failed_oom": 1}, Slo()) == "2 requests lost"


# ---- a JSONL trace json.loads raises other than JSONDecodeError on: a traceback from inside json


@pytest.mark.parametrize("line, expect", [
    ('{"arrival_s": 0, "prompt_tokens": ' + "9" * 5000 + ', "output_tokens": 5}',
     r"t\.jsonl: line 2: not valid JSON for a request: a number with too many digits$"),
    ("[" * 100_000, r"t\.jsonl: line 2: not valid JSON for a request: nested too deep$"),
])
def test_serve_a_trace_line_json_cannot_read(line, expect, capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n' + line + "\n")
    fails_cleanly(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", trace], capsys, expect, seconds=10)


# ---- a trace's value of thousands of characters was quoted whole (a line as long); 300 nines read as 1000...00540160


@pytest.mark.parametrize("name, row, expect", [
    ("t.csv", "0," + "x" * 100_000 + ",5",
     r"t\.csv: row 3: column 'prompt_tokens': expected an integer, got 'x{30}\.\.\.x{30} \(100000 characters\)'$"),
    ("t.csv", "0," + "9" * 300 + ",5",
     r"t\.csv: row 3: column 'prompt_tokens': expected at most 16777216 tokens, got 9999999999\.\.\.99999999999$"),
    ("t.csv", "0,1\x000,5", r"t\.csv: row 3: column 'prompt_tokens': expected an integer, got '1\\x000'$"),
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": [' + "1, " * 50_000 + '1], "output_tokens": 5}',
     r"t\.jsonl: line 2: column 'prompt_tokens': expected an integer, got \[1, 1, 1, 1, \.\.\.\]$"),
    ("t.jsonl", '{"arrival_s": 0, "prompt_tokens": ' + "9" * 4000 + ', "output_tokens": 5}',
     r"t\.jsonl: line 2: column 'prompt_tokens': expected at most 16777216 tokens, got 9999999999\.\.\.99999999999$"),
])
def test_serve_a_trace_value_quoted_short(name, row, expect, capsys, tmp_path):
    trace = tmp_path / name
    first = ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}' if name.endswith("jsonl") else
             "arrival_s,prompt_tokens,output_tokens\n0,10,5")
    trace.write_text(f"{first}\n{row}\n")
    err = fails_cleanly(["serve", "--workload", "k3-tiny", "--no-cache", "--trace-file", trace], capsys, expect,
                        seconds=10)
    assert len(err) < 300


def test_serve_trace_counts_read_exactly(tmp_path):
    """Whole counts in any spelling a trace has used ('+12', ' 13 ', '10.0', '1e3') read as before."""
    from npusim.serving.arrivals import load_trace

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,+12,5\n0, 13 ,5\n0,10.0,1e3\n0,-0.0,5\n")
    with pytest.raises(ConfigError, match=r"row 5: column 'prompt_tokens': expected a count >= 1, got 0$"):
        load_trace(trace)
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,+12,5\n0, 13 ,5\n0,10.0,1e3\n")
    assert [(r.prompt_tokens, r.output_tokens) for r in load_trace(trace)] == [(12, 5), (13, 5), (10, 1000)]


# ---- a service's value said whole: YAML's 1e300 for a count as 301 digits, a name or kind of 5000 characters


@pytest.mark.parametrize("text, expect", [
    ("scheduler: {kind: static, max_batch: 1e300}\n", r"'max_batch' must be from 1 to 1024 sequences .*: 1e\+300$"),
    ("scheduler: {kind: chunked, token_budget: -1e300}\n", r"'token_budget' must be > 0: -1e\+300$"),
    ("scheduler: {kind: static}\npasses: optimized,buckets\nmargin: -1e300\n", r"'margin' must be >= 0: -1e\+300$"),
    ("scheduler: {kind: static}\npasses: optimized,buckets\nbuckets: [1e300]\n",
     r"'buckets' must be a non-empty list of lengths from 1 to 16777216 tokens: \[1e\+300\]$"),
    ("scheduler: {kind: static, max_batch: -" + "9" * 400 + "}\n",
     r"'max_batch' must be from 1 to 1024 .*: -9{9}\.\.\.9{11}$"),
    ("name: a/" + "x" * 5000 + "\nscheduler: {kind: static}\n",
     r"'name' must be a plain name.*: 'a/x{28}\.\.\.x{30} \(5002 characters\)'$"),
    ("scheduler: {kind: " + "x" * 5000 + "}\n",
     r"unknown scheduler 'x{30}\.\.\.x{30} \(5000 characters\)' \(expected one of"),
    ("scheduler: {kind: static}\nhost: {preprocess_on: " + "x" * 5000 + "}\n",
     r"key 'host.preprocess_on': expected one of pool, inference_thread, got 'x{30}\.\.\.x{30} \(5000 characters\)'$"),
    ("scheduler: {kind: static}\nkv_layout: " + "x" * 5000 + "\n",
     r"key 'kv_layout': expected one of contiguous, paged, got 'x{30}\.\.\.x{30} \(5000 characters\)'$"),
    ("scheduler: {kind: continuous, kv_memory_fraction: 2}\n", r"'kv_memory_fraction' must be <= 1: 2\.0$"),
])
def test_serve_a_service_value_said_short(text, expect, capsys, tmp_path):
    svc = tmp_path / "svc.yaml"
    svc.write_text(text)
    err = fails_cleanly([*SERVE, "--rate", "1", "--service", svc], capsys, expect, seconds=10)
    assert len(err) < 400  # the path of a pytest tmp_path is long


# ---- a lengths file: a value of 5000 digits was int()'s traceback; an empty one named no flag


@pytest.mark.parametrize("text, expect", [
    ("10\n" + "7" * 5000 + "\n", r"^npusim: error: --output-lengths: .*l\.txt: value 2: expected a whole token count "
                                 r"from 1 to 16777216, got '7{30}\.\.\.7{30} \(5000 characters\)'$"),
    ("", r"^npusim: error: --output-lengths: .*l\.txt: no lengths in the file \(expected whole token counts"),
])
def test_serve_a_lengths_file_refused_in_one_line(text, expect, capsys, tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text(text)
    fails_cleanly([*SERVE, "--rate", "10", "--output-lengths", f"file:{lengths}"], capsys, expect, seconds=10)


def test_serve_a_lengths_file_with_leading_zeros_reads_as_before(tmp_path):
    import numpy as np

    from npusim.serving.arrivals import lengths

    f = tmp_path / "l.txt"
    f.write_text("0000000000000010\n16777216\n")
    assert set(lengths(f"file:{f}", 50, np.random.default_rng(0)).tolist()) == {10, 16777216}
