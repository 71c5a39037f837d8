"""Device element dtypes <-> numpy: bytes as the device stores them, values as numpy
computes them (float32 for the float dtypes, int64 for the integer ones). bf16 has no
numpy dtype: it is the upper half of an fp32, rounded to nearest even."""

from __future__ import annotations

import numpy as np

from npusim.errors import ProgramError

_NUMPY = {"fp16": np.float16, "fp32": np.float32, "int8": np.int8, "uint8": np.uint8, "int16": np.int16,
          "int32": np.int32, "int64": np.int64}


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """uint8 bytes -> values (float32 or int64)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if dtype == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dtype not in _NUMPY:
        raise ProgramError(f"dtype {dtype!r} has no numpy form (have bf16, {', '.join(_NUMPY)})")
    v = raw.view(_NUMPY[dtype])
    return v.astype(np.float32) if dtype in ("fp16", "fp32") else v.astype(np.int64)


def encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """values -> uint8 bytes in `dtype` (floats rounded to nearest, as the device stores them)."""
    v = np.asarray(values)
    if dtype == "bf16":
        bits = v.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # to nearest, ties to even
        nan = np.isnan(v.astype(np.float32))
        out = np.where(nan, 0x7FC0, rounded).astype(np.uint16)
        return out.view(np.uint8)
    if dtype not in _NUMPY:
        raise ProgramError(f"dtype {dtype!r} has no numpy form (have bf16, {', '.join(_NUMPY)})")
    with np.errstate(over="ignore", invalid="ignore"):
        if np.issubdtype(_NUMPY[dtype], np.integer) and np.issubdtype(v.dtype, np.floating):
            v = np.rint(v)
        return np.ascontiguousarray(v.astype(_NUMPY[dtype])).view(np.uint8)


def stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` as the device would hold them in `dtype` (rounded), back as numpy values."""
    return decode(encode(values, dtype), dtype).reshape(np.shape(values))
