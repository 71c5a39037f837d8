"""Every shipped workload runs one decode and one prefill step under every shipped
pass pipeline on every shipped hardware config. Small shapes: batch 2, a short
context, and ONE decoder layer (every layer runs the same ops on the same shapes,
so depth adds simulation time, not coverage); the op shapes that depend on the
model's widths - hidden, FFN, heads, vocabulary - are the model's own, so a kernel
that cannot tile them fails here."""

from __future__ import annotations

from importlib import resources

import attrs
import pytest

from npusim.runtime import LoweringCache
from npusim.runtime.decoder import run_decoder
from npusim.workload import load_workload

SHIPPED_WORKLOADS = ("k3", "k3-tiny", "k3-tiny-moe", "k3-tiny-outliers", "llama2-7b", "mixtral-8x7b", "qwen2.5-7b",
                     "qwen3-30b-a3b", "yi-1.5-6b")
SHIPPED_HW = ("ascend910b1", "ascend910b2", "ascend910b3", "ascend910b4")
PIPELINES = ("baseline", "optimized")
# decode: context per sequence (the new token included); prefill: prompt length
SMALL = {"decode": 16, "prefill": 8}

_CACHE = LoweringCache()  # the four pipelines of one workload and config share lowerings


def _shipped(folder: str) -> set[str]:
    return {p.name.removesuffix(".yaml") for p in resources.files("npusim").joinpath(folder).iterdir()
            if p.name.endswith(".yaml")}


def test_the_lists_here_are_what_ships():
    assert _shipped("workloads") == set(SHIPPED_WORKLOADS)
    assert _shipped("hwconfigs") == set(SHIPPED_HW)


@pytest.mark.parametrize("passes", PIPELINES)
@pytest.mark.parametrize("phase", sorted(SMALL))
@pytest.mark.parametrize("hw", SHIPPED_HW)
@pytest.mark.parametrize("workload", SHIPPED_WORKLOADS)
def test_workload_runs(workload, hw, phase, passes):
    one_layer = attrs.evolve(load_workload(workload), layers=1)
    run = run_decoder(one_layer, hw, phase, batch=2, context=SMALL[phase], passes=passes, cache=_CACHE)
    r = run.result
    assert r.cycles > 0 and r.us > 0
    assert r.stats.flops > 0 and r.stats.gm_read_bytes > 0
    assert run.memory.fits
