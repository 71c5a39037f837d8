"""Sharded numerics: run every rank's shard of a tensor-parallel step with numpy, the
collectives summing across ranks, and compare with the unsharded FP32 reference.

Each rank gets the slices of the full model's weights and KV cache it holds (rows
of Q, K, V, gate and up; columns of O and down; its K/V heads of the cache), so the
ranks together compute what one device computes. The ranks run in threads that
meet at each collective (ops.collectives.exchange).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import numpy as np
from attrs import frozen

from npusim.graph.build import build_decoder
from npusim.graph.execute import _caches, _pack, _start_cache, cosine, execute, random_weights
from npusim.graph.ir import Graph
from npusim.hw import load_hw
from npusim.ops.collectives import exchange
from npusim.parallel.plan import Plan, check_plan
from npusim.passes import apply
from npusim.workload import Workload, load_workload

ROWS = ("wq", "wk", "wv", "bq", "bk", "bv", "w_gate", "w_up")  # split by output rows
COLUMNS = ("wo", "w_down")  # split by input columns
THRESHOLD = 0.999  # cosine to the FP32 reference a sharded step must reach


def _slice(name: str, x: np.ndarray, rank: int, tp: int) -> np.ndarray:
    key = re.sub(r"^L\d+\.", "", name)
    if key in ROWS:
        n = x.shape[0] // tp
        return x[rank * n:(rank + 1) * n]
    if key in COLUMNS:
        n = x.shape[1] // tp
        return x[:, rank * n:(rank + 1) * n]
    return x


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


@frozen
class ShardedCheck:
    tp: int
    passes: tuple[str, ...]
    cosine: float  # of the logits (rank 0's; every rank's are the same) to the FP32 reference
    ranks_agree: bool  # every rank produced the same logits

    @property
    def passed(self) -> bool:
        return self.ranks_agree and self.cosine >= THRESHOLD

    def line(self) -> str:
        return (f"tp {self.tp}, passes {','.join(self.passes) or 'none'}: logits cosine {self.cosine:.6f} to the "
                f"unsharded FP32 reference (>= {THRESHOLD}), ranks agree: {self.ranks_agree} -> "
                f"{'ok' if self.passed else 'FAIL'}")


def check_sharded(workload: Workload | str, tp: int, passes: str | Sequence[str] = "optimized",
                  phase: str = "decode", batch: int = 2, context=None, seed: int = 0, devices: int | None = None,
                  **options) -> ShardedCheck:
    """Every rank of a `tp`-way shard (after `passes`) against the unsharded FP32 reference."""
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    hw = load_hw()
    check_plan(Plan(tp, devices), w, hw)
    full = build_decoder(w, phase, batch, context)
    ref = execute(full, "reference", seed)
    weights = random_weights(full, seed)
    shard = apply(build_decoder(w, phase, batch, context, tp=tp), passes, hw=hw, **options)
    ex = exchange.Exchange(tp)
    results: list = [None] * tp
    errors: list = []

    def rank_run(r: int) -> None:
        exchange.enter(ex, r)
        try:
            results[r] = execute(shard, "device", seed, weights=_rank_weights(shard, weights, r, tp),
                                 kv=_rank_kv(shard, full, seed, r, tp))
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the other ranks are released
            errors.append(e)
            ex.abort()
        finally:
            exchange.leave()

    threads = [threading.Thread(target=rank_run, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if errors:
        raise (real or errors)[0]
    logits = [r.outputs["logits"] for r in results]
    agree = all(np.array_equal(logits[0], x) for x in logits[1:])
    return ShardedCheck(tp, tuple(shard.applied), cosine(logits[0], ref.outputs["logits"]), agree)
