"""Shared check of the calibration recovery tests: hidden values found, nothing else moved."""

from __future__ import annotations


def assert_recovered(cal, hidden: dict, within: float = 0.10, free: tuple = ()) -> None:
    """Every field of `hidden` fitted within `within` of its hidden value, and every other
    fitted field but those `free` (the caller says why) within `within` of the base value
    (it was not moved)."""
    fitted = {f.field: f.after for f in cal.fields}
    for field, truth in hidden.items():
        assert field in fitted, f"{field} not fitted: {[(e.field, e.reason) for e in cal.excluded]}"
        assert abs(fitted[field] / truth - 1) < within, f"{field}: fitted {fitted[field]}, hidden {truth}"
    for f in cal.fields:
        if f.field not in hidden and f.field not in free:
            assert abs(f.after / f.before - 1) < within, f
