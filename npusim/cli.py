"""The `npusim` command line."""

from __future__ import annotations

import argparse
import sys

from npusim.errors import NpusimError


def _cmd_hw(args) -> int:
    from npusim.hw.show import show_hw

    print(show_hw(args.name, args.set))
    return 0


def _cmd_demo(args) -> int:
    from npusim.demo import main as demo

    demo(args.hw)
    return 0


def _op_help(op_type: str) -> str:
    import attrs

    from npusim.ops.registry import spec

    sp = spec(op_type)
    lines = [f"npusim op {op_type} key=value ...  ({sp.help})", "", "parameters:"]
    for f in attrs.fields(sp.params):
        lines.append(f"  {f.name:14s} default {f.default!r:10s} {f.metadata.get('help', '')}")
    if sp.tiling is not None:
        lines += ["", "tiling (tiling.KEY=VALUE, default: chosen by the lowering):"]
        for f in attrs.fields(sp.tiling):
            lines.append(f"  {f.name:14s} {f.metadata.get('help', '')}")
    return "\n".join(lines)


def _cmd_op(args) -> int:
    from npusim.errors import ConfigError
    from npusim.hw import load_hw
    from npusim.hw.load import parse_set_args
    from npusim.ops import OPS, lower, simulate_op

    if args.list or not args.type:
        print("op types: " + ", ".join(sorted(OPS)))
        return 0
    if args.help:
        print(_op_help(args.type))
        return 0
    params, tiling = {}, {}
    for item in args.params:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"op {args.type}: expected key=value, got '{item}'")
        if key.startswith("tiling."):
            tiling[key[len("tiling."):]] = value
        else:
            params[key] = value
    hw = load_hw(args.hw, parse_set_args(args.set))
    low = lower(args.type, params, hw, tiling or None)
    report = simulate_op(low, hw, trace="instr" if args.trace else "kernel")
    print(_op_summary(report))
    if args.json:
        import json

        from npusim.report import op_json

        with open(args.json, "w") as f:
            json.dump(op_json(report), f, indent=1)
    if args.trace:
        from npusim.report import write_chrome_trace

        write_chrome_trace(report.run, args.trace)
    return 0


def _op_summary(r) -> str:
    low = r.lowered
    lines = [
        f"{low.op_type} on {r.hw.name}: {r.us:.2f} us ({r.cycles:.0f} cycles), {len(low.kernels)} kernel(s)",
        f"  {r.tflops:.2f} TFLOPS, GM {r.gm_bw_bytes_per_s / 1e12:.3f} TB/s, HBM {r.hbm_bw_bytes_per_s / 1e12:.3f} TB/s, "
        f"L2 hit rate {100 * r.stats.l2_hit_rate:.1f}%",
        f"  bound: {r.bound} (roofline {r.roofline.time_s * 1e6:.2f} us: compute {r.roofline.compute_s * 1e6:.2f}, "
        f"HBM {r.roofline.hbm_s * 1e6:.2f}, L2 {r.roofline.l2_s * 1e6:.2f})",
        "  pipes busy: " + ", ".join(f"{p} {100 * v:.0f}%" for p, v in r.utilisation().items()),
    ]
    if low.tiling is not None:
        lines.append(f"  tiling: {low.tiling}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npusim", description="Cycle-approximate simulator of a 910B-like NPU.")
    sub = p.add_subparsers(dest="command", required=True)

    hw = sub.add_parser("hw", help="hardware configs")
    hw_sub = hw.add_subparsers(dest="hw_command", required=True)
    show = hw_sub.add_parser("show", help="print a config with derived figures")
    show.add_argument("name", nargs="?", default="ascend910b2", help="config name or path")
    show.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a field")
    show.set_defaults(func=_cmd_hw)

    demo = sub.add_parser("demo", help="run the README's hand-built vector add on every AIV core")
    demo.add_argument("--hw", default="ascend910b2", help="config name or path")
    demo.set_defaults(func=_cmd_demo)

    op = sub.add_parser("op", add_help=False, help="simulate one operator (npusim op --list; npusim op TYPE --help)")
    op.add_argument("type", nargs="?", help="op type (snake_case)")
    op.add_argument("params", nargs="*", metavar="key=value", help="op parameters; tiling.KEY=VALUE to force a tiling")
    op.add_argument("--hw", default="ascend910b2", help="config name or path")
    op.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a hardware field")
    op.add_argument("--json", metavar="PATH", help="write the JSON report")
    op.add_argument("--trace", metavar="PATH", help="write a Chrome trace (instruction level)")
    op.add_argument("--list", action="store_true", help="list the op types")
    op.add_argument("-h", "--help", action="store_true", help="show the op's parameters")
    op.set_defaults(func=_cmd_op)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except NpusimError as e:
        print(f"npusim: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an output path that cannot be written
        print(f"npusim: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
