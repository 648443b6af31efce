"""Same seed, same participants: the server's seeded draw of who trains and evaluates each round.

Flower samples a round's nodes at random over node ids that are random per run. The strategies here
draw partition ids instead (fl_attack.federation.participants, from the run's seed and the round) and send to
the nodes that hold them. A node's partition id is asked once, with a "query" message its ClientApp
answers from its node config (the same on the simulation and the deployment engine). A node that
does not answer with one is never sampled (events.log says so); with no partition known at all, the
round falls back to Flower's own random draw.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fl_attack.federation.participants import sample_participants

QUERY_TIMEOUT = 600.0  # seconds to wait for the nodes' answers (a deployment's nodes may be slow to start)


class NodePartitions:
    """Node id -> partition id, learnt once per node by a "query" message; ``sample`` draws nodes."""

    def __init__(self, seed: int, event: Callable[[str], None] = print):
        self.seed = seed
        self.event = event
        self.partition: dict[int, int | None] = {}

    def learn(self, grid, node_ids) -> None:
        """Ask each node not asked yet for its partition id (one message each, in one send)."""
        unknown = sorted(int(n) for n in node_ids if int(n) not in self.partition)
        if not unknown:
            return
        content = RecordDict({"config": ConfigRecord({"ask": "partition-id"})})
        messages = [Message(content=content, dst_node_id=n, message_type=MessageType.QUERY) for n in unknown]
        answered = {}
        for reply in grid.send_and_receive(messages, timeout=QUERY_TIMEOUT):
            record = None if reply.has_error() else reply.content.get("simulation")
            if record is not None and "partition-id" in record:
                answered[int(reply.metadata.src_node_id)] = int(record["partition-id"])
        for node in unknown:
            self.partition[node] = answered.get(node)
        silent = [n for n in unknown if answered.get(n) is None]
        if silent:
            self.event(f"node(s) {silent} gave no partition-id: never sampled (start them with --node-config)")

    def sample(self, node_ids, size: int, server_round: int, stage: str) -> list[int]:
        """``size`` of ``node_ids`` for ``stage`` of the run's ``server_round``: the nodes of the
        partitions fl_attack.federation.participants draws (a partition held by two nodes sends to both)."""
        nodes = [int(n) for n in node_ids]
        by_partition: dict[int, list[int]] = {}
        for node in nodes:
            if self.partition.get(node) is not None:
                by_partition.setdefault(self.partition[node], []).append(node)
        if not by_partition:
            self.event(f"round {server_round}: no node gave a partition-id; {stage} participants drawn by Flower")
            return random.sample(nodes, min(size, len(nodes)))
        chosen = sample_participants(by_partition, size, self.seed, server_round, stage)
        return sorted(node for p in chosen for node in by_partition[p])


class SeededClients:
    """A legacy ClientManager (Flower's SecAgg+ path) whose ``sample`` is ``NodePartitions``' draw
    for one round and stage; everything else is the wrapped manager's."""

    def __init__(self, manager, nodes: NodePartitions, grid, server_round: int, stage: str):
        self.manager, self.nodes, self.grid = manager, nodes, grid
        self.server_round, self.stage = server_round, stage

    def num_available(self) -> int:
        return self.manager.num_available()

    def all(self) -> dict:
        return self.manager.all()

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        return self.manager.wait_for(num_clients, timeout)

    def sample(self, num_clients: int, min_num_clients: int | None = None, criterion=None) -> list:
        if criterion is not None:
            raise ValueError("a seeded draw of participants takes no criterion")
        self.manager.wait_for(max(num_clients, min_num_clients or 0))
        proxies = {int(p.node_id): p for p in self.manager.all().values()}
        self.nodes.learn(self.grid, proxies)
        return [proxies[n] for n in self.nodes.sample(proxies, num_clients, self.server_round, self.stage)]
