"""Whole cycles: the engine's unit of time."""

import math

# Float products of config values (50 x 1.1, 1.12 us x 1.8 GHz) land a hair above the
# whole number they stand for; rounding to this many decimals first keeps the ceiling
# from adding a cycle that is not there.
_DECIMALS = 6


def whole_cycles(x: float) -> int:
    """Round a cost up to whole cycles."""
    return math.ceil(round(x, _DECIMALS))
