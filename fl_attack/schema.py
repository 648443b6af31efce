"""The run record's schema: which files a run folder holds, and the typed columns of its CSVs.

Each file, and what it holds, is in ``FOLDER_FILES``; docs/run-folder.md is generated from it and from the
row schemas (python -m analysis.docs run-folder). The folder itself is read and written by
fl_attack.audit.run_folder (``RunFolder``).

Each CSV's columns are defined once, in ``ROUND_SCHEMA`` (rounds.csv) and ``ATTACK_SCHEMA`` (attacks.csv:
the one vocabulary of an attack's result; the attacker's ``AttackOutcome``, the evaluator's row, the
report and analysis/ use its names): each ``Column`` with its type, its meaning and, for attacks.csv,
where its value comes from. The writers (fl_attack.audit.service, fl_attack.audit.replay, the evaluator
fl_attack.evaluation.evaluator) and the reader (analysis/load.py) share the views ``ROUNDS`` / ``ATTACKS``
(column -> type) and ``ROUND_COLUMNS`` / ``ATTACK_COLUMNS``. New columns go at the end, except in
attacks.csv where "image" stays last: the reader spots a cut-off last line by its image path. At the
bottom of the layers (pyproject.toml's import-linter contracts), beside fl_attack.records, so that the
server's service and the evaluator, which may not import it, share one schema. No torch at import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Column:
    """One column of a run folder's CSV, defined once: its name, how it is read, what it holds and,
    for attacks.csv, where its value comes from.

    name: the header's. kind: int, float or str (analysis/load.py reads the first two as numbers; node_id
    and client_id are text: Flower node ids are 64-bit and would lose digits as floats). doc: what it
    holds, one line (docs/run-folder.md is made from it). source (attacks.csv): who gives an attack
    row the value (``fl_attack.evaluation.evaluator.attack_row`` / ``Evaluator.record``): ``TARGET`` (the
    ``AttackTarget``'s attribute), ``OUTCOME`` (the ``AttackOutcome``'s field), ``SCORE`` (the evaluator's
    metrics), ``VERDICT`` (``fl_attack.evaluation.verdict.VERDICT_COLUMNS``) or ``EVALUATOR`` (the evaluator
    or its caller). attribute: the name of that attribute or field where it is not the column's own.
    default: the value of a row not given it (None: an empty cell). required: ``attack_row`` refuses
    a row without it.
    """

    name: str
    kind: type
    doc: str
    source: str = ""
    default: object = None
    required: bool = False
    attribute: str = ""


TARGET, OUTCOME, SCORE, VERDICT, EVALUATOR = "target", "outcome", "score", "verdict", "evaluator"
NAN = math.nan
# New columns go at the end, except in attacks.csv where "image" stays last (see the module's docstring).
ROUND_SCHEMA: tuple[Column, ...] = (
    Column("round", int, "the server round, 1..num-server-rounds"),
    Column("clients", int, "the updates the round's aggregate was made from"),
    Column("train_loss", float, "the clients' mean training loss (empty when they report none)"),
    Column("eval_loss", float, "the clients' federated evaluation of the round's global model: loss"),
    Column("eval_accuracy", float, "... accuracy"),
    Column("attacks_in_flight", int, "attacks dispatched and not yet finished at the round's end"),
    Column("seconds", float, "the round's wall time, from configure to its row"),
    Column(
        "global_loss",
        float,
        "the server's evaluation of the global model on its held-out set (server-test-samples): loss",
    ),
    Column("global_accuracy", float, "... accuracy"),
    Column("attack_lag_rounds", int, "how many rounds the attacker is behind the federation at the round's end"),
    Column("attacks_dispatched", int, "attacks (client x method) the round sent to the attacker"),
    Column(
        "attacks_skipped", int, "attacks the round left out (attack-budget, attack-max-backlog; events.log says why)"
    ),
    Column("excluded", str, '"1,3": the partitions left out of the round (a non-finite update)'),
    Column("participants", str, '"0,1,2": the partitions whose updates the round received'),
    Column(
        "epsilon",
        float,
        "DP budget spent by the round (fl_attack.privacy): the most any client spent; empty without DP",
    ),
    Column("epsilon_tracked", str, '"0:1.2;1:0.9": each tracked client\'s (attack-clients ids) under local-dp'),
)
ATTACK_SCHEMA: tuple[Column, ...] = (
    Column("round", int, "the round whose update was attacked", TARGET),
    Column("node_id", str, "the client's Flower node id (64-bit, kept as text)", TARGET),
    Column(
        "partition_id", int, "the client's data partition (empty for an aggregate under secagg)", TARGET, required=True
    ),
    Column(
        "client_id", str, "the client's name in the data (a FEMNIST writer), or the aggregate's", TARGET, default=""
    ),
    Column(
        "method",
        str,
        'the attack (pisme, nlsme, sme, ig, ...; "METHOD+memory" for a remembering server\'s row)',
        OUTCOME,
        required=True,
    ),
    Column("dataset", str, "femnist or cifar100", EVALUATOR, required=True),
    Column(
        "defense",
        str,
        'the defense\'s label, e.g. "topk(0.1)+local-dp(C=0.05,eps=10)"; "none"',
        EVALUATOR,
        default="none",
    ),
    Column(
        "local_steps",
        int,
        "the client's local steps (epochs x batches): the update's steps the attack models",
        OUTCOME,
        required=True,
    ),
    Column(
        "gradients_per_iteration",
        float,
        "gradient evaluations per iteration (Attack.gradients_per_iteration): PI-SME's m (attack-nodes), "
        "pisme-adaptive's mean m, dimitrov's unrolled steps, 1 for the others; \"nodes\" in older records",
        OUTCOME,
        required=True,
    ),
    Column("iterations", int, "the attack's iterations", OUTCOME, required=True),
    Column(
        "labels",
        str,
        "where the attack's labels came from: recovered (from the update) or oracle",
        OUTCOME,
        required=True,
        attribute="label_source",  # AttackOutcome.labels is the label tensor
    ),
    Column("psnr", float, "PSNR (dB) of the matched reconstruction against the originals", SCORE, default=NAN),
    Column("ssim", float, "SSIM, matched", SCORE, default=NAN),
    Column("fsim", float, "FSIM, matched", SCORE, default=NAN),
    Column("lpips", float, "LPIPS, matched (lower is closer)", SCORE, default=NAN),
    Column(
        "lsim_honest",
        float,
        "the attack's final gradient-matching loss Lsim, as the server can compute it",
        OUTCOME,
        default=NAN,
    ),
    Column("lsim_calibrated", float, "... with the attack's calibrated scale", OUTCOME, default=NAN),
    Column("label_accuracy", float, "the fraction of the client's labels the attack got right", SCORE, default=NAN),
    Column("attack_seconds", float, "the attack's wall time", OUTCOME, default=NAN),
    Column("status", str, "ok or failed", OUTCOME, default="ok"),
    Column("error", str, "why a failed attack failed (an exception, a time-out, a NaN update)", OUTCOME, default=""),
    Column(
        "label_estimator",
        str,
        "the AttackConfig's, recorded even with oracle labels (where it is unused)",
        OUTCOME,
        required=True,
    ),
    Column(
        "lag_rounds",
        int,
        "how many rounds after its own the attack finished (the federation's attacker lag)",
        EVALUATOR,
    ),
    Column(
        "worker_node", str, "where the attack ran (fl_attack.attacker.runtime.workers.where_am_i)", OUTCOME, default=""
    ),
    Column("worker_id", str, "the worker that ran it", OUTCOME, default=""),
    Column("device", str, "the torch device it ran on (cpu, cuda); empty where unknown", OUTCOME, default=""),
    Column(
        "precision",
        str,
        'the attack\'s arithmetic as it ran (fp32, bf16, tf32: "auto" resolved); empty in older runs',
        OUTCOME,
        default="",
    ),
    Column(
        "compile",
        str,
        'how its steps ran: compiled, eager, "eager (<why>)" (attacker/attacks/compiled.py); empty: older',
        OUTCOME,
        default="",
    ),
    Column(
        "batch",
        int,
        "the attacks run as one reconstruct_batch with it (1: alone; attack-batch); empty in older runs",
        OUTCOME,
    ),
    Column("threads", int, "the attack's torch threads: what reproduces its numbers exactly", OUTCOME),
    Column(
        "memory",
        str,
        'a "+memory" row\'s attack memory (labels, keep, joint; fl_attack.attacker.memory), else empty',
        OUTCOME,
        default="",
    ),
    Column(
        "epsilon",
        float,
        "the DP budget the attacked client(s) had spent by the update's round; empty without DP",
        EVALUATOR,
    ),
    Column("parameters", int, "the update's floating-point entries: the equations the attack has", OUTCOME),
    Column("unknowns", int, "the client's pixels k*C*H*W: what it must recover", OUTCOME),
    Column("optimizer", str, 'the client\'s optimizer, e.g. "momentum 0.9, weight decay 0.0005"', OUTCOME, default=""),
    # The verdict (fl_attack.evaluation.verdict, docs/verdict.md); empty for a failed attack or an older run.
    Column("k", int, "the client's images (the attacked samples)", VERDICT),
    Column("recovered", int, "of the k: singled out and read by the reader as their original is", VERDICT),
    Column("recovered_low", int, "its exact 95% interval over the k images (Clopper-Pearson), low end", VERDICT),
    Column("recovered_high", int, "... high end", VERDICT),
    Column("guess_recovered", int, "the same count for the best guess without the update (the floor)", VERDICT),
    Column("reidentified", float, "the fraction singled out: own original nearest among k + D candidates", VERDICT),
    Column(
        "reid_chance",
        float,
        "update-free outputs' rate under the same matching (the largest of the four below)",
        VERDICT,
    ),
    Column("reid_noise", float, "the attacks' N(0, I) starts, matched and ranked like the attack", VERDICT),
    Column("reid_chance_matched", float, "k / (k + D): an output exchangeable with the candidates", VERDICT),
    Column("reid_chance_labels", float, "a random candidate of each recovered label's class", VERDICT),
    Column(
        "reid_chance_uniform", float, "1 / (k + D): a random ranking's, before the matching (not the chance)", VERDICT
    ),
    Column("guess_reidentified", float, "the best guess's fraction singled out (the floor)", VERDICT),
    Column("recognized", float, "the fraction the reader classifies as their original's true class", VERDICT),
    Column("recognized_low", float, "its exact 95% interval, low end", VERDICT),
    Column("recognized_high", float, "... high end", VERDICT),
    Column("recognized_truth", float, "the reader's accuracy on the originals (the ceiling)", VERDICT),
    Column("recognized_guess", float, "... on the best guess (the floor)", VERDICT),
    Column("guess_psnr", float, "the best update-free guess's matched PSNR (dB): the floor", VERDICT),
    Column("guess_ssim", float, "... its SSIM", VERDICT),
    Column("guess_lpips", float, "... its LPIPS", VERDICT),
    Column("psnr_margin", float, "psnr - guess_psnr (dB): above the floor when positive", VERDICT),
    Column("guesses", str, "JSON: each guess's reidentified, recognized, recovered, psnr, ssim, lpips", VERDICT),
    Column(
        "recovered_curve",
        str,
        "JSON {iteration: recovered}: the count at the attack's snapshots (1/4, 1/2) and at the whole budget",
        VERDICT,
        default="",
    ),
    Column(
        "count_trend",
        str,
        '"still rising" (the count rose after the last snapshot: a lower bound) or "converged"; empty: no snapshots',
        VERDICT,
        default="",
    ),
    Column(
        "lr_schedule",
        str,
        "X_hat's learning-rate schedule as it ran (steps, plateau, constant, cosine; attack-lr-schedule or the "
        "audit's rule); empty in older runs",
        OUTCOME,
        default="",
    ),
    Column(
        "psnr_recovered",
        float,
        "Dimitrov et al.'s metric: the share of the k images whose PSNR-maximising match is above the "
        "dataset's delta (20 dB FEMNIST, 19 dB CIFAR-100); lenient on FEMNIST's white pages, read beside the verdict",
        SCORE,
        default=NAN,
    ),
    Column(
        "guess_psnr_recovered",
        float,
        "psnr_recovered of the best update-free guess (its null: about a fifth on FEMNIST without any update)",
        VERDICT,
    ),
    Column("image", str, "the grid's path relative to the run folder (stays the last column)", EVALUATOR, default=""),
)

# The views the writers and readers use: column -> type, column -> meaning, the columns in order.
ROUNDS: dict[str, type] = {c.name: c.kind for c in ROUND_SCHEMA}
ATTACKS: dict[str, type] = {c.name: c.kind for c in ATTACK_SCHEMA}
ROUND_DESCRIPTIONS: dict[str, str] = {c.name: c.doc for c in ROUND_SCHEMA}
ATTACK_DESCRIPTIONS: dict[str, str] = {c.name: c.doc for c in ATTACK_SCHEMA}
ROUND_COLUMNS, ATTACK_COLUMNS = list(ROUNDS), list(ATTACKS)
# results.csv (fl-attack attack) and the experiments' attack rows (fl_attack.evaluation.evaluator.results_row): these
# attacks.csv columns, under their own names, in this order.
RESULT_COLUMNS: tuple[str, ...] = (
    *("dataset", "partition_id", "method", "local_steps", "gradients_per_iteration", "iterations", "labels"),
    *("psnr", "ssim", "fsim", "lpips", "lsim_honest", "lsim_calibrated", "label_accuracy", "attack_seconds"),
    *(c.name for c in ATTACK_SCHEMA if c.source == VERDICT),
    *("psnr_recovered", "lr_schedule"),
)
# Former names of today's columns in committed records, read as today's at read time (``fl_attack.records.read_csv``
# with ``former``; never rewritten in the records): results.csv and the experiments' CSVs named partition_id
# "client" and attack_seconds "seconds"; attacks.csv, results.csv and the experiments' CSVs named
# gradients_per_iteration "nodes" (which the run config's attack-nodes, m, still is).
FORMER_NAMES: dict[str, str] = {
    "client": "partition_id",
    "seconds": "attack_seconds",
    "nodes": "gradients_per_iteration",
}


def attack_columns(source: str) -> tuple[str, ...]:
    """The attacks.csv columns whose value comes from ``source`` (``TARGET``, ``OUTCOME``, ``SCORE``,
    ``VERDICT`` or ``EVALUATOR``), in their order."""
    return tuple(c.name for c in ATTACK_SCHEMA if c.source == source)


# Every file of a run folder -> what it holds (RunFolder's paths; docs/run-folder.md is made from it).
FOLDER_FILES: dict[str, str] = {
    "config.json": "the full run config, the AttackConfig, the defense, versions and seed (and each resume); "
    "`privacy`: the DP accountant and its parameters; `verdict`: how the verdict was scored (``write_config``)",
    "events.log": "one timestamped line per event: each round's start and end, what was attacked or skipped and "
    "why, the backlog and lag, excluded updates, resumes (``event``)",
    "rounds.csv": "one row per finished round (``ROUNDS``, columns below)",
    "attacks.csv": "one row per attack, the leakage record and the verdict (``ATTACKS``, columns below; "
    "fl_attack.evaluation.evaluator.attack_row)",
    "images/round-R/METHOD/client-P.png": "every original over its matched reconstruction, in bands of 16 pairs",
    "images/round-R/METHOD/client-P-evidence.png": "a few singled-out images: the reconstruction, its own original "
    "and the nearest other candidate, with their 1 - SSIM (``evidence_path``; docs/verdict.md)",
    "updates/index.csv": "one line per recorded update, with record-updates=true: whose it is and the SHA-256 of "
    "its files (columns below; fl_attack.federation.update)",
    "updates/round-R/w0.pt": "round R's global weights w0, written once per round and shared by its updates",
    "updates/round-R/NAME.pt": "an attacked update's wT, its public training metadata and its target: what the "
    "attacker observed, never data (`fl-attack replay` attacks it again)",
    "checkpoint.pt": "the last finished round's global model, written atomically after its rounds.csv row, for "
    "resume (``save_checkpoint``)",
    "memory.pt": "the server's attack memory of its tracked clients, with attack-memory on (fl_attack.attacker.memory)",
    "summary.json": "written at the end: attack counts, wall time, the final drain's seconds, `timings` (where the "
    "time went), `verdict` (each attack's verdict and the lines the launcher prints) and `writes_refused` (rounds "
    "whose row, checkpoint or update the disk refused) (``write_summary``)",
    "replays/NAME/": "the record of a `fl-attack replay` of this run, a run folder of its own",
    "report/": "`python -m analysis.report RUN --out RUN/report` (make demo): report.html and its tables",
}
RUN_FILES = ("config.json", "rounds.csv", "attacks.csv", "events.log")  # any of them: the folder holds a run


def numeric(schema: dict[str, type]) -> list[str]:
    """The columns of ``schema`` read as numbers."""
    return [c for c, kind in schema.items() if kind is not str]


def percent(x: float) -> str:
    """A fraction in [0,1] as a reader's percentage: "28%", "0.049%" below 1%, "n/a" when not a number."""
    if not math.isfinite(x):
        return "n/a"
    return f"{100 * x:.0f}%" if x >= 0.01 or x == 0 else f"{100 * x:.2g}%"


def whose(row) -> str:
    """An attack row's target in words (a dict or a pandas row): "partition P", or for an aggregate
    (SecAgg+; its partition_id empty or NaN) its client_id."""
    pid = row.get("partition_id")
    if pid is None or pid == "" or (isinstance(pid, float) and math.isnan(pid)):
        return str(row.get("client_id") or "the aggregate")
    return f"partition {int(pid)}"


def evidence_path(image: str | Path) -> Path:
    """The evidence picture beside a row's grid (its ``image``, relative to the run folder):
    images/round-R/METHOD/NAME.png -> images/round-R/METHOD/NAME-evidence.png (fl_attack.evaluation.images
    .save_evidence; drawn by the evaluator when the verdict singles some image out)."""
    image = Path(image)
    return image.with_name(f"{image.stem}-evidence.png")
