"""Test-wide setup (tests/ and the notebooks): npusim's on-disk cache never goes into
the user's cache folder. The session's is a fresh temporary folder (the notebooks'
kernels inherit it through the environment); each test function gets an empty one
of its own, so no test is served what another one simulated."""

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

# tests/'s helpers (kernels.py: kernels by hand, the deadline guard) for tests in its subfolders too
sys.path.insert(0, str(Path(__file__).parent / "tests"))

_CACHE = tempfile.mkdtemp(prefix="npusim-test-cache-")
os.environ["NPUSIM_CACHE_DIR"] = _CACHE


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path_factory.mktemp("npusim-cache")))


_STOP = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


@pytest.fixture(autouse=True)
def _signals_as_they_were(request):
    """Every test starts with Ctrl-C and SIGTERM as a fresh process has them (and a
    subprocess inherits an ignored or blocked signal): a test that leaves them otherwise
    is named in a warning and they are put back. On a fresh clone the full suite saw
    Ctrl-C ignored from somewhere in the first tests (not found yet: it does not happen
    in a part of the suite), which failed every interruption test after it."""
    yield
    changed = [signal.Signals(s).name for s, h in _STOP.items() if signal.getsignal(s) is not h]
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, []) & set(_STOP) if hasattr(signal, "pthread_sigmask") else set()
    for s, h in _STOP.items():
        signal.signal(s, h)
    if blocked:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
    if changed or blocked:
        import warnings

        warnings.warn(f"{request.node.nodeid} left {', '.join(changed + [f'{signal.Signals(s).name} blocked' for s in blocked])}"
                      " changed; put back")


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)
