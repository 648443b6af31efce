"""Label recovery from the output-bias update (docs/PISME.md "Label recovery"; the core of RLU)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from fl_attack.attacker.labels import estimate_class_counts, recover_labels, refine_labels, round_counts
from fl_attack.evaluation.metrics import label_count_accuracy
from fl_attack.federation.data import client_partition, load_pool
from fl_attack.federation.models import build_model
from fl_attack.federation.training import train_local

NUM_CLASSES = {"femnist": 62, "cifar100": 100}


@functools.lru_cache(maxsize=4)  # shared by the parametrised tests; nothing mutates it
def _victim(dataset, partition, k=50, batch_size=10, local_epochs=20):
    split = client_partition(load_pool(dataset), partition, k)
    result = train_local(
        build_model(dataset, seed=partition),
        split.train.images,
        split.train.labels,
        dataset=dataset,
        lr=0.004,
        batch_size=batch_size,
        local_epochs=local_epochs,
        seed=partition,
    )
    return result.update, split.train.labels


@pytest.mark.parametrize("estimator", ["paper", "support"])
@pytest.mark.parametrize("dataset, partition", [("femnist", 0), ("cifar100", 0)])
def test_recovered_label_counts_at_the_paper_protocol(dataset, partition, estimator):
    """k=50, B=10, E=20 (T=100) on real clients: label-count accuracy >= 0.9."""
    update, truth = _victim(dataset, partition)
    labels = recover_labels(update, estimator=estimator)
    assert labels.shape == (50,) and labels.dtype == torch.int64
    assert bool((labels[1:] >= labels[:-1]).all())  # sorted by class
    assert 0 <= int(labels.min()) and int(labels.max()) < NUM_CLASSES[dataset]
    accuracy = label_count_accuracy(labels, truth, NUM_CLASSES[dataset])
    assert accuracy >= 0.9, f"{dataset} client {partition}: label-count accuracy {accuracy:.2f}"
    raw = estimate_class_counts(update)
    assert raw.shape == (NUM_CLASSES[dataset],)
    assert raw.sum() == pytest.approx(50, abs=1.0)  # the softmax and the bias update both sum to k


def test_label_recovery_does_not_depend_on_the_dummy_seed_much():
    update, truth = _victim("femnist", 2, local_epochs=2)
    accs = [label_count_accuracy(recover_labels(update, seed=s), truth, 62) for s in range(3)]
    assert min(accs) >= 0.9


def test_label_recovery_needs_the_output_bias():
    update, _ = _victim("femnist", 0, k=10, batch_size=10, local_epochs=1)
    from fl_attack.federation.update import ObservedUpdate

    w0 = {k: v for k, v in update.w0.items() if k != "fc2.bias"}
    wT = {k: v for k, v in update.wT.items() if k != "fc2.bias"}
    with pytest.raises(KeyError, match="output-layer bias 'fc2.bias'"):
        estimate_class_counts(ObservedUpdate(w0, wT, update.metadata))


# --- round_counts ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("total", [1, 10, 50, 257])
def test_round_counts_sums_to_total_and_is_non_negative(seed, total):
    raw = np.random.default_rng(seed).normal(total / 20, total / 10, size=62)
    counts = round_counts(raw, total)
    assert counts.dtype == np.int64 and counts.shape == (62,)
    assert counts.sum() == total
    assert (counts >= 0).all()
    assert (counts[raw <= 0] == 0).all()  # negative estimates are clipped, not rounded up


def test_round_counts_keeps_exact_integers():
    raw = np.zeros(10)
    raw[[1, 4, 7]] = [20, 25, 5]
    np.testing.assert_array_equal(round_counts(raw, 50), raw.astype(np.int64))


def test_round_counts_largest_remainder():
    np.testing.assert_array_equal(round_counts(np.array([1.6, 1.3, 2.1]), 5), [2, 1, 2])


@pytest.mark.parametrize("raw", [np.full(7, -1.0), np.zeros(7), np.array([np.nan] * 7)])
def test_round_counts_handles_all_negative_or_empty_input(raw):
    counts = round_counts(raw, 10)
    assert counts.sum() == 10 and (counts >= 0).all()
    assert counts.max() - counts.min() <= 1  # falls back to a uniform split


def test_refining_on_the_data_itself_fixes_long_training():
    """T=250 on FEMNIST: p_bar on dummy inputs loses counts (docs/attack-core.md). Re-estimated on
    the client's own images (the best a reconstruction can do), the counts come back, and the
    matching hands most images their own label."""
    from fl_attack.federation.data import get_spec

    update, truth = _victim("femnist", 0, local_epochs=50)
    dummy = recover_labels(update, estimator="paper")
    inputs = get_spec("femnist").normalize(client_partition(load_pool("femnist"), 0, 50).train.images)
    refined = refine_labels(update, inputs, dummy)
    assert refined.shape == (50,) and refined.dtype == torch.int64
    before, after = (label_count_accuracy(y, truth, 62) for y in (dummy, refined))
    assert before < after, (before, after)  # 0.82 -> 1.0 measured
    # Per image, not only as a multiset: most images get their own label (0.8 measured), far more than
    # the same labels handed out in a random order would get on average (sum_c n_c m_c / k^2: 0.04).
    per_image = float((refined == truth).float().mean())
    shuffled = float((torch.bincount(refined, minlength=62) * torch.bincount(truth, minlength=62)).sum()) / 50**2
    assert per_image > max(0.5, 4 * shuffled), (per_image, shuffled)
    with pytest.raises(ValueError, match="one label per image"):
        refine_labels(update, inputs[:3], dummy)


def test_label_refine_setting_is_validated_and_skips_oracle_labels():
    from fl_attack.attacker.api import reconstruct
    from fl_attack.attacker.attacks import AttackConfig

    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="label_refine"):
            AttackConfig(label_refine=bad)
    update, truth = _victim("femnist", 1, k=6, batch_size=3, local_epochs=1)
    rec = reconstruct(update, "pisme", labels=truth, iterations=4, nodes=2, label_refine=0.5)
    assert torch.equal(rec.labels, truth) and rec.label_source == "oracle"
    rec = reconstruct(update, "pisme", iterations=4, nodes=2, label_refine=0.5)  # runs the refinement
    assert rec.labels.shape == (6,) and rec.label_source == "recovered"


def test_label_refine_runs_once_at_its_fraction_and_its_labels_are_kept(monkeypatch):
    """Unit test of the wiring (a spy stands in for the re-estimation): label_refine=0.5 of 4
    iterations calls it once, and the attack goes on with, and returns, the labels it gave."""
    import fl_attack.attacker.api as api

    update, _ = _victim("femnist", 1, k=6, batch_size=3, local_epochs=1)
    calls = []

    def spy(update_, x, y, model):
        calls.append(y.clone())
        return torch.flip(y, [0])

    monkeypatch.setattr(api, "refine_labels", spy)
    rec = api.reconstruct(update, "pisme", iterations=4, nodes=2, label_refine=0.5)
    assert len(calls) == 1 and torch.equal(rec.labels, torch.flip(calls[0], [0]))
    calls.clear()
    api.reconstruct(update, "pisme", iterations=4, nodes=2)  # label_refine 0: the labels stay fixed
    assert calls == []
