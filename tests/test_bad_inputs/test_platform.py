"""Issue 35, finding 21: the calls only Linux has (os.sysconf's SC_AVPHYS_PAGES, the
`resource` module, signal.pthread_sigmask) taken away, as on macOS or Windows: each
degrades to its stated fallback instead of crashing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from npusim.cli import main
from npusim.graph.build import build_decoder
from npusim.passes import validate as v
from npusim.pool import run_tasks
from npusim.workload import load_workload

GiB = 2**30


def _sysconf_without(*missing: str):
    """os.sysconf as on an OS that lacks the names `missing` (macOS: SC_AVPHYS_PAGES)."""
    real = os.sysconf

    def sysconf(name):
        if name in missing:
            raise ValueError("unrecognized configuration name")
        return real(name)

    return sysconf


def test_without_sc_avphys_pages_the_physical_memory_stands_for_the_available(monkeypatch):
    monkeypatch.setattr(os, "sysconf", _sysconf_without("SC_AVPHYS_PAGES"))
    monkeypatch.setitem(sys.modules, "resource", None)  # and no ulimit to read: import fails
    assert v.available_host_bytes() == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_without_resource_the_available_memory_is_not_capped(monkeypatch):
    """Windows has no `resource` module: validate imports and reads no limit."""
    code = ("import sys; sys.modules['resource'] = None; import npusim.passes.validate as v; "
            "print(v.available_host_bytes() > 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
    monkeypatch.setitem(sys.modules, "resource", None)
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 3 * 2**18, "SC_PAGE_SIZE": 4096}[name])
    assert v.available_host_bytes() == 3 * GiB


def test_an_address_space_limit_caps_the_available_memory(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda what: (GiB, resource.RLIM_INFINITY))
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 2**20, "SC_PAGE_SIZE": 4096}[name])
    assert v.available_host_bytes() == GiB


def test_without_sysconf_or_resource_validate_warns_once_and_runs(monkeypatch, capsys):
    """Windows: no os.sysconf, no `resource`: the memory is not known, the check is not
    made (one warning line says so), the validation runs."""
    monkeypatch.delattr(os, "sysconf")
    monkeypatch.setitem(sys.modules, "resource", None)
    assert v.available_host_bytes() is None
    v.check_host_memory(build_decoder(load_workload("k3-tiny"), "decode", 1, 64))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not report its free memory" in err and "not checked" in err
    with pytest.raises(v.NpusimError, match="GiB of host memory"):  # a limit given is still held
        v.check_host_memory(build_decoder(load_workload("k3"), "decode", 1, 64), limit=GiB)
    assert main(["validate", "--workload", "k3-tiny", "--batch", "1", "--context", "16"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "free memory" in err


def _square(x: int) -> int:
    return x * x


def test_the_worker_pool_runs_without_pthread_sigmask(monkeypatch):
    """Windows has no signal.pthread_sigmask: the workers start without holding Ctrl-C
    and SIGTERM (npusim.pool's doc says what that costs) and do their tasks."""
    monkeypatch.delattr(signal, "pthread_sigmask")
    done, failed = {}, {}
    run_tasks(_square, [(i,) for i in range(5)], 2, done.__setitem__, failed.__setitem__)
    assert done == {i: i * i for i in range(5)} and not failed
