"""The mixed (chunked-prefill) step graph: one engine step for decodes and prefill
chunks together, consistent with the decode and prefill graphs at its edges."""

import pytest

from npusim.errors import ConfigError
from npusim.graph.build import build_decoder
from npusim.hw import load_hw
from npusim.passes import apply
from npusim.runtime.decoder import run_decoder
from npusim.runtime.run import run_graph

HW = load_hw("ascend910b2")


def mixed_us(passes, lengths, new_tokens, **options) -> float:
    g = build_decoder("k3-tiny", "mixed", len(lengths), lengths, new_tokens=new_tokens)
    return run_graph(apply(g, passes, hw=HW, **options), HW).latency_us


@pytest.mark.parametrize("passes", ["baseline", "optimized"])
def test_mixed_edges_are_decode_and_prefill(passes):
    """Only decodes: the decode step, bit for bit; only whole-prompt chunks: the prefill."""
    assert mixed_us(passes, [100, 80, 60], [1, 1, 1]) == run_decoder("k3-tiny", HW, "decode", 3, [100, 80, 60],
                                                                     passes).latency_us
    assert mixed_us(passes, [48, 48], [48, 48]) == run_decoder("k3-tiny", HW, "prefill", 2, 48, passes).latency_us


@pytest.mark.parametrize("passes, options", [("baseline", {}), ("optimized", {}), ("optimized", {"kv_layout": "paged"}),
                                             ("optimized,buckets", {})])
def test_mixed_step_is_one_step(passes, options):
    """Decodes beside a chunk share one pass over the weights and one set of launches:
    less than the decode step and the chunk's prefill run one after the other, more
    than either alone."""
    both = mixed_us(passes, [200, 150, 120, 96], [1, 1, 1, 64], **options)
    dec = mixed_us(passes, [200, 150, 120], [1, 1, 1], **options)
    chunk = mixed_us(passes, [96], [64], **options)
    assert max(dec, chunk) < both < dec + chunk


def test_mixed_chunk_attends_to_its_prefix():
    """A chunk late in a long prompt reads more cache than the same chunk at its start."""
    assert mixed_us("optimized", [1, 400], [1, 64])  > mixed_us("optimized", [1, 64], [1, 64])
    g = build_decoder("k3-tiny", "mixed", 3, [90, 100, 300], new_tokens=[1, 1, 32])
    assert g.tokens == 34 and g.seq == 32
    fused = apply(g, "optimized", hw=HW)
    kinds = {n.name: n.op_type for n in fused.nodes if n.layer == 0}
    assert kinds["L0.attention"] == "decode_attention" and kinds["L0.chunk_attention"] == "flash_attention"


@pytest.mark.parametrize("new_tokens, match", [
    (None, "new_tokens must list one count per sequence"),
    ([1, 2], "new_tokens must list one count per sequence"),
    ([1, 0, 1], "positive integers"),
    ([1, 1, 200], "no longer than their sequence's length"),
    ([8, 1, 1], "decodes (1) before the prefill chunks"),
])
def test_mixed_bad_new_tokens(new_tokens, match):
    with pytest.raises(ConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
        build_decoder("k3-tiny", "mixed", 3, [90, 100, 120], new_tokens=new_tokens)


def test_new_tokens_only_in_mixed():
    with pytest.raises(ConfigError, match="mixed phase only"):
        build_decoder("k3-tiny", "decode", 2, 64, new_tokens=[1, 1])
