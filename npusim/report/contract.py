"""The JSON report of DESIGN.md's contract, for a run or for one operator."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from npusim.engine import RunResult
from npusim.engine.device import KernelRecord
from npusim.hw import HwConfig
from npusim.ops.roofline import OpReport, bound_of, link_utilisation
from npusim.report.tables import STALLS, stalls


def _kernel_entry(k: KernelRecord, hw: HwConfig) -> dict:
    return {
        "name": k.name,
        "type": k.op_type,
        "core_type": k.core_type,
        "block_dim": k.block_dim,
        "stream": k.stream,
        "start_us": hw.us(k.start),
        "duration_us": hw.us(k.cycles),
        "flops": k.stats.flops,
        "gm_bytes": k.stats.gm_bytes,
        "hbm_read_bytes": k.stats.hbm_read_bytes,
        "hbm_write_bytes": k.stats.hbm_write_bytes,
        "bound": bound_of(k.stats, hw, k.cycles),
        "start_cost_us": hw.us(k.start - k.queued),
        "pipe_busy": {p: k.stats.utilisation(p) for p in k.stats.busy_cycles},
        "stalls_percent": {st.pipe: {w: getattr(st, w) for w in STALLS} for st in stalls(k.stats)},
    } | ({"fast_forwarded_waves": k.skipped} if getattr(k, "skipped", 0) else {})  # engine.fastforward
    # (getattr: a record pickled before KernelRecord had `skipped`, from the disk cache)


def run_json(result: RunResult, peak_memory_bytes: float, tokens: int = 0, extra: dict | None = None) -> dict:
    hw = result.hw
    s = result.stats
    by_type: dict = defaultdict(lambda: {"count": 0, "total_us": 0.0})
    for k in result.kernels:
        by_type[k.op_type]["count"] += 1
        by_type[k.op_type]["total_us"] += hw.us(k.cycles)
    busy = sum(v["total_us"] for v in by_type.values()) or 1.0
    for v in by_type.values():
        v["ratio"] = v["total_us"] / busy
    out = {
        "hw": hw.name,
        "latency_us": result.us,
        "tokens_per_s": tokens / (result.us * 1e-6) if tokens and result.cycles else 0.0,
        "hbm_read_bytes": s.hbm_read_bytes,
        "hbm_write_bytes": s.hbm_write_bytes,
        "l2_hit_rate": s.l2_hit_rate,
        "peak_memory_bytes": peak_memory_bytes,
        "kernel_count": len(result.kernels),
        # kernels priced from a few of their waves (engine.fastforward, with --fast-forward)
        "fast_forwarded_kernels": len(result.fast_forwarded),
        # transfers after which identical blocks that came apart were kept as one (--fast-forward)
        "kept_together_transfers": result.kept_together,
        "host_launch_us": hw.us(result.host_launch_cycles),
        "host_wait_us": hw.us(result.host_wait_cycles),
        "ops": [_kernel_entry(k, hw) for k in result.kernels],
        "by_type": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["total_us"])),
    }
    out.update(extra or {})
    return out


def op_json(report: OpReport) -> dict:
    """The run contract for one operator, plus its roofline and tiling. latency_us is
    the op time the text prints (kernel start costs + kernel times + any wait for
    the host's launch, see OpReport); run_us the whole run, host launch and final
    synchronize included."""
    low = report.lowered
    memory = sum(t.nbytes for t in (*low.inputs, *low.outputs)) + low.workspace_bytes
    r, hw = report.roofline, report.hw
    return run_json(report.run, memory, extra={
        "op_type": low.op_type,
        "params": vars_of(low.params),
        "tiling": vars_of(low.tiling) if low.tiling is not None else None,
        "latency_us": report.us,
        "op_cycles": report.cycles,
        "kernel_start_us": hw.us(report.start_cycles),
        "kernel_us": hw.us(report.kernel_cycles),
        "host_gap_us": hw.us(report.host_gap_cycles),
        "run_us": report.run.us,
        "flops": low.flops,
        "tflops": report.tflops,
        "min_gm_bytes": low.min_gm_bytes,
        "gm_bw_bytes_per_s": report.gm_bw_bytes_per_s,
        "hbm_bw_bytes_per_s": report.hbm_bw_bytes_per_s,
        "bound": report.bound,
        "pipe_busy": report.utilisation(),
        "links_used": link_utilisation(report.stats, hw, report.cycles),
        "roofline_us": {"compute": r.compute_s * 1e6, "hbm": r.hbm_s * 1e6, "l2": r.l2_s * 1e6},
    })


def set_note(overrides: Mapping[str, Any] | None) -> str:
    """' (--set a.b=1 --set c=2)' after a config's name in a header; '' without overrides."""
    if not overrides:
        return ""
    return " (" + " ".join(f"--set {k}={v}" for k, v in overrides.items()) + ")"


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of a config's canonical JSON (keys sorted, no spaces): equal configs, equal hashes."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def provenance(argv: Sequence[str], hw: HwConfig, overrides: Mapping[str, Any] | None = None,
               workload: str | None = None, workload_path: str | None = None) -> dict:
    """What produced an output, for its JSON and its trace's metadata: the command as
    typed, the npusim version, the hardware config in effect (overrides applied) with
    its hash, the overrides as given and the workload (name or path as given, and the
    file it resolved to)."""
    from npusim import __version__

    import attrs

    config = attrs.asdict(hw)
    out = {"command": list(argv), "npusim_version": __version__, "hw": hw.name,
           "overrides": dict(overrides or {}), "hw_config": config, "hw_config_sha256": config_hash(config)}
    if workload is not None:
        out["workload"] = {"name": workload, "path": workload_path}
    return out


def vars_of(record) -> dict:
    import attrs

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs.asdict(record).items()}
