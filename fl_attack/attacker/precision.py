"""The attacks' arithmetic precision: which one to use, and the contexts an attack runs in.

One home for every precision decision (``AttackConfig.precision``, run-config ``attack-precision``,
``--precision`` of ``fl-attack attack`` / ``replay`` and of the experiments all end here):

- ``"fp32"``: float32 throughout, today's path bit for bit (nothing is set, nothing is cast). On
  CUDA that is torch's own default: float32 GEMMs, and cuDNN convolutions that torch already lets
  use TF32 (``torch.backends.cudnn.allow_tf32`` defaults to True).
- ``"bf16"``: ``torch.autocast(device, dtype=torch.bfloat16)`` around the part of each attack step
  that builds the graph: the m node forwards and their node gradients (eq. 8), taken with
  create_graph, so the double backward to X_hat, P1 and d runs every operation in the dtype autocast
  gave it in the forward (bf16 convolutions and GEMMs; PyTorch's documented rule, and the reason
  the backward itself is not run under autocast: that would re-cast the parts kept in float32).
  X_hat, P1, d (and SME's alpha, NL-SME's t) stay float32 master copies that Adam updates;
  ``fl_attack.attacker.attacks.gradients.path_gradient`` sums the quadrature nodes in float32 and returns G
  in float32, so the cosine objective (eq. 10: Lsim, TV, R_p, R_d) is accumulated in float32. The
  paper CNNs' fast path lowers explicitly (bf16 channels_last activations, bf16 convolutions,
  their hand-written double backward and the GEMMs, float32 outputs where the sums over nodes and
  samples are). Label recovery (the output-bias arithmetic), label refinement, the trace's callback
  and every metric run outside these contexts, in float32.
- ``"tf32"``: CUDA only. ``torch.backends.cuda.matmul.allow_tf32`` and
  ``torch.backends.cudnn.allow_tf32`` are set to True for the attack and restored afterwards (TF32
  tensor cores for float32 GEMMs and convolutions; the tensors stay float32).
- ``"auto"``: the fastest precision the device really accelerates, probed once per process and
  device (``auto_precision``). On a CPU: bf16 only when /proc/cpuinfo reports native bf16
  (``avx512_bf16`` or ``amx_bf16``) AND a short GEMM probe in this process finds bf16 at least
  ``AUTO_MIN_SPEEDUP`` times faster than fp32; else fp32 (so never bf16 on a CPU without native bf16,
  where torch emulates it). On CUDA: fp32. Measured on an H200 (docs/gpu-check/): the paper CNNs'
  step is bound by kernel launches (40-55 ms whatever its FLOPs, 1-7% of the fp32 GEMM peak), so
  bf16 ran 0.88-0.96x and TF32 0.95-1.01x as fast as fp32; bf16 paid only for a 4x wider model at
  k=200 (1.42x a step). Ask for bf16 by name there.

Sources: torch.amp ("Automatic Mixed Precision", the autocast op lists and "backward passes under
autocast are not recommended"); torch.backends ("TensorFloat-32 (TF32) on Ampere (and later)
devices"); Micikevicius et al., "Mixed Precision Training" (ICLR 2018: float32 master weights and
float32 accumulation); Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training" (2019).
Measurements: docs/performance.md, "Mixed precision".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

PRECISIONS = ("fp32", "bf16", "tf32", "auto")
RESOLVED = ("fp32", "bf16", "tf32")  # what ``resolve_precision`` returns
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic
AUTO_MIN_SPEEDUP = 1.2  # bf16 GEMM / fp32 GEMM throughput the CPU probe asks for before choosing bf16
_AUTO: dict[str, str] = {}  # "cpu" -> what auto resolved to in this process


def check_precision(precision) -> str:
    """``precision`` when it is one of ``PRECISIONS``; ValueError naming the allowed values otherwise."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def check_on_device(precision, device: str | torch.device) -> str:
    """``precision`` (``check_precision``) when an attack on ``device`` (a torch device or its name) can
    run with it: ValueError for "tf32" on a device that is not CUDA (TF32 is a mode of NVIDIA tensor
    cores; on a CPU there is nothing to set). The one check of tf32's device: ``resolve_precision``,
    ``precision_scope``, the run config's attack-precision with attack-device (``AuditSettings``)."""
    check_precision(precision)
    device = torch.device(device)
    if precision == "tf32" and device.type != "cuda":
        raise ValueError(
            f"precision 'tf32' needs a CUDA device (TF32 is a mode of NVIDIA tensor cores), the attack runs on "
            f"'{device}'; use fp32 or bf16 there"
        )
    return precision


def resolve_precision(precision: str, device: str | torch.device) -> str:
    """The precision an attack on ``device`` runs with: "fp32", "bf16" or "tf32".

    precision: one of ``PRECISIONS``; "auto" is ``auto_precision(device)`` (probed once per process
    and device). device: a torch device or its name ("cpu", "cuda", "cuda:1").
    Raises ValueError for a value not in PRECISIONS (naming them) and for "tf32" on a device that is
    not CUDA (TF32 is a mode of NVIDIA tensor cores; on a CPU there is nothing to set).
    """
    check_on_device(precision, device)
    device = torch.device(device)
    if precision == "auto":
        return auto_precision(device)
    return precision


def auto_precision(device: str | torch.device) -> str:
    """What "auto" picks on ``device`` (module docstring): fp32 on a GPU; on the CPU, probed on first
    use and cached for the process, so the GEMM probe runs once."""
    if torch.device(device).type != "cpu":
        return "fp32"
    if "cpu" not in _AUTO:
        _AUTO["cpu"] = "bf16" if cpu_has_native_bf16() and _cpu_bf16_gemm_faster() else "fp32"
    return _AUTO["cpu"]


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU reports native bf16 arithmetic: a flags line of /proc/cpuinfo (or of the
    given ``cpuinfo`` text) lists ``avx512_bf16`` or ``amx_bf16``. False where it cannot be read
    (not Linux): torch then emulates bf16, which is slower than fp32."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.split(":", 1)[0].strip() == "flags":
            flags = set(line.split(":", 1)[1].split())
            return any(flag in flags for flag in CPU_BF16_FLAGS)
    return False


def gemm_gflops(
    device: str | torch.device,
    dtype: torch.dtype = torch.float32,
    n: int = 2048,
    repeats: int = 5,
    tf32: bool = False,
    max_seconds: float | None = None,
) -> float:
    """GEMM throughput (GFLOP/s) of this process: the best of ``repeats`` (after one warm-up) n x n
    matmuls in ``dtype`` on ``device``; ``tf32``: float32 with TF32 tensor cores allowed (CUDA).
    max_seconds: stop repeating once the measurement has taken this long (at least one timed
    matmul after the warm-up); an emulated bf16 2048^2 matmul takes about 15 s on a CPU without
    native bf16 (docs/performance.md, "Mixed precision")."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    best, start = float("inf"), time.perf_counter()
    with precision_scope("tf32" if tf32 else "fp32", device):
        for i in range(repeats + 1):
            _sync(device)
            t = time.perf_counter()
            (a @ b).sum().item()
            _sync(device)
            best = min(best, time.perf_counter() - t)
            if i >= 1 and max_seconds is not None and time.perf_counter() - start > max_seconds:
                break
    return 2 * n**3 / best / 1e9


@contextmanager
def precision_scope(precision: str, device: str | torch.device) -> Iterator[None]:
    """The whole attack's context: for "tf32", TF32 allowed for CUDA matmuls and cuDNN
    convolutions, both flags restored on exit (also after an exception); nothing for "fp32" and
    "bf16" (bf16 is ``autocast``'s, per step). precision: a resolved one (``RESOLVED``).
    Raises ValueError for another value (resolve "auto" first) and for "tf32" off CUDA."""
    if precision not in RESOLVED:
        raise ValueError(f"precision_scope takes a resolved precision ({', '.join(RESOLVED)}), got {precision!r}")
    if precision != "tf32":
        yield
        return
    check_on_device(precision, device)
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def autocast(precision: str, device: str | torch.device):
    """The context of one attack step's graph building (the forwards and the node gradients):
    ``torch.autocast(device type, dtype=torch.bfloat16)`` for "bf16", a null context otherwise.
    precision: a resolved one (``RESOLVED``); ValueError for another value."""
    if precision not in RESOLVED:
        raise ValueError(f"autocast takes a resolved precision ({', '.join(RESOLVED)}), got {precision!r}")
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


def lowered_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype autocast computes ``x``'s matmuls and convolutions in: its autocast dtype when
    autocast is on for x's device and x is float32 (autocast lowers float32 only), else x's own.
    The paper CNNs' fast path reads it to lower its hand-written operators explicitly."""
    kind = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


def full_precision(x: torch.Tensor):
    """A context in which autocast does not lower ``x``'s device's operators (for the sums that must
    stay in float32 inside a lowered step, e.g. a path's node weights); a null context, touching
    nothing, when autocast is off."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return nullcontext()


def _cpu_bf16_gemm_faster(n: int = 1024, repeats: int = 3) -> bool:
    """The CPU's GEMM probe: bf16 n x n matmuls at least AUTO_MIN_SPEEDUP times the fp32 throughput
    (about 0.1 s on a CPU with native bf16)."""
    fp32 = gemm_gflops("cpu", torch.float32, n, repeats)
    return gemm_gflops("cpu", torch.bfloat16, n, repeats) >= AUTO_MIN_SPEEDUP * fp32


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
