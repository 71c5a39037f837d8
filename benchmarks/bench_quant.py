"""What INT8 weights buy K3's decode: FP16 against W8A16 against W8A8.

For k3 decode at batch 1 and 8, context 4096 (passes optimized, then
optimized,quantize with --quant w8a16 / w8a8), prints per run: latency, weight
bytes, the weight-read floor (weights read in full at sustained HBM bandwidth),
and how much of the ideal gain each INT8 run achieves - the ideal being the
latency falling by exactly the floor it saves - with the reason for the rest, from
the simulator's own decomposition of a step (npusim.report.step.floor_of):

    latency = weight floor + other HBM traffic + device idle + kernels slower than their traffic

so the shortfall (ideal gain - achieved gain) is the sum of the changes of the last
three, printed term by term, with the time of the quantise / dequantise kernels
W8A8 adds beside them (each added kernel also pays the device's kernel start,
which shows as device idle).

    python benchmarks/bench_quant.py [--batches 1,8] [--context 4096]
"""

from __future__ import annotations

import argparse

from npusim.report.step import floor_of
from npusim.runtime.decoder import run_decoder

MODES = (("FP16", "optimized", {}), ("W8A16", "optimized,quantize", {"quant": "w8a16"}),
         ("W8A8", "optimized,quantize", {"quant": "w8a8"}))
QUANT_OPS = ("quantize_per_token", "token_dequant")


def measure(batch: int, context: int, hw: str = "ascend910b2") -> list[dict]:
    """One row per mode: the run's figures and its floor decomposition."""
    rows = []
    for name, passes, options in MODES:
        run = run_decoder("k3", hw, "decode", batch, context, passes, **options)
        f = floor_of(run)
        quant_us = sum(run.hw.us(k.cycles) for k in run.result.kernels if k.op_type in QUANT_OPS)
        rows.append(dict(mode=name, latency_us=run.latency_us, weight_bytes=run.memory.weights_bytes,
                         floor=f, quant_us=quant_us, kernels=len(run.result.kernels)))
    return rows


def table(batch: int, context: int, rows: list[dict]) -> str:
    fp = rows[0]
    lines = [f"k3 decode, batch {batch} x context {context}",
             f"  {'':6s}{'latency us':>12s}{'weights GB':>12s}{'floor us':>10s}{'kernels':>9s}{'gain us':>10s}"
             f"{'ideal us':>10s}{'achieved':>10s}"]
    for r in rows:
        gain = fp["latency_us"] - r["latency_us"]
        ideal = fp["floor"].floor_us - r["floor"].floor_us
        share = f"{100 * gain / ideal:.1f}%" if ideal else "-"
        lines.append(f"  {r['mode']:6s}{r['latency_us']:>12,.1f}{r['weight_bytes'] / 1e9:>12.3f}"
                     f"{r['floor'].floor_us:>10,.1f}{r['kernels']:>9d}{gain:>10,.1f}{ideal:>10,.1f}{share:>10s}")
    half = fp["floor"].floor_us / 2
    lines.append(f"  ideal = the floor the INT8 run saves; halving the whole floor would save {half:,.1f} us, "
                 f"{half - (fp['floor'].floor_us - rows[1]['floor'].floor_us):,.1f} us of which stay in the "
                 "weights kept FP16 (the LM head) and the fp32 scales")
    for r in rows[1:]:
        a, b = fp["floor"], r["floor"]
        parts = {"other HBM traffic": b.other_hbm_us - a.other_hbm_us, "device idle": b.idle_us - a.idle_us,
                 "kernels slower than their traffic": b.kernel_excess_us - a.kernel_excess_us}
        short = sum(parts.values())
        lines.append(f"  {r['mode']}: shortfall {short:+,.1f} us = " + ", ".join(f"{k} {v:+,.1f}" for k, v in parts.items())
                     + (f" (quantise/dequantise kernels take {r['quant_us']:,.1f} us, in the last two)"
                        if r["quant_us"] else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8", help="decode batches, comma list")
    parser.add_argument("--context", type=int, default=4096, help="context length per sequence")
    args = parser.parse_args()
    for batch in (int(b) for b in args.batches.split(",")):
        print(table(batch, args.context, measure(batch, args.context)))
        print()


if __name__ == "__main__":
    main()
