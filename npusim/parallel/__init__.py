"""Several devices: parallel plans that shard the decoder (tensor parallel), what a
step's communication costs and hides, sharded numerics and the every-rank check.
Collectives themselves are ops (npusim.ops.collectives); the topology is part of
the hardware config (HwConfig.topology).

Modules: plan (Plan, check_plan, per-device bytes), flags (the command-line
flags), breakdown, numerics, ranks, pipeline. Nothing is imported here, so the
command line reads its flags without loading the graph builder."""
