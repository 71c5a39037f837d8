"""Expert capacity (Workload.capacity_factor, GShard/Switch): a skewed routing capped at
capacity factor 1 drops rows and runs no slower, a cap no expert reaches changes
nothing, the dropped rows are those over ceil(factor x tokens x k / experts) in the
routing's own counts (one device and expert parallel), and a bad factor is one line.
Also: expert parallelism combined with tensor or sequence parallelism is refused in one
line saying what is modelled."""

import math
import re

import attrs
import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.graph.routing import draw_routing
from npusim.hw import load_hw
from npusim.report.moe import moe_breakdown, moe_lines
from npusim.report.step import step_json, summary
from npusim.runtime.decoder import run_decoder
from npusim.workload import load_workload

HW = load_hw("ascend910b2")
PROMPT = 128  # prefill tokens: enough rows that the expert GEMMs' sizes show in their time
ZIPF = load_workload("k3-tiny-moe", {"routing": "zipf", "routing_zipf_exponent": 1.2})


def _prefill(w, **kw):
    return run_decoder(w, HW, "prefill", 1, PROMPT, "optimized", memo=False, **kw)


def _group_sizes(run) -> dict[int, tuple[int, ...]]:
    """Layer -> the rows per expert its first grouped matmul runs over."""
    out = {}
    for n in run.graph.nodes:
        if n.op_type == "grouped_matmul":
            out.setdefault(n.layer, tuple(n.args.group_sizes))
    return out


def _expected_drops(w, layer: int, tokens: int, factor: float) -> tuple[int, list[int]]:
    """(dropped rows, kept rows per expert) from the uncapped routing's ids, by hand."""
    counts = np.bincount(draw_routing(w, layer, tokens).ids.ravel(), minlength=w.experts)
    cap = math.ceil(factor * tokens * w.experts_per_token / w.experts)
    return int(np.maximum(counts - cap, 0).sum()), [int(min(c, cap)) for c in counts]


def test_zipf_capped_at_one_drops_rows_and_is_no_slower():
    capped = attrs.evolve(ZIPF, capacity_factor=1.0)
    free, cut = _prefill(ZIPF), _prefill(capped)
    mf, mc = moe_breakdown(free), moe_breakdown(cut)
    cap = math.ceil(PROMPT * ZIPF.experts_per_token / ZIPF.experts)
    assert mc["expert_capacity_rows"] == cap
    assert max(map(max, mf["tokens_per_expert"])) > cap  # the skew overfills an expert ...
    assert max(map(max, mc["tokens_per_expert"])) == cap  # ... which the cap holds to its capacity
    assert all(d > 0 for d in mc["dropped_rows"])
    kept = {n.layer: sum(n.args.group_sizes) for n in cut.graph.nodes if n.op_type == "grouped_matmul"}
    silu = {n.layer: n.args.shape[0] for n in cut.graph.nodes if n.name.endswith("experts_silu")}
    assert silu == kept and all(r < PROMPT * ZIPF.experts_per_token for r in kept.values())  # activations shrink too
    assert mc["us"]["experts"] < mf["us"]["experts"]
    assert cut.latency_us <= free.latency_us
    line = next(x for x in moe_lines(mc) if x.lstrip().startswith("routing"))
    assert re.search(rf"capacity factor 1 \({cap} rows per expert\): [\d.]+ rows dropped per MoE layer", line)
    assert "capacity" not in summary(free) and "dropped_rows" not in step_json(free)["moe"]


def test_a_cap_no_expert_reaches_is_bit_identical():
    big = attrs.evolve(ZIPF, capacity_factor=100.0)
    a, b = _prefill(ZIPF), _prefill(big)
    ja, jb = step_json(a), step_json(b)
    moe_b = jb.pop("moe")
    assert moe_b.pop("dropped_rows") == [0] * ZIPF.moe_layers
    for key in ("capacity_factor", "expert_capacity_rows", "routed_rows", "dropped_share"):
        moe_b.pop(key)
    assert ja.pop("moe") == moe_b
    assert ja == jb
    assert [k.cycles for k in a.result.kernels] == [k.cycles for k in b.result.kernels]


@pytest.mark.parametrize("ep", [1, 2])
def test_dropped_rows_are_those_over_capacity(ep):
    """Over an expert-parallel group the cap applies per expert to the group's tokens;
    the simulated (busiest) device's grouped matmuls run over its experts' kept rows."""
    factor = 1.25
    run = _prefill(attrs.evolve(ZIPF, capacity_factor=factor), ep=ep, devices=ep)
    b = moe_breakdown(run)
    groups = _group_sizes(run)
    for i, layer in enumerate(b["layers"]):
        dropped, kept = _expected_drops(ZIPF, layer, PROMPT * ep, factor)
        assert dropped > 0 and b["dropped_rows"][i] == dropped
        assert b["dropped_share"][i] == dropped / (PROMPT * ep * ZIPF.experts_per_token)
        per = ZIPF.experts // ep
        assert groups[layer] in {tuple(kept[c * per:(c + 1) * per]) for c in range(ep)}


@pytest.mark.parametrize("value, expect", [
    ("-1", r"key 'capacity_factor': expected a finite value >= 0 \(0 = no cap\), got -1.0"),
    (".nan", r"key 'capacity_factor': expected a finite value >= 0 \(0 = no cap\), got nan"),
    ("lots", r"key 'capacity_factor': expected a number, got 'lots'"),
])
def test_bad_capacity_factor_is_one_line(tmp_path, value, expect):
    text = (load_workload.__globals__["find_file"]("k3-tiny-moe", "workloads")).read_text()
    p = tmp_path / "bad.yaml"
    p.write_text(re.sub(r"^capacity_factor:.*$", f"capacity_factor: {value}", text, flags=re.M))
    with pytest.raises(ConfigError, match=r"bad.yaml: " + expect) as e:
        load_workload(p)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"key 'capacity_factor': set for a dense FFN"):
        load_workload("k3-tiny", {"capacity_factor": 1})


@pytest.mark.parametrize("sets", [{"routing": "zipf"}, {"routing": "trace", "routing_trace": "t.yaml"},
                                  {"first_dense_layers": 1}, {"routing_zipf_exponent": 2}, {"routing_seed": 7}])
def test_routing_a_dense_ffn_is_one_line(sets):
    """routing=zipf (or a trace, first_dense_layers, a zipf exponent, a seed) on a dense FFN ran as if not given."""
    key = next(k for k in ("first_dense_layers", "routing_zipf_exponent", "routing_seed", "routing_trace", "routing")
               if k in sets)
    with pytest.raises(ConfigError, match=rf"\(--workload-set\): key '{key}': set for a dense FFN \(mlp: swiglu\); "
                                          r"experts need mlp: moe$"):
        load_workload("k3-tiny", sets)


def test_ep_with_sp_says_what_is_modelled():
    with pytest.raises(ConfigError, match=r"^--ep 2 with --sp 2: expert parallelism is modelled with data-parallel "
                                          r"attention .*not sequence parallel$"):
        run_decoder(ZIPF, HW, "prefill", 1, 16, ep=2, sp=2)


def test_validate_checks_a_capped_workload_by_its_router():
    """numpy routes by the router's scores, so the cap on the timing draw's counts plays no
    part there: validate runs the capped workload's numerics, uncapped, and passes."""
    from npusim.passes.validate import validate_passes

    check = validate_passes(attrs.evolve(ZIPF, capacity_factor=1.0))
    assert check.moe and all(c.transformed > 0.999 for c in check.checks if c.is_float)


@pytest.mark.parametrize("routing", ["uniform", "trace"])
def test_a_zipf_exponent_without_zipf_routing_is_one_line(routing, tmp_path):
    """routing_zipf_exponent: 2 with routing: zipf left out drew the experts uniformly, silently."""
    sets = {"routing": routing, "routing_zipf_exponent": 2} | (
        {"routing_trace": str(tmp_path / "t.yaml")} if routing == "trace" else {})
    with pytest.raises(ConfigError, match=rf"\(--workload-set\): key 'routing_zipf_exponent': shapes routing: zipf "
                                          rf"only, got routing: {routing}$"):
        load_workload("k3-tiny-moe", sets)
