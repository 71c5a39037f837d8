"""What the serving loop, the schedulers and the reports share: a request's progress
(`Seq`), one iteration's work (`Work`) and a finished run's records (`StepRecord`,
`ReplicaRecord`, `ServingRun`).

`Seq` is the one mutable record of the serving package: the simulation loop
advances it step by step. A sequence's KV cache holds `prefilled` tokens; the
prefill of its `goal` tokens (the prompt, plus the tokens generated
before a preemption, which are recomputed) ends with its next token; each
decode step adds one token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import define, field, frozen

from npusim.serving.arrivals import Request

if TYPE_CHECKING:
    from npusim.serving.service import ServiceConfig
    from npusim.serving.stepcost import StepCost

STATUSES = ("ok", "rejected", "timeout", "oom")  # oom: its batch did not fit in the device memory


@define(slots=True, eq=False)
class Seq:
    req: Request
    ready_us: float = 0.0  # tokenized: from now on the scheduler sees it
    prefilled: int = 0  # tokens its current prefill has put in the KV cache
    goal: int = 0  # tokens its current prefill must process (set when it is admitted)
    decoding: bool = False  # its prefill is done: each step adds one token
    generated: int = 0  # output tokens so far
    started_us: float | None = None  # start of its first step
    token_us: list[float] = field(factory=list)  # when each output token reached the client
    done_us: float | None = None
    status: str | None = None  # None while in flight, else one of STATUSES
    preemptions: int = 0
    blocks: int = 0  # KV blocks held (paged schedulers)
    replica: int | None = None  # the replica the router sent it to (None: rejected at the door)
    # prefill/decode disaggregation (disagg.py): its prompt's KV cache came from a prefill
    # instance on node `kv_node`, taking kv_transfer_us over the links; kv_ready until a
    # decode instance admits it (then it decodes at once: no prefill)
    kv_node: int | None = None
    kv_transfer_us: float | None = None
    kv_ready: bool = False

    @property
    def arrival_us(self) -> float:
        return self.req.arrival_s * 1e6

    @property
    def prompt(self) -> int:
        return self.req.prompt_tokens

    @property
    def output(self) -> int:
        return self.req.output_tokens

    def admit(self) -> None:
        """(Re)start its prefill: the prompt, and after a preemption the tokens it had
        generated (recomputed; the prefill ends with its next token). A sequence whose
        KV cache came with it (kv_ready) holds its prompt and first token already: it
        decodes from its next step."""
        if self.kv_ready:
            self.prefilled = self.goal = self.prompt + self.generated
            self.decoding, self.kv_ready = True, False
            return
        self.prefilled, self.goal, self.decoding = 0, self.prompt + self.generated, False

    @property
    def context(self) -> int:
        """Context of its next decode step, the new token included."""
        return self.prompt + self.generated

    @property
    def max_tokens(self) -> int:
        """KV tokens it holds at its last step."""
        return self.prompt + self.output - 1

    def finish(self, status: str, at_us: float) -> None:
        self.status, self.done_us = status, at_us


@frozen
class Work:
    """One iteration: prefill chunks (sequence, tokens this step puts in its cache)
    and decodes (sequences getting one token), with the shapes the step is priced
    and compiled at. The decoder graph pads a batch to its longest sequence, so a
    prefill part is (its sequences, its longest chunk) and a decode part (its
    batch, its longest context); a request-level batch keeps its formed size after
    some of its sequences have finished (`pad_batch`)."""

    prefill: tuple[tuple[Seq, int], ...] = ()
    decode: tuple[Seq, ...] = ()
    prefill_batch: int = 0
    prefill_tokens: int = 0
    decode_batch: int = 0
    decode_context: int = 0
    prefill_context: int = 0  # the longest prefill's context after the step (its earlier chunks included)
    continued: bool = False  # a prefill chunk continues its prompt (earlier chunks are in the cache)

    @classmethod
    def of(cls, prefill=(), decode=(), pad_batch: int | None = None, pad_context: int | None = None) -> Work:
        prefill, decode = tuple(prefill), tuple(decode)
        return cls(prefill, decode, len(prefill), max((n for _, n in prefill), default=0),
                   (pad_batch or len(decode)) if decode else 0,
                   max([s.context for s in decode] + [pad_context or 0]) if decode else 0,
                   max((s.prefilled + n for s, n in prefill), default=0), any(s.prefilled for s, _ in prefill))

    @property
    def mixed(self) -> bool:
        """A chunked-prefill iteration: prefill chunks beside decodes, or a chunk that
        continues a prompt (its attention reads the earlier chunks' cache). One step of
        the decoder's mixed graph (graph.build)."""
        return bool(self.prefill) and (bool(self.decode) or self.continued)

    @property
    def context(self) -> int:
        """The longest sequence's context after the step."""
        return max(self.decode_context, self.prefill_context)

    @property
    def seqs(self) -> list[Seq]:
        return [s for s, _ in self.prefill] + list(self.decode)


@frozen
class StepRecord:
    start_us: float
    end_us: float
    device_us: float
    compile_us: float
    decode_batch: int
    prefill_tokens: int
    kv_tokens: int  # KV-cache tokens held (reserved) during the step
    replica: int = 0  # the replica that ran it


@frozen
class ReplicaRecord:
    """One replica of a finished run: its cards, what the router gave it and how busy it was."""

    index: int
    first_card: int  # its cards are first_card .. first_card + tp - 1
    tp: int
    requests: int  # requests routed to it
    prompt_tokens: int  # their prompts' tokens
    output_tokens: int  # tokens it generated (preempted and recomputed ones once)
    completed: int
    busy_us: float  # time its loop spent in steps: framework overhead, compiling and the step itself
    steps: int
    kv_capacity_tokens: int
    role: str = ""  # under disaggregation: "prefill" or "decode" instance ("": prefill and decode colocated)


@frozen
class ServingRun:
    """A finished simulation: every request's record and every step's (of every
    replica, in order of start). `kv_capacity_tokens` is one replica's KV pool."""

    service: ServiceConfig
    cost: StepCost
    seqs: tuple[Seq, ...]
    steps: tuple[StepRecord, ...]
    kv_capacity_tokens: int
    preemptions: int
    blocking_sync: bool
    replicas: tuple[ReplicaRecord, ...] = ()
    router: str = "round-robin"
    pd: tuple[int, int] | None = None  # disaggregated: (prefill cards, decode cards)

    @property
    def cards(self) -> int:
        return sum(r.tp for r in self.replicas) or 1

    @property
    def tp(self) -> int:
        return self.replicas[0].tp if self.replicas else 1


__all__ = ["ReplicaRecord", "STATUSES", "Seq", "ServingRun", "StepRecord", "Work"]
