"""The paper's victim CNNs (docs/PISME.md, "Victim training"; following SME, Zhu et al. ICML 2023).

Both models take normalised NCHW input, use ReLU and average pooling and have no batch norm, so
train and eval mode compute the same function. ``OUTPUT_BIAS`` names the output-layer bias used
for label recovery.
"""

from __future__ import annotations

import importlib
import inspect
import re

import torch
from torch import nn

from fl_attack.federation.pools import get_spec
from fl_attack.federation.update import is_integer

OUTPUT_BIAS = "fc2.bias"


class PaperCNN(nn.Module):
    """conv, ReLU, AvgPool 2, conv, ReLU, AvgPool 2, fc, ReLU, fc: the layout both victims share.

    ``fl_attack.attacker.attacks.gradients`` recognises this class (and subclasses that keep its forward,
    zero-padded convolutions, 2x2 average pooling and no hooks) and computes the attacks' node
    gradients with a structured, exact fast path; any other module takes the generic path.
    """

    conv1: nn.Conv2d
    conv2: nn.Conv2d
    fc1: nn.Linear
    fc2: nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class CifarCNN(PaperCNN):
    """CIFAR-100 CNN: (N,3,32,32) normalised images -> (N,100) logits.

    conv 3->64 (3x3, pad 1), ReLU, AvgPool 2, conv 64->128 (3x3, pad 1), ReLU, AvgPool 2,
    fc 8192->200, ReLU, fc 200->100 (about 1.74M parameters).
    """

    def __init__(self, num_classes: int = 100, width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.fc1 = nn.Linear(2 * width * 8 * 8, 200)
        self.fc2 = nn.Linear(200, num_classes)


class FemnistCNN(PaperCNN):
    """FEMNIST CNN: (N,1,28,28) normalised images -> (N,62) logits.

    conv 1->32 (3x3, pad 1), ReLU, AvgPool 2, conv 32->64 (3x3, pad 1), ReLU, AvgPool 2,
    fc 3136->100, ReLU, fc 100->62 (about 0.34M parameters).
    """

    def __init__(self, num_classes: int = 62, width: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.fc1 = nn.Linear(2 * width * 7 * 7, 100)
        self.fc2 = nn.Linear(100, num_classes)


def build_model(dataset: str, seed: int | None = None, width: int | None = None) -> nn.Module:
    """The victim model for ``dataset`` (its registered ``DatasetSpec.model``: FemnistCNN for femnist,
    CifarCNN for cifar100), in eval mode.

    ``seed`` makes the initial weights reproducible. ``width`` overrides conv1's channel count
    (conv2 has twice as many; the paper's 32 for FEMNIST, 64 for CIFAR-100), for scaling studies.
    Raises ValueError for an unknown dataset or a width < 1.
    """
    spec = get_spec(dataset)
    if width is not None and int(width) < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    kwargs = {} if width is None else {"width": int(width)}
    if seed is None:
        model = spec.new_model(**kwargs)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = spec.new_model(**kwargs)
    return model.eval()


# --- any model: "package.module:factory" ---------------------------------------------------------
PAPER_SPECS = ("", "paper")
_SPEC_PATTERN = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def resolve_model(spec: str, dataset: str, seed: int | None = None) -> nn.Module:
    """The victim model named by ``spec`` for ``dataset``, in eval mode, checked before any work.

    spec: "" or "paper": the paper's CNN for the dataset (``build_model``); or "package.module:factory",
    a callable returning a fresh ``nn.Module``, called as ``factory(dataset=dataset)`` when it takes a
    ``dataset`` keyword (or ``**kwargs``), else ``factory()``. The module must be importable here
    (installed, or on PYTHONPATH).
    The contract of a user model (``check_model``): input normalised images (N,C,H,W) per
    ``fl_attack.federation.data.get_spec(dataset)``, output logits (N, num_classes), floating-point parameters, and
    buffers that are floating point or integer (batch norm's running statistics and int64 counter).
    Label recovery also needs the output-layer bias (``output_bias_key``).
    seed: makes the initial weights reproducible (the global RNG is left as it was).
    Raises ValueError, naming the spec, for a bad spec format, an import failure, a missing or
    non-callable factory, a factory that raises or returns no nn.Module, and a model that fails
    ``check_model``; all before any expensive work.
    """
    if not isinstance(spec, str):
        raise ValueError(f"model spec must be a string, got {type(spec).__name__}")
    spec = spec.strip()
    if spec in PAPER_SPECS:
        return build_model(dataset, seed=seed)
    get_spec(dataset)  # ValueError for an unknown dataset
    factory = _factory(spec)
    if seed is None:
        model = _call_factory(factory, spec, dataset)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _call_factory(factory, spec, dataset)
    check_model(model, dataset, what=f"model spec '{spec}'")
    return model.eval()


def _factory(spec: str):
    if not _SPEC_PATTERN.fullmatch(spec):
        raise ValueError(f"model spec '{spec}' is neither 'paper' nor 'package.module:factory'")
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or an error inside the module
        raise ValueError(
            f"model spec '{spec}': cannot import '{module_name}' ({type(exc).__name__}: {exc}); "
            "the module must be importable (installed, or on PYTHONPATH)"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"model spec '{spec}': '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"model spec '{spec}': '{attr}' is not callable")
    return obj


def _call_factory(factory, spec: str, dataset: str) -> nn.Module:
    try:
        params = inspect.signature(factory).parameters.values()
        takes_dataset = any(
            p.name == "dataset" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.kind is p.VAR_KEYWORD
            for p in params
        )
    except (TypeError, ValueError):  # no signature (some builtins): call it bare
        takes_dataset = False
    try:
        model = factory(dataset=dataset) if takes_dataset else factory()
    except Exception as exc:
        raise ValueError(f"model spec '{spec}': the factory raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"model spec '{spec}': the factory returned {type(model).__name__}, not a torch.nn.Module")
    return model


def check_model(model: nn.Module, dataset: str, what: str = "the model") -> None:
    """Check ``model`` against the contract, with one forward pass (in eval mode: no running statistics
    change) on a zero (2,C,H,W) batch of ``dataset``'s image shape: logits of shape (2, num_classes),
    at least one parameter, every parameter floating point (the attacks' unknowns' gradients), every
    buffer floating point or integer (the update carries both, ``fl_attack.federation.update.ObservedUpdate``).
    The model's mode and the global RNG are left as they were. Raises ValueError starting with ``what``.
    """
    spec = get_spec(dataset)
    if not isinstance(model, nn.Module):
        raise ValueError(f"{what}: expected a torch.nn.Module, got {type(model).__name__}")
    params = set(parameter_keys(model))
    if not params:
        raise ValueError(f"{what}: the model has no parameters")
    for key, value in model.state_dict().items():
        if key in params and not torch.is_floating_point(value):
            raise ValueError(f"{what}: parameter '{key}' is {value.dtype}; every parameter must be floating point")
        if key not in params and not (torch.is_floating_point(value) or is_integer(value)):
            raise ValueError(
                f"{what}: buffer '{key}' is {value.dtype}; a buffer must be floating point or integer "
                "(such as batch norm's running statistics and num_batches_tracked)"
            )
    shape = (2, *spec.image_shape)
    first = next(model.parameters())
    batch = torch.zeros(shape, dtype=first.dtype, device=first.device)
    training = model.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = model.eval()(batch)
    except Exception as exc:
        raise ValueError(
            f"{what}: the forward pass on a {shape} {spec.name} batch raised {type(exc).__name__}: {exc}"
        ) from None
    finally:
        model.train(training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, spec.num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"{what}: on a {shape} {spec.name} batch the model returned {got}; it must return "
            f"logits of shape (2, {spec.num_classes})"
        )


def parameter_keys(model: nn.Module) -> list[str]:
    """The state-dict keys of ``model``'s parameters, in state-dict order: what the attacks match
    (``fl_attack.attacker.api``). The buffers (batch norm's running statistics and counter) are the other keys;
    for a model without buffers, every key. A parameter registered under two names (tied weights)
    keeps both, as the state dict does."""
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    return [k for k in model.state_dict() if k in names]


def output_bias_key(state: dict, num_classes: int) -> str:
    """The state-dict key of the output-layer bias that label recovery reads: ``OUTPUT_BIAS`` when it
    is a (num_classes,) tensor, else the last 1-D entry of size ``num_classes`` (a user model's output
    layer is normally registered last). Raises KeyError when there is none.
    """
    if OUTPUT_BIAS in state and tuple(state[OUTPUT_BIAS].shape) == (num_classes,):
        return OUTPUT_BIAS
    for key in reversed(list(state)):
        if tuple(state[key].shape) == (num_classes,):
            return key
    raise KeyError(
        f"label recovery needs the output-layer bias '{OUTPUT_BIAS}' (in another model: a 1-D "
        f"entry of size {num_classes}) in the update; there is none (give the output layer a bias, "
        "or use oracle labels)"
    )


class InputNormalization:
    """A forward pre-hook that feeds a model normalised its own way from the attack's input space.

    The attacks and ``check_model`` feed a victim images normalised per ``get_spec(dataset)``
    (``DatasetSpec.normalize``); a user's app may normalise otherwise (e.g. Flower's quickstart:
    mean 0.5, std 0.5). The hook maps x -> ((x * spec_std + spec_mean) - mean) / std, so the
    model sees exactly what its app gave it for the same pixels in [0,1]. A plain class (not a
    closure): models travel to attack workers by pickling. mean, std: one value per channel, or one
    for all (as torchvision's Normalize takes them), on the [0,1] scale.
    """

    def __init__(self, dataset: str, mean, std):
        spec = get_spec(dataset)
        c = spec.image_shape[0]
        mean, std = ((v,) * c if isinstance(v, (int, float)) else v for v in (mean, std))  # Normalize(0.5, 0.5)
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
        if len(self.mean) != c or len(self.std) != c or min(self.std) <= 0 or max(map(abs, self.mean)) > 1:
            raise ValueError(
                f"input normalisation for {spec.name} needs {c} mean(s) in [-1,1] and {c} std(s) > 0, on the "
                f"[0,1] pixel scale (as torchvision's Normalize after ToTensor), got {mean} / {std}"
            )
        self.spec_mean, self.spec_std = spec.mean, spec.std

    def __call__(self, module: nn.Module, args: tuple):
        x, *rest = args
        view = (1, -1, 1, 1)

        def as_tensor(values):
            return torch.tensor(values, dtype=x.dtype, device=x.device).view(view)

        pixels = x * as_tensor(self.spec_std) + as_tensor(self.spec_mean)
        return ((pixels - as_tensor(self.mean)) / as_tensor(self.std), *rest)


def with_input_normalization(model: nn.Module, dataset: str, mean, std) -> nn.Module:
    """``model`` (changed in place and returned) fed through an ``InputNormalization`` hook; its
    parameter and buffer names stay the model's own (the update's keys). Raises ValueError for a
    normalisation that does not fit the dataset's channels."""
    model.register_forward_pre_hook(InputNormalization(dataset, mean, std))
    return model
