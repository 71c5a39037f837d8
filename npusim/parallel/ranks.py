"""Simulate every rank of a tensor-parallel step, not one: the check of the symmetric
assumption (engine.links.SymmetricFabric). Each rank gets its own device (cores,
L2, HBM) and host in one SimPy environment; their collectives meet on a FullFabric
(a link per direction of every wired pair), a transfer step waiting for what its
peers send it."""

from __future__ import annotations

from npusim.engine.device import Device
from npusim.engine.events import Environment
from npusim.engine.host import Host
from npusim.engine.links import FullFabric
from npusim.engine.run import _check_calls, until_even
from npusim.engine.stats import Tracer
from npusim.errors import DeadlockError
from npusim.graph.ir import Graph
from npusim.hw import HwConfig
from npusim.runtime.compile import compile_nodes, host_program
from npusim.runtime.memory import place


class _RankFabric:
    """One rank's view of the shared fabric (what Host.fabric expects)."""

    def __init__(self, fabric: FullFabric, rank: int):
        self.fabric, self.rank = fabric, rank
        self.links = fabric.links if rank == 0 else ()

    def transfer(self, t, queued):
        return self.fabric.transfer(self.rank, t, queued)


def every_rank_cycles(graph: Graph, hw: HwConfig, ranks: int) -> list[float]:
    """Each rank's step time (cycles) when all `ranks` run `graph` (one device's shard) together."""
    placement = place(graph, hw.hbm.hbm_bytes)
    compiled = compile_nodes(graph, list(graph.nodes), hw, placement)
    calls = list(host_program(graph, compiled, placement.addresses).calls)
    _check_calls(calls, hw)

    def attempt(lone_from: tuple[int, int] | None):
        env = Environment()
        devices = [Device(env, hw, Tracer("kernel")) for _ in range(ranks)]
        fabric = FullFabric(env, devices)
        hosts = []
        for r, dev in enumerate(devices):
            dev.lone_from = lone_from
            host = Host(env, dev)
            host.fabric = _RankFabric(fabric, r)
            env.process(host.run(calls))
            hosts.append(host)
        env.run()
        return devices, hosts

    hosts = until_even(attempt)
    if not all(h.done for h in hosts):
        raise DeadlockError(f"every-rank run of {graph!r}: a rank never finished")
    return [h.end for h in hosts]
