"""FlashAttention builds each distinct structure of its runs' programs once (flash._RunPrograms:
a template with each GM input's base a variable, bound per run) and lowers to the very
kernels building every run's programs anew gives: the same programs, the same sharing of
Program objects between blocks, the same everything else."""

from __future__ import annotations

import importlib

import pytest

from npusim.hw import load_hw
from npusim.isa import Affine, Kernel
from npusim.isa.program import bound
from npusim.isa.verify import verify
from npusim.ops import lower
from npusim.ops.attention import flash

HW = load_hw("ascend910b2")  # 24 cube cores: 30 query heads leave 6 to split into parts


def attn(batch=3, heads=10, kv_heads=None, head_dim=64, seq_q=512, seq_kv=None, causal=True, **kv) -> dict:
    return dict(batch=batch, heads=heads, kv_heads=kv_heads or heads, head_dim=head_dim, seq_q=seq_q,
                seq_kv=seq_kv or seq_q, causal=causal, **kv)


CONTIGUOUS = dict(kv_layout="contiguous", layers=2, layer=1)
SHAPES = {
    "causal, contiguous, leftover heads in parts": attn(**CONTIGUOUS),
    "not causal, contiguous, odd batch": attn(batch=5, heads=6, causal=False, seq_q=384, **CONTIGUOUS),
    "causal, per_layer, short queries": attn(batch=5, heads=7, seq_q=256, seq_kv=512),
    "GQA, contiguous, leftover heads": attn(batch=3, heads=12, kv_heads=4, seq_q=384, causal=False, **CONTIGUOUS),
    "GQA causal, per_layer": attn(batch=1, heads=28, kv_heads=4, seq_q=640),
    "paged": attn(batch=3, heads=4, kv_heads=2, kv_layout="paged", block_tokens=128),
    "paged, leftover heads": attn(batch=1, heads=26, kv_heads=2, seq_q=256, kv_layout="paged", block_tokens=64),
    "decode, packed GQA": attn(batch=5, heads=8, kv_heads=2, seq_q=1, seq_kv=1024, causal=False, **CONTIGUOUS),
    "decode, packed causal GQA": attn(batch=3, heads=16, kv_heads=2, seq_q=4, seq_kv=768, **CONTIGUOUS),
    "head_dim split over chunks": attn(batch=3, heads=9, head_dim=512, seq_q=256, causal=False, **CONTIGUOUS),
}


def sharing(kernel: Kernel) -> tuple:
    """Which blocks run one Program object: each side's programs by first index of their object."""
    return tuple(tuple(next(j for j, q in enumerate(progs) if q is p) for p in progs)
                 for progs in (kernel.aic, kernel.aiv))


def built_anew(monkeypatch, params: dict):
    with monkeypatch.context() as m:
        m.setattr(flash, "_SHARE_BUILDS", False)
        return lower("flash_attention", params, HW)


@pytest.mark.parametrize("params", SHAPES.values(), ids=SHAPES.keys())
def test_shared_builds_lower_the_kernels_built_anew(monkeypatch, params):
    shared, anew = lower("flash_attention", params, HW), built_anew(monkeypatch, params)
    assert shared == anew  # programs, gm, workspace, tiling, ...: every field
    assert [sharing(k) for k in shared.kernels] == [sharing(k) for k in anew.kernels]
    for k in shared.kernels:
        verify(k, HW)


def test_runs_of_one_structure_are_built_once(monkeypatch):
    """Contiguous: each sequence's heads are a run (the layout breaks runs between
    sequences); whole-head runs share one template, each set of parts another."""
    calls = []
    real = flash._fa_programs
    monkeypatch.setattr(flash, "_fa_programs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    kernel = lower("flash_attention", SHAPES["causal, contiguous, leftover heads in parts"], HW).kernels[0]
    runs = len({id(p) for p in kernel.aic})
    assert runs > 4 and len(calls) < runs


def test_bound_substitutes_some_vars_and_leaves_an_int_when_none_is_left():
    a = Affine(0x100, (("block", 64), ("@q", 1), ("i", 8)))
    assert bound(a, {"@q": 0x1000}) == Affine(0x1100, (("block", 64), ("i", 8)))
    assert bound(Affine(4, (("@k", 2),)), {"@k": 10}) == 24  # a plain int, as addr() gives it
    assert bound(a, {"x": 1}) is a and bound(7, {"@q": 1}) == 7


def test_paged_runs_share_a_template(monkeypatch):
    """Paged: every block is a run of its own (its loads follow the table), yet the runs of
    one structure are built once, their block loads' and table row's addresses bound per run."""
    calls = []
    real = flash._fa_programs
    monkeypatch.setattr(flash, "_fa_programs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    kernel = lower("flash_attention", SHAPES["paged"], HW).kernels[0]
    runs = len({id(p) for p in kernel.aic})
    assert runs == kernel.block_dim > 4 and len(calls) < runs


@pytest.mark.parametrize("op, params", [
    ("flash_attention", SHAPES["paged"]),
    ("decode_attention", dict(batch=3, heads=2, kv_heads=2, head_dim=64, context=512, kv_layout="paged",
                              block_tokens=128)),
])
def test_paged_programs_are_verified_as_one_walk_again(monkeypatch, op, params):
    """Every block of a paged attention kernel has a program of its own (its loads follow the
    table), but they share their buffers and every instruction but their copies, so verify
    walks one program of each structure and checks the others as that walk again
    (verify_alike.check_like): their differing copies only."""
    verify_module = importlib.import_module("npusim.isa.verify")  # the module (the package names its function)
    kernel = lower(op, params, HW).kernels[0]
    progs = kernel.aic if op == "flash_attention" else kernel.aiv
    walks = []
    real = verify_module.walk_body
    monkeypatch.setattr(verify_module, "walk_body", lambda *a: walks.append(1) or real(*a))
    verify(kernel, HW)
    assert len(progs) == kernel.block_dim > 4 and len({id(p) for p in progs}) == len(progs)
    assert 0 < len(walks) <= 4


def test_a_template_hole_is_found_by_its_prefix_and_an_empty_variable_name_is_none():
    """_holes read a term's name by its first character: a term of the empty name ("")
    was an IndexError, not a Copy without a base variable."""
    from npusim.isa import Copy, Loop, Mem

    copies = [Copy(Mem.GM, Mem.UB, Affine(0, ((var, 64),)), 0, 64) for var in ("", "@q", "i")]
    assert flash._holes((*copies, Loop("i", 2, (copies[1],)))) == [(1, None), (3, [(0, None)])]
