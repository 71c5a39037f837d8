"""The command-line flags of a parallel plan, shared by run, compare, sweep and validate."""

from __future__ import annotations


def add_plan_flags(p) -> None:
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree: heads, K/V heads and FFN columns "
                   "split over this many devices of one node, an all_reduce after the O and down projections; "
                   "one device is simulated, its peers symmetric")
    p.add_argument("--sp", type=int, default=1, help="sequence-parallel degree (prefill): each device holds "
                   "1/sp of every prompt and all_gathers each layer's K and V")
    p.add_argument("--devices", type=int, help="devices the step runs on (must equal tp x sp; default tp x sp)")


def plan_args(args) -> dict:
    """run_decoder's plan keywords from parsed flags (only what differs from one device)."""
    out = {}
    for key in ("tp", "sp"):
        if getattr(args, key, 1) != 1:
            out[key] = getattr(args, key)
    if getattr(args, "devices", None) is not None:
        out["devices"] = args.devices
    return out


def say_plan(run, step: dict) -> None:
    """`run`'s line on communication, under a plan of several devices."""
    if step.get("tp", 1) > 1 or step.get("sp", 1) > 1:
        from npusim.outputs import say
        from npusim.parallel.breakdown import comm_breakdown

        say("  " + comm_breakdown(run).line())


def validate_sharded(args, passes, context, options: dict) -> int:
    """`npusim validate --tp N`: the sharded step's numerics (npusim.parallel.numerics)."""
    from npusim.outputs import say
    from npusim.parallel.numerics import check_sharded

    check = check_sharded(args.workload, args.tp, passes, args.phase, args.batch or 2, context, args.seed,
                          devices=args.devices, sp=args.sp, **options)
    say(check.line())
    return 0 if check.passed else 1
