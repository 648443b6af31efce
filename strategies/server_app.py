"""The Flower ServerApp: a FedAvg federation whose server attacks client updates as they arrive.

Run with ``flwr run .`` (see README). The run config is checked before the first round; results go
to ``<results-dir>/<run-name>/`` (config.json, rounds.csv, attacks.csv, events.log, images/).

The run config's ``defense`` picks how the server side runs (fl_attack/run_config.py, DefenseSettings):
- central-dp: LeakageFedAvg wrapped in Flower's DifferentialPrivacyServerSideFixedClipping or
  DifferentialPrivacyClientSideFixedClipping; the attacker sees each clipped, noise-free update;
- secagg: Flower's legacy SecAgg+ workflow with SecAggLeakageFedAvg (strategies/secagg.py); the
  attacker sees only the aggregate;
- anything else: plain LeakageFedAvg; local-dp, topk, low-rank and quantize act on the clients.
"""

from __future__ import annotations

import logging
import math
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

from fl_attack.participants import sample_size
from fl_attack.paths import resolve_in_project
from fl_attack.privacy import PrivacyLedger
from fl_attack.replay import ReplayError, prepare_replay, run_replay
from fl_attack.run_config import RunSettings
from fl_attack.runs import RunFolder
from fl_attack.verdict import verdict_protocol

from .secagg import SecAggLeakageFedAvg, run_secagg
from .strategy import LeakageFedAvg

log = logging.getLogger(__name__)
app = ServerApp()


def privacy_ledger(settings: RunSettings, num_nodes: int) -> PrivacyLedger | None:
    """The run's DP accounting (fl_attack.privacy): None without local-dp or central-dp."""
    return PrivacyLedger.for_defense(settings.defense, check_defense(settings, num_nodes), num_nodes)


def write_run_config(folder, settings: RunSettings, run_config: dict, num_nodes: int) -> None:
    """A new run's config.json in ``folder`` (a RunFolder or a path): the flat run config, the seed,
    the AttackConfig, the defense and its DP accounting (what analysis/load.py and ``fl-attack
    replay`` read back)."""
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
            "verdict": verdict_protocol(settings.server_test_samples),
        }
    )


def run_folder(settings: RunSettings) -> RunFolder:
    """The run's folder. A named run (run-name) must not exist yet, so that two runs never share
    one record; an unnamed one gets a fresh name (timestamp-dataset-methods, with -2, -3 ... when
    taken). Raises ValueError for a named folder that already holds a run."""
    root = resolve_in_project(settings.results_dir)
    if settings.run_name:
        folder = RunFolder(root / settings.run_name)
        if folder.holds_run:
            raise ValueError(
                f"invalid run config: run folder {folder} already holds a run; choose another "
                f'run-name, or resume it with resume="{folder}"'
            )
        return folder
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{settings.dataset}-{'-'.join(settings.methods)}"
    path, n = root / base, 1
    while path.exists():
        n += 1
        path = root / f"{base}-{n}"
    return RunFolder(path)


def prepare_resume(settings: RunSettings, run_config: dict) -> tuple[RunFolder, int, dict]:
    """(the run folder, its last completed round R, R's global model) for resume="RUN_DIR".

    Checks what ``RunSettings.check_resumable`` checks, and the node count; then cuts
    rounds.csv, attacks.csv and updates/index.csv back to rounds <= R (``RunFolder.cut_back``), so
    the resumed rounds never duplicate a row. Raises ValueError naming what does not fit, before
    any round.
    """
    folder, recorded, done, arrays = settings.check_resumable(run_config)
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


def check_defense(settings: RunSettings, num_nodes: int) -> int:
    """Fail before round 1 when the federation cannot run the defense; returns the clients sampled
    per round (at most ``num_nodes``)."""
    defense = settings.defense
    minimum = defense.secagg_min_clients if defense.secagg else 1
    sampled = sample_size(num_nodes, settings.fraction_train, minimum)  # what the strategies sample per round
    defense.check_clients(sampled)
    return sampled


def build_strategy(settings: RunSettings, run_dir, num_nodes: int, initial_state: dict, round_offset: int = 0):
    """(the strategy that runs, the leakage-tracking strategy inside it). Its settings carry the
    federation's ``num_nodes`` as num_partitions (the Flower partitioners' ground truth)."""
    settings = settings.with_partitions(num_nodes)
    test_set = settings.server_test_set()
    defense = settings.defense
    min_evaluate = 1 if settings.fraction_evaluate > 0 else 0
    clients_per_round = check_defense(settings, num_nodes)
    privacy = privacy_ledger(settings, num_nodes)
    tracking = {"clients_per_round": clients_per_round, "test_set": test_set, "privacy": privacy}
    if defense.secagg:
        strategy = SecAggLeakageFedAvg(
            settings,
            run_dir,
            initial_state,
            **tracking,
            fraction_fit=settings.fraction_train,
            fraction_evaluate=settings.fraction_evaluate,
            min_fit_clients=defense.secagg_min_clients,
            min_evaluate_clients=min_evaluate,
            min_available_clients=defense.secagg_min_clients,
        )
        return strategy, strategy
    strategy = LeakageFedAvg(
        settings,
        run_dir,
        round_offset=round_offset,
        **tracking,
        fraction_train=settings.fraction_train,
        fraction_evaluate=settings.fraction_evaluate,
        min_train_nodes=1,
        min_evaluate_nodes=min_evaluate,
        min_available_nodes=1,
    )
    if not defense.central_dp:
        return strategy, strategy
    wrapper = (
        DifferentialPrivacyServerSideFixedClipping
        if defense.clipping == "server"
        else DifferentialPrivacyClientSideFixedClipping
    )
    return wrapper(
        strategy,
        noise_multiplier=defense.noise_multiplier,
        clipping_norm=defense.clip_norm,
        num_sampled_clients=clients_per_round,
    ), strategy


@app.main()
def main(grid: Grid, context: Context) -> None:
    main_started = time.time()  # epoch seconds: the launcher subtracts its own launch time
    settings = RunSettings.from_run_config(context.run_config)
    settings.check_device()
    num_nodes = len(list(grid.get_node_ids()))
    settings = settings.with_partitions(num_nodes)  # what the Flower partitioners cut the data by
    settings.check_partitions(num_nodes)
    settings.check_nodes(num_nodes)  # attack-clients ids must be < the federation's node count
    check_defense(settings, num_nodes)
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
        run_dir, done, state = run_folder(settings), 0, settings.new_model(seed=settings.seed).state_dict()
        write_run_config(run_dir, settings, run_config, num_nodes)
    config_seconds = time.perf_counter() - clock
    print(f"fl-attack: leakage record in {run_dir}", flush=True)
    if done:
        print(f"fl-attack: resuming after round {done} of {settings.num_server_rounds}", flush=True)

    runner, strategy = build_strategy(settings, run_dir, num_nodes, state, round_offset=done)
    if done:
        strategy.folder.event(f"resumed after round {done}: rounds {done + 1}..{settings.num_server_rounds} follow")
    started = time.time()
    try:
        if settings.defense.secagg:
            run_secagg(grid, context, strategy, settings)
        else:
            runner.start(
                grid=grid,
                initial_arrays=ArrayRecord(state),
                num_rounds=settings.num_server_rounds - done,
                train_config=ConfigRecord({}),
                evaluate_fn=strategy.evaluate_global,
            )
    finally:
        rounds_finished = time.time()
        # Ray shuts down when main() returns: collect every attack first.
        waves = math.ceil(strategy.attacks_pending / max(1, settings.attack_actors))
        counts = strategy.finish(timeout=settings.attack_timeout * waves + 60)
        strategy.timings.add("writing", config_seconds)
        # Where the time went (fl_attack/timings.py); the launcher adds its own clock and prints it.
        timings = {
            **strategy.timing_record(),
            "main_started": main_started,
            "rounds_finished": rounds_finished,
            "main_finished": time.time(),
        }
        try:  # the shutdown path must not fail on the error that may have brought it here
            run_dir.write_summary(
                {
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "seconds": round(time.time() - started, 1),
                    **counts,
                    "resumed_after_round": done or None,
                    "drain_seconds": round(time.time() - rounds_finished, 1),
                    "cuda": torch.cuda.is_available(),
                    "timings": timings,
                },
            )
        except OSError as exc:
            print(f"fl-attack: error: could not write {run_dir.summary_file}: {exc}", flush=True)
    print(f"fl-attack: {counts['attacks_ok']}/{counts['attacks']} attacks succeeded; results in {run_dir}", flush=True)
    if counts["writes_refused"] or counts["attacks_unwritten"]:
        print(f"fl-attack: error: the disk refused part of the record: {incomplete(counts)}", flush=True)


def incomplete(counts: dict) -> str:
    """What of a run's record the disk refused (summary.json's counts), in words."""
    refused = counts.get("writes_refused") or {}
    what = {"rounds": "rounds.csv rows", "checkpoints": "checkpoints", "updates": "recorded updates"}
    what["memory"] = "the attack memory (memory.pt)"
    parts = [f"{what[k]} of round(s) {','.join(map(str, sorted(set(v))))}" for k, v in refused.items()]
    if counts.get("attacks_unwritten"):
        parts.append(f"{counts['attacks_unwritten']} attacks.csv row(s) (kept in unwritten-*.pt)")
    return "; ".join(parts) + " (see events.log): the run may not resume or replay in full"
