"""Offline, for docs/attacker-memory.md: the label estimator on every recorded round of a memory run,
per tracked writer, fusions of the rounds, and the aux estimator, scored against the truth.

    PYTHONPATH=. python docs/attacker-memory/seed1/labels_over_rounds.py RUN_DIR
"""

import json
import sys

import numpy as np

from fl_attack.attacker.labels import (
    AuxiliaryData,
    class_support,
    estimate_class_counts,
    recover_counts,
    round_counts_on_support,
)
from fl_attack.audit.settings import RunSettings  # its owner; fl_attack.run_config no longer re-exports it
from fl_attack.evaluation.victims import ground_truth
from fl_attack.federation.update import load_update, read_update_index


def accuracy(counts: np.ndarray, truth: np.ndarray) -> float:
    return int(np.minimum(counts, truth).sum()) / int(truth.sum())


def main(run: str) -> None:
    with open(f"{run}/config.json") as f:
        settings = RunSettings.from_run_config(json.load(f)["run_config"])
    by_partition: dict[int, list] = {}
    for row in read_update_index(f"{run}/updates"):
        update, target = load_update(f"{run}/updates", row)
        by_partition.setdefault(target.partition_id, []).append((target.round, update))
    test_set = settings.server_test_set()
    aux = AuxiliaryData(test_set.images, test_set.labels)
    for p, items in sorted(by_partition.items()):
        items.sort(key=lambda item: item[0])
        _, labels = ground_truth(settings.data, [p])
        truth = np.bincount(labels.numpy(), minlength=62)
        k = int(truth.sum())
        raws = [estimate_class_counts(u, None, seed=0) for _, u in items]
        supports = [class_support(u) for _, u in items]
        each = [accuracy(round_counts_on_support(r, s, k), truth) for r, s in zip(raws, supports)]
        print(p, "per round", " ".join(f"{r}:{a:.2f}" for (r, _), a in zip(items, each)))
        for n in (1, 2, 3, 5, 15):
            mean = accuracy(round_counts_on_support(np.mean(raws[:n], axis=0), supports[0], k), truth)
            median = accuracy(round_counts_on_support(np.median(raws[:n], axis=0), supports[0], k), truth)
            print(
                f"  first {n}: mean-raw {mean:.2f}  median-raw {median:.2f}  support sizes "
                f"{int(supports[0].sum())} true {int((truth > 0).sum())}"
            )
        chosen = [(r, u) for r, u in items if r in (1, 2, 5, 10, 15)]
        print(
            p,
            "aux",
            " ".join(f"{r}:{accuracy(recover_counts(u, 'aux', aux, None, seed=0), truth):.2f}" for r, u in chosen),
        )


if __name__ == "__main__":
    main(sys.argv[1])
