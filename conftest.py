"""Test-wide setup (tests/ and the notebooks): npusim's on-disk cache never goes into
the user's cache folder. The session's is a fresh temporary folder (the notebooks'
kernels inherit it through the environment); each test function gets an empty one
of its own, so no test is served what another one simulated."""

import os
import shutil
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


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)
