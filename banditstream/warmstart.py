"""A policy learned in the deciding process itself from a logged file: the SDK's fallback
when it holds no verified snapshot (offline from the start, the repository unreachable, every
snapshot failing verification, the one held expired or flagged for drift).

    local = local_policy("interrogator", settings, "logged.jsonl")
    decider = Decider("interrogator", client, kafka=..., settings=settings, fallback=local)

The file is what ``banditstream replay`` reads (a JSONL interaction log, or Avro decision and
reward events): each logged decision, joined with its rewards by the domain's reward engine,
is folded into the domain's policy in time order, its features encoded as the join encodes
them (z-scored with the statistics of the decisions before it when the domain normalises).
The events the Decider logs while this policy decides carry its ``version``, ``local:`` and the
first 12 hex digits of the file's SHA-256, so they can be told from the snapshots' and
evaluated apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from banditstream.decider import ActivePolicy
from banditstream.replay import joined_events
from learner.domain import DomainSettings
from learner.features import FeatureEncoder
from learner.policies import POLICIES

__all__ = ["local_policy"]


def local_policy(domain: str, settings: DomainSettings, path: str | Path, *, actions: Sequence[str] | None = None,
                 tenant: str = "default", workspace: str = "main", seed: int | None = None) -> ActivePolicy:
    """The domain's policy after the logged decisions of ``path`` (per-arm policies: a shared
    model needs each candidate's features, which a logged choice does not carry)."""
    if POLICIES[settings.policy].shared:
        raise ValueError(f"policy {settings.policy!r} is a shared model: a local warm start needs a per-arm policy")
    path = Path(path)
    encoder = FeatureEncoder(settings.features)
    rows = joined_events(path, domain, settings, tenant=tenant, workspace=workspace, actions=actions, encoder=encoder)
    rows = [row for row in rows if row["mode"] == "live"]
    if not rows:
        raise ValueError(f"{path}: no live decision of {tenant}/{workspace}/{domain} to learn from")
    policy = settings.make_policy(**({} if seed is None else {"seed": seed}))
    policy.update_batch(np.array([row["features"] for row in rows]), [row["actions"][row["arm_index"]] for row in rows],
                        np.array([row["reward"] for row in rows]), times=[row["decision_time"] for row in rows])  # fmt: skip
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return ActivePolicy(f"local:{digest}", policy, FeatureEncoder(settings.features, encoder.normalizer.freeze()),
                        samples=len(rows))
