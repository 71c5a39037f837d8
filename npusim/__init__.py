"""npusim: a cycle-approximate simulator of a 910B-like NPU.

The public API, stage by stage (see docs/api.md):
    npusim.hw       load_hw(name, overrides)                   -> HwConfig
    npusim.workload load_workload(name | path | config.json)   -> Workload
    npusim.graph    build_decoder(workload, phase, batch, lengths) -> Graph; execute(graph)
    npusim.passes   apply(graph, "optimized" | "fusion,memplan" | ...) -> Graph
    npusim.ops      lower(op_type, params, hw), simulate_op(lowered, hw)
    npusim.isa      Kernel, Program, Copy, Mmad, ...; verify(kernel, hw)
    npusim.engine   simulate(kernel, hw), run(host_calls, hw)  -> RunResult
    npusim.runtime  run_decoder(workload, hw, phase, batch, context, passes) -> GraphRun;
                    compare(...) -> Comparison; run_graph(graph, hw)
    npusim.report   summary(run), step_json(run), comparison_table(c), chrome traces
    npusim.passes.validate  validate_passes(workload, passes) -> Validation
"""

import importlib

# The public names and the module each comes from. They are imported on first use
# (PEP 562), so that `import npusim.cli` or `npusim hw show` does not pay for the
# engine, numpy and simpy.
_LAZY = {
    "report": "npusim.report",
    "run": "npusim.engine", "simulate": "npusim.engine",
    "ConfigError": "npusim.errors", "DeadlockError": "npusim.errors", "NpusimError": "npusim.errors",
    "ProgramError": "npusim.errors",
    "build_decoder": "npusim.graph", "execute": "npusim.graph",
    "load_hw": "npusim.hw",
    "verify": "npusim.isa",
    "apply": "npusim.passes",
    "validate_passes": "npusim.passes.validate",
    "OutOfMemoryError": "npusim.runtime", "run_graph": "npusim.runtime",
    "compare": "npusim.runtime.decoder", "run_decoder": "npusim.runtime.decoder",
    "load_workload": "npusim.workload",
}


def submodule(package: str, name: str):
    """`package.name` imported on first use, as `import package.name` would make it an
    attribute of the package; AttributeError if there is no such module."""
    import importlib.util

    if name.startswith("_") or importlib.util.find_spec(f"{package}.{name}") is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return importlib.import_module(f"{package}.{name}")


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:  # a subpackage (npusim.ops, npusim.hw, npusim.sweep, ...)
        return submodule(__name__, name)
    value = importlib.import_module(module) if name == "report" else getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "ConfigError", "DeadlockError", "NpusimError", "OutOfMemoryError", "ProgramError", "apply", "build_decoder",
    "compare", "execute", "load_hw", "load_workload", "report", "run", "run_decoder", "run_graph", "simulate",
    "validate_passes", "verify",
]
