"""The persistent cache of simulated steps and kernels (see store.py, compute.py).

    store = open_store(cache_dir=None, enabled=True)   # $NPUSIM_CACHE_DIR, else the user's cache folder
    value = cached(store, "step", inputs, hw, compute)   # npusim.diskcache.compute
"""

from __future__ import annotations

import os
from pathlib import Path

from npusim.diskcache.store import DEFAULT_MAX_BYTES, DiskCache


def default_dir() -> Path:
    """$NPUSIM_CACHE_DIR, else the user's cache folder (~/.cache/npusim, $XDG_CACHE_HOME/npusim on Linux).
    Set to '' it is refused, as `--cache-dir ''` is: not the variable left unset (a
    `cache clear` would clear the user's cache)."""
    if "NPUSIM_CACHE_DIR" in os.environ and not os.environ["NPUSIM_CACHE_DIR"].strip():
        from npusim.errors import ConfigError

        raise ConfigError("NPUSIM_CACHE_DIR: expected a folder, got an empty string (unset it for the user's "
                          "cache folder)")
    if os.environ.get("NPUSIM_CACHE_DIR"):
        return Path(os.environ["NPUSIM_CACHE_DIR"])
    import platformdirs

    return Path(platformdirs.user_cache_dir("npusim", appauthor=False))


def open_store(cache_dir: str | os.PathLike | None = None, enabled: bool = True) -> DiskCache:
    """The store at `cache_dir` (None: default_dir()); enabled=False: one that holds nothing."""
    return DiskCache(cache_dir or default_dir(), enabled=enabled)


__all__ = ["DEFAULT_MAX_BYTES", "DiskCache", "default_dir", "open_store"]
