"""The observed-update boundary: everything the honest-but-curious server sees of one client.

An ``ObservedUpdate`` holds the global weights sent (w0), the weights returned (wT) and public
training metadata. It has no field for images or labels, so the attacker cannot be handed private
data through it; the evaluator gets the ground truth separately, after the attack.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

StateDict = "OrderedDict[str, torch.Tensor]"

# The only keys ObservedUpdate.client may hold: public identifiers the server knows anyway.
PUBLIC_CLIENT_KEYS = frozenset({"round", "node_id", "partition_id", "client_id", "participants"})


def local_steps(num_samples: int, batch_size: int, local_epochs: int) -> int:
    """T = E * ceil(k / B), the number of local SGD steps of one client."""
    return int(local_epochs) * math.ceil(int(num_samples) / int(batch_size))


@dataclass(frozen=True)
class TrainingMetadata:
    """Public training metadata of one client update (PISME.md, "Threat model").

    lr is eta (plain SGD), batch_size B, local_epochs E, num_samples k; local_steps T defaults to
    E * ceil(k/B). Raises ValueError for non-positive values or B > k.
    """

    dataset: str
    lr: float
    batch_size: int
    local_epochs: int
    num_samples: int
    local_steps: int = -1

    def __post_init__(self):
        for name in ("batch_size", "local_epochs", "num_samples"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if self.batch_size > self.num_samples:
            raise ValueError(f"batch size B={self.batch_size} is larger than the client's k={self.num_samples} samples")
        if self.local_steps == -1:
            object.__setattr__(self, "local_steps", local_steps(self.num_samples, self.batch_size, self.local_epochs))
        elif self.local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, got {self.local_steps}")

    def to_dict(self) -> dict:
        return dict(dataset=self.dataset, lr=self.lr, batch_size=self.batch_size, local_epochs=self.local_epochs,
                    num_samples=self.num_samples, local_steps=self.local_steps)


def _as_state(weights, name: str) -> "OrderedDict[str, torch.Tensor]":
    if isinstance(weights, torch.nn.Module):
        weights = weights.state_dict()
    if not isinstance(weights, dict) or not weights:
        raise TypeError(f"{name} must be a non-empty dict of parameter name -> tensor, got {type(weights).__name__}")
    out = OrderedDict()
    for key, value in weights.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.array(value, copy=True))
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}['{key}'] must be a tensor or ndarray, got {type(value).__name__}")
        if not torch.is_floating_point(value):
            raise ValueError(f"{name}['{key}'] has dtype {value.dtype}; model parameters are floating point")
        out[key] = value.detach().to(torch.float32).cpu().clone()
    return out


@dataclass(frozen=True)
class ObservedUpdate:
    """What the server observes of one client in one round: (w0, wT, metadata).

    w0, wT: dicts parameter name -> float32 tensor (the model's state dict layout), same keys and
    shapes, given as floating-point tensors or ndarrays (copied to float32 on the CPU).
    client: public identifiers only, keys from PUBLIC_CLIENT_KEYS (round, node_id, partition_id,
    client_id, participants), values int, float, str or bool.
    Validated on construction; raises ValueError on mismatched keys or shapes, a non-floating dtype,
    NaN/inf values or a client key outside PUBLIC_CLIENT_KEYS, and TypeError for a non-scalar client
    value, before any attack work starts. ``check_against`` checks the update against its model.
    """

    w0: dict
    wT: dict
    metadata: TrainingMetadata
    client: dict = field(default_factory=dict)  # public identifiers only, e.g. {"round": 3, "node_id": 7}

    def __post_init__(self):
        w0, wT = _as_state(self.w0, "w0"), _as_state(self.wT, "wT")
        if list(w0) != list(wT):
            missing = sorted(set(w0) ^ set(wT))
            raise ValueError(f"w0 and wT have different keys (differing: {missing[:5]})" if missing
                             else "w0 and wT list the same keys in a different order")
        for key in w0:
            if w0[key].shape != wT[key].shape:
                raise ValueError(f"w0 and wT differ in shape at '{key}': {tuple(w0[key].shape)} vs {tuple(wT[key].shape)}")
            for name, state in (("w0", w0), ("wT", wT)):
                if not torch.isfinite(state[key]).all():
                    raise ValueError(f"{name}['{key}'] contains NaN or inf; the update cannot be attacked")
        if not isinstance(self.metadata, TrainingMetadata):
            raise TypeError("metadata must be a TrainingMetadata")
        if not isinstance(self.client, dict):
            raise TypeError(f"client must be a dict of public identifiers, got {type(self.client).__name__}")
        for key, value in self.client.items():
            if not isinstance(value, (int, float, str, bool)):
                raise TypeError(f"client['{key}'] must be a public scalar identifier, got {type(value).__name__}")
            if key not in PUBLIC_CLIENT_KEYS:
                raise ValueError(f"client['{key}'] is not a public identifier; client may only hold "
                                 f"{', '.join(sorted(PUBLIC_CLIENT_KEYS))}")
        object.__setattr__(self, "w0", w0)
        object.__setattr__(self, "wT", wT)

    def check_against(self, model) -> None:
        """Check that this update is one of ``model`` (an nn.Module or its state dict): exactly the
        model's state-dict keys, each of the model's shape, and floating-point model tensors.

        Raises ValueError naming the first offending key: a tensor the model does not have (e.g.
        'private_images' smuggled in beside the weights), a model tensor the update lacks, or a
        shape that differs.
        """
        state = model.state_dict() if isinstance(model, torch.nn.Module) else model
        if not isinstance(state, dict):
            raise TypeError(f"model must be an nn.Module or its state dict, got {type(state).__name__}")
        extra = [k for k in self.w0 if k not in state]
        if extra:
            raise ValueError(f"the update has tensor '{extra[0]}', which is not one of the model's parameters "
                             f"({len(extra)} such key(s): {extra[:5]})")
        missing = [k for k in state if k not in self.w0]
        if missing:
            raise ValueError(f"the update lacks the model's tensor '{missing[0]}' ({len(missing)} missing: {missing[:5]})")
        for key, reference in state.items():
            if tuple(self.w0[key].shape) != tuple(reference.shape):
                raise ValueError(f"the update's '{key}' has shape {tuple(self.w0[key].shape)}, "
                                 f"the model's {tuple(reference.shape)}")
            if not torch.is_floating_point(reference):
                raise ValueError(f"the model's '{key}' has dtype {reference.dtype}; only floating-point "
                                 "parameters can be attacked")

    @property
    def delta_w(self) -> "OrderedDict[str, torch.Tensor]":
        """Delta w = w0 - wT = eta * sum of the local gradients (eq. 1)."""
        return OrderedDict((k, self.w0[k] - self.wT[k]) for k in self.w0)

    @classmethod
    def from_arrays(cls, keys, w0_arrays, wT_arrays, metadata: TrainingMetadata, client=None) -> "ObservedUpdate":
        """Build from parallel lists of numpy arrays (Flower's ArrayRecord order)."""
        keys = list(keys)
        if not (len(keys) == len(w0_arrays) == len(wT_arrays)):
            raise ValueError(f"w0 and wT have different numbers of arrays: {len(w0_arrays)} vs {len(wT_arrays)} "
                             f"for {len(keys)} parameter names")
        return cls(OrderedDict(zip(keys, w0_arrays)), OrderedDict(zip(keys, wT_arrays)), metadata, dict(client or {}))


def flatten(state: dict) -> torch.Tensor:
    """Concatenate a state dict into one flat (P,) vector, in key order."""
    return torch.cat([v.reshape(-1) for v in state.values()])


def layout(state: dict) -> list[tuple[str, torch.Size]]:
    """(name, shape) of every parameter, the map from flat vectors back to a state dict."""
    return [(k, v.shape) for k, v in state.items()]


def unflatten(flat: torch.Tensor, shapes: list[tuple[str, torch.Size]]) -> dict:
    """Views of a flat (P,) vector as a state dict (no copy; works under torch.func.vmap)."""
    sizes = [int(np.prod(s)) for _, s in shapes]
    return {k: p.view(s) for (k, s), p in zip(shapes, torch.split(flat, sizes))}
