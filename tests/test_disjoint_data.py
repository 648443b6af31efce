"""The verdict's data kept apart from the run's clients (issue #48, item 4; fl_attack.evaluation.overlap).

On the real bundled pools, with fixed seeds: FEMNIST's public pool and distractors hold no sample of
the run's writers; config.json records how many of them the attacker's public pool (the server's
held-out set) shares, and the report shows it; the shipped fingerprints of the readers' training
sets are those of the readers' own training selection; a client image the reader trained on is
warned about, once per run, and the bundled clients' images are not. Byte-equality and the digests
are computed here with numpy and hashlib, not with the code under test.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_attack.evaluation import reader
from fl_attack.evaluation.metrics import get_lpips
from fl_attack.evaluation.verdict import Verdict
from fl_attack.federation.data import (
    DataSettings,
    client_partition,
    load_bundled,
    partition_writers,
    run_writers,
    server_test_set,
)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
K = 32
CLIENTS = 3  # a federation of partitions 0..2 (paper partitioner, k = 32)


def _u8(images: torch.Tensor) -> np.ndarray:
    """float (N,C,H,W) in [0,1] -> uint8 (N,C,H,W), as the pool stores them (x 255, rounded)."""
    return (images.double() * 255).round().clamp(0, 255).to(torch.uint8).numpy()


def _pool_u8(pool, idx) -> np.ndarray:
    images = pool.images[idx]
    return images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)


def _writer_bytes(pool, writer_ids) -> dict[bytes, set]:
    """Every sample of these writers, by its raw bytes -> the writers who wrote it."""
    idx = np.flatnonzero(np.isin(pool.writers, writer_ids))
    out: dict[bytes, set] = {}
    for image, w in zip(_pool_u8(pool, idx), pool.writers[idx].tolist(), strict=True):
        out.setdefault(np.ascontiguousarray(image).tobytes(), set()).add(w)
    return out


@pytest.fixture(scope="module")
def femnist_run():
    pool = load_bundled("femnist")
    writer_ids = partition_writers(pool, K)[:CLIENTS]
    names = run_writers(DataSettings("femnist", K, num_partitions=CLIENTS), pool)
    held = server_test_set(pool, 1000, seed=0)
    return pool, writer_ids, names, held


def test_run_writers_are_the_writers_of_the_federations_partitions(femnist_run):
    pool, writer_ids, names, _ = femnist_run
    assert names == tuple(sorted(client_partition(pool, p, K).train.client_id for p in range(CLIENTS)))
    assert set(names) == set(pool.writer_names[writer_ids].tolist())
    assert run_writers(DataSettings("cifar100", K, num_partitions=CLIENTS)) == ()
    with pytest.raises(ValueError, match="number of partitions is not known"):
        run_writers(DataSettings("femnist", K))


def test_femnist_public_pool_and_distractors_hold_no_sample_of_the_runs_writers(femnist_run):
    pool, writer_ids, names, held = femnist_run
    theirs = _writer_bytes(pool, writer_ids)
    public = (held.images, held.labels)
    before = Verdict.from_data("femnist", seed=0, public=public)
    after = Verdict.from_data("femnist", seed=0, public=public, exclude_writers=names)

    def shared(images):
        return sum(np.ascontiguousarray(x).tobytes() in theirs for x in _u8(images))

    # without the exclusion both hold the victims' handwriting: the test can fail
    held_theirs = shared(held.images)
    assert held_theirs > 0 and shared(before.distractors) > 0
    assert shared(after.public_images) == 0 and shared(after.distractors) == 0
    # the public pool is the server's held-out set less exactly those samples, labels kept in step
    assert len(after.public_images) == len(held.images) - held_theirs == len(after.public_labels)
    keep = [np.ascontiguousarray(x).tobytes() not in theirs for x in _u8(held.images)]
    assert torch.equal(after.public_labels, held.labels[torch.tensor(keep)])
    assert len(after.distractors) >= after.num_distractors  # D still drawn: the others hold plenty
    # no victim's training image is a distractor either
    for p in range(CLIENTS):
        own = {np.ascontiguousarray(x).tobytes() for x in _u8(client_partition(pool, p, K).train.images)}
        assert not own & {np.ascontiguousarray(x).tobytes() for x in _u8(after.distractors)}


def test_writers_the_pool_lacks_or_cifar100_writers_are_refused():
    with pytest.raises(ValueError, match="lacks"):
        Verdict.from_data("femnist", exclude_writers=["f9999_99"])
    with pytest.raises(ValueError, match="cifar100 has no writers"):
        Verdict.from_data("cifar100", exclude_writers=["f1501_00"])


def test_too_few_other_writers_for_d_gives_fewer_distractors_with_a_warning(caplog):
    """natural partitioner, 105 clients: every writer with LEAF-train samples is in the run, so only
    the 79 test-only writers' 2,403 samples are left: D = 3,000 cannot be drawn."""
    pool = load_bundled("femnist")
    data = DataSettings("femnist", 0, partitioner="natural", num_partitions=105)
    names = run_writers(data, pool)
    train_writers = np.flatnonzero(np.bincount(pool.writers[pool.split == 0], minlength=len(pool.writer_names)))
    assert set(names) == set(pool.writer_names[train_writers].tolist())
    verdict = Verdict.from_data("femnist", seed=0, num_distractors=3000, exclude_writers=names)
    theirs = _writer_bytes(pool, train_writers)
    others = _pool_u8(pool, np.flatnonzero(~np.isin(pool.writers, train_writers)))
    usable = sum(np.ascontiguousarray(x).tobytes() not in theirs for x in others)
    assert len(verdict.distractors) == usable <= len(others) < 3000  # every one the other writers hold
    truth = client_partition(pool, 0, K).train
    with caplog.at_level(logging.WARNING, logger="fl_attack.evaluation.verdict"):
        candidates = verdict.candidates(truth.images)
    assert len(candidates) - K == len(verdict.distractors)
    assert f"only {len(verdict.distractors)} distractors available (D=3000 asked)" in caplog.text


def _write_config(tmp_path, run_config: dict, num_nodes: int) -> dict:
    from fl_attack.audit.settings import RunSettings
    from strategies.server_app import write_run_config

    settings = RunSettings.from_run_config(run_config)
    write_run_config(tmp_path, settings, run_config, num_nodes)
    return json.loads((tmp_path / "config.json").read_text())


def test_config_json_records_the_writers_the_attackers_public_pool_shares(tmp_path, femnist_run):
    pool, writer_ids, _, held = femnist_run
    record = _write_config(tmp_path, {"dataset": "femnist", "samples-per-client": K, "seed": 0}, CLIENTS)["verdict"][
        "disjoint"
    ]
    theirs = _writer_bytes(pool, writer_ids)
    hits = [theirs[b] for x in _u8(held.images) if (b := np.ascontiguousarray(x).tobytes()) in theirs]
    assert hits  # the server's held-out set (LEAF-test of all writers) holds the victims' writers
    assert record["run_writers"] == CLIENTS
    assert record["attacker_pool"] == {
        "samples": 1000,
        "shared_writers": len(set().union(*hits)),
        "shared_samples": len(hits),
    }
    assert record["verdict_public_pool"] == 1000 - len(hits)
    assert record["distractors"] == 2000 and record["reader_training_images"] == 0
    assert f"holds {len(hits)} samples of {len(set().union(*hits))} of these writers" in record["text"]


def test_the_report_shows_the_record_beside_the_verdict(tmp_path):
    from analysis.report import main
    from tests.test_analysis import attack_row, make_run, round_rows

    verdict = dict(k=32, recovered=2, guess_recovered=0, reidentified=0.1, reid_chance=0.0005, psnr_margin=-1.0)
    rows = [attack_row(1, p, **verdict) for p in range(2)]
    line = "verdict data without the run's 2 writers: a public pool of 988 samples; test line"
    for name, disjoint in (("with", {"text": line}), ("without", None)):
        run = make_run(tmp_path / name, rows, round_rows(1))
        config = json.loads((run / "config.json").read_text())
        config["verdict"] = {"distractors": 2000} | ({"disjoint": disjoint} if disjoint else {})
        (run / "config.json").write_text(json.dumps(config))
        out = tmp_path / f"report-{name}"
        assert main([str(run), "--out", str(out), "--format", "md"]) == 0
        text = (out / "report.md").read_text()
        verdict_section = text.split("## Verdict", 1)[1].split("##", 1)[0]
        assert "attacked images recovered" in verdict_section
        assert (line in verdict_section) == (disjoint is not None)


# ------------------------------------------------------------------ the reader's training set


def _digests(images_nchw_u8: np.ndarray) -> np.ndarray:
    """The fingerprint's rule written out: blake2b, 8 bytes, of each image's (C,H,W) uint8 bytes."""
    raw = b"".join(hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=8).digest() for x in images_nchw_u8)
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def _source(dataset: str):
    if dataset == "femnist":
        return None
    path = SHARED_DATA / reader.CIFAR100_SOURCE
    if not path.is_file():
        pytest.skip(f"shared offline data absent: {path}")
    return path.parent


@pytest.mark.parametrize("dataset", ["femnist", "cifar100"])
def test_the_shipped_digests_are_the_readers_own_training_set(dataset):
    images, _ = reader.training_set(dataset, _source(dataset))
    nchw = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    expected = np.unique(_digests(nchw))
    shipped = reader.training_digests(dataset)
    assert shipped.dtype == np.uint64 and np.array_equal(shipped, expected)
    info = reader.reader_info(dataset)
    record = info["training_digests"]
    path = Path(reader.__file__).parents[1] / "assets" / record["file"]
    assert record["count"] == len(shipped) and len(shipped) <= info["training_set"]["size"] == len(images)
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert path.stat().st_size < 300_000  # compact: 8 bytes an image


def _reader_images(dataset: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = reader.training_set(dataset, _source(dataset))
    pick = np.random.default_rng(0).choice(len(images), n, replace=False)
    x = torch.from_numpy(np.ascontiguousarray(images[pick])).float().div(255)
    x = x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2).contiguous()
    return x, torch.from_numpy(labels[pick])


def test_no_bundled_client_image_is_the_readers_but_a_reader_writers_are():
    """cifar100: none of the 3,000 bundled images; femnist: none of partitions 0..59 at k = 32 (the
    reader's writers are partitions 61 and up), while partition 99, a reader writer, is all theirs."""
    from fl_attack.evaluation.overlap import reader_overlap

    pool = load_bundled("cifar100")
    x = torch.from_numpy(pool.images.transpose(0, 3, 1, 2).copy()).float().div(255)
    assert reader_overlap(x, "cifar100") == 0
    pool = load_bundled("femnist")
    assert sum(reader_overlap(client_partition(pool, p, K).train.images, "femnist") for p in range(60)) == 0
    last = client_partition(pool, 99, K).train
    assert last.client_id in reader.reader_writers() and reader_overlap(last.images, "femnist") == K


@pytest.mark.parametrize(
    "dataset",
    # CIFAR-100 (21 s on 2 busy cores): slow for the suite's 15-minute budget; CI keeps the same path on FEMNIST
    ["femnist", pytest.param("cifar100", marks=pytest.mark.slow)],
)
def test_a_client_holding_reader_training_images_is_warned_about_once(dataset, caplog):
    pool = load_bundled(dataset)
    k = 20
    held = 1000 if dataset == "cifar100" else 0
    verdict = Verdict.from_data(dataset, seed=0)
    lpips = get_lpips("cpu")

    def score(images, labels, client_id):
        return verdict.score(images, labels, images, labels, psnr=0.0, lpips=lpips, client_id=client_id)

    with caplog.at_level(logging.WARNING, logger="fl_attack.evaluation.verdict"):
        client = client_partition(pool, 0, k, seed=0, held_out=held).train  # a bundled client: not the reader's
        score(client.images, client.labels, "client 0")
        assert "reader's training set" not in caplog.text
        theirs, their_labels = _reader_images(dataset, 5)
        client = client_partition(pool, 1, k, seed=0, held_out=held).train
        mixed = torch.cat([theirs, client.images[5:]])
        score(mixed, torch.cat([their_labels, client.labels[5:]]), "client 1")
        score(theirs, their_labels, "client 2")  # a second client: no second warning
    warnings = [r.getMessage() for r in caplog.records if "reader's training set" in r.getMessage()]
    assert len(warnings) == 1
    assert f"5 of the client's {k} images (client 1) are in the reader's training set" in warnings[0]
    assert "'recognized' is optimistic" in warnings[0]
