"""Several devices: the tables issue 13 asks for, every number simulated.

    python benchmarks/bench_parallel.py [--only collectives,tp,sp,speed] [--plot DIR]

- collectives: `npusim op all_reduce` from 1 KiB to 1 GiB on 8 devices, as hccl_test
  prints it, Mesh (HCCL's choice in the 8-card full mesh) and Ring; and on k3-tiny's
  all_reduce sizes, that Mesh beats Ring.
- tp: K3 decode at batch 1, 8 and 32 (context 4096) and a 4096-token prefill at
  TP 1, 2, 4 and 8: latency, tokens/s, speed-up, communication share and exposed
  communication (a step that does not fit one device says so).
- sp: a 32,768-token K3 prefill (--sp-tokens; K3's max_context_tokens raised to
  fit) at SP 1, 2, 4 and 8, and where more devices stop paying.
- speed: the wall time of simulating a K3 TP 8 decode step against the single-device
  step (the issue's bound: at most 1.5x).
"""

from __future__ import annotations

import argparse
import sys
import time

import attrs

from npusim.hw import load_hw
from npusim.ops.collectives.simulate import HEADER, simulate_collective
from npusim.parallel.breakdown import comm_breakdown
from npusim.runtime.decoder import run_decoder
from npusim.runtime.memory import OutOfMemoryError
from npusim.workload import load_workload

HW = load_hw()
SECTIONS = ("collectives", "tp", "sp", "speed")


def collectives() -> None:
    sizes = [1 << k for k in range(10, 31)]
    for algo in ("mesh", "ring"):
        print(f"\nall_reduce on 8 devices, {algo} (hccl_test form; formula: the HCCL user guide's cost)")
        print(HEADER)
        for n in sizes:
            print(simulate_collective("all_reduce", n, 8, HW, algo).line())
    tiny = load_workload("k3-tiny")
    print("\nk3-tiny's all_reduce (tokens x hidden x 2 bytes) on an 8-card full mesh: Mesh vs Ring")
    print(f"{'tokens':>8} {'bytes':>10} {'mesh(us)':>10} {'ring(us)':>10} {'mesh wins':>10}")
    for tokens in (1, 2, 8, 32, 128, 512):
        n = tokens * tiny.hidden_size * 2
        mesh, ring = (simulate_collective("all_reduce", n, 8, HW, a).us for a in ("mesh", "ring"))
        print(f"{tokens:>8} {n:>10} {mesh:>10.2f} {ring:>10.2f} {str(mesh < ring):>10}")


def _row(label: str, tp: int, run, base_us: float | None) -> str:
    b = comm_breakdown(run)
    speedup = f"{base_us / run.latency_us:.2f}x" if base_us else "-"
    return (f"{label:<22} {tp:>3} {run.latency_us:>12,.1f} {run.tokens_per_s:>12,.1f} {speedup:>8} "
            f"{100 * b.comm_share:>7.1f}% {b.exposed_us:>10,.1f} {100 * b.link_utilisation:>7.2f}%")


def tp_table(plot_dir: str | None) -> None:
    print("\nK3 tensor parallel on ascend910b2 (optimized passes; one device simulated, peers symmetric)")
    print(f"{'step':<22} {'tp':>3} {'latency(us)':>12} {'tokens/s':>12} {'speedup':>8} {'comm':>8} "
          f"{'exposed(us)':>10} {'links':>8}")
    cases = [("decode b1 ctx4096", "decode", 1, 4096), ("decode b8 ctx4096", "decode", 8, 4096),
             ("decode b32 ctx4096", "decode", 32, 4096), ("prefill 4096", "prefill", 1, 4096)]
    curves = {}
    for label, phase, batch, ctx in cases:
        base = None
        for tp in (1, 2, 4, 8):
            try:
                run = run_decoder("k3", HW, phase, batch, ctx, "optimized", tp=tp, counters=False)
            except OutOfMemoryError as e:
                print(f"{label:<22} {tp:>3} does not fit: {str(e).split(': ', 1)[1][:90]}...")
                continue
            base = base or (run.latency_us if tp == 1 else None)
            print(_row(label, tp, run, base), flush=True)
            curves.setdefault(label, []).append((f"tp{tp}", tp, run.latency_us, comm_breakdown(run).comm_share))
    if plot_dir:
        from npusim.parallel.plots import plan_scaling  # matplotlib only when plotting

        paths = plan_scaling(curves, plot_dir, title="K3 tensor parallel on ascend910b2 (optimized passes)")
        print("wrote " + ", ".join(map(str, paths)))


def sp_table(tokens: int = 32768) -> None:
    k3 = load_workload("k3")
    raised = "max_context_tokens raised to fit; " if tokens > k3.max_context_tokens else ""
    k3 = attrs.evolve(k3, max_context_tokens=max(tokens, k3.max_context_tokens))
    print(f"\nK3 sequence parallel prefill of {tokens:,} tokens ({raised}the last part of the prompt simulated: it "
          "attends to the most keys)")
    print(f"{'sp':>3} {'latency(us)':>12} {'tokens/s':>12} {'speedup':>8} {'gain':>8} {'comm':>8} {'exposed(us)':>12}")
    base = prev = None
    for sp in (1, 2, 4, 8):
        run = run_decoder(k3, HW, "prefill", 1, tokens, "optimized", sp=sp, counters=False)
        b = comm_breakdown(run)
        base = base or run.latency_us
        gain = f"{prev / run.latency_us:.2f}x" if prev else "-"
        print(f"{sp:>3} {run.latency_us:>12,.1f} {run.tokens_per_s:>12,.1f} {base / run.latency_us:>7.2f}x "
              f"{gain:>8} {100 * b.comm_share:>7.1f}% {b.exposed_us:>12,.1f}", flush=True)
        prev = run.latency_us
    print("gain: latency at the previous degree over this one (doubling the devices); below 2x a doubling "
          "pays less than the devices it adds")


def speed() -> None:
    print("\nsimulation wall time, K3 decode batch 8 context 4096 (optimized)")
    walls = {}
    for tp in (1, 8):
        t = time.perf_counter()
        run_decoder("k3", HW, "decode", 8, 4096, "optimized", tp=tp)
        walls[tp] = time.perf_counter() - t
        print(f"  tp {tp}: {walls[tp]:.2f} s")
    ratio = walls[8] / walls[1]
    print(f"  tp 8 / tp 1 = {ratio:.2f} (bound 1.5): {'ok' if ratio <= 1.5 else 'SLOWER THAN THE BOUND'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    ap.add_argument("--plot", metavar="DIR", help="write plan_scaling.png and .svg (latency and communication "
                    "share against the TP degree; npusim compare --plans ... --plot DIR draws the same)")
    ap.add_argument("--sp-tokens", type=int, default=32768, help="prompt length of the sequence-parallel table")
    args = ap.parse_args(argv)
    only = args.only.split(",")
    for name in only:
        if name not in SECTIONS:
            ap.error(f"--only: unknown section {name!r} (known: {', '.join(SECTIONS)})")
    if "collectives" in only:
        collectives()
    if "tp" in only:
        tp_table(args.plot)
    if "sp" in only:
        sp_table(args.sp_tokens)
    if "speed" in only:
        speed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
