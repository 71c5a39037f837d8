"""Several devices: parallel plans that shard the decoder (tensor parallel), what a
step's communication costs and hides, sharded numerics and the every-rank check.
Collectives themselves are ops (npusim.ops.collectives); the topology is part of
the hardware config (HwConfig.topology)."""

from npusim.parallel.plan import Plan, check_plan, device_kv_bytes, device_weight_bytes, devices_to_fit

__all__ = ["Plan", "check_plan", "device_kv_bytes", "device_weight_bytes", "devices_to_fit"]
