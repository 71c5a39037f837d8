"""verify(kernel, hw): reject a lowered kernel the hardware could not run.

The engine trusts what it runs, so this is where a lowering bug becomes one
readable line instead of a wrong number or a hang. Checked, against the config:

- the kernel's shape: block_dim (1 to MAX_BLOCK_DIM), one shared program or one per block, the
  programs its core type needs, its GmTensors inside the GM the device has;
- every buffer: its core has that memory, it fits, it is aligned, no two overlap;
- every program, walked once per site (its core, the blocks it runs for, its
  sub-core) by verify_walk.py: each instruction's fields of the types the engine
  takes, its pipe on the core, its operands inside one declared buffer (or GM
  tensor) for *every* block, sub-core and loop iteration (verify_addresses.py), its
  dtypes, ops and flag ids ones the config knows;
- synchronisation: SetFlag/WaitFlag counts balance per program, cross-core flags
  balance between the AIC and AIV sides of a MIX block, SyncAll only when every
  block can be resident at once.

A site is a program on one core: a shared program is checked once with `block` over
[0, block_dim-1]; a per-block program with `block` fixed; a MIX AIV program once
per sub-core with `sub` fixed, so an error can name the sub-core at fault.

A Program object met again on a core of the kind it passed on (a MIX AIV program,
once per sub-core; a program some blocks share, in runs apart) is not walked again:
only the checks that read `block` or `sub` - the accesses whose addresses move with
them, listed by its first walk in walk order - are run with the new site's ranges,
and its flag counts are the first walk's. Every other check reads neither, so it
passes again; the first of the listed ones to fail is the first the walk would have
failed at.

And a program like the last one walked on its core - the same buffers object, the
same loops (var and count), every other instruction the same object but some Copy,
Mmad or VecOp - is checked as that one's walk again, the differing instructions in
full (verify_alike.py: check_like, and check_listed, which runs a listed check again).
"""

from __future__ import annotations

import itertools
from collections import Counter

import attrs

from npusim.errors import ProgramError
from npusim.hw.checks import gm_named_bytes
from npusim.hw.config import HwConfig
from npusim.isa.program import ALIGN_BYTES, CORE_MEMS, Buffer, CoreType, GmTensor, Kernel, Mem, Program
from npusim.isa.verify_addresses import a_type, hex_range, names
from npusim.isa.verify_alike import check_like, check_listed
from npusim.isa.verify_walk import Site, Walk, walk_body

# The most blocks a kernel may launch: Ascend C's blockDim is 1 to 65535. The engine runs
# every block (a launch of 65535 one-instruction blocks takes under a second); a block_dim
# of 2^63 ran forever.
MAX_BLOCK_DIM = 65535


def verify(kernel: Kernel, hw: HwConfig) -> Kernel:
    """Check `kernel` against `hw`; return it unchanged, or raise one-line ProgramError."""
    gm_end = gm_named_bytes(hw)
    _check_shape(kernel, gm_end)
    capacity = mem_capacity(hw)
    capacity[Mem.GM] = gm_end
    walks = {}
    passed: dict[tuple, set] = {}  # (core, program buffers) -> var-free instructions that passed
    sites = list(_sites(kernel, hw))
    # (core, id(program)) -> its first walk on that core, for the programs met on more than one site
    first: dict[tuple, Walk | None] = {}
    for key, n in Counter((site.core, id(_program(kernel, site))) for site, _ in sites).items():
        if n > 1:
            first[key] = None
    last: dict[CoreType, Walk] = {}  # per core, the last program walked (in full or like another)
    for site, indices in sites:
        walk = _check_program(kernel, hw, capacity, site, passed, first, last)
        for index in indices:  # blocks sharing one Program object are checked once
            walks[(site.core, index, site.sub)] = walk
    if kernel.core_type is CoreType.MIX:
        _check_cross_balance(kernel, hw, walks)
    return kernel


# ------------------------------------------------------------------ kernel shape


def _check_shape(kernel: Kernel, gm_end: int) -> None:
    """block_dim in range; GmTensors inside [0, gm_end); the program tuples the core type
    needs, each of length 1 or block_dim."""
    where = f"kernel {kernel.name!r}"
    ct = kernel.core_type
    if ct.__class__ is not CoreType:
        raise ProgramError(f"{where}: core_type {ct!r} is {a_type(ct)}, expected a CoreType "
                           f"({', '.join(c.value for c in CoreType)})")
    for name in ("block_dim", "workspace_bytes"):
        value = getattr(kernel, name)
        if value.__class__ is not int:
            raise ProgramError(f"{where}: {name} {value!r} is {a_type(value)}, expected an int")
    if not 1 <= kernel.block_dim <= MAX_BLOCK_DIM:
        raise ProgramError(f"{where}: block_dim {kernel.block_dim} must be 1 to {MAX_BLOCK_DIM} (Ascend C's blockDim)")
    if kernel.workspace_bytes < 0:
        raise ProgramError(f"{where}: workspace_bytes {kernel.workspace_bytes} must be >= 0")
    for i, t in enumerate(kernel.gm):
        if t.__class__ is not GmTensor:
            raise ProgramError(f"{where}: gm[{i}] is {a_type(t)}, expected a GmTensor")
        for name in ("addr", "nbytes"):
            value = getattr(t, name)
            if value.__class__ is not int:
                raise ProgramError(f"{where}: GmTensor {t.name!r}: {name} {value!r} is {a_type(value)}, "
                                   "expected an int")
        if t.addr < 0 or t.nbytes < 1:
            raise ProgramError(f"{where}: GmTensor {t.name!r}: addr {t.addr} must be >= 0 and nbytes {t.nbytes} >= 1")
        if t.addr + t.nbytes > gm_end:
            raise ProgramError(f"{where}: GmTensor {t.name!r} {hex_range(t)} reaches past {gm_end:#x}, the GM "
                               "addresses the simulated device has (its L2 model's tags name)")
    wanted = {"aic": ct in (CoreType.AIC, CoreType.MIX), "aiv": ct in (CoreType.AIV, CoreType.MIX)}
    for side, progs in (("aic", kernel.aic), ("aiv", kernel.aiv)):
        if wanted[side] and not progs:
            raise ProgramError(f"{where}: {ct.value} kernel has no {side} program")
        if not wanted[side] and progs:
            raise ProgramError(f"{where}: {ct.value} kernel has {len(progs)} {side} program(s), expected none")
        if progs and len(progs) not in (1, kernel.block_dim):
            raise ProgramError(
                f"{where}: {len(progs)} {side} programs for block_dim {kernel.block_dim}: "
                f"expected 1 (shared by all blocks) or {kernel.block_dim} (one per block)"
            )
        for i, p in enumerate(progs):
            if not isinstance(p, Program):
                raise ProgramError(f"{where}: {side}[{i}] is {a_type(p)}, expected a Program")


def mem_capacity(hw: HwConfig) -> dict[Mem, int]:
    """Bytes of each local memory, from the config (what-if runs change them)."""
    return {
        Mem.L1: hw.aic.l1_bytes,
        Mem.L0A: hw.aic.l0a_bytes,
        Mem.L0B: hw.aic.l0b_bytes,
        Mem.L0C: hw.aic.l0c_bytes,
        Mem.BT: hw.aic.bt_bytes,
        Mem.FB: hw.aic.fb_bytes,
        Mem.UB: hw.aiv.ub_bytes,
    }


def _sites(kernel: Kernel, hw: HwConfig):
    """Every (program, core, blocks, sub-core) combination to check, each once, with the
    program indices it stands for: a run of consecutive blocks sharing one Program
    object is one site whose `block` ranges over the run."""
    mix = kernel.core_type is CoreType.MIX
    for core, progs in ((CoreType.AIC, kernel.aic), (CoreType.AIV, kernel.aiv)):
        subs = range(hw.chip.aiv_per_aic) if mix and core is CoreType.AIV else range(1)
        index = 0
        while index < len(progs):
            last = index
            while last + 1 < len(progs) and progs[last + 1] is progs[index]:
                last += 1
            if len(progs) == 1:
                where, blocks = "all blocks", (0, kernel.block_dim - 1)
            else:
                where = f"block {index}" if last == index else f"blocks {index}..{last}"
                blocks = (index, last)
            for sub in subs:
                name = f"AIV sub {sub}" if mix and core is CoreType.AIV else core.value
                label = f"kernel {kernel.name!r}, {where}, {name}"
                yield Site(core, index, sub, label, {"block": blocks, "sub": (sub, sub)}), range(index, last + 1)
            index = last + 1


# ------------------------------------------------------------------ one program


def _program(kernel: Kernel, site: Site) -> Program:
    """The program `site` runs."""
    return (kernel.aic if site.core is CoreType.AIC else kernel.aiv)[site.index]


def _check_program(kernel: Kernel, hw: HwConfig, capacity: dict[Mem, int], site: Site,
                   passed: dict[tuple, set], first: dict[tuple, Walk | None], last: dict[CoreType, Walk]) -> Walk:
    """Check one program as it runs on `site`; return the walk with its flag counts.
    `passed`: the var-free instructions already checked, by core and buffers; `first`:
    the first walk of each program object met on several sites of a core, None until
    walked; `last`: the last program walked on each core (see the module doc)."""
    program = _program(kernel, site)
    key = (site.core, id(program))
    seen = first.get(key)
    if seen is not None:
        return _check_again(seen, site)
    w = check_like(last[site.core], program, site) if site.core in last else None
    if w is None:
        w = Walk(kernel, hw, site, passed=passed.setdefault((site.core, program.buffers), set()), site_checks=[],
                 program=program, gm_end=capacity[Mem.GM])
        w.buffers = _check_buffers(w, program.buffers, capacity)
        walk_body(w, program.body, (), site.scope, 1)
        _check_flag_balance(w)
    last[site.core] = w
    if key in first:
        first[key] = w
    return w


def _check_again(seen: Walk, site: Site) -> Walk:
    """The walk of `seen`'s program on another site of its core: its checks that read
    `block` or `sub` run again with this site's ranges, the rest is `seen`'s."""
    w = attrs.evolve(seen, site=site, site_checks=None, program=None)
    done: set = set()
    for entry in seen.site_checks:
        check_listed(w, entry, done)
    return w


def _check_buffers(w: Walk, buffers: tuple[Buffer, ...], capacity: dict[Mem, int]) -> dict[Mem, tuple[Buffer, ...]]:
    """Each buffer is in a memory of its core, aligned, inside its capacity; none overlap.

    Returns the buffers of each memory sorted by address, for the access checks."""
    core = w.site.core
    by_mem: dict[Mem, list[Buffer]] = {}
    for i, b in enumerate(buffers):
        if b.__class__ is not Buffer:
            w.fail(f"buffers[{i}] is {a_type(b)}, expected a Buffer")
        for name, cls in (("mem", Mem), ("addr", int), ("nbytes", int)):
            value = getattr(b, name)
            if value.__class__ is not cls:
                w.fail(f"buffer {b.name!r}: {name} {value!r} is {a_type(value)}, expected a{'n' * (cls is int)} "
                       f"{cls.__name__}")
        if b.mem not in CORE_MEMS[core]:
            w.fail(f"buffer {b.name!r} in {b.mem!r}: {core.value} has no {b.mem!r} (has {names(CORE_MEMS[core])})")
        if b.nbytes < 1 or b.addr < 0:
            w.fail(f"buffer {b.name!r} in {b.mem!r}: addr {b.addr} must be >= 0 and nbytes {b.nbytes} >= 1")
        align = ALIGN_BYTES[b.mem]
        if b.addr % align:
            w.fail(f"buffer {b.name!r} in {b.mem!r}: addr {b.addr:#x} is not {align}-byte aligned")
        end, cap = b.addr + b.nbytes, capacity[b.mem]
        if end > cap:
            w.fail(f"buffer {b.name!r} [{b.addr:#x}, {end:#x}) needs {end} bytes of {b.mem!r} "
                   f"but {core.value} has {cap}")
        by_mem.setdefault(b.mem, []).append(b)
    for mem, bufs in by_mem.items():
        bufs.sort(key=lambda b: b.addr)
        # sorted by address, the first overlap is always between neighbours
        for a, b in itertools.pairwise(bufs):
            if b.addr < a.addr + a.nbytes:
                w.fail(f"buffers {a.name!r} {hex_range(a)} and {b.name!r} {hex_range(b)} overlap in {mem!r}")
    return {mem: tuple(bufs) for mem, bufs in by_mem.items()}


# ------------------------------------------------------------------ flag balance


def _check_flag_balance(w: Walk) -> None:
    """Per (src, dst, id), sets x trips == waits x trips, or some wait never returns
    (or a flag is left set for the next kernel)."""
    for key, (path, instr) in w.first_flag.items():
        sets, waits = w.sets[key], w.waits[key]
        if sets != waits:
            src, dst, flag_id = key
            w.fail(f"flag {src!r}->{dst!r} id {flag_id} cannot balance: {sets} sets vs {waits} waits "
                   "(loop trips counted)", path, instr)


def _check_cross_balance(kernel: Kernel, hw: HwConfig, walks: dict) -> None:
    """In each MIX block, AIC sets of an id == each AIV's waits of it and each AIV's sets ==
    AIC waits (an AIC set reaches every AIV; an AIC wait needs every AIV's set)."""
    shared = len(kernel.aic) == 1 and len(kernel.aiv) == 1
    for b in range(1 if shared else kernel.block_dim):
        block = "" if shared else f" in block {b}"
        cube = walks[(CoreType.AIC, 0 if len(kernel.aic) == 1 else b, 0)]
        for sub in range(hw.chip.aiv_per_aic):
            vec = walks[(CoreType.AIV, 0 if len(kernel.aiv) == 1 else b, sub)]
            _check_cross_direction(cube, vec, "AIC", f"AIV sub {sub}", block)
            _check_cross_direction(vec, cube, f"AIV sub {sub}", "AIC", block)


def _check_cross_direction(sender: Walk, receiver: Walk, src: str, dst: str, block: str) -> None:
    """Per id, the cross sets `sender` issues == the cross waits `receiver` issues.

    The error names the first instruction involved: the sender's set, else the receiver's wait."""
    for flag_id in sorted(set(sender.cross_sets) | set(receiver.cross_waits)):
        sets, waits = sender.cross_sets[flag_id], receiver.cross_waits[flag_id]
        if sets != waits:
            at, site = sender, sender.first_cross.get((True, flag_id))
            if site is None:
                at, site = receiver, receiver.first_cross[(False, flag_id)]
            at.fail(f"cross flag id {flag_id} {src} -> {dst}{block} cannot balance: "
                    f"{src} sets {sets} vs {dst} waits {waits} (loop trips counted)", *site)


