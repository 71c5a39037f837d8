"""Collectives as registered ops: all_reduce, reduce_scatter, all_gather, all_to_all,
send_recv.

A collective lowers to its vector kernels (a reduction of the chunks that arrived,
or the copy of the rank's own chunk: they share the vector cores and HBM with
everything else) and a plan (`Lowered.tiling`, a CollectivePlan) saying where its
transfer steps go between them; the runtime turns each Send into an
engine.links.LinkTransfer on the node's stream (launch_order). One rank is
lowered; its peers run the same (symmetric ranks).
"""

from __future__ import annotations

import attrs
import numpy as np
from attrs import frozen, validators

from npusim.engine.links import LinkTransfer
from npusim.errors import ConfigError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES, VecOp
from npusim.ops.collectives.algorithms import ALGOS, KINDS, Copy, Reduce, Send, pick, steps
from npusim.ops.collectives.exchange import current
from npusim.ops.registry import GmArena, Lowered, TensorInfo, param, register
from npusim.ops.vector_kernels import Stream, streaming_kernel


# The largest buffer a collective may have, in elements: 2^32 (8 GiB of fp16, 16 GiB of fp32,
# within a 910B's 64 GiB). The engine's time and memory grow with it: an all_reduce of 2^32
# fp16 elements takes 4 s and 300 MB to simulate, 2^36 a minute and 4 GB.
ELEMENTS_MAX = 1 << 32
DTYPES = ("fp16", "bf16", "fp32")


@frozen
class CollectiveParams:
    elements: int = param(1 << 20, "elements of the buffer n (all_gather: its output; reduce_scatter: its input; "
                          f"at most {ELEMENTS_MAX})", validator=[validators.gt(0), validators.le(ELEMENTS_MAX)])
    dtype: str = param("fp16", "element dtype", validator=validators.in_(DTYPES))
    devices: int = param(8, "ranks in the group", validator=validators.gt(1))
    algo: str = param("auto", "mesh, ring, or auto: HCCL's choice for the topology", validator=validators.in_(ALGOS))
    axis: int = param(0, "all_gather: the axis of the output tensor the ranks' parts are stacked along "
                         "(numerics only)", validator=validators.ge(0))


@frozen
class CollectivePlan:
    """How a lowered collective runs: the algorithm and its steps in launch order, each
    a Send (a transfer step) or the index of one of the op's kernels."""

    kind: str
    algo: str
    nbytes: int  # the buffer n
    devices: int
    order: tuple


def launch_order(low: Lowered) -> tuple:
    """What a node launches, in order: kernel indices, and a collective's Sends between them."""
    if isinstance(low.tiling, CollectivePlan):
        return low.tiling.order
    return tuple(range(len(low.kernels)))


def _sizes(kind: str, n: int, p: int) -> tuple[int, int]:
    """(input, output) elements of one rank."""
    return {"all_reduce": (n, n), "reduce_scatter": (n, n // p), "all_gather": (n // p, n),
            "all_to_all": (n, n), "send_recv": (n, n)}[kind]


def collective_steps(kind: str, p: CollectiveParams, hw: HwConfig) -> tuple[str, tuple]:
    """(algorithm, steps of one rank) of a collective node (algorithms.pick and steps):
    what it lowers to, and what a report reads its transfer steps' peers from."""
    algo = pick(kind, p.devices, p.algo, hw)
    return algo, steps(kind, algo, p.elements * DTYPE_BYTES[p.dtype], p.devices, hw)


def _lower(kind: str, p: CollectiveParams, hw: HwConfig, gm: GmArena) -> Lowered:
    if p.elements % p.devices:
        raise ConfigError(f"op {kind}: elements {p.elements} must be a multiple of devices {p.devices}")
    algo, plan = collective_steps(kind, p, hw)
    e = DTYPE_BYTES[p.dtype]
    n_in, n_out = _sizes(kind, p.elements, p.devices)
    c = p.elements // p.devices  # elements of a chunk
    x, y = gm.tensor("x", n_in * e), gm.tensor("y", n_out * e)
    width = max((s.inputs for s in plan if isinstance(s, Reduce)), default=0)
    recv = gm.tensor("recv", max(1, width - 1) * c * e) if width else None  # chunks received for a reduction
    q = max(1, hw.l2.line_bytes // e)
    kernels, order = [], []
    for s in plan:
        if isinstance(s, Send):
            order.append(s)
            continue
        if isinstance(s, Reduce):
            ins = [Stream(x, e)] + [Stream(recv, e, offset=j * c * e) for j in range(s.inputs - 1)]

            def compute(rows, ub_in, ub_out, tmp, consts, k=s.inputs):
                ops = [VecOp("add", rows, p.dtype, ub_out[0], (ub_in[0], ub_in[1]))]
                return ops + [VecOp("add", rows, p.dtype, ub_out[0], (ub_out[0], ub_in[j])) for j in range(2, k)]

            kernel = streaming_kernel(f"reduce{len(kernels)}", kind, hw, c, ins, [Stream(y, e)], compute, quantum=q)
        else:
            assert isinstance(s, Copy)

            def compute(rows, ub_in, ub_out, tmp, consts):
                return [VecOp("copy", rows, p.dtype, ub_out[0], (ub_in[0],), flops_per_elem=0)]

            kernel = streaming_kernel(f"copy{len(kernels)}", kind, hw, c, [Stream(x, e)], [Stream(y, e)], compute,
                                      quantum=q)
        order.append(len(kernels))
        kernels.append(attrs.evolve(kernel, op_type=kind))
    reduced = sum(s.inputs - 1 for s in plan if isinstance(s, Reduce)) * c
    moved = sum((s.inputs + 1) * c * e for s in plan if isinstance(s, Reduce)) + \
        sum(2 * c * e for s in plan if isinstance(s, Copy))
    return Lowered(kind, p, CollectivePlan(kind, algo, p.elements * e, p.devices, tuple(order)), kernels,
                   flops=float(reduced), min_gm_bytes=float(moved), unit="vector",
                   inputs=[TensorInfo("x", (n_in,), p.dtype)], outputs=[TensorInfo("y", (n_out,), p.dtype)],
                   workspace_bytes=recv.nbytes if recv is not None else 0)


# ---------------------------------------------------------------- numpy semantics


def _ranks(p: CollectiveParams, x: np.ndarray, op_type: str) -> tuple[list[np.ndarray], int]:
    ex, rank = current(op_type)
    if ex.ranks != p.devices:
        raise ValueError(f"a group of {p.devices} devices, but {ex.ranks} ranks run")
    return [np.asarray(v, dtype=np.float32) for v in ex.gather(rank, x)], rank


def _ref_all_reduce(p, x, specs, ctx):
    parts, _ = _ranks(p, x["x"].reshape(-1), "all_reduce")
    return {"y": np.sum(parts, axis=0, dtype=np.float32)}  # in rank order


def _ref_reduce_scatter(p, x, specs, ctx):
    parts, rank = _ranks(p, x["x"].reshape(-1), "reduce_scatter")
    c = p.elements // p.devices
    return {"y": np.sum(parts, axis=0, dtype=np.float32)[rank * c:(rank + 1) * c]}


def _ref_all_gather(p, x, specs, ctx):
    shape = specs["y"].shape
    part = list(shape)
    if p.axis >= len(shape) or shape[p.axis] % p.devices:
        raise ValueError(f"axis {p.axis} of the output {shape} must split into {p.devices} parts")
    part[p.axis] //= p.devices
    parts, _ = _ranks(p, x["x"].reshape(part), "all_gather")
    return {"y": np.concatenate(parts, axis=p.axis)}


def _ref_all_to_all(p, x, specs, ctx):
    parts, rank = _ranks(p, x["x"].reshape(p.devices, -1), "all_to_all")
    return {"y": np.stack([parts[j][rank] for j in range(p.devices)])}


def _ref_send_recv(p, x, specs, ctx):
    parts, rank = _ranks(p, x["x"].reshape(-1), "send_recv")
    return {"y": parts[(rank - 1) % p.devices]}


_REFS = {"all_reduce": _ref_all_reduce, "reduce_scatter": _ref_reduce_scatter, "all_gather": _ref_all_gather,
         "all_to_all": _ref_all_to_all, "send_recv": _ref_send_recv}
_OP = " npusim op also takes bytes=SIZE or a range bytes=1KiB..1GiB, printed as hccl_test does."
_HELP = {
    "all_reduce": "AllReduce: every rank gets the sum of every rank's buffer (HCCL Mesh or Ring)." + _OP,
    "reduce_scatter": "ReduceScatter: rank r gets chunk r of the sum of every rank's buffer." + _OP,
    "all_gather": "AllGather: every rank gets every rank's chunk, in rank order." + _OP,
    "all_to_all": "AllToAll: rank r's chunk j goes to rank j, as its chunk r." + _OP,
    "send_recv": "SendRecv: rank r sends its buffer to rank r+1 and receives rank r-1's (HcclSend / HcclRecv, "
                 "a pipeline stage's hand-over)." + _OP,
}


def _register(kind: str) -> None:
    def lower_collective(p: CollectiveParams, hw: HwConfig, gm: GmArena, tiling=None) -> Lowered:
        return _lower(kind, p, hw, gm)

    lower_collective.__doc__ = _HELP[kind]
    register(kind, CollectiveParams, reference=_REFS[kind], ins=("x",), outs=("y",))(lower_collective)


for _kind in KINDS:
    _register(_kind)


def transfer(plan: CollectivePlan, send: Send, name: str, stream: int, mode: str, owner=None) -> LinkTransfer:
    """The host call of one transfer step of a lowered collective."""
    return LinkTransfer(name, plan.kind, send.nbytes, send.peers, plan.devices, send.inter_node, stream, mode, owner)
