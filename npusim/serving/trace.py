"""A serving run as a Chrome trace (Perfetto, chrome://tracing): one span per
step on the device track (batch, prefill tokens, compile time in its args; on a
cluster a thread per replica, and its own counters), one span per request from
arrival to its last token on the request lanes (a request takes the first lane
free at its arrival, so spans on a lane never overlap), and counters of the
decode batch and the KV cache in use. Times are µs."""

from __future__ import annotations

import heapq
import json

from npusim.outputs import write_text
from npusim.serving.simulate import ServingRun


def chrome_trace(run: ServingRun) -> dict:
    meta = [{"name": "process_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": n}}
            for p, n in ((1, "device steps"), (2, "requests"))]
    if run.cards > 1:  # a cluster: a thread of steps per replica (disaggregated: its role first)
        meta += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": r.index,
                  "args": {"name": (f"{r.role} " if r.role else "") + (
                      f"replica {r.index} (cards {r.first_card}-{r.first_card + r.tp - 1})" if r.tp > 1
                      else f"replica {r.index} (card {r.first_card})")}} for r in run.replicas]
    events = []
    for st in run.steps:
        events.append({"name": "step", "cat": "step", "ph": "X", "ts": st.start_us, "dur": st.end_us - st.start_us,
                       "pid": 1, "tid": st.replica, "args": {"decode_batch": st.decode_batch,
                                                              "prefill_tokens": st.prefill_tokens,
                                                              "device_us": st.device_us,
                                                              "compile_us": st.compile_us}})
        counter = "" if run.cards == 1 else f" {st.replica}"  # a counter track per replica
        events.append({"name": "batch" + counter, "ph": "C", "ts": st.start_us, "pid": 1, "tid": 0,
                       "args": {"decode_batch": st.decode_batch}})
        events.append({"name": "kv_cache" + counter, "ph": "C", "ts": st.start_us, "pid": 1, "tid": 0,
                       "args": {"tokens": st.kv_tokens}})
    lanes: list[tuple[float, int]] = []  # (free from, lane)
    count = 0
    for s in sorted(run.seqs, key=lambda s: (s.arrival_us, s.req.id)):
        end = s.done_us if s.done_us is not None else s.arrival_us
        if lanes and lanes[0][0] <= s.arrival_us:
            _, lane = heapq.heappop(lanes)
        else:
            lane, count = count, count + 1
        heapq.heappush(lanes, (end, lane))
        first = s.token_us[0] - s.arrival_us if s.token_us else None
        events.append({"name": f"request {s.req.id}", "cat": s.status or "in flight", "ph": "X",
                       "ts": s.arrival_us, "dur": end - s.arrival_us, "pid": 2, "tid": lane,
                       "args": {"prompt_tokens": s.prompt, "output_tokens": s.output, "status": s.status,
                                "ttft_us": first, "preemptions": s.preemptions}})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_trace(run: ServingRun, path) -> None:
    write_text(path, json.dumps(chrome_trace(run)))


__all__ = ["chrome_trace", "write_trace"]
