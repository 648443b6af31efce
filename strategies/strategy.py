"""The project's FedAvg: Flower's FedAvg with a seeded draw of participants, and its server evaluation.

``SeededFedAvg`` aggregates exactly like FedAvg. It differs in three ways, none of them an attack:
the participants of each round are drawn from the run's seed and round (strategies/sampling.py)
instead of Flower's unseeded ``random.sample``; the clients are told the run's round (a resumed run
goes on counting); and integer arrays (batch norm's num_batches_tracked) are counters, not weights,
so they take the clients' maximum in their dtype (``integer_arrays_as_max``).

The honest-but-curious server is not here: server_app.py wraps this strategy in the audit plugin
(strategies/audit.py), as it would wrap any other. ``GlobalEvaluation`` is the server's own
evaluation of each round's global model on its held-out samples (Flower's ``evaluate_fn``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fl_attack.federation.models import resolve_model
from fl_attack.federation.training import evaluate_model

from .sampling import NodePartitions


def integer_arrays_as_max(aggregate: ArrayRecord, records: list[ArrayRecord]) -> ArrayRecord:
    """``aggregate`` (FedAvg's weighted mean of ``records``) with each integer array replaced by the
    element-wise maximum of the records' arrays, in their dtype; floating arrays unchanged, key order kept.

    Flower's aggregate_arrayrecords multiplies every array by a float weight, which turns an int64
    counter such as batch norm's num_batches_tracked into a float64 mean; a counter of steps taken
    is not a weight to average, and the clients' next w0 must hold it as the model's int64 buffer.
    Raises ValueError when the records disagree on an integer array's dtype.
    """
    out = {}
    for key, array in aggregate.items():
        arrays = [record[key].numpy() for record in records]
        if not np.issubdtype(arrays[0].dtype, np.integer):
            out[key] = array
            continue
        if len({a.dtype for a in arrays}) != 1:
            raise ValueError(f"the clients' '{key}' arrays differ in dtype: {sorted({str(a.dtype) for a in arrays})}")
        out[key] = Array(np.asarray(np.maximum.reduce(arrays), dtype=arrays[0].dtype))
    return ArrayRecord(out)


class SeededFedAvg(FedAvg):
    """FedAvg with the run's seeded draw of participants and the run's round numbering (module docstring).

    seed: the run's seed. event: where the draw's notes go (a run folder's events.log).
    round_offset: rounds already done before this strategy started (a resumed run).
    """

    def __init__(self, seed: int, event: Callable[[str], None], round_offset: int = 0, **fedavg_kwargs):
        super().__init__(**fedavg_kwargs)
        self.nodes = NodePartitions(seed, event)  # the seeded draw of participants
        self.round_offset = round_offset

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self._configure(grid, arrays, config, server_round + self.round_offset, "train")

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self._configure(grid, arrays, config, server_round + self.round_offset, "evaluate")

    def _configure(self, grid: Grid, arrays: ArrayRecord, config: ConfigRecord, server_round: int, stage: str):
        """FedAvg's configure_train/configure_evaluate with the participants drawn from the run's seed
        and round (strategies/sampling.py) instead of Flower's unseeded ``random.sample``."""
        fraction, minimum = (
            (self.fraction_train, self.min_train_nodes)
            if stage == "train"
            else (self.fraction_evaluate, self.min_evaluate_nodes)
        )
        if fraction == 0.0:
            return []
        size = max(int(len(list(grid.get_node_ids())) * fraction), minimum)  # Flower's count
        _, available = sample_nodes(grid, self.min_available_nodes, size)  # Flower's wait for enough nodes
        self.nodes.learn(grid, available)
        node_ids = self.nodes.sample(available, size, server_round, stage)
        flwr_log(logging.INFO, "configure_%s: Sampled %s nodes (out of %s)", stage, len(node_ids), len(available))
        config["server-round"] = server_round  # the run's round, also in a resumed run
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        kind = MessageType.TRAIN if stage == "train" else MessageType.EVALUATE
        return self._construct_messages(record, node_ids, kind)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round + self.round_offset, replies)
        if arrays is not None:
            arrays = integer_arrays_as_max(arrays, [r.content["arrays"] for r in replies if not r.has_error()])
        return arrays, metrics


class GlobalEvaluation:
    """The server's evaluation of the global model on its held-out samples: Flower's ``evaluate_fn``
    (round 0: the initial model, logged only). settings: the run's RunSettings; test_set: its
    held-out ClientData (None: no evaluation); event: events.log; timings: the run's Timings."""

    def __init__(self, settings, test_set, event: Callable[[str], None], timings):
        self.settings, self.test_set, self.event, self.timings = settings, test_set, event, timings

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if self.test_set is None:
            return None
        with self.timings.measure("global_evaluation"):
            net = resolve_model(self.settings.model, self.settings.dataset)
            net.load_state_dict(arrays.to_torch_state_dict())
            loss, accuracy = evaluate_model(net, self.test_set.images, self.test_set.labels, self.settings.dataset)
        if server_round == 0:
            self.event(
                f"initial global model: test accuracy {accuracy:.4f}, loss {loss:.4f} "
                f"on the server's {len(self.test_set)} held-out samples"
            )
        return MetricRecord({"global-loss": loss, "global-accuracy": accuracy})
