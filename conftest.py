"""Test-wide setup (tests/ and the notebooks): npusim's on-disk cache goes to a fresh
temporary folder for the session, never into the user's cache folder; the notebooks'
kernels inherit it through the environment."""

import os
import shutil
import tempfile

_CACHE = tempfile.mkdtemp(prefix="npusim-test-cache-")
os.environ["NPUSIM_CACHE_DIR"] = _CACHE


def pytest_unconfigure(config):
    shutil.rmtree(_CACHE, ignore_errors=True)
