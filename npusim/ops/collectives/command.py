"""`npusim op all_reduce bytes=64MiB devices=8 algo=mesh`: one collective, printed the
way hccl_test prints it (`bytes` may also be a range: bytes=1KiB..1GiB doubles from
the first to the last, like hccl_test's -b/-e/-f 2); with --profile DIR also written
as hccl_test writes it (DIR/all_reduce_test.txt), which `npusim calibrate --hccl` reads."""

from __future__ import annotations

from npusim.errors import ConfigError
from npusim.hw import HwConfig
from npusim.isa.program import DTYPE_BYTES
from npusim.ops.collectives import hccl_test
from npusim.ops.collectives.lower import DTYPES, ELEMENTS_MAX
from npusim.ops.collectives.simulate import HEADER, CollectiveReport, parse_bytes, simulate_collective

KEYS = ("bytes", "elements", "devices", "algo", "dtype", "axis")


def sizes(text: str, kind: str = "") -> list[int]:
    """'64MiB' -> [64 MiB]; '1KiB..1MiB' -> every power-of-two multiple from 1 KiB to 1 MiB."""
    where = f"op {kind}: parameter 'bytes'" if kind else "op: bytes"
    lo, dots, hi = text.partition("..")
    first = parse_bytes(lo, where)
    last = parse_bytes(hi, where) if dots else first
    if first < 1 or last < first:
        raise ConfigError(f"{where}: expected 1 <= first <= last, got {text!r}")
    out = [first]
    while out[-1] * 2 <= last:
        out.append(out[-1] * 2)
    return out


def run_collective_op(kind: str, params: dict[str, str], hw: HwConfig) -> tuple[str, list[CollectiveReport]]:
    """The printed table and the reports of `npusim op KIND key=value...`."""
    unknown = sorted(set(params) - set(KEYS))
    if unknown:
        raise ConfigError(f"op {kind}: unknown parameter '{unknown[0]}' (expected one of: {', '.join(KEYS)})")
    try:
        devices = int(params.get("devices", hw.topology.node_device_count))
    except ValueError:
        raise ConfigError(f"op {kind}: parameter 'devices' expects an integer, got {params['devices']!r}") from None
    if devices < 2:  # before the buffer is split over them (the op's parameter says the same)
        raise ConfigError(f"op {kind}: 'devices' must be > 1: {devices}")
    dtype = params.get("dtype", "fp16")
    if dtype not in DTYPES:  # before its size is needed (the op's parameter says the same)
        raise ConfigError(f"op {kind}: 'dtype' must be in {DTYPES!r} (got {dtype!r})")
    if params.get("axis", "0") != "0":  # the op's parameter (its help lists it): numerics only, of a 1-D buffer here
        raise ConfigError(f"op {kind}: 'axis' must be 0 here (the buffer is 1-D: elements or bytes; axis picks where a "
                          f"graph node's parts stack), got {params['axis']!r}")
    if "elements" in params and "bytes" in params:
        raise ConfigError(f"op {kind}: give bytes or elements, not both")
    if "elements" in params:  # the op's parameter, as the graph's nodes give it
        elements = parse_bytes(params["elements"], f"op {kind}: parameter 'elements'")
        if elements < 1:  # (0 bytes would be refused as bytes, a parameter not given)
            raise ConfigError(f"op {kind}: 'elements' must be > 0: {elements}")
        params = {**params, "bytes": str(elements * DTYPE_BYTES[dtype])}
    nbytes = sizes(params.get("bytes", "64MiB"), kind)
    most = ELEMENTS_MAX * DTYPE_BYTES[dtype]
    if "elements" not in params and nbytes[-1] > most:  # (elements= is checked as the op's parameter)
        raise ConfigError(f"op {kind}: bytes {nbytes[-1]} is more than the {most} of {ELEMENTS_MAX} {dtype} elements "
                          "a collective may have")
    reports = [simulate_collective(kind, n, devices, hw, params.get("algo", "auto"), dtype) for n in nbytes]
    r = reports[0]
    head = (f"{kind} on {devices} devices of {hw.name} ({hw.topology.intra_node}), algorithm {r.algo}; "
            "one rank simulated, its peers symmetric")
    return "\n".join([head, HEADER] + [x.line() for x in reports]), reports


def hccl_test_output(reports: list[CollectiveReport], hw: HwConfig) -> tuple[str, str]:
    """(file name, text) of the reports in hccl_test's layout, under the command line
    that would measure them; check_result NULL (the numerics are not checked here)."""
    r = reports[0]
    per_node = min(r.devices, hw.topology.node_device_count)
    lines = [f"# npusim op {r.kind} on {hw.name}: simulated (one rank, its peers symmetric, algorithm {r.algo}), "
             "in hccl_test's layout",
             "# " + hccl_test.command_line(r.kind, [x.nbytes for x in reports], r.devices, r.dtype, per_node),
             hccl_test.HEADER] + [hccl_test.row(x.nbytes, x.us) for x in reports]
    return hccl_test_file(r.kind), "\n".join(lines) + "\n"


def hccl_test_file(kind: str) -> str:
    """The file `op KIND --profile DIR` writes in DIR: hccl_test's output's name."""
    if kind not in hccl_test.TESTS:
        raise ConfigError(f"op {kind} --profile: hccl_test has no test for it (it has "
                          f"{', '.join(hccl_test.TESTS.values())})")
    return f"{hccl_test.TESTS[kind]}.txt"


def report_json(reports: list[CollectiveReport]) -> dict:
    return {"op_type": reports[0].kind, "algo": reports[0].algo, "devices": reports[0].devices,
            "rows": [{"data_size_bytes": r.nbytes, "latency_us": r.us, "alg_bw_gb_s": r.algbw_gb_s,
                      "bus_bw_gb_s": r.busbw_gb_s, "formula_us": r.formula_us} for r in reports]}
