"""verify() runs once per distinct kernel in a process (engine.run._verify_once), and a
step that skipped it still counts the config fields it reads (the disk cache's key)."""

import importlib

import attrs

from npusim.diskcache.reads import recording
from npusim.engine import Launch, Synchronize, run
from npusim.hw import load_hw
from npusim.ops import lower

engine_run = importlib.import_module("npusim.engine.run")  # (npusim.engine.run is also the function's name)


def test_a_renamed_kernel_is_verified_once(monkeypatch):
    hw = load_hw()
    kernel = lower("add", {}, hw).kernels[0]
    calls = []
    real = engine_run.verify
    monkeypatch.setattr(engine_run, "verify", lambda k, hw: calls.append(k.name) or real(k, hw))
    monkeypatch.setattr(engine_run, "_VERIFIED", type(engine_run._VERIFIED)())
    first = run([Launch(kernel), Synchronize()], hw)
    second = run([Launch(attrs.evolve(kernel, name="again")), Synchronize()], hw)
    assert len(calls) == 1 and first.cycles == second.cycles
    run([Launch(kernel), Synchronize()], load_hw())  # another config object: checked again
    assert len(calls) == 2


def test_a_skipped_verify_still_records_its_reads(monkeypatch):
    hw = load_hw()
    kernel = lower("add", {}, hw).kernels[0]
    monkeypatch.setattr(engine_run, "_VERIFIED", type(engine_run._VERIFIED)())
    from npusim.diskcache.reads import tracked

    t = tracked(hw)
    reads = []
    for _ in range(2):
        with recording() as r:
            run([Launch(kernel), Synchronize()], t)
        reads.append(r)
    assert "aiv.ub_bytes" in reads[0] and reads[0] == reads[1]
