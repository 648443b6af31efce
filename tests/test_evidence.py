"""The verdict's evidence on real bundled clients with fixed seeds: ``Verdict.evidence`` (which singled-out
images, their own original's distance and the nearest other candidate's) and the evaluator's picture of
it beside each grid (images/round-R/METHOD/NAME-evidence.png).

Distances and nearest candidates are checked against a brute-force loop over ``piq.ssim``, one call per
reconstruction, that imports nothing it checks.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import piq
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image

from fl_attack.attacker.api import Reconstruction
from fl_attack.attacker.runtime.workers import AttackOutcome
from fl_attack.evaluation.evaluator import Evaluator
from fl_attack.evaluation.verdict import Verdict
from fl_attack.federation.data import client_partition, load_bundled, server_test_set
from fl_attack.federation.update import AttackTarget
from fl_attack.schema import ATTACK_COLUMNS

K = {"femnist": 32, "cifar100": 20}
HELD_OUT = 1000  # the federation's server-test-samples default: the public pool
D = 300  # distractors: fewer than the default 2,000, so that the brute force stays within seconds


def _client(dataset: str, partition: int):
    pool = load_bundled(dataset)
    held = HELD_OUT if dataset == "cifar100" else 0
    return client_partition(pool, partition, K[dataset], seed=0, held_out=held).train


def _verdict(dataset: str) -> Verdict:
    public = server_test_set(load_bundled(dataset), HELD_OUT, seed=0)
    return Verdict.from_data(dataset, seed=0, public=(public.images, public.labels), num_distractors=D)


@pytest.fixture(scope="module", params=["femnist", "cifar100"])
def setup(request):
    return request.param, _verdict(request.param)


def _brute_force(matched: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """(k, N) 1 - SSIM, piq.ssim of each reconstruction against every candidate (float32, as the
    ranking: piq in float64 takes minutes on 2 cores; tests/test_verdict.py holds the two to 1e-10)."""
    c = candidates.float()
    return torch.stack([1 - piq.ssim(x.float().expand_as(c), c, data_range=1.0, reduction="none") for x in matched])


def test_the_originals_themselves_are_at_distance_zero_and_their_nearest_other_is_farther(setup):
    dataset, verdict = setup
    truth = _client(dataset, 0).images
    k = len(truth)
    found = verdict.evidence(truth, truth, n=k)
    assert sorted(e["index"] for e in found) == list(range(k))  # every original singles itself out
    for e in found:
        assert e["own"] == pytest.approx(0.0, abs=1e-5)
        assert e["nearest"] != e["index"] and e["nearest_distance"] > 0.01
        assert e["nearest_kind"] == ("original" if e["nearest"] < k else "distractor")
        assert e["margin"] == pytest.approx(e["nearest_distance"] - e["own"])
    assert [e["margin"] for e in found] == sorted((e["margin"] for e in found), reverse=True)


def test_the_evidence_is_singled_out_images_with_their_true_nearest_other_candidate(setup):
    dataset, verdict = setup
    truth = _client(dataset, 1).images[:12]  # k = 12: the brute force below costs k piq calls
    k = len(truth)
    gen = torch.Generator().manual_seed(0)
    matched = (truth + 0.2 * torch.randn(truth.shape, generator=gen)).clamp(0, 1)
    matched[8:] = torch.rand(matched[8:].shape, generator=gen)  # 4 carry nothing of their original
    candidates = verdict.candidates(truth)
    found = verdict.evidence(matched, truth, candidates, n=4)
    assert len(candidates) == k + D

    d = _brute_force(matched, candidates)
    own = d[torch.arange(k), torch.arange(k)]
    others = d.clone()
    others[torch.arange(k), torch.arange(k)] = math.inf
    nearest_distance, nearest = others.min(1)
    singled = own <= nearest_distance
    assert int(singled.sum()) > 4  # enough for a choice among them
    assert len(found) == 4 and len({e["index"] for e in found}) == 4
    for e in found:
        j = e["index"]
        assert bool(singled[j])
        assert e["nearest"] == int(nearest[j])
        assert e["own"] == pytest.approx(float(own[j]), abs=1e-4)
        assert e["nearest_distance"] == pytest.approx(float(nearest_distance[j]), abs=1e-4)
        assert e["nearest_kind"] == ("original" if e["nearest"] < k else "distractor")
    # spread over the singled-out images by margin: the clearest case first, the closest call last
    margins = (nearest_distance - own)[singled]
    assert found[0]["margin"] == pytest.approx(float(margins.max()), abs=1e-4)
    assert found[-1]["margin"] == pytest.approx(float(margins.min()), abs=1e-4)
    assert [e["margin"] for e in found] == sorted((e["margin"] for e in found), reverse=True)


def test_no_evidence_when_each_reconstruction_is_another_original(setup):
    dataset, verdict = setup
    truth = _client(dataset, 0).images
    assert verdict.evidence(truth.roll(1, dims=0), truth) == []  # each ranks second behind the one it copies


def test_the_evidence_refuses_what_it_cannot_rank():
    verdict = _verdict("femnist")
    truth = _client("femnist", 0).images
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        verdict.evidence(truth, truth, n=-1)
    with pytest.raises(ValueError, match="one \\(k,C,H,W\\) shape"):
        verdict.evidence(truth[:3], truth)
    with pytest.raises(ValueError, match="start with the k originals"):
        verdict.evidence(truth, truth, verdict.candidates(truth).flip(0))


# ---------------------------------------------------------------- the evaluator's picture


def _cells(picture: np.ndarray, image: torch.Tensor, scale: int) -> list[tuple[int, int]]:
    """Top-left (y, x) of every exact copy in ``picture`` (H,W,3) uint8 of ``image`` (C,H,W) in [0,1]
    enlarged ``scale`` times by pixel repetition."""
    pixels = (image.expand(3, -1, -1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    cell = pixels.repeat(scale, axis=0).repeat(scale, axis=1)
    h, w = cell.shape[:2]
    first_rows = (sliding_window_view(picture, (1, w, 3)) == cell[0][None, None, None]).all(axis=(-3, -2, -1))
    return [
        (int(y), int(x))
        for y, x in zip(*np.nonzero(first_rows[:, :, 0]))
        if y + h <= len(picture) and np.array_equal(picture[y : y + h, x : x + w], cell)
    ]


def _outcome(images: torch.Tensor, labels: torch.Tensor) -> AttackOutcome:
    target = AttackTarget(1, (0,), 7, "w0")
    rec = Reconstruction("pisme", images, labels, "recovered", float("nan"), float("nan"), 1.0, {})
    return AttackOutcome(0, "pisme", target, "ok", reconstruction=rec, label_source="recovered", attack_seconds=1.0)


@pytest.fixture(scope="module")
def femnist_verdict():
    return _verdict("femnist")


@pytest.mark.heavy  # the evaluator's whole scoring: LPIPS, the verdict, the reader
def test_the_evaluator_draws_the_evidence_beside_the_grid(tmp_path, femnist_verdict):
    truth = _client("femnist", 0)
    gen = torch.Generator().manual_seed(2)
    recon = (truth.images + 0.2 * torch.randn(truth.images.shape, generator=gen)).clamp(0, 1)
    shuffle = torch.randperm(len(recon), generator=gen)  # an attack returns them in its own order
    row = Evaluator("femnist", folder=tmp_path, verdict=femnist_verdict).record(
        _outcome(recon[shuffle], truth.labels[shuffle]), (truth.images, truth.labels)
    )
    assert row["status"] == "ok" and row["image"] == "images/round-1/pisme/client-0.png"
    assert list(row) == list(ATTACK_COLUMNS)  # no column of its own: the path follows from the grid's
    path = tmp_path / "images/round-1/pisme/client-0-evidence.png"
    picture = np.asarray(Image.open(path).convert("RGB"))

    candidates = femnist_verdict.candidates(truth.images)
    found = femnist_verdict.evidence(recon, truth.images, candidates)
    assert len(found) == 4
    scale = math.ceil(96 / 28)  # enlarged to at least 96 px a side, to be read
    tops = []
    for e in found:  # one row each: the reconstruction | its own original | the nearest other candidate
        j = e["index"]
        (a,), (b,), (c,) = (_cells(picture, x, scale) for x in (recon[j], truth.images[j], candidates[e["nearest"]]))
        assert a[0] == b[0] == c[0] and a[1] < b[1] < c[1]
        tops.append(a[0])
    assert tops == sorted(tops) and len(set(tops)) == len(tops)


@pytest.mark.heavy  # the evaluator's whole scoring: LPIPS, the verdict, the reader
def test_no_evidence_picture_when_nothing_is_singled_out_and_a_failure_keeps_the_row(
    tmp_path, femnist_verdict, monkeypatch, caplog
):
    truth = _client("femnist", 0)
    evaluator = Evaluator("femnist", folder=tmp_path, verdict=femnist_verdict)
    stale = tmp_path / "images/round-1/pisme/client-0-evidence.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an older attack's")
    # each reconstruction exactly one of the distractors (distance 0), whatever the matching: none singled out
    k = len(truth.images)
    copies = femnist_verdict.candidates(truth.images)[k : 2 * k]
    row = evaluator.record(_outcome(copies, truth.labels), (truth.images, truth.labels))
    assert row["status"] == "ok" and row["reidentified"] == 0.0
    assert (tmp_path / row["image"]).is_file() and not stale.exists()

    def broken(*args, **kwargs):
        raise RuntimeError("no evidence today")

    monkeypatch.setattr(femnist_verdict, "evidence", broken)
    with caplog.at_level(logging.WARNING, logger="fl_attack.evaluation.evaluator"):
        row = evaluator.record(_outcome(truth.images, truth.labels), (truth.images, truth.labels))
    assert row["status"] == "ok" and row["recovered"] == len(truth.images) and row["error"] == ""
    assert "client-0-evidence.png could not be drawn" in caplog.text and "no evidence today" in caplog.text
    assert not stale.exists()
