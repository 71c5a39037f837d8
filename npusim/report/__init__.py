"""Reports of a run: the JSON contract, Chrome traces, the step summary and comparison.

The names below are imported from their modules on first use (a command imports
only the reports it prints: `npusim op` needs no step report, nor the runtime it reads)."""

import importlib

_HOME = {
    "op_json": "contract", "run_json": "contract",
    "comparison_table": "step", "floor_of": "step", "memory_in_use": "step", "memory_timeline": "step",
    "step_json": "step", "summary": "step",
    "statistic_table": "tables", "stalls": "tables", "write_tables": "tables",
    "chrome_trace": "trace", "write_chrome_trace": "trace",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value
