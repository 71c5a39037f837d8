"""Pipeline parallel: the decoder's layers split into `pp` stages on as many devices
(each stage possibly tensor-parallel), the batch into `microbatches` that flow
through the stages one after another.

The engine simulates one stage on one micro-batch (a decoder of layers / pp layers
at batch / microbatches, with the LM head and the embedding: the last stage's work
and the first's gather, so at least the slowest stage) and one hand-over of a
micro-batch's activations to the next stage (a transfer step on the link between
them, over the NIC when they sit in different nodes). The schedule is GPipe's
forward pass: stage s starts micro-batch j at slot j + s, so the step takes
(microbatches + pp - 1) stage slots, of which pp - 1 are the bubble.
# assumption: a stage sends micro-batch j while it computes j + 1 (the hand-over is
# on its own engine and small: tokens x hidden x 2 bytes), so each of the pp - 1
# hand-overs on the critical path adds its time once.
"""

from __future__ import annotations

import attrs
from attrs import frozen

from npusim.engine.host import Synchronize
from npusim.engine.links import LinkTransfer
from npusim.engine.run import RunResult, run
from npusim.errors import ConfigError
from npusim.graph.build import step_lengths
from npusim.hw import HwConfig, load_hw
from npusim.runtime.decoder import run_decoder, step
from npusim.runtime.memory import OutOfMemoryError, place
from npusim.runtime.run import GraphRun
from npusim.workload import Workload, load_workload


@frozen
class PipelineRun:
    stage: GraphRun  # one stage, one micro-batch
    handovers: tuple[RunResult, ...]  # one micro-batch's activations from stage s to s + 1, for each s
    pp: int
    microbatches: int
    tp: int

    @property
    def hw(self) -> HwConfig:
        return self.stage.hw

    @property
    def stage_us(self) -> float:
        return self.stage.latency_us

    @property
    def handover_us(self) -> float:
        """The pp - 1 hand-overs on the critical path, together: each transfer step's time on
        the device (its launch is on the host, overlapped like a kernel's)."""
        return sum(self.hw.us(h.kernels[0].cycles) for h in self.handovers)

    @property
    def latency_us(self) -> float:
        return (self.microbatches + self.pp - 1) * self.stage_us + self.handover_us

    @property
    def bubble_fraction(self) -> float:
        """Share of each device's time idle in the pipeline's fill and drain."""
        return (self.pp - 1) / (self.microbatches + self.pp - 1)

    @property
    def tokens(self) -> int:
        return self.stage.tokens * self.microbatches

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.latency_us * 1e-6)

    def summary(self) -> str:
        g = self.stage.graph
        return "\n".join([
            f"{g.workload.name} {g.phase}: pipeline of {self.pp} stages x tp {self.tp} = {self.pp * self.tp} devices, "
            f"{self.microbatches} micro-batches of {g.batch}",
            f"  latency        {self.latency_us:,.1f} us, {self.tokens_per_s:,.1f} tokens/s",
            f"  one stage      {self.stage_us:,.1f} us per micro-batch ({self.layers} layers); "
            f"hand-overs {self.handover_us:,.1f} us in all",
            f"  bubble         {100 * self.bubble_fraction:.1f}% of each device's time "
            f"(pp - 1 = {self.pp - 1} of {self.microbatches + self.pp - 1} slots)",
        ])

    @property
    def layers(self) -> int:
        return self.stage.graph.workload.layers


def run_pipeline(workload: Workload | str, hw: HwConfig | str = "ascend910b2", phase: str = "decode",
                 batch: int = 1, context=None, passes="optimized", *, pp: int = 2, microbatches: int = 1,
                 tp: int = 1, overrides=None, memo: bool = True, **options) -> PipelineRun:
    """One step of `workload` pipelined over `pp` stages (see the module doc)."""
    w = workload if isinstance(workload, Workload) else load_workload(workload)
    hw = load_hw(hw, overrides)
    for key, value in (("--pp", pp), ("--microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}: expected a positive integer, got {value!r}")
    if w.layers % pp:
        raise ConfigError(f"--pp {pp} does not divide {w.name}'s layers {w.layers}")
    if batch % microbatches:
        raise ConfigError(f"--microbatches {microbatches} does not divide the batch {batch}")
    topo = hw.topology
    if pp * tp > topo.max_devices:
        raise ConfigError(f"{pp * tp} devices (--pp {pp} x --tp {tp}), but {hw.name}'s topology has "
                          f"{topo.size_text()}")
    stage_w = attrs.evolve(w, name=f"{w.name}/stage", layers=w.layers // pp)
    # memory at the full batch: every micro-batch's KV cache stays on its stage
    full = step(stage_w, phase, batch, context, passes, **options)
    full = attrs.evolve(full, tp=tp)
    breakdown = place(full.graph(hw=hw), hw.hbm.hbm_bytes).breakdown
    if not breakdown.fits:
        raise OutOfMemoryError(f"{w.name} {phase} batch {batch}, one of {pp} stages (tp {tp}) does not fit in "
                               f"{hw.name}'s memory: {breakdown.line()}", breakdown)
    mb = batch // microbatches
    lengths = step_lengths(w, phase, batch, context)[:mb]
    stage = run_decoder(stage_w, hw, phase, mb, lengths, passes, memo=memo, tp=tp, **options)
    g = stage.graph
    nbytes = g.batch * (1 if phase == "decode" else g.context) * w.hidden_size * w.dtype_bytes
    n = topo.node_device_count
    hands = {}
    for s in range(1, pp):  # stage s - 1 -> s: over the NIC when its last card and s's first are in two nodes
        inter = (s * tp - 1) // n != (s * tp) // n
        if inter not in hands:
            hands[inter] = run([LinkTransfer("handover", "send_recv", nbytes, (1,), 2, inter, 0, "graph"),
                                Synchronize()], hw)
    order = [(s * tp - 1) // n != (s * tp) // n for s in range(1, pp)]
    return PipelineRun(stage, tuple(hands[x] for x in order), pp, microbatches, tp)
