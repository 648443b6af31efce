"""The model is a parameter: a user's own architecture (tests/user_models.py, which the project does
not ship) through the resolver, the gradient engine, ``reconstruct``, ``fl-attack attack``, the
run config, an in-process federation with its replay, and a real federation through the launcher.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fl_attack import reconstruct
from fl_attack.attacker.attacks import gradients
from fl_attack.attacker.attacks.gradients import path_gradient
from fl_attack.audit.settings import RunSettings
from fl_attack.cli import main
from fl_attack.evaluation.evaluator import psnr_trace, score
from fl_attack.evaluation.victims import train_victim
from fl_attack.federation.models import OUTPUT_BIAS, build_model, check_model, output_bias_key, resolve_model
from fl_attack.federation.update import flatten, layout
from tests.user_models import LeNet, TinyResNet, lenet

ROOT = Path(__file__).resolve().parent.parent
LENET = "tests.user_models:lenet"


# --- the resolver -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["", "paper", " paper "])
def test_the_paper_spec_is_the_papers_cnn(spec):
    a, b = resolve_model(spec, "cifar100", seed=3), build_model("cifar100", seed=3)
    assert type(a) is type(b) and not a.training
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_a_factory_gets_the_dataset_and_the_seed_fixes_its_weights():
    cifar = resolve_model(LENET, "cifar100", seed=1)
    assert isinstance(cifar, LeNet) and not cifar.training
    assert cifar.features[0].in_channels == 3 and cifar.classifier[-1].out_features == 100
    state = torch.random.get_rng_state()
    again = resolve_model(LENET, "cifar100", seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left as it was
    assert all(torch.equal(again.state_dict()[k], v) for k, v in cifar.state_dict().items())
    other = resolve_model(LENET, "cifar100", seed=2)
    assert not torch.equal(other.features[0].weight, cifar.features[0].weight)
    assert isinstance(resolve_model("tests.user_models:tiny_resnet", "femnist"), TinyResNet)  # no dataset argument


BAD_SPECS = [
    ("tests.user_models", "model spec 'tests.user_models' is neither 'paper' nor 'package.module:factory'"),
    (
        "tests/user_models.py:lenet",
        "model spec 'tests/user_models.py:lenet' is neither 'paper' nor 'package.module:factory'",
    ),
    (
        "no_such_package.models:net",
        "model spec 'no_such_package.models:net': cannot import 'no_such_package.models' (ModuleNotFoundError: No "
        "module named 'no_such_package'); the module must be importable (installed, or on PYTHONPATH)",
    ),
    (
        "tests.user_models:resnet50",
        "model spec 'tests.user_models:resnet50': 'tests.user_models' has no attribute 'resnet50'",
    ),
    (
        "tests.user_models:not_a_module",
        "model spec 'tests.user_models:not_a_module': the factory returned int, not a torch.nn.Module",
    ),
    (
        "tests.user_models:broken",
        "model spec 'tests.user_models:broken': the factory raised RuntimeError: no weights file",
    ),
    (
        "tests.user_models:wrong_classes",
        "model spec 'tests.user_models:wrong_classes': on a (2, 1, 28, 28) femnist batch the model returned (2, 10); "
        "it must return logits of shape (2, 62)",
    ),
    (
        "tests.user_models:integer_parameter",
        "model spec 'tests.user_models:integer_parameter': parameter 'steps' is torch.int64; every parameter "
        "must be floating point",
    ),
    (
        "tests.user_models:bool_buffer",
        "model spec 'tests.user_models:bool_buffer': buffer 'mask' is torch.bool; a buffer must be floating point "
        "or integer (such as batch norm's running statistics and num_batches_tracked)",
    ),
]


@pytest.mark.parametrize("spec, message", BAD_SPECS, ids=[s for s, _ in BAD_SPECS])
def test_bad_specs_give_clear_errors(spec, message):
    with pytest.raises(ValueError) as info:
        resolve_model(spec, "femnist")
    assert str(info.value) == message


def test_a_cifar_model_on_femnist_fails_the_forward_check():
    with pytest.raises(
        ValueError,
        match=r"^the model: the forward pass on a \(2, 1, 28, 28\) femnist batch raised "
        r"RuntimeError: ",
    ):
        check_model(lenet("cifar100"), "femnist")


def test_label_recovery_finds_a_user_models_output_bias():
    assert output_bias_key(build_model("femnist").state_dict(), 62) == OUTPUT_BIAS
    assert output_bias_key(lenet("femnist").state_dict(), 62) == "classifier.4.bias"
    assert output_bias_key(TinyResNet().state_dict(), 62) == "head.bias"
    no_bias = resolve_model("tests.user_models:no_output_bias", "femnist").state_dict()
    with pytest.raises(
        KeyError,
        match="label recovery needs the output-layer bias 'fc2.bias' \\(in another model: "
        "a 1-D entry of size 62\\) in the update; there is none",
    ):
        output_bias_key(no_bias, 62)


# --- the gradient engine: a user model takes the generic path, and it is exact ------------------------


def test_a_user_model_takes_the_generic_path_and_matches_a_literal_autograd_loop(monkeypatch):
    torch.manual_seed(0)
    model = TinyResNet(width=4).double().eval()
    shapes = layout(model.state_dict())
    w0 = flatten(model.state_dict())
    anchors = [w0, w0 + 0.05 * torch.randn_like(w0), w0 + 0.1 * torch.randn_like(w0)]
    anchors = [a.clone().requires_grad_(True) for a in anchors]
    basis = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.0, 0.1, 0.9]], dtype=torch.float64)
    coeffs = torch.tensor([0.3, 0.5, 0.2], dtype=torch.float64)
    x = torch.randn(5, 1, 28, 28, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3, 0, 61, 3, 7])
    probe = torch.randn_like(w0)

    def fast_path(*args, **kwargs):
        raise AssertionError("the structured path is for the paper's CNNs only")

    monkeypatch.setattr(gradients, "_cnn_path_gradient", fast_path)
    g = path_gradient(model, shapes, anchors, basis, coeffs, x, y)
    dx, da = torch.autograd.grad((g * probe).sum(), [x, anchors[1]])

    # Literal: TinyResNet's forward written out with each node's weights, one autograd call per node.
    sizes = [math.prod(shape) for _, shape in shapes]
    literal = 0
    for i in range(3):
        w_i = sum(basis[i, j] * anchors[j] for j in range(3))
        w = {k: p.view(shape) for (k, shape), p in zip(shapes, torch.split(w_i, sizes))}
        h = torch.relu(F.conv2d(x, w["stem.weight"], w["stem.bias"], padding=1))
        r = F.conv2d(
            torch.relu(F.conv2d(h, w["block.0.weight"], w["block.0.bias"], padding=1)),
            w["block.2.weight"],
            w["block.2.bias"],
            padding=1,
        )
        logits = F.linear(torch.relu(h + r).mean((2, 3)), w["head.weight"], w["head.bias"])
        loss = coeffs[i] * F.cross_entropy(logits, y)
        literal = literal + torch.cat(
            [t.reshape(-1) for t in torch.autograd.grad(loss, list(w.values()), create_graph=True)]
        )
    ldx, lda = torch.autograd.grad((literal * probe).sum(), [x, anchors[1]])
    assert torch.allclose(g, literal, rtol=1e-10, atol=1e-12)
    assert torch.allclose(dx, ldx, rtol=1e-9, atol=1e-12)
    assert torch.allclose(da, lda, rtol=1e-9, atol=1e-12)
    assert g.abs().max() > 0 and dx.abs().max() > 0


# --- reconstruct, fl-attack attack ---------------------------------------------------------------


@pytest.fixture(scope="module")
def lenet_victim():
    """A real FEMNIST client (k=8, B=4, E=2: T=4) trained with the user's LeNet."""
    return train_victim("femnist", 0, samples=8, batch_size=4, local_epochs=2, lr=0.05, seed=0, model=LENET)


def test_reconstruct_attacks_a_user_model(lenet_victim):
    update = lenet_victim.update
    assert set(update.w0) == set(lenet().state_dict())
    mine = lenet()
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    truth = lenet_victim.images
    # The trace scores X_hat after the first step and at the end (psnr_trace: matched-pair PSNR).
    rec = reconstruct(
        update, "pisme", model=mine, iterations=20, nodes=2, device="cpu", trace_every=19, callback=psnr_trace(truth)
    )
    assert rec.images.shape == (8, 1, 28, 28) and torch.isfinite(rec.images).all()
    assert rec.label_source == "recovered" and rec.labels.shape == (8,)
    scores = score(rec.images, rec.labels, truth, lenet_victim.labels, "femnist")
    # Labels recovered from classifier.4.bias beat the best constant guess (1.0 against 0.375 measured).
    majority = lenet_victim.labels.bincount().max().item() / len(lenet_victim.labels)
    assert scores["label_accuracy"] > majority, (scores["label_accuracy"], majority)
    start, end = (row["psnr"] for row in rec.trace)  # iterations 0 and 19
    assert end == pytest.approx(scores["psnr"])
    # The optimisation, not the initialisation, brings X_hat closer to the client's images: 1 dB
    # gained in 19 steps (1.8 dB measured, 14.5 -> 16.3 dB; 22 dB after 200 iterations).
    assert end > start + 1, (start, end)
    assert 0 <= rec.lsim_honest < 1
    # the caller's module is left alone: its weights and requires_grad
    assert all(torch.equal(mine.state_dict()[k], v) for k, v in before.items())
    assert all(p.requires_grad for p in mine.parameters())
    # the same attack with the spec gives the same reconstruction
    again = reconstruct(update, "pisme", model=LENET, iterations=20, nodes=2, device="cpu")
    assert torch.equal(again.images, rec.images)


def test_reconstruct_needs_the_model_the_update_is_of(lenet_victim):
    with pytest.raises(
        ValueError, match="the update has tensor 'features.0.weight', which is not one of the model's parameters"
    ):
        reconstruct(lenet_victim.update, "ig", iterations=1)


def test_fl_attack_attack_with_a_user_model(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(
        [
            "attack",
            "--model",
            LENET,
            "--dataset",
            "femnist",
            "--clients",
            "1",
            "--samples",
            "8",
            "--batch-size",
            "4",
            "--local-epochs",
            "1",
            "--iterations",
            "20",
            "--nodes",
            "2",
            "--methods",
            "pisme",
            "--device",
            "cpu",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and math.isfinite(float(rows[0]["psnr"]))
    assert json.loads((out / "settings.json").read_text())["model"] == LENET


def test_fl_attack_attack_with_a_bad_model_exits_2_before_training(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["attack", "--model", "tests.user_models:wrong_classes", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fl-attack: error: model spec 'tests.user_models:wrong_classes': on a (2, 1, 28, 28) femnist "
        "batch the model returned (2, 10); it must return logits of shape (2, 62)"
    ]
    assert not out.exists()


# --- the run config ------------------------------------------------------------------------------


def test_the_run_config_model_is_resolved_in_validation():
    settings = RunSettings.from_run_config({"model": LENET})
    assert settings.model == LENET and isinstance(settings.new_model(), LeNet)
    assert isinstance(RunSettings.from_run_config({}).new_model(), type(build_model("femnist")))
    with pytest.raises(ValueError) as info:
        RunSettings.from_run_config({"model": "tests.user_models:not_a_module"})
    assert str(info.value) == (
        "invalid run config: model: model spec 'tests.user_models:not_a_module': the factory "
        "returned int, not a torch.nn.Module"
    )
    with pytest.raises(ValueError, match="^invalid run config: model: label recovery needs the output-layer bias"):
        RunSettings.from_run_config({"model": "tests.user_models:no_output_bias"})
    # with oracle labels, no output bias is needed
    RunSettings.from_run_config({"model": "tests.user_models:no_output_bias", "attack-labels": "oracle"})


def test_an_in_process_federation_and_its_replay_with_a_user_model(tmp_path):

    from fl_attack.records import read_csv
    from strategies.server_app import write_run_config
    from tests.inprocess import federate, flower_run_config

    run = dict(
        num_rounds=1,
        attack_clients="0",
        attack_iterations=10,
        attack_method="pisme",
        attack_threads=1,
        model=LENET,
        server_test_samples=100,
    )
    settings, strategy, _, jobs = federate(tmp_path, **run, torch_threads=1)
    write_run_config(tmp_path, settings, flower_run_config(**run), num_nodes=2)
    assert [job.model for job in jobs] == [LENET]  # the spec travels with the job; the actor rebuilds it
    assert set(jobs[0].update.w0) == set(lenet().state_dict())  # the clients trained the LeNet
    _, rows = read_csv(tmp_path / "attacks.csv")
    assert [r["status"] for r in rows] == ["ok"] and math.isfinite(float(rows[0]["psnr"]))
    _, rounds = read_csv(tmp_path / "rounds.csv")
    assert 0 <= float(rounds[0]["global_accuracy"]) <= 1  # the server's evaluation of the LeNet
    # the replay reads the run's model key and reproduces the row exactly
    assert main(["replay", str(tmp_path), "--threads", "1", "--device", "cpu", "--name", "again"]) == 0
    _, replayed = read_csv(tmp_path / "replays" / "again" / "attacks.csv")
    assert replayed[0]["status"] == "ok" and replayed[0]["psnr"] == rows[0]["psnr"]


def _flower_app_run(tmp_path, **changes):
    """strategies/run_configs/flower-app.toml (the recipe of docs/audit-your-app.md) in
    process, made small: 1 round, k=8, B=4, 5 attack iterations; ``changes`` on top."""
    import tomllib

    from strategies.server_app import write_run_config
    from tests.inprocess import federate, flower_run_config

    with open(ROOT / "strategies" / "run_configs" / "flower-app.toml", "rb") as f:
        recipe = tomllib.load(f)
    run = {k.replace("-", "_"): v for k, v in recipe.items()}
    run.update(num_server_rounds=1, samples_per_client=8, batch_size=4, attack_iterations=5, attack_threads=1)
    run.update(server_test_samples=100, **changes)
    rounds = run.pop("num_server_rounds")
    settings, _, _, jobs = federate(tmp_path, num_rounds=rounds, **run, torch_threads=1)
    write_run_config(tmp_path, settings, flower_run_config(num_rounds=rounds, **run), num_nodes=2)
    return settings, jobs


@pytest.mark.heavy
def test_the_flower_app_recipe_attacks_a_max_pooling_model_trained_with_momentum(tmp_path):
    from fl_attack.federation.config import ClientOptimizer
    from fl_attack.records import read_csv
    from tests.user_models import quickstart_net

    settings, jobs = _flower_app_run(tmp_path)
    assert settings.model == "tests.user_models:quickstart_net" and settings.data.partitioner == "dirichlet"
    meta = jobs[0].update.metadata
    assert meta.optimizer == ClientOptimizer("momentum", momentum=0.9) and meta.lr == 0.01
    assert set(jobs[0].update.w0) == set(quickstart_net().state_dict())
    _, rows = read_csv(tmp_path / "attacks.csv")
    assert {r["method"] for r in rows} == {"pisme", "pisme+memory"}
    for r in rows:
        assert r["status"] == "ok" and math.isfinite(float(r["psnr"])), r["error"]
        assert r["optimizer"] == "momentum 0.9" and int(r["unknowns"]) == 8 * 3 * 32 * 32
        assert int(r["parameters"]) == sum(p.numel() for p in quickstart_net().parameters())
    # the recorded momentum updates replay to the same rows
    assert main(["replay", str(tmp_path), "--threads", "1", "--device", "cpu", "--name", "again"]) == 0
    _, replayed = read_csv(tmp_path / "replays" / "again" / "attacks.csv")
    pisme = [r["psnr"] for r in rows if r["method"] == "pisme"]
    assert [r["psnr"] for r in replayed if r["method"] == "pisme"] == pisme


def test_the_flower_app_recipe_with_a_batch_norm_model_in_train_mode(tmp_path):
    """The same recipe with the other kind of model docs/library.md names: batch norm (and max pooling, dropout)
    trained in train mode on FEMNIST. The counters stay int64 through the record; the attack runs."""
    from fl_attack.federation.update import load_update, read_update_index
    from fl_attack.records import read_csv

    model = "tests.user_models:batch_norm_net"
    settings, jobs = _flower_app_run(tmp_path, dataset="femnist", model=model, client_train_mode=True)
    assert jobs[0].update.metadata.train_mode and jobs[0].model == model
    _, rows = read_csv(tmp_path / "attacks.csv")
    assert rows and all(r["status"] == "ok" and math.isfinite(float(r["psnr"])) for r in rows), rows
    recorded, _ = load_update(tmp_path / "updates", read_update_index(tmp_path / "updates")[0])
    counters = [k for k in recorded.w0 if k.endswith("num_batches_tracked")]
    assert counters and all(recorded.wT[k].dtype == torch.int64 for k in counters)


# --- a real federation through the launcher -------------------------------------------------------


@pytest.mark.runtime
# 41 s: slow for the suite's 15-minute budget; test_quickstart_app audits a user's model through flwr run in CI
@pytest.mark.slow
def test_a_real_federation_attacks_a_user_model(tmp_path):
    results = tmp_path / "results"
    run_config = (
        f'model="{LENET}" num-server-rounds=1 samples-per-client=8 batch-size=4 local-epochs=1 '
        f'attack-iterations=5 attack-clients="0" results-dir="{results}" run-name="user"'
    )
    # The apps run from Flower's packaged copy of the project, which holds tests/user_models.py (every
    # .py file but test_*.py): no PYTHONPATH is needed for a model module inside the project.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FLWR_HOME"] = str(tmp_path / "flwr-home")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "strategies.launch",
            "--run-config",
            run_config,
            "--federation-config",
            "num-supernodes=2 client-resources-num-cpus=1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run = results / "user"
    assert json.loads((run / "config.json").read_text())["run_config"]["model"] == LENET
    with open(run / "attacks.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["status"] == "ok" and math.isfinite(float(r["psnr"])) for r in rows), rows
    w0 = torch.load(run / "updates" / "round-1" / "w0.pt", weights_only=True)["w0"]
    assert list(w0) == list(lenet().state_dict())  # the federation trained and attacked the LeNet
