"""The verdict's null and its controls (fl_attack.evaluation.verdict, docs/verdict.md), on real bundled
clients with fixed seeds: update-free outputs scored exactly like an attack stay within the chance
the verdict prints; another client's images re-matched to this client's originals stay at chance,
and a planted leak is caught. The interval and the label-aware chance are checked against
computations written out here (scipy's beta quantiles, numpy counts) that import nothing they check.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import beta

from fl_attack.evaluation.metrics import match_pairs
from fl_attack.evaluation.verdict import Verdict, exceeds_chance, interval
from fl_attack.federation.data import client_partition, load_bundled, server_test_set

K = 32
HELD_OUT = 1000


def _client(dataset: str, partition: int):
    held = HELD_OUT if dataset == "cifar100" else 0
    return client_partition(load_bundled(dataset), partition, K, seed=0, held_out=held).train


@pytest.fixture(scope="module", params=["femnist", "cifar100"])
def setup(request):
    dataset = request.param
    public = server_test_set(load_bundled(dataset), HELD_OUT, seed=0)
    return dataset, Verdict.from_data(dataset, seed=0, public=(public.images, public.labels))


def _no_lpips(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A stand-in for LPIPS: it only fills the guesses' lpips columns, which these tests do not read."""
    return torch.zeros(len(a))


def _row(verdict, outputs, truth) -> dict:
    """The verdict's row for update-free ``outputs`` scored as an attack's reconstructions: matched to
    ``truth`` exactly like an attack (the labels recovered exactly, the strongest a label-knowing server
    can be), so its ``reidentified`` is theirs and its ``reid_chance`` the chance the verdict prints."""
    order, _ = match_pairs(outputs, truth.images)
    matched = outputs[torch.as_tensor(order)]
    return verdict.score(matched, truth.labels, truth.images, truth.labels, psnr=0.0, lpips=_no_lpips)


@pytest.mark.heavy
def test_update_free_outputs_stay_within_the_printed_chance(setup):
    """Uniform noise and each client's own images with their pixels shuffled (the intensities, none of
    the structure), 3 clients: singled out no more often than the chance the verdict prints for them
    (each row's own ``reid_chance``); that chance is the matched null, at least k/(k+D), never the old
    1/(k+D) (the statistic and its null)."""
    dataset, verdict = setup
    gen = torch.Generator().manual_seed(3)
    singled, n, chances = 0, 0, []
    for partition in (0, 1, 2):
        truth = _client(dataset, partition)
        flat = truth.images.flatten(2)
        shuffled = flat[:, :, torch.randperm(flat.shape[-1], generator=gen)].reshape(truth.images.shape)
        noise = torch.rand(truth.images.shape, generator=gen)
        for outputs in (noise, shuffled):
            row = _row(verdict, outputs, truth)
            singled += round(row["reidentified"] * K)
            n += K
            chances.append(row["reid_chance"])
    chance = float(np.mean(chances))
    print(f"{dataset}: update-free outputs singled out {singled} of {n}; chance {chance:.4f}, 1/(k+D) {1 / 2032:.5f}")
    assert min(chances) >= (1 - 1e-12) * K / (K + verdict.num_distractors), chances
    assert not exceeds_chance(singled, n, chance)


@pytest.mark.heavy
def test_another_clients_images_re_matched_stay_at_chance_and_a_planted_leak_is_caught(setup):
    """Client b's images (a perfect reconstruction of b) offered as client a's: re-matched to a's
    originals, with b's originals out of the distractors, never more than chance. The same with 30%
    of a's matched original blended in (an output that peeks at the truth) is flagged: the control
    can fail."""
    dataset, verdict = setup
    for a, b in ((0, 1), (1, 2), (2, 0)):
        mine, theirs = _client(dataset, a), _client(dataset, b)
        control = verdict.control(theirs.images, mine.images, mine.labels, theirs.images, theirs.labels)
        assert control["k"] == K and not control["exceeds"], (a, b, control)
        leak = verdict.control(_peeking(theirs, mine, 0.3), mine.images, mine.labels, theirs.images, theirs.labels)
        assert leak["exceeds"], (a, b, leak)


def _peeking(theirs, mine, weight: float) -> torch.Tensor:
    """b's images matched to a's originals, with ``weight`` of each matched original blended in."""
    order, _ = match_pairs(theirs.images, mine.images)
    return (1 - weight) * theirs.images[torch.as_tensor(order)] + weight * mine.images


@pytest.mark.heavy
def test_a_weak_leak_is_caught_only_with_the_other_clients_originals_left_out():
    """On CIFAR-100 most of client b's originals are among the drawn distractors (2,512 of the
    3,000), so b's images offered as a's are each nearest their own copy there: a control built that
    way is zero whatever leaks. A 15% peek is flagged by control(), which leaves them out, and missed
    by the old construction."""
    dataset = "cifar100"
    public = server_test_set(load_bundled(dataset), HELD_OUT, seed=0)
    verdict = Verdict.from_data(dataset, seed=0, public=(public.images, public.labels))
    for a, b in ((0, 1), (1, 2)):
        mine, theirs = _client(dataset, a), _client(dataset, b)
        peeking = _peeking(theirs, mine, 0.15)
        assert verdict.control(peeking, mine.images, mine.labels, theirs.images, theirs.labels)["exceeds"]
        old = int(verdict.singled_out(peeking, verdict.candidates(mine.images)).sum())
        assert not exceeds_chance(old, K, K / (K + verdict.num_distractors)), old


def test_the_control_leaves_the_other_clients_originals_out():
    """With b's originals among the distractors, b's own images can never be singled out for a (each
    is nearest its own copy): the old control, zero by construction. control() removes them."""
    dataset = "femnist"
    public = server_test_set(load_bundled(dataset), HELD_OUT, seed=0)
    mine, theirs = _client(dataset, 0), _client(dataset, 1)
    planted = torch.cat([theirs.images, Verdict.from_data(dataset, seed=0).distractors])
    v = Verdict(dataset, public.images, public.labels, planted, 2000)
    candidates = v.candidates(mine.images, exclude=theirs.images)
    kept = candidates[K:]
    assert not any(bool((kept == x).flatten(1).all(1).any()) for x in theirs.images)
    assert len(candidates) == K + 2000
    with_them = v.candidates(mine.images)
    assert sum(bool((with_them[K:] == x).flatten(1).all(1).any()) for x in theirs.images) == K


@pytest.mark.parametrize("count,n", [(0, 32), (1, 32), (2, 32), (7, 16), (32, 32)])
def test_the_interval_is_clopper_pearsons(count, n):
    low, high = interval(count, n)
    exp_low = 0.0 if count == 0 else beta.ppf(0.025, count, n - count + 1)
    exp_high = 1.0 if count == n else beta.ppf(0.975, count + 1, n - count)
    assert low == pytest.approx(exp_low, abs=1e-9) and high == pytest.approx(exp_high, abs=1e-9)
    with pytest.raises(ValueError, match="count <= n"):
        interval(n + 1, n)


def test_one_image_more_or_less_stays_inside_the_interval():
    """The demo's thread-count change (1 and 2 of 32 recovered; 3 and 7 of 32 recognized): each
    count lies in the other's interval."""
    for a, b in ((1, 2), (3, 7)):
        lo_a, hi_a = interval(a, 32)
        lo_b, hi_b = interval(b, 32)
        assert lo_a * 32 <= b <= hi_a * 32 and lo_b * 32 <= a <= hi_b * 32


def test_the_label_aware_chance_is_written_out(setup):
    dataset, verdict = setup
    truth = _client(dataset, 0)
    recovered = torch.roll(truth.labels, 1)
    recovered[:3] = (truth.labels.max() + 1) % 62  # a few labels wrong, perhaps of no original
    own_prints = {x.tobytes() for x in (truth.images.numpy() * 255).round().astype(np.uint8)}
    d = (verdict.distractors.numpy() * 255).round().astype(np.uint8)
    kept = [i for i in range(len(d)) if d[i].tobytes() not in own_prints][: verdict.num_distractors]
    dis_labels = verdict.distractor_labels.numpy()[kept]
    own = np.bincount(truth.labels.numpy(), minlength=100)
    dis = np.bincount(dis_labels, minlength=100)
    expected = np.mean([own[y] / (own[y] + dis[y]) if own[y] else 0.0 for y in recovered.numpy()])
    assert verdict.label_chance(recovered, truth.labels, truth.images) == pytest.approx(expected, abs=1e-12)


def test_a_chance_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="chance must be in"):
        exceeds_chance(1, 32, 0.0)
