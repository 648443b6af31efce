"""The verdict a reader can judge: how many of a client's images the server recovered, against what it
could guess without the update. The evaluator's (it sees the ground truth); docs/verdict.md.

For one scored attack (k reconstructions, Hungarian-matched to the client's k originals):

* **The floor** (``guess_psnr``, ``guess_ssim``, ``guess_lpips``): the best score of the two guesses a
  server can make from public knowledge without the update: the mean image of its public pool (k
  copies), and the label-only guess (for each recovered label, the mean image of that class in the
  pool; the pool mean for a class the pool lacks). Each is scored like the attack (matched pairs),
  and each metric takes the better guess. ``psnr_margin`` = the attack's PSNR − ``guess_psnr``.
* **Singled out** (``reidentified``): closed-set rank-1 identification (the biometrics protocol,
  ISO/IEC 19795-1): for each matched reconstruction, its own original is ranked among the client's
  k originals plus D distractors the client never held, by 1 - SSIM (it separated best of pixel L2,
  SSIM and LPIPS on both datasets); the fraction ranked first. ``reid_chance`` = 1/(k+D), the rate of a random ranking.
* **Recognized** (``recognized``): the fraction of reconstructions an independent classifier (the
  reader, fl_attack.audit.reader: trained on data disjoint from the clients and from the public pool)
  assigns their original's true class; ``recognized_truth`` is its accuracy on the originals (the
  ceiling) and ``recognized_guess`` on the better guess (the floor).
* **Recovered** (``recovered`` of ``k``): an image is recovered when its reconstruction is singled
  out AND the reader reads it as it reads the original (same predicted class). ``guess_recovered``:
  the same count for the better guess.

The public pool is the server's own held-out set (``fl_attack.federation.data.server_test_set``: the data of
its centralised evaluation and of the ``aux`` label estimator), never a client's. The distractors are
drawn from the dataset's pool with the run's seed; any that equals one of the client's originals is
left out.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass

import numpy as np
import torch

from fl_attack.audit.metrics import _psnr, _ssim, match_pairs
from fl_attack.audit.runs import percent, whose
from fl_attack.federation.data import get_spec, load_pool, server_test_set

log = logging.getLogger(__name__)

__all__ = [
    "Verdict",
    "VERDICT_COLUMNS",
    "DEFAULT_DISTRACTORS",
    "DEFAULT_PUBLIC_SAMPLES",
    "verdict_line",
    "verdict_protocol",
    "verdict_summary",
]

DEFAULT_DISTRACTORS = 2000  # D: candidates beside the client's own k (docs/verdict.md: why 2,000)
DEFAULT_PUBLIC_SAMPLES = 1000  # the public pool when the run holds none out (server-test-samples = 0)
FEW = 0.25  # below this fraction of the attacked images recovered, the summary says how to attack harder
_SLACK = 512  # extra distractors drawn, so that D remain after dropping the client's own images
# Every column the verdict adds to a row (fl_attack.audit.runs.ATTACKS), NaN where there is no score.
VERDICT_COLUMNS = (
    "k",
    "recovered",
    "guess_recovered",
    "reidentified",
    "reid_chance",
    "recognized",
    "recognized_truth",
    "recognized_guess",
    "guess_psnr",
    "guess_ssim",
    "guess_lpips",
    "psnr_margin",
)


def pixel_l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(len(a), len(b)) Euclidean distances between images a (k,C,H,W) and b (N,C,H,W)."""
    return torch.cdist(a.flatten(1), b.flatten(1))


def _window(size: int, dtype: torch.dtype) -> torch.Tensor:
    """(size - 10, size): row r holds SSIM's 11-tap Gaussian (sigma 1.5, normalised) at columns r..r+10."""
    taps = torch.arange(11, dtype=dtype) - 5
    g = torch.exp(-(taps**2) / (2 * 1.5**2))
    g = g / g.sum()
    band = torch.zeros(size - 10, size, dtype=dtype)
    for r in range(size - 10):
        band[r, r : r + 11] = g
    return band


def _gaussian_blur(x: torch.Tensor) -> torch.Tensor:
    """SSIM's window over the last two dimensions of x (..., H, W), separably and without padding
    (the valid region, as piq.ssim and Wang et al. 2004): (..., H - 10, W - 10)."""
    return _window(x.shape[-2], x.dtype) @ x @ _window(x.shape[-1], x.dtype).T


def _window_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SSIM's local means and variances of images x (N,C,H,W)."""
    mu = _gaussian_blur(x)
    return mu, _gaussian_blur(x * x) - mu**2


def ssim_distance(a: torch.Tensor, b: torch.Tensor, b_stats=None) -> torch.Tensor:
    """(len(a), len(b)) 1 - SSIM between images a (k,C,H,W) and b (N,C,H,W) in [0,1]: SSIM of Wang et
    al. 2004 (Gaussian window 11, sigma 1.5, K1 = 0.01, K2 = 0.03, data range 1, mean over the valid
    region and the channels), piq.ssim's definition, with each image's window statistics computed once
    (b's may be given: ``_window_stats(b)``)."""
    c1, c2 = 0.01**2, 0.03**2
    (mu_a, var_a), (mu_b, var_b) = _window_stats(a), _window_stats(b) if b_stats is None else b_stats
    rows = []
    for i in range(len(a)):
        mu_ab = mu_a[i] * mu_b
        cov = _gaussian_blur(a[i] * b) - mu_ab
        ss = (2 * mu_ab + c1) / (mu_a[i] ** 2 + mu_b**2 + c1) * (2 * cov + c2) / (var_a[i] + var_b + c2)
        rows.append(1 - ss.mean(dim=(1, 2, 3)))
    return torch.stack(rows)


DISTANCES = {"l2": pixel_l2, "ssim": ssim_distance}  # the re-identification distance (docs/verdict.md)
DEFAULT_DISTANCE = "ssim"  # separated best on both datasets (docs/verdict.md)


def _fingerprints(images: torch.Tensor) -> list[bytes]:
    """One digest per image of its 8-bit pixels: equal images (from the same uint8 pool) match."""
    q = (images.detach().cpu().float().clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    return [hashlib.blake2b(x.tobytes(), digest_size=16).digest() for x in q]


@dataclass
class Verdict:
    """What the evaluator needs for the verdict of one dataset; built once per run (``from_data``).

    public_images (P,C,H,W) in [0,1] and public_labels (P,) int64: the server's public pool.
    distractors (D + slack, C,H,W) in [0,1]: candidates the client never held, in the seed's order.
    num_distractors: D. reader: a classifier, images (N,C,H,W) in [0,1] -> logits (N, classes)
    (fl_attack.audit.reader.load_reader; loaded on first use when None). reader_writers: client ids the
    reader was trained on (a warning names an attacked one: its ``recognized`` is optimistic).
    """

    dataset: str
    public_images: torch.Tensor
    public_labels: torch.Tensor
    distractors: torch.Tensor
    num_distractors: int = DEFAULT_DISTRACTORS
    reader: torch.nn.Module | None = None
    reader_writers: frozenset = frozenset()
    distance: str = DEFAULT_DISTANCE

    def __post_init__(self) -> None:
        if self.distance not in DISTANCES:
            raise ValueError(f"verdict: distance must be one of {', '.join(DISTANCES)}, got {self.distance!r}")
        spec = get_spec(self.dataset)
        self.dataset = spec.name
        shape = tuple(spec.image_shape)
        for name, x in (("public_images", self.public_images), ("distractors", self.distractors)):
            if x.dim() != 4 or tuple(x.shape[1:]) != shape or not x.is_floating_point():
                raise ValueError(f"verdict: {name} must be float (N,{','.join(map(str, shape))}), got {tuple(x.shape)}")
        if len(self.public_images) == 0 or len(self.public_labels) != len(self.public_images):
            raise ValueError("verdict: the public pool needs images and one label each")
        if self.num_distractors < 1:
            raise ValueError(f"verdict: needs at least one distractor, got {self.num_distractors}")
        pool_mean = self.public_images.mean(0)
        means = torch.stack(
            [
                self.public_images[self.public_labels == c].mean(0)
                if bool((self.public_labels == c).any())
                else pool_mean
                for c in range(spec.num_classes)
            ]
        )
        self._pool_mean, self._class_means = pool_mean, means
        self._distractor_prints = _fingerprints(self.distractors)
        self._public_prints = _fingerprints(self.public_images)
        self._warned: set = set()
        self._stats = None  # (candidates, their SSIM window statistics) of the attack being scored

    @classmethod
    def from_data(
        cls,
        dataset: str,
        *,
        data_dir: str | None = None,
        seed: int = 0,
        public: tuple[torch.Tensor, torch.Tensor] | None = None,
        num_distractors: int = DEFAULT_DISTRACTORS,
    ) -> Verdict:
        """The run's verdict: the public pool ``public`` = (images, labels) (the server's held-out set;
        None: ``server_test_set`` of DEFAULT_PUBLIC_SAMPLES with the run's seed), and D =
        ``num_distractors`` distractors drawn from the dataset's pool (``load_pool(dataset,
        data_dir)``) with ``default_rng([seed, 38])``. ValueError for bad data settings or D < 1."""
        if num_distractors < 1:
            raise ValueError(f"verdict: needs at least one distractor, got {num_distractors}")
        pool = load_pool(dataset, data_dir)
        if public is None:
            held = server_test_set(pool, min(DEFAULT_PUBLIC_SAMPLES, len(pool) - 1), seed=seed)
            public = (held.images, held.labels)
        n = min(len(pool), num_distractors + _SLACK)
        idx = np.sort(np.random.default_rng([seed, 38]).choice(len(pool), size=n, replace=False))
        images = torch.from_numpy(np.ascontiguousarray(pool.images[idx])).float().div_(255.0)
        images = images[:, None] if images.dim() == 3 else images.permute(0, 3, 1, 2).contiguous()
        from fl_attack.audit.reader import reader_writers

        writers = frozenset(reader_writers()) if get_spec(dataset).name == "femnist" else frozenset()
        return cls(dataset, public[0].float(), public[1].long(), images, num_distractors, reader_writers=writers)

    # ------------------------------------------------------------------------------- pieces

    def _read(self, images: torch.Tensor) -> torch.Tensor:
        if self.reader is None:
            from fl_attack.audit.reader import load_reader

            self.reader = load_reader(self.dataset)
        with torch.no_grad():
            return self.reader(images.float().cpu()).argmax(1)

    def candidates(self, truth: torch.Tensor) -> torch.Tensor:
        """The client's k originals followed by D distractors none of which equals an original."""
        own = set(_fingerprints(truth))
        keep = [i for i, p in enumerate(self._distractor_prints) if p not in own][: self.num_distractors]
        if len(keep) < self.num_distractors and ("size",) not in self._warned:
            self._warned.add(("size",))
            log.warning("verdict: only %d distractors available (D=%d asked)", len(keep), self.num_distractors)
        return torch.cat([truth.float().cpu(), self.distractors[keep]])

    def singled_out(self, matched: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """(k,) bool: matched[i]'s nearest candidate (``distance``) is candidates[i], its own original
        (rank 1; a tie with another candidate counts for the image)."""
        k = matched.shape[0]
        if self.distance == "l2":
            d = pixel_l2(matched.double().cpu(), candidates.double().cpu())
        else:  # float32 (2-4x faster); each distinct image once (a guess repeats images)
            if self._stats is None or self._stats[0] is not candidates:
                self._stats = (candidates, _window_stats(candidates.float().cpu()))
            unique, inverse = torch.unique(matched.float().cpu(), dim=0, return_inverse=True)
            d = ssim_distance(unique, candidates.float().cpu(), self._stats[1])[inverse]
        own = d[torch.arange(k), torch.arange(k)]
        return (d < own[:, None]).sum(1) == 0

    def guesses(self, labels, truth: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The update-free guesses of k images: "pool mean" (k copies) and "labels" (each recovered
        label's class mean in the public pool), each (k,C,H,W) in [0,1]. A public image equal to one
        of ``truth`` (a client's own, where a driver's clients and the pool overlap) is left out."""
        labels = torch.as_tensor(labels).long().cpu()
        k = len(labels)
        pool_mean, class_means = self._pool_mean, self._class_means
        if truth is not None:
            own = set(_fingerprints(truth))
            keep = torch.tensor([p not in own for p in self._public_prints])
            if not bool(keep.all()):
                images, classes = self.public_images[keep], self.public_labels[keep]
                pool_mean = images.mean(0)
                class_means = torch.stack(
                    [
                        images[classes == c].mean(0) if bool((classes == c).any()) else pool_mean
                        for c in range(len(class_means))
                    ]
                )
        return {"pool mean": pool_mean.expand(k, *pool_mean.shape).clone(), "labels": class_means[labels]}

    def judge(
        self, matched: torch.Tensor, truth: torch.Tensor, truth_labels: torch.Tensor, candidates=None, read_truth=None
    ) -> dict:
        """Singled out, recognized and recovered for k images ``matched`` (k,C,H,W) in [0,1] lined up
        with ``truth`` (k,C,H,W) and ``truth_labels`` (k,). Returns per-image tensors: singled (bool),
        read (the reader's class), recognized (bool), recovered (bool); and the reader's class of the
        originals as ``read_truth`` (given: not read again)."""
        truth = truth.float().cpu()
        candidates = self.candidates(truth) if candidates is None else candidates
        singled = self.singled_out(matched, candidates)
        read = self._read(matched.clamp(0, 1))
        read_truth = self._read(truth) if read_truth is None else read_truth
        labels = torch.as_tensor(truth_labels).long().cpu()
        return {
            "singled": singled,
            "read": read,
            "read_truth": read_truth,
            "recognized": read == labels,
            "recovered": singled & (read == read_truth),
        }

    # ------------------------------------------------------------------------------- the row

    def score(
        self,
        matched: torch.Tensor,
        recon_labels,
        truth: torch.Tensor,
        truth_labels,
        *,
        psnr: float,
        lpips,
        client_id: str = "",
    ) -> dict:
        """The verdict's columns (``VERDICT_COLUMNS``) for one attack.

        matched: its reconstructions (k,C,H,W) in [0,1], Hungarian-matched so matched[j] pairs truth[j]
        (``fl_attack.audit.metrics.evaluate_reconstruction``'s matched_recon); recon_labels: the labels the
        attack recovered (k,), used by the label-only guess; truth, truth_labels: the originals; psnr:
        the attack's matched PSNR (dB); lpips: an LPIPS callable (fl_attack.audit.metrics.LPIPS) for the
        guesses. client_id: the attacked client's, to warn when the reader was trained on it.
        Returns floats (counts as ints); ValueError for mismatched shapes."""
        matched, truth = matched.detach().float().cpu().clamp(0, 1), truth.detach().float().cpu().clamp(0, 1)
        if matched.shape != truth.shape:
            raise ValueError(
                f"verdict: reconstructions {tuple(matched.shape)} and originals {tuple(truth.shape)} differ"
            )
        k = len(truth)
        if client_id and client_id in self.reader_writers and client_id not in self._warned:
            self._warned.add(client_id)
            log.warning(
                "verdict: the reader was trained on client %s's images: its 'recognized' is optimistic", client_id
            )
        candidates = self.candidates(truth)
        mine = self.judge(matched, truth, truth_labels, candidates)
        labels = torch.as_tensor(truth_labels).long().cpu()
        floor = {"psnr": -math.inf, "ssim": -math.inf, "lpips": math.inf, "recognized": 0.0, "recovered": 0}
        for guess in self.guesses(recon_labels, truth).values():
            order, _ = match_pairs(guess, truth)
            g = guess[torch.as_tensor(order)]
            floor["psnr"] = max(floor["psnr"], float(_psnr(g, truth).double().mean()))
            floor["ssim"] = max(floor["ssim"], float(_ssim(g, truth).double().mean()))
            floor["lpips"] = min(floor["lpips"], float(lpips(g, truth).double().mean()))
            theirs = self.judge(g, truth, labels, candidates, mine["read_truth"])
            floor["recognized"] = max(floor["recognized"], float(theirs["recognized"].double().mean()))
            floor["recovered"] = max(floor["recovered"], int(theirs["recovered"].sum()))
        return {
            "k": k,
            "recovered": int(mine["recovered"].sum()),
            "guess_recovered": floor["recovered"],
            "reidentified": float(mine["singled"].double().mean()),
            "reid_chance": 1.0 / len(candidates),
            "recognized": float(mine["recognized"].double().mean()),
            "recognized_truth": float((mine["read_truth"] == labels).double().mean()),
            "recognized_guess": floor["recognized"],
            "guess_psnr": floor["psnr"],
            "guess_ssim": floor["ssim"],
            "guess_lpips": floor["lpips"],
            "psnr_margin": float(psnr) - floor["psnr"],
        }

    # ------------------------------------------------------------------------------- the evidence

    def evidence(
        self, matched: torch.Tensor, truth: torch.Tensor, candidates: torch.Tensor | None = None, n: int = 4
    ) -> list[dict]:
        """Up to ``n`` singled-out images with what singled them out, for a reader to look at
        (fl_attack.audit.images.save_evidence draws them; docs/verdict.md, "The evidence").

        matched: the reconstructions (k,C,H,W) in [0,1] lined up with the originals ``truth`` (k,C,H,W)
        in [0,1] (matched[j] pairs truth[j], as ``score`` takes them); candidates: ``candidates(truth)``
        (computed when None): the k originals, then the D distractors. The distance is always 1 - SSIM
        (``ssim_distance``, in float32 as the ranking), the verdict's published one, whatever
        ``distance`` is. Image j is singled out when no candidate is strictly nearer matched[j] than
        truth[j] (a tie counts for the image, as in ``singled_out``; a non-finite distance never).

        Which n: spread evenly over the singled-out images ranked by margin, from the largest to the
        smallest (all of them when n or fewer are). The picture then shows the clearest case and the
        closest call, what "singled out" means across the attack; the n largest margins alone would
        show only its best. Returns the entries in decreasing margin, [] when none is singled out;
        each a dict: ``index`` j (0..k-1); ``own``: 1 - SSIM of matched[j] to truth[j];
        ``nearest``: the index in candidates of the nearest candidate other than truth[j];
        ``nearest_kind``: "original" (another of the client's originals, nearest < k) or
        "distractor"; ``nearest_distance``: its 1 - SSIM to matched[j]; ``margin``:
        nearest_distance - own (>= 0). Distances are floats in [0, 2].

        ValueError when matched and truth are not one (k,C,H,W) shape with k >= 1, when candidates
        are not (N,C,H,W) with N > k starting with truth, or when n is not an int >= 0.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"verdict evidence: n must be an int >= 0, got {n!r}")
        if matched.dim() != 4 or matched.shape != truth.shape or len(truth) == 0:
            raise ValueError(
                f"verdict evidence: reconstructions {tuple(matched.shape)} and originals {tuple(truth.shape)} "
                "must be one (k,C,H,W) shape with k >= 1"
            )
        k = len(truth)
        truth = truth.detach().float().cpu()
        candidates = self.candidates(truth) if candidates is None else candidates.detach().float().cpu()
        if candidates.dim() != 4 or candidates.shape[1:] != truth.shape[1:] or len(candidates) <= k:
            raise ValueError(
                f"verdict evidence: candidates must be (N,{','.join(map(str, truth.shape[1:]))}) with N > k = {k}, "
                f"got {tuple(candidates.shape)}"
            )
        if not torch.equal(candidates[:k], truth):
            raise ValueError("verdict evidence: candidates must start with the k originals (Verdict.candidates)")
        d = ssim_distance(matched.detach().float().cpu().clamp(0, 1), candidates)
        rows = torch.arange(k)
        own = d[rows, rows].clone()
        d[rows, rows] = math.inf  # the nearest OTHER candidate
        nearest_distance, nearest = d.min(1)
        singled = torch.isfinite(own) & torch.isfinite(nearest_distance) & (own <= nearest_distance)
        margin = nearest_distance - own
        ranked = sorted(torch.nonzero(singled).flatten().tolist(), key=lambda j: (-float(margin[j]), j))
        if len(ranked) > n:
            ranked = [ranked[round(i * (len(ranked) - 1) / (n - 1))] for i in range(n)] if n > 1 else ranked[:n]
        return [
            {
                "index": j,
                "own": float(own[j]),
                "nearest": int(nearest[j]),
                "nearest_kind": "original" if int(nearest[j]) < k else "distractor",
                "nearest_distance": float(nearest_distance[j]),
                "margin": float(margin[j]),
            }
            for j in ranked
        ]


def verdict_protocol(public_samples: int) -> dict:
    """The verdict's settings as config.json records them (docs/verdict.md)."""
    return {
        "public_pool": f"the server's held-out set ({public_samples or DEFAULT_PUBLIC_SAMPLES} samples)",
        "distractors": DEFAULT_DISTRACTORS,
        "distance": "1 - SSIM",
        "recovered": "singled out (rank 1 among k + D) and read by the reader as its original",
    }


def verdict_line(row: dict) -> str:
    """One attack's verdict in a reader's words, from its row: "9 of 32 images recovered (a guess
    without the update: 0); singled out 28% (chance 0.05%); recognized 41% (reader: 85% of the
    originals, 12% of the guess); PSNR 15.1 dB, 1.9 dB under the guess". Rows without a verdict
    (failed, or written before it existed) say so."""

    def num(name):
        try:
            value = float(row.get(name))
        except (TypeError, ValueError):
            return math.nan
        return value

    k, recovered = num("k"), num("recovered")
    if not (math.isfinite(k) and math.isfinite(recovered)):
        status = row.get("status") or "no verdict"
        return f"no verdict ({status}{': ' + str(row['error']) if row.get('error') else ''})"
    margin = num("psnr_margin")
    side = "over" if margin >= 0 else "under"
    guess = num("guess_recovered")
    return (
        f"{int(recovered)} of {int(k)} images recovered (a guess without the update: "
        f"{int(guess) if math.isfinite(guess) else 'n/a'}); singled out {percent(num('reidentified'))} "
        f"(chance {percent(num('reid_chance'))}); recognized {percent(num('recognized'))} (reader: "
        f"{percent(num('recognized_truth'))} of the originals, {percent(num('recognized_guess'))} of the guess); "
        f"PSNR {num('psnr'):.1f} dB, {abs(margin):.1f} dB {side} the guess"
    )


def verdict_summary(rows: list[dict]) -> dict:
    """summary.json's "verdict" from a run's attack rows: ``lines`` (one per scored attack in round
    order, what a remembering server holds at the end per tracked client, and the memoryless
    attacks' total, with a hint to attack harder when under ``FEW`` of the images) and ``attacks``
    (each scored attack's verdict columns, with round, partition_id and method)."""
    scored = [r for r in rows if r.get("status") == "ok" and r.get("k") not in (None, "")]
    scored.sort(
        key=lambda r: (r["round"] or 0, r["partition_id"] if r["partition_id"] is not None else -1, r["method"])
    )
    lines = [f"round {r['round']}, {whose(r)}, {r['method']}: {verdict_line(r)}" for r in scored]
    held = {}
    for r in scored:
        if r.get("memory"):
            held[(r["partition_id"], r["method"])] = r  # the last round's, rows in round order
    lines += [
        f"the remembering server ({method}) holds {r['recovered']} of {r['k']} images of {whose(r)} "
        f"after round {r['round']}"
        for (_, method), r in held.items()
    ]
    memoryless = [r for r in scored if not r.get("memory")]
    if memoryless:
        recovered, images = sum(int(r["recovered"]) for r in memoryless), sum(int(r["k"]) for r in memoryless)
        budget = "/".join(str(i) for i in sorted({r["iterations"] for r in memoryless}))
        few = recovered < FEW * images
        lines.append(
            f"in all: {recovered} of {images} attacked images recovered by {len(memoryless)} attack(s) of "
            f"{budget} iterations"
            + (
                "; few at this budget: `fl-attack replay RUN_DIR --iterations 1000` attacks the recorded "
                "updates again with more (README, Quick start)"
                if few
                else ""
            )
        )
    keys = ("round", "partition_id", "method", *VERDICT_COLUMNS)
    return {"lines": lines, "attacks": [{key: r.get(key) for key in keys} for r in scored]}
