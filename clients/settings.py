"""The run config as a client process reads it: parsed once per run config and process, shared by the
ClientApp (clients/client_app.py) and its defense mods (clients/defenses.py), which run on every
message. The server's pre-flight (fl_attack.run_config.preflight) has checked the whole run config;
a client reads only what it needs (no attack key, no attack code) without checking it again per message.
"""

from __future__ import annotations

import functools

from flwr.app import Context

from fl_attack.federation.settings import FederationSettings


@functools.lru_cache(maxsize=8)
def parsed(run_config: tuple) -> FederationSettings:
    """The federation settings of a run config given as its sorted (key, value) items."""
    return FederationSettings.from_run_config(dict(run_config))


def run_settings(context: Context) -> FederationSettings:
    """The federation settings (its ``defense`` included) of ``context.run_config``, from the cache."""
    return parsed(tuple(sorted(dict(context.run_config).items())))
