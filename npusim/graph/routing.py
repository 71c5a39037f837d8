"""Which experts a timing run's tokens go to: the routing draw of a MoE decoder.

A router's choices depend on the activations, which a timing run does not compute,
yet they set the run's cost: how many rows each expert's GEMMs have and which
experts' weights are read at all. So each MoE layer's choices are drawn, as the
workload says (Workload.routing):

- uniform: every token picks experts_per_token distinct experts, each equally likely;
- zipf: expert popularity follows Zipf's law - the expert of rank r is drawn with
  weight r^-s (s = routing_zipf_exponent), ranks shuffled per layer - and a token
  picks distinct experts by those weights, without replacement (Efraimidis and
  Spirakis: the k largest of u^(1/weight), u uniform in (0, 1), one per expert);
- trace: a recorded routing, a YAML or JSON file holding one entry per MoE layer,
  each a list of per-token lists of expert ids (or a .npy int array [MoE layers,
  tokens, k], for traces longer than a config file may be); a run with more tokens than the
  trace recorded reuses its tokens in order (token t takes row t mod rows).

Expert capacity (Workload.capacity_factor > 0, as GShard and Switch define it): an
expert takes at most ceil(capacity_factor x tokens x experts_per_token / experts)
rows of a layer, `tokens` the tokens routed together (under expert parallelism the
whole group's, as every device's tokens can reach an expert); its rows beyond that
are dropped. Which of an expert's rows are dropped does not change the cost, so only
the counts are capped (tokens_per_expert); the grouped matmuls run over the rows
kept. # assumption: a dropped row is not computed by any expert - its token gets
only the shared experts and the residual (the combine adds nothing for it) - while
the permutation, the dispatch and the combine still move it (they are priced by the
routed rows, tokens x experts_per_token, as without a cap).

Draws are deterministic: layer i's generator is seeded by (routing_seed, i), and
tokens draw in order, so a batch's first tokens route as a smaller batch does.
The numpy checks (npusim.graph.execute) route by the router's own scores instead:
there the draw plays no part.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import attrs
import numpy as np
from attrs import frozen

from npusim.errors import ConfigError
from npusim.hw.parse import input_file, parse_json, parse_yaml, read_text, short
from npusim.workload import Workload


@frozen
class LayerRouting:
    """One MoE layer's routing of `tokens` tokens: expert ids [tokens, k]; `capacity`
    the rows an expert takes at most (None: no cap)."""

    ids: np.ndarray
    experts: int
    capacity: int | None = None

    @property
    def routed_per_expert(self) -> tuple[int, ...]:
        """(token, expert) pairs routed to each expert, by expert id, before any cap."""
        return tuple(int(c) for c in np.bincount(self.ids.reshape(-1), minlength=self.experts))

    @property
    def tokens_per_expert(self) -> tuple[int, ...]:
        """Rows of each expert's GEMMs, by expert id: the pairs routed to it, at most `capacity`."""
        return self._capped(self.routed_per_expert)

    @property
    def dropped_rows(self) -> int:
        """Routed rows over their expert's capacity (0 without a cap)."""
        routed = self.routed_per_expert  # counted once: the rows kept are these, capped
        return sum(routed) - sum(self._capped(routed))

    def _capped(self, routed: tuple[int, ...]) -> tuple[int, ...]:
        """Per-expert counts `routed` at most `capacity` each."""
        return routed if self.capacity is None else tuple(min(c, self.capacity) for c in routed)

    @property
    def busiest_share(self) -> float:
        """The busiest expert's share of the rows computed (those routed, less any dropped;
        1/experts when perfectly even)."""
        counts = self.tokens_per_expert
        return max(counts) / sum(counts)


@frozen
class CardRouting:
    """One MoE layer under expert parallelism: `ep` devices, each with `tokens` tokens and
    experts / ep consecutive experts; the routing of all their tokens (device d's are
    rows d x tokens ..)."""

    routing: LayerRouting
    ep: int

    @property
    def rows_per_card(self) -> tuple[int, ...]:
        """Rows each device's experts receive (from every device's tokens)."""
        counts, per = self.routing.tokens_per_expert, self.routing.experts // self.ep
        return tuple(sum(counts[c * per:(c + 1) * per]) for c in range(self.ep))

    @property
    def busiest_card(self) -> int:
        """The device whose experts receive the most rows (the first of equals)."""
        rows = self.rows_per_card
        return rows.index(max(rows))

    def groups(self, card: int) -> tuple[int, ...]:
        """Rows of each of device `card`'s experts."""
        per = self.routing.experts // self.ep
        return self.routing.tokens_per_expert[card * per:(card + 1) * per]


def card_routing(w: Workload, layer: int, tokens: int, ep: int) -> CardRouting:
    """Layer `layer`'s routing over an expert-parallel group of `ep` devices with `tokens` tokens each."""
    return CardRouting(draw_routing(w, layer, tokens * ep), ep)


def draw_routing(w: Workload, layer: int, tokens: int) -> LayerRouting:
    """Layer `layer`'s routing of `tokens` tokens, as the workload's routing fields say
    (capped at expert_capacity(w, tokens) rows per expert when capacity_factor is set)."""
    return attrs.evolve(_routed(w, layer, tokens), capacity=expert_capacity(w, tokens))


def expert_capacity(w: Workload, tokens: int) -> int | None:
    """Rows an expert takes at most when `tokens` tokens are routed together (None: no cap):
    ceil(capacity_factor x tokens x experts_per_token / experts)."""
    if not w.capacity_factor:
        return None
    return math.ceil(w.capacity_factor * tokens * w.experts_per_token / w.experts)


def _routed(w: Workload, layer: int, tokens: int) -> LayerRouting:
    """draw_routing before the capacity cap."""
    if w.routing != "trace":
        return _drawn(w, layer, tokens)
    p = input_file(w.routing_trace, f"routing_trace {w.routing_trace}")
    if not p.exists():
        raise ConfigError(f"routing_trace: no file {w.routing_trace}")
    stat = p.stat()  # a file rewritten since is read again
    rows = _trace(w.routing_trace, stat.st_mtime_ns, stat.st_size, w.experts, w.experts_per_token)
    if len(rows) != w.moe_layers:
        raise ConfigError(f"{w.routing_trace}: {len(rows)} layers of routing, expected one per MoE layer "
                          f"of {w.name} ({w.moe_layers})")
    trace = rows[layer - w.first_dense_layers]
    return LayerRouting(trace[np.arange(tokens) % len(trace)], w.experts)


@functools.lru_cache(maxsize=1024)  # the builder and the report draw the same layers
def _drawn(w: Workload, layer: int, tokens: int) -> LayerRouting:
    """A uniform or zipf draw (draw_routing)."""
    k, e = w.experts_per_token, w.experts
    rng = np.random.default_rng([w.routing_seed, layer])
    weights = np.ones(e)
    if w.routing == "zipf":  # popularity by rank, the ranks a per-layer shuffle of the experts
        weights = (rng.permutation(e) + 1.0) ** -w.routing_zipf_exponent
    # one key per (token, expert), token by token: a batch's first tokens draw as a smaller batch's
    keys = rng.random((tokens, e)) ** (1.0 / weights)
    ids = np.argsort(-keys, axis=1, kind="stable")[:, :k]
    return LayerRouting(ids.astype(np.int64), e)


@functools.lru_cache(maxsize=16)
def _trace(path: str, mtime_ns: int, nbytes: int, experts: int, k: int) -> tuple[np.ndarray, ...]:
    """A routing trace file's layers, each [tokens, k] expert ids, checked (cached by the
    file's path, modification time and size)."""
    p = Path(path)
    if p.suffix == ".npy":  # a long trace: one int array [moe layers, tokens, k]
        try:
            data = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: not a readable .npy array ({e})") from None
        if data.ndim != 3 or data.dtype.kind not in "iu":
            raise ConfigError(f"{path}: expected an integer array [MoE layers, tokens, {k}], got "
                              f"{data.dtype} {list(data.shape)}")
        data = data.tolist()
    else:
        data = (parse_json if p.suffix == ".json" else parse_yaml)(read_text(p), path)
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path}: expected a list with one entry per MoE layer (each a list of per-token "
                          f"lists of expert ids), got {short(data)}")
    out = []
    for i, layer in enumerate(data):
        if not isinstance(layer, list) or not layer:
            raise ConfigError(f"{path}: layer {i}: expected a non-empty list of per-token lists of {k} expert "
                              f"ids, got {short(layer)}")
        for t, ids in enumerate(layer):
            where = f"{path}: layer {i}, token {t}"
            if not isinstance(ids, list) or len(ids) != k:
                raise ConfigError(f"{where}: expected a list of {k} expert ids (experts_per_token), got {short(ids)}")
            bad = [x for x in ids if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < experts]
            if bad:
                raise ConfigError(f"{where}: expert id {short(bad[0])} out of range, expected 0 .. {experts - 1}")
            if len(set(ids)) != k:
                raise ConfigError(f"{where}: expected {k} distinct expert ids, got {ids}")
        out.append(np.array(layer, dtype=np.int64))
    return tuple(out)


__all__ = ["CardRouting", "LayerRouting", "card_routing", "draw_routing", "expert_capacity"]
