"""femnist-digits: FEMNIST's ten digits, an MNIST-like task with FEMNIST's writers as clients.

The pool is the digit samples (classes 0-9, whose labels FEMNIST already numbers 0-9) of whatever
femnist reads (the bundled sample: 12,555 of its 18,796 samples, 104 writers with LEAF-train digits;
or a real LEAF directory, an .npz, a saved dataset, through ``load_pool("femnist", data_dir)``). A client
is one writer, as on femnist (``DatasetSpec.writers``): partition p is the p-th writer by name with at
least k LEAF-train digits, the server's test set is drawn from LEAF-test digits. 1x28x28 in LEAF's
convention (255 = white background), FEMNIST's normalisation and recovery threshold (20 dB), the
paper's FEMNIST CNN with a 10-way output layer. Its reader (``reader_femnist-digits.pt``) is trained
on the LEAF-train digits of the same last 40 writers as femnist's; it has no diffusion prior, so
DGGI (and ``image_prior = "diffusion"``) refuse it.

This module is the whole dataset: the registry's entry (``DIGITS``), registered by
fl_attack.federation's import of it.
"""

from __future__ import annotations

from fl_attack.federation.femnist import FEMNIST
from fl_attack.federation.loading import load_pool
from fl_attack.federation.pools import DatasetSpec, Pool, register_dataset

NAME = "femnist-digits"
DIGITS_CLASSES = 10  # FEMNIST's labels 0-9 are the digits '0'..'9' (10-35 A-Z, 36-61 a-z)


def digits_of(pool: Pool) -> Pool:
    """The digit samples (labels 0..9) of a femnist :class:`Pool`, in pool order, as a femnist-digits
    pool: images uint8 (n,28,28), labels int64 0..9, ``writers`` / ``split`` of those samples and the
    same ``writer_names`` (a writer without digits keeps its name and holds no sample). Read-only
    arrays, like every loaded pool. ValueError for a pool that is not femnist."""
    if pool.dataset != FEMNIST.name:
        raise ValueError(f"{NAME} is cut from a {FEMNIST.name} pool, not {pool.dataset}")
    keep = pool.labels < DIGITS_CLASSES
    return Pool(
        dataset=NAME,
        images=pool.images[keep],
        labels=pool.labels[keep],
        writers=pool.writers[keep],
        writer_names=pool.writer_names,
        split=pool.split[keep],
    )


def load_digits(source: str | None) -> Pool:
    """The femnist-digits pool of a data source: :func:`digits_of` ``load_pool("femnist", source)``
    (None: the bundled sample). Raises as that does."""
    return digits_of(load_pool(FEMNIST.name, source))


def _model(**kwargs):
    """The paper's FEMNIST CNN with a 10-way output layer (fl_attack.federation.models.FemnistCNN,
    imported on first use)."""
    from fl_attack.federation.models import FemnistCNN

    return FemnistCNN(num_classes=DIGITS_CLASSES, **kwargs)


DIGITS = register_dataset(
    DatasetSpec(
        name=NAME,
        image_shape=FEMNIST.image_shape,
        num_classes=DIGITS_CLASSES,
        mean=FEMNIST.mean,
        std=FEMNIST.std,
        psnr_recovered_db=FEMNIST.psnr_recovered_db,
        writers=True,
        background=FEMNIST.background,
        hflip=False,
        sample=FEMNIST.sample,
        load=load_digits,
        model=_model,
        reader_epochs=8,  # ten classes learn fast; 8 epochs cost ~25 min on the shared 2-core CPU
        reader_crop_pad=2,
        prior_steps=None,
    )
)

__all__ = ["DIGITS", "DIGITS_CLASSES", "NAME", "digits_of", "load_digits"]
