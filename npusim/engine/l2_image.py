"""An L2's contents as data (l2_image) and put back into an L2 (warm): the fast-forward
(engine.fastforward) copies the device's L2 into each truncated run's and, when it prices a
kernel, puts the L2 its measuring run left over the device's (Device._replay). An image
holds every cached line, each set's LRU order and the dirty bits, nothing else of the L2's
state (no fills in flight, no write-backs still draining: see fastforward's assumptions).
"""

from __future__ import annotations

import numpy as np

from npusim.engine.l2cache import _ROTATE


def l2_image(l2) -> tuple[np.ndarray, np.ndarray]:
    """The lines an L2Cache holds, oldest use first within each set (the order they are
    put back in: see warm), and which of them are dirty."""
    held = np.flatnonzero(l2.tags >= 0)
    order = held[np.argsort(l2.last_use[held], kind="stable")]
    sets = l2.sets
    tag = l2.tags[order].astype(np.int64)
    s = order // l2.ways
    # set = (line + (line // sets * ROTATE) % sets) % sets, line = tag * sets + r: solve for r
    r = (s - (tag * _ROTATE) % sets) % sets
    return tag * sets + r, l2.dirty[order].copy()


def warm(l2, image: tuple[np.ndarray, np.ndarray]) -> None:
    """Put an l2_image into an L2Cache of the same geometry: each line accessed once, in the
    image's order (so each set's LRU order is the image's), then its dirty bits. An empty
    L2 then holds the image; one that holds lines keeps those the image's evict nowhere
    (sets it leaves partly free), a line both hold dirty in either."""
    lines, dirty = image
    if not len(lines):
        return
    l2.access(np.ascontiguousarray(lines), False)
    if dirty.any():
        slots = l2.find(lines[dirty])
        l2.dirty[slots[slots >= 0]] = True


__all__ = ["l2_image", "warm"]
