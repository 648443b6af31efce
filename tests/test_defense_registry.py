"""The defense registry (fl_attack/federation/defense_registry.py): a defense is one class.

A test-local defense, "sign" (each update coordinate sent as its sign times a scale, signSGD-style),
is registered as one class and goes through the same paths as the library's own: the run config
(parsed, typed, checked), config.json's defense block and attacks.csv's label, and the ClientApp's
mods on a real in-process FEMNIST federation. Then the combination central-dp+secagg refused with
its reason, local-dp+secagg accepted, and the mods reading one parse per run config.
"""

from __future__ import annotations

import csv
from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fl_attack.audit.settings import RunSettings
from fl_attack.federation.defense_registry import DEFENSES, Defense, register_defense
from fl_attack.federation.defense_settings import DefenseSettings
from fl_attack.federation.models import build_model
from fl_attack.federation.update import flatten
from fl_attack.run_config import preflight
from tests.inprocess import BASE, federate, flower_run_config


@dataclass(frozen=True)
class Sign(Defense):
    """signSGD-style compression: the client sends w0 + scale * sign(wT - w0)."""

    name: ClassVar[str] = "sign"
    order: ClassVar[int] = 55  # after low-rank and quantize, before top-k
    sign_scale: float = 1e-3

    def checks(self) -> list[tuple[bool, str]]:
        return [(self.sign_scale > 0, f"defense-sign-scale must be > 0, got {self.sign_scale}")]

    def transform(self, w0: dict, wT: dict, seed: int) -> dict:
        return OrderedDict((k, w0[k] + self.sign_scale * torch.sign(wT[k] - w0[k])) for k in w0)

    def label(self) -> str:
        return f"sign({self.sign_scale:g})"

    def observed(self) -> str:
        return f"sign: each update coordinate as +-{self.sign_scale:g} (or 0)"


@pytest.fixture
def sign():
    register_defense(Sign)
    try:
        yield Sign
    finally:
        DEFENSES.pop("sign")


def test_a_defense_registered_as_one_class_is_parsed_checked_and_described(sign):
    settings = DefenseSettings.from_run_config({"defense": "topk+sign", "defense-sign-scale": "0.002", "seed": 1})
    assert settings.uses("sign") and settings.sign and not settings.low_rank
    assert settings.value("sign_scale") == 0.002  # typed like its default: a float
    assert settings.describe() == {
        "defense": "topk+sign",
        "label": "topk(0.1)+sign(0.002)",
        "parameters": {"defense-topk-fraction": 0.1, "defense-adaptive-attack": True, "defense-sign-scale": 0.002},
        "observed": "sign: each update coordinate as +-0.002 (or 0); top-k: only the 0.1 fraction of update "
        "coordinates largest in magnitude; the rest equal w0. The attacker matches only these observed "
        "coordinates (adaptive)",
    }
    assert settings.observed_only and settings.transforms_update
    assert "defense-sign-scale" in DefenseSettings.keys()
    # its key is checked like every defense key, whether the defense is on or not
    with pytest.raises(ValueError, match=r"^invalid run config: defense-sign-scale must be > 0, got -1.0$"):
        DefenseSettings.from_run_config({"defense": "none", "defense-sign-scale": -1.0})
    with pytest.raises(ValueError, match="run config 'defense-sign-scale' must be a number, got 'big'"):
        DefenseSettings.from_run_config({"defense": "sign", "defense-sign-scale": "big"})
    with pytest.raises(ValueError, match="unknown defense key 'defense-sign-scal'; known: .*defense-sign-scale"):
        DefenseSettings.from_run_config({"defense": "sign", "defense-sign-scal": 0.1})
    with pytest.raises(ValueError, match="defense 'none' cannot be combined"):
        DefenseSettings.from_run_config({"defense": "sign+none"})
    # the whole run's settings take it too, and hand the attack its (non-)adaptation
    run = RunSettings.from_run_config({**BASE, "defense": "sign", "defense-sign-scale": 0.002})
    assert run.defense == DefenseSettings(defense="sign", plugin_parameters={"sign_scale": 0.002})
    assert run.attack_config().observed_only is False
    # and its transform runs in its order: sign before top-k, so top-k's fraction is exact
    w0 = build_model("femnist", seed=0).state_dict()
    gen = torch.Generator().manual_seed(0)
    wT = OrderedDict((k, v + 1e-2 * torch.randn(v.shape, generator=gen)) for k, v in w0.items())
    u = flatten(settings.transform(w0, wT)) - flatten(w0)
    kept = u != 0
    assert int(kept.sum()) == pytest.approx(0.1 * u.numel(), abs=1)
    assert torch.allclose(u[kept].abs(), torch.full_like(u[kept], 0.002), rtol=1e-3)


def test_an_unregistered_defense_is_unknown_and_a_registered_one_is_listed(sign):
    with pytest.raises(ValueError, match="unknown defense 'signs' in defense='signs'; choose from none, .*, sign "):
        DefenseSettings.from_run_config({"defense": "signs"})
    DEFENSES.pop("sign")
    try:
        with pytest.raises(ValueError, match="unknown defense key 'defense-sign-scale'"):
            DefenseSettings.from_run_config({"defense": "none", "defense-sign-scale": 0.1})
    finally:
        DEFENSES["sign"] = Sign


@pytest.mark.heavy
def test_a_registered_defense_runs_through_the_client_mods_of_a_real_federation(sign, tmp_path):
    """Two FEMNIST writers train for real in process; the ClientApp's update_transform_mod applies the
    registered class's transform, so the server (and the attacker) sees scale * sign(u) of each
    client's update, and attacks.csv labels the rows with the class's label."""
    from tests.test_defenses import observed, raw_update

    scale = 0.002
    settings, _, _, jobs = federate(tmp_path, defense="sign", defense_sign_scale=scale)
    assert sorted(j.target.partition_id for j in jobs) == [0, 1]
    for job in jobs:
        raw = flatten(raw_update(settings, job.target.partition_id))
        seen = flatten(observed(job))
        sent = seen != 0
        assert torch.allclose(seen[sent].abs(), torch.full_like(seen[sent], scale), rtol=1e-3)  # only +-scale
        clear = raw.abs() > 1e-5  # away from 0, where a re-run's rounding (< 1e-6) cannot flip the sign
        assert float(clear.float().mean()) > 0.4  # (0.46 of them here)
        assert torch.equal(torch.sign(seen[clear]), torch.sign(raw[clear]))
        assert job.config.observed_only is False
    with open(tmp_path / "attacks.csv") as f:
        assert {row["defense"] for row in csv.DictReader(f)} == {"sign(0.002)"}


def test_register_defense_refuses_a_class_that_would_break_the_keys(sign):
    @dataclass(frozen=True)
    class Again(Sign):
        pass

    with pytest.raises(ValueError, match="register_defense: 'sign' is registered already"):
        register_defense(Again)

    @dataclass(frozen=True)
    class Looser(Defense):
        name: ClassVar[str] = "looser"
        clip_norm: float = 1.0  # local-dp's and central-dp's clip_norm defaults to 0.05

    with pytest.raises(ValueError, match="Looser.clip_norm defaults to 1.0, another defense's clip_norm to 0.05"):
        register_defense(Looser)

    class Undecorated(Defense):  # without @dataclass its scale would be no parameter
        name: ClassVar[str] = "undecorated"
        scale: float = 1.0

    with pytest.raises(TypeError, match=r"decorate Undecorated with @dataclass\(frozen=True\)"):
        register_defense(Undecorated)

    @dataclass(frozen=True)
    class Joined(Defense):
        name: ClassVar[str] = "a+b"

    with pytest.raises(ValueError, match="name must be lower-case text without '\\+'"):
        register_defense(Joined)
    assert "looser" not in DEFENSES and "undecorated" not in DEFENSES and "a+b" not in DEFENSES


# --- which defenses combine ----------------------------------------------------------------------


@pytest.mark.parametrize("defense", ["central-dp+secagg", "secagg+central-dp"])
def test_central_dp_with_secagg_is_refused_before_any_work_with_the_reason(defense):
    """Flower's central-DP wrappers wrap a Message-API strategy and clip per-client updates; SecAgg+
    runs on the legacy workflow whose strategy sees only the aggregate. The launcher's own check
    (what runs before any process starts) refuses it, saying so and what to use instead."""
    import strategies.launch as launch

    with pytest.raises(ValueError) as refused:
        launch._check_run_config({"defense": defense}, "options.num-supernodes=3")
    message = str(refused.value)
    assert message.startswith("invalid run config: central-dp cannot be combined with secagg: ")
    for reason in ("Message-API strategy", "legacy workflow", "unmasked aggregate alone", "use local-dp+secagg"):
        assert reason in message


def test_local_dp_with_secagg_is_accepted_and_switches_both_on():
    """Distributed DP: each client clips and noises (LocalDpMod) before SecAgg+ masks its update."""
    import strategies.launch as launch

    launch._check_run_config({"defense": "local-dp+secagg"}, "options.num-supernodes=3")
    settings = preflight(flower_run_config(defense="local-dp+secagg"), num_nodes=3)
    assert settings.defense.local_dp and settings.defense.secagg and not settings.defense.central_dp
    assert settings.defense.label == "local-dp(C=0.05,eps=10)+secagg(shares=3,t=2)"
    assert settings.clients_per_round(3) == 3 and settings.defense.min_clients == 2
    assert settings.defense.observed().startswith("SecAgg+: only the aggregate")


# --- the client mods parse the run config once ---------------------------------------------------


def test_the_client_mods_parse_the_run_config_once_not_per_message(monkeypatch):
    """Unit test on real Flower messages: the four training mods around a stand-in training step,
    three rounds, topk+local-dp; one parse of the run config (shared with the ClientApp), and each
    reply still carries the defended update (top-k's fraction of non-zeros)."""
    from clients import settings as client_settings
    from clients.defenses import TRAIN_MODS
    from fl_attack.federation.settings import FederationSettings

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    parses = []
    real = DefenseSettings.from_run_config.__func__

    def counted(cls, config):
        parses.append(dict(config))
        return real(cls, config)

    monkeypatch.setattr(DefenseSettings, "from_run_config", classmethod(counted))
    client_settings.parsed.cache_clear()
    run_config = flower_run_config(defense="topk+local-dp", defense_topk_fraction=0.05)
    context = Context(1, 7, {"partition-id": 0, "num-partitions": 2}, RecordDict(), run_config)
    w0 = build_model("femnist", seed=0).state_dict()
    gen = torch.Generator().manual_seed(0)
    wT = {k: v - 1e-3 * torch.randn(v.shape, generator=gen) for k, v in w0.items()}

    def train(msg, ctx):
        return Message(
            RecordDict({"arrays": ArrayRecord(wT), "metrics": MetricRecord({"num-examples": 8})}), reply_to=msg
        )

    def wrap(mod, inner):
        return lambda msg, ctx: mod(msg, ctx, inner)

    app = train
    for mod in reversed(TRAIN_MODS):  # TRAIN_MODS[0] outermost, as Flower chains them
        app = wrap(mod, app)
    for server_round in (1, 2, 3):
        sent = Message(
            RecordDict({"arrays": ArrayRecord(w0), "config": ConfigRecord({"server-round": server_round})}),
            dst_node_id=7,
            message_type="train",
        )
        ((_, arrays),) = app(sent, context).content.array_records.items()
        u = flatten(arrays.to_torch_state_dict()) - flatten(w0)
        assert int((u != 0).sum()) == pytest.approx(0.05 * u.numel(), abs=1)
    assert len(parses) == 1
    assert isinstance(client_settings.run_settings(context), FederationSettings) and len(parses) == 1
