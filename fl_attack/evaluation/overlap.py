"""What the verdict's data shares with a run's clients (docs/verdict.md, "Disjoint from the run's writers").
The evaluator's.

* **FEMNIST writers.** The verdict's public pool (the update-free guesses) and its distractors leave
  out the run's writers (``fl_attack.federation.data.run_writers``): every sample they wrote, and any
  image byte-equal to one (``leave_out_writers``), so neither the floor nor the ranking holds a
  victim's handwriting. The server's own held-out set (its evaluation, the ``aux`` label estimator)
  is left as it is: ``disjoint_record`` says in config.json how many of the run's writers it shares.
  CIFAR-100 has no writers: nothing to leave out beyond the verdict's rule that no distractor or
  public image equals one of the client's originals.
* **The reader's training set**, both datasets: a client image the reader trained on
  (``fl_attack.evaluation.reader.in_training_set``, by fingerprint) makes its ``recognized`` optimistic;
  ``reader_overlap`` counts them, the verdict warns once per run, and ``disjoint_record`` counts
  them over the run's clients.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from fl_attack.federation.loading import load_pool
from fl_attack.federation.partition import DataSettings, run_writers, server_test_set
from fl_attack.federation.pools import Pool, get_spec

log = logging.getLogger(__name__)

__all__ = ["Disjoint", "leave_out_writers", "reader_overlap", "disjoint_record", "disjoint_line"]


def _prints(images: torch.Tensor) -> list[bytes]:
    """One digest per float image (N,C,H,W) in [0,1] of its 8-bit pixels (as the verdict's own)."""
    q = (images.detach().cpu().float().clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    return [hashlib.blake2b(x.tobytes(), digest_size=16).digest() for x in q]


def _pool_prints(pool: Pool, idx: np.ndarray) -> list[bytes]:
    """``_prints`` of pool samples ``idx``, from the uint8 arrays (no float copy)."""
    images = pool.images[idx]
    q = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    return [hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=16).digest() for x in q]


@dataclass(frozen=True, eq=False)
class Disjoint:
    """A public pool and the distractors' candidates with a run's writers left out.

    public_images (P,C,H,W) float in [0,1], public_labels (P,) int64: the public pool given, less every
    image byte-equal to a sample of the writers (all of it when that would leave nothing:
    ``public_kept_all``). candidates: int64 ascending pool indices the distractors may be drawn from
    (the other writers' samples). writer_prints: the 8-bit digests of the writers' samples (a drawn
    distractor equal to one is dropped). writers: how many writers were left out; shared_writers,
    shared_samples: how many of them, and of their samples, the public pool given held."""

    public_images: torch.Tensor
    public_labels: torch.Tensor
    candidates: np.ndarray
    writer_prints: frozenset
    writers: int = 0
    shared_writers: int = 0
    shared_samples: int = 0
    public_kept_all: bool = False


def leave_out_writers(pool: Pool, public: tuple[torch.Tensor, torch.Tensor], writers: Iterable[str] = ()) -> Disjoint:
    """``public`` = (images (P,C,H,W) in [0,1], labels (P,)) and the pool's indices without the samples
    of ``writers`` (LEAF writer names of ``pool``; empty: nothing left out, every index a candidate).

    Raises ValueError for writers given with a pool that has none (cifar100: "cifar100 has no
    writers"), or for names the pool lacks."""
    names = sorted({str(w) for w in writers})
    images, labels = public[0].float(), public[1].long()
    if not names:
        return Disjoint(images, labels, np.arange(len(pool), dtype=np.int64), frozenset())
    spec = get_spec(pool.dataset)
    if pool.writer_names is None:
        raise ValueError(f"verdict: exclude_writers is for femnist: {spec.name} has no writers")
    index = {str(n): i for i, n in enumerate(pool.writer_names.tolist())}
    unknown = [n for n in names if n not in index]
    if unknown:
        raise ValueError(
            f"verdict: exclude_writers names {len(unknown)} writer(s) the {spec.name} pool lacks (e.g. {unknown[0]!r})"
        )
    theirs = np.isin(pool.writers, [index[n] for n in names])
    their_idx = np.flatnonzero(theirs)
    writer_of: dict[bytes, set] = {}  # an image's digest -> the run's writers who wrote it
    for p, w in zip(_pool_prints(pool, their_idx), pool.writers[their_idx].tolist(), strict=True):
        writer_of.setdefault(p, set()).add(w)
    prints = _prints(images)
    shared = torch.tensor([p in writer_of for p in prints], dtype=torch.bool)
    held = set().union(*(writer_of[p] for p in prints if p in writer_of))
    kept_all = bool(shared.all())
    if kept_all:
        log.warning(
            "verdict: every public image is a sample of the run's %d writer(s); the guesses keep them all", len(names)
        )
    else:
        images, labels = images[~shared], labels[~shared]
    return Disjoint(
        images,
        labels,
        np.flatnonzero(~theirs).astype(np.int64),
        frozenset(writer_of),
        writers=len(names),
        shared_writers=len(held),
        shared_samples=int(shared.sum()),
        public_kept_all=kept_all,
    )


def reader_overlap(truth: torch.Tensor, dataset: str) -> int:
    """How many of ``truth`` (float (k,C,H,W) in [0,1]) are, at 8 bits, images the reader of ``dataset``
    trained on (``fl_attack.evaluation.reader.in_training_set``). Raises as that does."""
    from fl_attack.evaluation.reader import in_training_set

    return int(in_training_set(truth, dataset).sum())


def disjoint_record(data: DataSettings, public_samples: int, *, num_distractors: int, default_public: int) -> dict:
    """config.json's ``verdict["disjoint"]`` of a federation (``data`` with its num_partitions N, the
    clients 0..N-1; ``public_samples``: its server-test-samples): what the verdict's data and the
    attacker's share with the run's clients, as ``Verdict.from_data`` builds the verdict's (D =
    ``num_distractors``; ``default_public``: the verdict's pool size when the run holds none out). Keys:

    * ``reader_training_images``: the clients' training images the reader trained on (by fingerprint).
    * femnist only: ``run_writers`` (how many writers the clients hold, ``run_writers``);
      ``attacker_pool``: the server's held-out set (its evaluation, the ``aux`` label estimator; None
      when the run holds none out): its ``samples``, the ``shared_writers`` of the run it holds samples
      of and those ``shared_samples``; ``verdict_public_pool``: the guesses' pool once the run's
      writers are left out; ``distractors``: the D available (fewer than asked when the other writers'
      samples do not hold them: the run's log then warns "only N distractors available").
    * ``text``: the line the report shows (``disjoint_line``).

    Raises ValueError / FileNotFoundError for bad data settings (N None for femnist included)."""
    from fl_attack.evaluation.victims import private_samples

    clients = range(int(data.num_partitions or 0))
    record: dict = {
        "reader_training_images": sum(reader_overlap(private_samples(data, p).images, data.dataset) for p in clients)
    }
    if get_spec(data.dataset).writers:
        pool = load_pool(data.dataset, data.data_dir)
        held = server_test_set(pool, public_samples, seed=data.seed) if public_samples else None
        drawn = held if held is not None else server_test_set(pool, default_public, seed=data.seed)
        kept = leave_out_writers(pool, (drawn.images, drawn.labels), run_writers(data, pool))
        record.update(
            {
                "run_writers": kept.writers,
                "attacker_pool": None
                if held is None
                else {
                    "samples": len(held),
                    "shared_writers": kept.shared_writers,
                    "shared_samples": kept.shared_samples,
                },
                "verdict_public_pool": len(kept.public_labels),
                "distractors": min(num_distractors, len(kept.candidates)),
                "distractors_asked": num_distractors,
            }
        )
    record["text"] = disjoint_line(record)
    return record


def disjoint_line(record: dict) -> str:
    """The report's line of a ``disjoint_record`` (config.json ``verdict["disjoint"]``)."""
    overlap = int(record.get("reader_training_images") or 0)
    reader = (
        f"{overlap} of the clients' images are in the reader's training set: its 'recognized' is optimistic"
        if overlap
        else "no client image is in the reader's training set"
    )
    if "run_writers" not in record:
        return f"verdict data: {reader}"
    writers, attacker = record["run_writers"], record.get("attacker_pool")
    if attacker is None:
        server = "the server holds no public pool out"
    elif attacker["shared_writers"]:
        server = (
            f"the attacker's public pool (the server's held-out set, {attacker['samples']} samples) holds "
            f"{attacker['shared_samples']} samples of {attacker['shared_writers']} of these writers"
        )
    else:
        server = "the attacker's public pool (the server's held-out set) shares none of these writers"
    asked = record.get("distractors_asked", record["distractors"])
    short = f" (of D={asked} asked: the other writers hold no more)" if record["distractors"] < asked else ""
    return (
        f"verdict data without the run's {writers} writers: a public pool of {record['verdict_public_pool']} "
        f"samples and {record['distractors']} distractors{short}; {server}; {reader}"
    )
