"""Architectures the project does not ship, for the "attack your own model" tests (run config
``model="tests.user_models:lenet"``, ``fl-attack attack --model tests.user_models:lenet``).

All follow the contract of fl_attack.federation.models.resolve_model: normalised (N,C,H,W) input of the
dataset's shape, (N, num_classes) logits, floating-point parameters. LeNet and TinyResNet have no
buffers; BatchNormNet has batch norm (float running statistics, an int64 counter), max pooling and
dropout. None names its output bias ``fc2.bias``: label recovery finds it as the last 1-D entry of
size num_classes.
"""

from __future__ import annotations

import torch
from torch import nn

from fl_attack.federation.data import get_spec


class LeNet(nn.Module):
    """LeNet-5 style: conv 5x5 (pad 2) -> 6, Tanh, AvgPool 2, conv 5x5 -> 16, Tanh, AvgPool 2,
    fc 120, Tanh, fc 84, Tanh, fc num_classes. (N,C,28|32,...) -> (N, num_classes)."""

    def __init__(self, channels: int = 1, size: int = 28, num_classes: int = 62):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 5, padding=2),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.Tanh(),
            nn.AvgPool2d(2),
        )
        side = (size // 2 - 4) // 2
        self.classifier = nn.Sequential(
            nn.Linear(16 * side * side, 120), nn.Tanh(), nn.Linear(120, 84), nn.Tanh(), nn.Linear(84, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def lenet(dataset: str = "femnist") -> LeNet:
    """The factory of the spec "tests.user_models:lenet": a LeNet for ``dataset``'s images."""
    spec = get_spec(dataset)
    channels, size, _ = spec.image_shape
    return LeNet(channels, size, spec.num_classes)


class TinyResNet(nn.Module):
    """A residual net without batch norm for FEMNIST: conv 1->8, ReLU, one residual block of two 3x3
    convs, global average pooling, fc 8->62."""

    def __init__(self, width: int = 8, num_classes: int = 62):
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.block = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = torch.relu(h + self.block(h))
        return self.head(h.mean((2, 3)))


def tiny_resnet() -> TinyResNet:
    """A factory without a dataset argument (FEMNIST only): "tests.user_models:tiny_resnet"."""
    return TinyResNet()


class QuickstartNet(nn.Module):
    """The CNN of Flower's quickstart-pytorch app: conv 5x5 -> 6, ReLU, MaxPool 2, conv 5x5 -> 16,
    ReLU, MaxPool 2, fc 120, ReLU, fc 84, ReLU, fc num_classes. (N,C,28|32,...) -> (N, num_classes)."""

    def __init__(self, channels: int = 3, size: int = 32, num_classes: int = 100):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(channels, 6, 5), nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        side = ((size - 4) // 2 - 4) // 2
        self.fc1, self.fc2, self.fc3 = nn.Linear(16 * side * side, 120), nn.Linear(120, 84), nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1))))))


def quickstart_net(dataset: str = "cifar100") -> QuickstartNet:
    """The factory of "tests.user_models:quickstart_net" (strategies/run_configs/flower-app.toml)."""
    spec = get_spec(dataset)
    channels, size, _ = spec.image_shape
    return QuickstartNet(channels, size, spec.num_classes)


class BatchNormNet(nn.Module):
    """Batch norm, max pooling and dropout, FEMNIST: BatchNorm2d(1) on the input, then conv 1->4 (3x3,
    pad 1), BatchNorm2d, ReLU, MaxPool 2, conv 4->8, BatchNorm2d, ReLU, MaxPool 2, Dropout(0.25), fc
    392->62. The first batch norm sees the images themselves, whose statistics do not depend on the
    weights (tests/test_batchnorm.py's literal check of the running-statistics estimate)."""

    def __init__(self, width: int = 4, num_classes: int = 62):
        super().__init__()
        self.features = nn.Sequential(
            nn.BatchNorm2d(1),
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(2 * width * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.features(x).flatten(1)))


def batch_norm_net() -> BatchNormNet:
    """The factory of "tests.user_models:batch_norm_net" (FEMNIST only)."""
    return BatchNormNet()


def with_batch_norm():
    """Conv 1->4 (3x3), BatchNorm2d, fc 2704->62 (FEMNIST): the smallest model with batch norm."""
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 26 * 26, 62))


# Factories that break the contract, for the error messages.
def not_a_module():
    return 42


def wrong_classes(dataset: str = "femnist") -> LeNet:
    return LeNet(num_classes=10)


class _Odd(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.fc = nn.Linear(784, 62)
        if kind == "parameter":
            self.steps = nn.Parameter(torch.zeros((), dtype=torch.int64), requires_grad=False)
        else:
            self.register_buffer("mask", torch.ones(62, dtype=torch.bool))

    def forward(self, x):
        return self.fc(x.flatten(1))


def integer_parameter():
    return _Odd("parameter")


def bool_buffer():
    return _Odd("buffer")


def no_output_bias():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 62, bias=False))


def broken(dataset: str):
    raise RuntimeError("no weights file")


class PlainPaperCNN(nn.Module):
    """The paper CNN's own layers (``fl_attack.federation.models.PaperCNN``) as a plain module, same state-dict
    keys: ``fl_attack.attacker.attacks.gradients.path_gradient`` does not recognise it and takes its generic
    (autograd) path, so the two paths can be compared on one network."""

    def __init__(self, cnn):
        super().__init__()
        self.conv1, self.conv2, self.fc1, self.fc2, self.pool = cnn.conv1, cnn.conv2, cnn.fc1, cnn.fc2, cnn.pool

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))
