"""The paper's victim CNNs (PISME.md, "Victim training"; following SME, Zhu et al. ICML 2023).

Both models take normalised NCHW input, use ReLU and average pooling and have no batch norm, so
train and eval mode compute the same function. ``OUTPUT_BIAS`` names the output-layer bias used
for label recovery.
"""
from __future__ import annotations

import torch
from torch import nn

OUTPUT_BIAS = "fc2.bias"


class PaperCNN(nn.Module):
    """conv, ReLU, AvgPool 2, conv, ReLU, AvgPool 2, fc, ReLU, fc: the layout both victims share.

    ``fl_attack.attacks.gradients`` recognises this class (and subclasses that keep its forward,
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


_MODELS = {"cifar100": CifarCNN, "femnist": FemnistCNN}


def build_model(dataset: str, seed: int | None = None, width: int | None = None) -> nn.Module:
    """The victim model for ``dataset`` ("femnist" or "cifar100"), in eval mode.

    ``seed`` makes the initial weights reproducible. ``width`` overrides conv1's channel count
    (conv2 has twice as many; the paper's 32 for FEMNIST, 64 for CIFAR-100), for scaling studies.
    Raises ValueError for an unknown dataset or a width < 1.
    """
    if dataset not in _MODELS:
        raise ValueError(f"unknown dataset '{dataset}'; choose one of: {', '.join(sorted(_MODELS))}")
    if width is not None and int(width) < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    kwargs = {} if width is None else {"width": int(width)}
    if seed is None:
        model = _MODELS[dataset](**kwargs)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _MODELS[dataset](**kwargs)
    return model.eval()
