"""verify() checks a program like the last one walked on its core (the same objects but some
Copy, Mmad or VecOp: a FlashAttention kernel's runs, one template bound apart) as that
walk again: the listed checks that read `block` or `sub` with its own ranges, the
differing instructions in full. It stays as strict as walking every program: a bad
address planted in one of several alike programs is reported with the line a full walk
gives, naming that program's blocks."""

from __future__ import annotations

import importlib

import attrs
import pytest

from npusim.errors import ProgramError
from npusim.hw import load_hw
from npusim.isa import Buffer, Copy, CoreType, GmTensor, Kernel, Loop, Mem, Program, SetFlag, VecOp, addr, verify
from npusim.isa.program import shift
from npusim.ops import lower

verify_module = importlib.import_module("npusim.isa.verify")  # (npusim.isa.verify is also the function's name)
HW = load_hw("ascend910b2")
GM, UB = Mem.GM, Mem.UB
# 5 sequences x 6 heads: four whole-head runs of 6 blocks alike (contiguous KV: a run per
# sequence, on 24 cube cores), then the fifth sequence's heads split into parts
PARAMS = dict(batch=5, heads=6, kv_heads=6, head_dim=64, seq_q=768, seq_kv=768, causal=False,
              kv_layout="contiguous", layers=2, layer=1)


@pytest.fixture(scope="module")
def fa() -> Kernel:
    return lower("flash_attention", PARAMS, HW).kernels[0]


def error(kernel: Kernel, monkeypatch, alike: bool) -> str:
    """verify's one line for a bad kernel; alike=False walks every program in full."""
    with monkeypatch.context() as m:
        if not alike:
            m.setattr(verify_module, "check_like", lambda *a: None)
        with pytest.raises(ProgramError) as e:
            verify(kernel, HW)
    return str(e.value)


def assert_same_error(kernel: Kernel, monkeypatch, where: str) -> None:
    """The error names `where`, and walking every program in full gives the same line."""
    line = error(kernel, monkeypatch, alike=True)
    assert where in line and line == error(kernel, monkeypatch, alike=False)


def paths(body: tuple, prefix=()):
    """(path, instruction) of a body in walk order, loops' bodies included."""
    for i, x in enumerate(body):
        yield prefix + (i,), x
        if x.__class__ is Loop:
            yield from paths(x.body, prefix + (i,))


def replaced(body: tuple, path: tuple, new) -> tuple:
    """body with the instruction at `path` replaced by `new`."""
    i, rest = path[0], path[1:]
    x = new if not rest else Loop(body[i].var, body[i].count, replaced(body[i].body, rest, new))
    return body[:i] + (x,) + body[i + 1:]


def planted(kernel: Kernel, side: str, block: int, pick, change) -> Kernel:
    """The kernel with one instruction of the program `block` runs on `side` changed: the first,
    in walk order, for which pick(path, instr) holds, made change(instr); every block
    running that Program object runs the changed one."""
    progs = getattr(kernel, side)
    old = progs[block]
    path, instr = next((p, x) for p, x in paths(old.body) if pick(p, x))
    new = Program(replaced(old.body, path, change(instr)), old.buffers)
    return attrs.evolve(kernel, **{side: [new if p is old else p for p in progs]})


def gm_load(path, x) -> bool:
    return x.__class__ is Copy and x.src is GM


def test_alike_runs_are_checked_like_the_first(fa, monkeypatch):
    """The kernel's whole-head runs are distinct Program objects, checked but the first as alike."""
    runs = [fa.aic[b] for b in (0, 6, 12, 18)]
    assert len({id(p) for p in runs}) == 4
    alike = []
    real = verify_module.check_like
    monkeypatch.setattr(verify_module, "check_like", lambda *a: alike.append(real(*a)) or alike[-1])
    verify(fa, HW)
    assert sum(w is not None for w in alike) >= 2 * 3  # runs 2..4 on the AIC and each AIV sub 0


def test_a_bad_gm_load_in_one_run_is_reported(fa, monkeypatch):
    bad = planted(fa, "aic", 12, gm_load, lambda c: c.moved(shift(c.src_addr, 1 << 40), c.dst_addr))
    assert_same_error(bad, monkeypatch, "blocks 12..17, AIC: instr ")


def test_a_bad_gm_load_in_one_runs_loop_is_reported(fa, monkeypatch):
    bad = planted(fa, "aic", 6, lambda p, x: len(p) > 1 and gm_load(p, x),
                  lambda c: c.moved(shift(c.src_addr, 1 << 40), c.dst_addr))
    assert_same_error(bad, monkeypatch, "blocks 6..11, AIC: instr ")


def test_a_bad_ub_address_in_one_runs_loop_is_reported(fa, monkeypatch):
    bad = planted(fa, "aiv", 18, lambda p, x: len(p) > 1 and x.__class__ is VecOp,
                  lambda v: v.moved(shift(v.dst, 1 << 20), v.srcs))
    assert_same_error(bad, monkeypatch, "blocks 18..23, AIV sub 0: instr ")


def test_a_workspace_too_small_for_the_last_runs_blocks_is_reported(fa, monkeypatch):
    """The workspace accesses are the same instructions in every run: only their `block`
    range tells the last runs' apart (the listed checks, run again with each run's range)."""
    ws = next(t for t in fa.gm if t.name == "workspace")
    per_block = ws.nbytes // fa.block_dim
    small = attrs.evolve(fa, gm=[attrs.evolve(t, nbytes=18 * per_block) if t is ws else t for t in fa.gm])
    assert_same_error(small, monkeypatch, "blocks 18..23, AIC: instr ")


def test_a_run_whose_flags_differ_is_walked_in_full(fa, monkeypatch):
    bad = planted(fa, "aic", 12, lambda p, x: x.__class__ is SetFlag, lambda f: SetFlag(f.src, f.dst, f.id + 6))
    assert_same_error(bad, monkeypatch, "blocks 12..17, AIC: instr ")


def test_an_equal_but_not_identical_numpy_address_still_fails(monkeypatch):
    """Instructions equal to the reference's but other objects are checked in full."""
    np = pytest.importorskip("numpy")
    buffers = (Buffer("x", UB, 0, 4096),)
    ok, odd = VecOp("add", 8, "fp16", 64, (0,)), VecOp("add", 8, "fp16", np.int64(64), (0,))
    assert ok == odd  # equal: only the address's type tells them apart
    store = Copy(UB, GM, 0, addr(0, block=64), 64)
    first, second = (Program([Loop("i", 4, [op]), store], buffers) for op in (ok, odd))
    kernel = Kernel("k", CoreType.AIV, 3, aiv=[first, first, second])
    assert_same_error(kernel, monkeypatch, "block 2, AIV: instr 0.0 VecOp")


def test_a_bad_address_in_one_of_several_small_alike_programs(monkeypatch):
    """Shared objects but one load per program, the third's outside the GM tensors; and
    the store of the shared ones reads `block`, rechecked with each program's block."""
    buffers = (Buffer("x", UB, 0, 4096),)
    shared = [VecOp("add", 8, "fp16", 0, (0,)), Copy(UB, GM, 0, addr(0x2000, block=64), 64)]

    def program(load: int) -> Program:
        return Program([Loop("i", 2, [Copy(GM, UB, load, 0, 64), *shared])], buffers)

    progs = [program(0x1000 + 64 * b) for b in range(3)]
    gm = [GmTensor("in", 0x1000, 192), GmTensor("out", 0x2000, 192)]
    ok = Kernel("k", CoreType.AIV, 3, aiv=progs, gm=gm)
    verify(ok, HW)
    far = attrs.evolve(ok, aiv=[*progs[:2], program(0x3000)])
    assert_same_error(far, monkeypatch, "block 2, AIV: instr 0.0 Copy")
    short = attrs.evolve(ok, gm=[gm[0], GmTensor("out", 0x2000, 128)])  # block 2's store lands past it
    assert_same_error(short, monkeypatch, "block 2, AIV: instr 0.2 Copy")
