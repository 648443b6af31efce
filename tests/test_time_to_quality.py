"""The short-budget levers (docs/time-to-quality.md): the public start and the snapshots the evaluator
scores to say whether a count was still rising. Real FEMNIST updates, fixed seeds."""

from __future__ import annotations

import json
import math

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
    from fl_attack.evaluation.metrics import get_lpips
    from fl_attack.evaluation.verdict import Verdict
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
    from fl_attack.evaluation.verdict import verdict_line

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
    from pathlib import Path

    from analysis.experiments.time_to_quality import seed_table, table
    from fl_attack.records import read_csv
    from fl_attack.schema import FORMER_NAMES

    root = Path(__file__).resolve().parents[1] / "docs"
    runs = sorted(p.parent for p in (root / "time-to-quality").glob("*/levers.csv"))  # paper, heldout, ...
    assert len(runs) >= 2
    page = (root / "time-to-quality.md").read_text()
    seeded = 0
    for folder in (root / "time-to-quality", *runs):  # the demo's, then each other run's
        rows = read_csv(folder / "levers.csv", FORMER_NAMES)[1]  # dated records: nodes, today's gradients_per_iteration
        made = table(rows)
        assert (folder / "levers.md").read_text() == made
        assert made.strip() in page
        if (folder / "seeds.md").exists():  # the third measurement's: each setting over its seeds
            seeded += 1
            assert (folder / "seeds.md").read_text() == seed_table(rows)
            assert seed_table(rows).strip() in page
    assert seeded >= 3


def test_the_seed_table_groups_replays_that_differ_only_in_the_seed():
    """Unit test: one row per setting (options without seed=, iterations, m), each seed's summed count."""
    from analysis.experiments.time_to_quality import seed_table

    def row(lever, options, recovered, iterations="200"):
        return {"lever": lever, "options": options, "iterations": iterations, "gradients_per_iteration": "3",
                "recovered": recovered, "k": "32", "psnr": "15.0", "attack_seconds": "20.0"}  # fmt: skip

    rows = [row("a", "lr_images=0.3", "5"), row("a", "lr_images=0.3", "2"), row("b", "lr_images=0.3,seed=1", "4"),
            row("c", "lr_images=0.3", "9", iterations="1000")]  # fmt: skip
    lines = seed_table(rows).splitlines()
    assert lines[2] == "| `lr_images=0.3` | 200 | 3 | 0, 1 | 7, 4 of 64 | 5.5 | 15.00 | 20.0 |"
    assert lines[3].startswith("| `lr_images=0.3` | 1000 | 3 | 0 | 9 of 32 | 9.0 |")
    assert len(lines) == 4


# --- the learning-rate schedule made for short budgets (attack-lr-schedule) ------------------------------


def test_the_steps_schedule_is_todays_attack_and_the_audit_default_sets_its_own_rates():
    """Unit test: "steps" gives AttackConfig's own (the paper's) rates, so today's attack stays reachable;
    the audit's default sets its schedule's values, and attack-options still override them."""
    from fl_attack.attacker.attacks import LR_SCHEDULES
    from fl_attack.audit.settings import ADDED_KEYS, AuditSettings

    paper = AttackConfig()
    steps = AuditSettings(attack_lr_schedule="steps").attack_config()
    assert (steps.lr_images, steps.lr_decay, steps.lr_schedule) == (paper.lr_images, paper.lr_decay, paper.lr_schedule)
    from fl_attack.attacker.rule import SHORT

    default = AuditSettings()
    assert default.attack_lr_schedule == "auto"  # the audit's rule picks it per update (tests/test_rule.py)
    config = default.attack_config()  # until the update is known: the rule's short-trajectory schedule
    for name, value in LR_SCHEDULES[SHORT["schedule"]].items():
        assert getattr(config, name) == value
    mine = AuditSettings(attack_options="lr_images=0.7").attack_config()
    assert mine.lr_images == 0.7 and mine.lr_decay == config.lr_decay
    assert ADDED_KEYS["attack-lr-schedule"] == "steps"  # a run recorded before the key resumes as it ran


def test_an_unknown_lr_schedule_is_refused_before_any_work():
    from fl_attack.audit.settings import AuditSettings

    with pytest.raises(ValueError, match="attack-lr-schedule must be one of"):
        AuditSettings.from_run_config({"attack-lr-schedule": "fast"})
    with pytest.raises(ValueError, match="lr_schedule must be one of steps, cosine, plateau"):
        AttackConfig(lr_schedule="linear")


@pytest.mark.parametrize("iterations", [8, 200])
def test_the_cosine_schedule_is_the_half_cosine_written_out(iterations):
    """Unit test against the formula (not the code): after step i the rate is lr (1 + cos(pi i / K)) / 2."""

    from fl_attack.attacker.attacks.base import sme_schedulers

    x = torch.zeros(3, requires_grad=True)
    optimizer = torch.optim.Adam([x], lr=0.3)
    (scheduler,) = sme_schedulers([optimizer], AttackConfig(iterations=iterations, lr_schedule="cosine"))
    for i in range(1, iterations + 1):
        optimizer.step()
        scheduler.step()
        want = 0.3 * (1 + math.cos(math.pi * i / iterations)) / 2
        assert optimizer.param_groups[0]["lr"] == pytest.approx(want, abs=1e-12)
    assert sme_schedulers([optimizer], AttackConfig(iterations=iterations, lr_decay=False)) == []


def test_dimitrov_keeps_its_own_decay_whatever_smes_switch_says():
    """Unit test: lr_decay (SME's) does not switch off Dimitrov et al.'s exponential decay."""
    from fl_attack.federation.update import ClientOptimizer
    from tests.test_dimitrov import TanhMLP, _case

    for lr_decay in (True, False):
        attack = _case(TanhMLP(), "femnist", 4, 2, 1, ClientOptimizer("sgd"), iterations=20, lr_decay=lr_decay)[0]
        optimizer = torch.optim.Adam([torch.zeros(2, requires_grad=True)], lr=0.4)
        (scheduler,) = attack.schedulers([optimizer])
        for _ in range(10):
            optimizer.step()
            scheduler.step()
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4 * 0.995)  # FEMNIST: x0.995 every 10


def test_the_plateau_schedule_cuts_the_rate_when_the_loss_stalls_as_written_out():
    """Unit test against the rule written out (not torch's code): a loss that has not reached a new low
    (by 1e-4 relative) for more than `patience` steps multiplies every rate by `factor`."""
    from fl_attack.attacker.attacks.base import sme_schedulers

    config = AttackConfig(iterations=100, lr_schedule="plateau", lr_plateau_patience=3, lr_plateau_factor=0.5)
    x = torch.zeros(3, requires_grad=True)
    optimizer = torch.optim.Adam([x], lr=0.3)
    (scheduler,) = sme_schedulers([optimizer], config)
    losses = [1.0, 0.9, 0.9, 0.95, 0.9, 0.9, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.79999, 0.7]
    best, bad, lr = math.inf, 0, 0.3
    for loss in losses:
        scheduler.step(loss)
        if loss < best * (1 - 1e-4):
            best, bad = loss, 0
        else:
            bad += 1
        if bad > 3:
            lr, bad = lr * 0.5, 0
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr, abs=1e-15)
    assert lr < 0.3  # the sequence stalls long enough to cut the rate at least once
