"""The recovered rule alone (fl_attack.evaluation.verdict, ``Verdict.judge``): an image is recovered when it is
singled out AND the reader reads it as it reads its original, and neither condition is enough.

Real bundled clients, the real reader and real distractors (D = 500 of the default 2,000, to keep it
cheap: the rule does not depend on D). Two kinds of images each meet one condition only:

* a blend: each original mixed with another of the client's originals, t of the other, t raised in
  steps of 0.05 until the reader's reading flips. Just past the flip most are still nearer their own
  original than any of the k + D candidates (singled out) but read differently; one step before, read
  the same. A gradient-inversion attack that mixes two of a client's images gives such outputs.
* a look-alike: for each original, the distractor nearest it in 1 - SSIM among those the reader reads
  as it reads the original (sought among its 64 nearest): read the same, but a candidate itself, so
  never singled out.

Each test went red with the rule broken on purpose: recovered = singled out alone (the blends), and
recovered = read the same alone (the look-alikes).
"""

from __future__ import annotations

import pytest
import torch

from fl_attack.evaluation.verdict import Verdict, ssim_distance
from fl_attack.federation.data import client_partition, load_bundled

K = 8
D = 500
HELD_OUT = {"femnist": 0, "cifar100": 1000}  # the federation's default: cifar100 clients never hold the pool
STEPS = torch.arange(1, 20) * 0.05  # t = 0.05 .. 0.95
NEAREST = 64  # the distractors nearest each original that the look-alike is sought among


@pytest.fixture(scope="module", params=["femnist", "cifar100"])
def case(request):
    """(verdict, the client's k originals, their labels, the k + D candidates, the reader's classes of the
    originals) for partition 0 of the bundled pool."""
    dataset = request.param
    truth = client_partition(load_bundled(dataset), 0, K, seed=0, held_out=HELD_OUT[dataset]).train
    verdict = Verdict.from_data(dataset, seed=0, num_distractors=D)
    candidates = verdict.candidates(truth.images)
    return verdict, truth.images, truth.labels, candidates, verdict._read(truth.images)


def _blends(verdict, truth, read_truth):
    """For each original i, (the blend just past the reader's flip, the blend one step before it, whether
    it flips at all by t = 0.95), blending toward original i - 1."""
    t = STEPS[None, :, None, None, None]
    mixed = (1 - t) * truth[:, None] + t * truth.roll(1, 0)[:, None]  # (k, steps, C, H, W)
    reads = verdict._read(mixed.flatten(0, 1)).view(len(truth), len(STEPS))
    changed = reads != read_truth[:, None]
    first = changed.int().argmax(1)  # the first step read differently (0 when none is)
    flips = changed.any(1) & (first > 0)  # read the same at t = 0.05: a step before the flip exists
    rows = torch.arange(len(truth))
    past = torch.where(flips[:, None, None, None], mixed[rows, first], truth)
    before = torch.where(flips[:, None, None, None], mixed[rows, (first - 1).clamp_min(0)], truth)
    return past, before, flips


def test_an_image_singled_out_but_read_differently_is_not_recovered(case):
    verdict, truth, labels, candidates, read_truth = case
    past, before, flips = _blends(verdict, truth, read_truth)
    after = verdict.judge(past, truth, labels, candidates, read_truth)
    assert (after["read"][flips] != read_truth[flips]).all()
    both = flips & after["singled"]
    assert int(both.sum()) >= 4, (flips, after["singled"])  # singled out, yet read as another class
    assert not after["recovered"][both].any()
    # one step of t earlier the reader still reads them as their originals: then they are recovered
    # (all but those that step leaves no longer singled out), so the reading alone tips the verdict
    earlier = verdict.judge(before, truth, labels, candidates, read_truth)
    assert (earlier["read"][flips] == read_truth[flips]).all()
    kept = both & earlier["singled"]
    assert int(kept.sum()) >= 4 and earlier["recovered"][kept].all()


def test_an_image_read_the_same_but_not_singled_out_is_not_recovered(case):
    verdict, truth, labels, candidates, read_truth = case
    distractors = candidates[len(truth) :]
    nearest = ssim_distance(truth, distractors).argsort(1)[:, :NEAREST]  # each original's, nearest first
    shown, where = torch.unique(nearest, return_inverse=True)
    reads = verdict._read(distractors[shown])[where]  # the reader's class of each, (k, NEAREST)
    lookalikes, found = truth.clone(), torch.zeros(len(truth), dtype=torch.bool)
    for i in range(len(truth)):
        same = (reads[i] == read_truth[i]).nonzero().flatten()
        if len(same):
            lookalikes[i], found[i] = distractors[nearest[i, same[0]]], True
    assert int(found.sum()) >= 4, found  # several originals have a distractor near them read alike
    out = verdict.judge(lookalikes, truth, labels, candidates, read_truth)
    assert (out["read"][found] == read_truth[found]).all()
    assert not out["singled"][found].any()
    assert not out["recovered"][found].any()


def test_the_originals_themselves_meet_both_conditions(case):
    verdict, truth, labels, candidates, read_truth = case
    out = verdict.judge(truth.clone(), truth, labels, candidates)
    assert out["singled"].all() and (out["read"] == read_truth).all() and out["recovered"].all()
    assert torch.equal(out["recognized"], read_truth == labels)
