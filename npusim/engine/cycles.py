"""Whole cycles: the engine's unit of time."""

import math

# Float products of config values (50 x 1.1, 1.12 us x 1.8 GHz) land a hair above the
# whole number they stand for; rounding to this many decimals first keeps the ceiling
# from adding a cycle that is not there.
_DECIMALS = 6
# A fraction this far above a whole number cannot round down to it at _DECIMALS
# decimals: its ceiling needs no rounding (the common case, taken without round()).
_CLEAR = 10.0 ** -_DECIMALS


def whole_cycles(x: float) -> int:
    """Round a cost up to whole cycles: ceil(round(x, _DECIMALS))."""
    c = math.ceil(x)
    if c == x or c - x < 1.0 - _CLEAR:  # whole, or clear of the whole number below
        return c
    return math.ceil(round(x, _DECIMALS))
