"""Tests of fl_attack.evaluation.metrics on real CIFAR-100 and FEMNIST images.

References: scikit-image for PSNR and SSIM, piq.fsim called image by image and the paper's FSIM
written out in numpy (tests/fsim_reference.py) for FSIM, a brute-force
assignment for the Hungarian matching, and for the LPIPS wrapper a from-the-paper LPIPS-alex forward
pass (Zhang et al. 2018) and the lpips package's own forward pass with the shared offline AlexNet
trunk (the check on the shipped trunk's values).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fl_attack.evaluation import metrics as M

REPO = Path(__file__).resolve().parents[1]
# The larger real data sets, where a checkout has them beside it (FL_ATTACK_SHARED_DATA overrides).
DATA_DIRS = [Path(os.environ.get("FL_ATTACK_SHARED_DATA", REPO.parent / "shared" / "data"))]
ASSETS = REPO / "fl_attack" / "assets"


def _load_npz(shared_name: str, asset_name: str) -> np.ndarray:
    """`images` from the shared offline data, else from the identical bundled copy."""
    for path in [d / shared_name for d in DATA_DIRS] + [ASSETS / asset_name]:
        if path.is_file():
            with np.load(path, allow_pickle=False) as data:
                return data["images"]
    pytest.skip(f"no {shared_name} found")


@pytest.fixture(scope="module")
def cifar() -> torch.Tensor:
    """48 real CIFAR-100 images, (48,3,32,32) float32 in [0,1]."""
    images = _load_npz("cifar100_subset.npz", "cifar100_sample.npz")
    idx = np.random.default_rng(0).choice(len(images), 48, replace=False)
    return torch.from_numpy(images[idx]).permute(0, 3, 1, 2).float().div(255)


@pytest.fixture(scope="module")
def femnist() -> torch.Tensor:
    """48 real FEMNIST images, (48,1,28,28) float32 in [0,1]."""
    images = _load_npz("femnist_subset.npz", "femnist_sample.npz")
    idx = np.random.default_rng(1).choice(len(images), 48, replace=False)
    return torch.from_numpy(images[idx]).unsqueeze(1).float().div(255)


@pytest.fixture(scope="module", params=["cifar", "femnist"])
def images(request, cifar, femnist) -> torch.Tensor:
    return {"cifar": cifar, "femnist": femnist}[request.param]


@pytest.fixture(scope="module")
def lpips_metric() -> M.LPIPS:
    metric = M.LPIPS()
    assert metric.available, "the shipped LPIPS weights must load"
    return metric


def _mid_range(x: torch.Tensor) -> torch.Tensor:
    """Scale to [0.25, 0.75] so that small noise is never clipped."""
    return 0.25 + 0.5 * x


def _noisy(x: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return x + sigma * torch.randn(x.shape, generator=g)


# ---------------------------------------------------------------- identical images


def test_identical_images_give_the_ideal_scores(images, lpips_metric):
    x = images[:16]
    assert torch.all(M.psnr(x, x) == 100.0)  # MSE floor 1e-10 -> 100 dB
    assert torch.allclose(M.ssim(x, x), torch.ones(16), atol=1e-5)
    assert torch.allclose(M.fsim(x, x), torch.ones(16), atol=1e-5)
    assert torch.allclose(lpips_metric(x, x), torch.zeros(16), atol=1e-6)


def test_evaluate_on_identical_batch(images, lpips_metric):
    x = images[:8]
    out = M.evaluate_reconstruction(x, x, lpips=lpips_metric)
    assert out["psnr"] == 100.0
    assert out["ssim"] == pytest.approx(1.0, abs=1e-5)
    assert out["fsim"] == pytest.approx(1.0, abs=1e-5)
    assert out["lpips"] == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(out["label_accuracy"])
    assert out["matching"] == list(range(8))
    assert torch.equal(out["matched_recon"], x)
    assert all(len(v) == 8 for v in out["per_image"].values())


# ---------------------------------------------------------------- PSNR with known noise


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
def test_constant_offset_on_mid_grey_is_20_db(dtype, tol):
    truth = torch.full((3, 1, 28, 28), 0.5, dtype=dtype)
    recon = truth + 0.1  # MSE 0.01
    assert torch.allclose(M.psnr(recon, truth).double(), torch.full((3,), 20.0, dtype=torch.float64), atol=tol)
    assert torch.allclose(M.psnr(truth - 0.1, truth).double(), torch.full((3,), 20.0, dtype=torch.float64), atol=tol)


@pytest.mark.parametrize("sigma", [0.01, 0.03, 0.05])
def test_gaussian_noise_psnr_is_minus_20_log10_sigma(images, sigma):
    truth = _mid_range(images[:32])
    recon = _noisy(truth, sigma, seed=2)
    assert recon.min() >= 0 and recon.max() <= 1  # no clipping, so MSE estimates sigma^2
    got = M.psnr(recon, truth)
    expected = -20 * math.log10(sigma)
    # per image the MSE over D pixels has relative s.d. sqrt(2/D): <= 0.23 dB for D = 784
    assert torch.all((got - expected).abs() < 0.8)
    assert got.mean().item() == pytest.approx(expected, abs=0.1)


def test_out_of_range_values_are_clamped(cifar):
    truth = torch.ones_like(cifar[:4])
    assert torch.all(M.psnr(cifar[:4] + 2.0, truth) == 100.0)
    assert torch.all(M.psnr(-cifar[:4] - 1.0, torch.zeros_like(truth)) == 100.0)


# ---------------------------------------------------------------- Hungarian matching


def test_matching_recovers_a_random_permutation(images):
    truth = images[:32]
    perm = torch.from_numpy(np.random.default_rng(3).permutation(32))
    recon_idx, truth_idx = M.match_pairs(truth[perm], truth)
    assert np.array_equal(truth_idx, np.arange(32))
    assert np.array_equal(perm.numpy()[recon_idx], np.arange(32))  # recon[recon_idx[i]] is truth[i]


def test_matching_recovers_a_permutation_under_noise(images):
    truth = images[:32]
    perm = np.random.default_rng(4).permutation(32)
    recon = _noisy(truth, 0.05, seed=5)[perm]
    recon_idx, _ = M.match_pairs(recon, truth)
    assert np.array_equal(perm[recon_idx], np.arange(32))


def test_matched_psnr_of_permuted_batch_equals_unpermuted(images, lpips_metric):
    truth = _mid_range(images[:24])
    noisy = _noisy(truth, 0.04, seed=6)
    perm = np.random.default_rng(7).permutation(24)
    out = M.evaluate_reconstruction(noisy[perm], truth, lpips=lpips_metric)
    assert out["matching"] == [int(p) for p in perm]  # recon i was truth perm[i]
    assert torch.equal(out["matched_recon"], noisy)
    assert np.allclose(out["per_image"]["psnr"], M.psnr(noisy, truth).numpy(), rtol=0, atol=1e-6)
    assert np.allclose(out["per_image"]["ssim"], M.ssim(noisy, truth).numpy(), rtol=0, atol=1e-6)
    assert np.allclose(out["per_image"]["lpips"], lpips_metric(noisy, truth).numpy(), rtol=0, atol=1e-6)
    # the reported PSNR is the mean of the per-image PSNRs
    assert out["psnr"] == pytest.approx(float(np.mean(out["per_image"]["psnr"])), abs=1e-9)


def test_matching_is_optimal_against_brute_force(cifar):
    # 6 heavily corrupted images: total matched MSE equals the minimum over all 720 permutations
    truth = cifar[:6]
    recon = (0.5 * truth[torch.tensor([3, 1, 5, 0, 2, 4])] + 0.5 * cifar[6:12]).clamp(0, 1)
    recon_idx, truth_idx = M.match_pairs(recon, truth)
    mse = ((recon[:, None] - truth[None]) ** 2).double().mean(dim=(2, 3, 4)).numpy()
    best = min(sum(mse[p[j], j] for j in range(6)) for p in itertools.permutations(range(6)))
    assert mse[recon_idx, truth_idx].sum() == pytest.approx(best, rel=1e-12)
    assert sorted(recon_idx.tolist()) == list(range(6))


# ---------------------------------------------------------------- scikit-image reference


def _skimage_pairs(x: torch.Tensor):
    """Real pairs with a range of similarity: unrelated images, noisy copies, blurred copies."""
    n = 8
    truth = x[:n]
    yield "unrelated", x[n : 2 * n], truth
    yield "noisy", _noisy(truth, 0.1, seed=8).clamp(0, 1), truth
    yield "blurred", F.avg_pool2d(truth, 3, stride=1, padding=1, count_include_pad=False), truth


def test_psnr_and_ssim_match_scikit_image(images):
    skm = pytest.importorskip("skimage.metrics")
    for kind, recon, truth in _skimage_pairs(images):
        got_psnr = M.psnr(recon, truth).double().numpy()
        got_ssim = M.ssim(recon, truth).double().numpy()
        for i in range(len(truth)):
            r, t = recon[i].double().numpy(), truth[i].double().numpy()
            ref_psnr = skm.peak_signal_noise_ratio(t, r, data_range=1)
            ref_ssim = skm.structural_similarity(
                r, t, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=1, channel_axis=0
            )
            assert got_psnr[i] == pytest.approx(ref_psnr, abs=1e-4), kind
            assert got_ssim[i] == pytest.approx(ref_ssim, abs=1e-4), kind


def test_fsim_orders_degradations(images):
    truth = _mid_range(images[:16])
    scores = [M.fsim(_noisy(truth, s, seed=9).clamp(0, 1), truth).mean().item() for s in (0.02, 0.08, 0.2)]
    assert 1.0 > scores[0] > scores[1] > scores[2] > 0.0


def test_fsim_matches_piq_image_by_image(images):
    """M.fsim against piq.fsim called on its own: one image at a time, in 0..255 with data_range=255,
    on the clamped inputs; FSIMc (chromatic) for RGB. fl_attack's FSIM is piq's, so this checks what
    the wrapper decides (per-image values, data range, clamping, FSIMc for colour), not FSIM itself."""
    import piq

    colour = images.shape[1] == 3
    pairs = list(_skimage_pairs(images))
    pairs.append(("out of range", _noisy(images[:8], 0.3, seed=12), images[:8]))  # clamped before scoring
    for kind, recon, truth in pairs:
        got = M.fsim(recon, truth)
        assert got.shape == (len(truth),) and got.dtype == torch.float32, kind
        r, t = (255 * z.clamp(0, 1).double() for z in (recon, truth))
        for i in range(len(truth)):
            ref = piq.fsim(r[i : i + 1], t[i : i + 1], data_range=255, chromatic=colour, reduction="none")
            assert float(got[i]) == pytest.approx(float(ref), abs=1e-6), (kind, i)
        if colour:  # the chromatic terms are really in: plain FSIM on the same pairs is another number
            plain = piq.fsim(r, t, data_range=255, chromatic=False, reduction="none")
            assert float((got.double() - plain).abs().max()) > 1e-3, kind


def test_fsim_matches_the_papers_formula_written_out(images):
    """M.fsim against FSIM (FSIMc for RGB) written out from Zhang et al. 2011 and the authors'
    FeatureSIM.m in numpy (tests/fsim_reference.py: Kovesi's phase congruency with log-Gabor filters,
    the Scharr gradient, no piq), on real pairs from unrelated to near-identical: within 1e-3 (measured
    at most 2e-4: float32 against float64), while the pairs' own values are 0.1 and more apart."""
    from tests.fsim_reference import fsim_reference

    colour = images.shape[1] == 3
    values = []
    for kind, recon, truth in _skimage_pairs(images):
        got = M.fsim(recon, truth)
        for i in range(3):
            r, t = (255 * z[i].clamp(0, 1).double().numpy() for z in (recon, truth))
            r, t = (z.transpose(1, 2, 0) if colour else z[0] for z in (r, t))
            expected = fsim_reference(t, r)
            assert float(got[i]) == pytest.approx(expected, abs=1e-3), (kind, i)
            values.append(expected)
    assert max(values) - min(values) > 0.1


# ---------------------------------------------------------------- LPIPS


def _reference_lpips_alex(state: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """LPIPS v0.1 written out from Zhang et al. 2018 on torchvision's AlexNet layout.

    x, y: (N,3,H,W) in [0,1], H, W >= 32. Returns (N,).
    """
    shift = torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1)
    scale = torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1)

    def features(z):
        z = ((2 * z - 1) - shift) / scale

        def conv(z, name, **kw):  # conv + ReLU of torchvision's alexnet.features
            return F.relu(F.conv2d(z, state[f"net.{name}.weight"], state[f"net.{name}.bias"], **kw))

        f1 = conv(z, "slice1.0", stride=4, padding=2)
        f2 = conv(F.max_pool2d(f1, 3, 2), "slice2.3", padding=2)
        f3 = conv(F.max_pool2d(f2, 3, 2), "slice3.6", padding=1)
        f4 = conv(f3, "slice4.8", padding=1)
        f5 = conv(f4, "slice5.10", padding=1)
        return [f1, f2, f3, f4, f5]

    total = 0
    for k, (a, b) in enumerate(zip(features(x), features(y))):
        a = a / (a.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
        b = b / (b.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
        total = total + F.conv2d((a - b) ** 2, state[f"lin{k}.model.1.weight"]).mean(dim=(2, 3))
    return total.reshape(-1)


def test_lpips_matches_the_paper_forward_pass(cifar, femnist, lpips_metric):
    state = torch.load(M.SHIPPED_LPIPS_WEIGHTS, map_location="cpu", weights_only=True)
    with torch.no_grad():
        # RGB 32x32, fed as is
        x, y = cifar[:8], _noisy(cifar[:8], 0.1, seed=10).clamp(0, 1)
        assert torch.allclose(lpips_metric(x, y), _reference_lpips_alex(state, x, y), atol=1e-5)
        x, y = cifar[:8], cifar[8:16]
        assert torch.allclose(lpips_metric(x, y), _reference_lpips_alex(state, x, y), atol=1e-5)
        # grayscale 28x28: repeated to 3 channels and upsampled to 32x32
        g, h = femnist[:8], femnist[8:16]
        up = lambda z: F.interpolate(z.repeat(1, 3, 1, 1), size=(32, 32), mode="bilinear", align_corners=False)
        assert torch.allclose(lpips_metric(g, h), _reference_lpips_alex(state, up(g), up(h)), atol=1e-5)


def _shared_lpips_weights() -> Path:
    for d in DATA_DIRS:
        if (d / "lpips" / "alex.pth").is_file():
            return d / "lpips" / "alex.pth"
    pytest.skip("no shared lpips/alex.pth (the project's offline LPIPS weights) beside the checkout")


def test_lpips_matches_the_lpips_package(cifar, femnist, lpips_metric):
    """M.LPIPS (the shipped weights file) against the lpips package's own LPIPS-alex v0.1 forward pass,
    its linear heads from the package's bundled v0.1 file and its AlexNet trunk from the shared
    offline weights (not the shipped asset), fed [-1,1] inputs as the package documents."""
    import lpips

    trunk = {
        k: v
        for k, v in torch.load(_shared_lpips_weights(), map_location="cpu", weights_only=True).items()
        if k.startswith("net.")
    }
    assert len(trunk) == 10  # 5 convolutions, weight and bias
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        net = lpips.LPIPS(net="alex", pretrained=True, pnet_rand=True, verbose=False)
    result = net.load_state_dict(trunk, strict=False)
    assert not result.unexpected_keys
    # the heads (lin0..4, also reachable as lins) stay the package's own
    assert {k.split(".")[0] for k in result.missing_keys} <= {f"lin{i}" for i in range(5)} | {"lins", "scaling_layer"}
    net.eval()

    def package(x, y):
        with torch.no_grad():
            return net(2 * x - 1, 2 * y - 1).reshape(-1)

    up = lambda z: F.interpolate(z.repeat(1, 3, 1, 1), size=(32, 32), mode="bilinear", align_corners=False)
    pairs = [
        ("noisy", cifar[:8], _noisy(cifar[:8], 0.1, seed=10).clamp(0, 1)),
        ("unrelated", cifar[:8], cifar[8:16]),
        ("grey", femnist[:8], femnist[8:16]),  # repeated to RGB and upsampled to 32x32 by M.LPIPS
    ]
    for kind, x, y in pairs:
        got = lpips_metric(x, y)
        ref = package(up(x), up(y)) if x.shape[1] == 1 else package(x, y)
        assert float(ref.min()) > 1e-3, kind  # real distances, not a degenerate zero
        assert torch.allclose(got, ref, rtol=0, atol=1e-6), (kind, float((got - ref).abs().max()))


def test_shipped_lpips_heads_are_the_lpips_package_v01_heads():
    import lpips

    package_heads = torch.load(
        Path(lpips.__file__).parent / "weights" / "v0.1" / "alex.pth", map_location="cpu", weights_only=True
    )
    shipped = torch.load(M.SHIPPED_LPIPS_WEIGHTS, map_location="cpu", weights_only=True)
    assert set(package_heads) == {f"lin{k}.model.1.weight" for k in range(5)}
    for key, value in package_heads.items():
        assert torch.equal(shipped[key], value), key
    # the AlexNet trunk has torchvision's ImageNet shapes
    assert shipped["net.slice1.0.weight"].shape == (64, 3, 11, 11)
    assert shipped["net.slice5.10.weight"].shape == (256, 256, 3, 3)


def test_lpips_grows_with_noise_on_real_images(images, lpips_metric):
    truth = _mid_range(images[:16])
    g = torch.Generator().manual_seed(11)
    z = torch.randn(truth.shape, generator=g)
    levels = [0.01, 0.03, 0.1, 0.3]
    per_level = torch.stack([lpips_metric((truth + s * z).clamp(0, 1), truth) for s in levels])
    means = per_level.mean(dim=1)
    assert torch.all(means[1:] > means[:-1]), means
    assert torch.all(per_level[-1] > per_level[0])  # every image: heavy noise > light noise
    assert torch.all(per_level >= 0)


def test_lpips_distinguishes_real_images(cifar, lpips_metric):
    same = lpips_metric(cifar[:16], cifar[:16])
    other = lpips_metric(cifar[:16], cifar[16:32])
    assert torch.all(other > 0.05) and torch.all(other < 1.0)
    assert torch.all(same < 1e-6)


def test_missing_lpips_weights_give_nan_and_a_warning(tmp_path, cifar):
    missing = tmp_path / "nowhere.pth"
    with pytest.warns(
        UserWarning, match=r"LPIPS weights not found \(.*nowhere\.pth.*lpips will be reported as missing \(NaN\)"
    ):
        metric = M.LPIPS(weights=missing)
    assert not metric.available
    assert torch.isnan(metric(cifar[:4], cifar[:4])).all()
    out = M.evaluate_reconstruction(cifar[:4], cifar[:4], lpips=metric)
    assert math.isnan(out["lpips"]) and all(math.isnan(v) for v in out["per_image"]["lpips"])
    assert out["psnr"] == 100.0  # the other metrics are unaffected


def test_environment_variable_selects_the_weights(tmp_path, monkeypatch, cifar):
    monkeypatch.setenv(M.LPIPS_WEIGHTS_ENV, str(tmp_path / "absent.pth"))
    with pytest.warns(UserWarning, match=r"FL_ATTACK_LPIPS_WEIGHTS .*absent\.pth"):
        assert not M.LPIPS().available
    monkeypatch.setenv(M.LPIPS_WEIGHTS_ENV, str(M.SHIPPED_LPIPS_WEIGHTS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert M.LPIPS().available


def test_weights_without_the_alexnet_trunk_are_unavailable(tmp_path, cifar):
    # only the linear heads: the trunk would stay random, which must not produce a number
    shipped = torch.load(M.SHIPPED_LPIPS_WEIGHTS, map_location="cpu", weights_only=True)
    heads_only = tmp_path / "heads.pth"
    torch.save({k: v for k, v in shipped.items() if not k.startswith("net.")}, heads_only)
    with pytest.warns(UserWarning, match=r"missing 10 AlexNet feature tensors"):
        metric = M.LPIPS(weights=heads_only)
    assert not metric.available and torch.isnan(metric(cifar[:2], cifar[:2])).all()

    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match=r"cannot be read"):
        assert not M.LPIPS(weights=garbage).available


def test_get_lpips_is_cached_per_device():
    assert M.get_lpips() is M.get_lpips("cpu")
    assert M.get_lpips().available


# ---------------------------------------------------------------- labels


@pytest.mark.parametrize(
    "pred, true, expected",
    [
        ([0, 1, 2, 3], [3, 2, 1, 0], 1.0),  # same multiset, any order
        ([0, 0, 1, 2], [0, 1, 1, 3], 0.5),  # min counts: class 0 -> 1, class 1 -> 1
        ([5, 5, 5, 5], [5, 5, 5, 6], 0.75),
        ([1, 1], [2, 2], 0.0),
        ([7], [7], 1.0),
    ],
)
def test_label_count_accuracy_known_values(pred, true, expected):
    assert M.label_count_accuracy(pred, true, 10) == pytest.approx(expected)
    assert M.label_count_accuracy(torch.tensor(pred), np.array(true), 10) == pytest.approx(expected)
    assert M.label_count_accuracy(pred, true, None) == pytest.approx(expected)


def test_evaluate_reports_label_accuracy(cifar, lpips_metric):
    out = M.evaluate_reconstruction(
        cifar[:4], cifar[:4], recon_labels=[3, 3, 1, 0], true_labels=[0, 1, 2, 3], num_classes=100, lpips=lpips_metric
    )
    assert out["label_accuracy"] == pytest.approx(0.75)


@pytest.mark.parametrize(
    "pred, true, num_classes, message",
    [
        ([0, 1, 2], [0, 1, 2, 3], 10, "pred_labels and true_labels must have the same length, got 3 and 4"),
        ([], [], 10, "label_count_accuracy needs at least one label, got 0"),
        ([0, 10], [0, 1], 10, "pred_labels must lie in [0, 10), got values from 0 to 10"),
        ([0, 1], [-1, 1], 10, "true_labels must lie in [0, 10), got values from -1 to 1"),
        ([0.0, 1.0], [0, 1], 10, "pred_labels must be integers, got dtype float64"),
        ([[0, 1]], [0, 1], 10, "pred_labels must be 1-D, got shape (1, 2)"),
    ],
)
def test_label_count_accuracy_errors(pred, true, num_classes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        M.label_count_accuracy(pred, true, num_classes)


# ---------------------------------------------------------------- input checks


def _image_functions(lpips_metric):
    return {
        "match_pairs": M.match_pairs,
        "psnr": M.psnr,
        "ssim": M.ssim,
        "fsim": M.fsim,
        "lpips": lpips_metric,
        "evaluate": lambda r, t: M.evaluate_reconstruction(r, t, lpips=lpips_metric),
    }


_GOOD = torch.rand(4, 1, 28, 28, generator=torch.Generator().manual_seed(12))
_NAN = _GOOD.clone()
_NAN[2, 0, 3, 4] = float("nan")
_INF = _GOOD.clone()
_INF[1, 0, 0, 0] = float("inf")

INPUT_ERRORS = [
    (
        _GOOD,
        torch.rand(5, 1, 28, 28),
        ValueError,
        "recon and truth must have the same shape, got (4,1,28,28) and (5,1,28,28)",
    ),
    (_GOOD[0], _GOOD[0], ValueError, "images must be 4-D (N,C,H,W), got shape (1,28,28)"),
    (_GOOD[None], _GOOD[None], ValueError, "images must be 4-D (N,C,H,W), got shape (1,4,1,28,28)"),
    (torch.rand(4, 2, 28, 28), torch.rand(4, 2, 28, 28), ValueError, "images must have 1 or 3 channels, got 2"),
    (_GOOD[:0], _GOOD[:0], ValueError, "images must contain at least one image, got N=0"),
    ((_GOOD * 255).to(torch.uint8), _GOOD, ValueError, "images must be floating point in [0,1], got torch.uint8"),
    (_NAN, _GOOD, ValueError, "images contain NaN"),
    (_GOOD, _NAN, ValueError, "images contain NaN"),
    (_INF, _GOOD, ValueError, "images contain inf"),
    (_GOOD.numpy(), _GOOD, TypeError, "recon must be a torch.Tensor, got ndarray"),
    (_GOOD, _GOOD.tolist(), TypeError, "truth must be a torch.Tensor, got list"),
]


@pytest.mark.parametrize("recon, truth, error, message", INPUT_ERRORS)
@pytest.mark.parametrize("name", ["match_pairs", "psnr", "ssim", "fsim", "lpips", "evaluate"])
def test_every_input_error_raises_its_message(name, recon, truth, error, message, lpips_metric):
    fn = _image_functions(lpips_metric)[name]
    with pytest.raises(error, match=re.escape(message)):
        fn(recon, truth)


def test_ssim_needs_the_window_size():
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(13))
    with pytest.raises(ValueError, match=re.escape("ssim needs images of at least 11x11 pixels, got 8x8")):
        M.ssim(x, x)


def test_labels_must_come_together(cifar, lpips_metric):
    with pytest.raises(ValueError, match="recon_labels and true_labels must be given together"):
        M.evaluate_reconstruction(cifar[:2], cifar[:2], recon_labels=[0, 1], lpips=lpips_metric)


# ------------------------------------------------------------ Dimitrov et al.'s share of recovered images


def _recovered_by_permutations(recon: np.ndarray, truth: np.ndarray, threshold_db: float) -> float:
    """The slow reference (Dimitrov et al., compute_matching): every one-to-one assignment, the one of the
    largest summed per-image PSNR (data range 1), then the share strictly above the threshold. numpy only."""
    n = len(truth)
    mse = ((recon[:, None] - truth[None]) ** 2).reshape(n, n, -1).mean(-1)
    gain = 10 * np.log10(1 / np.maximum(mse, 1e-10))
    best = max(itertools.permutations(range(n)), key=lambda p: sum(gain[i, p[i]] for i in range(n)))
    return float(np.mean([gain[i, best[i]] > threshold_db for i in range(n)]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_psnr_recovered_is_the_psnr_maximising_assignment_s_share(images, seed):
    """On 6 real images and reconstructions of mixed quality (some near their original, some noise, some a
    blend of two originals, where MSE's and PSNR's optimal matchings can differ), the share above delta is the
    brute-force reference's, at thresholds that split the pairs; shuffling the reconstructions changes nothing."""
    g = torch.Generator().manual_seed(seed)
    truth = images[torch.randperm(len(images), generator=g)[:6]]
    noise = torch.tensor([0.02, 0.05, 0.1, 0.3, 0.0, 0.0])[:, None, None, None]
    recon = (truth + noise * torch.randn(truth.shape, generator=g)).clamp(0, 1)
    recon[4] = torch.rand(truth[0].shape, generator=g)
    recon[5] = 0.5 * truth[5] + 0.5 * truth[0]
    for threshold in (12.0, 20.0, 26.0):
        expected = _recovered_by_permutations(recon.numpy(), truth.numpy(), threshold)
        assert M.psnr_recovered(recon, truth, threshold) == pytest.approx(expected)
        shuffled = recon[torch.randperm(6, generator=g)]
        assert M.psnr_recovered(shuffled, truth, threshold) == pytest.approx(expected)
    assert 0 < M.psnr_recovered(recon, truth, 20.0) < 1  # the thresholds above do split the pairs
    assert M.psnr_recovered(truth, truth, 99.0) == 1.0  # an exact copy: 100 dB
    with pytest.raises(ValueError, match="threshold_db must be a finite number"):
        M.psnr_recovered(recon, truth, float("nan"))
