"""The SDK against a real signed repository: publish -> pull -> decide, hot swap, tamper."""

from __future__ import annotations

import time

import numpy as np
import pytest

from banditstream.decider import Decider
from learner.domain import DomainSettings
from publisher import SnapshotClient
from publisher.cli_ops import generate_keys, load_keys
from publisher.publish import Publisher
from publisher.stores import open_store

ARMS = ["small", "large", "agent"]
SETTINGS = DomainSettings(policy="lin_ucb", params={"alpha": 0.1, "eps0": 0.03}, features={"dimension": 8, "normalize": False})


@pytest.fixture
def repo(tmp_path):
    generate_keys(tmp_path / "keys")
    keys, root = load_keys(tmp_path / "keys")
    store = open_store(tmp_path / "snapshots")
    publisher = Publisher(store, keys, root, domains={"route": SETTINGS})
    client = SnapshotClient(tmp_path / "snapshots", tmp_path / "cache", tmp_path / "keys" / "root.json", domain="route")
    return publisher, client, tmp_path


def _policy_preferring(best: str, seed: int):
    policy = SETTINGS.make_policy(seed=seed)
    x = SETTINGS.encoder().context_vector({"numeric": {"load": 1.0}, "categorical": {}, "vector": []})
    arms = [ARMS[i % 3] for i in range(300)]
    policy.update_batch(np.tile(x, (300, 1)), arms, [1.0 if a == best else 0.0 for a in arms])
    return policy


def test_publish_pull_decide_and_a_new_snapshot_is_used_within_one_refresh_interval(repo):
    publisher, client, _ = repo
    first = publisher.publish("route", _policy_preferring("large", 1)).version
    interval = 0.5
    with Decider("route", repository=client, settings=SETTINGS, refresh_interval_s=interval, seed=2) as decider:
        d = decider.decide({"load": 1.0}, ARMS)
        assert d.policy_version == first and d.fallback is None
        assert [decider.decide({"load": 1.0}, ARMS).action for _ in range(200)].count("large") > 150

        second = publisher.publish("route", _policy_preferring("agent", 2)).version
        published_at = time.monotonic()
        while decider.decide({"load": 1.0}, ARMS).policy_version != second:
            assert time.monotonic() - published_at < interval + 1.0, "new snapshot not used within one refresh interval"
            time.sleep(0.01)
        assert [decider.decide({"load": 1.0}, ARMS).action for _ in range(200)].count("agent") > 150


def test_tampered_repository_keeps_the_last_good_snapshot_and_counts_the_failure(repo):
    publisher, client, tmp_path = repo
    good = publisher.publish("route", _policy_preferring("large", 1)).version
    with Decider("route", repository=client, settings=SETTINGS, refresh_interval_s=3600, seed=2) as decider:
        assert decider.policy_version == good
        publisher.publish("route", _policy_preferring("agent", 2))
        targets = sorted((tmp_path / "snapshots" / "default" / "main" / "route" / "targets").iterdir())
        newest = max(targets, key=lambda p: p.stat().st_mtime)
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0x01
        newest.write_bytes(bytes(data))
        assert decider.refresh() is False
        assert decider.decide({"load": 1.0}, ARMS).policy_version == good  # the last good one decides
        failures = {
            s.labels["kind"]: s.value
            for m in decider.metrics.registry.collect() if m.name == "banditstream_sdk_verification_failures"
            for s in m.samples if s.name.endswith("_total")
        }  # fmt: skip
        assert sum(failures.values()) == 1 and next(iter(failures)) != ""
