"""npusim serve against the one public serving table on a 910B: Yi-1.5-6B under MindIE
(npusim/data/measured/facts.md item 11; trust C: variant and method not stated).

    python benchmarks/serving_table.py [--service vllm-continuous] [--service-set KEY=VALUE ...]

Each row of the table is a batch of requests that arrive together: a prefill row B
prompts of 1,000 tokens with one output token (tokens/s: the prompts' tokens over
the time to the last first token), a decode row B prompts of one token with 100
output tokens each (tokens/s: the output tokens over the time to the last one). The
service's scheduler takes the whole batch (its max_batch set to B). Each row also
prints where npusim's time went: its prefill steps (seconds), its mean decode step
(ms), and, for a decode row, MindIE's time a step less npusim's. Step prices come
from the engine (cached on disk: the first run takes minutes).
"""

from __future__ import annotations

import argparse

from npusim.diskcache import open_store
from npusim.hw.load import parse_set_args
from npusim.serving import StepCost, simulate
from npusim.serving.arrivals import Request
from npusim.serving.service import load_service

WORKLOAD = "yi-1.5-6b"
PROMPT, DECODE_TOKENS = 1000, 100  # the table's prefill prompt and decode output lengths
# (phase, batch, MindIE tokens/s, lmdeploy tokens/s): facts.md item 11
TABLE = (("prefill", 1, 11458, 1238), ("prefill", 10, 18956, 1693), ("prefill", 50, 20061, 1837),
         ("decode", 1, 68, 15), ("decode", 10, 643, 131), ("decode", 100, 4435, 454), ("decode", 200, 4442, 441))


def row(phase: str, batch: int, service, cost: StepCost) -> tuple[float, float, float]:
    """npusim's tokens/s for one row (the batch arrives at t = 0), the seconds its
    prefill steps took and the mean time of its decode steps in ms (nan if none)."""
    prompt, output = (PROMPT, 1) if phase == "prefill" else (1, DECODE_TOKENS)
    run = simulate([Request(i, 0.0, prompt, output) for i in range(batch)], service, cost)
    bad = [s.status for s in run.seqs if s.status != "ok"]
    if bad:
        raise SystemExit(f"serving_table: {phase} batch {batch}: {len(bad)} requests ended '{bad[0]}'")
    prefill_s = sum(st.end_us - st.start_us for st in run.steps if st.prefill_tokens) / 1e6
    decode_ms = [(st.end_us - st.start_us) / 1e3 for st in run.steps if st.decode_batch and not st.prefill_tokens]
    step_ms = sum(decode_ms) / len(decode_ms) if decode_ms else float("nan")
    if phase == "prefill":
        return batch * prompt / (max(s.token_us[0] for s in run.seqs) / 1e6), prefill_s, step_ms
    return batch * output / (max(s.done_us for s in run.seqs) / 1e6), prefill_s, step_ms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--service", default="vllm-continuous")
    p.add_argument("--service-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a service field, e.g. host.step_overhead_us=6000")
    p.add_argument("--max-batch", type=int, default=100,
                   help="rows of a larger batch are listed, not run: the service pads 200 one-token prompts to "
                   "its smallest prompt bucket, and that prefill's simulation needs more than 24 GiB")
    a = p.parse_args(argv)
    service = load_service(a.service, parse_set_args(a.service_set))
    print(f"{WORKLOAD} on ascend910b2, service {service.name} (max_batch: each row's batch; host: step overhead "
          f"{service.host.step_overhead_us:g} us, {service.host.postprocess_us_per_token:g} us per output token, "
          f"tokenize {service.host.tokenize_us:g} us)")
    print(f"{'run':<8} {'batch':>5} {'MindIE':>8} {'npusim':>9} {'error':>7} {'lmdeploy':>9}   (tokens/s)   "
          "npusim: prefill steps, decode step, MindIE's time a step less npusim's")
    errors = []
    store = open_store()
    for phase, batch, mindie, lmdeploy in TABLE:
        if batch > a.max_batch:
            print(f"{phase:<8} {batch:>5} {mindie:>8,} {'-':>9} {'':>7} {lmdeploy:>9,}   not run (--max-batch "
                  f"{a.max_batch})")
            continue
        # the row's batch is the scheduler's largest: the step-cost grid prices no larger step
        row_service = load_service(a.service, {"scheduler.max_batch": batch} | parse_set_args(a.service_set))
        cost = StepCost(WORKLOAD, "ascend910b2", service.passes, service.pass_options(), max_batch=batch, store=store)
        ours, prefill_s, step_ms = row(phase, batch, row_service, cost)
        errors.append(ours / mindie - 1)
        where = f"prefill {prefill_s:.3f} s"
        if phase == "decode":  # each step adds a token to every sequence
            where += f", decode {step_ms:.1f} ms, gap {1e3 * batch * (1 / mindie - 1 / ours):+.1f} ms"
        print(f"{phase:<8} {batch:>5} {mindie:>8,} {ours:>9,.0f} {100 * errors[-1]:>+6.0f}% {lmdeploy:>9,}   {where}",
              flush=True)
    worst = max(errors, key=abs)
    print(f"npusim against MindIE: median |error| {100 * sorted(map(abs, errors))[len(errors) // 2]:.0f}%, "
          f"largest {100 * worst:+.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
