"""Client-side defenses as Flower mods, each switched on and configured by the run config.

Flower fixes a ClientApp's mods when the module is imported, and the mods do not check the
message type (as measured on Flower 1.42). So ``TRAIN_MODS`` is registered for training only, and each
mod here reads the run's DefenseSettings (parsed once per run config: clients/settings.py) and steps
aside when its defense is off. Outermost first:

1. ``secagg_mod``: Flower's ``secaggplus_mod`` (SecAgg+ masking of the final update);
2. ``update_transform_mod``: the ``transform`` of every active defense that has one (topk, low-rank,
   quantize; fl_attack/federation/defense_registry.py), post-processing of whatever the inner mods
   produced, so that DP noise is sparsified, not sparsity noised;
3. ``local_dp_mod``: Flower's ``LocalDpMod`` (clip to C, Gaussian noise), seeded per client and round;
4. ``central_clipping_mod``: Flower's ``fixedclipping_mod`` for central DP with client-side
   clipping (the strategy wrapper sends the clipping norm).

The mods read the weights sent and returned from the message's single ArrayRecord, so they work
both on the Message API (``arrays``) and on SecAgg+'s legacy messages (``fitins.parameters``).
A new defense whose client side is the library's own arithmetic needs nothing here (its ``transform``);
one whose client side is a Flower mod (the library imports no Flower) adds its mod to ``TRAIN_MODS``.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.mod import LocalDpMod, fixedclipping_mod

from fl_attack.federation.defense_settings import DefenseSettings

from .settings import run_settings


def _defense(context: Context) -> DefenseSettings:
    """The run's DefenseSettings, parsed once per run config and process (not per message)."""
    return run_settings(context).defense


def _server_round(msg: Message) -> int:
    for record in msg.content.config_records.values():  # "config" or, on the legacy path, "fitins.config"
        if "server-round" in record:
            return int(record["server-round"])
    group = str(msg.metadata.group_id)
    return int(group) if group.isdigit() else 0


def client_seed(context: Context, msg: Message) -> int:
    """A seed for this client's defense randomness: (run seed, server round, partition id)."""
    seed = int(context.run_config.get("seed", 0))
    partition = int(context.node_config.get("partition-id", 0))
    return (seed * 1_000_003 + _server_round(msg) * 1009 + partition) % (2**32)


def secagg_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's secaggplus_mod when the defense includes secagg."""
    if not _defense(context).secagg:
        return call_next(msg, context)
    return secaggplus_mod(msg, context, call_next)


def update_transform_mod(msg: Message, context: Context, call_next) -> Message:
    """Replace the returned weights by the active defenses' transformed update (DefenseSettings.transform)."""
    defense = _defense(context)
    if not defense.transforms_update:
        return call_next(msg, context)
    (sent,) = msg.content.array_records.values()
    w0 = sent.to_torch_state_dict()
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    ((key, returned),) = reply.content.array_records.items()
    wT = defense.transform(w0, returned.to_torch_state_dict(), seed=client_seed(context, msg))
    reply.content.array_records[key] = ArrayRecord(wT)
    return reply


def local_dp_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's LocalDpMod (sensitivity = the clipping norm) when the defense includes local-dp.

    LocalDpMod draws its noise from numpy's global generator; it is seeded here for this client
    and round, and the generator's state restored afterwards.
    """
    defense = _defense(context)
    if not defense.local_dp:
        return call_next(msg, context)
    mod = LocalDpMod(
        clipping_norm=defense.clip_norm, sensitivity=defense.clip_norm, epsilon=defense.epsilon, delta=defense.delta
    )
    state = np.random.get_state()
    np.random.seed(client_seed(context, msg))
    try:
        return mod(msg, context, call_next)
    finally:
        np.random.set_state(state)


def central_clipping_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's fixedclipping_mod when the defense is central-dp with client-side clipping."""
    defense = _defense(context)
    if not (defense.central_dp and defense.clipping == "client"):
        return call_next(msg, context)
    return fixedclipping_mod(msg, context, call_next)


TRAIN_MODS = [secagg_mod, update_transform_mod, local_dp_mod, central_clipping_mod]
