"""The short-budget levers (docs/time-to-quality.md): the public start and the snapshots the evaluator
scores to say whether a count was still rising. Real FEMNIST updates, fixed seeds."""

from __future__ import annotations

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
        torch.testing.assert_close(rec.snapshots[2], alone.snapshots[2], atol=1e-5, rtol=0)
