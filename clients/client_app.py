"""The Flower ClientApp (Message API): real FedAvg local epochs on one private partition.

Each simulated node takes partition ``context.node_config["partition-id"]``: a FEMNIST writer, or
a CIFAR-100 k-sample (optionally class-restricted) client. ``train`` runs E local epochs of plain
SGD from the received global weights (fl_attack.training, the paper protocol) and returns the new
weights plus public metrics. ``evaluate`` scores the global model on the client's held-out samples.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_attack.data import client_partition, get_spec, load_pool
from fl_attack.models import build_model
from fl_attack.run_config import RunSettings
from fl_attack.training import train_local


app = ClientApp()


def _load_split(settings: RunSettings, partition_id: int):
    pool = load_pool(settings.dataset, settings.data_dir or None)
    return client_partition(pool, partition_id, settings.samples, settings.classes, seed=settings.seed)


def _model_from(msg: Message, dataset: str) -> torch.nn.Module:
    model = build_model(dataset)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training; replies with wT and public metrics."""
    settings = RunSettings.from_run_config(context.run_config)
    torch.set_num_threads(settings.threads)
    partition_id = int(context.node_config["partition-id"])
    split = _load_split(settings, partition_id)
    server_round = int(msg.content["config"]["server-round"])
    model = _model_from(msg, settings.dataset)
    result = train_local(model, split.train.images, split.train.labels, dataset=settings.dataset,
                         lr=settings.lr, batch_size=settings.batch_size, local_epochs=settings.local_epochs,
                         seed=settings.seed * 1_000_003 + server_round * 1009 + partition_id)
    meta = result.update.metadata
    metrics = MetricRecord({"num-examples": meta.num_samples, "local-steps": meta.local_steps, "lr": meta.lr,
                            "batch-size": meta.batch_size, "local-epochs": meta.local_epochs,
                            "train-loss": result.train_loss})
    # Simulation bookkeeping for the evaluator role only; the strategy never hands it to the attacker.
    simulation = ConfigRecord({"partition-id": partition_id, "client-id": split.train.client_id})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics, "simulation": simulation})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the global model on the client's held-out samples."""
    settings = RunSettings.from_run_config(context.run_config)
    torch.set_num_threads(settings.threads)
    split = _load_split(settings, int(context.node_config["partition-id"]))
    model = _model_from(msg, settings.dataset)
    test = split.test if len(split.test.labels) else split.train
    with torch.no_grad():
        logits = model(get_spec(settings.dataset).normalize(test.images))
        loss = F.cross_entropy(logits, test.labels).item()
        accuracy = (logits.argmax(1) == test.labels).float().mean().item()
    metrics = MetricRecord({"num-examples": len(test.labels), "eval-loss": loss, "eval-accuracy": accuracy})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
