"""The verdict's evidence on real bundled clients with fixed seeds: ``Verdict.evidence`` (which singled-out
images, their own original's distance and the nearest other candidate's).

Distances and nearest candidates are checked against a brute-force loop over ``piq.ssim``, one call per
reconstruction, that imports nothing it checks.
"""

from __future__ import annotations

import math

import piq
import pytest
import torch

from fl_attack.audit.verdict import Verdict
from fl_attack.federation.data import client_partition, load_bundled, server_test_set

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
