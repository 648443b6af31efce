"""The honest-but-curious server under SecAgg+: Flower's legacy workflow, attacking the aggregate.

SecAgg+ exists only on Flower's legacy path (Flower 1.42): ``SecAggPlusWorkflow`` inside
``DefaultWorkflow`` with a ``LegacyContext`` and the legacy ``flwr.server.strategy.FedAvg``; the
clients answer through ``secaggplus_mod`` and a NumPyClient (clients/client_app.py).

The strategy then receives, for every participant, the same unmasked aggregate: the num-examples
weighted mean of the participants' returned weights. That is all the server has, so the attacker
attacks it as ONE update (``observed_aggregate``): w0 -> aggregate, with k = the participants' total
samples K and their common lr, B and E. Why this is the right model: with equal local steps T,
Delta_agg = sum_i (k_i/K) Delta_i ~ eta T sum_i (k_i/K) grad L_i = eta T grad L_union, the mean loss
over all K images; label recovery from the output bias adds up the same way. The attack therefore
reconstructs K images and the evaluator scores them against the union of all participants' images
(Hungarian matching one-to-one over the union). A smaller k (one client's) would leave the
attacker guessing which participant its images belong to, which the aggregate cannot tell it.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import torch
from flwr.app import ArrayRecord
from flwr.common import FitRes, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from fl_attack import ObservedUpdate, TrainingMetadata
from fl_attack.audit.service import AuditService
from fl_attack.audit.settings import RunSettings
from fl_attack.federation.update import AttackTarget

from .sampling import NodePartitions, SeededClients


def _weighted_mean(key: str):
    """A legacy metrics-aggregation function: the num-examples weighted mean of ``key``."""

    def aggregate(metrics: list[tuple[int, dict]]) -> dict:
        pairs = [(n, float(m[key])) for n, m in metrics if key in m]
        total = sum(n for n, _ in pairs)
        return {key: sum(n * v for n, v in pairs) / total} if total else {}

    return aggregate


def _state(keys: list[str], arrays) -> OrderedDict:
    """A state dict of the numpy ``arrays``, named by ``keys`` in order (copies, so writable)."""
    return OrderedDict((k, torch.from_numpy(a.copy())) for k, a in zip(keys, arrays, strict=True))


def observed_aggregate(w0: ArrayRecord, results: list[FitRes], dataset: str, client: dict) -> ObservedUpdate:
    """The attacker's view of a SecAgg+ round: (w0, the aggregate, the participants' metadata as one).

    k = the participants' total num-examples; lr, B and E must agree across participants (ValueError
    otherwise); T is the num-examples weighted mean of their local steps (exact when they agree).
    """
    if not results:
        raise ValueError("no results to aggregate")
    metrics = [r.metrics for r in results]
    for key in ("lr", "batch-size", "local-epochs"):
        if len({m[key] for m in metrics}) != 1:
            raise ValueError(f"participants differ in '{key}'; the aggregate has no single training setting")
    total = sum(int(r.num_examples) for r in results)
    steps = round(sum(int(r.num_examples) * int(m["local-steps"]) for r, m in zip(results, metrics)) / total)
    meta = TrainingMetadata.from_metrics(dataset, {**metrics[0], "num-examples": total, "local-steps": steps})
    w0_state = w0.to_torch_state_dict()
    wT = _state(list(w0_state), parameters_to_ndarrays(results[0].parameters))
    return ObservedUpdate(w0_state, wT, meta, client)


class SecAggLeakageFedAvg(LegacyFedAvg):
    """Legacy FedAvg under SecAgg+ that hands each round's aggregate to the audit service.

    service: the run's fl_attack.audit.service.AuditService; evaluate: the server's own evaluation of the
    global model (strategies.strategy.GlobalEvaluation), or None; kwargs: the legacy FedAvg's.
    """

    def __init__(self, service: AuditService, initial_state: dict, evaluate=None, **kwargs):
        self.service = service
        self.settings = service.settings
        self.keys = list(initial_state)
        self.server_evaluation = evaluate
        self.nodes = NodePartitions(service.settings.seed, service.folder.event)  # the seeded draw
        self.global_arrays: dict[int, ArrayRecord] = {}
        self.grid = None  # run_secagg sets it
        super().__init__(
            initial_parameters=ndarrays_to_parameters([v.numpy() for v in initial_state.values()]),
            on_fit_config_fn=lambda server_round: {"server-round": server_round},
            evaluate_fn=self.evaluate_global,
            fit_metrics_aggregation_fn=_weighted_mean("train-loss"),
            evaluate_metrics_aggregation_fn=_weighted_mean("eval-accuracy"),
            **kwargs,
        )

    def configure_fit(self, server_round, parameters, client_manager):
        start = time.perf_counter()
        arrays = ArrayRecord(_state(self.keys, parameters_to_ndarrays(parameters)))
        self.service.round_started(server_round)
        self.global_arrays = {server_round: arrays}
        clients = SeededClients(client_manager, self.nodes, self.grid, server_round, "train")
        instructions = super().configure_fit(server_round, parameters, clients)
        if server_round > 1:  # round 1's configure belongs to the start-up span
            self.service.timings.add("strategy", time.perf_counter() - start)
        return instructions

    def configure_evaluate(self, server_round, parameters, client_manager):
        clients = SeededClients(client_manager, self.nodes, self.grid, server_round, "evaluate")
        instructions = super().configure_evaluate(server_round, parameters, clients)
        if not instructions:  # no federated evaluation (fraction-evaluate 0): aggregate_evaluate never comes
            self.service.end_of_round(server_round, None)  # the server's own evaluation is already in
        return instructions

    def aggregate_fit(self, server_round, results, failures):
        fits = [fit_res for _, fit_res in results]
        self.service.training_received(
            server_round,
            [int(r.metrics["partition-id"]) for r in fits if "partition-id" in r.metrics],
            [r.metrics.get("train-seconds") for r in fits],
            [r.metrics.get("train-started") for r in fits],
        )
        with self.service.timings.measure("strategy"):
            self._dispatch(server_round, fits)
            parameters, metrics = super().aggregate_fit(server_round, results, failures)
        self.service.round_trained(server_round, len(results), metrics.get("train-loss"))
        return parameters, metrics

    def aggregate_evaluate(self, server_round, results, failures):
        self.service.evaluation_received(server_round)
        with self.service.timings.measure("strategy"):
            loss, metrics = super().aggregate_evaluate(server_round, results, failures)
        self.service.clients_evaluated(server_round, loss, metrics.get("eval-accuracy"))
        self.service.end_of_round(server_round, None)  # the legacy workflow evaluates centrally before this
        return loss, metrics

    def evaluate_global(self, server_round: int, parameters, config):
        """The legacy ``evaluate_fn``: the server's evaluation of the global model (round 0: the initial one)."""
        if self.server_evaluation is None:
            return None
        metrics = self.server_evaluation(server_round, ArrayRecord(_state(self.keys, parameters)))
        if metrics is None:
            return None
        if server_round > 0:
            self.service.global_evaluated(server_round, metrics["global-loss"], metrics["global-accuracy"])
        return metrics["global-loss"], dict(metrics)

    def _dispatch(self, server_round: int, results: list[FitRes]) -> None:
        """One attack per method on the round's aggregate, when attack-clients selects anyone."""
        w0 = self.global_arrays.get(server_round)
        partitions = sorted(int(r.metrics["partition-id"]) for r in results if "partition-id" in r.metrics)
        if not results or not self.settings.select_clients(partitions, server_round):
            self.service.folder.event(
                f"round {server_round}: no attack on the aggregate (attack-clients selects nobody)"
            )
            return
        if not self.settings.attacks_round(server_round):
            self.service.folder.event(
                f"round {server_round}: not attacked (attack-rounds={self.settings.attack_rounds})"
            )
            return
        target = AttackTarget(
            server_round, tuple(partitions), None, f"aggregate:{','.join(map(str, partitions))}", aggregate=True
        )
        self.service.observe(
            target, lambda: observed_aggregate(w0, results, self.settings.dataset, {"round": server_round})
        )
        self.service.folder.event(
            f"round {server_round}: dispatched attacks on the SecAgg+ aggregate of partitions "
            f"{partitions} ({self.service.pipeline.in_flight} in flight)"
        )


def run_secagg(grid, context, strategy: SecAggLeakageFedAvg, settings: RunSettings) -> None:
    """Run the federation through Flower's DefaultWorkflow with SecAggPlusWorkflow as its fit workflow."""
    defense = settings.defense
    workflow = DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(
            num_shares=defense.secagg_num_shares,
            reconstruction_threshold=defense.secagg_reconstruction_threshold,
            max_weight=defense.secagg_max_weight or float(settings.max_client_samples()),
        )
    )
    strategy.grid = grid  # the seeded draw of participants asks the nodes their partition ids through it
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=settings.num_server_rounds), strategy=strategy)
    workflow(grid, legacy)
