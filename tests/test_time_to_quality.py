"""The short-budget levers (docs/time-to-quality.md): the public start and the snapshots the evaluator
scores to say whether a count was still rising. Real FEMNIST updates, fixed seeds."""

from __future__ import annotations

import json

import pytest
import torch

from fl_attack import reconstruct
from fl_attack.attacker.api import reconstruct_batch, snapshot_iterations
from fl_attack.attacker.attacks.base import AttackConfig
from fl_attack.attacker.labels import AuxiliaryData
from fl_attack.attacker.start import public_sample
from fl_attack.federation.data import client_partition, load_pool, server_test_set
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local


@pytest.fixture(scope="module")
def victim():
    """A real FEMNIST writer's update (k=10, B=5, E=2: T=4 SGD steps) and the server's public pool."""
    pool = load_pool("femnist")
    split = client_partition(pool, 3, 10)
    update = train_local(
        build_model("femnist", seed=0),
        split.train.images,
        split.train.labels,
        dataset="femnist",
        lr=0.05,
        batch_size=5,
        local_epochs=2,
    ).update
    public = server_test_set(pool, 300, seed=0)
    return update, split.train, AuxiliaryData(public.images, public.labels)


def test_public_sample_draws_each_label_from_its_class_and_distinct_within_a_class(victim):
    _, _, aux = victim
    labels = torch.tensor([3, 3, 3, 7, 1])
    images, found = public_sample(labels, aux.images, aux.labels, seed=0)
    assert found.all()
    for image, label in zip(images, labels):  # each start is one of the pool's images of its class
        same = (aux.images == image).flatten(1).all(1)
        assert same.any() and (aux.labels[same] == label).all()
    assert not torch.equal(images[0], images[1]) and not torch.equal(images[1], images[2])
    again, _ = public_sample(labels, aux.images, aux.labels, seed=0)
    assert torch.equal(images, again)  # seeded


def test_public_sample_leaves_a_class_the_pool_lacks_to_noise(victim):
    _, _, aux = victim
    missing = int(torch.arange(62)[torch.bincount(aux.labels, minlength=62) == 0][0])
    images, found = public_sample(torch.tensor([missing, int(aux.labels[0])]), aux.images, aux.labels)
    assert found.tolist() == [False, True] and (images[0] == 0).all()


def test_the_public_start_is_where_x_hat_starts_and_is_returned_for_the_verdict(victim):
    update, _, aux = victim
    rec = reconstruct(
        update, "pisme", iterations=1, nodes=1, lr_images=0.0, start="public", label_aux=aux, device="cpu", snapshots=()
    )
    expected, found = public_sample(rec.labels, aux.images, aux.labels, seed=0)
    assert found.all()
    # lr 0: X_hat never moves (up to the normalise/denormalise round trip)
    torch.testing.assert_close(rec.start_images, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(rec.images, expected, atol=1e-5, rtol=0)
    noise = reconstruct(update, "pisme", iterations=1, nodes=1, device="cpu")
    assert noise.start_images is None


def test_public_start_without_a_pool_fails_before_any_work(victim):
    update, _, _ = victim
    with pytest.raises(ValueError, match="start='public' needs the server's public pool"):
        reconstruct(update, "pisme", iterations=1000, start="public", device="cpu")
    with pytest.raises(ValueError, match="start must be one of noise, public"):
        AttackConfig(start="prior")
    with pytest.raises(ValueError, match="snapshots must be fractions"):
        AttackConfig(snapshots=(0.5, 1.0))


def test_a_snapshot_is_the_shorter_attack_itself(victim):
    """Without the step schedule, the snapshot after j of K iterations is exactly the j-iteration attack."""
    update, _, _ = victim
    assert snapshot_iterations(AttackConfig(iterations=8)) == [2, 4]
    assert snapshot_iterations(AttackConfig(iterations=2, snapshots=(0.25, 0.5))) == [1]
    long = reconstruct(update, "pisme", iterations=8, nodes=2, lr_decay=False, device="cpu")
    short = reconstruct(update, "pisme", iterations=4, nodes=2, lr_decay=False, device="cpu")
    assert sorted(long.snapshots) == [2, 4]
    torch.testing.assert_close(long.snapshots[4], short.images, atol=1e-6, rtol=0)
    assert not torch.allclose(long.snapshots[2], long.images)


def test_a_batch_keeps_each_clients_snapshots_and_start(victim):
    update, _, aux = victim
    recs = reconstruct_batch(
        [update, update], "pisme", iterations=4, nodes=1, start="public", label_aux=aux, device="cpu"
    )
    alone = reconstruct(update, "pisme", iterations=4, nodes=1, start="public", label_aux=aux, device="cpu")
    for rec in recs:
        assert sorted(rec.snapshots) == [1, 2]
        torch.testing.assert_close(rec.start_images, alone.start_images)
        torch.testing.assert_close(rec.snapshots[2], alone.snapshots[2], atol=1e-3, rtol=0)  # float32 batch sums


# --- the verdict's side: the start as a guess, the snapshots as a trend ------------------------------


@pytest.fixture(scope="module")
def judged():
    """A verdict on the bundled FEMNIST pool and a client's 16 originals (partition 0)."""
    from fl_attack.audit.metrics import get_lpips
    from fl_attack.audit.verdict import Verdict
    from fl_attack.federation.data import load_bundled

    truth = client_partition(load_bundled("femnist"), 0, 16, seed=0, held_out=0).train
    return Verdict.from_data("femnist", seed=0, num_distractors=200), truth, get_lpips("cpu")


def test_a_start_that_is_already_the_truth_is_in_the_floor(judged):
    """The null of the public start: were it the client's own images, the floor (the best guess) would
    recover every image the attack does, so nothing would be claimed for the update."""
    verdict, truth, lpips = judged
    plain = verdict.score(truth.images, truth.labels, truth.images, truth.labels, psnr=40.0, lpips=lpips)
    started = verdict.score(
        truth.images, truth.labels, truth.images, truth.labels, psnr=40.0, lpips=lpips, start=truth.images
    )
    assert plain["recovered"] == started["recovered"] > 8
    assert plain["guess_recovered"] < 4 <= started["recovered"]  # the plain guesses recover few
    assert started["guess_recovered"] == started["recovered"]  # the start recovers what the attack does
    assert "public start" in started["guesses"] and "public start" not in plain["guesses"]


def test_the_trend_says_still_rising_only_when_the_count_rose_after_the_last_snapshot(judged):
    from fl_attack.audit.verdict import verdict_line

    verdict, truth, lpips = judged
    noise = torch.rand_like(truth.images, generator=torch.Generator().manual_seed(0))
    args = (truth.images, truth.labels, truth.images, truth.labels)
    rising = verdict.score(*args, psnr=40.0, lpips=lpips, snapshots={50: noise, 100: noise}, iterations=200)
    flat = verdict.score(*args, psnr=40.0, lpips=lpips, snapshots={50: noise, 100: truth.images}, iterations=200)
    none = verdict.score(*args, psnr=40.0, lpips=lpips)
    k = rising["recovered"]
    assert rising["count_trend"] == "still rising" and flat["count_trend"] == "converged"
    assert json.loads(rising["recovered_curve"]) == {"50": 0, "100": 0, "200": k}
    assert json.loads(flat["recovered_curve"]) == {"50": 0, "100": k, "200": k}
    assert none["count_trend"] == "" and none["recovered_curve"] == ""
    assert verdict_line({**rising, "psnr": 40.0}).endswith(
        f"a lower bound: still rising (0, 0, {k} at 50, 100, 200 iterations)"
    )
    flat_line = verdict_line({**flat, "psnr": 40.0})
    assert flat_line.endswith(f"converged within its schedule (0, {k}, {k} at 50, 100, 200 iterations)")
    assert "rising" not in verdict_line({**none, "psnr": 40.0})


def test_the_lever_page_shows_the_table_its_records_make():
    """docs/time-to-quality.md's table is levers.md, which the script writes from levers.csv: none by hand."""
    import csv
    from pathlib import Path

    from analysis.experiments.time_to_quality import table

    root = Path(__file__).resolve().parents[1] / "docs"
    for folder in (root / "time-to-quality", root / "time-to-quality" / "paper"):  # the demo's, the second run's
        with open(folder / "levers.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        made = table(rows)
        assert (folder / "levers.md").read_text() == made
        assert made.strip() in (root / "time-to-quality.md").read_text()
