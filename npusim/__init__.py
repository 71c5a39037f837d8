"""npusim: a cycle-approximate simulator of a 910B-like NPU.

The public API, stage by stage (see README.md):
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

from npusim import report
from npusim.engine import run, simulate
from npusim.errors import ConfigError, DeadlockError, NpusimError, ProgramError
from npusim.graph import build_decoder, execute
from npusim.hw import load_hw
from npusim.isa import verify
from npusim.passes import apply
from npusim.passes.validate import validate_passes
from npusim.runtime import OutOfMemoryError, run_graph
from npusim.runtime.decoder import compare, run_decoder
from npusim.workload import load_workload

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "DeadlockError", "NpusimError", "OutOfMemoryError", "ProgramError", "apply", "build_decoder",
    "compare", "execute", "load_hw", "load_workload", "report", "run", "run_decoder", "run_graph", "simulate",
    "validate_passes", "verify",
]
