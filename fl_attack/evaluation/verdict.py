"""The verdict a reader can judge: how many of a client's images the server recovered, against what it
could get without the update. The evaluator's (it sees the ground truth); docs/verdict.md.
Over 600 lines on purpose: the ranking, the guesses, the null and the control must share one
candidate set and one 1 - SSIM, so they live in one class (the statistics are in stats.py).

For one scored attack (k reconstructions, Hungarian-matched to the client's k originals by MSE,
``match_pairs``):

* **Singled out** (``reidentified``): closed-set rank-1 identification (the biometrics protocol,
  ISO/IEC 19795-1): each matched reconstruction's own original is ranked among the client's k
  originals plus D distractors the client never held, by 1 - SSIM; the fraction ranked first.
* **Chance** (``reid_chance``): the rate at which outputs that carry nothing from the update are
  singled out under the *same* matching and ranking; the matching already pairs each output with
  the original it resembles most, so this is about k/(k+D), not 1/(k+D). It is the largest of:
  ``reid_noise`` (the attacks' own N(0, I) starts, ``NOISE_OUTPUTS`` of them, each matched and
  ranked like the attack), ``guess_reidentified`` (the best update-free guess, below),
  ``reid_chance_matched`` = k/(k+D) (an output exchangeable with the candidates: its nearest
  candidate is one of the k originals with that probability) and ``reid_chance_labels`` (a server
  that knows the recovered labels and picks, for each, a candidate of that class at random: the mean
  over the recovered labels of own/(own + distractors) of that class). ``reid_chance_uniform`` =
  1/(k+D) is kept as a column, never the headline.
* **The floor**: the update-free guesses a server can make from its public pool and the recovered
  labels, each matched like the attack and given every column (``guesses``: singled out,
  recognized, recovered, PSNR, SSIM, LPIPS): "pool mean" (k copies of the pool's mean image),
  "class mean" (each recovered label's mean image), and two sharp label guesses chosen without the
  truth, "class medoid" (the pool image of that class nearest, by 1 - SSIM, to the others of its
  class) and "reader's pick" (the pool image of that class the reader is surest of). Each floor
  column (``guess_psnr``, ``guess_ssim``, ``guess_lpips``, ``guess_reidentified``,
  ``recognized_guess``, ``guess_recovered``) is the best guess's for that column. ``psnr_margin`` =
  the attack's PSNR - ``guess_psnr``.
* **Recognized** (``recognized``): the fraction of reconstructions an independent classifier (the
  reader, fl_attack.evaluation.reader: trained on data disjoint from the clients and from the public pool)
  assigns their original's true class; ``recognized_truth`` is its accuracy on the originals (the
  ceiling).
* **Recovered** (``recovered`` of ``k``): an image is recovered when its reconstruction is singled
  out AND the reader reads it as it reads the original (same predicted class).
* **Intervals**: ``recovered_low``..``recovered_high`` (counts) and ``recognized_low``..
  ``recognized_high`` (fractions) are exact (Clopper-Pearson) 95% intervals, the k images taken as a
  sample of the client's data: a change of one image from float noise (another thread count) stays
  inside them.

The public pool is the server's own held-out set (``fl_attack.federation.data.server_test_set``: the data of
its centralised evaluation and of the ``aux`` label estimator), never a client's. The distractors are
drawn from the dataset's pool with the run's seed; any that equals one of the client's originals is
left out. On FEMNIST both leave out the run's writers where the driver knows them (``exclude_writers``,
fl_attack.evaluation.overlap): the server's held-out set is LEAF-test samples of every writer, the victims
included, and config.json says how many of them it shares. A client image the reader trained on is
found by fingerprint and warned about (``warn_reader_overlap``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from fl_attack.evaluation.metrics import _psnr, _ssim, match_pairs, psnr_recovered
from fl_attack.evaluation.overlap import leave_out_writers, reader_overlap
from fl_attack.evaluation.stats import CONFIDENCE, exceeds_chance, interval
from fl_attack.federation.loading import load_pool
from fl_attack.federation.partition import server_test_set
from fl_attack.federation.pools import get_spec
from fl_attack.schema import VERDICT, attack_columns, percent, whose

log = logging.getLogger(__name__)

__all__ = [
    "Verdict",
    "VERDICT_COLUMNS",
    "DEFAULT_DISTRACTORS",
    "DEFAULT_PUBLIC_SAMPLES",
    "verdict_line",
    "verdict_protocol",
    "verdict_summary",
    "exceeds_chance",
]

DEFAULT_DISTRACTORS = 2000  # D: candidates beside the client's own k (docs/verdict.md: why 2,000)
DEFAULT_PUBLIC_SAMPLES = 1000  # the public pool when the run holds none out (server-test-samples = 0)
FEW = 0.25  # below this fraction of the attacked images recovered, the summary says how to attack harder
_SLACK = 512  # extra distractors drawn, so that D remain after dropping the client's own images
NOISE_OUTPUTS = 2  # update-free random starts scored for the null (reid_noise); each costs an attack's ranking
NOISE_SEED = 7919  # their draws: fixed, so that the same update gets the same null
_SHARED_PICKS: dict = {}  # the shipped readers' class picks per public pool, for every verdict of the process
_SHARED_PICKS_SIZE = 8  # pools kept (each: 3 x num_classes images)
_BLOCK = 256  # candidates ranked at a time (singled_out stops an image at the first nearer one)
GUESSES = ("pool mean", "class mean", "class medoid", "reader's pick")  # the update-free guesses
# Every column the verdict adds to a row, NaN where there is no score: declared once, with its meaning and type,
# as the VERDICT columns of attacks.csv's schema (fl_attack.schema.ATTACK_SCHEMA).
VERDICT_COLUMNS = attack_columns(VERDICT)
START_GUESS = "public start"  # the attack's own start when it started from public images (AttackConfig.start)


def pixel_l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(len(a), len(b)) Euclidean distances between images a (k,C,H,W) and b (N,C,H,W)."""
    return torch.cdist(a.flatten(1), b.flatten(1))


@functools.lru_cache(maxsize=8)
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
    luminance_b, contrast_b = mu_b**2 + c1, var_b + c2  # b's terms of the denominators, once
    rows = []
    for i in range(len(a)):  # in place: each row's tensors are b-sized, so memory traffic is the cost
        ss = _gaussian_blur(a[i] * b)
        mu_ab = mu_a[i] * mu_b
        ss.sub_(mu_ab).mul_(2).add_(c2)  # 2 cov + c2
        ss.mul_(mu_ab.mul_(2).add_(c1))  # (2 mu_a mu_b + c1)(2 cov + c2)
        ss.div_((luminance_b + mu_a[i] ** 2).mul_(contrast_b + var_a[i]))
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
    (fl_attack.evaluation.reader.load_reader; loaded on first use when None). reader_writers: client ids the
    reader was trained on (a warning names an attacked one: its ``recognized`` is optimistic).
    distractor_labels (D + slack,) int64: the distractors' classes (the label-aware chance; None: NaN).
    """

    dataset: str
    public_images: torch.Tensor
    public_labels: torch.Tensor
    distractors: torch.Tensor
    num_distractors: int = DEFAULT_DISTRACTORS
    reader: torch.nn.Module | None = None
    reader_writers: frozenset = frozenset()
    distance: str = DEFAULT_DISTANCE
    distractor_labels: torch.Tensor | None = None

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
        if self.distractor_labels is not None:
            self.distractor_labels = torch.as_tensor(self.distractor_labels).long().cpu()
            if self.distractor_labels.shape != (len(self.distractors),):
                raise ValueError(
                    f"verdict: distractor_labels must have shape ({len(self.distractors)},), "
                    f"got {tuple(self.distractor_labels.shape)}"
                )
        self._num_classes = spec.num_classes
        self._psnr_recovered_db = spec.psnr_recovered_db
        # no reader (an app's own data, DatasetSpec.reader_epochs 0, none given): "singled out" leads, and
        # "recognized"/"recovered" are NaN (a reader's columns; ``score``)
        self.has_reader = self.reader is not None or spec.reader_epochs > 0
        self._distractor_prints = _fingerprints(self.distractors)
        self._public_prints = _fingerprints(self.public_images)
        self._warned: set = set()
        self._stats = None  # (candidates, their SSIM window statistics) of the attack being scored
        self._picks: dict = {}  # the guesses' per-class images, per set of public images left out
        # The shipped reader (loaded on first use) is one module per process, so a verdict built again on the
        # same pool (a replay, a test) reuses the class picks another computed: the reader over the whole pool.
        self._pool_key = None
        if self.reader is None and self.has_reader:
            digest = hashlib.blake2b(digest_size=16)
            for x in (self.public_images.detach().float(), torch.as_tensor(self.public_labels).long()):
                digest.update(np.ascontiguousarray(x.cpu().numpy()).tobytes())
            self._pool_key = (self.dataset, digest.digest())

    @classmethod
    def from_data(
        cls,
        dataset: str,
        *,
        data_dir: str | None = None,
        seed: int = 0,
        public: tuple[torch.Tensor, torch.Tensor] | None = None,
        num_distractors: int = DEFAULT_DISTRACTORS,
        exclude_writers: Iterable[str] = (),
    ) -> Verdict:
        """The run's verdict: the public pool ``public`` = (images, labels) (the server's held-out set;
        None: ``server_test_set`` of DEFAULT_PUBLIC_SAMPLES with the run's seed), and D =
        ``num_distractors`` distractors drawn from the dataset's pool (``load_pool(dataset,
        data_dir)``) with ``default_rng([seed, 38])``, with their labels (for the label-aware chance).
        exclude_writers: femnist writer names, the run's (``fl_attack.federation.data.run_writers``): the
        public pool and the distractors then hold no sample of theirs, nor an image equal to one
        (``fl_attack.evaluation.overlap.leave_out_writers``); fewer than D distractors when the other writers'
        samples do not hold them. ValueError for bad data settings, D < 1, or writers that cifar100 or
        the pool lacks."""
        if num_distractors < 1:
            raise ValueError(f"verdict: needs at least one distractor, got {num_distractors}")
        pool = load_pool(dataset, data_dir)
        if public is None:
            held = server_test_set(pool, min(DEFAULT_PUBLIC_SAMPLES, len(pool) - 1), seed=seed)
            public = (held.images, held.labels)
        kept = leave_out_writers(pool, public, exclude_writers)
        n = min(len(kept.candidates), num_distractors + _SLACK)
        idx = kept.candidates[np.sort(np.random.default_rng([seed, 38]).choice(len(kept.candidates), n, replace=False))]
        images = torch.from_numpy(np.ascontiguousarray(pool.images[idx])).float().div_(255.0)
        images = images[:, None] if images.dim() == 3 else images.permute(0, 3, 1, 2).contiguous()
        labels = torch.from_numpy(np.asarray(pool.labels[idx], dtype=np.int64))
        if kept.writer_prints:  # an image of another writer equal to one of the run's: out too
            keep = torch.tensor([p not in kept.writer_prints for p in _fingerprints(images)])
            images, labels = images[keep], labels[keep]
        from fl_attack.evaluation.reader import reader_writers

        writers = frozenset(reader_writers(dataset))
        return cls(
            dataset,
            kept.public_images,
            kept.public_labels,
            images,
            num_distractors,
            reader_writers=writers,
            distractor_labels=labels,
        )

    def warn_reader_overlap(self, truth: torch.Tensor, client_id: str = "") -> int:
        """How many of a client's originals ``truth`` (k,C,H,W) in [0,1] the reader trained on, by
        fingerprint (``fl_attack.evaluation.overlap.reader_overlap``); the first time in a run that any is,
        one warning names the count (its ``recognized`` is then optimistic); 0 without a reader (or with a
        reader the app gave, whose training set the verdict cannot see). ValueError for bad images."""
        if not self.has_reader or get_spec(self.dataset).reader_epochs == 0:
            return 0
        count = reader_overlap(truth, self.dataset)
        if count and ("reader training set",) not in self._warned:
            self._warned.add(("reader training set",))
            log.warning(
                "verdict: %d of the client's %d images%s are in the reader's training set: its 'recognized' is "
                "optimistic (warned once per run)",
                count,
                len(truth),
                f" ({client_id})" if client_id else "",
            )
        return count

    # ------------------------------------------------------------------------------- pieces

    def _logits(self, images: torch.Tensor) -> torch.Tensor:
        if self.reader is None:
            from fl_attack.evaluation.reader import load_reader

            self.reader = load_reader(self.dataset)
        with torch.no_grad():
            return self.reader(images.float().cpu())

    def _read(self, images: torch.Tensor) -> torch.Tensor:
        return self._logits(images).argmax(1)

    def _kept(self, truth: torch.Tensor) -> list[int]:
        """Indices of the D distractors kept beside ``truth``: none equals one of its images."""
        own = set(_fingerprints(truth))
        keep = [i for i, p in enumerate(self._distractor_prints) if p not in own][: self.num_distractors]
        if len(keep) < self.num_distractors and ("size",) not in self._warned:
            self._warned.add(("size",))
            log.warning("verdict: only %d distractors available (D=%d asked)", len(keep), self.num_distractors)
        return keep

    def candidates(self, truth: torch.Tensor, exclude: torch.Tensor | None = None) -> torch.Tensor:
        """The client's k originals followed by D distractors none of which equals an original (nor,
        given ``exclude`` (N,C,H,W), one of those images: a control's own client's originals)."""
        kept = self._kept(truth if exclude is None else torch.cat([truth, exclude]))
        return torch.cat([truth.float().cpu(), self.distractors[kept]])

    def singled_out(self, matched: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """(k,) bool: matched[i]'s nearest candidate (``distance``) is candidates[i], its own original
        (rank 1; a tie with another candidate counts for the image).

        1 - SSIM is computed in float32, each distinct image once (a guess repeats images), and
        candidates in blocks of ``_BLOCK``, the client's originals first: an image stops being ranked
        as soon as some candidate is nearer than its own original, so only the images that end up
        singled out meet every candidate (most update-free outputs stop after one block). The result
        is the full comparison's (``tests/test_verdict.py`` holds it to the whole distance matrix)."""
        k = matched.shape[0]
        if self.distance == "l2":
            d = pixel_l2(matched.double().cpu(), candidates.double().cpu())
            own = d[torch.arange(k), torch.arange(k)]
            return (d < own[:, None]).sum(1) == 0
        if self._stats is None or self._stats[0] is not candidates:
            self._stats = (candidates, _window_stats(candidates.float().cpu()))
        cands, (mu, var) = candidates.float().cpu(), self._stats[1]
        unique, inverse = torch.unique(matched.float().cpu(), dim=0, return_inverse=True)
        beaten = torch.zeros(k, dtype=torch.bool)
        first = max(k, _BLOCK)  # the first block holds every original, so each own distance comes from it
        for u in range(len(unique)):
            rows = (inverse == u).nonzero().flatten()  # the matched images equal to this one
            image = unique[u : u + 1]
            d = ssim_distance(image, cands[:first], (mu[:first], var[:first]))[0]
            own = d[rows]
            beaten[rows] = (d[None, :] < own[:, None]).any(1)
            for start in range(first, len(cands), _BLOCK):
                if bool(beaten[rows].all()):
                    break
                end = min(start + _BLOCK, len(cands))
                nearest = ssim_distance(image, cands[start:end], (mu[start:end], var[start:end]))[0].min()
                beaten[rows] |= nearest < own
        return ~beaten

    def _class_picks(self, keep: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per class (num_classes, C,H,W), from the public images ``keep`` (P,) bool: the class mean,
        the class medoid (the image whose mean 1 - SSIM to the others of its class is least) and the
        reader's pick (the image the reader gives the highest probability of that class); a class the
        kept pool lacks gets the pool mean, the pool image nearest it (pixel L2) and the reader's pick
        over the whole kept pool. Cached per ``keep``, and with the shipped reader per pool for the process
        (``_SHARED_PICKS``: the same pixels and labels give the same picks)."""
        key = bytes(keep.numpy().tobytes())
        shared = None if self._pool_key is None else (*self._pool_key, key)
        if key not in self._picks and shared in _SHARED_PICKS:
            self._picks[key] = _SHARED_PICKS[shared]
        if key in self._picks:
            return self._picks[key]
        images, labels = self.public_images[keep].float(), self.public_labels[keep]
        pool_mean = images.mean(0)
        central = images[int(pixel_l2(pool_mean[None], images).argmin())]
        # without a reader there is no reader's pick: an all-zero score picks each class's first image, dropped below
        zeros = torch.zeros(len(images), self._num_classes)
        probs = torch.softmax(self._logits(images), 1) if self.has_reader else zeros
        means, medoids, picks = [], [], []
        for c in range(self._num_classes):
            of_c = images[labels == c]
            surest = probs[:, c].argmax() if len(of_c) == 0 else probs[labels == c, c].argmax()
            picks.append((images if len(of_c) == 0 else of_c)[int(surest)])
            if len(of_c) == 0:
                means.append(pool_mean)
                medoids.append(central)
                continue
            means.append(of_c.mean(0))
            medoids.append(of_c[int(ssim_distance(of_c, of_c).sum(1).argmin())])
        out = {"pool mean": pool_mean, "class mean": torch.stack(means), "class medoid": torch.stack(medoids)}
        if self.has_reader:
            out["reader's pick"] = torch.stack(picks)
        self._picks[key] = out
        if shared is not None:
            while len(_SHARED_PICKS) >= _SHARED_PICKS_SIZE:
                _SHARED_PICKS.pop(next(iter(_SHARED_PICKS)))
            _SHARED_PICKS[shared] = out
        return out

    def guesses(self, labels, truth: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The update-free guesses of k images, each (k,C,H,W) in [0,1], chosen from the public pool
        and the recovered ``labels`` (k,) only (``GUESSES``): "pool mean" (k copies of the pool's mean
        image), "class mean" (each label's mean image), "class medoid" and "reader's pick" (each
        label's sharp public image: ``_class_picks``). A public image equal to one of ``truth`` (a
        client's own, where a driver's clients and the pool overlap) is left out first."""
        labels = torch.as_tensor(labels).long().cpu()
        keep = torch.ones(len(self.public_images), dtype=torch.bool)
        if truth is not None:
            own = set(_fingerprints(truth))
            keep = torch.tensor([p not in own for p in self._public_prints])
        picks = self._class_picks(keep)
        out = {"pool mean": picks["pool mean"].expand(len(labels), *picks["pool mean"].shape).clone()}
        out.update({name: picks[name][labels] for name in GUESSES[1:] if name in picks})  # no reader: no pick
        return out

    def noise(self, k: int, draw: int) -> torch.Tensor:
        """An update-free output: the attacks' own start (N(0, I) in the normalised space, as
        ``fl_attack.attacker.api._initial_images`` draws it), in pixels (k,C,H,W) clamped to [0,1];
        ``draw`` picks one of a fixed sequence (NOISE_SEED + draw)."""
        spec = get_spec(self.dataset)
        gen = torch.Generator().manual_seed(NOISE_SEED + draw)
        return spec.denormalize(torch.randn(k, *spec.image_shape, generator=gen)).clamp(0, 1)

    def label_chance(self, recon_labels, truth_labels, truth: torch.Tensor) -> float:
        """The label-aware chance: a server that knows the recovered labels (k,) and picks, for each,
        one candidate of that class at random singles out an original with probability own/(own +
        distractors) of that class (0 for a label no original has); the mean over the k labels. NaN
        without ``distractor_labels``."""
        if self.distractor_labels is None:
            return math.nan
        n = self._num_classes
        dis = torch.bincount(self.distractor_labels[self._kept(truth)], minlength=n).double()
        own = torch.bincount(torch.as_tensor(truth_labels).long().cpu(), minlength=n).double()
        labels = torch.as_tensor(recon_labels).long().cpu()
        return float((own[labels] / (own[labels] + dis[labels]).clamp_min(1)).mean())

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
        labels = torch.as_tensor(truth_labels).long().cpu()
        if not self.has_reader:  # nothing reads the images: class -1, never recognized nor recovered (score: NaN)
            read = read_truth = torch.full((len(matched),), -1, dtype=torch.long)
        else:
            read = self._read(matched.clamp(0, 1))
            read_truth = self._read(truth) if read_truth is None else read_truth
        return {
            "singled": singled,
            "read": read,
            "read_truth": read_truth,
            "recognized": read == labels,
            "recovered": singled & (read == read_truth),
        }

    def control(
        self, other: torch.Tensor, truth: torch.Tensor, truth_labels, other_truth: torch.Tensor, other_labels=None
    ) -> dict:
        """A control that can fail: another client's reconstructions ``other`` (k',C,H,W) in [0,1]
        offered as this client's, Hungarian-matched to this client's ``truth`` (k,C,H,W) exactly like an
        attack, and ranked among its k originals and D distractors with the other client's originals
        ``other_truth`` left out (where they stay, the control is zero by construction). Needs k' >= k
        (the first k are used). other_labels: the labels the other attack recovered (k',), for the
        label-aware chance. Returns {"k", "singled": count, "recovered": count (None without a reader:
        nothing reads the images, and a 0 would read as "none recovered"), "chance": the larger of
        k/(k+D) and the label-aware chance, "exceeds": ``exceeds_chance`` of the count}: a sound
        verdict keeps "exceeds" False; a leak (an output or a matching that peeks at the truth) makes
        it True. ValueError for k' < k."""
        truth = truth.detach().float().cpu().clamp(0, 1)
        other = other.detach().float().cpu().clamp(0, 1)
        k = len(truth)
        if len(other) < k:
            raise ValueError(f"control: needs at least k={k} other images, got {len(other)}")
        order, _ = match_pairs(other[:k], truth)
        matched = other[:k][torch.as_tensor(order)]
        exclude = other_truth.detach().float().cpu()
        candidates = self.candidates(truth, exclude=exclude)
        judged = self.judge(matched, truth, truth_labels, candidates)
        chance = k / len(candidates)
        if other_labels is not None:
            labels = torch.as_tensor(other_labels).long().cpu()[:k]
            label_chance = self.label_chance(labels, truth_labels, torch.cat([truth, exclude]))
            chance = max(chance, label_chance) if math.isfinite(label_chance) else chance
        singled = int(judged["singled"].sum())
        return {
            "k": k,
            "singled": singled,
            "recovered": int(judged["recovered"].sum()) if self.has_reader else None,
            "chance": chance,
            "exceeds": exceeds_chance(singled, k, chance),
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
        snapshots: dict | None = None,
        iterations: int | None = None,
        start: torch.Tensor | None = None,
    ) -> dict:
        """The verdict's columns (``VERDICT_COLUMNS``) for one attack.

        matched: its reconstructions (k,C,H,W) in [0,1], Hungarian-matched so matched[j] pairs truth[j]
        (``fl_attack.evaluation.metrics.evaluate_reconstruction``'s matched_recon); recon_labels: the labels the
        attack recovered (k,), used by the label guesses and the label-aware chance; truth, truth_labels:
        the originals; psnr: the attack's matched PSNR (dB); lpips: an LPIPS callable
        (fl_attack.evaluation.metrics.LPIPS) for the guesses. client_id: the attacked client's, to warn when
        the reader was trained on it. Every update-free output (the guesses, ``NOISE_OUTPUTS`` noise
        starts) is matched to ``truth`` with ``match_pairs`` as the attack was. Returns floats (counts as
        ints; ``guesses`` a JSON object of each guess's columns); ValueError for mismatched shapes.
        start: the attack's own start (k,C,H,W) in [0,1] when it started from public images
        (``AttackConfig.start`` "public"): scored as one more guess, ``START_GUESS``, so what the start
        alone recovers is in the floor. snapshots: {iteration: X_hat (k,C,H,W) in [0,1]} part-way
        (``Reconstruction.snapshots``), each matched and judged as the attack: ``recovered_curve`` (JSON
        {iteration: recovered}, the whole budget ``iterations`` included) and ``count_trend``: "still rising"
        when the count at the end is above the last snapshot's, else "converged" ("" without snapshots)."""
        matched, truth = matched.detach().float().cpu().clamp(0, 1), truth.detach().float().cpu().clamp(0, 1)
        if matched.shape != truth.shape:
            raise ValueError(
                f"verdict: reconstructions {tuple(matched.shape)} and originals {tuple(truth.shape)} differ"
            )
        k = len(truth)
        self.warn_reader_overlap(truth, client_id)
        if client_id and client_id in self.reader_writers and client_id not in self._warned:
            self._warned.add(client_id)
            log.warning(
                "verdict: the reader was trained on client %s's images: its 'recognized' is optimistic", client_id
            )
        candidates = self.candidates(truth)
        mine = self.judge(matched, truth, truth_labels, candidates)
        labels = torch.as_tensor(truth_labels).long().cpu()

        def pair(outputs: torch.Tensor) -> torch.Tensor:  # the attack's matching, for an update-free output
            order, _ = match_pairs(outputs, truth)
            return outputs[torch.as_tensor(order)]

        per_guess = {}
        guesses = self.guesses(recon_labels, truth)
        if start is not None:
            guesses[START_GUESS] = start.detach().float().cpu().clamp(0, 1)
        for name, guess in guesses.items():
            g = pair(guess)
            theirs = self.judge(g, truth, labels, candidates, mine["read_truth"])
            per_guess[name] = {
                "reidentified": float(theirs["singled"].double().mean()),
                "recognized": float(theirs["recognized"].double().mean()),
                "recovered": int(theirs["recovered"].sum()),
                "psnr": float(_psnr(g, truth).double().mean()),
                "ssim": float(_ssim(g, truth).double().mean()),
                "lpips": float(lpips(g, truth).double().mean()),
                "psnr_recovered": psnr_recovered(guess, truth, self._psnr_recovered_db),
            }
        noise = [self.singled_out(pair(self.noise(k, i)), candidates) for i in range(NOISE_OUTPUTS)]
        reid_noise = float(torch.cat(noise).double().mean())

        def best(column: str, better=max):
            return better(g[column] for g in per_guess.values())

        matched_chance = k / len(candidates)
        label_chance = self.label_chance(recon_labels, labels, truth)
        chances = [reid_noise, best("reidentified"), matched_chance]
        chances += [label_chance] if math.isfinite(label_chance) else []
        recovered, recognized = int(mine["recovered"].sum()), int(mine["recognized"].sum())
        curve = {
            int(it): int(
                self.judge(pair(x.float().cpu().clamp(0, 1)), truth, labels, candidates, mine["read_truth"])[
                    "recovered"
                ].sum()
            )
            for it, x in sorted((snapshots or {}).items())
        }
        trend = ""
        if curve:
            trend = "still rising" if recovered > curve[max(curve)] else "converged"
            curve[int(iterations) if iterations else max(curve) + 1] = recovered
        rec_low, rec_high = interval(recovered, k)
        recog_low, recog_high = interval(recognized, k)
        return {
            "k": k,
            "recovered": recovered,
            "recovered_low": int(math.floor(rec_low * k + 1e-9)),
            "recovered_high": int(math.ceil(rec_high * k - 1e-9)),
            "guess_recovered": best("recovered"),
            "reidentified": float(mine["singled"].double().mean()),
            "reid_chance": max(chances),
            "reid_noise": reid_noise,
            "reid_chance_matched": matched_chance,
            "reid_chance_labels": label_chance,
            "reid_chance_uniform": 1.0 / len(candidates),
            "guess_reidentified": best("reidentified"),
            "recognized": recognized / k,
            "recognized_low": recog_low,
            "recognized_high": recog_high,
            "recognized_truth": float((mine["read_truth"] == labels).double().mean()),
            "recognized_guess": best("recognized"),
            "guess_psnr": best("psnr"),
            "guess_ssim": best("ssim"),
            "guess_lpips": best("lpips", min),
            "psnr_margin": float(psnr) - best("psnr"),
            "guesses": json.dumps({n: {c: round(v, 6) for c, v in g.items()} for n, g in per_guess.items()}),
            "recovered_curve": json.dumps({str(it): n for it, n in curve.items()}) if curve else "",
            "count_trend": trend,
            "guess_psnr_recovered": best("psnr_recovered"),
        } | ({} if self.has_reader else self._unread(per_guess))

    @staticmethod
    def _unread(per_guess: dict) -> dict:
        """The columns a reader gives, NaN (and the count's curve empty) for a verdict without one, and
        each guess's recognized/recovered NaN in ``guesses``: singled out and its chance stand alone."""
        reader_columns = ("recovered", "recovered_low", "recovered_high", "guess_recovered", "recognized")
        reader_columns += ("recognized_low", "recognized_high", "recognized_truth", "recognized_guess")
        unread = {n: {**g, "recognized": math.nan, "recovered": math.nan} for n, g in per_guess.items()}
        return {c: math.nan for c in reader_columns} | {
            "guesses": json.dumps({n: {c: round(v, 6) for c, v in g.items()} for n, g in unread.items()}),
            "recovered_curve": "",
            "count_trend": "",
        }

    # ------------------------------------------------------------------------------- the evidence

    def evidence(
        self, matched: torch.Tensor, truth: torch.Tensor, candidates: torch.Tensor | None = None, n: int = 4
    ) -> list[dict]:
        """Up to ``n`` singled-out images with what singled them out, for a reader to look at
        (fl_attack.evaluation.images.save_evidence draws them; docs/verdict.md, "The evidence").

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
        "public_pool": (
            f"the server's held-out set ({public_samples or DEFAULT_PUBLIC_SAMPLES} samples), less the run's FEMNIST "
            "writers (disjoint: the sizes used)"
        ),
        "distractors": DEFAULT_DISTRACTORS,
        "distance": "1 - SSIM",
        "chance": (
            "update-free outputs under the same matching and ranking: the largest of "
            f"{NOISE_OUTPUTS} noise starts' rate, the best guess's, k/(k+D) and the label-aware chance"
        ),
        "guesses": list(GUESSES),
        "intervals": f"exact (Clopper-Pearson) {CONFIDENCE:.0%} over the k images",
        "recovered": "singled out (rank 1 among k + D) and read by the reader as its original",
    }


def _num(row: dict, name: str) -> float:
    try:
        return float(row.get(name))
    except (TypeError, ValueError):
        return math.nan


def verdict_line(row: dict) -> str:
    """One attack's verdict in a reader's words, from its row: "2 of 32 images recovered (95%: 0-7; a
    guess without the update: 0); singled out 28% (chance 4.1%: update-free outputs under the same
    matching); recognized 41% (95%: 24-59%; reader: 85% of the originals, 12% of the best guess); PSNR
    15.1 dB, 1.9 dB under the guess". Rows without a verdict (failed, or written before it existed)
    say so; rows written before the intervals leave them out."""
    k, recovered = _num(row, "k"), _num(row, "recovered")
    if math.isfinite(k) and not math.isfinite(recovered) and math.isfinite(_num(row, "reidentified")):
        return unread_line(row)  # a verdict without a reader (an app's own data): singled out leads
    if not (math.isfinite(k) and math.isfinite(recovered)):
        status = row.get("status") or "no verdict"
        return f"no verdict ({status}{': ' + str(row['error']) if row.get('error') else ''})"
    margin = _num(row, "psnr_margin")
    side = "over" if margin >= 0 else "under"
    guess = _num(row, "guess_recovered")
    low, high = _num(row, "recovered_low"), _num(row, "recovered_high")
    span = f"95%: {int(low)}-{int(high)}; " if math.isfinite(low) and math.isfinite(high) else ""
    r_low, r_high = _num(row, "recognized_low"), _num(row, "recognized_high")
    r_span = ""
    if math.isfinite(r_low) and math.isfinite(r_high):
        r_span = f"95%: {percent(r_low).rstrip('%')}-{percent(r_high)}; "
    matched = math.isfinite(_num(row, "reid_chance_matched"))
    chance = f"chance {percent(_num(row, 'reid_chance'))}" + (
        ": update-free outputs under the same matching" if matched else ", 1/(k+D)"
    )
    return (
        f"{int(recovered)} of {int(k)} images recovered ({span}a guess without the update: "
        f"{int(guess) if math.isfinite(guess) else 'n/a'}); singled out {percent(_num(row, 'reidentified'))} "
        f"({chance}); recognized {percent(_num(row, 'recognized'))} ({r_span}reader: "
        f"{percent(_num(row, 'recognized_truth'))} of the originals, {percent(_num(row, 'recognized_guess'))} "
        f"of the best guess); PSNR {_num(row, 'psnr'):.1f} dB, {abs(margin):.1f} dB {side} the guess"
        + _trend_words(row)
    )


def unread_line(row: dict) -> str:
    """The verdict of a row scored without a reader (an app's own data: no reader trained for it), led by
    singled out: "singled out 28% of 32 images (chance 4.1%: update-free outputs under the same matching;
    the best guess without the update: 3.1%); 'recovered' needs a reader (none for this dataset); PSNR
    15.1 dB, 1.9 dB under the guess"."""
    margin = _num(row, "psnr_margin")
    side = "over" if margin >= 0 else "under"
    return (
        f"singled out {percent(_num(row, 'reidentified'))} of {int(_num(row, 'k'))} images (chance "
        f"{percent(_num(row, 'reid_chance'))}: update-free outputs under the same matching; the best guess without "
        f"the update: {percent(_num(row, 'guess_reidentified'))}); 'recovered' needs a reader (none for this "
        f"dataset); PSNR {_num(row, 'psnr'):.1f} dB, {abs(margin):.1f} dB {side} the guess"
    )


def _trend_words(row: dict) -> str:
    """ "; a lower bound: still rising (0, 1, 2 at 50, 100, 200 iterations)" or "; converged (...)" from the
    row's count_trend and recovered_curve; "" for a row without them."""
    trend = row.get("count_trend") or ""
    if trend not in ("still rising", "converged"):
        return ""
    try:
        curve = json.loads(row.get("recovered_curve") or "{}")
    except (TypeError, ValueError):
        curve = {}
    steps = ""
    if curve:
        its = sorted(curve, key=int)
        steps = f" ({', '.join(str(curve[i]) for i in its)} at {', '.join(its)} iterations)"
    return f"; {'a lower bound: still rising' if trend == 'still rising' else 'converged within its schedule'}{steps}"


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
    unread = [r for r in scored if not math.isfinite(_num(r, "recovered"))]  # no reader: no count to add up
    if unread:
        singled = sum(round(_num(r, "reidentified") * int(r["k"])) for r in unread)
        lines.append(
            f"in all: {singled} of {sum(int(r['k']) for r in unread)} attacked images singled out by "
            f"{len(unread)} attack(s); 'recovered' needs a reader, and none is trained for this dataset"
        )
    counted = [r for r in scored if r not in unread]
    held = {}
    for r in counted:
        if r.get("memory"):
            held[(r["partition_id"], r["method"])] = r  # the last round's, rows in round order
    lines += [
        f"the remembering server ({method}) holds {r['recovered']} of {r['k']} images of {whose(r)} "
        f"after round {r['round']}"
        for (_, method), r in held.items()
    ]
    memoryless = [r for r in counted if not r.get("memory")]
    if memoryless:
        recovered, images = sum(int(r["recovered"]) for r in memoryless), sum(int(r["k"]) for r in memoryless)
        budget = "/".join(str(i) for i in sorted({r["iterations"] for r in memoryless}))
        # More iterations help only where a count was still rising (rows without the trend: assume they may),
        # and never under the plateau schedule, which has cut X_hat's rate to nothing by its end: 2,000
        # iterations give the images of 400 to 7 digits (docs/time-to-quality.md)
        longer = [r for r in memoryless if r.get("lr_schedule") != "plateau"]
        rising = [r for r in longer if (r.get("count_trend") or "still rising") == "still rising"]
        few = recovered < FEW * images
        hint = ""
        if few and not longer:
            hint = (
                "; the plateau schedule had cut X_hat's rate to nothing by each attack's end, so more iterations "
                "of it change nothing (docs/time-to-quality.md)"
            )
        elif few and rising:
            hint = (
                f"; still rising in {len(rising)} of {len(memoryless)}: `fl-attack replay RUN_DIR --iterations 1000` "
                "attacks the recorded updates again with more (docs/time-to-quality.md)"
            )
        elif few:  # flat within each attack's schedule, which a longer one still moves (docs/time-to-quality.md)
            hint = (
                "; every count was flat over the last half of its schedule, which a longer schedule can still "
                "move: `fl-attack replay RUN_DIR --iterations 1000` (docs/time-to-quality.md)"
            )
        lines.append(
            f"in all: {recovered} of {images} attacked images recovered by {len(memoryless)} attack(s) of "
            f"{budget} iterations" + hint
        )
    keys = ("round", "partition_id", "method", *VERDICT_COLUMNS)
    return {"lines": lines, "attacks": [{key: r.get(key) for key in keys} for r in scored]}
