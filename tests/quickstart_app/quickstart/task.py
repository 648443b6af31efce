"""quickstart: a Flower / PyTorch app (the model, the data, train and test).

Laid out as Flower's quickstart-pytorch ``task.py``: the same max-pooling CNN (for CIFAR-100's 100
classes), the same transforms and normalisation, SGD with momentum 0.9, IID partitions of which each
node keeps 80% for training and 20% for testing. The data is a CIFAR-100 sample in an .npz file
(``images`` uint8 (N, 32, 32, 3), ``labels``), read with numpy; by default the one bundled with
fl-attack, found where that package is installed.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import Compose, Normalize, ToTensor


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz'); ``batch_norm``: a BatchNorm2d after
    each convolution, as most Flower apps' models have (their running statistics and int64 counter are
    in the state dict the app sends)."""

    def __init__(self, num_classes: int = 100, batch_norm: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.bn1 = nn.BatchNorm2d(6) if batch_norm else nn.Identity()
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.bn2 = nn.BatchNorm2d(16) if batch_norm else nn.Identity()
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


pytorch_transforms = Compose([ToTensor(), Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])

_pool = {}  # Cache the data file's arrays, once per process


def data_path(data_file: str = "") -> Path:
    """The .npz to read: ``data_file``, or "" for the CIFAR-100 sample bundled with fl-attack."""
    return Path(data_file) if data_file else Path(str(files("fl_attack") / "assets" / "cifar100_sample.npz"))


def load_partition(partition_id: int, num_partitions: int, examples: int = 0, data_file: str = "") -> dict:
    """Partition ``partition_id`` of ``num_partitions`` IID ones, its first ``examples`` images (0 =
    all), split 80% train, 20% test: {"train": (images, labels), "test": (images, labels)}, raw
    uint8 (N, 32, 32, 3) images and int64 labels."""
    path = data_path(data_file)
    if path not in _pool:
        with np.load(path, allow_pickle=False) as npz:
            _pool[path] = (npz["images"], npz["labels"].astype(np.int64))
    images, labels = _pool[path]
    partition = np.array_split(np.random.default_rng(42).permutation(len(labels)), num_partitions)[partition_id]
    if examples:
        partition = partition[:examples]
    # Divide data on each node: 80% train, 20% test
    order = np.random.default_rng(42).permutation(len(partition))
    test_size = int(round(0.2 * len(partition)))
    train, test = partition[order[test_size:]], partition[order[:test_size]]
    return {"train": (images[train], labels[train]), "test": (images[test], labels[test])}


def training_images(partition_id: int, num_partitions: int, examples: int = 0, data_file: str = ""):
    """Partition ``partition_id``'s training images as float (N, 3, 32, 32) in [0, 1] and its labels."""
    images, labels = load_partition(partition_id, num_partitions, examples, data_file)["train"]
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255, torch.from_numpy(labels)


class ImageDataset(Dataset):
    """Raw images and labels, as quickstart's transformed batches: {"img": tensor, "label": int}."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"img": pytorch_transforms(self.images[i]), "label": int(self.labels[i])}


def load_data(partition_id: int, num_partitions: int, batch_size: int, examples: int = 0, data_file: str = ""):
    """Load partition CIFAR-100 data: (trainloader, testloader)."""
    partition = load_partition(partition_id, num_partitions, examples, data_file)
    trainloader = DataLoader(ImageDataset(*partition["train"]), batch_size=batch_size, shuffle=True)
    testloader = DataLoader(ImageDataset(*partition["test"]), batch_size=batch_size)
    return trainloader, testloader


def train(net, trainloader, epochs, lr, device, proximal_mu: float = 0.0):
    """Train the model on the training set (with FedProx's proximal term when ``proximal_mu`` > 0)."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    global_params = [p.detach().clone() for p in net.parameters()]
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            if proximal_mu > 0:
                proximal = sum((p - g).pow(2).sum() for p, g in zip(net.parameters(), global_params))
                loss = loss + (proximal_mu / 2) * proximal
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net, testloader, device):
    """Validate the model on the test set: (loss, accuracy)."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss / max(len(testloader), 1), correct / max(len(testloader.dataset), 1)
