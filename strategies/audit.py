"""The honest-but-curious server as a plugin: wrap any Flower Message-API strategy and audit it.

``AuditedStrategy(strategy, service)`` is itself a Flower ``Strategy``. It hands each round's w0 and
every train reply (wT and the public metadata the ClientApp's ``clients.mods.leakage_metadata``
adds) to the Flower-free ``fl_attack.audit.service.AuditService``, then lets the wrapped strategy
(FedAvg, FedProx, FedAdam, FedAvgM, the project's own ...) configure and aggregate exactly as it
would alone. Two things change for the wrapped strategy: the replies reach it in partition order
(their arrival order varies, and floating-point sums depend on it), and a reply with a non-finite
array is left out of the aggregate (a NaN would poison every later round; its attack row says why).

``audit(strategy, context, ...)`` builds it from a ServerApp's Context (README, "Audit your Flower
app"). The service writes the run folder as the project's federation does (rounds.csv,
attacks.csv, events.log, images/, summary.json).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, fields

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_attack.audit.service import AuditService, new_run_folder
from fl_attack.audit.settings import RunSettings, audit_run_config
from fl_attack.federation.app_data import AppData, register_app_data
from fl_attack.federation.data import get_spec
from fl_attack.federation.models import check_model, with_input_normalization
from fl_attack.federation.update import AttackTarget, ObservedUpdate, TrainingMetadata


def observed_update(w0: ArrayRecord, reply: Message, dataset: str, client: dict) -> ObservedUpdate:
    """The attacker's view of one reply: (w0, wT, public metadata). Raises ValueError on bad input.

    Only the ArrayRecord and the public training metrics are read; the reply's "simulation"
    record (partition id, for the evaluator) is not part of it. An integer array that w0 holds as
    a float (Flower's FedAvg averages batch norm's counter) is taken in the reply's integer dtype,
    as the client's model loaded it.
    """
    meta = TrainingMetadata.from_metrics(dataset, reply.content["metrics"])
    w0_state, wT_state = w0.to_torch_state_dict(), reply.content["arrays"].to_torch_state_dict()
    for key, array in wT_state.items():
        # Flower's strategies average an integer counter (batch norm's num_batches_tracked) into a
        # float; the client loaded it back into its integer buffer, and that is the w0 it trained from
        if key in w0_state and w0_state[key].is_floating_point() and not array.is_floating_point():
            w0_state[key] = w0_state[key].to(array.dtype)
    return ObservedUpdate(w0_state, wT_state, meta, client)


def partition_of(reply: Message) -> int | None:
    """The simulated client's partition id (the reply's "simulation" record), None without one."""
    sim = reply.content.get("simulation") if not reply.has_error() else None
    return int(sim["partition-id"]) if sim is not None and "partition-id" in sim else None


def in_partition_order(replies: Iterable[Message]) -> list[Message]:
    """Replies sorted by partition id, then node id: the order they arrive in varies from run to
    run, and floating-point sums depend on the order."""
    return sorted(replies, key=lambda r: (partition_of(r) is None, partition_of(r) or 0, int(r.metadata.src_node_id)))


def is_finite(arrays: ArrayRecord) -> bool:
    """True when every array of the record is free of NaN and inf."""
    return all(np.isfinite(array.numpy()).all() for array in arrays.values())


def first_metric(metrics, names: tuple[str, ...]) -> float | None:
    """The first of ``names`` present in ``metrics`` (a MetricRecord or dict), as a float; else None."""
    for name in names:
        if metrics and name in metrics:
            return float(metrics[name])
    return None


# What the rows read from the strategy's and evaluate_fn's metrics: this project's names, then Flower's quickstart's.
TRAIN_LOSS = ("train-loss", "train_loss")
EVAL_LOSS, EVAL_ACCURACY = ("eval-loss", "eval_loss"), ("eval-accuracy", "eval_acc", "eval_accuracy")
GLOBAL_LOSS, GLOBAL_ACCURACY = ("global-loss", "loss"), ("global-accuracy", "accuracy")


def audit(
    strategy: Strategy,
    context,
    *,
    model,
    dataset: str | AppData,
    normalize: tuple | None = None,
    truth: Callable[[int], tuple] | None = None,
) -> AuditedStrategy:
    """``strategy`` (any Flower Message-API strategy) audited by an honest-but-curious server.

    context: the ServerApp's Context; its run config's audit keys are read
    (fl_attack.audit.settings.audit_run_config: every attack-* key, num-server-rounds, seed,
    results-dir, run-name, record-updates, server-test-samples), the app's own keys are not.
    model: the victims' architecture: the app's nn.Module class or factory (called with no
    arguments), or a model. dataset: a registered dataset ("cifar100", "femnist", "femnist-digits";
    fl_attack.federation.data.DATASETS): the images' shape (3x32x32, 1x28x28), classes and public pool;
    or the app's own data, ``fl_attack.federation.app_data.AppData`` (its name, (C,H,W), class count, a
    public set (images float (P,C,H,W) in [0,1], labels (P,)) and optionally distractors), registered
    under its name (``register_app_data``): the server's public pool is then the app's public set
    (run config server-test-samples is not read), the verdict's distractors the app's (or drawn from the
    public set), and, with no reader for it, the verdict leads with "singled out" and leaves its
    reader's columns NaN (recognized*, recovered*, guess_recovered; docs/audit-your-app.md, "Your own
    data"). An attack that needs a diffusion prior is refused. normalize: (mean, std) per channel, the
    app's own input normalisation (the attack reconstructs pixels in [0,1] and feeds the model what
    the app feeds it); None: the dataset's (fl_attack.federation.data.get_spec). truth: partition id
    -> (images (k,C,H,W) in [0,1], labels (k,)), that client's training images, for scoring; only
    the evaluator calls it, never the attacker. None: the rows are recorded unscored (the
    reconstructions and their Lsim).
    The clients' replies must carry clients.mods.leakage_metadata's metrics. Raises ValueError,
    before any round, for an unknown attack-* key, bad settings, a model that breaks
    fl_attack.federation.models.check_model, a normalisation that does not fit the dataset, a truth
    that does not give float (k,C,H,W) images in [0,1] (``check_truth``), a run-name taken, or an
    AppData that ``register_app_data`` refuses (shapes, ranges, labels outside 0..num_classes-1, fewer
    than 100 public images or distractors).
    """
    app = dataset if isinstance(dataset, AppData) else None
    if app is not None:  # checked and registered before anything reads the registry
        dataset = register_app_data(app).name
    audit_keys = audit_run_config(context.run_config)
    known = {f.name.replace("_", "-") for f in fields(RunSettings)}
    unknown = sorted(k for k in audit_keys if k not in known)
    if unknown:  # the app's pyproject declares them, so Flower took them: a typo would go unnoticed
        attack_keys = sorted(k for k in known if k.startswith("attack-"))
        raise ValueError(f"audit: unknown run-config key '{unknown[0]}'; the audit's keys are {', '.join(attack_keys)}")
    settings = RunSettings.from_run_config({**audit_keys, "dataset": dataset})
    settings.check_device()
    victim = model if isinstance(model, torch.nn.Module) else model()
    if normalize is not None:
        victim = with_input_normalization(victim, dataset, *normalize)
    check_model(victim, dataset, what=f"the audited model {type(victim).__name__}")
    if truth is not None:
        check_truth(truth, dataset)
    _pickle_by_value(type(victim).__module__)
    try:
        folder = new_run_folder(settings)
    except ValueError as exc:  # a named run that exists: an audited app's run does not resume
        raise ValueError(str(exc).split("; choose another")[0] + "; choose another run-name") from None
    folder.write_config(
        {
            "run_config": {**dict(context.run_config), "dataset": dataset},
            "seed": settings.seed,
            "run_name": folder.path.name,
            "attack_config": asdict(settings.attack_config()),
            "audit": {
                "strategy": type(strategy).__name__,
                "model": f"{type(victim).__module__}.{type(victim).__qualname__}",
                "normalize": [list(v) if isinstance(v, (tuple, list)) else v for v in normalize] if normalize else None,
                "scored": truth is not None,
                "app_data": None if app is None else _app_record(app),
            },
        }
    )
    print(f"fl-attack: leakage record in {folder}", flush=True)
    if app is not None:
        print(
            f"fl-attack: {dataset} is the app's own data, with no reader trained for it: the verdict leads with "
            "'singled out'; 'recovered' needs a reader (its columns stay empty)",
            flush=True,
        )
    service = AuditService(
        settings,
        folder,
        test_set=settings.server_test_set() if app is None else app.public_set(),
        truth=None if truth is None else _concatenated(truth),
        model=victim,
    )
    return AuditedStrategy(strategy, service)


def _app_record(app: AppData) -> dict:
    """config.json's account of an app's own data: its shape, classes, sizes and statistics."""
    spec = get_spec(app.name)
    return {
        "name": spec.name,
        "image_shape": list(spec.image_shape),
        "num_classes": spec.num_classes,
        "public": len(app.public[1]),
        "distractors": "drawn from the public set" if app.distractors is None else len(app.distractors[1]),
        "mean": list(spec.mean),
        "std": list(spec.std),
        "reader": None,
    }


def check_truth(truth: Callable[[int], tuple], dataset: str, partition_id: int = 0) -> None:
    """ValueError unless ``truth(partition_id)`` gives (images, labels) as the evaluator scores
    them: float images (k,C,H,W) of the dataset's shape in [0,1] (ToTensor's scale, before any
    Normalize) and k labels. Called once before round 1, so a wrong truth fails before any attack."""
    shape = get_spec(dataset).image_shape
    what = f"audit: truth({partition_id})"
    try:
        images, labels = truth(partition_id)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must return (images, labels) of that client's training data: {exc}") from None
    images, labels = torch.as_tensor(images), torch.as_tensor(labels)
    if images.dim() != 4 or tuple(images.shape[1:]) != shape or not images.is_floating_point():
        raise ValueError(
            f"{what}: images must be float (k,{','.join(map(str, shape))}) for {dataset}, got {images.dtype} "
            f"{tuple(images.shape)} (channels first, as ToTensor gives them)"
        )
    if images.numel() and (images.min() < 0 or images.max() > 1):
        raise ValueError(
            f"{what}: images must be in [0,1], got [{float(images.min()):.3g}, {float(images.max()):.3g}] "
            "(divide 0-255 pixels by 255; score before any Normalize)"
        )
    if labels.dim() != 1 or len(labels) != len(images):
        raise ValueError(f"{what}: labels must be ({len(images)},), got {tuple(labels.shape)}")


def _concatenated(truth: Callable[[int], tuple]):
    """partition ids -> their training images and labels, concatenated in order (an aggregate's)."""

    def images_and_labels(partition_ids: tuple[int, ...]):
        parts = [truth(p) for p in partition_ids]
        return torch.cat([torch.as_tensor(i) for i, _ in parts]), torch.cat([torch.as_tensor(y) for _, y in parts])

    return images_and_labels


def _pickle_by_value(module_name: str) -> None:
    """Ship the app's model class to Ray attack workers by value: the app's package is on the
    ServerApp's path, not necessarily on a worker's."""
    module = sys.modules.get(module_name)
    if module is None or module_name.startswith(("torch", "fl_attack")):
        return
    try:
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(module)
    except Exception:  # no Ray, or a module it cannot take: local workers import it themselves
        pass


class AuditedStrategy(Strategy):
    """``strategy``, audited by ``service`` (module docstring).

    round_offset: rounds done before this run started (a resumed run): Flower's round r is the
    run's round r + round_offset in the records. finish_on_return: ``start`` drains the attacks and
    writes summary.json before it returns (off when the caller finishes the service itself).
    check: raises ValueError for a reply's metadata the attack must not take (the project's
    federation: training other than its run config prescribes); the attack row then fails.
    """

    def __init__(
        self,
        strategy: Strategy,
        service: AuditService,
        *,
        round_offset: int = 0,
        finish_on_return: bool = True,
        check: Callable[[TrainingMetadata], None] | None = None,
    ):
        self.strategy, self.service, self.check = strategy, service, check
        self.round_offset, self.finish_on_return = round_offset, finish_on_return
        self.global_arrays: dict[int, ArrayRecord] = {}  # w0 of the current round (run numbering)

    def __getattr__(self, name):  # the wrapped strategy's own attributes (fraction_train, ...)
        if name in ("strategy", "service"):
            raise AttributeError(name)
        return getattr(self.strategy, name)

    # -- Flower's Strategy ----------------------------------------------------------------------
    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        start = time.perf_counter()
        run_round = server_round + self.round_offset
        if server_round == 1:  # before any client trains: attack-clients ids must be partitions
            self.service.settings.check_nodes(len(list(grid.get_node_ids())))
        self.service.round_started(run_round)
        self.global_arrays = {run_round: arrays}  # older rounds' w0 are not needed
        messages = self.strategy.configure_train(server_round, arrays, config, grid)
        if server_round > 1:  # round 1's configure belongs to the start-up span
            self.service.timings.add("strategy", time.perf_counter() - start)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        run_round = server_round + self.round_offset
        replies = in_partition_order(replies)
        ok = [r for r in replies if not r.has_error()]
        self.service.training_received(
            run_round,
            [partition_of(r) for r in ok if partition_of(r) is not None],
            [(r.content.get("metrics") or {}).get("train-seconds") for r in ok],
            [(r.content.get("simulation") or {}).get("train-started") for r in ok],
        )
        with self.service.timings.measure("strategy"):
            self.observe(run_round, ok)  # a non-finite update becomes a failed attack row
            valid = self._exclude_non_finite(run_round, ok)
            arrays, metrics = self.strategy.aggregate_train(server_round, valid) if valid else (None, None)
        self.service.round_trained(run_round, len(valid), first_metric(metrics, TRAIN_LOSS))
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        run_round = server_round + self.round_offset
        self.service.evaluation_received(run_round)
        with self.service.timings.measure("strategy"):
            metrics = self.strategy.aggregate_evaluate(server_round, in_partition_order(replies))
        self.service.clients_evaluated(
            run_round, first_metric(metrics, EVAL_LOSS), first_metric(metrics, EVAL_ACCURACY)
        )
        return metrics

    def evaluate_fn(self, evaluate: Callable[[int, ArrayRecord], MetricRecord | None] | None = None):
        """Flower's ``evaluate_fn`` that ends each round: ``evaluate``'s (the server's own
        evaluation, if any) metrics go into the round's row, then the row and the checkpoint are
        written. Pass it to ``start`` of the strategy that runs (a DP wrapper around this one)."""

        def end_of_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            metrics = evaluate(server_round, arrays) if evaluate is not None else None
            if server_round > 0:
                run_round = server_round + self.round_offset
                loss, accuracy = first_metric(metrics, GLOBAL_LOSS), first_metric(metrics, GLOBAL_ACCURACY)
                if metrics is not None:
                    self.service.global_evaluated(run_round, loss, accuracy)
                self.service.end_of_round(run_round, arrays.to_torch_state_dict())
            return metrics

        end_of_round.audited = True
        return end_of_round

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600, **kwargs):
        """Flower's ``Strategy.start`` with ``evaluate_fn`` ending each round (``evaluate_fn``); then,
        with finish_on_return, the attacks still in flight are collected and summary.json written."""
        evaluate = kwargs.pop("evaluate_fn", None)
        if not getattr(evaluate, "audited", False):
            evaluate = self.evaluate_fn(evaluate)
        started = time.time()
        try:
            return super().start(grid, initial_arrays, num_rounds, timeout, evaluate_fn=evaluate, **kwargs)
        finally:
            if self.finish_on_return:
                self.service.close(started)

    # -- the attacks ----------------------------------------------------------------------------
    def observe(self, run_round: int, replies: list[Message]) -> None:
        """Hand the round's replies to the service: one update per partition the schedule picks."""
        w0 = self.global_arrays.get(run_round)
        nodes: dict[int, list[Message]] = {}
        for reply in replies:
            if partition_of(reply) is not None:
                nodes.setdefault(partition_of(reply), []).append(reply)
        shared = {p: [int(r.metadata.src_node_id) for r in rs] for p, rs in nodes.items() if len(rs) > 1}
        if shared:  # a deployment's SuperNodes started with the same partition-id: whose data is it?
            self.service.folder.event(
                f"round {run_round}: partition-id(s) {sorted(shared)} came from more than one node "
                f"(node ids {shared}): aggregated but not attacked; give each SuperNode its own partition-id"
            )
        if len(nodes) < len(replies) and not shared:
            self.service.folder.event(
                f"round {run_round}: {len(replies) - len(nodes)} repl(ies) without a partition-id "
                "(the ClientApp has no clients.mods.leakage_metadata mod?): not attacked"
            )
        by_partition = {p: rs[0] for p, rs in nodes.items() if len(rs) == 1}
        service = self.service
        for partition_id in service.plan(run_round, list(by_partition)):
            reply = by_partition[partition_id]
            client_id = str(reply.content["simulation"].get("client-id", ""))
            target = AttackTarget(run_round, (partition_id,), int(reply.metadata.src_node_id), client_id)
            client = {"round": run_round, "node_id": target.node_id}

            def make_update(reply=reply, client=client) -> ObservedUpdate:
                update = observed_update(w0, reply, service.settings.dataset, client)
                if self.check is not None:
                    self.check(update.metadata)
                return update

            service.observe(target, make_update)
        service.folder.event(
            f"round {run_round}: {service.dispatched(run_round)} attack(s) dispatched, "
            f"{service.pipeline.in_flight} in flight"
        )

    def _exclude_non_finite(self, run_round: int, replies: list[Message]) -> list[Message]:
        """The replies whose weights are all finite; the others are logged and left out of the
        aggregate. With none left, Flower keeps the previous global model."""
        valid, excluded = [], []
        for reply in replies:
            (valid if is_finite(reply.content["arrays"]) else excluded).append(reply)
        if excluded:
            who = [partition_of(r) if partition_of(r) is not None else int(r.metadata.src_node_id) for r in excluded]
            self.service.excluded(run_round, who)
            self.service.folder.event(
                f"round {run_round}: excluded {len(excluded)} non-finite update(s) from the aggregate "
                f"(partitions {who})" + ("; no valid update: the global model stays as it was" if not valid else "")
            )
        return valid


__all__ = ["AuditedStrategy", "audit", "check_truth", "observed_update", "partition_of", "in_partition_order"]
