"""Fast-forward (npusim.engine.fastforward) against the full simulation: error and speed-up.

    python benchmarks/bench_fastforward.py [--quick] [--skip-big] [--big-exact] [--only TEXT]

A corpus of kernels and steps of K3 and qwen2.5-7b - the prefill GEMMs and vector
kernels of 16 to 32 prompts of 4096 tokens (as `npusim op` runs them: a whole step of
that size takes minutes to simulate exactly), whole decode, prefill and mixed steps -
each priced exactly (exact=True, the default) and fast (exact=False, as --fast-forward:
kernels fast-forwarded, and a group of identical blocks that comes apart kept as one
instead of the step simulated again). Prints per case both latencies, |ff/exact - 1|,
the HBM read error, the kernels fast-forwarded, the transfers after which a group was
kept as one, and the two wall times; then the median and max latency error over the
cases that were approximated (target: median <= 0.2%, max <= 1%) and over all, and the
speed-up.
Then the time to price a K3 prefill step of 32 x 4096 tokens (target <= 10 s; priced
first, in a process that has priced nothing else, as a command would): on one
910B2 that step needs 75 GiB of weights and KV cache, so it is priced as serving prices
it on 2 cards (--tp 2: one card's shard), on HBM of unbounded capacity (as the
step-cost model prices points).
--big-exact also prices it exactly (minutes). --quick: a third of the corpus. --only
TEXT: the cases whose label contains TEXT.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from npusim.errors import ConfigError
from npusim.graph.build import build_decoder
from npusim.hw import load_hw
from npusim.ops.registry import lower
from npusim.ops.roofline import simulate_op
from npusim.passes import apply
from npusim.runtime.decoder import run_decoder
from npusim.runtime.run import run_graph

HW = load_hw("ascend910b2")
UNBOUNDED = {"hbm.hbm_bytes": 1 << 50}  # price steps whatever their memory, as serving.stepcost does
PRICING_HW = load_hw("ascend910b2", UNBOUNDED)

# (hidden, heads, kv_heads, ffn) as the workload files give them
MODELS = {"k3": (4096, 32, 32, 8448), "qwen2.5-7b": (3584, 28, 4, 18944)}


def _kernels(quick: bool) -> list[tuple[str, str, dict]]:
    """(label, op, params): the prefill kernels of both models at 16 and 32 prompts of 4096."""
    out = []
    for model, (h, heads, kv, ffn) in MODELS.items():
        qkv = h + 2 * kv * (h // heads)
        for tokens in ((65536,) if quick else (65536, 131072)):
            tag = f"{model} prefill {tokens // 4096}x4096"
            out += [
                (f"{tag} qkv_proj", "matmul", dict(m=tokens, n=qkv, k=h, trans_b=True)),
                (f"{tag} o_proj", "matmul", dict(m=tokens, n=h, k=h, trans_b=True)),
                (f"{tag} down_proj", "matmul", dict(m=tokens, n=h, k=ffn, trans_b=True)),
                (f"{tag} rms_norm", "rms_norm", dict(shape=(tokens, h))),
                (f"{tag} add_rms_norm", "add_rms_norm", dict(shape=(tokens, h))),
                (f"{tag} swiglu", "swiglu", dict(shape=(tokens, ffn))),
                (f"{tag} add", "add", dict(shape=(tokens, h))),
                (f"{tag} rope", "rope", dict(shape=(tokens, heads, h // heads))),
            ]
            out.append((f"{tag} gate_up_proj", "matmul", dict(m=tokens, n=2 * ffn, k=h, trans_b=True)))
    # K3's gate_up at 24 prompts, between the corpus's 16 and 32
    out.append(("k3 prefill 24x4096 gate_up_proj", "matmul", dict(m=98304, n=2 * 8448, k=4096, trans_b=True)))
    return out


def _steps(quick: bool) -> list[tuple[str, dict]]:
    """(label, run_decoder or mixed arguments): whole steps."""
    out = [
        ("k3 decode 8 x 4096", dict(workload="k3", phase="decode", batch=8, context=4096)),
        ("qwen2.5-7b decode 32 x 2048", dict(workload="qwen2.5-7b", phase="decode", batch=32, context=2048)),
        ("k3 prefill 1 x 4096", dict(workload="k3", phase="prefill", batch=1, context=4096)),
        ("qwen2.5-7b prefill 2 x 2048", dict(workload="qwen2.5-7b", phase="prefill", batch=2, context=2048)),
        ("k3 mixed 15 decode + 1 x 2048 chunk", dict(workload="k3", phase="mixed", lengths=[4096] * 15 + [2048],
                                                     new_tokens=[1] * 15 + [2048])),
    ]
    if not quick:
        out += [
            ("k3 prefill 16 x 4096 (tp 2)", dict(workload="k3", phase="prefill", batch=16, context=4096, tp=2)),
            ("k3 prefill 16 x 4096", dict(workload="k3", phase="prefill", batch=16, context=4096)),
        ]
    return out


# K3's prefill of 32 x 4096 tokens, priced on 2 cards (tp 2: one card's shard)
BIG = dict(workload="k3", phase="prefill", batch=32, context=4096, tp=2)


def _price_step(args: dict, exact: bool):
    args = dict(args)
    if args["phase"] == "mixed":
        g = build_decoder(args["workload"], "mixed", len(args["lengths"]), args["lengths"],
                          new_tokens=args["new_tokens"])
        run = run_graph(apply(g, "optimized", hw=PRICING_HW), PRICING_HW, counters=False, exact=exact)
    else:
        run = run_decoder(args.pop("workload"), "ascend910b2", passes="optimized", overrides=UNBOUNDED,
                          counters=False, exact=exact, **args)
    r = run.result
    return r.cycles, r.stats.hbm_read_bytes, len(r.fast_forwarded), r.kept_together


def _price_op(op: str, params: dict, exact: bool):
    rep = simulate_op(lower(op, params, HW), HW, trace="kernel", counters=False, exact=exact)
    return rep.cycles, rep.stats.hbm_read_bytes, len(rep.run.fast_forwarded), rep.run.kept_together


def _timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a third of the corpus")
    p.add_argument("--skip-big", action="store_true", help="leave out the K3 prefill of 32 x 4096 tokens")
    p.add_argument("--big-exact", action="store_true", help="price that step exactly too (minutes)")
    p.add_argument("--only", metavar="TEXT", default="", help="the cases whose label contains TEXT")
    args = p.parse_args(argv)  # an unknown flag: one line and exit 2, not the whole benchmark run
    quick, only = args.quick, args.only
    big = None
    if not args.skip_big:  # first, in a process that has priced nothing yet (as a command would)
        (cf, _, nf, kept), tf = _timed(lambda: _price_step(BIG, False))
        big = cf, nf, kept, tf
    cases = [(label, lambda exact, o=op, p=params: _price_op(o, p, exact)) for label, op, params in _kernels(quick)]
    cases += [(label, lambda exact, a=a: _price_step(a, exact)) for label, a in _steps(quick)]
    print(f"{'case':46} {'exact us':>12} {'ff us':>12} {'|ff/ex-1|':>9} {'HBM err':>8} {'ff k':>4} {'kept':>5} "
          f"{'exact s':>8} {'ff s':>7} {'x':>5}")
    rows = []
    for label, price in (c for c in cases if only in c[0]):
        try:
            (ce, he, _, _), te = _timed(lambda: price(True))
        except ConfigError as e:  # a shape beyond the engine's work limit (ops.matmul.WORK_MAX)
            print(f"{label:46} left out: {e}")
            continue
        (cf, hf, nf, kept), tf = _timed(lambda: price(False))
        err, herr = abs(cf / ce - 1), (hf / he - 1 if he else 0.0)
        rows.append((label, err, herr, nf or kept, te, tf))
        print(f"{label:46} {HW.us(ce):12,.1f} {HW.us(cf):12,.1f} {100 * err:8.3f}% {100 * herr:+7.2f}% {nf:4} "
              f"{kept:5} {te:8.2f} {tf:7.2f} {te / tf:5.1f}", flush=True)
    fast = [r for r in rows if r[3]]
    print(f"\n{len(rows)} cases, {len(fast)} approximated (kernels fast-forwarded, or identical blocks that came apart "
          "kept as one; the others: too few waves to gain from it, or no steady state, and no group came apart: "
          "priced exactly)")
    for what, sel in (("approximated", fast), ("all", rows)):
        if sel:
            errs = [r[1] for r in sel]
            herrs = [abs(r[2]) for r in sel]
            te, tf = sum(r[4] for r in sel), sum(r[5] for r in sel)
            print(f"  {what:15} latency |ff/exact-1| median {100 * statistics.median(errs):.3f}% max "
                  f"{100 * max(errs):.3f}% (target 0.2% / 1%); HBM read |error| median "
                  f"{100 * statistics.median(herrs):.2f}% max {100 * max(herrs):.2f}%; "
                  f"time {te:.1f} s exact -> {tf:.1f} s ({te / tf:.1f}x)")
    if big is not None:
        cf, nf, kept, tf = big
        print(f"\nK3 prefill 32 x 4096 (tp 2, one card's shard): {HW.us(cf):,.1f} us priced in {tf:.1f} s "
              f"({nf} kernels fast-forwarded, groups kept as one after {kept} transfers; target <= 10 s)")
        if args.big_exact:
            (ce, _, _, _), te = _timed(lambda: _price_step(BIG, True))
            print(f"  exact: {HW.us(ce):,.1f} us in {te:.1f} s; |ff/exact - 1| {100 * abs(cf / ce - 1):.3f}%, "
                  f"{te / tf:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
