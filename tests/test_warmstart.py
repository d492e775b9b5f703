"""The SDK's local warm start: a policy learned in-process from a logged file decides when no
verified snapshot is held (none published, or every one failing verification), its decisions
logged with its own version; a verified snapshot takes over as soon as one is pulled."""

from __future__ import annotations

import json
import random

import pytest

from banditstream.decider import Decider, PulledSnapshots
from banditstream.warmstart import local_policy
from learner.domain import DomainSettings
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig
from publisher.pull import SnapshotClient
from publisher.repository import create_root
from publisher.signing import KeyRing
from publisher.stores import DirectoryStore

SETTINGS = DomainSettings.model_validate({"policy": "lin_ts", "params": {"seed": 3, "eps0": 0.05},
                                          "features": {"dimension": 16, "normalize": True}})  # fmt: skip


def best(x: float) -> str:
    return "a" if x > 0 else "b"


def logged(path, n: int = 600, seed: int = 1):
    """A uniform logger's decisions over a and b; reward 1 for the better arm given x."""
    rng = random.Random(seed)
    with open(path, "w") as out:
        for i in range(n):
            x, agent = rng.uniform(-1, 1), rng.choice("ab")
            out.write(json.dumps({"interaction_id": f"i{i}", "agent": agent, "context": {"x": x},
                                  "timestamp": 1_700_000_000_000 + 1000 * i, "probability": 0.5}) + "\n")  # fmt: skip
            out.write(json.dumps({"interaction_id": f"i{i}", "reward": float(agent == best(x))}) + "\n")
    return path


def hits(decider: Decider, n: int = 300, seed: int = 2) -> tuple[float, set[str]]:
    rng = random.Random(seed)
    right, versions = 0, set()
    for i in range(n):
        x = rng.uniform(-1, 1)
        decision = decider.decide({"x": x}, ["a", "b"], f"e{i}")
        right += decision.action == best(x)
        versions.add(decision.policy_version)
    return right / n, versions


def test_offline_the_local_warm_start_decides_and_its_decisions_say_so(tmp_path):
    local = local_policy("route", SETTINGS, logged(tmp_path / "log.jsonl"), actions=["a", "b"])
    assert local.samples == 600 and local.version.startswith("local:")
    share, versions = hits(Decider("route", settings=SETTINGS, fallback=local, seed=5))
    assert share > 0.85 and versions == {local.version}
    baseline, versions = hits(Decider("route", settings=SETTINGS, seed=5))
    assert baseline < 0.6 and versions == {""}  # without it, the first candidate (a) every time
    again = local_policy("route", SETTINGS, tmp_path / "log.jsonl", actions=["a", "b"])
    assert hits(Decider("route", settings=SETTINGS, fallback=again, seed=5)) == hits(
        Decider("route", settings=SETTINGS, fallback=local, seed=5))  # same file and seed: same choices


def test_a_snapshot_that_fails_verification_leaves_the_local_warm_start_deciding_and_a_good_one_replaces_it(tmp_path):
    local = local_policy("route", SETTINGS, logged(tmp_path / "log.jsonl"), actions=["a", "b"])
    trusted, other = KeyRing.generate(), KeyRing.generate()
    (tmp_path / "root.json").write_bytes(create_root(trusted))
    store = DirectoryStore(tmp_path / "snapshots")
    config = PublisherConfig(guards=GuardConfig(min_samples=0))
    Publisher(store, other, create_root(other), domains={"route": SETTINGS}, config=config).publish("route", SETTINGS.make_policy())
    client = SnapshotClient(store, tmp_path / "cache", tmp_path / "root.json", domain="route")
    decider = Decider("route", PulledSnapshots(client), settings=SETTINGS, fallback=local, seed=5, refresh_interval_s=3600)
    share, versions = hits(decider)
    assert share > 0.85 and versions == {local.version}
    assert decider.metrics.fallbacks.labels("route", "no_snapshot", "stable")._value.get() == 300

    other_store = DirectoryStore(tmp_path / "good")  # a snapshot signed by the trusted keys
    version = Publisher(other_store, trusted, create_root(trusted), domains={"route": SETTINGS}, config=config).publish(
        "route", SETTINGS.make_policy()).version
    good = Decider("route", PulledSnapshots(SnapshotClient(other_store, tmp_path / "cache-good", tmp_path / "root.json",
                                                           domain="route")),
                   settings=SETTINGS, fallback=local, seed=5, refresh_interval_s=3600)  # fmt: skip
    assert hits(good, n=20)[1] == {version}


def test_a_shared_model_cannot_be_warm_started_locally(tmp_path):
    shared = DomainSettings.model_validate({"policy": "shared_lin_ts", "features": {"shared": True}})
    with pytest.raises(ValueError, match="per-arm policy"):
        local_policy("route", shared, logged(tmp_path / "log.jsonl"))
