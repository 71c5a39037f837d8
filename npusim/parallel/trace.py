"""The Chrome trace of a step under a parallel plan: one process group per device.

The engine simulates one device (Plan.simulated_device); its peers are assumed to
run the same program in step with it (engine.links.SymmetricFabric), so their
timeline is its timeline. The trace says so rather than invent differences: each
device d gets the processes of the one-device trace (report.trace: host, streams,
kernels, cores, bandwidth, memory), named "device d (simulated): ..." or "device d
(symmetric copy of device s): ...", with the same events, plus a "collectives"
process: a span per collective (thread = its stream) with its transfer steps and
reduction or copy kernels nested inside, and a flow arrow from each transfer step to
the same step on every device it sends to. A step's args name the devices it sends
to and receives from. Sorted by device, then as the one-device trace.

With one device the trace is report.trace.chrome_trace's, unchanged.
"""

from __future__ import annotations

from npusim.isa.program import DTYPE_BYTES
from npusim.ops.collectives import KINDS, Send, collective_steps
from npusim.parallel.plan import Plan, graph_plan
from npusim.report.trace import chrome_trace
from npusim.runtime.run import GraphRun

FLOW_CAT = "collective"  # category of the arrows between devices


def run_trace(run: GraphRun, memory: list[tuple[float, float]] | None = None) -> dict:
    """The trace of a decoder step: one device's, or under a plan of several devices
    one process group per device (see the module doc)."""
    trace = chrome_trace(run.result, memory)
    plan = graph_plan(run.graph)
    if plan.world == 1:
        return trace
    return devices_trace(run, plan, trace["traceEvents"])


def _label(plan: Plan, device: int) -> str:
    sim = plan.simulated_device
    return f"device {device} (simulated)" if device == sim else f"device {device} (symmetric copy of device {sim})"


def devices_trace(run: GraphRun, plan: Plan, one: list[dict]) -> dict:
    """The trace of `plan.world` devices from the simulated device's events `one`."""
    stride = max(e["pid"] for e in one) + 1  # the pids of one device, its collectives process last
    flows = max((e["id"] for e in one if e["ph"] in ("s", "f")), default=0) + 1
    spans = _collective_spans(run)
    events: list[dict] = []
    for d in range(plan.world):
        base = d * stride
        for e in one:
            e = dict(e, pid=base + e["pid"])
            if e["name"] == "process_name":
                e["args"] = {"name": f"{_label(plan, d)}: {e['args']['name']}"}
            elif e["name"] == "process_sort_index":
                e["args"] = {"sort_index": base + e["args"]["sort_index"]}
            elif e["ph"] in ("s", "f"):
                e["id"] = d * flows + e["id"]
            events.append(e)
        events += _collectives_process(run, plan, d, base + stride, spans)
    events += _exchange_flows(run, plan, spans, stride, plan.world * flows)
    sim = plan.simulated_device
    note = (f"one device simulated (device {sim}); the others are assumed to run its program in step "
            f"(symmetric ranks), so their processes repeat its timeline")
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"devices": {"tp": plan.tp, "sp": plan.sp, "world": plan.world, "simulated": sim,
                                      "assumption": note}}}


def _collective_spans(run: GraphRun) -> list[tuple]:
    """(node, its records in launch order, the node's steps) of every collective that ran."""
    by_node: dict[str, list] = {}
    for r in run.result.kernels:
        if r.op_type in KINDS and r.owner is not None:
            by_node.setdefault(r.owner.node, []).append(r)
    out = []
    for name, recs in by_node.items():
        node = run.node(recs[0])
        algo, steps = collective_steps(node.op_type, node.args, run.hw)
        out.append((node, algo, steps, sorted(recs, key=lambda r: r.start)))
    return out


def _send_of(steps: tuple, rec) -> Send | None:
    """The Send a record ran, or None for a reduction or copy kernel: transfer steps are
    numbered after the node's kernels (runtime.compile.host_program)."""
    sends = [s for s in steps if isinstance(s, Send)]
    i = rec.owner.index - (len(steps) - len(sends))
    return sends[i] if i >= 0 else None


def _collectives_process(run: GraphRun, plan: Plan, device: int, pid: int, spans: list[tuple]) -> list[dict]:
    us = run.hw.us
    events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
               "args": {"name": f"{_label(plan, device)}: collectives"}},
              {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for node, algo, steps, recs in spans:
        group = plan.group(node.op_type, device)
        rank = group.index(device)
        start, end = recs[0].start, max(r.end for r in recs)
        events.append({"name": node.name, "cat": "collective", "ph": "X", "ts": us(start), "dur": us(end - start),
                       "pid": pid, "tid": recs[0].stream,
                       "args": {"type": node.op_type, "algo": algo, "bytes": node.args.elements * DTYPE_BYTES[node.args.dtype],
                                "group": list(group), "rank": rank}})
        for r in recs:
            send = _send_of(steps, r)
            args = {"type": r.op_type, "core_type": r.core_type}
            if send is not None:
                p = len(group)
                args |= {"bytes_per_peer": send.nbytes, "sends_to": [group[(rank + o) % p] for o in send.peers],
                         "receives_from": [group[(rank - o) % p] for o in send.peers]}
            events.append({"name": r.name, "cat": "transfer" if send else "collective kernel", "ph": "X",
                           "ts": us(r.start), "dur": us(r.cycles), "pid": pid, "tid": r.stream, "args": args})
    return events


def _exchange_flows(run: GraphRun, plan: Plan, spans: list[tuple], stride: int, first_id: int) -> list[dict]:
    """An arrow from each transfer step to the same step on each device it sends to (at the
    step's middle: the copies run it at the same time)."""
    us = run.hw.us
    out: list[dict] = []
    for node, _, steps, recs in spans:
        for r in recs:
            send = _send_of(steps, r)
            if send is None:
                continue
            ts = us((r.start + r.end) / 2)
            for d in range(plan.world):
                group = plan.group(node.op_type, d)
                rank, p = group.index(d), len(group)
                for o in send.peers:
                    fid = first_id + len(out) // 2
                    dst = group[(rank + o) % p]
                    out += [{"name": node.op_type, "cat": FLOW_CAT, "ph": "s", "id": fid, "ts": ts,
                             "pid": (d + 1) * stride, "tid": r.stream},
                            {"name": node.op_type, "cat": FLOW_CAT, "ph": "f", "bp": "e", "id": fid, "ts": ts,
                             "pid": (dst + 1) * stride, "tid": r.stream}]
    return out
