"""npusim: a cycle-approximate simulator of a 910B-like NPU.

The public API, stage by stage (see README.md):
    npusim.hw      load_hw(name, overrides)           -> HwConfig
    npusim.isa     Kernel, Program, Copy, Mmad, ...; verify(kernel, hw)
    npusim.engine  simulate(kernel, hw), run(host_calls, hw) -> RunResult
"""

from npusim.engine import run, simulate
from npusim.errors import ConfigError, DeadlockError, NpusimError, ProgramError
from npusim.hw import load_hw
from npusim.isa import verify

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "DeadlockError", "NpusimError", "ProgramError", "load_hw", "run", "simulate", "verify",
]
