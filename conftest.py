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
from hypothesis import HealthCheck, settings

# tests/'s helpers (kernels.py: kernels by hand, the deadline guard) for tests in its subfolders too
sys.path.insert(0, str(Path(__file__).parent / "tests"))

# Property tests (hypothesis) check results, not speed: no per-example deadline and no
# "input generation is slow" health check, both timed on the wall clock (a busy CI
# machine, or the sanitizer's build of the engine, .ci/sanitize, tripped the latter on
# tests/test_engine_queue.py with a correct queue). Speed is for benchmarks/.
settings.register_profile("npusim", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("npusim")

_CACHE = tempfile.mkdtemp(prefix="npusim-test-cache-")
os.environ["NPUSIM_CACHE_DIR"] = _CACHE


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path_factory.mktemp("npusim-cache")))


_STOP = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


def _put_back() -> list[str]:
    """Ctrl-C and SIGTERM as a fresh interactive process has them; the names of those that were not."""
    changed = [signal.Signals(s).name for s, h in _STOP.items() if signal.getsignal(s) is not h]
    mask = getattr(signal, "pthread_sigmask", None)  # a test may take it away (as on Windows)
    blocked = mask(signal.SIG_BLOCK, []) & set(_STOP) if mask else set()
    for s, h in _STOP.items():
        signal.signal(s, h)
    if blocked:
        mask(signal.SIG_UNBLOCK, blocked)
    return changed + [f"{signal.Signals(s).name} blocked" for s in blocked]


@pytest.fixture(autouse=True)
def _signals_as_they_were(request):
    """Every test starts with Ctrl-C and SIGTERM as an interactive process has them (a
    process started in the background by a non-interactive shell, as CI runs the suite,
    inherits Ctrl-C ignored, and so would every subprocess a test starts); a test that
    leaves them otherwise is named in a warning and they are put back."""
    _put_back()
    yield
    changed = _put_back()
    if changed:
        import warnings

        warnings.warn(f"{request.node.nodeid} left {', '.join(changed)} changed; put back")


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)
