"""An app with its own data through the audit plugin (strategies.audit.audit(dataset=AppData(...))).

The app's data is real FEMNIST (the bundled sample): its handwritten digits, area-downsampled to 1x16x16, a
shape and a class count (10) the registry does not know. Its ClientApp (Flower's, with the audit's
leakage_metadata mod) trains a small CNN on one writer's 8 digits per client; the ServerApp wraps Flower's
FedAvg with ``audit``, handing it the app's public set (other writers' digits) and distractors (others
again). One round, in process (tests/inprocess.py's grid and in-process attack workers), the audit's own
attack (PI-SME, nodes by the rule: no prior, no public pool).
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from clients.mods import leakage_metadata
from fl_attack.federation.app_data import AppData
from fl_attack.federation.loading import load_bundled
from fl_attack.records import read_csv
from tests.inprocess import InProcessGrid

K, BATCH, LR = 8, 4, 0.05  # each client's 8 digits, 2 local steps of plain SGD


def digits_by_writer() -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """The bundled FEMNIST digits as the app holds them: images float (N,1,16,16) in [0,1] (area-downsampled
    from 28x28), labels int64 (N,) in 0..9, and each one's writer index (N,)."""
    pool = load_bundled("femnist")
    digits = np.flatnonzero(pool.labels < 10)
    full = torch.from_numpy(pool.images[digits].astype(np.float32) / 255.0)[:, None]
    images = torch.nn.functional.interpolate(full, size=(16, 16), mode="area").clamp(0, 1)
    return images, torch.from_numpy(pool.labels[digits]), pool.writers[digits]


IMAGES, LABELS, WRITERS = digits_by_writer()
# clients: the first two writers with 8 digits; public set and distractors: 300 digits each of other writers
_writers = [w for w in np.unique(WRITERS) if (WRITERS == w).sum() >= K]
CLIENTS = {p: np.flatnonzero(WRITERS == w)[:K] for p, w in enumerate(_writers[:2])}
_others = np.flatnonzero(~np.isin(WRITERS, _writers[:2]))
PUBLIC, DISTRACTORS = _others[:300], _others[300:600]


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 16 * 16, 10)
    )


client_app = ClientApp(mods=[leakage_metadata(lr=LR, batch_size=BATCH, local_epochs=1)])


@client_app.train()
def train(msg: Message, context: Context):
    """One epoch of plain SGD on the client's 8 digits, in batches of 4 (the app's own training)."""
    model = net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    idx = CLIENTS[int(context.node_config["partition-id"])]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for start in range(0, K, BATCH):
        optimizer.zero_grad()
        b = idx[start : start + BATCH]
        torch.nn.functional.cross_entropy(model(IMAGES[b]), LABELS[b]).backward()
        optimizer.step()
    metrics = MetricRecord({"train_loss": 0.0, "num-examples": K})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


class AppGrid(InProcessGrid):
    """tests/inprocess.py's grid, delivering to this app's ClientApp."""

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            delivered = Message(copy.deepcopy(msg.content), node, msg.metadata.message_type)
            replies.append(client_app(delivered, self.contexts[node]))
        return replies


@pytest.fixture(autouse=True)
def _registry_restored():
    """An app's dataset is registered for the process (fl_attack.federation.app_data): each test here gives
    the registry back as it found it, so the rest of the suite sees the built-in datasets only."""
    from fl_attack.federation import app_data as app_data_module
    from fl_attack.federation import loading
    from fl_attack.federation.pools import DATASETS

    datasets, names = dict(DATASETS), set(app_data_module._APP_NAMES)
    yield
    DATASETS.clear()
    DATASETS.update(datasets)
    app_data_module._APP_NAMES.clear()
    app_data_module._APP_NAMES.update(names)
    loading._cached_pool.cache_clear()


def app_data(**changes) -> AppData:
    fields = dict(
        name="digits16",
        image_shape=(1, 16, 16),
        num_classes=10,
        public=(IMAGES[PUBLIC], LABELS[PUBLIC]),
        distractors=(IMAGES[DISTRACTORS], LABELS[DISTRACTORS]),
    )
    return AppData(**(fields | changes))


def _context(tmp_path, **keys) -> Context:
    run_config = {"results-dir": str(tmp_path), "run-name": "app", "attack-clients": "all", **keys}
    return Context(1, 0, {}, RecordDict(), run_config)


def test_an_apps_own_data_is_audited_and_its_verdict_leads_with_singled_out(tmp_path, monkeypatch, capsys):
    import fl_attack.audit.service as service_module
    from fl_attack.attacker.runtime.workers import InlineWorkers
    from strategies.audit import audit

    monkeypatch.setattr(service_module, "federation_workers", lambda settings, threads: InlineWorkers("cpu", threads))
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # what Flower's runtime sets
    context = _context(tmp_path, **{"attack-iterations": 60})
    truth = lambda p: (IMAGES[CLIENTS[p]], LABELS[CLIENTS[p]])  # noqa: E731
    strategy = audit(FedAvg(fraction_evaluate=0.0), context, model=net, dataset=app_data(), truth=truth)
    grid = AppGrid(dict(context.run_config), partitions=(0, 1))
    strategy.start(grid=grid, initial_arrays=ArrayRecord(net().state_dict()), num_rounds=1, train_config=ConfigRecord())

    run = tmp_path / "app"
    _, rows = read_csv(run / "attacks.csv")
    assert sorted(int(r["partition_id"]) for r in rows) == [0, 1]
    for row in rows:
        assert row["status"] == "ok" and row["method"] == "pisme" and int(row["k"]) == K, row
        # singled out and its chance are scored: the app's distractors (D = 300) beside the client's 8
        assert 0 <= float(row["reidentified"]) <= 1 and math.isclose(float(row["reid_chance_matched"]), K / (K + 300))
        assert math.isfinite(float(row["guess_psnr"])) and math.isfinite(float(row["psnr"]))
        # no reader for the app's data: its columns are empty, not a 0 that reads as "nothing recovered"
        for column in ("recovered", "recovered_low", "recognized", "recognized_truth", "guess_recovered"):
            assert row[column] in ("", "nan"), (column, row[column])
        assert "reader's pick" not in json.loads(row["guesses"])
    summary = json.loads((run / "summary.json").read_text())
    lines = summary["verdict"]["lines"]
    assert all(line.split(": ", 1)[1].startswith("singled out ") for line in lines[:2]), lines
    assert "'recovered' needs a reader" in lines[-1] and lines[-1].startswith("in all: ")
    config = json.loads((run / "config.json").read_text())
    assert config["audit"]["app_data"]["image_shape"] == [1, 16, 16] and config["audit"]["app_data"]["public"] == 300
    assert "the verdict leads with 'singled out'" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("changes", "keys", "message"),
    [
        ({"public": (IMAGES[PUBLIC] * 255, LABELS[PUBLIC])}, {}, r"public images must be finite and in \[0,1\]"),
        ({"public": (IMAGES[PUBLIC[:50]], LABELS[PUBLIC[:50]])}, {}, "has 50 images; the verdict needs at least 100"),
        ({"public": (IMAGES[PUBLIC], LABELS[PUBLIC] + 5)}, {}, r"labels must be in 0..9 \(num_classes=10\)"),
        ({"public": (IMAGES[PUBLIC][:, :, :14], LABELS[PUBLIC])}, {}, r"images must be float \(N,1,16,16\)"),
        ({"distractors": (IMAGES[DISTRACTORS[:20]], LABELS[DISTRACTORS[:20]])}, {}, "distractors has 20 images"),
        ({"name": "cifar100"}, {}, "a built-in dataset has that name"),
        ({}, {"attack-method": "dggi"}, "digits16 has no diffusion prior"),  # an attack that needs a prior
    ],
)
def test_bad_app_data_is_refused_before_any_round(tmp_path, changes, keys, message):
    from strategies.audit import audit

    with pytest.raises(ValueError, match=message):
        audit(FedAvg(), _context(tmp_path, **keys), model=net, dataset=app_data(**changes))
    assert not (tmp_path / "app").exists()  # no run folder: refused before anything was written


def test_without_a_reader_the_control_counts_singled_out_and_no_recovered():
    """Another client's images offered as this client's, under the app's verdict (no reader): the control
    still counts how many were singled out against its chance, and gives no "recovered" count (a 0 would
    read as "none recovered" where nothing read the images)."""
    from fl_attack.evaluation.verdict import Verdict
    from fl_attack.federation.app_data import register_app_data

    name = register_app_data(app_data()).name
    verdict = Verdict.from_data(name, seed=0, public=(IMAGES[PUBLIC], LABELS[PUBLIC]))
    assert not verdict.has_reader
    mine, theirs = (IMAGES[CLIENTS[p]] for p in (0, 1))
    control = verdict.control(theirs, mine, LABELS[CLIENTS[0]], theirs, LABELS[CLIENTS[1]])
    assert control["recovered"] is None and control["k"] == K
    assert 0 <= control["singled"] <= K and not control["exceeds"]
