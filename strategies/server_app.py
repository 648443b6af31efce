"""The Flower ServerApp: a FedAvg federation whose server attacks client updates as they arrive.

Run with ``flwr run .`` (see README). The run config is checked before the first round; results go
to ``<results-dir>/<run-name>/`` (config.json, rounds.csv, attacks.csv, events.log, images/).

The server is the project's FedAvg (strategies/strategy.py) audited by the plugin any Flower app
can use (strategies/audit.py) over the run's fl_attack.audit.service.AuditService. The run config's
``defense`` picks how it runs (fl_attack/federation/defense_settings.py, DefenseSettings):
- central-dp: the audited FedAvg wrapped in Flower's DifferentialPrivacyServerSideFixedClipping or
  DifferentialPrivacyClientSideFixedClipping; the attacker sees each clipped, noise-free update;
- secagg: Flower's legacy SecAgg+ workflow with SecAggLeakageFedAvg (strategies/secagg.py); the
  attacker sees only the aggregate;
- anything else: the audited FedAvg; local-dp, topk, low-rank and quantize act on the clients.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import asdict

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
)

from fl_attack.audit.replay import ReplayError, prepare_replay, run_replay
from fl_attack.audit.run_folder import RunFolder, check_resumable
from fl_attack.audit.service import AuditService, new_run_folder
from fl_attack.audit.settings import RunSettings
from fl_attack.evaluation.overlap import disjoint_record
from fl_attack.evaluation.verdict import DEFAULT_DISTRACTORS, DEFAULT_PUBLIC_SAMPLES, verdict_protocol
from fl_attack.evaluation.victims import ground_truth
from fl_attack.federation.participants import sample_size
from fl_attack.privacy.accountant import PrivacyLedger
from fl_attack.run_config import preflight

from .audit import AuditedStrategy
from .secagg import SecAggLeakageFedAvg, run_secagg
from .strategy import GlobalEvaluation, SeededFedAvg

CRASH_ENV = "FL_ATTACK_CRASH_AFTER_ROUND"  # fault injection (tests): crash_hooks
SETTLED = ":settled"

log = logging.getLogger(__name__)
app = ServerApp()


def privacy_ledger(settings: RunSettings, num_nodes: int) -> PrivacyLedger | None:
    """The run's DP accounting (fl_attack.privacy.accountant): None without local-dp or central-dp."""
    return PrivacyLedger.for_defense(settings.defense, settings.clients_per_round(num_nodes), num_nodes)


def write_run_config(folder, settings: RunSettings, run_config: dict, num_nodes: int) -> None:
    """A new run's config.json in ``folder`` (a RunFolder or a path): the flat run config, the seed,
    the AttackConfig, the defense and its DP accounting (what analysis/load.py and ``fl-attack
    replay`` read back), and the verdict's protocol with what its data shares with the run's clients
    (``verdict["disjoint"]``, fl_attack.evaluation.overlap.disjoint_record)."""
    folder = RunFolder(folder)
    privacy = privacy_ledger(settings, num_nodes)
    folder.write_config(
        {
            "run_config": run_config,
            "seed": settings.seed,
            "run_name": folder.path.name,
            "num_nodes": num_nodes,
            "attack_config": asdict(settings.attack_config()),
            "defense": settings.defense.describe(),
            "privacy": privacy.describe() if privacy is not None else None,
            "verdict": {
                **verdict_protocol(settings.server_test_samples),
                # what the verdict's data and the attacker's public pool share with the run's clients
                "disjoint": disjoint_record(
                    settings.with_partitions(num_nodes).data,
                    settings.server_test_samples,
                    num_distractors=DEFAULT_DISTRACTORS,
                    default_public=DEFAULT_PUBLIC_SAMPLES,
                ),
            },
        }
    )


def prepare_resume(settings: RunSettings, run_config: dict) -> tuple[RunFolder, int, dict]:
    """(the run folder, its last completed round R, R's global model) for resume="RUN_DIR".

    Checks what ``fl_attack.audit.run_folder.check_resumable`` checks, and the node count; then cuts
    rounds.csv, attacks.csv and updates/index.csv back to rounds <= R (``RunFolder.cut_back``), so
    the resumed rounds never duplicate a row. Raises ValueError naming what does not fit, before
    any round.
    """
    folder, recorded, done, arrays = check_resumable(settings, run_config)
    nodes = recorded.get("num_nodes")
    if (
        settings.partitioner != "paper"
        and None not in (nodes, settings.num_partitions)
        and nodes != settings.num_partitions
    ):
        raise ValueError(
            f"invalid run config: resume: the interrupted run had {nodes} nodes, this federation has "
            f"{settings.num_partitions}; partitioner={settings.partitioner} cuts the data by the node count, "
            "so every client's data would change"
        )
    try:
        folder.cut_back(done)
    except ValueError as exc:
        raise ValueError(f"invalid run config: resume: {exc}") from None
    return folder, done, arrays


def complete_kept_rounds(run_dir: RunFolder, settings: RunSettings, num_nodes: int) -> int:
    """Before a resumed run's first round: the attacks of the kept rounds that were in flight when
    the run died, run here from their recorded updates (``fl-attack replay --missing``, in this
    process, with the run's attack threads), so their rows and what they leave in the server's
    memory are there before the later rounds need them. Returns how many ran; a failure is logged
    and leaves them to ``fl-attack replay RUN --missing``."""
    if not settings.record_updates:
        return 0
    threads = settings.attack_thread_count(sample_size(num_nodes, settings.fraction_train, 1))
    try:
        replay = prepare_replay(run_dir.path, missing=True, threads=threads, device=settings.attack_device)
        if not replay.attacks:
            return 0
        run_dir.event(f"resume: running the {replay.attacks} attack(s) of the kept rounds left in flight first")
        return len(run_replay(replay, log=sys.stdout))
    except (ReplayError, OSError) as exc:
        run_dir.event(f"resume: the kept rounds' missing attacks were not run ({exc}); fl-attack replay --missing")
        return 0


def build_strategy(settings: RunSettings, run_dir, num_nodes: int, initial_state: dict, round_offset: int = 0):
    """(the strategy that runs, the run's AuditService, the evaluate_fn that ends each round).

    Its settings carry the federation's ``num_nodes`` as num_partitions (the Flower partitioners'
    ground truth). The project's FedAvg (strategies.strategy.SeededFedAvg) is audited like any
    strategy (strategies.audit.AuditedStrategy); under central DP the audit sits inside Flower's DP
    wrapper, so it sees each update after the clipping and before the noise; under SecAgg+ the
    legacy strategy feeds the service the aggregate."""
    settings = settings.with_partitions(num_nodes)
    test_set = settings.server_test_set()
    defense = settings.defense
    min_evaluate = 1 if settings.fraction_evaluate > 0 else 0
    clients_per_round = settings.clients_per_round(num_nodes)
    service = AuditService(
        settings,
        run_dir,
        clients_per_round=clients_per_round,
        round_offset=round_offset,
        test_set=test_set,
        privacy=privacy_ledger(settings, num_nodes),
        truth=lambda partition_ids: ground_truth(settings.data, partition_ids),
        hooks=crash_hooks(),
    )
    evaluate = GlobalEvaluation(settings, test_set, service.folder.event, service.timings)
    if defense.secagg:
        strategy = SecAggLeakageFedAvg(
            service,
            initial_state,
            evaluate,
            fraction_fit=settings.fraction_train,
            fraction_evaluate=settings.fraction_evaluate,
            min_fit_clients=defense.min_clients,
            min_evaluate_clients=min_evaluate,
            min_available_clients=defense.min_clients,
        )
        return strategy, service, None
    fedavg = SeededFedAvg(
        settings.seed,
        service.folder.event,
        round_offset=round_offset,
        fraction_train=settings.fraction_train,
        fraction_evaluate=settings.fraction_evaluate,
        min_train_nodes=1,
        min_evaluate_nodes=min_evaluate,
        min_available_nodes=1,
    )
    audited = AuditedStrategy(
        fedavg, service, round_offset=round_offset, finish_on_return=False, check=settings.check_prescribed
    )
    if not defense.central_dp:
        return audited, service, audited.evaluate_fn(evaluate)
    wrapper = (
        DifferentialPrivacyServerSideFixedClipping
        if defense.clipping == "server"
        else DifferentialPrivacyClientSideFixedClipping
    )
    dp = wrapper(
        audited,
        noise_multiplier=defense.noise_multiplier,
        clipping_norm=defense.clip_norm,
        num_sampled_clients=clients_per_round,
    )
    return dp, service, audited.evaluate_fn(evaluate)


@app.main()
def main(grid: Grid, context: Context) -> None:
    main_started = time.time()  # epoch seconds: the launcher subtracts its own launch time
    num_nodes = len(list(grid.get_node_ids()))
    settings = preflight(context.run_config, num_nodes)  # every check, once, before round 1
    run_config = dict(context.run_config)
    clock = time.perf_counter()
    if settings.resume:
        run_dir, done, state = prepare_resume(settings, run_config)
        config = run_dir.read_config()
        config.setdefault("resumed", []).append(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "after_round": done, "run_config": run_config}
        )
        run_dir.write_config(config)
        complete_kept_rounds(run_dir, settings, num_nodes)
    else:
        run_dir, done, state = new_run_folder(settings), 0, settings.new_model(seed=settings.seed).state_dict()
        write_run_config(run_dir, settings, run_config, num_nodes)
    config_seconds = time.perf_counter() - clock
    print(f"fl-attack: leakage record in {run_dir}", flush=True)
    if done:
        print(f"fl-attack: resuming after round {done} of {settings.num_server_rounds}", flush=True)

    runner, service, evaluate = build_strategy(settings, run_dir, num_nodes, state, round_offset=done)
    if done:
        service.folder.event(f"resumed after round {done}: rounds {done + 1}..{settings.num_server_rounds} follow")
    started = time.time()
    try:
        if settings.defense.secagg:
            run_secagg(grid, context, runner, settings)
        else:
            runner.start(
                grid=grid,
                initial_arrays=ArrayRecord(state),
                num_rounds=settings.num_server_rounds - done,
                train_config=ConfigRecord({}),
                evaluate_fn=evaluate,
            )
    finally:
        # Ray shuts down when main() returns: collect every attack first.
        service.timings.add("writing", config_seconds)
        service.close(  # summary.json, with where the time went (fl_attack/audit/timings.py)
            started,
            summary={"resumed_after_round": done or None, "cuda": torch.cuda.is_available()},
            timings={"main_started": main_started},
        )


def crash_hooks() -> list:
    """Fault injection for the tests, from the environment: with FL_ATTACK_CRASH_AFTER_ROUND=R the
    ServerApp process exits abruptly (os._exit: no clean-up, no summary.json) right after round R's
    checkpoint, or with "R:before-checkpoint" after its rounds.csv row but before its checkpoint (the
    resume must then cut that row back). With ":settled" after either ("3:before-checkpoint:settled")
    it first waits (at most 600 s) until every attack of the rounds before R is collected (its row
    written, its memory saved), so that a test knows what the crash leaves on disk. Unset: none."""
    value = os.environ.get(CRASH_ENV, "")
    if not value:
        return []
    settled = value.endswith(SETTLED)
    round_text, _, point = value.removesuffix(SETTLED).partition(":")
    point = point or "round-end"

    def crash(at: str, server_round: int, service) -> None:
        if at != point or str(server_round) != round_text:
            return
        if settled:
            service.settle(server_round, timeout=600)
        service.folder.event(f"round {server_round}: {CRASH_ENV}={value}: the ServerApp dies here, as if killed")
        os._exit(70)

    return [crash]
