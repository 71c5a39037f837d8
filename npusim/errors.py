"""The errors npusim raises for bad input. Each carries one line that names the
file, key, kernel, block or instruction at fault and what was expected."""


class NpusimError(Exception):
    """Base of every error npusim reports to a user as one line."""


class ConfigError(NpusimError):
    """A hardware config, workload or override is missing, malformed or out of range."""


class ProgramError(NpusimError):
    """A lowered program breaks a rule verify() checks (fit, alignment, flags, pipes)."""


class DeadlockError(NpusimError):
    """The simulation stopped with work still waiting on something nothing will provide."""
