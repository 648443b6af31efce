"""The Flower ClientApp (Message API): real FedAvg local epochs on one private partition.

Each node takes partition ``context.node_config["partition-id"]``: a FEMNIST writer, or a CIFAR-100
k-sample (optionally class-restricted) client, or (run config ``partitioner``) a partition of Flower
Datasets' natural, iid, dirichlet or pathological partitioner over ``num-partitions`` nodes. The
simulation sets both; on the deployment engine each SuperNode is started with
``--node-config "partition-id=i num-partitions=N"``. ``train`` runs E local epochs of plain
SGD (or the run's client-optimizer) from the received global weights (fl_attack.federation.training), in eval mode
or with client-train-mode in train mode, and returns the new weights (batch norm's buffers included)
plus public metrics. ``evaluate`` scores the global model on the client's held-out samples.

Defenses (run config ``defense``): training goes through the mods of clients/defenses.py, each
switched on by the run config. Under ``secagg`` the server runs Flower's legacy SecAgg+ workflow,
so both handlers hand the message to ``LEGACY_APP``, a NumPyClient doing the same work.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import ClientApp as LegacyClientApp
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

from fl_attack.federation.data import load_client_split
from fl_attack.federation.settings import FederationSettings
from fl_attack.federation.training import evaluate_model, train_local

from .defenses import TRAIN_MODS
from .settings import run_settings

app = ClientApp()


def node_partition(context: Context) -> int:
    """The node's partition: its node config's ``partition-id``. ValueError saying how to set it."""
    try:
        return int(context.node_config["partition-id"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"this node has no usable partition-id in its node config ({dict(context.node_config)}); "
            'start each SuperNode with --node-config "partition-id=I num-partitions=N" '
            '(docs/running.md, "Running on Flower\'s deployment engine")'
        ) from None


def node_settings(context: Context) -> FederationSettings:
    """The run config's federation settings, with the federation's partition count from the node config's
    ``num-partitions``: the Flower Datasets partitioners cut the data into that many partitions, as
    the server does with its node count. ValueError for a num-partitions that is not a whole number
    >= 1 (without one, a Flower partitioner raises when the data is loaded)."""
    settings = run_settings(context)
    found = context.node_config.get("num-partitions")
    try:
        return settings if found is None else settings.with_partitions(int(found))
    except (TypeError, ValueError):
        raise ValueError(
            f"this node's num-partitions ({found!r}) is not a whole number >= 1; start each SuperNode with "
            '--node-config "partition-id=I num-partitions=N"'
        ) from None


def _load_split(settings: FederationSettings, partition_id: int):
    """The node's data (fl_attack.federation.data.load_client_split, the evaluator's too)."""
    return load_client_split(settings.data, partition_id)


def _prepare(settings: FederationSettings, partition_id: int, state: dict):
    """(the node's data, the run's model holding ``state``), on the run's torch threads."""
    torch.set_num_threads(settings.threads)
    split = _load_split(settings, partition_id)
    model = settings.new_model()
    model.load_state_dict(state)
    return split, model


def local_training(settings: FederationSettings, partition_id: int, server_round: int, w0: dict):
    """E local epochs from ``w0``: returns (wT state dict, public metrics, simulation bookkeeping).

    The metrics include ``train-seconds`` (loading the partition and training), the bookkeeping
    ``train-started`` (epoch seconds), for the run's time breakdown (fl_attack/audit/timings.py).
    """
    started, clock = time.time(), time.perf_counter()
    split, model = _prepare(settings, partition_id, w0)
    result = train_local(
        model,
        split.train.images,
        split.train.labels,
        dataset=settings.dataset,
        lr=settings.lr,
        batch_size=settings.batch_size,
        local_epochs=settings.local_epochs,
        seed=settings.seed * 1_000_003 + server_round * 1009 + partition_id,
        optimizer=settings.optimizer,
        train_mode=settings.client_train_mode,
    )
    meta = result.update.metadata
    metrics = {**meta.to_metrics(), "train-loss": result.train_loss, "train-seconds": time.perf_counter() - clock}
    simulation = {"partition-id": partition_id, "client-id": split.train.client_id, "train-started": started}
    return model.state_dict(), metrics, simulation


def local_evaluation(settings: FederationSettings, partition_id: int, weights: dict) -> dict:
    """Loss and accuracy of ``weights`` on the client's held-out samples (its train set if it has none)."""
    split, model = _prepare(settings, partition_id, weights)
    test = split.test if len(split.test.labels) else split.train
    loss, accuracy = evaluate_model(model, test.images, test.labels, settings.dataset)
    return {"num-examples": len(test.labels), "eval-loss": loss, "eval-accuracy": accuracy}


@app.train(mods=TRAIN_MODS)
def train(msg: Message, context: Context) -> Message:
    """One round of local training; replies with wT and public metrics."""
    settings = node_settings(context)
    if settings.defense.secagg:
        return LEGACY_APP(msg, context)
    server_round = int(msg.content["config"]["server-round"])
    wT, metrics, simulation = local_training(
        settings, node_partition(context), server_round, msg.content["arrays"].to_torch_state_dict()
    )
    # Simulation bookkeeping for the evaluator role only; the strategy never hands it to the attacker.
    content = RecordDict(
        {"arrays": ArrayRecord(wT), "metrics": MetricRecord(metrics), "simulation": ConfigRecord(simulation)}
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the global model on the client's held-out samples."""
    settings = node_settings(context)
    if settings.defense.secagg:
        return LEGACY_APP(msg, context)
    partition_id = node_partition(context)
    metrics = local_evaluation(settings, partition_id, msg.content["arrays"].to_torch_state_dict())
    # The partition id lets the server average the replies in one order (float sums depend on it).
    simulation = ConfigRecord({"partition-id": partition_id})
    return Message(content=RecordDict({"metrics": MetricRecord(metrics), "simulation": simulation}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """The node's partition id, which the server asks once per node to draw each round's
    participants from the run's seed (strategies/sampling.py). Nothing private: the server's own
    bookkeeping of who is who, as in every reply's "simulation" record."""
    simulation = ConfigRecord({"partition-id": node_partition(context)})
    return Message(content=RecordDict({"simulation": simulation}), reply_to=msg)


class SecAggClient(NumPyClient):
    """The same training and evaluation for Flower's legacy path (SecAgg+ needs a NumPyClient).

    Weights travel as a list of arrays in the model's state-dict order. Public metrics, and the
    simulation bookkeeping (partition-id, client-id) for the evaluator, go in the FitRes metrics,
    which SecAgg+ leaves in plaintext.
    """

    def __init__(self, context: Context):
        self.settings = node_settings(context)
        self.partition_id = node_partition(context)
        self.keys = list(self.settings.new_model().state_dict())

    def _state(self, parameters) -> dict:
        return OrderedDict((k, torch.from_numpy(a.copy())) for k, a in zip(self.keys, parameters, strict=True))

    def fit(self, parameters, config):
        wT, metrics, simulation = local_training(
            self.settings, self.partition_id, int(config["server-round"]), self._state(parameters)
        )
        return [v.numpy() for v in wT.values()], int(metrics["num-examples"]), {**metrics, **simulation}

    def evaluate(self, parameters, config):
        metrics = local_evaluation(self.settings, self.partition_id, self._state(parameters))
        return float(metrics["eval-loss"]), int(metrics["num-examples"]), metrics


LEGACY_APP = LegacyClientApp(client_fn=lambda context: SecAggClient(context).to_client())
