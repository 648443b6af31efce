"""The evaluator: every driver's one scorer of attack outcomes against the ground truth.

The federation (strategies/), ``fl-attack replay``, ``fl-attack attack`` and the paper experiments
all hand an ``AttackOutcome`` (fl_attack.attacker.runtime.workers) and the victim's truth to ``Evaluator.record``,
which scores it and returns THE row (``attack_row``: the columns of attacks.csv, defined once in
``fl_attack.schema.ATTACK_SCHEMA`` with where each value comes from; ``results_row`` selects
``RESULT_COLUMNS`` of it, under the same names, for results.csv and the experiments' CSVs).

* ``score``: PSNR after Hungarian matching, SSIM, FSIM, LPIPS-alex (one network, loaded once) and
  label-count accuracy;
  ``psnr_trace``: the evaluator's PSNR in an in-process attack's trace.
* the verdict (``fl_attack.evaluation.verdict``, when the evaluator is given one): how many of the client's
  images were recovered, singled out and recognized, against the best guess without the update; and,
  beside each grid, the evidence picture of a few singled-out images (``Verdict.evidence``).

The attacker never sees anything here; scoring happens after the attack.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from fl_attack.evaluation.images import save_comparison_grid, save_evidence
from fl_attack.evaluation.metrics import evaluate_reconstruction, get_lpips, match_pairs, psnr
from fl_attack.evaluation.verdict import Verdict
from fl_attack.federation.data import get_spec
from fl_attack.schema import (
    ATTACK_COLUMNS,
    ATTACK_SCHEMA,
    OUTCOME,
    RESULT_COLUMNS,
    SCORE,
    TARGET,
    VERDICT,
    attack_columns,
    evidence_path,
)

log = logging.getLogger(__name__)

__all__ = ["Evaluator", "score", "psnr_trace", "attack_row", "RESULT_COLUMNS", "results_row"]

_SCORES = attack_columns(SCORE)  # psnr, ssim, fsim, lpips, label_accuracy: ``score``'s
_VERDICT = attack_columns(VERDICT)  # the verdict's (fl_attack.evaluation.verdict.VERDICT_COLUMNS)


# ----------------------------------------------------------------------------------- scoring


def score(images: torch.Tensor, labels, truth_images: torch.Tensor, truth_labels, dataset: str) -> dict:
    """Score a reconstruction against the ground truth, on Hungarian-matched pairs.

    images, truth_images: (N,C,H,W) in [0,1]; labels, truth_labels: (N,) class ids (order irrelevant).
    Returns ``fl_attack.evaluation.metrics.evaluate_reconstruction``'s dict: psnr (dB), ssim, fsim, lpips (the
    shared CPU LPIPS-alex network, loaded once per process), label_accuracy in [0,1], psnr_recovered in
    [0,1] (Dimitrov et al.'s share above the dataset's ``psnr_recovered_db``), per_image,
    matching, matched_recon. Raises TypeError / ValueError for malformed inputs.
    """
    spec = get_spec(dataset)
    return evaluate_reconstruction(
        images,
        truth_images,
        recon_labels=labels,
        true_labels=truth_labels,
        num_classes=spec.num_classes,
        lpips=get_lpips("cpu"),
        psnr_recovered_db=spec.psnr_recovered_db,
    )


def psnr_trace(truth: torch.Tensor) -> Callable[[int, torch.Tensor], dict]:
    """A ``reconstruct`` callback: the matched-pair mean PSNR of the current images, for the trace.
    The evaluator's view during the attack; nothing goes back to the attacker."""

    def callback(iteration: int, images: torch.Tensor) -> dict:
        recon_idx, _ = match_pairs(images, truth)
        return {"psnr": float(psnr(images[torch.as_tensor(recon_idx)], truth).double().mean())}

    return callback


# -------------------------------------------------------------------------------------- rows


# attack_row's columns that a row must be given, and every column's default, in order (ATTACK_SCHEMA's).
_REQUIRED = tuple(c.name for c in ATTACK_SCHEMA if c.required)
_DEFAULTS = {c.name: c.default for c in ATTACK_SCHEMA}
# (column, TARGET or OUTCOME, the attribute) of the columns ``record`` reads off the outcome and its target.
_CARRIED = tuple((c.name, c.source, c.attribute or c.name) for c in ATTACK_SCHEMA if c.source in (TARGET, OUTCOME))


def attack_row(*, scores: dict | None = None, **columns) -> dict:
    """One attack's row, with exactly the columns ``ATTACK_COLUMNS`` (attacks.csv; each column's
    meaning and type in ``fl_attack.schema.ATTACKS``), in their order.

    columns: values by column name; method, dataset, local_steps, gradients_per_iteration
    (``Attack.gradients_per_iteration``),
    iterations, labels ("recovered" or "oracle"), partition_id and label_estimator are required, the
    others default to "" / "none" (defense) / "ok" (status) / NaN (lsim_*, attack_seconds) / None (an
    empty cell: round, node_id, lag_rounds, threads, epsilon without DP, parameters, unknowns).
    scores: ``score``'s dict (psnr in dB, ssim, fsim, lpips, label_accuracy) and the verdict's columns
    (``fl_attack.evaluation.verdict.VERDICT_COLUMNS``) where judged; None leaves the metrics NaN and the verdict
    empty (a failed attack). Raises TypeError for a name that is not a column or a missing required one.
    """
    unknown = sorted(columns.keys() - set(ATTACK_COLUMNS) | columns.keys() & set(_SCORES + _VERDICT))
    missing = [c for c in _REQUIRED if c not in columns]
    if unknown or missing:
        raise TypeError(f"attack_row: not a column {unknown}, missing {missing}")
    row = dict(_DEFAULTS)
    row.update(columns, **{m: float((scores or {}).get(m, math.nan)) for m in _SCORES})
    row.update({c: (scores or {}).get(c) for c in _VERDICT})
    return row


def results_row(row: dict, columns=RESULT_COLUMNS) -> dict:
    """An ``attack_row`` as a results.csv row (fl-attack attack, the experiments): only ``columns``
    (``fl_attack.schema.RESULT_COLUMNS``: attacks.csv's names) are kept, in their order."""
    return {c: row.get(c) for c in columns}


# ------------------------------------------------------------------------------- the evaluator


class Evaluator:
    """Scores attack outcomes against their ground truth, one row each (``attack_row``).

    dataset, defense: the rows' (the run's dataset and defense label). folder: where the image
    grids go (``folder``/``image``), None for none. table: a function that stores each row (e.g.
    appends it to attacks.csv), called after scoring; an OSError from it propagates (the caller keeps
    the outcome and tries again) and nothing else escapes ``record``. timings: an object with
    ``measure(phase)`` (fl_attack.audit.timings.Timings) for the scoring, images and writing phases.
    verdict: the run's ``fl_attack.evaluation.verdict.Verdict`` (its public pool, distractors and reader), which
    adds the verdict's columns to every scored row; None leaves them empty.
    """

    def __init__(
        self,
        dataset: str,
        *,
        defense: str = "none",
        folder: str | Path | None = None,
        table: Callable[[dict], None] | None = None,
        grid_columns: int = 16,
        timings=None,
        verdict: Verdict | None = None,
    ):
        self.dataset, self.defense = get_spec(dataset).name, defense
        self.folder = Path(folder) if folder is not None else None
        self.table, self.grid_columns, self.timings = table, grid_columns, timings
        if verdict is not None and verdict.dataset != self.dataset:
            raise ValueError(f"the verdict is for {verdict.dataset}, the evaluator for {self.dataset}")
        self.verdict = verdict

    def _save(self, recon, truth, target, method: str, image, row: dict) -> None:
        """The row's image grid (originals over their matched reconstructions, or the
        reconstructions alone without a truth) under ``folder``; its path goes in ``row``. With a
        truth and a verdict, the evidence picture beside it (``_save_evidence``)."""
        if self.folder is None:
            return
        if image is None:
            image = Path("images") / f"round-{target.round}" / method / f"{target.name}.png"
        with self._measure("images"):  # one attack's pictures
            save_comparison_grid(truth, recon, self.folder / image, columns=self.grid_columns)
            if truth is not None:
                self._save_evidence(recon, truth, self.folder / evidence_path(image))
        row["image"] = Path(image).as_posix()

    def _save_evidence(self, matched: torch.Tensor, truth: torch.Tensor, path: Path) -> None:
        """The evidence picture at ``path`` (beside the grid: ``evidence_path``): a few singled-out images
        of ``matched`` (k,C,H,W) in [0,1], lined up with ``truth``, each beside its own original and the
        nearest other candidate, with their 1 - SSIM (``Verdict.evidence``). Nothing without a verdict,
        and no picture (a stale one removed) when no image is singled out. A failure is logged and the
        row kept as it is: the evidence is for reading, the row's numbers do not depend on it."""
        if self.verdict is None:
            return
        try:
            truth = truth.detach().float().cpu()
            candidates = self.verdict.candidates(truth)
            found = self.verdict.evidence(matched, truth, candidates)
            if not found:
                path.unlink(missing_ok=True)
                return
            pick = torch.tensor([e["index"] for e in found])
            captions = [
                (
                    f"image {e['index']} (margin {e['margin']:.3f})",
                    f"1 - SSIM {e['own']:.3f}",
                    f"{e['nearest_kind']} {e['nearest']}: 1 - SSIM {e['nearest_distance']:.3f}",
                )
                for e in found
            ]
            nearest = candidates[torch.tensor([e["nearest"] for e in found])]
            save_evidence(matched.detach().cpu()[pick], truth[pick], nearest, captions, path)
        except Exception:
            log.warning("evaluator: the evidence picture %s could not be drawn", path, exc_info=True)

    def _measure(self, phase: str):
        return self.timings.measure(phase) if self.timings is not None else nullcontext()

    def record(
        self,
        outcome,
        truth: tuple[torch.Tensor, torch.Tensor] | None,
        *,
        lag_rounds: int | None = None,
        image: str | Path | None = None,
        epsilon: float | None = None,
    ) -> dict:
        """Score ``outcome`` (if it succeeded) against ``truth`` = (images (N,C,H,W) in [0,1],
        labels (N,)) and store its row; returns the row. truth None: the row of a successful
        attack is stored unscored (an audit without the ground truth), its grid the reconstructions.

        image: the grid's path under ``folder`` (default images/round-R/METHOD/NAME.png); with a
        verdict, the evidence picture goes beside it (``evidence_path``: NAME-evidence.png). A scoring
        or grid failure makes the row status "failed" with the cause ("evaluation: ..."), an evidence
        failure is only logged; it never raises, except an OSError from ``table``. lag_rounds: how
        many rounds after its own the attack finished (the federation's attacker lag). epsilon: the
        DP budget the attacked client(s) had spent by the update's round (None without DP)."""
        target = outcome.target
        carried = {name: getattr(target if source == TARGET else outcome, at) for name, source, at in _CARRIED}
        seconds = carried["attack_seconds"]
        carried["attack_seconds"] = round(seconds, 3) if math.isfinite(seconds) else math.nan  # to the ms
        row = attack_row(dataset=self.dataset, defense=self.defense, lag_rounds=lag_rounds, epsilon=epsilon, **carried)
        if outcome.status == "ok" and truth is None:  # an audit without the ground truth: kept, unscored
            try:
                self._save(outcome.images.detach().cpu(), None, target, outcome.method, image, row)
            except Exception as exc:
                row.update(status="failed", error=f"images: {type(exc).__name__}: {exc}")
        elif outcome.status == "ok":
            try:
                with self._measure("scoring"):
                    scores = score(outcome.images, outcome.labels, *truth, self.dataset)
                    if self.verdict is not None:
                        judged = self.verdict.score(
                            scores["matched_recon"],
                            outcome.labels,
                            *truth,
                            psnr=scores["psnr"],
                            lpips=get_lpips("cpu"),
                            client_id=target.client_id,
                            snapshots=outcome.snapshots,
                            iterations=outcome.iterations,
                            start=outcome.start_images,
                        )
                        scores.update(judged)
                row.update({m: float(scores[m]) for m in _SCORES})
                row.update({c: scores.get(c) for c in _VERDICT})
                self._save(scores["matched_recon"].cpu(), truth[0], target, outcome.method, image, row)
            except Exception as exc:  # a scoring bug must not lose the run either
                row.update(status="failed", error=f"evaluation: {type(exc).__name__}: {exc}")
        if self.table is not None:
            with self._measure("writing"):
                self.table(row)
        return row
