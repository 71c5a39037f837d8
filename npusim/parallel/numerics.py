"""Sharded numerics: run every rank's shard of a parallel step with numpy, the
collectives summing (tensor parallel) or gathering (sequence parallel) across ranks,
and compare with the unsharded FP32 reference.

Each rank gets the slices of the full model's weights and KV cache it holds (each
weight along its dim of graph.build.TP_SPLIT_DIMS, every expert's alike; its K/V
heads of the cache), so the ranks together compute what one device computes. The ranks run in threads that
meet at each collective (ops.collectives.exchange).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import numpy as np
from attrs import frozen

from npusim.errors import ConfigError
from npusim.graph.build import TP_SPLIT_DIMS, build_decoder, host_inputs
from npusim.graph.execute import _caches, _pack, _start_cache, cosine, execute, random_weights
from npusim.graph.ir import Graph
from npusim.hw import load_hw
from npusim.ops.collectives import exchange
from npusim.parallel.plan import Plan, check_plan
from npusim.passes import apply
from npusim.workload import Workload, load_workload

THRESHOLD = 0.999  # cosine to the FP32 reference a sharded step must reach


def _slice(name: str, x: np.ndarray, rank: int, tp: int) -> np.ndarray:
    axis = TP_SPLIT_DIMS.get(re.sub(r"^L\d+\.", "", name))
    if axis is None:
        return x
    n = x.shape[axis] // tp
    return np.take(x, range(rank * n, (rank + 1) * n), axis=axis)


def _rank_weights(shard: Graph, full: dict[str, np.ndarray], rank: int, tp: int) -> dict[str, np.ndarray]:
    out = {}
    for spec in shard.of_kind("weight"):
        parts = shard.derived.get(spec.name, (spec.name,))
        out[spec.name] = np.concatenate([_slice(p, full[p], rank, tp) for p in parts], axis=0)
    return out


def _rank_kv(shard: Graph, full: Graph, seed: int, rank: int, tp: int) -> dict[str, np.ndarray]:
    """The rank's K/V heads of the full cache, in the shard's layout."""
    out = {spec.name: np.zeros(spec.shape, dtype=np.float32) for spec in shard.of_kind("kv")}
    for c in _caches(shard):
        if c.layout.layout == "paged":
            out[c.tensors["block_table"]] = c.layout.block_table()
        phys = {local: out[t] for local, t in c.tensors.items()}
        k, v = (_start_cache(full, name, full.tensors[name].shape, seed) for name in c.names())
        h = k.shape[1] // tp
        k, v = k[:, rank * h:(rank + 1) * h], v[:, rank * h:(rank + 1) * h]
        out |= {c.tensors[local]: x for local, x in _pack(c.layout, phys, k, v).items()}
    return out


def _rank_inputs(full: Graph, full_inputs: dict[str, np.ndarray], shard: Graph, part: int, sp: int) -> dict:
    """Part `part` of `sp` of every prompt: its tokens, RoPE rows, mask rows and local last rows."""
    if sp == 1:
        return {}
    b, ctx = full.batch, full.context
    s = ctx // sp
    rows = slice(part * s, (part + 1) * s)
    out = {"tokens": full_inputs["tokens"].reshape(b, ctx)[:, rows].reshape(-1)}
    for name in ("rope_cos", "rope_sin"):
        out[name] = full_inputs[name].reshape(b, ctx, -1)[:, rows].reshape(b * s, -1)
    heads = shard.tensors["attn_mask"].shape[1]
    out["attn_mask"] = full_inputs["attn_mask"][:, :heads, rows]
    out["last_index"] = (np.arange(b) * s + s - 1).astype(np.int32)  # prompts fill the context: the last row
    return out


@frozen
class ShardedCheck:
    tp: int
    sp: int
    passes: tuple[str, ...]
    cosine: float  # of the logits of the last part of the prompt (sp) to the FP32 reference
    ranks_agree: bool  # the ranks of each tensor-parallel group produced the same logits

    @property
    def passed(self) -> bool:
        return self.ranks_agree and self.cosine >= THRESHOLD

    def line(self) -> str:
        return (f"tp {self.tp} x sp {self.sp}, passes {','.join(self.passes) or 'none'}: logits cosine "
                f"{self.cosine:.6f} to the unsharded FP32 reference (>= {THRESHOLD}), tensor-parallel ranks agree: "
                f"{self.ranks_agree} -> {'ok' if self.passed else 'FAIL'}")


def check_sharded(workload: Workload | str, tp: int = 1, passes: str | Sequence[str] = "optimized",
                  phase: str = "decode", batch: int = 2, context=None, seed: int = 0, devices: int | None = None,
                  sp: int = 1, shard: Graph | None = None, **options) -> ShardedCheck:
    """Every rank of a tp x sp plan (after `passes`) against the unsharded FP32 reference.
    Rank (part, t): part `part` of every prompt (sp), shard `t` of the heads and FFN (tp).
    `shard`: one device's graph already built and transformed (the one a run simulated);
    passes and options are then its own."""
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    hw = load_hw()
    check_plan(Plan(tp, sp, devices), w, hw)
    full = build_decoder(w, phase, batch, context)
    ref = execute(full, "reference", seed)
    weights = random_weights(full, seed)
    full_inputs = host_inputs(full, seed=seed)
    if shard is None:
        shard = apply(build_decoder(w, phase, batch, context, tp=tp, sp=sp), passes, hw=hw, **options)
    if sp > 1 and any(n.op_type == "flash_attention" for n in shard.nodes):
        raise ConfigError("sequence-parallel numerics: the fused causal attention is aligned to the last part of "
                          "the prompt (the rank simulated); check with passes that keep attention unfused, e.g. "
                          "--passes baseline")
    tp_groups = [exchange.Exchange(tp) for _ in range(sp)]
    sp_groups = [exchange.Exchange(sp) for _ in range(tp)]
    results: dict = {}
    errors: list = []

    def rank_run(part: int, t: int) -> None:
        exchange.enter({"all_reduce": (tp_groups[part], t), "all_gather": (sp_groups[t], part)})
        try:
            results[part, t] = execute(shard, "device", seed, weights=_rank_weights(shard, weights, t, tp),
                                       kv=_rank_kv(shard, full, seed, t, tp),
                                       inputs=_rank_inputs(full, full_inputs, shard, part, sp))
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the other ranks are released
            errors.append(e)
            for ex in tp_groups + sp_groups:
                ex.abort()
        finally:
            exchange.leave()

    threads = [threading.Thread(target=rank_run, args=(part, t)) for part in range(sp) for t in range(tp)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if errors:
        raise (real or errors)[0]
    last = [results[sp - 1, t].outputs["logits"] for t in range(tp)]
    agree = all(np.array_equal(last[0], x) for x in last[1:])
    return ShardedCheck(tp, sp, tuple(shard.applied), cosine(last[0], ref.outputs["logits"]), agree)
