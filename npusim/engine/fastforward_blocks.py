"""Fast-forward over waves of blocks: price a kernel whose blocks run in many waves of cores
(block_dim a multiple of, and more than, the cores of its type) from a few of those waves.

A causal FlashAttention prefill of 32 x 4096 tokens (16 heads) is one MIX kernel of 528
blocks on 24 cube cores: blocks 0..503 are whole heads - 21 waves of 24 blocks doing the
same work at other addresses - then 24 blocks share the 8 heads left over. Its blocks
repeat no loop long enough for fastforward.price (which needs every block in one wave);
its waves of blocks repeat instead.

How such a kernel is priced (the same measurement as fastforward.measure, with blocks in
place of loop iterations):
- Its *block waves* (block_waves): the longest prefix of blocks whose programs have the
  same shape (alike: equal up to addresses) on every core type, W = its whole waves
  of cores. Wave j is blocks [j * cores, (j + 1) * cores); the blocks from W * cores on
  (the uneven part of the prefix and every block after it) are the kernel's *tail*.
- A truncated kernel keeping n waves (truncated): blocks [0, n * cores) and the tail,
  renumbered after them; a renumbered block's addresses that move with `block` are
  rebased (rebased) so that it reads and writes where it did.
- Its marked runs: the device marks each block's (or group's) end with its kernel's
  counters then (Device.mark_blocks, into Device.block_marks); wave j ends when its last
  block ends, and the kernel then is the counters at that mark (_snapshots): every
  counter, a pipe's own ones counted as its block ends.
- Then fastforward.measure: the probe, the fill point, FF_INCREMENTS increments, the
  jitter-aware steady test, the mean wave extrapolated over the waves left out, the
  instructions counted from the programs, the L2 left as the measuring run left it.
# assumption: the waves left out cost what the mean measured one did (their blocks do the
#   same work at other addresses, and the L2 holds as much of what they read);
# assumption: the tail, run after fewer waves, costs what it does after all of them.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from npusim.engine import fastforward as ff
from npusim.engine.fastforward_rewrite import (ByKernel, cores_of, gm_bytes, kinds, programs, readdressed,
                                               record_fields)
from npusim.engine.stats import KernelStats
from npusim.isa.program import Affine, CoreType, Kernel, Loop, Program

# The mark that asks for block marks (engine.run's simulate): the reserved variable the
# blocks of a kernel are the values of, never a loop's
BLOCK = "block"
# Fewer waves of blocks to leave out than this: simulate the kernel in full. Lower than
# fastforward.FF_MIN_SKIP (16, set by a GEMM whose short loop waves cost less to simulate
# than the runs that would price them): a wave of blocks is whole blocks, so the runs'
# fixed cost is small beside the waves they leave out, and FF_MIN_GAIN still bounds it.
# The K3 prefill's FlashAttention (21 waves) leaves 15 out once its 6 are kept.
FF_MIN_BLOCK_SKIP = 8
# The jitter of the waves (fastforward.FF_NOISE_SIGMAS) a steady state of block waves may
# show: none. A kernel of a few tens of block waves is measured wave by wave (no stride
# averages a wave's jitter out), and waves of blocks that jitter are blocks drifting apart
# (a wave's K and V outgrowing the L2, blocks started in lock-step coming out of it), a
# trend rather than noise: a causal FlashAttention of 25 x 16 heads of 512 to 1024 tokens
# on an 8 or 16 MiB L2 (waves +-2 to 8% apart) came out 1.6 to 7% off with the loop path's
# 3; its waves on a 32 MiB L2, and the K3 prefill's on 192 MiB, agree to 0.2%.
FF_BLOCK_NOISE_SIGMAS = 0
PARAMETERS = (FF_MIN_BLOCK_SKIP, FF_BLOCK_NOISE_SIGMAS)  # besides fastforward.PARAMETERS, what a result depends on


# ---------------------------------------------------------------- shapes


def alike(a, b, address: bool = False) -> bool:
    """Are `a` and `b` (programs, instructions, bodies, fields' values) the same up to
    addresses: every Affine's base and every int in an address field (record_fields) may
    differ, nothing else? Generic over every ISA class (attrs records, field by field);
    bools count as values (Mmad.accumulate). A pair of records that are equal outright is
    settled by their own ==, except Loop and Program, which hold bodies (walked item by
    item, the items two programs share by identity at once).
    # assumption: blocks whose programs are alike cost alike: where they point (GM rows of
    #   other heads, other local buffer offsets) changes neither their time nor their traffic
    #   beyond what the measured waves show (burst rounding and L2 sets alike)."""
    if a is b:
        return True
    cls = a.__class__
    if cls is not b.__class__:
        return False
    if cls is Affine:
        return a.terms == b.terms
    if cls is int:
        return address or a == b
    if cls is tuple:
        return len(a) == len(b) and all([alike(x, y, address) for x, y in zip(a, b)])
    if not attrs.has(cls):
        return a == b
    if cls is not Loop and cls is not Program and a == b:
        return True
    return all([alike(getattr(a, name), getattr(b, name), is_addr) for name, is_addr in record_fields(cls).every])


def _prefix(kernel: Kernel) -> int:
    """The blocks from the first on whose programs are alike (see alike) to the first's, on
    every core type; each distinct Program is compared once."""
    types = kinds(kernel)
    first = [kernel.program(kind, 0) for kind in types]
    compared: dict[tuple, bool] = {}  # (core type, id(program)) -> alike the first block's
    for b in range(1, kernel.block_dim):
        for kind, p0 in zip(types, first):
            p = kernel.program(kind, b)
            key = (kind, id(p))
            if key not in compared:
                compared[key] = alike(p0, p)
            if not compared[key]:
                return b
    return kernel.block_dim


def block_waves(kernel: Kernel, cores: int) -> int:
    """W: the whole waves of `cores` blocks in the longest prefix of blocks with programs of
    one shape; 0 unless the blocks fill every core in every wave, in more than one wave."""
    if kernel.block_dim <= cores or kernel.block_dim % cores:
        return 0
    # assumption: a kernel is asked about with one number of cores (the cache keeps W, not the prefix)
    return _WAVES.get(kernel, lambda k: _prefix(k) // cores)


_WAVES = ByKernel()  # block_waves() of the kernels last asked about


# ---------------------------------------------------------------- truncation


def rebased(value, delta: int, memo: dict | None = None):
    """`value` (a Program, an instruction, a body, a field's value) for a block renumbered
    `delta` lower: every Affine with a `block` term of step s has its base moved by
    delta * s, so that it points where it did (fastforward_rewrite.readdressed; `memo` as there)."""
    def move(a: Affine) -> Affine:
        step = dict(a.terms).get(BLOCK, 0)
        return Affine(a.base + delta * step, a.terms) if step else a
    return readdressed(value, move, memo)


def truncated(kernel: Kernel, cores: int, waves: int, keep: int) -> Kernel:
    """The kernel keeping `keep` of its `waves` block waves: blocks [0, keep * cores), then
    its tail (blocks from waves * cores on) renumbered right after them, their programs
    rebased to their own addresses (one rebased Program per Program the tail shares)."""
    delta = (waves - keep) * cores
    if not delta:
        return kernel
    blocks = list(range(keep * cores)) + list(range(waves * cores, kernel.block_dim))
    kw = {}
    for kind in kinds(kernel):
        progs = programs(kernel, kind)
        if len(progs) == 1:  # one program for every block: the tail is blocks of the same shape
            continue
        memo: dict = {}
        kw["aic" if kind is CoreType.AIC else "aiv"] = tuple(
            progs[b] if b < keep * cores else rebased(progs[b], delta, memo) for b in blocks)
    return attrs.evolve(kernel, block_dim=len(blocks), **kw)


# ---------------------------------------------------------------- marks


def _snapshots(marks: list, n: int, cores: int) -> list[KernelStats]:
    """The kernel at the end of each of its first n block waves, from a marked run's block
    marks (Device.block_marks: (block indices, the kernel's counters then), in the order the
    blocks ended): wave j's is the mark at which the last of its blocks ended. Counters a
    pipe keeps (busy, wait, flops, local bytes) count at its block's end, GM ones as they
    go; instructions are left as counted (measure counts them from the programs)."""
    last: dict[int, int] = {}  # wave -> the index of the mark its last block ended at
    for i, (blocks, _) in enumerate(marks):
        for b in blocks:
            if b < n * cores:
                last[b // cores] = i
    return [marks[last[j]][1] for j in range(n)]


# ---------------------------------------------------------------- pricing


def _wave_gm_bytes(kernel: Kernel, cores: int) -> int:
    """GM bytes a wave moves (block 0's programs, cores times; a MIX AIV program once): an
    upper bound of the new lines it brings into the L2 (see fastforward_rewrite.wave_gm_bytes)."""
    return cores * sum(gm_bytes(kernel.program(kind, 0).body) for kind in kinds(kernel))


def _first_plan(kernel: Kernel, hw) -> tuple[int, int, tuple[list[int], int, int]]:
    """(cores, W, plan from the earliest wave the L2 allows) of a kernel."""
    cores = cores_of(kernel, hw)
    w = block_waves(kernel, cores)
    if not w:
        return cores, 0, ([], 1, 0)
    return cores, w, ff.plan(w, ff.earliest(hw, _wave_gm_bytes(kernel, cores)), 0, FF_MIN_BLOCK_SKIP)


def worth_trying(kernel: Kernel, hw) -> bool:
    """Might price() fast-forward this kernel (enough block waves to leave some out)?"""
    return bool(_first_plan(kernel, hw)[2][2])


def price(kernel: Kernel, hw, image: Callable[[], tuple[np.ndarray, np.ndarray]] | None,
          simulate: ff.Simulate) -> tuple[KernelStats, int, tuple] | None:
    """fastforward.price for a kernel of many block waves: (its stats, block waves not
    simulated, the L2 it leaves), or None to simulate it in full. The probe run keeps as many
    waves as the measuring run from FF_KEEP on would, so that when the L2 allows measuring
    from there (the common case: a wave of blocks brings in a large share of an L2) the probe
    is that run (a run of the K3 prefill's FlashAttention costs a share of its full one)."""
    cores, w, (_, _, skip) = _first_plan(kernel, hw)
    if not skip:
        return None
    return ff.measure(kernel, hw, image, simulate, w, lambda n: truncated(kernel, cores, w, n), BLOCK,
                      lambda marks, n: _snapshots(marks, n, cores), FF_MIN_BLOCK_SKIP, FF_BLOCK_NOISE_SIGMAS,
                      probe_share=1.0)  # the probe is always the measuring run from FF_KEEP


__all__ = ["BLOCK", "FF_BLOCK_NOISE_SIGMAS", "FF_MIN_BLOCK_SKIP", "PARAMETERS", "alike", "block_waves", "price",
           "rebased", "truncated", "worth_trying"]
