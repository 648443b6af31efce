"""The compiled step (``fl_attack.attacker.attacks.compiled``): the same attack as eager, compiled once per
process and problem, and eager with a one-line reason when compiling fails.

Each compile costs 10-30 s here with inductor's on-disk cache cold (the module: about 2 minutes on 2
cores; a few seconds warm), so the models, images and iterations are tiny and every compiling test is
marked heavy. Exactness is checked in
float64 (inductor compiles float64 on the CPU): the trace's loss and Lsim, the images and the final
Lsim of the compiled run equal the eager run's to 1e-9 (measured differences ~1e-16).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_attack import reconstruct, reconstruct_batch
from fl_attack.attacker.attacks import AttackConfig
from fl_attack.attacker.attacks import compiled as compiled_step
from fl_attack.federation.models import build_model
from fl_attack.federation.update import ObservedUpdate, TrainingMetadata

TOL = 1e-9
FAST = dict(iterations=3, trace_every=1, device="cpu", dtype=torch.float64, nodes=2)


class MaxPoolNet(nn.Module):
    """A user model with max pooling (generic path): conv 1->2, ReLU, MaxPool 2, conv 2->2, ReLU,
    MaxPool 2, fc 98->62 on FEMNIST's (1,28,28)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
        self.fc = nn.Linear(2 * 7 * 7, 62)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class Untraceable(MaxPoolNet):
    """MaxPoolNet with a graph break in its forward: torch.compile(fullgraph=True) refuses it."""

    def forward(self, x):
        torch._dynamo.graph_break()
        return super().forward(x)


def _tiny_cnn():
    torch.manual_seed(0)
    return build_model("femnist", seed=0, width=2)  # the paper's FEMNIST CNN, 2 channels: structured path


def _update(model, seed: int, optimizer=None, sparse: bool = False) -> ObservedUpdate:
    g = torch.Generator().manual_seed(seed)
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    wT = {k: v - 0.01 * torch.randn(v.shape, generator=g) for k, v in w0.items()}
    if sparse:  # a top-k-like update: half its coordinates never sent (observed_only)
        wT = {k: torch.where(torch.rand(v.shape, generator=g) < 0.5, w0[k], v) for k, v in wT.items()}
    meta = TrainingMetadata("femnist", 0.01, 1, 1, 2, **({} if optimizer is None else {"optimizer": optimizer}))
    return ObservedUpdate(w0, wT, meta)


LABELS = torch.tensor([[1, 2], [3, 4]])


def _same(eager, compiled, n: int) -> None:
    """The compiled run's ``n`` reconstructions equal the eager run's ``n`` (a missing or extra one fails)."""
    assert len(eager) == len(compiled) == n > 0, (len(eager), len(compiled), n)
    for a, b in zip(eager, compiled, strict=True):
        assert b.compile == "compiled" and a.compile == "eager"
        assert abs(a.lsim_honest - b.lsim_honest) < TOL and abs(a.lsim_calibrated - b.lsim_calibrated) < TOL
        assert a.images.shape == b.images.shape and float((a.images - b.images).abs().max()) < TOL
        assert len(a.trace) == len(b.trace) == 3
        for ra, rb in zip(a.trace, b.trace, strict=True):
            for col in ("loss", "lsim_honest", "lsim_calibrated", "tv"):
                assert abs(ra[col] - rb[col]) < TOL, (col, ra[col], rb[col])


def _run(model, method, batched: bool, mode: str, seeds=(0, 1), optimizer=None, sparse=False, **options):
    updates = [_update(model, s, optimizer, sparse) for s in seeds]
    options = {**FAST, **options}
    if batched:
        return reconstruct_batch(updates, method, labels=LABELS, compile=mode, model=model, **options)
    return [reconstruct(updates[0], method, labels=LABELS[0], compile=mode, model=model, **options)]


@pytest.mark.heavy
def test_compiled_equals_eager_on_the_structured_path_and_a_second_attack_does_not_recompile():
    compiled_step.reset()
    model = _tiny_cnn()
    _same(_run(model, "pisme", False, "off"), _run(model, "pisme", False, "on"), 1)
    assert compiled_step.compile_count() == 1
    again = _run(model, "pisme", False, "on", seeds=(5, 6))  # another client's update, another model copy
    assert again[0].compile == "compiled"
    assert compiled_step.compile_count() == 1  # the second attack reused the compiled step


@pytest.mark.heavy
@pytest.mark.slow  # 40 s cold; CI keeps the structured path (..._and_a_second_attack_does_not_recompile)
def test_compiled_equals_eager_on_the_structured_path_batched():
    _same(_run(_tiny_cnn(), "nlsme", True, "off"), _run(_tiny_cnn(), "nlsme", True, "on"), 2)


@pytest.mark.heavy
@pytest.mark.slow  # 28 s cold; CI keeps the structured path
def test_compiled_equals_eager_on_the_generic_path():
    model = MaxPoolNet()
    _same(_run(model, "sme", False, "off"), _run(model, "sme", False, "on"), 1)


@pytest.mark.heavy
@pytest.mark.slow  # 54 s cold on CI; CI keeps the structured path, the default models' (..._does_not_recompile)
def test_compiled_equals_eager_on_the_generic_path_batched():
    model = MaxPoolNet()
    _same(_run(model, "pisme", True, "off"), _run(model, "pisme", True, "on"), 2)


@pytest.mark.heavy
@pytest.mark.slow  # 49 s cold; CI keeps the structured path (..._does_not_recompile)
def test_compiled_equals_eager_for_a_momentum_client_with_weight_decay_and_a_sparse_update():
    """The optimizer-aware surrogate (momentum's weights along the path, the weight-decay term) and
    observed_only's mask, on the structured path (T = 2 local steps: k=2, B=1)."""
    from fl_attack.federation.config import ClientOptimizer

    optimizer = ClientOptimizer("momentum", momentum=0.9, weight_decay=5e-4)
    runs = [
        _run(_tiny_cnn(), "pisme", False, mode, optimizer=optimizer, sparse=True, observed_only=True)
        for mode in ("off", "on")
    ]
    _same(*runs, 1)


@pytest.mark.heavy
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_equals_eager_on_cuda_batched_with_cuda_graphs():
    """On CUDA ("auto" compiles there, with CUDA graphs): the structured path batched and the generic
    path alone, float64, compiled against eager on the same device (1e-8: Triton's float64 kernels)."""
    model = _tiny_cnn()
    cuda = dict(device="cuda")
    for net, method, batched in ((model, "pisme", True), (MaxPoolNet(), "sme", False)):
        eager, compiled = (_run(net, method, batched, mode, **cuda) for mode in ("off", "auto"))
        assert len(eager) == len(compiled) == (2 if batched else 1)
        for a, b in zip(eager, compiled, strict=True):
            assert b.compile == "compiled" and abs(a.lsim_honest - b.lsim_honest) < 1e-8
            assert float((a.images - b.images).abs().max()) < 1e-6


@pytest.mark.heavy
def test_a_model_dynamo_cannot_trace_falls_back_to_eager_with_the_reason(caplog):
    """A real failure: torch.compile(fullgraph=True) meets a graph break in the model's forward."""
    compiled_step.reset()
    model = Untraceable()
    eager = _run(model, "ig", False, "off")
    with caplog.at_level("WARNING", logger="fl_attack.attacker.attacks.compiled"):
        fell_back = _run(model, "ig", False, "on")
    assert fell_back[0].compile.startswith("eager (compile failed: ")
    assert "\n" not in fell_back[0].compile
    assert any("running it eagerly" in r.message for r in caplog.records)
    assert fell_back[0].lsim_honest == eager[0].lsim_honest  # the eager step, from the first iteration on
    assert compiled_step.compile_count() == 0
    again = _run(model, "ig", False, "on")  # the failure is remembered: no second try
    assert again[0].compile == fell_back[0].compile


def test_a_compile_that_raises_falls_back_to_eager(monkeypatch):
    """Unit test: torch.compile itself made to fail (monkeypatched to return a function that raises)."""
    compiled_step.reset()

    def broken(fn, **kwargs):
        def run(*args):
            raise RuntimeError("inductor exploded\nsecond line")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    model = MaxPoolNet()
    eager = _run(model, "ig", False, "off")
    rec = _run(model, "ig", False, "on")[0]
    assert rec.compile == "eager (compile failed: RuntimeError: inductor exploded)"
    assert rec.lsim_honest == eager[0].lsim_honest
    compiled_step.reset()


def test_compile_modes_resolve_by_device_and_bad_values_are_refused():
    assert compiled_step.resolve_compile("auto", "cuda") and not compiled_step.resolve_compile("auto", "cpu")
    assert compiled_step.resolve_compile("on", "cpu") and not compiled_step.resolve_compile("off", "cuda")
    with pytest.raises(ValueError, match="compile must be one of off, on, auto, got 'yes'"):
        AttackConfig(compile="yes")


@pytest.mark.parametrize(
    ("method", "options", "reason"),
    [
        ("pisme-adaptive", {}, "method 'pisme-adaptive' has no compiled step"),
        ("pisme", {"precision": "bf16", "dtype": torch.float32}, "precision bf16 runs eagerly"),
    ],
)
def test_attacks_without_a_compiled_form_run_eagerly_and_say_why(method, options, reason):
    model = MaxPoolNet()
    kwargs = {**FAST, "iterations": 1, **options}
    rec = reconstruct(_update(model, 0), method, labels=LABELS[0], compile="on", model=model, **kwargs)
    assert rec.compile == f"eager ({reason})" or rec.compile.startswith(f"eager ({reason}")


def test_the_cli_passes_compile_to_the_attacks_and_refuses_it_twice(capsys):
    from fl_attack.cli import UsageError, _settings, build_parser, main

    args = build_parser().parse_args(["attack", "--compile", "on", "--device", "cpu"])
    assert _settings(args).attack_config().compile == "on"
    assert _settings(build_parser().parse_args(["attack"])).attack_config().compile == "auto"
    with pytest.raises(UsageError, match="--option: compile is set here and by --compile; give one"):
        _settings(build_parser().parse_args(["attack", "--compile", "on", "--option", "compile=off"]))
    assert main(["attack", "--compile", "maybe"]) == 2
    assert "argument --compile: compile must be one of off, on, auto, got 'maybe'" in capsys.readouterr().err
