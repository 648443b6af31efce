"""The observed-update boundary: everything the honest-but-curious server sees of one client.

An ``ObservedUpdate`` holds the global weights sent (w0), the weights returned (wT) and public
training metadata. It has no field for images or labels, so the attacker cannot be handed private
data through it; the evaluator gets the ground truth separately, after the attack.

w0 and wT are the model's whole state dict: its floating-point parameters and buffers (float32) and
its integer buffers (e.g. a batch norm's int64 ``num_batches_tracked``, kept with their dtype). The
attacks match the parameters only (``fl_attack.attacker.api``); batch-norm running statistics are read by
``fl_attack.attacker.attacks.batchnorm``.
"""

from __future__ import annotations

import hashlib
import io
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from fl_attack.federation.config import ClientOptimizer, check_training, local_steps
from fl_attack.records import append_csv_row, read_csv, write_bytes_atomic

StateDict = "OrderedDict[str, torch.Tensor]"

# The only keys ObservedUpdate.client may hold: public identifiers the server knows anyway.
PUBLIC_CLIENT_KEYS = frozenset({"round", "node_id", "partition_id", "client_id", "participants"})


@dataclass(frozen=True)
class TrainingMetadata:
    """Public training metadata of one client update (docs/PISME.md, "Threat model").

    lr is eta, batch_size B, local_epochs E, num_samples k; local_steps T defaults to
    E * ceil(k/B). optimizer: the clients' local optimizer (``fl_attack.federation.config.ClientOptimizer``,
    or its dict; default plain SGD, the paper's). train_mode: the clients trained the model in train
    mode (batch norm on batch statistics, updating its running statistics; dropout active), else in
    eval mode (the paper's; the default). Raises ValueError for non-positive values, B > k or a bad
    optimizer, TypeError for a train_mode that is not a bool.
    """

    dataset: str
    lr: float
    batch_size: int
    local_epochs: int
    num_samples: int
    local_steps: int = -1
    optimizer: ClientOptimizer = ClientOptimizer()
    train_mode: bool = False

    def __post_init__(self):
        if isinstance(self.optimizer, dict):
            object.__setattr__(self, "optimizer", ClientOptimizer(**self.optimizer))
        if not isinstance(self.optimizer, ClientOptimizer):
            raise TypeError(f"optimizer must be a ClientOptimizer, got {type(self.optimizer).__name__}")
        if not isinstance(self.train_mode, bool):
            raise TypeError(f"train_mode must be a bool, got {type(self.train_mode).__name__}")
        check_training(self.num_samples, self.batch_size, self.local_epochs, self.lr, samples_name="num_samples")
        if self.local_steps == -1:
            object.__setattr__(self, "local_steps", local_steps(self.num_samples, self.batch_size, self.local_epochs))
        elif self.local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, got {self.local_steps}")

    def to_metrics(self) -> dict:
        """The metadata as a Flower client's reply metrics (kebab-case: "num-examples", "lr", ...;
        "train-mode" 0 or 1)."""
        return {
            "num-examples": self.num_samples,
            "local-steps": self.local_steps,
            "lr": self.lr,
            "batch-size": self.batch_size,
            "local-epochs": self.local_epochs,
            **self.optimizer.to_metrics(),
            "train-mode": int(self.train_mode),
        }

    @classmethod
    def from_metrics(cls, dataset: str, metrics) -> TrainingMetadata:
        """Back from a reply's metrics (``to_metrics``); KeyError for a missing one, ValueError for a bad one.
        A reply without "train-mode" (an older client) trained in eval mode."""
        m = metrics
        return cls(
            dataset,
            lr=float(m["lr"]),
            batch_size=int(m["batch-size"]),
            local_epochs=int(m["local-epochs"]),
            num_samples=int(m["num-examples"]),
            local_steps=int(m["local-steps"]),
            optimizer=ClientOptimizer.from_metrics(m),
            train_mode=bool(int(m.get("train-mode", 0))),
        )

    def to_dict(self) -> dict:
        return dict(
            dataset=self.dataset,
            lr=self.lr,
            batch_size=self.batch_size,
            local_epochs=self.local_epochs,
            num_samples=self.num_samples,
            local_steps=self.local_steps,
            optimizer=asdict(self.optimizer),
            train_mode=self.train_mode,
        )


def is_integer(t: torch.Tensor) -> bool:
    """True for an integer tensor (int8 ... int64, uint8): a counter buffer such as a batch norm's
    ``num_batches_tracked``; False for floating point, complex and bool."""
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _as_state(weights, name: str) -> OrderedDict[str, torch.Tensor]:
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
        if is_integer(value):  # an integer buffer (a counter): kept exactly, with its dtype
            out[key] = value.detach().cpu().clone()
            continue
        if not torch.is_floating_point(value):
            raise ValueError(
                f"{name}['{key}'] has dtype {value.dtype}; an update holds floating-point tensors and "
                "integer buffers only"
            )
        out[key] = value.detach().to(torch.float32).cpu().clone()
    return out


@dataclass(frozen=True)
class ObservedUpdate:
    """What the server observes of one client in one round: (w0, wT, metadata).

    w0, wT: dicts name -> tensor (the model's state dict layout: parameters and buffers), same keys,
    shapes and dtypes, given as tensors or ndarrays and copied to the CPU: floating-point ones as
    float32, integer ones (buffers such as a batch norm's int64 ``num_batches_tracked``) with their
    own dtype.
    client: public identifiers only, keys from PUBLIC_CLIENT_KEYS (round, node_id, partition_id,
    client_id, participants), values int, float, str or bool.
    Validated on construction; raises ValueError on mismatched keys, shapes or dtypes (an integer
    tensor on one side only, or two integer dtypes), a bool or complex tensor, NaN/inf values or a
    client key outside PUBLIC_CLIENT_KEYS, and TypeError for a non-scalar client value, before any
    attack work starts. ``check_against`` checks the update against its model.
    """

    w0: dict
    wT: dict
    metadata: TrainingMetadata
    client: dict = field(default_factory=dict)  # public identifiers only, e.g. {"round": 3, "node_id": 7}

    def __post_init__(self):
        w0, wT = _as_state(self.w0, "w0"), _as_state(self.wT, "wT")
        if list(w0) != list(wT):
            missing = sorted(set(w0) ^ set(wT))
            raise ValueError(
                f"w0 and wT have different keys (differing: {missing[:5]})"
                if missing
                else "w0 and wT list the same keys in a different order"
            )
        for key in w0:
            if w0[key].shape != wT[key].shape:
                raise ValueError(
                    f"w0 and wT differ in shape at '{key}': {tuple(w0[key].shape)} vs {tuple(wT[key].shape)}"
                )
            if w0[key].dtype != wT[key].dtype:
                raise ValueError(f"w0 and wT differ in dtype at '{key}': {w0[key].dtype} vs {wT[key].dtype}")
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
                raise ValueError(
                    f"client['{key}'] is not a public identifier; client may only hold "
                    f"{', '.join(sorted(PUBLIC_CLIENT_KEYS))}"
                )
        object.__setattr__(self, "w0", w0)
        object.__setattr__(self, "wT", wT)

    def check_against(self, model) -> None:
        """Check that this update is one of ``model`` (an nn.Module or its state dict): exactly the
        model's state-dict keys, each of the model's shape; floating-point model tensors where the
        update has float32 ones, and integer model buffers where the update has the same integer dtype.

        Raises ValueError naming the first offending key: a tensor the model does not have (e.g.
        'private_images' smuggled in beside the weights), a model tensor the update lacks, a shape
        that differs, or a dtype that does not match (an integer entry on one side only, another
        integer dtype, a bool or complex model tensor).
        """
        state = model.state_dict() if isinstance(model, torch.nn.Module) else model
        if not isinstance(state, dict):
            raise TypeError(f"model must be an nn.Module or its state dict, got {type(state).__name__}")
        extra = [k for k in self.w0 if k not in state]
        if extra:
            raise ValueError(
                f"the update has tensor '{extra[0]}', which is not one of the model's parameters "
                f"({len(extra)} such key(s): {extra[:5]})"
            )
        missing = [k for k in state if k not in self.w0]
        if missing:
            raise ValueError(
                f"the update lacks the model's tensor '{missing[0]}' ({len(missing)} missing: {missing[:5]})"
            )
        for key, reference in state.items():
            if tuple(self.w0[key].shape) != tuple(reference.shape):
                raise ValueError(
                    f"the update's '{key}' has shape {tuple(self.w0[key].shape)}, the model's {tuple(reference.shape)}"
                )
            ours = self.w0[key].dtype
            if is_integer(reference) or is_integer(self.w0[key]):
                if reference.dtype != ours:
                    raise ValueError(f"the update's '{key}' has dtype {ours}, the model's {reference.dtype}")
            elif not torch.is_floating_point(reference):
                raise ValueError(
                    f"the model's '{key}' has dtype {reference.dtype}; an update holds floating-point tensors "
                    "and integer buffers only"
                )

    @property
    def num_parameters(self) -> int:
        """The model's parameters in the update: its floating-point entries but batch norm's running
        statistics (torch's buffer names running_mean and running_var), the equations the attacks match."""
        stats = ("running_mean", "running_var")
        return sum(v.numel() for k, v in self.w0.items() if torch.is_floating_point(v) and not k.endswith(stats))

    @property
    def num_unknowns(self) -> int:
        """k*C*H*W, the client's pixels the attack must recover (the model's data ratio is
        num_unknowns / num_parameters: above 1, the inversion is underdetermined)."""
        from fl_attack.federation.pools import get_spec

        shape = get_spec(self.metadata.dataset).image_shape
        return self.metadata.num_samples * int(np.prod(shape))

    @property
    def delta_w(self) -> OrderedDict[str, torch.Tensor]:
        """Delta w = w0 - wT = eta * sum of the local gradients (eq. 1) on the parameters; buffers'
        entries are their change (an integer buffer's in its dtype)."""
        return OrderedDict((k, self.w0[k] - self.wT[k]) for k in self.w0)

    @classmethod
    def from_arrays(cls, keys, w0_arrays, wT_arrays, metadata: TrainingMetadata, client=None) -> ObservedUpdate:
        """Build from parallel lists of numpy arrays (Flower's ArrayRecord order)."""
        keys = list(keys)
        if not (len(keys) == len(w0_arrays) == len(wT_arrays)):
            raise ValueError(
                f"w0 and wT have different numbers of arrays: {len(w0_arrays)} vs {len(wT_arrays)} "
                f"for {len(keys)} parameter names"
            )
        return cls(OrderedDict(zip(keys, w0_arrays)), OrderedDict(zip(keys, wT_arrays)), metadata, dict(client or {}))


def flatten(state: dict) -> torch.Tensor:
    """Concatenate a state dict into one flat (P,) vector, in key order (the attacks pass only the
    model's parameters, ``fl_attack.attacker.api``)."""
    return torch.cat([v.reshape(-1) for v in state.values()])


def layout(state: dict) -> list[tuple[str, torch.Size]]:
    """(name, shape) of every parameter, the map from flat vectors back to a state dict."""
    return [(k, v.shape) for k, v in state.items()]


def unflatten(flat: torch.Tensor, shapes: list[tuple[str, torch.Size]]) -> dict:
    """Views of a flat (P,) vector as a state dict (no copy; works under torch.func.vmap)."""
    sizes = [int(np.prod(s)) for _, s in shapes]
    return {k: p.view(s) for (k, s), p in zip(shapes, torch.split(flat, sizes))}


@dataclass(frozen=True)
class AttackTarget:
    """Whose update an attack targets: public identifiers only, never data.

    round: the FedAvg round, >= 1. partition_ids: the simulated client's partition id, or under
    SecAgg+ (``aggregate`` True) every participant of the aggregate, ascending. node_id: Flower's
    node id of the client (None for an aggregate). client_id: the dataset's client name (a LEAF
    writer, "cifar100-client-P") or "aggregate:0,1,2". Raises ValueError for a round < 1, no or
    negative partition ids, or several ids without ``aggregate``.
    """

    round: int
    partition_ids: tuple[int, ...]
    node_id: int | None = None
    client_id: str = ""
    aggregate: bool = False

    def __post_init__(self):
        ids = tuple(sorted(int(p) for p in self.partition_ids))
        if int(self.round) < 1:
            raise ValueError(f"an attack target's round must be >= 1, got {self.round}")
        if not ids or ids[0] < 0:
            raise ValueError(f"an attack target needs partition ids >= 0, got {self.partition_ids}")
        if len(ids) > 1 and not self.aggregate:
            raise ValueError(f"several partition ids {ids} make an aggregate: set aggregate=True")
        object.__setattr__(self, "round", int(self.round))
        object.__setattr__(self, "partition_ids", ids)

    @property
    def partition_id(self) -> int | None:
        """The client's partition id; None for an aggregate."""
        return None if self.aggregate else self.partition_ids[0]

    @property
    def name(self) -> str:
        """ "client-P", or "aggregate": the file name of its image grid and recorded update."""
        return "aggregate" if self.aggregate else f"client-{self.partition_ids[0]}"

    def describe(self) -> str:
        """Human-readable, for logs: "round 3 partition 5" or "round 3 aggregate of 0,1,2"."""
        if self.aggregate:
            return f"round {self.round} aggregate of {','.join(map(str, self.partition_ids))}"
        return f"round {self.round} partition {self.partition_ids[0]}"

    def to_row(self) -> dict:
        """The target as CSV cells (updates/index.csv)."""
        return {
            "round": self.round,
            "partition_ids": ",".join(map(str, self.partition_ids)),
            "node_id": "" if self.node_id is None else self.node_id,
            "client_id": self.client_id,
            "aggregate": int(self.aggregate),
        }

    @classmethod
    def from_row(cls, row: dict) -> AttackTarget:
        """Inverse of ``to_row`` (values may be strings, as read from a CSV)."""
        node = row.get("node_id")
        return cls(
            round=int(row["round"]),
            partition_ids=tuple(int(p) for p in str(row["partition_ids"]).split(",")),
            node_id=None if node in (None, "") else int(node),
            client_id=str(row.get("client_id") or ""),
            aggregate=str(row.get("aggregate", "0")) in ("1", "True", "true"),
        )


# Recorded updates: what the attacker observed, kept in a run folder so it can be attacked again ----------
UPDATE_INDEX = "index.csv"
UPDATE_INDEX_COLUMNS = [
    "round",
    "partition_ids",
    "node_id",
    "client_id",
    "aggregate",
    "file",
    "sha256",
    "w0_file",
    "w0_sha256",
]


def _saved(obj) -> tuple[bytes, str]:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def save_torch_atomic(path, obj) -> str:
    """``torch.save`` of ``obj`` written atomically to ``path`` (fl_attack.records); returns its SHA-256."""
    data, sha = _saved(obj)
    write_bytes_atomic(path, data)
    return sha


def save_update(update: ObservedUpdate, target: AttackTarget, folder) -> dict:
    """Record ``update`` under ``folder`` (a run's ``updates/``) and append its line to ``index.csv``.

    Files: ``round-R/w0.pt`` (the round's global weights, written once per round and shared) and
    ``round-R/<target.name>.pt`` (wT, the public training metadata and the target), each written
    atomically; the index holds their SHA-256. Only what the attacker observed is written, never data.
    Returns the index row.
    """
    folder = Path(folder)
    rel = Path(f"round-{target.round}")
    w0_bytes, w0_sha = _saved({"w0": update.w0})
    if not (folder / rel / "w0.pt").exists():
        write_bytes_atomic(folder / rel / "w0.pt", w0_bytes)
    data, sha = _saved({"wT": update.wT, "metadata": update.metadata.to_dict(), "target": target.to_row()})
    write_bytes_atomic(folder / rel / f"{target.name}.pt", data)
    row = {
        **target.to_row(),
        "file": (rel / f"{target.name}.pt").as_posix(),
        "sha256": sha,
        "w0_file": (rel / "w0.pt").as_posix(),
        "w0_sha256": w0_sha,
    }
    append_csv_row(folder / UPDATE_INDEX, row, UPDATE_INDEX_COLUMNS)
    return row


def _checked_bytes(folder: Path, name: str, sha: str) -> bytes:
    """The bytes of ``folder``/``name``; ValueError unless their SHA-256 is ``sha``."""
    data = (folder / name).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha:
        raise ValueError(f"recorded update {folder / name} does not match its checksum in {UPDATE_INDEX}")
    return data


def verify_update(folder, row: dict) -> None:
    """Check the files of one ``index.csv`` row of ``folder`` against their SHA-256, without loading them.

    Raises ValueError for a checksum that differs (a corrupt or altered record), FileNotFoundError
    for a missing file, KeyError for an index row without the file columns.
    """
    folder = Path(folder)
    for name, sha in ((row["w0_file"], row["w0_sha256"]), (row["file"], row["sha256"])):
        _checked_bytes(folder, name, sha)


def load_update(folder, row: dict) -> tuple[ObservedUpdate, AttackTarget]:
    """The (update, target) of one ``index.csv`` row of ``folder``, checked against its SHA-256.

    Raises ValueError when a file's checksum differs from the index (a corrupt or altered record),
    FileNotFoundError when a file is missing.
    """
    folder = Path(folder)

    def read(name: str, sha: str):
        return torch.load(io.BytesIO(_checked_bytes(folder, name, sha)), weights_only=True)

    w0 = read(row["w0_file"], row["w0_sha256"])["w0"]
    saved = read(row["file"], row["sha256"])
    target = AttackTarget.from_row(row)
    meta = TrainingMetadata(**saved["metadata"])
    return ObservedUpdate(w0, saved["wT"], meta, {"round": target.round}), target


def read_update_index(folder) -> list[dict]:
    """The rows of ``folder``/index.csv in file order ([] when nothing was recorded)."""
    return read_csv(Path(folder) / UPDATE_INDEX)[1]
