"""FlashAttention as one MIX kernel: the block programs and the lowering."""

from __future__ import annotations

from collections import Counter

import attrs
import numpy as np

from npusim.errors import ProgramError
from npusim.hw import HwConfig
from npusim.isa.program import Affine, Copy, CoreType, CrossWaitFlag, Kernel, Loop, Program, bound, moving
from npusim.ops.build import cdiv
from npusim.ops.reference import attention, batches_to, bsnd_to_batches, group_heads
from npusim.ops.registry import GmArena, Lowered, register
from npusim.ops.attention.common import (
    check_page_loads, FIX, FlashAttentionParams, _io, _kv_cache, _kv_inputs, page_loads,
)
from npusim.ops.attention.flash_cores import _Cube, _KvRead, _Vec
from npusim.ops.attention.flash_tiling import (
    check_steps, choose_flash_tiling, _fa_geometry, _FaGeometry, FlashAttentionTiling, _partition, _S_FREE, _splits,
    _Step, _Tile, _tile_keys, _tile_steps,
)

# The AIVs per block the AIV program is written for: `sub` 0 or 1 picks one half of a q
# tile's rows (flash_cores._Vec), as on the 910B (chip.aiv_per_aic 2).
FLASH_AIVS = 2


def _fa_programs(g: _FaGeometry, tiles: list[int], specs: list, q, kv: _KvRead, o, w,
                 loops: bool = True) -> tuple[Program, Program]:
    """The AIC and AIV programs of a block working through q tiles `tiles` of one head.

    Slot s: the cube computes Q K^T of step s+2 and P V of step s; the AIVs do the
    softmax of step s+1 and the rescale-accumulate of step s (and finish a tile
    after its last step). The cube running two steps ahead keeps both sides busy:
    the chain P(s) -> P V -> Q K^T -> S -> softmax has two steps to complete. The
    pipeline runs on across q tiles. Slots that look alike become a Loop (two per
    iteration: ping and pong); in a non-causal head whole tiles look alike and loop
    (unless loops=False: steps whose addresses are data, as a paged cache's)."""
    cube, vec = _Cube(g, q, kv, w), _Vec(g, o, w)
    masked = any(step[2] for t in tiles for step in specs[t][1])
    cube.out, vec.out = cube.prologue() + kv.start(g), vec.prologue(masked)
    nsteps = [len(specs[t][1]) for t in tiles]
    start = [0]
    for n in nsteps:
        start.append(start[-1] + n)

    def step(i: int, j: int, lin=None) -> _Step | None:
        """Step j of block tile i (None past the last); lin(i) gives the tile's first row."""
        while i < len(tiles) and j >= nsteps[i]:
            j -= nsteps[i]
            i += 1
        if i >= len(tiles):
            return None
        rows, steps = specs[tiles[i]]
        k0, kt, masked = steps[j]
        nsub, nb = g.step_shape(kt)
        tile = _Tile(lin(i) if lin else tiles[i] * g.qt, rows, i % 2)
        return _Step(tile, k0, kt, nsub, nb, masked, j == 0, j == len(steps) - 1, (start[i] + j) % 2)

    def ahead(st: _Step) -> None:
        """Q K^T of st (its tile's Q first, if st opens the tile)."""
        if st.first:
            cube.load_q(st.tile)
        cube.load_kv(st, "k")
        cube.qk(st, reuse=True)

    def slot(s: _Step, s1: _Step | None, s2: _Step | None) -> None:
        if s2 is not None:
            ahead(s2)
        cube.load_kv(s, "v")
        cube.load_p(s)
        cube.pv(s)
        if s1 is not None:
            vec.softmax(s1)
        vec.update(s)
        if s.last:
            vec.finish(s.tile)

    def looped(var: str, count: int, body) -> None:
        """Emit body() once as the body of Loop(var, count) on both cores; every
        buffer rotation must come back to where it started."""
        before = (cube.mm % 2, cube.cc % 2, vec.ch % 2)
        saved = cube.out, vec.out
        cube.out, vec.out = [], []
        body()
        assert before == (cube.mm % 2, cube.cc % 2, vec.ch % 2), "loop body must rotate buffers evenly"
        (c_out, v_out), (cube.out, vec.out) = (cube.out, vec.out), saved
        cube.out.append(Loop(var, count, c_out))
        vec.out.append(Loop(var, count, v_out))

    def moved(st: _Step | None) -> _Step | None:
        return None if st is None else attrs.evolve(st, k0=moving(st.k0, "j", 2 * g.kt))

    def emit_tile(i: int, lin=None) -> None:
        n = nsteps[i]
        steps = [step(i, j, lin) for j in range(n + 2)]  # and two past the tile's end
        run = 0  # slots 0 .. run-1 look alike: their s+1 and s+2 are in this tile, unmasked, not its last
        while loops and run <= n - 4 and not steps[run + 1].masked and not steps[run + 2].masked:
            run += 1
        if run >= 2:
            looped("j", run // 2, lambda: [slot(*(moved(steps[x + i]) for i in range(3))) for x in (0, 1)])
        for j in range(run // 2 * 2, n):
            slot(steps[j], steps[j + 1], steps[j + 2])

    first = step(0, 0)
    cube.load_q(first.tile)
    cube.load_kv(first, "k")
    cube.qk(first, reuse=False)
    second = step(0, 1)
    if second is not None:
        if second.first:
            cube.load_q(second.tile)
        cube.load_kv(second, "k")
        cube.qk(second, reuse=False)
    vec.softmax(first)
    # tiles 0 .. same-1 are alike (consecutive, same rows and steps): pairs of them loop, as long
    # as the two tiles after a pair (which its last slots look into) are alike too
    same = 1
    while (same < len(tiles) and tiles[same] == tiles[0] + same and specs[tiles[same]] == specs[tiles[0]]):
        same += 1
    pairs = max(0, (same - 2) // 2) if loops else 0
    if pairs >= 1:
        lin = lambda i: moving((tiles[0] + i) * g.qt, "tt", 2 * g.qt)  # noqa: E731
        looped("tt", pairs, lambda: [emit_tile(i, lin) for i in (0, 1)])
    for i in range(2 * pairs, len(tiles)):
        emit_tile(i)
    cube.out += [CrossWaitFlag(FIX, _S_FREE)] * min(2, start[-1])  # the last two slots' releases
    return (Program(cube.out + cube.epilogue(), g.aic), Program(vec.out + vec.epilogue(), g.aiv))


# Build each distinct structure of a kernel's run programs once (_RunPrograms); False builds
# every run's anew, as the tests compare.
_SHARE_BUILDS = True
# The variable standing for each GM input's base address in a template (_RunPrograms); a
# template's variables all start with "@", which starts no loop variable of a lowering
# (flash_cores' paged ones too: TABLE_VAR, page_var)
_BASES = {"q": "@q", "k": "@k", "v": "@v", "o": "@o"}


class _RunPrograms:
    """_fa_programs for the runs of blocks of one kernel (g, specs, the workspace w, loops
    and the KV cache are the kernel's), each distinct structure built once.

    Runs differ mostly in the base addresses of their GM inputs (Q, O, the K and V heads):
    a template is built with each base a variable of its own (_BASES: base 0, step 1) and
    a run's programs bind them to its bases (isa.program.bound). Exact: the emitters
    derive addresses from an input only by shift, moving and offset, each linear in its
    base, and offset's addr() drops only terms of step 0, never the base variable; so a
    template's address is the run's with the variable in place of the base, but where
    every other term dropped: a plain int from the run's inputs, which bound gives too.
    shift and moving drop no term, so an address has one left as long as its input has:
    an input without terms is not made a variable (a plain int from it could not be told
    from an Affine without terms) but part of the structure. A paged cache's addresses are
    data: a template reads each block load's, and its sequence's row of the block table,
    as a variable of its own (_KvRead.pages), bound to the run's sequence and head
    (_KvRead.page_values; its loads touch the same blocks of its own sequence, by
    KvCache.runs, which depends on the positions alone). The structure, the key of a
    template (_structure): the tiles and each input's terms (or the input itself, if it
    is not a variable). A structure only one run has is built as it is."""

    def __init__(self, g: _FaGeometry, specs: list, w, loops: bool, runs: list[tuple]):
        """runs: the (tiles, q, kv, o) of each run the kernel will ask for."""
        self.g, self.specs, self.w, self.loops = g, specs, w, loops
        self.runs = Counter(_structure(*run)[0] for run in runs)  # runs of each structure
        # structure -> (per side (its template, where in its body the base variables are: _holes),
        # a paged template's loads: _KvRead.pages)
        self.templates: dict[tuple, tuple[tuple[tuple[Program, list], ...], list | None]] = {}

    def __call__(self, tiles: list[int], q, kv: _KvRead, o) -> tuple[Program, Program]:
        """The AIC and AIV programs of a run working through `tiles` (see _fa_programs)."""
        key, inputs = _structure(tiles, q, kv, o)
        if not _SHARE_BUILDS or self.runs[key] < 2:
            return _fa_programs(self.g, tiles, self.specs, q, kv, o, self.w, self.loops)
        variable = {name: a for name, a in inputs.items() if _variable(a)}
        template = self.templates.get(key)
        if template is None:
            free = {**inputs, **{n: Affine(0, a.terms + ((_BASES[n], 1),)) for n, a in variable.items()}}
            reads = attrs.evolve(kv, k=free["k"], v=free["v"], pages=[] if kv.cache.layout.layout == "paged" else None)
            progs = _fa_programs(self.g, tiles, self.specs, free["q"], reads, free["o"], self.w, self.loops)
            template = self.templates[key] = tuple((p, _holes(p.body)) for p in progs), reads.pages
        sides, pages = template
        values = {_BASES[name]: a.base for name, a in variable.items()}
        if pages is not None:
            values.update(kv.page_values(pages))
        return tuple(Program(_bound_body(p.body, holes, values), p.buffers) for p, holes in sides)


def _structure(tiles: list[int], q, kv: _KvRead, o) -> tuple[tuple, dict]:
    """A run's structure (its template's key: see _RunPrograms) and its inputs by name."""
    inputs = {"q": q, "k": kv.k, "v": kv.v, "o": o}
    return (tuple(tiles), *(a.terms if _variable(a) else a for a in inputs.values())), inputs


def _variable(a) -> bool:
    """Whether a template makes the input's base a variable: an Affine with terms (see _RunPrograms)."""
    return a.__class__ is Affine and bool(a.terms)


def _holes(body: tuple) -> list[tuple[int, list | None]]:
    """Where a template's body reads a base variable: (index, None) for such a Copy,
    (index, the holes of its body) for a Loop holding some.
    # assumption: the inputs reach Copy addresses only (load_q, _KvRead.load, finish); a
    # variable left anywhere else would fail verify (a var not in scope)"""
    out = []
    for i, x in enumerate(body):
        if x.__class__ is Copy and any(a.__class__ is Affine and any(v.startswith("@") for v, _ in a.terms)
                                       for a in (x.src_addr, x.dst_addr)):
            out.append((i, None))
        elif x.__class__ is Loop:
            inner = _holes(x.body)
            if inner:
                out.append((i, inner))
    return out


def _bound_body(body: tuple, holes: list, values: dict[str, int]) -> tuple:
    """A template's body with its base variables bound at its holes (isa.program.bound);
    the rest are the template's instructions (records: shared, as the flags are)."""
    out = list(body)
    for i, inner in holes:
        x = body[i]
        out[i] = (x.moved(bound(x.src_addr, values), bound(x.dst_addr, values)) if inner is None
                  else Loop(x.var, x.count, _bound_body(x.body, inner, values)))
    return tuple(out)


def reference_flash_attention(p: FlashAttentionParams, x, specs, ctx) -> dict:
    """q (BSND or [b*h, s, d]) over the layer's cache (kv_layout); causal aligned to the
    end of the keys, and in decode each sequence's padding keys hidden. Scores and
    softmax in fp32 (in UB, never stored); P stored in q's dtype for the cube."""
    q = bsnd_to_batches(x["q"], specs["q"], p.batch * p.heads, p.seq_q, p.head_dim)
    k, v = (group_heads(t, p.group).reshape(-1, p.seq_kv, p.head_dim) for t in p.kv_cache().unpack(x))
    keys = np.arange(p.seq_kv)
    visible = np.ones((p.batch, p.heads, p.seq_q, p.seq_kv), dtype=bool)
    if p.causal:
        visible &= keys[None, :] <= np.arange(p.seq_q)[:, None] + p.seq_kv - p.seq_q
    if ctx.phase == "decode":  # each sequence's padding keys
        visible &= keys[None, None, None, :] < np.array(ctx.lengths)[:, None, None, None]
    o = attention(q.reshape(p.batch, p.heads, p.seq_q, p.head_dim), k.reshape(p.batch, p.heads, p.seq_kv, -1),
                  v.reshape(p.batch, p.heads, p.seq_kv, -1), visible, lambda a: ctx.store(a, specs["q"].dtype))
    return {"o": batches_to(o.reshape(-1, p.seq_q, p.head_dim), specs["o"])}


# the most query rows a Q tile holds (choose_flash_tiling's largest q_tile)
PACKED_ROWS = 128


@register("flash_attention", FlashAttentionParams, FlashAttentionTiling, reference=reference_flash_attention,
          ins=("q",), outs=("o",), kv="read")
def lower_flash_attention(p: FlashAttentionParams, hw: HwConfig, gm: GmArena,
                          tiling: FlashAttentionTiling | None, op_name: str = "flash_attention") -> Lowered:
    """FlashAttention: Q K^T, scale, mask, online softmax and P V in one MIX kernel
    (_lower_flash). Under GQA, when a KV head's whole group of query heads holds at
    most PACKED_ROWS query rows (decode, a few speculative tokens) and no tiling is
    given, the group is one Q tile of a kernel over the KV heads: q's heads of a group
    are consecutive, so their rows are too, and each KV head is read once for the
    group instead of once per query head. Causal: packed row i is query i % seq_q of
    its head and sees the keys that query sees (a key step is skipped only when no row
    sees it; the masks hold each row's query index, _FaGeometry.period).
    op_name: the op its errors name, 'op NAME: ...' (decode attention on the cube names
    itself, not the kernel it runs as)."""
    packed_rows = p.seq_q * p.group
    if tiling is None and p.group > 1 and packed_rows <= PACKED_ROWS and (not p.causal or packed_rows <= p.seq_kv):
        low = _lower_flash(attrs.evolve(p, heads=p.kv_heads, seq_q=packed_rows), hw, gm, None,
                           period=p.seq_q if p.causal else 0, op_name=op_name)
        ins, outs = _io(p)
        return attrs.evolve(low, params=p, flops=4.0 * p.batch * p.heads * p.head_dim * p.visible_pairs(),
                            inputs=[ins[0], *low.inputs[1:]], outputs=outs)
    return _lower_flash(p, hw, gm, tiling, op_name=op_name)


def _lower_flash(p: FlashAttentionParams, hw: HwConfig, gm: GmArena, tiling: FlashAttentionTiling | None,
                 period: int = 0, op_name: str = "flash_attention") -> Lowered:
    """FlashAttention: Q K^T, scale, mask, online softmax and P V in one MIX kernel.

    A block (1 AIC + 2 AIVs) takes q tiles of one head. For each step of keys
    (kv_tile) the AIC loads K, computes S = Q K^T (Mmad per sub_tile into L0C) and
    FixPipes it to the block's workspace; a head too large for L0 is split over
    head_dim (d_chunk: S summed in L0C over the chunks, P V made a column chunk of O
    at a time), L1 and UB holding it whole; the AIVs (half the rows each) scale,
    mask, update the running max and sum, write P = exp(S - max) back (fp16) and
    signal; the AIC loads P and V, computes P V and FixPipes the partial O, which
    the AIVs rescale-accumulate in UB. At the end of a q tile the AIVs divide by
    the row sums and store O. The cube computes Q K^T two steps ahead of P V, so
    cube and vector cores overlap; the workspace per block holds two of each (S,
    P, partial O) and the AIVs tell the cube when they have read an S slot. It is
    sized per block (the program knows its block, not its core) and stays in L2.
    Scores never reach GM as an S x S tensor. Causal: key steps wholly past a tile's last row are skipped,
    the diagonal steps are masked. GQA: K/V head h // group is read by the blocks
    of each of its query heads (the L2 keeps it).

    Blocks: every core first takes whole heads (block b = head b, in waves); the
    heads left over are split into q-tile sets of equal work (longest-first when
    causal) so the last wave fills the cores too.

    K and V come from the KV cache in kv_layout (seq_kv = its capacity, `layer` of
    `layers`); see _KvRead for what each layout's loads are."""
    if hw.chip.aiv_per_aic != FLASH_AIVS:  # fewer would leave rows undone, more would write past O
        raise ProgramError(f"op {op_name}: its MIX kernel splits each q tile's rows between {FLASH_AIVS} AIVs "
                           f"per AIC, and chip.aiv_per_aic is {hw.chip.aiv_per_aic}")
    t = tiling or FlashAttentionTiling()
    if not (t.q_tile and t.kv_tile and t.sub_tile and t.d_chunk):
        t = choose_flash_tiling(p, hw, t, period, op_name)
    g = _fa_geometry(p, t, hw, period, op_name)
    e, d, grp = g.e, p.head_dim, p.group
    bkv = p.batch * p.kv_heads
    hs = p.seq_q * d * e
    Q = gm.tensor("q", p.batch * p.heads * hs)
    cache = _kv_cache(p, hw, gm, op_name)
    O = gm.tensor("o", p.batch * p.heads * hs)
    paged = p.kv_layout == "paged"
    n_tiles = cdiv(p.seq_q, g.qt)
    check_steps(g, n_tiles, op_name)
    if paged:  # each q tile reads its keys in steps of kv_tile from key 0
        check_page_loads(op_name, f"batch={p.batch} x heads={p.heads} x seq_q={p.seq_q} x seq_kv={p.seq_kv}",
                         2 * p.batch * p.heads * sum(page_loads(_tile_keys(g, t)[3], g.kt, p.block_tokens)
                                                     for t in range(n_tiles)), p.block_tokens)
    specs = [_tile_steps(g, i) for i in range(n_tiles)]
    work = [len(s[1]) + 1 for s in specs]
    uniform = len(set(work)) == 1

    cores = hw.chip.aic_count
    units = p.batch * p.heads  # (gi, bk) in order gi * bkv + bk: query head bk * grp + gi
    whole = units // cores * cores
    left = units - whole
    parts = []
    if left:
        if t.q_splits > n_tiles:  # it would run as n_tiles: the tiling printed would not be the one run
            raise ProgramError(f"op {op_name}: tiling q_splits={t.q_splits} exceeds the {n_tiles} q tiles "
                               f"of a head (q_tile {g.qt}) it splits")
        n_parts = t.q_splits or _splits(left, cores, work, uniform)
        parts = _partition(work, n_parts, uniform)
    # block -> (kind, unit): kind -1 = the whole head, else the index of a part
    blocks = [(-1, u) for u in range(whole)] + [(i, u) for i in range(len(parts)) for u in range(whole, units)]
    W = gm.tensor("workspace", len(blocks) * g.ws_bytes)
    wb = Affine(W.addr, (("block", g.ws_bytes),))

    def kv_head(which: str, bk: int) -> int:
        """GM address of token 0 of K or V head bk (= batch * kv_heads + head)."""
        return cache.token_addr(which, *divmod(bk, p.kv_heads), 0)

    def kv_affine(bk: int, n: int) -> bool:
        """KV heads bk .. bk+n equally spaced (a run of blocks can share a program)."""
        return all(kv_head(w, bk + n) - kv_head(w, bk) == n * (kv_head(w, bk + 1) - kv_head(w, bk)) for w in "kv")

    runs = []  # (blocks, tiles, q, kv, o) of each run
    b = 0
    while b < len(blocks):  # runs of blocks: same kind, same gi, consecutive and equally spaced bk
        kind, u = blocks[b]
        gi, bk = divmod(u, bkv)
        end = b + 1
        while not paged and end < len(blocks) and blocks[end][0] == kind and blocks[end][1] == u + end - b \
                and blocks[end][1] // bkv == gi and kv_affine(bk, end - b):
            end += 1

        def at(tensor, per_head: int, head: int, heads_per_block: int):
            """The head's base at block b, moving by heads_per_block heads per block."""
            step = per_head * heads_per_block
            return Affine(tensor.addr + head * per_head - b * step, (("block", step),))

        qh = bk * grp + gi
        if paged:
            kv = _KvRead(cache, seq=bk // p.kv_heads, head=bk % p.kv_heads)
        else:  # the run's KV heads, one step apart per block
            steps = [kv_head(w, bk + 1) - kv_head(w, bk) if end - b > 1 else 0 for w in "kv"]
            kv = _KvRead(cache, *(Affine(kv_head(w, bk) - b * s, (("block", s),)) for w, s in zip("kv", steps)))
        runs.append((end - b, list(range(n_tiles)) if kind < 0 else parts[kind], at(Q, hs, qh, grp), kv,
                     at(O, hs, qh, grp)))
        b = end
    programs = _RunPrograms(g, specs, wb, not paged, [run[1:] for run in runs])
    aic, aiv = [], []
    for n, *run in runs:
        progs = programs(*run)
        aic += [progs[0]] * n
        aiv += [progs[1]] * n
    if all(x is aic[0] for x in aic):  # every block runs one program: verify checks it once
        aic, aiv = aic[:1], aiv[:1]
    kernel = Kernel("flash_attention", CoreType.MIX, len(blocks), aic=aic, aiv=aiv, gm=[Q, *cache.tensors, O, W],
                    workspace_bytes=W.nbytes, op_type="flash_attention")
    ins, outs = _io(p)
    ins = [ins[0], *_kv_inputs(cache)]
    return Lowered(
        op_type="flash_attention", params=p, tiling=t, kernels=[kernel],
        flops=4.0 * p.batch * p.heads * d * p.visible_pairs(),
        min_gm_bytes=float(sum(x.nbytes for x in ins + outs)),
        unit="cube", inputs=ins, outputs=outs, workspace_bytes=W.nbytes,
    )
