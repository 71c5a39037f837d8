"""The command-line flags of a parallel plan, shared by run, compare, sweep and validate."""

from __future__ import annotations


def add_plan_flags(p) -> None:
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree: heads, K/V heads and FFN columns "
                   "split over this many devices of one node, an all_reduce after the O and down projections; "
                   "one device is simulated, its peers symmetric")
    p.add_argument("--devices", type=int, help="devices the step runs on (must equal --tp; default --tp)")


def plan_args(args) -> dict:
    """run_decoder's plan keywords from parsed flags (only what differs from one device)."""
    out = {}
    if getattr(args, "tp", 1) != 1:
        out["tp"] = args.tp
    if getattr(args, "devices", None) is not None:
        out["devices"] = args.devices
    return out
