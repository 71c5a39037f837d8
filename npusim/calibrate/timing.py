"""How a measured row's time is simulated: one function per timing method.

A measurement is only comparable with a simulation that times the same thing (the
Method column of the public data, npusim/data/measured/README.md):

- KERNELS (msprof op_summary, `msprof op`, the torch_npu profiler's kernel table):
  device time of the row's kernels, each from reaching its stream's head (the kernel
  start, which msprof's duration includes as scheduling) to its end, summed. A row
  that sums several kernels (OP Type "Mul+Add+Exp") runs them back to back on one
  device, each reading what the one before wrote (its first input is the previous
  op's first output), so an intermediate still in the L2 is read from there.
- EAGER_LOOP (events around N back-to-back eager calls, divided by N): the same
  kernels launched by the host in eager mode LOOP_CALLS times on the same tensors;
  the time per call in steady state (the L2 holds what the calls before left, dirty
  lines included), which is the host's cost per call when the host is the slower.
- EAGER_CALL (one eager call between two events): one launch from an idle device:
  the host's launch cost, the kernel start and the kernels.

A row of npusim's own profile of a decoder step (`npusim run --profile`) is timed in
that step, run again on the trial config (step_kernel_us): its kernel as it ran there,
beside what ran with it, with the L2 the kernels before it left.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from npusim.engine import Launch, Synchronize, run
from npusim.errors import ConfigError, NpusimError, ProgramError
from npusim.hw import HwConfig
from npusim.hw.parse import short
from npusim.ops.registry import GmArena, Lowered, gm_align_bytes, lower, spec
from npusim.report.tables import task_cycles

KERNELS, EAGER_LOOP, EAGER_CALL = "kernels", "eager_loop", "eager_call"
# the Method column of the public measurements (npusim/data/measured/README.md) -> how
# npusim times the row; a profile without the column holds kernel times (msprof).
# assumption: "not stated" rows are kernel times - they come from the same metadata
# file as cann-bench's `msprof op` GEMM baselines
METHODS = {"": KERNELS, "K-msprof-op": KERNELS, "K-prof": KERNELS, "not stated": KERNELS,
           "EV-loop": EAGER_LOOP, "EV-single": EAGER_CALL, "EV-eager": EAGER_CALL}
# calls of an event-timed loop simulated: the first fills the L2 from cold, the ones
# after it are in steady state; the time per call is taken between the ends of the
# first and the last (assumption: two steady calls are enough - the state a call
# leaves is the state it found from the second call on)
LOOP_CALLS = 3

Part = tuple[str, tuple]  # (npusim op type, sorted params)
# the op of a row of npusim's own profile of a decoder step: its kernel is timed in the step
STEP = "decoder step"


def chain(parts: Sequence[Part], hw: HwConfig) -> list[Lowered]:
    """The parts lowered in order, each reading the first output of the one before
    as its first input (distinct GM tensors otherwise). Each part's tensors must fit
    the HBM, as `npusim op`'s do: past it the simulation walks every line of them
    (a Relu row of 800000000,5120000 ran for hours)."""
    out: list[Lowered] = []
    arena = GmArena(align_bytes=gm_align_bytes(hw))
    for op, params in parts:
        bound = {}
        if out:
            first_in = spec(op).operands.ins[0]
            bound[first_in] = arena.tensors[out[-1].outputs[0].name].addr
        arena = GmArena(bound, base=arena.next, align_bytes=arena.align_bytes, capacity=hw.hbm.hbm_bytes, op_type=op)
        out.append(lower(op, dict(params), hw, gm=arena))
    return out


def time_us(parts: Sequence[Part], timing: str, hw: HwConfig, kernel: int | None = None) -> float:
    """The simulated time of `parts` as the method `timing` measures it (see the module
    doc); `kernel`: only that kernel of them (by index; a row of npusim's own profile),
    from reaching its stream's head to its end."""
    kernels = [k for low in chain(parts, hw) for k in low.kernels]
    if timing == KERNELS:
        result = run([Launch(k, 0, "graph") for k in kernels] + [Synchronize()], hw, trace="kernel", counters=False)
        ks = result.kernels
        if kernel is not None:
            if kernel >= len(ks):
                raise ProgramError(f"op {parts[0][0]} has {len(ks)} kernel(s), no kernel {kernel}")
            return hw.us(task_cycles(ks[kernel]))
        return hw.us(ks[-1].end - ks[0].queued)
    calls = LOOP_CALLS if timing == EAGER_LOOP else 1
    result = run([Launch(k, 0, "eager") for _ in range(calls) for k in kernels] + [Synchronize()], hw,
                 trace="kernel", counters=False)
    ends = [k.end for k in result.kernels[len(kernels) - 1::len(kernels)]]
    if timing == EAGER_LOOP:
        return hw.us((ends[-1] - ends[0]) / (calls - 1))
    return hw.us(ends[0])  # the host's first launch starts at time 0


# [step, config, the run's kernel records by (node, index), the config fields it read, each
# node's (op type, parameters as JSON reads them)], or [step, config, the error it ran into]:
# the last run (a step that fails does so once, not once per row of it)
_STEPS: list = []


def step_kernel_us(step: str, node: str, index: int, hw: HwConfig, op: str, params: str) -> float:
    """Kernel `index` of graph node `node` in the decoder step `step` (the JSON a profile's
    STEP_FILE holds: run_decoder's arguments but the config, and the tilings it ran with),
    run on `hw` with those tilings, from reaching its stream's head to its end. The step
    runs once per config (the last one is kept), its field reads noted for every kernel
    read from it. `op` and `params` (JSON): what the row says the node ran; a step that
    runs it otherwise (a step file edited, or of another run) is an error."""
    from npusim.diskcache.reads import note

    if not _STEPS or _STEPS[0] != step or _STEPS[1] is not hw:
        try:
            _STEPS[:] = [step, hw, *_run_step(step, hw)]
        except NpusimError as e:
            _STEPS[:] = [step, hw, e]
    if isinstance(_STEPS[2], NpusimError):
        raise _STEPS[2].with_traceback(None)
    kernels, read, nodes = _STEPS[2:]
    note(read)
    k = kernels.get((node, index))
    if k is None:
        raise ProgramError(f"the step has no kernel {index} of node '{node}' (a profile of another step?)")
    _check_node(node, nodes[node], (op, json.loads(params)))
    return hw.us(task_cycles(k))


def _run_step(step: str, hw: HwConfig) -> tuple[dict, frozenset, dict]:
    """The step run on `hw`: its kernel records by (node, index), the config fields it
    read, and each node's (op type, parameters as JSON reads them)."""
    from npusim.diskcache.reads import recording
    from npusim.runtime.compile import tilings_pinned
    from npusim.runtime.decoder import run_decoder
    from npusim.workload import load_workload

    args = json.loads(step)
    tilings = args.pop("tilings", {})
    try:
        with recording() as read, tilings_pinned(tilings):
            workload, sets = args.pop("workload"), args.pop("workload_set", None)  # as --workload-set gave it
            run = run_decoder(load_workload(workload, sets) if sets else workload, hw, counters=False, **args)
    except TypeError as e:  # run_decoder's word for an argument of the wrong type (a hand-edited step file)
        raise ConfigError(f"the profile's step file: {e}") from None
    _check_tilings(tilings, run.graph)
    return ({(k.owner.node, k.owner.index): k for k in run.result.kernels if k.owner}, frozenset(read),
            {n.name: (n.op_type, json.loads(json.dumps(n.params))) for n in run.graph.nodes})


def _check_tilings(tilings: dict, graph) -> None:
    """Every tiling of the step file is a node's of the step: one that is no node's was
    not used (a name edited, or a step file of another workload)."""
    names = {n.name for n in graph.nodes}
    unused = next((name for name in tilings if name not in names), None)
    if unused is not None:
        raise ConfigError(f"the profile's step file: key 'tilings': {short(unused)} is not a node of the step "
                          f"(its {len(names)} nodes run with the tilings of their own names)")


def _check_node(node: str, ran: tuple[str, dict], row: tuple[str, dict]) -> None:
    """The step ran `node` as the row says (its op and parameters): a row timed on a
    kernel of another shape would be fitted without a word."""
    if ran == row:
        return
    (op, params), (row_op, row_params) = ran, row
    if op != row_op:
        raise ProgramError(f"the step runs node '{node}' as {op}, the row's npusim Op says {row_op} (the step file "
                           "of another run?)")
    key = next(k for k in sorted(params.keys() | row_params.keys()) if params.get(k) != row_params.get(k))
    raise ProgramError(f"the step runs node '{node}' with {key} {short(params.get(key))}, the row's npusim Params "
                       f"say {short(row_params.get(key))} (the step file of another run?)")
