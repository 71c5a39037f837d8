"""Bad-input catalogue, `npusim serve` (round 9): cards beyond the hardware's topology,
counts of one in messages, trace files a JSON parser chokes on, and values of
thousands of characters quoted whole. Each a one-line error before any step is priced."""

import pytest

from cli_check import fails_cleanly, one_line_error
from npusim.errors import ConfigError
from npusim.serving import StepCost
from npusim.serving.cluster import Cluster
from npusim.serving.service import SchedulerConfig, ServiceConfig

SERVE = ["serve", "--workload", "k3-tiny", "--no-cache", "--requests", "5"]
TOPOLOGY = r"but ascend910b2's topology has 32 \(topology.node_device_count 8 x topology.node_count 4; give at most 32"


# ---- cards beyond the topology: --cards 64 served 64 replicas, 32 of them on nodes the config has not


@pytest.mark.parametrize("argv, expect", [
    (["--rate", "10", "--cards", "33"], rf"--cards: 33 cards, {TOPOLOGY}"),
    (["--rate", "10", "--cards", "64", "--tp", "2"], rf"--cards: 64 cards, {TOPOLOGY}"),
    (["--rate", "10", "--service", "vllm-continuous", "--pd", "20:20"], rf"--pd 20:20: 40 cards, {TOPOLOGY}"),
    (["--rate", "10", "--plan", "--max-cards", "33"], rf"--max-cards: 33 cards, {TOPOLOGY}"),
    (["--rate", "10", "--tp", "2", "--set", "topology.node_device_count=1", "--set", "topology.node_count=1"],
     r"--tp 2: 2 cards, but ascend910b2's topology has 1 "),
])
def test_serve_more_cards_than_the_topology_has(argv, expect, capsys):
    fails_cleanly([*SERVE, *argv], capsys, expect, seconds=10)


def test_serve_a_cluster_of_more_cards_than_the_topology_has():
    """The API's door: a decode side's cards follow the prefill side's."""
    svc = ServiceConfig("t", SchedulerConfig("continuous", max_batch=8), "optimized")
    cost = StepCost("k3-tiny", "ascend910b2", "optimized", max_batch=8)
    one_line_error(lambda: Cluster(svc, cost, 33), ConfigError, r"cards: 33 cards, but ascend910b2's topology has 32")
    one_line_error(lambda: Cluster(svc, cost, 4, role="decode", first_index=30), ConfigError,
                   r"cards: 34 cards, but ascend910b2's topology has 32")
