"""Reports of a run: the JSON contract, Chrome traces, tables and plots."""

from npusim.report.contract import op_json, run_json
from npusim.report.trace import chrome_trace, write_chrome_trace

__all__ = ["chrome_trace", "op_json", "run_json", "write_chrome_trace"]
