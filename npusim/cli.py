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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except NpusimError as e:
        print(f"npusim: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
