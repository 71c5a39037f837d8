"""W8A16 matmul at decode sizes with a long K or a wide N as the 910B runs it: the
split-K multi-scale (MSD) kernel.

hicann/ops-nn's WeightQuantBatchMatmulV2 MSD tiling (op_host/op_tiling/
weight_quant_batch_matmul_v2_tiling_msd.cpp) takes the per-channel int8 shapes of
npusim.ops.matmul_msd (msd_applies); its IsCapable sets splitKFlag_ when K >
MSD_PERCHANNEL_MAX_K = 13696 or N > MSD_PERCHANNEL_MAX_N = 32000, and the tiling key
then runs op_kernel/weight_quant_batch_matmul_v2_msd_split_k.h
(WeightQuantBatchMatmulV2MsdSplitKKernel) instead of the multi-core one.
DoMSDGeneralOpTiling cuts K into kBlockNum blocks of singleCoreK = v1BaseK columns (at
most 12K, what one vector core quantises in UB) and N into tasks of taskNSize columns (a
16 MiB budget of partial results). One MIX kernel, one AIC to two AIVs:

1. PreProcess: the 2 x blockDim vector cores share the (row block, K block) tasks, a run
   of singleCoreTaskNum each, K fastest; a task splits its rows' K block into two int8
   parts with that block's own row maximum (per row and K block): workspace
   aUnfold[kIdx] = [A1; A2] of [m, v1BaseK] each, the maxima in reduceMaxWorkspace
   [kIdx][m]. Then SyncAll, and each AIV flags its cube (SYNC_AIV_AIC_FLAG).
2. ProcessCube, N task by N task (a cube loop each): the task's (K block, column block of
   singleCoreN) pairs are dealt to the cores in runs, K fastest (InitMatmulParams), so a
   core takes consecutive K blocks of one column block; a pair is [A1; A2] of its K block
   times the weight's rows of that block, int32 into workspace cUnfold[slot][kIdx] =
   [2m, taskN] (no atomic add: each K block has its own partial). Before it first waits
   for the AIVs, each cube issues up to 10 of its first weight chunks into L1
   (BL1PreLoad), which warms L2.
3. PostProcess: each AIV takes taskSingleCoreNSize columns of postProcessSingleCoreM rows
   of every task and sums the K blocks' partials: per K block and part, int32 in, cast,
   times the part's constant (Axpy), times the scale, times the block's row maximum, added
   to the row (MulAddDst); then the bias, the output dtype, out. A cube tells its AIVs that
   a task is done one task late (after its next LaunchMatmul: SYNC_AIC_ONLY_ALL, then
   SYNC_AIC_AIV_FLAG; after the last, at its end), and the partials rotate through
   c1c2CacheNum_ workspace slots that the AIVs free every vectorToCubeSyncCycle_ tasks.

Here: the host tiling's numbers as splitk_tiling computes them; the cube's loops over
each pair are npusim.ops.matmul's tile nests (_box) on the pair's [2m, K block] x [K block,
column block]; the quantisation and the combine are npusim.ops.matmul_msd's, per K block.
# assumption: the cube's tile (base_m, base_n, base_k, L1 chunk) is npusim's chooser's for
#   [2m, v1BaseK] x [v1BaseK, taskN] int8, base_n cut to the column block (CANN: "baseN <=
#   singleCoreN"), as in npusim.ops.matmul_msd: CANN's comes from its closed op cache or
#   TBE tiling for a weight that is not transposed (MsdA16W8CommonTiling takes only a
#   transposed ND or a non-transposed NZ weight).
# assumption: singleCoreN, a column block, is GetMatMulTiling's own fallback's for a
#   weight that is not transposed (CeilAlign(taskN / aicNum, 256); CheckInt8MatmulTiling
#   rejects any other than a multiple of 256) and the cube's nDim (hence blockDim) that
#   fallback's or MsdA16W8CommonTiling's; the kernel computes a transposed weight's itself.
# assumption: the hand-offs are SyncAlls (npusim has no all-AIC or all-AIV flag): one after
#   the cubes' task i (i >= 1) lets the AIVs start task i - 1, as CANN's one-task lag does,
#   and holds the cubes' task i + 1 until the AIVs are done with task i - 2 (CANN's cubes
#   may run up to vectorToCubeSyncCycle_ tasks ahead of them); with two slots (cycle 1)
#   CANN's cubes wait for task i - 1 itself, and so do these (one more SyncAll).
# assumption: PreProcess takes npusim.ops.matmul_msd's UB per element of a row (16 bytes):
#   a K block of more than 12256 columns is quantised in two chunks (its maximum first),
#   where CANN's buffers hold all 12K of it.
# assumption: the two AIVs of a block run one program (npusim's MIX blocks), so they take
#   their CANN tasks in step, one each at a time; where one has fewer it repeats the other's
#   (same values, the time CANN's idle core waits for its partner), and in PostProcess a
#   narrower share (the last columns, the last rows) is widened into its neighbour's, as
#   npusim.ops.matmul_msd shares an odd row.
# assumption: the last K block's row is quantised as a whole v1BaseK block, as CANN does
#   (it pads the row with zeros): here the pad is its own first elements again (one more
#   copy), which leaves the row maximum as it is; their parts land in the workspace
#   columns the cube never reads.
# assumption: the maximum of a row's K block is kept as npusim.ops.matmul_msd's two factors
#   (a / c, a / c^2), and the combine is its per-row Muls and Adds (the scalar unit reads
#   the factors; CANN: Axpy by the constants 1 / c, 1 / 2c^2, then MulAddDst with the
#   broadcast maximum), the scale applied once per row at the end: 4 vector instructions a
#   row per K block, as CANN's; FixPipe writes the partials as fp32 (npusim's int8
#   conversion), and CANN's int32 -> fp32 cast is kept as an fp32 cast of the same size.
# assumption: an antiquant offset is not modelled (as npusim.ops.matmul_msd): CANN's
#   ComputeSumA and SumMaxMul are not lowered.
"""

from __future__ import annotations

import attrs
from attrs import frozen

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import (
    DTYPE_BYTES, Buffer, Copy, Loop, Mem, Pipe, PipeBarrier, Program, SetFlag, SyncAll, WaitFlag,
    addr, shift,
)
from npusim.ops.build import align_up, cdiv
from npusim.ops.matmul_msd import _FACTORS, _PRE_BYTES, MSD_ALIGN, _after, _quantise, lowered_mix, msd_applies
from npusim.ops.matmul_program import _box, _epilogue, _Layout, _prologue
from npusim.ops.registry import GmArena, Lowered
from npusim.ops.vector import UB_BLOCK, cast, scalar_read, vop

# The host tiling's constants (weight_quant_batch_matmul_v2_tiling_msd.cpp); tests shrink
# the first two to reach this kernel with small shapes.
MSD_PERCHANNEL_MAX_K, MSD_PERCHANNEL_MAX_N = 13696, 32000  # IsCapable: splitKFlag_ above either
V1_MAX_K = 12 * 1024  # DoMSDGeneralOpTiling: singleCoreK at most 12 * 1024; v1BaseM = 12 * 1024 / singleCoreK
MAX_K_BLOCKS = 6  # DoMSDGeneralOpTiling: kBlockNum up to 6
C_BUDGET = 16 * 1024 * 1024  # DoMSDGeneralOpTiling: singleNSize = 16 MiB / (kBlockNum * order_ * m * 4)
AIV_BASE_N = 128  # DoMSDGeneralOpTiling: aivBaseN, the columns a vector core combines at once
V1_MAX_M = 8  # DoMSDGeneralOpTiling: v1BaseM at most 8 rows
ORDER = 2  # IsCapable: order_, the int8 parts of A
POST_BLOCK = 32 * 256  # DoMSDGeneralOpTiling: postProcessBaseM = 32 * 256 / taskSingleCoreNSize
SYNC_BUDGET = 16 * 1024 * 256  # kernel ComputeParams: vectorToCubeSyncCycle_ numerator
MAX_SYNC_CYCLE = 8  # kernel ComputeParams: vectorToCubeSyncCycle_ at most 8
PRELOAD_TIMES = 10  # kernel BL1PreLoad: "预载入次数保持10次"
_PING = 2  # flag ids (V -> MTE2) of the two partial buffers of PostProcess (0: _after's)


@frozen
class SplitKTiling:
    """The host tiling's numbers (DoMSDGeneralOpTiling, GetMatMulTiling, PostTiling) and
    the kernel's (ComputeParams) for one shape."""

    k_blocks: int  # the kernel's kBlockNum_ = CeilDiv(k, v1BaseK)
    v1_base_k: int  # singleCoreK: the columns of a K block
    v1_base_m: int  # rows of a PreProcess task
    task_n: int  # taskNSize: columns of an N task (a cube loop)
    task_core_n: int  # taskSingleCoreNSize: columns an AIV combines per task
    post_core_m: int  # postProcessSingleCoreM: rows an AIV combines
    post_base_m: int  # postProcessBaseM: rows it loads at once
    cube_core_n: int  # singleCoreN: a cube's column block (weight not transposed)
    block_dim: int
    cache_num: int  # c1c2CacheNum_: workspace slots of partials


def msd_splitk_applies(p) -> bool:
    """Whether CANN runs this W8A16 matmul as the split-K MSD kernel (module doc)."""
    return msd_applies(p) and (p.k > MSD_PERCHANNEL_MAX_K or p.n > MSD_PERCHANNEL_MAX_N)


def splitk_tiling(p, hw: HwConfig) -> SplitKTiling:
    """The host tiling of the split-K kernel, as weight_quant_batch_matmul_v2_tiling_msd.cpp
    computes it; ProgramError where it fails (CANN's tiling fails too: no K block <= 12K)."""
    aiv, aic = hw.aiv_count, hw.chip.aic_count
    m, k, n = p.m, p.k, p.n
    # DoMSDGeneralOpTiling: "nk差距超过30倍": a weight not transposed with K >= 30 N starts at 4 K blocks
    first = 4 if k // n >= 30 and not p.trans_b else 1
    for k_blocks in range(first, MAX_K_BLOCKS + 1):
        # SplitKByKBlock: K / kBlockNum on 64 columns, 512 for a transposed int8 weight (cache lines)
        core_k = align_up(cdiv(k, k_blocks), 512 if p.trans_b else 64)
        if core_k > V1_MAX_K:
            continue
        # DoMSDGeneralOpTiling: the N task from the 16 MiB of partials, down to 256 columns, at
        # most aivBaseN per AIV, at most N; an AIV's share of it on aivBaseN columns
        task_n = C_BUDGET // (k_blocks * ORDER * m * 4) // 256 * 256
        task_n = min(task_n, AIV_BASE_N * aiv, n)
        task_core_n = align_up(cdiv(task_n, aiv), AIV_BASE_N)
        post_n = 1 if task_core_n > task_n else cdiv(task_n, task_core_n)  # postProcessNBlockNum
        post_m = aiv // post_n  # postProcessMBlockNum
        post_core_m = cdiv(m, post_m)
        v1_base_m = min(V1_MAX_M, V1_MAX_K // core_k)
        # GetMatMulTiling's fallback (weight not transposed: singleCoreN on 256 columns) or
        # MsdA16W8CommonTiling (transposed: on 32), and its nDim (module doc: assumption)
        cube_n = min(n, task_n)
        cube_core_n = align_up(cube_n // aic, 32 if p.trans_b else 256)
        n_dim = min(aic, cdiv(cube_n, cube_core_n))
        # DoMSDGeneralOpTiling: blkDim_; PostTiling: CalcTschBlockDim(max(2 nDim, blkDim_)), AIVs per AIC
        blk = max(min(k_blocks * cdiv(m, v1_base_m), aiv), post_m * post_n)
        block_dim = cdiv(max(2 * n_dim, blk), aiv // aic)
        kernel_k_blocks = cdiv(k, core_k)  # ComputeParams: kBlockNum_
        # ComputeParams: vectorToCubeSyncCycle_ from 16 Ki x 256 partials, 1..8; twice as many slots
        cycle = min(MAX_SYNC_CYCLE, max(1, SYNC_BUDGET // (kernel_k_blocks * ORDER * m * task_n)))
        return SplitKTiling(
            k_blocks=kernel_k_blocks, v1_base_k=core_k, v1_base_m=v1_base_m, task_n=task_n, task_core_n=task_core_n,
            post_core_m=post_core_m, post_base_m=min(POST_BLOCK // task_core_n, post_core_m),
            cube_core_n=cube_core_n, block_dim=block_dim, cache_num=2 * cycle)
    raise ProgramError(f"op matmul: m={m} x k={k} x n={n} W8A16 takes CANN's split-K multi-scale kernel, whose "
                       f"tiling fails: no K block count up to {MAX_K_BLOCKS} gives blocks of at most {V1_MAX_K}")


def lower_msd_splitk(p, hw: HwConfig, gm: GmArena, tiling) -> Lowered:
    """The MIX kernel of the module doc."""
    from npusim.ops.matmul import MatmulParams, alloc_plan, check_tiling
    from npusim.ops.matmul_tiling import choose_tiling

    st = splitk_tiling(p, hw)
    m, n, k, e, eo = p.m, p.n, p.k, DTYPE_BYTES[p.dtype], DTYPE_BYTES[p.out_dtype]
    kb, vk, blocks = st.k_blocks, st.v1_base_k, st.block_dim
    loops = cdiv(n, st.task_n)
    tail_k = k - (kb - 1) * vk
    if vk - tail_k > tail_k:
        raise ProgramError(f"op matmul: the last K block of m={m} x k={k} x n={n} has {tail_k} columns, fewer than "
                           f"the {vk - tail_k} it is padded with to {vk} (its own first ones: module doc)")

    first_n = min(n, st.task_n)
    cube = MatmulParams(m=2 * m, n=first_n, k=vk, dtype="int8", out_dtype="fp32", trans_b=p.trans_b)
    t = tiling or choose_tiling(cube, hw)
    if t.base_m < 2 * m:
        raise ProgramError(f"op matmul: tiling base_m={t.base_m} does not hold both int8 parts of A's {m} rows "
                           f"(the multi-scale W8A16 kernel multiplies {2 * m} rows in one tile row)")
    check_tiling(t, "int8", hw, "matmul")
    core_n = cdiv(first_n, blocks) if p.trans_b else st.cube_core_n
    t = attrs.evolve(t, base_n=min(t.base_n, align_up(core_n, 16)), split_k=1, block_dim=blocks, a_resident=False)

    A, B, Y = gm.tensor("a", m * k * e), gm.tensor("b", k * n), gm.tensor("c", m * n * eo)
    scale = gm.tensor("scale", n * 4)
    bias = gm.tensor("bias", n * 4) if p.bias else None
    # the workspace (InitGlobalTensor): the row factors [kIdx][m] (CANN: the maxima), each K
    # block's two parts (aUnfoldSizeS8_: its x bytes, on 512), the slots of partials (cUnfoldSize_)
    fac_bytes = align_up(kb * m * _FACTORS, 512)
    a_unfold = align_up(e * m * vk, 512)
    c_slot = align_up(ORDER * m * st.task_n * kb, 128) * 4
    slots = min(loops, st.cache_num)
    W = gm.tensor("workspace", fac_bytes + kb * a_unfold + slots * c_slot)
    ws = _Workspace(factors=W.addr, parts=W.addr + fac_bytes, a_unfold=a_unfold,
                    partials=W.addr + fac_bytes + kb * a_unfold, c_slot=c_slot, cache_num=st.cache_num)

    lb = _Layout(B, k, n, 1, "ND", p.trans_b)
    plan, buf = alloc_plan(cube, t, hw, "matmul", _Layout(W, 2 * m, vk, 1, "ND"), lb,
                           (_Layout(W, 2 * m, first_n, 4, "ND"),), ((0, first_n),), vk, None, None)
    aic, aiv = [], []
    for b in range(blocks):
        body: list = [*_preload(p, st, plan, lb, b), PipeBarrier(Pipe.MTE2), SyncAll(), *_prologue(t)]
        body += _cube_loop(p, st, plan, lb, ws, b, 0)
        for i in range(1, loops):
            body += [*_cube_loop(p, st, plan, lb, ws, b, i), SyncAll()]  # task i - 1 to the AIVs
            if st.cache_num == 2 and i + 1 < loops:  # the slot task i + 1 takes is task i - 1's
                body.append(SyncAll())
        aic.append(Program([*body, SyncAll(), *_epilogue(t)], buf.buffers))
        aiv.append(_vector_program(p, hw, st, A, Y, scale, bias, ws, b, loops))
    return lowered_mix(p, t, aic, aiv, (A, B, Y, scale, bias, W))


@frozen
class _Workspace:
    factors: int  # [kIdx][m] rows' factors, _FACTORS bytes each
    parts: int  # K block kIdx's [A1; A2] at parts + kIdx * a_unfold, rows v1BaseK apart
    a_unfold: int
    partials: int  # task i's slot at partials + (i % cache_num) * c_slot: [kIdx][2m][taskN] fp32
    c_slot: int
    cache_num: int

    def partial(self, task: int, k_idx: int, row: int, col: int, task_cols: int, m: int) -> int:
        """GM address of a partial: task's slot, K block k_idx, row `row` of [A1; A2] x W, column `col`."""
        return self.partials + (task % self.cache_num) * self.c_slot + ((k_idx * 2 * m + row) * task_cols + col) * 4


def _pairs(p, st: SplitKTiling, b: int, task: int) -> list[tuple[int, int, int, int]]:
    """Cube b's (K block, first column in the task, columns, K columns) pairs of N task
    `task`, in its order (InitMatmulParams, LaunchMatmul): runs of singleCoreTaskNum, K fastest."""
    cur_n = min(st.task_n, p.n - task * st.task_n)
    core_n = cdiv(cur_n, st.block_dim) if p.trans_b else st.cube_core_n  # the kernel's cubeSingleCoreN_
    pairs = st.k_blocks * cdiv(cur_n, core_n)
    each = cdiv(pairs, st.block_dim)
    out = []
    for j in range(b * each, min(pairs, (b + 1) * each)):
        k_idx, n0 = j % st.k_blocks, j // st.k_blocks * core_n
        if n0 < cur_n:
            out.append((k_idx, n0, min(core_n, cur_n - n0), min(st.v1_base_k, p.k - k_idx * st.v1_base_k)))
    return out


def _cube_loop(p, st: SplitKTiling, plan, lb: _Layout, ws: _Workspace, b: int, task: int) -> list:
    """Cube b's pairs of N task `task` (LaunchMatmul): each the tile nest of [A1; A2] of its
    K block times the weight's rows of that block, into the task's slot."""
    from npusim.ops.matmul import MatmulParams

    m, t = p.m, plan.t
    t0 = task * st.task_n
    cur_n = min(st.task_n, p.n - t0)
    out = []
    for k_idx, n0, cols, kk in _pairs(p, st, b, task):
        cube = MatmulParams(m=2 * m, n=cols, k=kk, dtype="int8", out_dtype="fp32", trans_b=p.trans_b)
        la = _Layout(_At(ws.parts + k_idx * ws.a_unfold), 2 * m, st.v1_base_k, 1, "ND")
        lc = _Layout(_At(ws.partial(task, k_idx, 0, n0, cur_n, m)), 2 * m, cur_n, 4, "ND")
        pair = attrs.evolve(plan, p=cube, la=la, lb=lb.moved(k_idx * st.v1_base_k * lb.dr + (t0 + n0) * lb.dc),
                            lc=(lc,), parts=((0, cols),), k_piece=kk)
        dims = (1, cdiv(2 * m, t.base_m), cdiv(cols, t.base_n), 1)
        out += _box(pair, (0, 0, 0, 0), dims, dims)
    return out


def _preload(p, st: SplitKTiling, plan, lb: _Layout, b: int) -> list:
    """BL1PreLoad: cube b's first weight chunks of its first task, up to PRELOAD_TIMES,
    plain copies into one L1 chunk buffer (read again by the loop; they warm L2)."""
    t = plan.t
    kc = t.base_k * t.step_k
    out: list = []
    for k_idx, n0, cols, kk in _pairs(p, st, b, 0):
        for c in range(0, cols, t.base_n):
            for r in range(0, kk, kc):
                if len(out) == PRELOAD_TIMES:
                    return out
                seg, nseg, stride = lb.pieces(min(kc, kk - r), min(t.base_n, cols - c))
                src = lb.base + (k_idx * st.v1_base_k + r) * lb.dr + (n0 + c) * lb.dc
                out.append(Copy(Mem.GM, Mem.L1, src, plan.b_l1[0], seg, nseg, stride, seg))
    return out


@frozen
class _At:
    """A stand-in GM tensor for _Layout: only its address."""

    addr: int


def _carve(sizes: dict[str, int], limit: int, what: str) -> dict[str, int]:
    """UB offsets of `sizes` (bytes) back to back on 32-byte blocks inside the one UB
    buffer (CANN's 192 KB TBuf, its phases' tensors overlapping: InitBuffer)."""
    out, at = {}, 0
    for name, nbytes in sizes.items():
        out[name] = at
        at = align_up(at + nbytes, UB_BLOCK)
    if at > limit:
        raise ProgramError(f"op matmul: the split-K multi-scale kernel's {what} needs {at} bytes of UB, "
                           f"more than the {limit} it has")
    return out


def _vector_program(p, hw: HwConfig, st: SplitKTiling, A, Y, scale, bias, ws: _Workspace, b: int,
                    loops: int) -> Program:
    """Block b's two vector cores: their PreProcess tasks, SyncAll, then each N task's share
    once the cubes are past it (module doc)."""
    m, e = p.m, DTYPE_BYTES[p.dtype]
    ub_bytes = hw.aiv.ub_bytes
    room = ub_bytes - 2 * UB_BLOCK - _FACTORS - 6 * UB_BLOCK  # the row maximum, the factors, alignment
    chunk = min(st.v1_base_k, room // _PRE_BYTES // MSD_ALIGN * MSD_ALIGN)
    pre = _carve({"x": chunk * e, "w": chunk * 4, "t": chunk * 4, "h": chunk * 2, "q1": chunk, "q2": chunk,
                  "amax": 2 * UB_BLOCK, "fac": _FACTORS}, ub_bytes, "PreProcess")
    body: list = []
    for u0, u1 in _steps(_pre_units(p, st, 2 * b), _pre_units(p, st, 2 * b + 1)):
        body += _quantise_unit(p, st, A, ws, u0, u1, chunk, pre)
    body.append(SyncAll())

    shares = [_post_share(p, st, b, i) for i in range(loops)]
    if any(shares):
        w = st.task_core_n
        post = _carve({"fac": st.k_blocks * m * _FACTORS, "scale": w * 4, "bias": w * 4 if bias else 0,
                       "c0": st.post_base_m * w * 4, "c1": st.post_base_m * w * 4, "acc": st.post_core_m * w * 4,
                       "y": st.post_core_m * w * DTYPE_BYTES[p.out_dtype]}, ub_bytes, "PostProcess")
        # CopyInSumMax: every row's factors of every K block, once
        body += [Copy(Mem.GM, Mem.UB, ws.factors, post["fac"], st.k_blocks * m * _FACTORS),
                 *_after(Pipe.MTE2, Pipe.V), *scalar_read(),
                 SetFlag(Pipe.V, Pipe.MTE2, _PING), SetFlag(Pipe.V, Pipe.MTE2, _PING + 1)]
    for i in range(loops):
        if i and shares[i - 1]:  # task i - 1, as the cubes hand it over (after their task i)
            body += _post_prepare(st, scale, bias, post, i - 1, shares[i - 1])
        if i:
            body.append(SyncAll())
        if i and shares[i - 1]:
            body += _post_task(p, st, Y, ws, post, i - 1, shares[i - 1])
        if i and st.cache_num == 2 and i + 1 < loops:
            body.append(SyncAll())
    if shares[-1]:
        body += _post_prepare(st, scale, bias, post, loops - 1, shares[-1])
    body.append(SyncAll())
    if shares[-1]:
        body += _post_task(p, st, Y, ws, post, loops - 1, shares[-1])
    if any(shares):
        body += [WaitFlag(Pipe.V, Pipe.MTE2, _PING), WaitFlag(Pipe.V, Pipe.MTE2, _PING + 1), *_after(Pipe.MTE3, Pipe.V)]
    return Program(body, [Buffer("ub", Mem.UB, 0, ub_bytes)])


def _pre_units(p, st: SplitKTiling, core: int) -> list[tuple[int, int]]:
    """The (row, K block) units of AIV `core`'s PreProcess tasks, in its order: a run of
    singleCoreTaskNum of the (row block, K block) tasks, K fastest (PreProcess), a task's
    rows one by one."""
    blocks_m = cdiv(p.m, st.v1_base_m)
    tasks = st.k_blocks * blocks_m
    each = cdiv(tasks, 2 * st.block_dim)
    out = []
    for j in range(core * each, min(tasks, (core + 1) * each)):
        m_idx, k_idx = divmod(j, st.k_blocks)
        out += [(r, k_idx) for r in range(m_idx * st.v1_base_m, min(p.m, (m_idx + 1) * st.v1_base_m))]
    return out


def _steps(a: list, b: list) -> list[tuple]:
    """The two AIVs' units in step: one of each at a time; the core with fewer repeats the
    other's (module doc)."""
    return [(a[i] if i < len(a) else b[i], b[i] if i < len(b) else a[i]) for i in range(max(len(a), len(b)))]


def _quantise_unit(p, st: SplitKTiling, A, ws: _Workspace, u0, u1, chunk: int, ub: dict) -> list:
    """Row `row`'s K block `k_idx` (sub 0: u0, sub 1: u1) into its two parts and factors
    (matmul_msd._quantise over v1BaseK columns); the last K block is padded with its own
    first columns (module doc)."""
    m, k, e, vk = p.m, p.k, DTYPE_BYTES[p.dtype], st.v1_base_k
    tail = k - (st.k_blocks - 1) * vk

    def moving(base_of):
        a0, delta = base_of(*u0), base_of(*u1) - base_of(*u0)
        return addr(a0, sub=delta)

    seg = lambda row, k_idx: A.addr + (row * k + k_idx * vk) * e  # noqa: E731

    def pad_at(row, k_idx):  # where column `tail` of the unit's block comes from
        return seg(row, k_idx) + (0 if k_idx == st.k_blocks - 1 else tail * e)

    def load_x(j: int, n: int) -> list:
        out = []
        if j < tail:
            out.append(Copy(Mem.GM, Mem.UB, moving(lambda r, kk: seg(r, kk) + j * e), ub["x"],
                            (min(j + n, tail) - j) * e))
        if j + n > tail:
            lo = max(j, tail)
            out.append(Copy(Mem.GM, Mem.UB, moving(lambda r, kk: pad_at(r, kk) + (lo - tail) * e),
                            ub["x"] + (lo - j) * e, (j + n - lo) * e))
        return out

    def part_at(i: int, j: int):
        return moving(lambda r, kk: ws.parts + kk * ws.a_unfold + (i * m + r) * vk + j)

    fac_at = moving(lambda r, kk: ws.factors + (kk * m + r) * _FACTORS)
    return _quantise(p.dtype, vk, chunk, ub, ub["amax"], ub["fac"], load_x, part_at, fac_at)


def _post_share(p, st: SplitKTiling, b: int, task: int):
    """Block b's AIVs' shares of task `task`'s combine (PostProcess: AIV idx's rows
    postProcessSingleCoreM x (idx / postProcessNNum), columns taskSingleCoreNSize x (idx %
    postProcessNNum), cut to the task): ((row, column) of sub 0, of sub 1, rows, columns),
    the narrower widened (module doc); None when neither has one."""
    cur_n = min(st.task_n, p.n - task * st.task_n)
    post_n = cdiv(st.task_n, st.task_core_n)
    got = []
    for core in (2 * b, 2 * b + 1):
        r0, c0 = core // post_n * st.post_core_m, core % post_n * st.task_core_n
        if r0 < p.m and c0 < cur_n:
            got.append((r0, c0, min(st.post_core_m, p.m - r0), min(st.task_core_n, cur_n - c0)))
    if not got:
        return None
    rows, cols = max(g[2] for g in got), max(g[3] for g in got)
    at = [(r0 + nr - rows, c0 + nc - cols) for r0, c0, nr, nc in got]
    return at[0], at[-1], rows, cols


def _post_prepare(st: SplitKTiling, scale, bias, ub: dict, task: int, share) -> list:
    """Before the AIVs wait for task `task`: the sum zeroed, the share's scales (and bias) in
    (PostProcessOneTaskN: Duplicate; ComputeOffsetMn)."""
    (_, c0), (_, c1), rows, cols = share
    col = lambda base, eb: addr(base + (task * st.task_n + c0) * eb, sub=(c1 - c0) * eb)  # noqa: E731
    out = [vop("dup", rows * cols, "fp32", ub["acc"], scalar=0.0), *_after(Pipe.V, Pipe.MTE2),
           Copy(Mem.GM, Mem.UB, col(scale.addr, 4), ub["scale"], cols * 4)]
    if bias is not None:
        out.append(Copy(Mem.GM, Mem.UB, col(bias.addr, 4), ub["bias"], cols * 4))
    return out + _after(Pipe.MTE2, Pipe.V)


def _post_task(p, st: SplitKTiling, Y, ws: _Workspace, ub: dict, task: int, share) -> list:
    """Task `task`'s share combined (ProcessC1C2, CopyOutResult): per K block and run of
    postProcessBaseM rows, both parts' partials in (ping, pong), then per row the factors
    and the sum; per row the scale (and bias); out in the output dtype."""
    m, n, eo = p.m, p.n, DTYPE_BYTES[p.out_dtype]
    (r0, c0), (r1, c1), rows, cols = share
    dr, dc = r1 - r0, c1 - c0
    cur_n = min(st.task_n, n - task * st.task_n)
    out: list = []
    for k_idx in range(st.k_blocks):
        for mo in range(0, rows, st.post_base_m):
            rr = min(st.post_base_m, rows - mo)
            for part in (0, 1):
                src = addr(ws.partial(task, k_idx, part * m + r0 + mo, c0, cur_n, m), sub=(dr * cur_n + dc) * 4)
                c = ub[f"c{part}"]
                out += [WaitFlag(Pipe.V, Pipe.MTE2, _PING + part),
                        Copy(Mem.GM, Mem.UB, src, c, cols * 4, rr, cur_n * 4, cols * 4),
                        SetFlag(Pipe.MTE2, Pipe.V, _PING + part), WaitFlag(Pipe.MTE2, Pipe.V, _PING + part),
                        cast(rr * cols, "fp32", "fp32", c, c)]  # CANN's int32 -> fp32 (module doc)
            fac = addr(ub["fac"] + (k_idx * m + r0 + mo) * _FACTORS, r=_FACTORS, sub=dr * _FACTORS)
            row = lambda base: addr(base, r=cols * 4)  # noqa: E731
            out += [Loop("r", rr, [
                vop("muls", cols, "fp32", row(ub["c0"]), row(ub["c0"]), scalar_src=fac),
                vop("muls", cols, "fp32", row(ub["c1"]), row(ub["c1"]), scalar_src=shift(fac, UB_BLOCK)),
                vop("add", cols, "fp32", row(ub["acc"] + mo * cols * 4), row(ub["acc"] + mo * cols * 4),
                    row(ub["c0"])),
                vop("add", cols, "fp32", row(ub["acc"] + mo * cols * 4), row(ub["acc"] + mo * cols * 4),
                    row(ub["c1"]))]),
                SetFlag(Pipe.V, Pipe.MTE2, _PING), SetFlag(Pipe.V, Pipe.MTE2, _PING + 1)]
    acc = addr(ub["acc"], r=cols * 4)
    per_row = [vop("mul", cols, "fp32", acc, acc, ub["scale"])]
    if p.bias:
        per_row.append(vop("add", cols, "fp32", acc, acc, ub["bias"]))
    y_at = addr(Y.addr + (r0 * n + task * st.task_n + c0) * eo, sub=(dr * n + dc) * eo)
    return out + [Loop("r", rows, per_row), *_after(Pipe.MTE3, Pipe.V),
                  cast(rows * cols, "fp32", p.out_dtype, ub["y"], ub["acc"]), *_after(Pipe.V, Pipe.MTE3),
                  Copy(Mem.UB, Mem.GM, ub["y"], y_at, cols * eo, rows, cols * eo, n * eo)]


__all__ = ["MSD_PERCHANNEL_MAX_K", "MSD_PERCHANNEL_MAX_N", "SplitKTiling", "lower_msd_splitk", "msd_splitk_applies",
           "splitk_tiling"]
