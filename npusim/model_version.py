"""The version of what npusim simulates: the disk cache keys computed results on it.

A cached step, operator or serving point (npusim.diskcache) is keyed on this number
and on its inputs by value - the workload, the step's shape, the passes and their
options, the hardware fields the run read - not on npusim's source: an edit that
leaves results alone (a report, a message, a refactor, a faster path that gives the
same numbers) keeps every cached entry warm.

Bump MODEL_VERSION (by one) in the change that makes npusim simulate something else
for the same inputs: the engine's rules, a lowering or its tiling, a pass, the graph
builder, a constant or default read in code, the fields of the records a run
returns. The regression corpus (tests/test_engine_regression.py) records results
under this number and fails, saying so, when they change while it stays put: bump it,
then re-record (`python tests/test_engine_regression.py --record`, which refuses to
record changed results under the old number). Edits to config files need no bump:
configs and workloads are keyed by value. What a serving point simulates (the lengths
and graph the step-cost model gives a grid point) is versioned by
npusim.serving.stepcost.POINT_SCHEME as well.
"""

MODEL_VERSION = 12

__all__ = ["MODEL_VERSION"]
