"""Reports of a run: the JSON contract, Chrome traces, the step summary and comparison."""

from npusim.report.contract import op_json, run_json
from npusim.report.step import comparison_table, floor_of, memory_in_use, memory_timeline, step_json, summary
from npusim.report.tables import statistic_table, stalls, write_tables
from npusim.report.trace import chrome_trace, write_chrome_trace

__all__ = ["chrome_trace", "comparison_table", "floor_of", "memory_in_use", "memory_timeline", "op_json", "run_json", "stalls",
           "statistic_table", "step_json", "summary", "write_chrome_trace", "write_tables"]
