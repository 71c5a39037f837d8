"""Run the operator property tests (tests/test_ops_properties.py) with a larger
hypothesis budget than CI's, and print what ran: per op, how many drawn parameter
sets were lowered and simulated, only verified (too large to simulate within the
limit), or refused with a one-line error, and the time taken.

    python benchmarks/bench_properties.py [--examples N] [--sim-mib MIB] [OP ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=50, help="hypothesis examples per op (default 50)")
    ap.add_argument("--sim-mib", type=float, default=64.0,
                    help="simulate drawn ops moving at most this many MiB (default 64); larger ones are verified only")
    ap.add_argument("ops", nargs="*", help="op types (default: every registered op)")
    a = ap.parse_args(argv)
    os.environ["NPUSIM_HYPOTHESIS_EXAMPLES"] = str(a.examples)
    os.environ["NPUSIM_HYPOTHESIS_SIM_BYTES"] = str(a.sim_mib * 2**20)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from hypothesis import HealthCheck, given, settings

    import test_ops_properties as t

    ops = a.ops or sorted(t.OPS)
    print(f"hypothesis: {a.examples} examples per op, derandomized; simulate up to {a.sim_mib:g} MiB "
          f"(config {t.HW.name if hasattr(t.HW, 'name') else 'ascend910b2'})")
    total = Counter()
    t_all = time.perf_counter()
    for op in ops:
        seen: Counter = Counter()

        @settings(max_examples=a.examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
        @given(t.params_of(op))
        def prop(params):
            seen[t.check(op, params)] += 1

        t0 = time.perf_counter()
        try:
            prop()
        except Exception as err:  # a property failed: report it (hypothesis printed the example) and go on
            seen["FAILED"] += 1
            print(f"{op}: FAILED: {str(err).splitlines()[0] if str(err) else type(err).__name__}", flush=True)
        total.update(seen)
        print(f"{op:20s} {sum(seen.values()):4d} runs: {seen['simulated']:4d} simulated, {seen['verified']:4d} "
              f"verified only, {seen['refused']:4d} refused{'  FAILED' if seen['FAILED'] else ''}  "
              f"({time.perf_counter() - t0:6.1f} s)", flush=True)
    print(f"{'all':20s} {sum(total.values()):4d} runs: {total['simulated']:4d} simulated, {total['verified']:4d} "
          f"verified only, {total['refused']:4d} refused, {total['FAILED']} ops FAILED  "
          f"({time.perf_counter() - t_all:6.1f} s)")
    print("refusals (one-line errors, numbers as N), most frequent first:")
    for msg, count in sorted(t.REFUSALS.items(), key=lambda kv: -kv[1]):
        print(f"  {count:4d}  {msg}")
    return 1 if total["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
