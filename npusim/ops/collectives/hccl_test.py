"""hccl_test's output, as CANN's HCCL Test prints it: which test runs which collective,
the table's header and rows, and the command line that ran it. `npusim op all_reduce
... --profile DIR` writes a simulated run in this form; `npusim calibrate --hccl`
reads a measured one (npusim.calibrate.hccl).

The table (CANN HCCL Test user guide, "Result Description"; the tool's source,
hccl_opbase_rootinfo_base.cc, print_execution_time):

    data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:
    8192              | 764.55         | 0.00998              | success

- data_size: bytes per NPU as -b/-e give them. It is npusim's buffer n of each
  collective: the all_reduce and alltoall buffer, the reduce_scatter input, the
  all_gather *output* (hccl_allgather_rootinfo_test.cc divides the count by the ranks);
- aveg_time: µs per collective, averaged over the timed iterations (-n, after -w
  warm-up ones), from an event before the first to one after the last on the stream;
- alg_bandwidth: data_size / aveg_time in GB/s of 2^30 bytes (the guide's example:
  8192 bytes in 764.55 µs is printed 0.00998);
- check_result: success, failed, or NULL when the check is off (-c 0).
The guide spells the time column avg_time(us):, the binary aveg_time(us):.
"""

from __future__ import annotations

from collections.abc import Sequence

# the hccl_test executable of each npusim collective
TESTS = {"all_reduce": "all_reduce_test", "all_gather": "all_gather_test", "reduce_scatter": "reduce_scatter_test",
         "all_to_all": "alltoall_test"}
# every test the tool has (HCCL Test parameter description, Atlas A2), simulated or not
ALL_TESTS = ("all_gather_test", "all_gatherv_test", "all_reduce_test", "alltoall_test", "alltoallv_test",
             "alltoallvc_test", "broadcast_test", "reduce_scatter_test", "reduce_scatterv_test", "reduce_test",
             "scatter_test")
# npusim's dtypes -> hccl_test's -d names
DTYPES = {"fp16": "fp16", "bf16": "bfp16", "fp32": "fp32"}
DEFAULT_DTYPE = "fp32"  # hccl_test's -d when not given (HCCL Test parameter description)
HEADER = "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:"
GB = 2 ** 30  # bytes in hccl_test's "GB" of alg_bandwidth
CHECK_OFF = "NULL"  # check_result of a run without the result check (-c 0)
_UNITS = (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))


def size_arg(nbytes: int) -> str:
    """A size as -b/-e take it: 8K, 64M, 1G, or plain bytes."""
    for unit, scale in _UNITS:
        if nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def command_line(kind: str, sizes: Sequence[int], devices: int, dtype: str, npus_per_node: int) -> str:
    """The command that runs `kind` over `sizes` (doubling, as -f 2) on `devices` ranks,
    result check off."""
    step = " -f 2" if len(sizes) > 1 else ""
    return (f"mpirun -n {devices} ./bin/{TESTS[kind]} -b {size_arg(sizes[0])} -e {size_arg(sizes[-1])}{step} "
            f"-d {DTYPES[dtype]} -p {npus_per_node} -c 0")


def row(nbytes: int, us: float, check: str = CHECK_OFF) -> str:
    """One line of the table, in the tool's printf layout ("%-17llu | %-14.2f | %-20.5f | %s")."""
    return f"{nbytes:<17d} | {us:<14.2f} | {nbytes / us * 1e6 / GB:<20.5f} | {check}"
