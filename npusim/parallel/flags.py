"""The command-line flags of a parallel plan, shared by run, compare, sweep and validate."""

from __future__ import annotations


def add_plan_flags(p) -> None:
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree: heads, K/V heads and FFN columns "
                   "(a MoE layer: every expert's) split over this many devices of one node, an all_reduce after "
                   "the O and down projections (and a MoE layer's combine); "
                   "one device is simulated, its peers symmetric")
    p.add_argument("--sp", type=int, default=1, help="sequence-parallel degree (prefill): each device holds "
                   "1/sp of every prompt and all_gathers each layer's K and V")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (run only): the layers split over "
                   "this many devices, the batch into --microbatches flowing through them")
    p.add_argument("--microbatches", type=int, default=1, help="micro-batches of a pipelined step (with --pp)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel degree (a MoE decoder): each device (with --tp: "
                   "each tensor-parallel group of --tp devices) runs its own batch's attention, and each holds "
                   "experts / ep of every MoE layer's experts; all_to_alls carry "
                   "the tokens' rows to their experts and back; the busiest device is simulated")
    p.add_argument("--devices", type=int, help="devices the step runs on (must equal tp x sp x pp, or ep; "
                   "default that)")


def plan_args(args) -> dict:
    """run_decoder's plan keywords from parsed flags (only what differs from one device)."""
    out = {}
    for key in ("tp", "sp", "ep", "pp", "microbatches"):
        if getattr(args, key, 1) != 1:
            out[key] = getattr(args, key)
    if getattr(args, "devices", None) is not None:
        out["devices"] = args.devices
    return out


def say_plan(run, step: dict) -> None:
    """`run`'s line on communication, under a plan of several devices."""
    if step.get("tp", 1) > 1 or step.get("sp", 1) > 1 or step.get("ep", 1) > 1:
        from npusim.outputs import say
        from npusim.parallel.breakdown import comm_breakdown

        say("  " + comm_breakdown(run).line())


def plan_report(run) -> dict:
    """`run --json`'s keys on the plan and its communication, under a plan of several devices."""
    from npusim.parallel.breakdown import plan_json
    from npusim.parallel.plan import graph_plan

    return plan_json(run) if graph_plan(run.graph).world > 1 else {}


def validate_sharded(args, passes, context, options: dict) -> int:
    """`npusim validate --tp N`: the sharded step's numerics (npusim.parallel.numerics)."""
    from npusim.errors import ConfigError
    from npusim.outputs import say
    from npusim.parallel.numerics import check_sharded

    if getattr(args, "ep", 1) != 1:
        raise ConfigError("validate --ep: the numerics of an expert-parallel step are not modelled; validate checks "
                          "the MoE layer on one device (drop --ep)")
    if args.pp != 1 or args.microbatches != 1:
        raise ConfigError("--pp: a pipeline's stages compute what the unsplit decoder does layer by layer; "
                          "validate checks tensor and sequence parallel shards (--tp, --sp)")
    from npusim.step_flags import workload_of  # step_flags imports this module

    check = check_sharded(workload_of(args), args.tp, passes, args.phase, args.batch or 2, context, args.seed,
                          devices=args.devices, sp=args.sp, **options)
    say(check.line())
    return 0 if check.passed else 1


def run_pipelined(args, step: dict) -> int:
    """`npusim run --pp N`: a pipelined step (npusim.parallel.pipeline), its summary and JSON."""
    from npusim.errors import ConfigError
    from npusim.outputs import say
    from npusim.parallel.pipeline import run_pipeline

    for flag in ("--trace", "--profile", "--plot"):
        if getattr(args, flag[2:]):
            raise ConfigError(f"{flag}: a pipelined run (--pp) writes its summary and --json only; drop {flag} "
                              "or run one stage's step without --pp")
    step = dict(step)
    pp, tp = step.pop("pp", 1), step.get("tp", 1)
    if step.pop("sp", 1) != 1:
        raise ConfigError("--pp with --sp: a pipeline of sequence-parallel stages is not modelled")
    devices = step.pop("devices", None)
    if devices is not None and devices != pp * tp:
        raise ConfigError(f"--devices {devices} must equal --tp {tp} x --pp {pp} = {tp * pp}")
    if pp == 1:
        raise ConfigError("--microbatches is an option of a pipeline: give --pp N too")
    if step.pop("ep", 1) != 1:  # run_pipeline would take it for a pass option
        raise ConfigError("--pp with --ep: a pipeline of expert-parallel stages is not modelled")
    from npusim.step_flags import pipeline, workload_of  # step_flags imports this module

    run = run_pipeline(workload_of(args), args.hw, passes=pipeline(args.passes), pp=pp, memo=not args.no_memo, **step)
    say(run.summary())
    if args.json:
        from npusim.outputs import write_json, wrote_line
        from npusim.report.contract import provenance
        from npusim.step_flags import inputs

        meta = provenance(args.argv, run.hw, step.get("overrides"), args.workload, inputs(args)["--workload"])
        write_json(args.json, {"latency_us": run.latency_us, "tokens_per_s": run.tokens_per_s,
                               "stage_us": run.stage_us, "handover_us": run.handover_us,
                               "bubble_fraction": run.bubble_fraction, "pp": pp, "tp": tp,
                               "microbatches": run.microbatches, "provenance": meta})
        say(wrote_line([args.json]))
    return 0
