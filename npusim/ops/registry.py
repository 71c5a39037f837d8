"""The operator registry: op type -> (parameter record, tiling record, lowering).

A lowering is a plain function `lower(params, hw, gm, tiling) -> Lowered`: given
the op's shapes and dtypes, the hardware config and where its tensors live in GM,
it picks a tiling (or takes the one given), emits kernels that pass verify(), and
states the op's analytic FLOPs and minimum GM bytes.
"""

from __future__ import annotations

import functools
import importlib
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from attrs import field, frozen

from npusim.errors import ConfigError
from npusim.hw import HwConfig
from npusim.hw.parse import short, unbracketed
from npusim.isa.program import DTYPE_BYTES, GmTensor, Kernel

# GM allocations of a standalone op start here (an address, not a hardware fact: any
# base aligned to the allocation alignment gives the same costs).
GM_BASE = 1 << 30


@functools.cache
def default_hw() -> HwConfig:
    """The default hardware config: where a hardware fact comes from when no config is at hand."""
    from npusim.hw import load_hw

    return load_hw()


def gm_align_bytes(hw: HwConfig | None = None) -> int:
    """Alignment of GM allocations, the runtime allocator's and a standalone op's
    arena's: the L2 line of `hw` (the default config's without one). aclrtMalloc
    returns 512-byte aligned addresses; we use the line, so no allocation shares one."""
    return (hw or default_hw()).l2.line_bytes


@frozen
class TensorInfo:
    """An operand as profiling tools list it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    format: str = "ND"

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


class GmArena:
    """Where an op's GM tensors live: addresses given by the caller (a memory plan)
    for names it binds, the rest bump-allocated, align_bytes aligned (gm_align_bytes:
    the default config's when not given)."""

    def __init__(self, bound: Mapping[str, int] | None = None, base: int = GM_BASE, align_bytes: int | None = None,
                 capacity: int | None = None, op_type: str = ""):
        self.bound = dict(bound or {})
        self.next = base
        self.base = base
        self.align_bytes = align_bytes or gm_align_bytes()
        self.tensors: dict[str, GmTensor] = {}
        # bytes the allocated tensors may take (hbm.hbm_bytes; None: no limit): a tensor past
        # it is refused when it is allocated, before the lowering builds programs for it
        self.capacity, self.op_type = capacity, op_type

    def tensor(self, name: str, nbytes: int) -> GmTensor:
        if name in self.tensors:
            return self.tensors[name]
        if name in self.bound:
            addr = self.bound[name]
        else:
            addr = self.next
            self.next += -(-nbytes // self.align_bytes) * self.align_bytes
            if self.capacity is not None and self.next - self.base > self.capacity:
                raise ConfigError(f"op {self.op_type}: its tensors take at least {self.next - self.base} bytes of GM "
                                  f"(tensor {name!r}: {nbytes}), more than hbm.hbm_bytes {self.capacity}")
        t = self.tensors[name] = GmTensor(name, addr, nbytes)
        return t


@frozen
class Lowered:
    """An operator lowered for one hardware config: kernels in launch order plus
    what the roofline needs (FLOPs on its unit, minimum GM bytes)."""

    op_type: str
    params: Any
    tiling: Any
    kernels: tuple[Kernel, ...] = field(converter=tuple)
    flops: float
    min_gm_bytes: float
    unit: str  # "cube" or "vector": whose peak bounds the FLOPs
    inputs: tuple[TensorInfo, ...] = field(converter=tuple)
    outputs: tuple[TensorInfo, ...] = field(converter=tuple)
    workspace_bytes: int = 0
    # the config lower() built it for (None: built by hand): simulate_op refuses another,
    # whose cores, buffers or lines the kernels were not tiled for. Not compared: two
    # lowerings are alike by what they hold.
    hw: HwConfig | None = field(default=None, eq=False, repr=False)


KV_ROLES = (None, "read", "write")


@frozen
class Operands:
    """An op's GM operands by role: the local names it reads (`ins`) and writes (`outs`);
    a name ending in "*" stands for numbered parts ("c*": c0, c1, ...). `kv`: whether it
    reads or writes a KV cache, whose tensors (npusim.kvcache.KV_CACHE_NAMES of its
    layout) are then operands too - read, or read and written in place."""

    ins: tuple[str, ...] = field(converter=tuple)
    outs: tuple[str, ...] = field(converter=tuple)
    kv: str | None = field(default=None, validator=attrs.validators.in_(KV_ROLES))

    def allows(self, local: str, side: tuple[str, ...]) -> bool:
        return any(local == n or (n.endswith("*") and local[:len(n) - 1] == n[:-1] and local[len(n) - 1:].isdigit())
                   for n in side)


@frozen
class OpSpec:
    """Everything about one operator type: its parameter and tiling records, its
    lowering, its numpy reference, its operands and whether it may run in place."""

    op_type: str
    params: type  # frozen attrs class of the op's parameters (with defaults and help)
    tiling: type | None  # frozen attrs class of its tiling, or None if it has no knobs
    lower: Callable[..., Lowered]
    help: str
    choose: Callable | None = None  # choose(params, hw) -> tiling: what fields not given default to
    # reference(params, inputs: local name -> array, specs: local name -> TensorSpec, ctx) ->
    # {local output: array}: the op's numpy semantics (npusim.ops.reference says what ctx holds)
    reference: Callable | None = None
    operands: Operands | None = None
    # output element i depends only on input element i, read before it is written: the
    # output may take an input's buffer (the memory plan)
    in_place: bool = False


# The modules whose import registers op types (with @register). Importing npusim.ops
# imports none of them: spec() imports them in this order until it finds the op type it
# is asked for (`npusim op matmul` loads no attention kernels); reading OPS (here or in
# npusim.ops) or calling ops_where() imports them all. OPS lists op types in the order
# they were registered, which depends on what a process imported first: sort it to show it.
OP_MODULES = ("copy", "matmul", "vector", "rowwise", "sampling", "layout", "kv_cache", "attention", "geglu",
              "logit_softcap", "quant", "collectives", "grouped_matmul", "moe", "transpose", "maximum")
_REGISTERED: dict[str, OpSpec] = {}


def _registered(until: str | None = None) -> dict[str, OpSpec]:
    """The registry, once the op modules are imported in order until `until` is in it (None: all of them)."""
    if until not in _REGISTERED:
        for name in OP_MODULES:
            importlib.import_module(f"{__package__}.{name}")
            if until in _REGISTERED:
                break
    return _REGISTERED


def __getattr__(name: str) -> Any:
    if name == "OPS":  # op type -> OpSpec, every op module imported
        return _registered()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(op_type: str, params: type, tiling: type | None = None, choose: Callable | None = None, *,
             reference: Callable | None = None, ins: tuple[str, ...] = (), outs: tuple[str, ...] = (),
             kv: str | None = None, in_place: bool = False):
    """Decorator: register a lowering under `op_type` with its tiling record and the
    function that chooses a tiling (if it has knobs), its numpy reference, its operands
    (ins, outs, kv) and whether it may run in place."""

    def deco(fn):
        if op_type in _REGISTERED:
            raise ValueError(f"op type '{op_type}' registered twice")
        _REGISTERED[op_type] = OpSpec(op_type, params, tiling, fn, (fn.__doc__ or op_type).strip().splitlines()[0],
                                      choose, reference, Operands(ins, outs, kv), in_place)
        return fn

    return deco


def ops_where(pred: Callable[[OpSpec], bool]) -> tuple[str, ...]:
    """Registered op types whose descriptor satisfies `pred`, by name (the order op
    modules register in depends on which one a process imported first): how a pass
    derives the table it needs (in-place ops, KV readers) from the descriptors."""
    return tuple(sorted(op for op, s in _registered().items() if pred(s)))


def param(default, help: str, **kw):
    """A parameter field with its help text (shown by `npusim op TYPE --help`)."""
    return field(default=default, metadata={"help": help}, **kw)


def spec(op_type: str) -> OpSpec:
    ops = _registered(op_type)
    if op_type not in ops:  # every op module imported
        raise ConfigError(f"op: unknown op type '{op_type}' (known: {', '.join(sorted(ops))})")
    return ops[op_type]


def _tuple(text: str) -> tuple[int, ...]:
    """A tuple of ints as the CLI spells it: 8,4096, 8x4096, [8,4096], (8, 4096), (64,)
    or () for none. An empty item (1,,2 or a stray comma) or an unbalanced bracket is a
    ValueError: dropping it would simulate another shape than the one meant."""
    inner = unbracketed(text)
    if not inner:
        return ()
    return tuple(int(x) for x in inner.replace("x", ",").split(","))  # int('') raises


def _coerce(op_type: str, f: attrs.Attribute, value: Any) -> Any:
    """Parameters from the CLI arrive as strings; convert by the field's default type."""
    kind = type(f.default) if f.default is not None else str
    if not isinstance(value, str):
        return _typed(op_type, f, kind, value)
    try:
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return value.lower() in ("true", "1", "yes")
        if kind is tuple:
            return _tuple(value)
        number = kind(value)
    except ValueError:
        expected = "a tuple of ints (e.g. 8,4096)" if kind is tuple else kind.__name__
        raise ConfigError(f"op {op_type}: parameter '{f.name}' expects {expected}, got '{value}'") from None
    if kind is float and not math.isfinite(number):  # nan, inf, 1e400: no scalar a kernel takes (nor JSON)
        raise ConfigError(f"op {op_type}: parameter '{f.name}' expects a finite number, got '{value}'")
    return number


def _typed(op_type: str, f: attrs.Attribute, kind: type, value: Any) -> Any:
    """A parameter given as a Python value (the API, a fusion rule's params): of the
    field's type, as the CLI's text must be. An int field took 1.0 (an AttributeError
    deep in the lowering) and True (run as 1); a float field nan, inf or True."""
    if kind is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    elif kind is float:
        try:
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        except OverflowError:  # an int past a float's range
            ok = False
    elif kind is tuple:
        ok = not isinstance(value, (tuple, list)) or not any(isinstance(x, bool) for x in value)
    else:
        return value
    if not ok:
        expected = {int: "an int", float: "a finite number", tuple: "a tuple of ints (e.g. (8, 4096))"}[kind]
        raise ConfigError(f"op {op_type}: parameter '{f.name}' expects {expected}, got {short(value)}")
    return int(value) if kind is int else value


def make_record(op_type: str, cls: type, values: Mapping[str, Any], what: str = "parameter", base=None):
    """Build a params/tiling record from a mapping (over `base`, a record of the same
    class, when given), with one-line errors naming the field."""
    fields = {f.name: f for f in attrs.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"op {op_type}: unknown {what} '{unknown[0]}' (expected one of: {', '.join(fields)})")
    kw = {k: _coerce(op_type, fields[k], v) for k, v in values.items()}
    try:
        return attrs.evolve(base, **kw) if base is not None else cls(**kw)
    except (TypeError, ValueError) as e:  # attrs validators put the message first
        raise ConfigError(f"op {op_type}: {e.args[0] if e.args else e}") from None


def lower(op_type: str, params: Mapping[str, Any] | Any, hw: HwConfig, tiling: Mapping[str, Any] | Any = None,
          gm: GmArena | None = None) -> Lowered:
    """Lower one operator. `params` / `tiling` may be records or plain mappings."""
    s = spec(op_type)
    if not isinstance(hw, HwConfig):
        raise TypeError(f"lower {op_type}: hw: expected an HwConfig (npusim.load_hw(name)), got {short(hw)}")
    for name, value, cls in (("params", params, s.params), ("tiling", tiling, s.tiling)):
        if value is not None and not isinstance(value, Mapping) and (cls is None or not isinstance(value, cls)):
            raise TypeError(f"lower {op_type}: {name}: expected a mapping of field names to values or its record "
                            f"({cls.__name__ if cls else 'none: the op has no tiling'}), got {short(value)}")
    if not isinstance(params, s.params):
        params = make_record(op_type, s.params, params or {})
    if tiling and s.tiling is None:
        raise ConfigError(f"op {op_type}: has no tiling to set (got '{next(iter(tiling))}')")
    if tiling is not None and not isinstance(tiling, s.tiling):  # fields not given: the op's choice
        tiling = make_record(op_type, s.tiling, tiling, "tiling field", s.choose(params, hw) if s.choose else None)
    if gm is None:
        # tensors past the HBM are refused as they are allocated (the simulation would walk
        # every line of them, and the lowering build programs for them first); a memory
        # plan's arena placed its tensors and checked that they fit
        gm = GmArena(align_bytes=gm_align_bytes(hw), capacity=hw.hbm.hbm_bytes, op_type=op_type)
    return attrs.evolve(s.lower(params, hw, gm, tiling), hw=hw)
