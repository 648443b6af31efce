"""The verdict (fl_attack.evaluation.verdict) on real bundled clients: the floor, singled out, recognized, recovered.

Each property is checked on real data with fixed seeds, and the floor's PSNR against an independent
computation (numpy means, scipy's assignment, PSNR written out) that imports nothing it checks.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from fl_attack.evaluation.metrics import get_lpips
from fl_attack.evaluation.verdict import (
    VERDICT_COLUMNS,
    Verdict,
    pixel_l2,
    ssim_distance,
    verdict_line,
    verdict_summary,
)
from fl_attack.federation.data import client_partition, load_bundled, server_test_set

K = {"femnist": 32, "cifar100": 20}
HELD_OUT = 1000  # the federation's server-test-samples default: the public pool


def _client(dataset: str, partition: int):
    pool = load_bundled(dataset)
    held = HELD_OUT if dataset == "cifar100" else 0
    return client_partition(pool, partition, K[dataset], seed=0, held_out=held).train


@pytest.fixture(scope="module", params=["femnist", "cifar100"])
def setup(request):
    dataset = request.param
    pool = load_bundled(dataset)
    public = server_test_set(pool, HELD_OUT, seed=0)
    verdict = Verdict.from_data(dataset, seed=0, public=(public.images, public.labels))
    return dataset, verdict, public


def _score(verdict, images, labels, truth):
    return verdict.score(images, labels, truth.images, truth.labels, psnr=0.0, lpips=get_lpips("cpu"))


def test_the_originals_are_all_singled_out_recognized_at_the_readers_accuracy_and_recovered(setup):
    dataset, verdict, _ = setup
    truth = _client(dataset, 0)
    row = _score(verdict, truth.images, truth.labels, truth)
    assert set(row) == set(VERDICT_COLUMNS)
    assert row["k"] == K[dataset] and row["reidentified"] == 1.0
    assert row["recovered"] == K[dataset]
    assert row["recognized"] == row["recognized_truth"]
    assert row["recognized_truth"] > 5 / verdict.public_labels.max().item()  # far above chance
    assert row["reid_chance_uniform"] == pytest.approx(1 / (K[dataset] + verdict.num_distractors))
    assert row["reid_chance_matched"] == pytest.approx(K[dataset] / (K[dataset] + verdict.num_distractors))
    # the headline chance is the matched null, never 1/(k+D): at least k times it (32x on FEMNIST, 20x on CIFAR-100)
    assert row["reid_chance"] >= (1 - 1e-12) * K[dataset] * row["reid_chance_uniform"]
    parts = ("reid_noise", "reid_chance_matched", "reid_chance_labels", "guess_reidentified")
    assert row["reid_chance"] == max(row[c] for c in parts)


def test_the_pool_mean_guess_is_singled_out_at_chance_and_recovers_nothing(setup):
    dataset, verdict, _ = setup
    for partition in (0, 1, 2):
        truth = _client(dataset, partition)
        guess = verdict.guesses(truth.labels)["pool mean"]
        row = _score(verdict, guess, truth.labels, truth)
        # k identical guesses: at most the one original nearest the pool mean can be singled out
        assert row["reidentified"] * row["k"] <= 1
        assert row["recovered"] == 0


@pytest.mark.heavy
def test_reconstructions_swapped_between_two_clients_fall_to_chance(setup):
    dataset, verdict, _ = setup
    a, b = _client(dataset, 0), _client(dataset, 1)
    own = _score(verdict, a.images, a.labels, a)
    swapped = _score(verdict, b.images, b.labels, a)  # client 1's images offered as client 0's
    assert own["recovered"] == K[dataset]
    assert swapped["reidentified"] == 0.0 and swapped["recovered"] == 0
    # each reconstruction exactly another of the client's own originals: ranked second, never first
    shifted = verdict.singled_out(a.images.roll(1, dims=0), verdict.candidates(a.images))
    assert not shifted.any()


def test_a_distractor_equal_to_an_original_is_left_out(setup):
    dataset, verdict, _ = setup
    truth = _client(dataset, 0)
    planted = torch.cat([truth.images[:1], verdict.distractors])  # the client's first image as a distractor
    v = Verdict(dataset, verdict.public_images, verdict.public_labels, planted, verdict.num_distractors)
    v.reader = verdict.reader
    candidates = v.candidates(truth.images)
    assert len(candidates) == K[dataset] + verdict.num_distractors
    copies = (candidates[K[dataset] :] == truth.images[0]).flatten(1).all(1)
    assert not copies.any()  # the planted copy is not a candidate
    assert v.singled_out(truth.images, candidates).all()


@pytest.mark.parametrize("distance", ["ssim", "l2"])
def test_singled_out_means_ranked_first_not_second(setup, distance):
    dataset, verdict, _ = setup
    a, b = _client(dataset, 0).images[:2]
    v = Verdict(dataset, verdict.public_images, verdict.public_labels, verdict.distractors, distance=distance)
    candidates = torch.stack([a, b])  # the original first, one other candidate
    nearer_b = (0.4 * a + 0.6 * b)[None]  # its own original ranks second
    nearer_a = (0.6 * a + 0.4 * b)[None]
    assert not v.singled_out(nearer_b, candidates).any()
    assert v.singled_out(nearer_a, candidates).all()


def _independent_floor_psnr(guesses, truth_images) -> float:
    """The best guess's matched PSNR, written out with numpy and scipy only (the guess images
    themselves are held to the public pool by the tests below)."""
    t = truth_images.numpy().astype(np.float64)
    best = -math.inf
    for guess in (g.numpy().astype(np.float64) for g in guesses.values()):
        mse = ((guess[:, None] - t[None]) ** 2).reshape(len(guess), len(t), -1).mean(axis=2)
        rows, cols = linear_sum_assignment(mse.T)  # truth j <- guess cols[j]
        per_image = 10 * np.log10(1.0 / np.maximum(mse.T[rows, cols], 1e-10))
        best = max(best, float(per_image.mean()))
    return best


def test_the_floors_psnr_matches_an_independent_computation(setup):
    dataset, verdict, public = setup
    truth = _client(dataset, 2)
    recon_labels = torch.roll(truth.labels, 3)  # labels as an attack may recover them (order irrelevant)
    noisy = (truth.images + 0.2 * torch.randn(truth.images.shape, generator=torch.Generator().manual_seed(0))).clamp(
        0, 1
    )
    row = verdict.score(noisy, recon_labels, truth.images, truth.labels, psnr=12.5, lpips=get_lpips("cpu"))
    expected = _independent_floor_psnr(verdict.guesses(recon_labels, truth.images), truth.images)
    assert row["guess_psnr"] == pytest.approx(expected, abs=1e-4)
    assert row["psnr_margin"] == pytest.approx(12.5 - expected, abs=1e-4)
    assert 0.0 <= row["guess_ssim"] <= 1.0 and row["guess_lpips"] > 0.0


def test_the_blurry_guesses_are_the_public_pools_means(setup):
    dataset, verdict, public = setup
    labels = _client(dataset, 0).labels
    guesses = verdict.guesses(labels)
    assert list(guesses) == ["pool mean", "class mean", "class medoid", "reader's pick"]
    pub, lab = public.images.numpy().astype(np.float64), public.labels.numpy()
    assert np.allclose(guesses["pool mean"].numpy(), pub.mean(axis=0)[None].repeat(len(labels), 0), atol=1e-6)
    expected = [pub[lab == y].mean(axis=0) if (lab == y).any() else pub.mean(axis=0) for y in labels.numpy()]
    assert np.allclose(guesses["class mean"].numpy(), np.stack(expected), atol=1e-6)


def test_the_sharp_guesses_are_public_images_of_the_label_chosen_without_the_truth(setup):
    """The class medoid is the pool image of the label least far (1 - SSIM, piq pair by pair) from the
    others of its class; the reader's pick one of that class; neither depends on the client's images."""
    import piq

    dataset, verdict, public = setup
    labels = _client(dataset, 0).labels
    guesses = verdict.guesses(labels)
    other = verdict.guesses(labels, _client(dataset, 1).images)  # another truth: the same guesses
    for name in ("class medoid", "reader's pick"):
        assert torch.equal(guesses[name], other[name])
    for y, medoid, pick in list(zip(labels.tolist(), guesses["class medoid"], guesses["reader's pick"]))[:6]:
        of_y = public.images[public.labels == y].double()
        assert (of_y == pick.double()).flatten(1).all(1).any()  # a real public image of the label
        sums = [float((1 - piq.ssim(x.expand_as(of_y), of_y, data_range=1.0, reduction="none")).sum()) for x in of_y]
        assert torch.equal(of_y[int(np.argmin(sums))].float(), medoid)


def test_each_floor_column_is_the_best_guess_s(setup):
    dataset, verdict, _ = setup
    truth = _client(dataset, 1)
    row = _score(verdict, (truth.images * 0.5 + 0.25), truth.labels, truth)
    per_guess = json.loads(row["guesses"])
    assert set(per_guess) == {"pool mean", "class mean", "class medoid", "reader's pick"}
    for column, floor, better in (
        ("psnr", "guess_psnr", max),
        ("ssim", "guess_ssim", max),
        ("lpips", "guess_lpips", min),
        ("reidentified", "guess_reidentified", max),
        ("recognized", "recognized_guess", max),
        ("recovered", "guess_recovered", max),
    ):
        assert row[floor] == pytest.approx(better(g[column] for g in per_guess.values()), abs=1e-6), column


def test_a_little_noise_keeps_images_singled_out_and_heavy_noise_loses_them(setup):
    dataset, verdict, _ = setup
    truth = _client(dataset, 0)
    gen = torch.Generator().manual_seed(1)
    light = (truth.images + 0.05 * torch.randn(truth.images.shape, generator=gen)).clamp(0, 1)
    heavy = torch.rand(truth.images.shape, generator=gen)
    assert _score(verdict, light, truth.labels, truth)["reidentified"] == 1.0
    assert _score(verdict, heavy, truth.labels, truth)["recovered"] == 0


@pytest.mark.parametrize("dataset", ["femnist", "cifar100"])
def test_the_pairwise_ssim_distance_is_piqs_ssim(dataset):
    import piq

    a, b = _client(dataset, 0).images[:5].double(), _client(dataset, 1).images.double()
    fast = ssim_distance(a, b)
    slow = torch.stack([1 - piq.ssim(x.expand_as(b), b, data_range=1.0, reduction="none") for x in a])
    assert fast.shape == (5, len(b))
    assert torch.allclose(fast, slow, atol=1e-10)
    assert torch.allclose(pixel_l2(a, b)[2, 3], (a[2] - b[3]).pow(2).sum().sqrt())


def test_verdict_line_and_summary_read_a_row():
    row = dict.fromkeys(VERDICT_COLUMNS, 0.0) | {"k": 32, "recovered": 9, "guess_recovered": 0}
    row |= {"recovered_low": 4, "recovered_high": 16, "recognized_low": 0.24, "recognized_high": 0.59}
    row |= {"reidentified": 0.28, "reid_chance": 0.041, "recognized": 0.41, "recognized_truth": 0.85}
    row |= {"recognized_guess": 0.12, "psnr": 15.1, "psnr_margin": -1.9, "status": "ok"}
    line = verdict_line(row)
    assert line.startswith("9 of 32 images recovered (95%: 4-16; a guess without the update: 0)")
    assert "(chance 4%: update-free outputs under the same matching)" in line
    assert "recognized 41% (95%: 24-59%; reader: 85% of the originals, 12% of the best guess)" in line
    assert "1.9 dB under the guess" in line
    # a row written before the matched null: its chance is named for what it was, no interval invented
    old = {c: v for c, v in row.items() if not c.endswith(("_low", "_high")) and c != "reid_chance_matched"}
    old_line = verdict_line(old | {"reid_chance": 1 / 2032})
    assert "(chance 0.049%, 1/(k+D))" in old_line and "95%" not in old_line
    assert verdict_line({"status": "failed", "error": "boom"}) == "no verdict (failed: boom)"
    rows = [row | {"round": 1, "partition_id": 0, "method": "pisme", "memory": ""}]
    rows.append(row | {"round": 2, "partition_id": 0, "method": "pisme+memory", "memory": "keep", "recovered": 11})
    rows[0]["iterations"] = 200
    lines = verdict_summary(rows)["lines"]
    assert lines[0].startswith("round 1, partition 0, pisme: 9 of 32 images recovered")
    assert lines[2] == "the remembering server (pisme+memory) holds 11 of 32 images of partition 0 after round 2"
    assert lines[3] == "in all: 9 of 32 attacked images recovered by 1 attack(s) of 200 iterations"
    rows[0]["recovered"] = 7  # under a quarter: how to attack harder, where it would help
    hint = verdict_summary(rows)["lines"][3]  # a row without the trend: it may still be rising
    assert hint.startswith("in all: 7 of 32 attacked images recovered by 1 attack(s) of 200 iterations; still rising")
    assert "--iterations 1000" in hint
    rows[0]["count_trend"] = "converged"  # flat within its schedule, which a longer one still moves (measured)
    flat = verdict_summary(rows)["lines"][3]
    assert "; every count was flat over the last half of its schedule, which a longer schedule" in flat
    # the plateau schedule cuts X_hat's rate to nothing: more of its iterations are never offered
    for trend in ("still rising", "converged"):
        stalled = verdict_summary([rows[0] | {"count_trend": trend, "lr_schedule": "plateau"}, rows[1]])["lines"][3]
        assert "--iterations" not in stalled and "plateau schedule had cut X_hat's rate to nothing" in stalled


def test_the_blocked_ranking_is_the_whole_matrix_s(setup):
    """singled_out stops ranking an image at the first nearer candidate: the same answer as comparing
    each image with every candidate at once (the full 1 - SSIM matrix), for an attack-like image set
    (some singled out, some not), a repeated guess and noise."""
    dataset, verdict, _ = setup
    truth = _client(dataset, 0)
    gen = torch.Generator().manual_seed(4)
    noisy = (
        truth.images
        + torch.linspace(0.05, 2.0, K[dataset])[:, None, None, None] * torch.randn(truth.images.shape, generator=gen)
    ).clamp(0, 1)
    candidates = verdict.candidates(truth.images)
    for images in (noisy, verdict.guesses(truth.labels)["pool mean"], torch.rand(truth.images.shape, generator=gen)):
        d = ssim_distance(images.float(), candidates.float())
        own = d.diagonal()
        expected = (d < own[:, None]).sum(1) == 0
        got = verdict.singled_out(images, candidates)
        assert torch.equal(got, expected)
    assert 0 < int(verdict.singled_out(noisy, candidates).sum()) < K[dataset]  # both kinds of row present


def test_a_verdict_built_again_on_the_same_pool_reuses_its_class_picks(monkeypatch):
    """A unit test of ``_SHARED_PICKS``: a second verdict on the same public pool gives the same guesses
    without the reader reading the pool again; a verdict on another pool reads its own."""
    from fl_attack.evaluation import verdict as module

    monkeypatch.setattr(module, "_SHARED_PICKS", {})
    pool = load_bundled("femnist")
    public = server_test_set(pool, 200, seed=0)
    labels = torch.arange(10)
    expected = Verdict.from_data("femnist", seed=0, public=(public.images, public.labels)).guesses(labels)

    def reading(verdict, seen):
        logits = verdict._logits
        monkeypatch.setattr(verdict, "_logits", lambda images: seen.append(len(images)) or logits(images))
        return verdict

    seen = []
    again = reading(Verdict.from_data("femnist", seed=0, public=(public.images, public.labels)), seen)
    got = again.guesses(labels)
    assert seen == [] and set(got) == set(expected) and all(torch.equal(got[n], expected[n]) for n in expected)
    other = server_test_set(pool, 200, seed=1)
    seen_other = []
    reading(Verdict.from_data("femnist", seed=0, public=(other.images, other.labels)), seen_other).guesses(labels)
    assert seen_other == [200]  # the reader over the other pool, once
