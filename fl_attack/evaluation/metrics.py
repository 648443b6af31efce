"""Reconstruction quality metrics, always computed on matched pairs.

A gradient-inversion attack returns its reconstructions in no particular order, so each metric is
reported after a one-to-one Hungarian matching of reconstructions to the true images on per-image
MSE (SME, Zhu et al. 2023). Then, per image and as the batch mean:

- PSNR = 10 log10(1 / MSE), data range 1, with MSE floored at 1e-10 (an exact match gives 100 dB);
- SSIM (Wang et al. 2004), Gaussian window 11, sigma 1.5, data range 1 (piq);
- FSIM (Zhang et al. 2011), FSIMc for RGB, FSIM for grayscale (piq);
- LPIPS-alex v0.1 (Zhang et al. 2018) with offline weights; NaN when the weights are missing;
- label-count accuracy of the recovered labels.

All image inputs are float tensors of shape (N, C, H, W), C in {1, 3}, with values in [0, 1]; values
outside [0, 1] are clamped after the checks.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from fl_attack.paths import asset

__all__ = [
    "match_pairs",
    "psnr",
    "ssim",
    "fsim",
    "LPIPS",
    "get_lpips",
    "label_count_accuracy",
    "evaluate_reconstruction",
    "PSNR_MSE_FLOOR",
    "LPIPS_WEIGHTS_ENV",
    "SHIPPED_LPIPS_WEIGHTS",
]

# MSE floor for PSNR: an exact match reports 10*log10(1/1e-10) = 100 dB instead of +inf.
PSNR_MSE_FLOOR = 1e-10
SSIM_KERNEL_SIZE = 11
SSIM_KERNEL_SIGMA = 1.5
LPIPS_MIN_SIZE = 32  # AlexNet's feature maps collapse below this (28x28 FEMNIST)
LPIPS_BATCH = 64
LPIPS_WEIGHTS_ENV = "FL_ATTACK_LPIPS_WEIGHTS"
SHIPPED_LPIPS_WEIGHTS = Path(__file__).resolve().parents[1] / "assets" / "lpips_alex.pth"


def _fmt_shape(t: torch.Tensor) -> str:
    return "(" + ",".join(str(s) for s in t.shape) + ")"


def _check_images(recon, truth) -> None:
    """Raise if recon and truth are not a valid pair of image batches.

    Both must be floating-point torch tensors of the same shape (N, C, H, W) with N >= 1,
    C in {1, 3}, and no NaN or inf. Values need not lie in [0, 1]; callers clamp afterwards.
    Raises TypeError for non-tensors and ValueError otherwise.
    """
    for name, x in (("recon", recon), ("truth", truth)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    for x in (recon, truth):
        if x.dim() != 4:
            raise ValueError(f"images must be 4-D (N,C,H,W), got shape {_fmt_shape(x)}")
    if recon.shape != truth.shape:
        raise ValueError(f"recon and truth must have the same shape, got {_fmt_shape(recon)} and {_fmt_shape(truth)}")
    if recon.shape[1] not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels, got {recon.shape[1]}")
    if recon.shape[0] == 0:
        raise ValueError("images must contain at least one image, got N=0")
    for x in (recon, truth):
        if not x.is_floating_point():
            raise ValueError(f"images must be floating point in [0,1], got {x.dtype}")
    for x in (recon, truth):
        if torch.isnan(x).any():
            raise ValueError("images contain NaN")
        if torch.isinf(x).any():
            raise ValueError("images contain inf")


def _prepare(recon, truth) -> tuple[torch.Tensor, torch.Tensor]:
    """Check, detach, clamp to [0,1]; truth is moved to recon's device and dtype."""
    _check_images(recon, truth)
    recon = recon.detach().clamp(0.0, 1.0)
    truth = truth.detach().to(device=recon.device, dtype=recon.dtype).clamp(0.0, 1.0)
    return recon, truth


def _mse_matrix(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """(N, N) float64 matrix, entry [i, j] = mean squared error of recon[i] against truth[j]."""
    r = recon.reshape(recon.shape[0], -1).double()
    t = truth.reshape(truth.shape[0], -1).double()
    # one row at a time: exact differences, memory O(N*D)
    return torch.stack([((t - r[i]) ** 2).mean(dim=1) for i in range(r.shape[0])])


def match_pairs(recon, truth) -> tuple[np.ndarray, np.ndarray]:
    """One-to-one matching of reconstructions to true images (SME, Zhu et al. 2023).

    Solves the linear assignment (Hungarian algorithm, scipy.optimize.linear_sum_assignment) on the
    (N, N) per-image MSE matrix, minimising the total MSE of the matched pairs.

    Args:
        recon, truth: float tensors (N, C, H, W), C in {1, 3}; clamped to [0, 1].
    Returns:
        (recon_idx, truth_idx), two int64 arrays of shape (N,): recon[recon_idx[i]] is matched to
        truth[truth_idx[i]], and truth_idx is 0..N-1 in order (so recon[recon_idx] lines up with truth).
    Raises:
        TypeError, ValueError: see ``_check_images``.
    """
    recon, truth = _prepare(recon, truth)
    cost = _mse_matrix(recon, truth).cpu().numpy()
    # rows = truth, columns = recon, so the row indices come back sorted
    truth_idx, recon_idx = linear_sum_assignment(cost.T)
    return recon_idx.astype(np.int64), truth_idx.astype(np.int64)


def _psnr(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    mse = ((recon.double() - truth.double()) ** 2).mean(dim=(1, 2, 3))
    return (10.0 * torch.log10(1.0 / mse.clamp_min(PSNR_MSE_FLOOR))).to(recon.dtype)


def psnr(recon, truth) -> torch.Tensor:
    """Per-image peak signal-to-noise ratio in dB, data range 1.

    PSNR_n = 10 log10(1 / MSE_n), MSE_n the mean over C, H, W of the squared difference.
    MSE is floored at PSNR_MSE_FLOOR = 1e-10, so an exact match gives 100 dB (not +inf) and means stay
    finite. Computed in float64, returned in the input dtype.

    Args:
        recon, truth: float tensors (N, C, H, W), C in {1, 3}; clamped to [0, 1]. No matching is done.
    Returns:
        Tensor (N,), values in [0, 100] dB (inputs are clamped to [0, 1], so MSE <= 1).
    Raises:
        TypeError, ValueError: see ``_check_images``.
    """
    recon, truth = _prepare(recon, truth)
    return _psnr(recon, truth)


def psnr_recovered(recon, truth, threshold_db: float) -> float:
    """Dimitrov et al.'s share of recovered images ("Data Leakage in Federated Averaging", TMLR 2022; the
    authors' fedavg/attacks/grad_attack.py, ``compute_matching``): reconstructions are matched one-to-one to
    the originals so that the summed per-image PSNR is largest (Hungarian algorithm on the PSNR matrix, not
    on MSE as ``match_pairs`` does: the two optima differ), and an image counts when its matched PSNR is
    strictly above ``threshold_db`` (their delta: 20 dB on FEMNIST, 19 dB on CIFAR-100,
    ``DatasetSpec.psnr_recovered_db``).

    Args:
        recon, truth: float tensors (N, C, H, W), C in {1, 3}; clamped to [0, 1] (the authors score the
            de-normalised images unclamped: clamping to the originals' range can only raise a PSNR).
        threshold_db: delta in dB, a finite number.
    Returns:
        the fraction of the N images recovered, a float in [0, 1].
    Raises:
        TypeError, ValueError: see ``_check_images``; ValueError for a threshold that is not finite.
    """
    if not math.isfinite(float(threshold_db)):
        raise ValueError(f"threshold_db must be a finite number of dB, got {threshold_db!r}")
    recon, truth = _prepare(recon, truth)
    mse = _mse_matrix(recon, truth).clamp_min(PSNR_MSE_FLOOR)
    gain = (10.0 * torch.log10(1.0 / mse)).cpu().numpy()  # [i, j]: recon i against truth j
    rows, cols = linear_sum_assignment(gain, maximize=True)
    return float((gain[rows, cols] > float(threshold_db)).mean())


def _ssim(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    import piq

    h, w = recon.shape[-2:]
    if min(h, w) < SSIM_KERNEL_SIZE:
        raise ValueError(f"ssim needs images of at least {SSIM_KERNEL_SIZE}x{SSIM_KERNEL_SIZE} pixels, got {h}x{w}")
    return piq.ssim(
        recon,
        truth,
        kernel_size=SSIM_KERNEL_SIZE,
        kernel_sigma=SSIM_KERNEL_SIGMA,
        data_range=1.0,
        reduction="none",
        downsample=False,
    )


def ssim(recon, truth) -> torch.Tensor:
    """Per-image structural similarity (Wang et al. 2004), via piq.ssim.

    Gaussian window 11x11, sigma 1.5, data range 1, K1 = 0.01, K2 = 0.03, no padding (the mean is
    over the valid window positions), no downsampling; for RGB the mean over channels. This equals
    scikit-image's structural_similarity(gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=1).

    Args:
        recon, truth: float tensors (N, C, H, W), C in {1, 3}, H, W >= 11; clamped to [0, 1].
    Returns:
        Tensor (N,), values in [-1, 1], 1 for identical images.
    Raises:
        TypeError, ValueError: see ``_check_images``; ValueError if H or W < 11.
    """
    recon, truth = _prepare(recon, truth)
    return _ssim(recon, truth)


def _fsim(recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    import piq

    return piq.fsim(recon, truth, data_range=1.0, chromatic=recon.shape[1] == 3, reduction="none")


def fsim(recon, truth) -> torch.Tensor:
    """Per-image feature similarity (Zhang et al. 2011), via piq.fsim.

    FSIMc (with the chromatic YIQ terms) for 3-channel images, plain FSIM for 1-channel images.

    Args:
        recon, truth: float tensors (N, C, H, W), C in {1, 3}; clamped to [0, 1].
    Returns:
        Tensor (N,), values usually in [0, 1], 1 for identical images; NaN when both images of a
        pair are flat (no phase congruency anywhere, FSIM is undefined).
    Raises:
        TypeError, ValueError: see ``_check_images``.
    """
    recon, truth = _prepare(recon, truth)
    return _fsim(recon, truth)


def _resolve_lpips_weights(weights) -> tuple[Path, str]:
    """The weights file to use and where its name came from.

    Order: the explicit ``weights`` argument; else the environment variable FL_ATTACK_LPIPS_WEIGHTS;
    else the shipped fl_attack/assets/lpips_alex.pth. The first one given is used, even if the file
    is missing: a wrong explicit path is reported, not silently replaced.
    """
    if weights is not None:
        return Path(weights), "weights argument"
    env = os.environ.get(LPIPS_WEIGHTS_ENV)
    if env:
        return Path(env), f"${LPIPS_WEIGHTS_ENV}"
    try:
        return asset("lpips_alex.pth"), "shipped asset"
    except FileNotFoundError:
        return SHIPPED_LPIPS_WEIGHTS, "shipped asset"


class LPIPS:
    """LPIPS-alex v0.1 (Zhang et al. 2018, "The Unreasonable Effectiveness of Deep Features as a
    Perceptual Metric"), loaded entirely offline.

    The network is lpips.LPIPS(net="alex", pretrained=True, pnet_rand=True): pnet_rand avoids
    torchvision's AlexNet download; the ImageNet AlexNet features and the linear heads then come from
    a state dict (torchvision layout + LPIPS heads), found in this order: the ``weights`` argument,
    the environment variable FL_ATTACK_LPIPS_WEIGHTS, the shipped fl_attack/assets/lpips_alex.pth.

    If the file is missing, unreadable or lacks the AlexNet feature weights, ``available`` is False,
    a warning is issued once, and every call returns NaN: never a number from random features.

    Attributes:
        available: whether the metric can be computed.
        weights_path: the weights file that was tried (Path).
        device: torch.device the network runs on.
    """

    def __init__(self, weights: str | Path | None = None, device="cpu"):
        self.device = torch.device(device)
        self.weights_path, source = _resolve_lpips_weights(weights)
        self.available = False
        self._net = None
        problem = self._load()
        if problem is not None:
            warnings.warn(
                f"LPIPS weights not found ({source} {self.weights_path}: {problem}); "
                "lpips will be reported as missing (NaN)",
                stacklevel=2,
            )

    def _load(self) -> str | None:
        """Build the network; return None on success, else what went wrong."""
        if not self.weights_path.is_file():
            return "no such file"
        try:
            state = torch.load(self.weights_path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a corrupt or foreign file is "unavailable", not a crash
            return f"cannot be read: {type(exc).__name__}: {exc}"
        if not isinstance(state, dict):
            return f"not a state dict but {type(state).__name__}"
        import lpips

        with warnings.catch_warnings():
            # torchvision's deprecation notes about `pretrained=`; nothing is downloaded
            warnings.simplefilter("ignore", UserWarning)
            net = lpips.LPIPS(net="alex", pretrained=True, pnet_rand=True, verbose=False)
        try:
            result = net.load_state_dict(state, strict=False)
        except RuntimeError as exc:  # wrong tensor shapes
            return f"does not fit LPIPS-alex: {exc}"
        # the linear heads also come with the lpips package; the AlexNet features only from the file
        missing = [k for k in result.missing_keys if k.startswith("net.")]
        if missing:
            return f"missing {len(missing)} AlexNet feature tensors, e.g. {missing[0]}"
        self._net = net.eval().to(self.device)
        for p in self._net.parameters():
            p.requires_grad_(False)
        self.available = True
        return None

    def __call__(self, recon, truth) -> torch.Tensor:
        """Per-image LPIPS distance, no matching.

        Args:
            recon, truth: float tensors (N, C, H, W), C in {1, 3}; clamped to [0, 1]. Grayscale is
                repeated to 3 channels; images with a side < 32 px are upsampled (bilinear,
                align_corners=False) so that side becomes 32.
        Returns:
            Tensor (N,) on recon's device, float32, values >= 0 (0 for identical images; about 0.1
            to 0.8 for real pairs), or all NaN when ``available`` is False.
        Raises:
            TypeError, ValueError: see ``_check_images``.
        """
        recon, truth = _prepare(recon, truth)
        out_device = recon.device
        if not self.available:
            return torch.full((recon.shape[0],), float("nan"), device=out_device)
        recon = self._to_network_input(recon)
        truth = self._to_network_input(truth)
        out = []
        with torch.no_grad():
            for s in range(0, recon.shape[0], LPIPS_BATCH):
                # normalize=True maps [0,1] to the [-1,1] the network expects
                d = self._net(recon[s : s + LPIPS_BATCH], truth[s : s + LPIPS_BATCH], normalize=True)
                out.append(d.reshape(-1))
        return torch.cat(out).to(out_device)

    def _to_network_input(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(device=self.device, dtype=torch.float32)
        if x.shape[1] == 1:
            x = x.repeat(1, 3, 1, 1)
        h, w = x.shape[-2:]
        if min(h, w) < LPIPS_MIN_SIZE:
            scale = LPIPS_MIN_SIZE / min(h, w)
            size = (max(LPIPS_MIN_SIZE, math.ceil(h * scale)), max(LPIPS_MIN_SIZE, math.ceil(w * scale)))
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False).clamp(0.0, 1.0)
        return x


_LPIPS_CACHE: dict[str, LPIPS] = {}


def get_lpips(device="cpu") -> LPIPS:
    """A cached LPIPS instance per device, with the default weight resolution (loading is slow).

    Returns the same object on every call for the same device; if the weights are missing it warns
    once and that instance reports NaN.
    """
    key = str(torch.device(device))
    if key not in _LPIPS_CACHE:
        _LPIPS_CACHE[key] = LPIPS(device=key)
    return _LPIPS_CACHE[key]


def _as_label_array(labels, name: str) -> np.ndarray:
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def label_count_accuracy(pred_labels, true_labels, num_classes: int | None = None) -> float:
    """Label-count accuracy of a recovered label multiset.

    acc = sum_j min(n_hat_j, n_j) / k, with n_hat_j and n_j the counts of class j among the k
    predicted and the k true labels. The order of labels is ignored; 1.0 means the exact multiset.

    Args:
        pred_labels, true_labels: 1-D integer sequences, ndarrays or tensors of the same length k >= 1,
            values in [0, num_classes).
        num_classes: number of classes; None infers max label + 1.
    Returns:
        float in [0, 1].
    Raises:
        ValueError: on different lengths, empty input, non-integer or out-of-range labels.
    """
    pred = _as_label_array(pred_labels, "pred_labels")
    true = _as_label_array(true_labels, "true_labels")
    if pred.shape[0] != true.shape[0]:
        raise ValueError(
            f"pred_labels and true_labels must have the same length, got {pred.shape[0]} and {true.shape[0]}"
        )
    if true.shape[0] == 0:
        raise ValueError("label_count_accuracy needs at least one label, got 0")
    if num_classes is None:
        num_classes = int(max(pred.max(), true.max())) + 1
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    for name, arr in (("pred_labels", pred), ("true_labels", true)):
        if arr.min() < 0 or arr.max() >= num_classes:
            raise ValueError(f"{name} must lie in [0, {num_classes}), got values from {arr.min()} to {arr.max()}")
    n_hat = np.bincount(pred, minlength=num_classes)
    n = np.bincount(true, minlength=num_classes)
    return float(np.minimum(n_hat, n).sum() / true.shape[0])


def _mean(x: torch.Tensor) -> float:
    return float(x.double().mean()) if x.numel() else float("nan")


def evaluate_reconstruction(
    recon,
    truth,
    *,
    recon_labels=None,
    true_labels=None,
    num_classes: int | None = None,
    lpips: LPIPS | None = None,
    psnr_recovered_db: float | None = None,
) -> dict:
    """All metrics of a reconstructed batch, on Hungarian-matched pairs (PI-SME, SME protocol).

    Steps: check and clamp to [0, 1]; match recon to truth on per-image MSE (``match_pairs``);
    reorder recon; compute per-image PSNR, SSIM, FSIM and LPIPS on the matched pairs.
    The reported PSNR is the mean of the per-image PSNRs (SME's convention), not the PSNR of the
    mean MSE; each per-image value is capped at 100 dB (MSE floor 1e-10).

    Args:
        recon, truth: float tensors (N, C, H, W), C in {1, 3}, H, W >= 11; clamped to [0, 1].
        recon_labels, true_labels: optional 1-D integer labels of length N, given together
            (order irrelevant: label-count accuracy).
        num_classes: for the label check; None infers it.
        lpips: an LPIPS instance; None uses ``get_lpips(recon.device)``.
        psnr_recovered_db: Dimitrov et al.'s delta in dB for "psnr_recovered" (``psnr_recovered``); None
            leaves it NaN.
    Returns:
        dict with
          "psnr", "ssim", "fsim", "lpips": float batch means (lpips NaN if its weights are missing),
          "label_accuracy": float, NaN when labels are not given,
          "psnr_recovered": float in [0, 1], Dimitrov et al.'s share above psnr_recovered_db (NaN without it),
          "per_image": {"psnr", "ssim", "fsim", "lpips"}: lists of N floats in truth order,
          "matching": list of N ints, recon i is matched to truth matching[i],
          "matched_recon": Tensor (N, C, H, W), clamped, matched_recon[j] pairs truth[j].
    Raises:
        TypeError, ValueError: see ``_check_images``, ``ssim`` and ``label_count_accuracy``;
        ValueError if only one of recon_labels and true_labels is given.
    """
    if (recon_labels is None) != (true_labels is None):
        raise ValueError("recon_labels and true_labels must be given together")
    recon, truth = _prepare(recon, truth)
    recon_idx, truth_idx = match_pairs(recon, truth)
    matched = recon[torch.as_tensor(recon_idx, device=recon.device)]
    matching = np.empty(len(recon_idx), dtype=np.int64)
    matching[recon_idx] = truth_idx

    if lpips is None:
        lpips = get_lpips(recon.device)
    per_image = {
        "psnr": _psnr(matched, truth),
        "ssim": _ssim(matched, truth),
        "fsim": _fsim(matched, truth),
        "lpips": lpips(matched, truth),
    }
    label_accuracy = float("nan")
    if recon_labels is not None:
        label_accuracy = label_count_accuracy(recon_labels, true_labels, num_classes)

    return {
        **{name: _mean(values) for name, values in per_image.items()},
        "label_accuracy": label_accuracy,
        "psnr_recovered": (
            float("nan") if psnr_recovered_db is None else psnr_recovered(recon, truth, psnr_recovered_db)
        ),
        "per_image": {name: [float(v) for v in values.cpu()] for name, values in per_image.items()},
        "matching": [int(i) for i in matching],
        "matched_recon": matched,
    }
