"""The dataset registry (fl_attack.federation.pools: DatasetSpec, register_dataset, DATASETS) and the third
dataset that shows it, femnist-digits (fl_attack/federation/femnist_digits.py): FEMNIST's writers restricted
to their digits, run through a federation, the audit plugin and the verdict on the bundled real data."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from fl_attack.federation import femnist_digits
from fl_attack.federation.data import (
    DATASETS,
    DatasetSpec,
    client_partition,
    get_spec,
    load_bundled,
    load_pool,
    num_partitions,
    server_test_set,
)
from fl_attack.federation.models import FemnistCNN, build_model
from fl_attack.federation.pools import register_dataset


def test_every_dataset_is_one_registered_spec():
    assert sorted(DATASETS) == ["cifar100", "femnist", "femnist-digits"]
    for name, spec in DATASETS.items():
        assert spec.name == name and get_spec(name.upper()) is spec and get_spec(f" {name} ") is spec
        assert spec.model is not None and (spec.load is not None or spec.sample)
    femnist, cifar, digits = get_spec("femnist"), get_spec("cifar100"), get_spec("femnist-digits")
    # femnist and cifar100 are what they were before the registry (the paper's protocol)
    assert (femnist.image_shape, femnist.num_classes, femnist.mean, femnist.std) == (
        (1, 28, 28),
        62,
        (0.9642,),
        (0.1577,),
    )
    assert (cifar.image_shape, cifar.num_classes, cifar.psnr_recovered_db) == ((3, 32, 32), 100, 19.0)
    assert femnist.writers and digits.writers and not cifar.writers
    assert cifar.hflip and not femnist.hflip and not digits.hflip
    assert (digits.image_shape, digits.num_classes, digits.mean, digits.std) == (
        (1, 28, 28),
        10,
        femnist.mean,
        femnist.std,
    )
    assert femnist.prior_steps and cifar.prior_steps and digits.prior_steps is None
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; choose one of: cifar100, femnist, femnist-digits"):
        get_spec("mnist")


def test_register_dataset_refuses_a_taken_name_and_a_malformed_spec():
    """Unit test (specs made up, nothing registered)."""
    with pytest.raises(ValueError, match="'femnist' is registered already"):
        register_dataset(get_spec("femnist"))
    with pytest.raises(ValueError, match="lower case without spaces"):
        register_dataset(DatasetSpec("Digits", (1, 28, 28), 10, (0.5,), (0.5,)))
    with pytest.raises(ValueError, match="one value per channel"):
        register_dataset(DatasetSpec("rgb", (3, 32, 32), 10, (0.5,), (0.5,)))
    assert "rgb" not in DATASETS and "Digits" not in DATASETS


def test_the_default_models_come_from_the_registry_unchanged():
    """build_model asks the spec: femnist's is the paper's FemnistCNN with the same seeded weights as
    before (FemnistCNN() under torch.manual_seed), femnist-digits' the same CNN with 10 outputs."""
    torch.manual_seed(3)
    direct = FemnistCNN().state_dict()
    for key, value in build_model("femnist", seed=3).state_dict().items():
        assert torch.equal(value, direct[key]), key
    digits = build_model("femnist-digits", seed=3)
    assert isinstance(digits, FemnistCNN) and digits.fc2.out_features == 10
    assert digits(torch.rand(2, 1, 28, 28)).shape == (2, 10)


def test_the_digits_pool_is_femnists_digit_samples_of_real_writers():
    femnist, digits = load_bundled("femnist"), load_bundled("femnist-digits")
    keep = femnist.labels < 10
    assert len(digits) == int(keep.sum()) == 12_555  # of the sample's 18,796 (fl_attack/assets/README.md)
    assert set(np.unique(digits.labels).tolist()) == set(range(10))
    np.testing.assert_array_equal(digits.images, femnist.images[keep])
    np.testing.assert_array_equal(digits.writer_names[digits.writers], femnist.writer_names[femnist.writers[keep]])
    np.testing.assert_array_equal(digits.split, femnist.split[keep])
    assert not digits.images.flags.writeable and load_pool("femnist-digits") is digits
    with pytest.raises(ValueError, match="cut from a femnist pool, not cifar100"):
        femnist_digits.digits_of(load_bundled("cifar100"))


def test_a_digits_client_is_one_real_writer_with_its_digits_only():
    """Partition p is the p-th writer by name with >= k LEAF-train digits; its k training samples are
    that writer's LEAF-train digits, its test samples the writer's LEAF-test digits; the server's
    public pool holds LEAF-test digits only. Seeded: the same call gives the same samples."""
    femnist, digits = load_bundled("femnist"), load_bundled("femnist-digits")
    k = 8
    assert num_partitions(digits, k) == 101  # of 104 writers with LEAF-train digits
    names = set(femnist.writer_names.tolist())
    seen = set()
    for p in range(3):
        split = client_partition(digits, p, k, seed=0)
        writer = split.train.client_id
        assert writer in names and writer not in seen
        seen.add(writer)
        assert len(split.train) == k and split.train.images.shape == (k, 1, 28, 28)
        for part, leaf_split in ((split.train, 0), (split.test, 1)):
            assert 0 <= int(part.labels.min()) and int(part.labels.max()) <= 9
            own = (
                (femnist.writer_names[femnist.writers] == writer)
                & (femnist.split == leaf_split)
                & (femnist.labels < 10)
            )
            theirs = {x.tobytes() for x in femnist.images[own]}
            mine = (part.images[:, 0] * 255).round().to(torch.uint8).numpy()
            assert all(x.tobytes() in theirs for x in mine)
        again = client_partition(digits, p, k, seed=0)
        assert torch.equal(again.train.images, split.train.images) and torch.equal(
            again.train.labels, split.train.labels
        )
    public = server_test_set(digits, 500, seed=0)
    assert int(public.labels.max()) <= 9
    test_digits = {x.tobytes() for x in digits.images[digits.split == 1]}
    assert all(x.tobytes() in test_digits for x in (public.images[:, 0] * 255).round().to(torch.uint8).numpy())
    with pytest.raises(ValueError, match="classes is only supported for cifar100"):
        client_partition(digits, 0, k, classes=2)


def test_a_dataset_without_a_prior_says_so_only_when_a_prior_is_asked_for():
    from fl_attack.attacker.diffusion import load_prior, prior_info

    with pytest.raises(
        ValueError, match=r"femnist-digits has no diffusion prior .* datasets with a prior: cifar100, femnist$"
    ):
        load_prior("femnist-digits")
    with pytest.raises(ValueError, match="femnist-digits has no diffusion prior"):
        prior_info("femnist-digits")
    assert prior_info("femnist")["dataset"] == "femnist"


@pytest.mark.heavy
def test_a_short_digits_federation_runs_through_the_plugin_and_the_verdict(tmp_path):
    """Two real femnist-digits writers, k=8, one round, through the real ClientApp, the ServerApp's
    audit plugin (strategies.audit.AuditedStrategy) and the evaluator: every attacked client has a row
    with the verdict's columns, its labels among the digits; a DGGI run is refused before any round."""
    from fl_attack.evaluation.verdict import VERDICT_COLUMNS
    from tests.inprocess import serve

    run = serve(
        tmp_path,
        partitions=(0, 1),
        num_rounds=1,
        dataset="femnist-digits",
        samples_per_client=8,
        batch_size=4,
        attack_method="pisme",
        attack_iterations=2,
        attack_nodes=2,
        server_test_samples=200,
    )
    with open(run / "attacks.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and {r["method"] for r in rows} == {"pisme"}
    assert set(VERDICT_COLUMNS) <= set(rows[0])
    digits = load_bundled("femnist-digits")
    writers = {client_partition(digits, p, 8, seed=0).train.client_id for p in (0, 1)}
    assert {r["client_id"] for r in rows} == writers
    for row in rows:
        assert row["dataset"] == "femnist-digits" and row["status"] == "ok" and int(row["k"]) == 8
        assert 0 <= float(row["recognized_low"]) <= float(row["recognized"]) <= float(row["recognized_high"]) <= 1
        assert float(row["psnr"]) > 0 and 0 <= float(row["label_accuracy"]) <= 1


@pytest.mark.heavy
def test_the_audit_plugin_takes_the_digits_app_and_refuses_dggi_on_it(tmp_path):
    """strategies.audit.audit around Flower's own FedAvg, for an app on femnist-digits: the digits CNN
    and its clients' real images pass the plugin's checks, the run records the dataset, the verdict's
    public pool (the server's held-out set) and distractors are digits; DGGI (a diffusion prior this
    dataset lacks) is refused first, with nothing written."""
    import json

    from flwr.app import Context, RecordDict
    from flwr.serverapp.strategy import FedAvg

    from strategies.audit import audit

    digits = load_bundled("femnist-digits")

    def truth(p):
        split = client_partition(digits, p, 8, seed=0)
        return split.train.images, split.train.labels

    def context(name, **keys):
        run_config = {"results-dir": str(tmp_path), "run-name": name, "attack-method": "pisme", **keys}
        return Context(1, 0, {}, RecordDict(), run_config)

    with pytest.raises(ValueError, match="attack-method: femnist-digits has no diffusion prior"):
        audit(
            FedAvg(),
            context("dggi", **{"attack-method": "dggi"}),
            model=build_model("femnist-digits", seed=0),
            dataset="femnist-digits",
        )
    assert not (tmp_path / "dggi").exists()
    strategy = audit(
        FedAvg(),
        context("digits", **{"server-test-samples": 100}),
        model=lambda: build_model("femnist-digits", seed=0),
        dataset="femnist-digits",
        truth=truth,
    )
    config = json.loads((tmp_path / "digits" / "config.json").read_text())
    assert config["run_config"]["dataset"] == "femnist-digits" and config["audit"]["scored"]
    verdict = strategy.service.evaluator.verdict  # its public pool: the server's 100 held-out digits
    assert verdict.dataset == "femnist-digits" and len(verdict.public_labels) == 100
    assert int(verdict.public_labels.max()) <= 9 and int(verdict.distractor_labels.max()) <= 9
    assert tuple(verdict.distractors.shape[1:]) == (1, 28, 28) and len(verdict.distractors) >= 1000
