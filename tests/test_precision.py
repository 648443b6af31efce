"""Mixed precision (fl_attack.attacker.precision, issue 26): bf16 steps against fp32 on a real update, the
dtypes each operator runs in, fp32 unchanged bit for bit, "auto" and its probe, and the checks.

The bf16 tests run on any CPU: torch emulates bf16 where the CPU has no native bf16 (slower than
fp32, and correct), so every size here is tiny (a FEMNIST writer, k=4, m=3).
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fl_attack.attacker.precision as precision
from fl_attack import ATTACKS, AttackConfig, reconstruct, reconstruct_batch
from fl_attack.attacker.attacks import gradients
from fl_attack.attacker.attacks.pisme import PathIntegralSME
from fl_attack.attacker.precision import autocast, precision_scope, resolve_precision
from fl_attack.attacker.runtime.workers import AttackJob, run_job
from fl_attack.federation.data import get_spec
from fl_attack.federation.models import build_model
from fl_attack.federation.update import AttackTarget, flatten, layout
from tests.inprocess import femnist_update
from tests.user_models import PlainPaperCNN

K, NODES = 4, 3
NATIVE_BF16 = precision.cpu_has_native_bf16()  # read before any test patches it


def _update(partition: int):
    """A real FEMNIST writer's update, k=4, B=2, E=2 (T=4), and its labels."""
    update, train = femnist_update(partition, K, batch_size=2, local_epochs=2)
    return update, train.labels


@pytest.fixture(scope="module")
def femnist():
    return _update(0)


@pytest.fixture(scope="module")
def femnist_other():
    return _update(1)


def _state(update, labels, path: str, seed: int = 0, device: str = "cpu"):
    """A PI-SME attack at a perturbed state (P1 off the midpoint, d != 1) with X_hat ~ N(0, I), in
    float32 on ``device``, on the fast path of the paper CNN or the generic one."""
    model = build_model("femnist").to(device)
    if path == "generic":
        model = PlainPaperCNN(model)
    for p in model.parameters():
        p.requires_grad_(False)
    shapes = layout(update.w0)
    assert gradients._is_paper_cnn(model, shapes, torch.zeros(1, 1, 28, 28)) == (path == "fast")
    w0, wT = flatten(update.w0).to(device), flatten(update.wT).to(device)
    attack = PathIntegralSME(model, w0, wT, shapes, AttackConfig(nodes=NODES))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rms = attack.delta_w.norm() / attack.delta_w.numel() ** 0.5
        attack.control_point.add_(0.5 * rms * torch.randn(attack.w0.shape, generator=gen).to(device))
        attack.calibration.copy_(0.5 + torch.rand(attack.w0.shape, generator=gen).to(device))
    x = torch.randn(K, *get_spec("femnist").image_shape, generator=gen).to(device).requires_grad_(True)
    return attack, x, labels.to(device)


def _step(attack, x, y, name: str):
    """The objective's terms and dL/dX_hat, dL/dP1, dL/dd of one step, as the attack loop takes them
    (fl_attack.attacker.api._optimise: autocast around the objective, the backward after it)."""
    with precision_scope(name, x.device):
        with autocast(name, x.device):
            terms = attack.objective(x, y)
        grads = torch.autograd.grad(terms["loss"], [x, attack.control_point, attack.calibration])
    return terms, grads


# --- the bf16 step against the fp32 step ---------------------------------------------------------------

# Tolerances of a bf16 step against the fp32 step, per gradient: (smallest cosine, largest relative
# norm error ||g_bf16 - g_fp32|| / ||g_fp32||). bf16 keeps 8 bits of mantissa (unit roundoff 2^-9 =
# 0.2%); each operator rounds its output once (the convolutions and GEMMs accumulate in float32
# inside), the step chains about twenty of them forward and back, and a pre-activation within
# rounding of 0 flips its ReLU. Measured (docs/performance.md, "Mixed precision"): over 24 states
# of real FEMNIST (k=4, T=4) and CIFAR-100 (k=2) updates, both paths, m=2 and 3, and the benchmark's
# states (k=4..50, T=1..5, m=1..7):
# - dL/dX_hat and dL/dd: relative error 0.1% to 4.1%, cosine >= 0.9991. Bounds 10% and 0.995: 2.4x
#   the worst error, 6x its 1 - cosine.
# - dL/dP1: relative error 1% to 16.3%, cosine >= 0.9867 (the worst at k=4, T=1, m=1). P1 acts
#   through the curvature along the path, and the node weights rounded to bf16 move by about 2^-9
#   |w|, more than the whole update |delta_w| of a short local training (1.7x there): an fp32 step
#   at bf16-rounded anchors errs by the same 16.3%. Bounds 35% and 0.95: 2x and 4x.
# A step that is not lowered at all errs by exactly 0 (MIN_REL_ERROR).
TOLERANCE = {"dL/dX_hat": (0.995, 0.10), "dL/dP1": (0.95, 0.35), "dL/dd": (0.995, 0.10)}
MIN_REL_ERROR = 1e-4  # below this the step did not run in bf16 (fp32 against itself: exactly 0)


def _check_agreement(grads32, grads, what: str) -> list[float]:
    """Assert each gradient within its TOLERANCE of fp32's; returns the relative errors."""
    errors = []
    for (name, (min_cosine, max_error)), g32, g in zip(TOLERANCE.items(), grads32, grads):
        assert g.dtype == torch.float32 and g.shape == g32.shape, name  # float32 master copies
        a, b = g32.double().flatten(), g.double().flatten()
        cosine = float(a @ b / (a.norm() * b.norm()))
        error = float((b - a).norm() / a.norm())
        assert cosine >= min_cosine and error <= max_error, (what, name, cosine, error)
        errors.append(error)
    return errors


@pytest.mark.parametrize("path", ["fast", "generic"])
def test_a_bf16_step_has_the_fp32_steps_gradients_within_tolerance(femnist, path):
    """PI-SME on a real update: dL/dX_hat, dL/dP1 and dL/dd of a bf16 step against the fp32 step's,
    on the paper CNN's fast path and on the generic path; the loss and G are float32 in both."""
    attack, x, y = _state(*femnist, path)
    terms32, grads32 = _step(attack, x, y, "fp32")
    terms16, grads16 = _step(attack, x, y, "bf16")
    errors = _check_agreement(grads32, grads16, path)
    assert max(errors) > MIN_REL_ERROR, errors  # it really ran in bf16
    for key in ("loss", "lsim_honest", "lsim_calibrated", "tv"):  # the objective accumulated in float32
        assert terms16[key].dtype == torch.float32, key
    assert abs(float(terms16["lsim_honest"]) - float(terms32["lsim_honest"])) < 0.01


class _Census(TorchDispatchMode):
    """Counts the convolutions and GEMMs (forward and backward kernels) by the dtypes of their inputs."""

    HEAVY = {"convolution", "convolution_backward", "mm", "addmm", "bmm"}

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name in self.HEAVY:
            dtypes = {str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor)}
            self.counts[(name, "+".join(sorted(dtypes)))] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", ["fast", "generic"])
def test_bf16_runs_every_convolution_and_gemm_in_bf16_and_the_sums_in_float32(femnist, path):
    """Under bf16 every convolution and GEMM of the forwards, the node gradients and the double
    backward runs in bf16; the one exception is the fast path's conv1 weight gradient (one
    convolution_backward over the nodes' summed output gradients, 1 input channel, kept float32 on
    purpose), whose double backward is its two float32 convolutions. G comes out in float32."""
    attack, x, y = _state(*femnist, path)
    forward, backward = _Census(), _Census()
    with forward, autocast("bf16", x.device):
        terms = attack.objective(x, y)
        g = attack.surrogate_gradient(x, y)
    with backward:
        torch.autograd.grad(terms["loss"], [x, attack.control_point, attack.calibration])
    assert g.dtype == torch.float32
    float32 = {
        "forward": {op: n for op, n in forward.counts.items() if op[1] != "bfloat16"},
        "backward": {op: n for op, n in backward.counts.items() if op[1] != "bfloat16"},
    }
    if path == "fast":  # objective + surrogate_gradient: two G, each with one conv1 weight gradient
        assert float32 == {
            "forward": {("convolution_backward", "float32"): 2},
            "backward": {("convolution", "float32"): 2},
        }
    else:
        assert float32 == {"forward": {}, "backward": {}}
    assert sum(forward.counts.values()) > 10 and sum(backward.counts.values()) > 10


def test_bf16_through_reconstruct_batch_and_joint_attacks_with_float32_labels(femnist, femnist_other):
    """bf16 end to end: every method, the batched engine (vmapped node gradients, float32 node
    weights) and a joint attack on two updates; the labels are recovered in float32 (the same as
    fp32's), the result says which precision ran, and it is not the fp32 result."""
    update, _ = femnist
    settings = dict(iterations=2, nodes=2, device="cpu", trace_every=1)
    for method in ATTACKS:
        low = reconstruct(update, method, precision="bf16", **settings)
        full = reconstruct(update, method, **settings)
        assert (low.precision, full.precision, low.config["precision"]) == ("bf16", "fp32", "bf16")
        assert torch.equal(low.labels, full.labels) and torch.isfinite(low.images).all()
        assert not torch.equal(low.images, full.images), method
        assert abs(low.lsim_honest - full.lsim_honest) < 0.05, method
    batch = reconstruct_batch([update, femnist_other[0]], "pisme", precision="bf16", **settings)
    assert [r.precision for r in batch] == ["bf16", "bf16"] and all(torch.isfinite(r.images).all() for r in batch)
    alone = reconstruct(update, "pisme", precision="bf16", **settings)
    assert (batch[0].images - alone.images).abs().max() < 0.05  # the same bf16 attack, batched
    joint = reconstruct([update, femnist_other[0]], "nlsme", precision="bf16", **settings)
    assert joint.precision == "bf16" and len(joint.lsim_per_update) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("path", ["fast", "generic"])
def test_bf16_and_tf32_steps_on_cuda_agree_with_fp32(femnist, path):
    """On a GPU: the bf16 and TF32 steps (cuDNN, tensor cores) against the fp32 step on the same
    real update and state, within the CPU's tolerances; TF32's flags are restored after the step."""
    attack, x, y = _state(*femnist, path, device="cuda")
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    _, reference = _step(attack, x, y, "fp32")
    for name in ("bf16", "tf32"):
        _, grads = _step(attack, x, y, name)
        _check_agreement(reference, grads, name)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == flags
    assert reconstruct(femnist[0], "pisme", iterations=2, nodes=2, device="cuda", precision="auto").precision in (
        "bf16",
        "tf32",
        "fp32",
    )


# --- fp32 is today's path -------------------------------------------------------------------------------


def test_fp32_and_the_default_are_bit_identical_for_every_method(femnist, femnist_other):
    """precision="fp32" (and "auto" on a machine where it resolves to fp32) computes exactly what the
    default does: every method, the batched engine and a joint attack, torch.equal. (Against the code
    before mixed precision existed this was checked once from a copy of the previous commit: equal.)"""
    update, _ = femnist
    settings = dict(iterations=3, nodes=2, device="cpu", trace_every=1)
    names = ["fp32"] + (["auto"] if resolve_precision("auto", "cpu") == "fp32" else [])
    for method in ATTACKS:
        default = reconstruct(update, method, **settings)
        for name in names:
            again = reconstruct(update, method, precision=name, **settings)
            assert torch.equal(again.images, default.images), (method, name)
            assert (again.lsim_honest, again.lsim_calibrated) == (default.lsim_honest, default.lsim_calibrated)
            assert again.trace == default.trace and again.precision == "fp32"
    pair = [update, femnist_other[0]]
    default = reconstruct_batch(pair, "pisme", **settings)
    for a, b in zip(reconstruct_batch(pair, "pisme", precision="fp32", **settings), default):
        assert torch.equal(a.images, b.images) and a.lsim_honest == b.lsim_honest
    joint = reconstruct(pair, "nlsme", **settings)
    again = reconstruct(pair, "nlsme", precision="fp32", **settings)
    assert torch.equal(joint.images, again.images) and joint.lsim_per_update == again.lsim_per_update


# --- the checks -------------------------------------------------------------------------------------------


def test_tf32_on_a_cpu_and_a_bad_value_are_refused_before_any_work(femnist, monkeypatch):
    update, _ = femnist

    def no_work(*args, **kwargs):
        raise AssertionError("expensive work started")

    monkeypatch.setattr("fl_attack.attacker.api.recover_labels", no_work)
    with pytest.raises(ValueError, match="precision 'tf32' needs a CUDA device .* the attack runs on 'cpu'"):
        reconstruct(update, precision="tf32", device="cpu")
    with pytest.raises(ValueError, match="precision 'tf32' needs a CUDA device"):
        reconstruct_batch([update], precision="tf32", device="cpu")
    allowed = "precision must be one of fp32, bf16, tf32, auto, got 'fp16'"
    for call in (
        lambda: reconstruct(update, precision="fp16", device="cpu"),
        lambda: reconstruct_batch([update], precision="fp16", device="cpu"),
        lambda: AttackConfig(precision="fp16"),
        lambda: resolve_precision("fp16", "cpu"),
    ):
        with pytest.raises(ValueError, match=allowed):
            call()
    with pytest.raises(ValueError, match="dtype=torch.float64 is an exactness check"):
        reconstruct(update, precision="bf16", device="cpu", dtype=torch.float64)
    with pytest.raises(ValueError, match="takes a resolved precision"):
        autocast("auto", "cpu")


def test_a_job_records_the_precision_it_ran_with(femnist):
    """The worker's outcome (attacks.csv's precision column) names the resolved precision; a job that
    cannot run (tf32 on a CPU) fails with the reason and still names what it was asked."""
    update, _ = femnist
    target = AttackTarget(1, (0,))
    ok = run_job(AttackJob(0, update, "ig", AttackConfig(iterations=1, precision="auto"), target), "cpu")
    assert (ok.status, ok.precision) == ("ok", resolve_precision("auto", "cpu"))
    bad = run_job(AttackJob(1, update, "ig", AttackConfig(iterations=1, precision="tf32"), target), "cpu")
    assert bad.status == "failed" and "needs a CUDA device" in bad.error and bad.precision == "tf32"


def test_tf32_sets_both_flags_for_the_attack_and_restores_them():
    """Unit test: precision_scope("tf32") on a CUDA device turns on TF32 for matmuls and cuDNN and puts
    both flags back afterwards, also after an exception (the flags are process-wide; no GPU needed)."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
        with precision_scope("tf32", torch.device("cuda", 0)):
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
        with contextlib.suppress(RuntimeError), precision_scope("tf32", "cuda:0"):
            raise RuntimeError("the attack failed")
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
        with precision_scope("fp32", "cuda:0"), precision_scope("bf16", "cpu"):  # touch nothing
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
        with pytest.raises(ValueError, match="needs a CUDA device"), precision_scope("tf32", "cpu"):
            pass
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# --- auto ---------------------------------------------------------------------------------------------------


@pytest.fixture
def probes(monkeypatch):
    """A fresh auto cache and counters of the CPU's two probes (the flags and the GEMM timing)."""
    monkeypatch.setattr(precision, "_AUTO", {})
    calls = collections.Counter()
    flags, gemm = precision.cpu_has_native_bf16, precision._cpu_bf16_gemm_faster

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(precision, "cpu_has_native_bf16", counted("flags", flags))
    monkeypatch.setattr(precision, "_cpu_bf16_gemm_faster", counted("gemm", gemm))
    return calls


AVX2_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2\n"  # an AMD EPYC without AVX-512


def test_auto_is_fp32_on_a_cpu_without_native_bf16_and_probes_once(probes, monkeypatch):
    """On a CPU without avx512_bf16 or amx_bf16 auto is fp32, the GEMM probe never runs, and the
    answer is cached: the flags are read once per process. On a machine without native bf16 this reads
    the real /proc/cpuinfo; on one with it, the real flag parser is handed an AVX2 machine's flags."""
    if NATIVE_BF16:
        read = precision.cpu_has_native_bf16  # the probes fixture's counted wrapper
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda cpuinfo=None: read(AVX2_CPUINFO))
    assert [resolve_precision("auto", "cpu") for _ in range(3)] == ["fp32"] * 3
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert probes == {"flags": 1}  # read once, and no GEMM probe without native bf16


def test_auto_on_a_cpu_with_native_bf16_follows_the_gemm_probe(monkeypatch, probes):
    """Unit test: with the bf16 flags reported, auto is bf16 when the GEMM probe finds bf16 faster,
    fp32 when it does not; each answer is probed once."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    monkeypatch.setattr(precision, "_cpu_bf16_gemm_faster", lambda: probes.update(["gemm"]) or True)
    assert [precision.auto_precision("cpu") for _ in range(2)] == ["bf16", "bf16"] and probes["gemm"] == 1
    monkeypatch.setattr(precision, "_AUTO", {})
    monkeypatch.setattr(precision, "_cpu_bf16_gemm_faster", lambda: probes.update(["slow"]) or False)
    assert [precision.auto_precision("cpu") for _ in range(2)] == ["fp32", "fp32"] and probes["slow"] == 1


def test_the_gemm_probe_needs_a_real_speed_up(monkeypatch):
    """Unit test: the CPU's probe asks bf16 for AUTO_MIN_SPEEDUP times fp32's GEMM throughput."""
    speed = {torch.float32: 100.0, torch.bfloat16: 115.0}
    monkeypatch.setattr(precision, "gemm_gflops", lambda device, dtype, n, repeats: speed[dtype])
    assert not precision._cpu_bf16_gemm_faster()  # 1.15x: noise, not an accelerator
    speed[torch.bfloat16] = 400.0
    assert precision._cpu_bf16_gemm_faster()


@pytest.mark.parametrize(
    "line, native",
    [
        ("flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16 amx_tile", True),
        ("flags\t\t: fpu sse2 avx2 amx_bf16 amx_tile amx_int8", True),
        ("flags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_vnni", False),  # avx512 without bf16
        ("model name\t: avx512_bf16 in a name is not a flag", False),
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(line, native):
    """Unit test: only a flags line naming avx512_bf16 or amx_bf16 counts."""
    assert precision.cpu_has_native_bf16(f"processor\t: 0\n{line}\n") is native


def test_auto_on_cuda_is_fp32_whatever_the_gpu(monkeypatch):
    """Unit test, no GPU needed: on CUDA auto is fp32 (bf16 and TF32 measured no faster on an H200 at
    the paper's sizes, docs/gpu-check/), without a probe: the GPU's bf16 support is never asked."""
    monkeypatch.setattr(precision, "_AUTO", {})
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda **_: pytest.fail("auto probed the GPU"))
    monkeypatch.setattr(precision, "_cpu_bf16_gemm_faster", lambda: pytest.fail("auto probed the CPU"))
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        assert resolve_precision("auto", device) == "fp32"
    assert precision._AUTO == {}  # nothing cached for a GPU: the CPU's answer is still to be probed
    assert resolve_precision("tf32", "cuda:0") == "tf32" and resolve_precision("bf16", "cuda") == "bf16"


# --- the run config, the command lines and the row -----------------------------------------------------------


def test_attack_precision_reaches_every_attack_of_a_run():
    from fl_attack.audit.settings import RunSettings

    assert RunSettings.from_run_config({}).attack_config().precision == "fp32"
    assert RunSettings.from_run_config({"attack-precision": "bf16"}).attack_config().precision == "bf16"
    settings = RunSettings.from_run_config({"attack-precision": "tf32"})  # parsing alone needs no GPU
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="attack-precision: precision 'tf32' needs a CUDA device"):
            settings.check_device()


def test_the_command_lines_take_precision(tmp_path, capsys):
    from analysis.experiments import build_parser as experiments_parser
    from analysis.experiments.common import make_context
    from fl_attack.cli import build_parser, main

    cli = build_parser()
    assert cli.parse_args(["attack", "--precision", "bf16"]).precision == "bf16"
    assert cli.parse_args(["attack"]).precision is None  # not given: fp32
    assert cli.parse_args(["replay", "RUN", "--precision", "auto"]).precision == "auto"
    assert experiments_parser().parse_args(["table1", "--precision", "bf16"]).precision == "bf16"
    assert main(["attack", "--precision", "bf16", "--option", "precision=fp32", "--out", str(tmp_path / "a")]) == 2
    assert "--option: precision is set here and by --precision; give one" in capsys.readouterr().err
    ctx = make_context("table1", "tiny", tmp_path, "cpu", precision="bf16")
    assert ctx.precision == "bf16" and ctx.identity()["precision"] == "bf16"
    assert "precision" not in make_context("table1", "tiny", tmp_path, "cpu").identity()  # old CSVs resume
    with pytest.raises(ValueError, match="precision 'tf32' needs a CUDA device"):
        make_context("table1", "tiny", tmp_path, "cpu", precision="tf32")


def test_the_attack_row_has_the_precision_after_the_device():
    from fl_attack.evaluation.evaluator import attack_row
    from fl_attack.schema import ATTACK_COLUMNS

    assert ATTACK_COLUMNS[ATTACK_COLUMNS.index("device") + 1] == "precision"
    row = attack_row(
        method="ig",
        dataset="femnist",
        local_steps=4,
        gradients_per_iteration=1,
        iterations=1,
        labels="recovered",
        partition_id=0,
        label_estimator="support",
        device="cpu",
        precision="bf16",
    )
    assert list(row) == ATTACK_COLUMNS and row["precision"] == "bf16"
