"""Snapshots on the real S3 server (SeaweedFS): round trip, conditional writes, and two
publishers racing for one version of which exactly one wins."""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest

from learner.domain import DomainSettings
from publisher.errors import AlreadyExists, HashMismatchError, PreconditionFailed, VersionConflict
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig
from publisher.pull import SnapshotClient
from publisher.stores import S3Store, open_store

SETTINGS = DomainSettings(policy="lin_ts", params={"seed": 1}, features={"dimension": 8})
ARMS = ["gpt", "small", "local"]
CONFIG = PublisherConfig(guards=GuardConfig(min_samples=1))


def learned(seed: int):
    rng = np.random.default_rng(seed)
    policy = SETTINGS.make_policy()
    policy.update_batch(rng.standard_normal((90, 8)), [ARMS[i % 3] for i in range(90)], rng.random(90))
    return policy


@pytest.fixture
def store(s3) -> S3Store:
    return S3Store(f"snapshots-{uuid.uuid4().hex[:10]}", "prod", create_bucket=True, **s3)


def test_publish_pull_load_round_trip_s3_store(store, keys, root, tmp_path, s3):
    publisher = Publisher(store, keys, root, domains={"route": SETTINGS}, config=CONFIG)
    published = publisher.publish("route", learned(0))

    url = f"s3://{store.bucket}/{store.prefix}"
    client = SnapshotClient(url, tmp_path / "cache", root, domain="route", s3=s3)
    loaded = client.refresh()

    assert loaded.version == published.version == "1.0.0"
    assert loaded.snapshot.load_policy().arm_ids() == ARMS
    assert loaded.target.sha256 == published.entry.sha256
    publisher.publish("route", learned(1))
    assert client.refresh().version == "1.0.1"
    keys_in_bucket = {i.key for i in open_store(url, s3=s3).list("default/main/route/metadata/")}
    assert {"default/main/route/metadata/timestamp.json", "default/main/route/metadata/2.targets.json"} <= keys_in_bucket


def test_s3_store_conditional_writes_and_appends(store):
    store.put_new("claims/1", b"first")
    with pytest.raises(AlreadyExists):
        store.put_new("claims/1", b"second")
    data, tag = store.get_tagged("claims/1")
    store.put_if_match("claims/1", b"updated", tag)
    with pytest.raises(PreconditionFailed):
        store.put_if_match("claims/1", b"stale writer", tag)
    assert store.get("claims/1") == b"updated"

    threads = [threading.Thread(target=lambda i=i: store.append("log.jsonl", f"line {i}\n".encode())) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(store.get("log.jsonl").decode().splitlines()) == [f"line {i}" for i in range(6)]


class BarrierStore(S3Store):
    """S3, but every publisher waits at the claim of a targets version until all arrive."""

    def __init__(self, *args, barrier: threading.Barrier, **kwargs):
        super().__init__(*args, **kwargs)
        self.barrier = barrier

    def put_new(self, key, data):
        if key.endswith(".targets.json"):
            self.barrier.wait(timeout=30)
        super().put_new(key, data)


def test_two_publishers_racing_for_one_version_exactly_one_wins(store, keys, root, s3, tmp_path):
    Publisher(store, keys, root, domains={"route": SETTINGS}, config=CONFIG).publish("route", learned(0))
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def race(name: str, seed: int) -> None:
        racer_store = BarrierStore(store.bucket, store.prefix, barrier=barrier, **s3)
        publisher = Publisher(racer_store, keys, root, domains={"route": SETTINGS}, config=CONFIG)
        try:
            outcomes[name] = publisher.publish("route", learned(seed))
        except VersionConflict as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=race, args=(f"publisher-{i}", i + 1)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    winners = [o for o in outcomes.values() if not isinstance(o, VersionConflict)]
    losers = [o for o in outcomes.values() if isinstance(o, VersionConflict)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert winners[0].version == "1.0.1" and "claimed by another publisher" in str(losers[0])
    client = SnapshotClient(store, tmp_path / "cache", root, domain="route")
    loaded = client.refresh()
    assert loaded.version == "1.0.1" and loaded.target.sha256 == winners[0].entry.sha256
    manifest = Publisher(store, keys, root, domains={"route": SETTINGS}).repository("route").manifest()
    assert [line["version"] for line in manifest] == ["1.0.0", "1.0.1"]


def test_eight_writers_claim_one_key_and_exactly_one_succeeds(store):
    results = []
    barrier = threading.Barrier(8)

    def claim(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            store.put_new("default/main/route/metadata/9.targets.json", f"writer {i}".encode())
            results.append(i)
        except AlreadyExists:
            pass

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 1
    assert store.get("default/main/route/metadata/9.targets.json") == f"writer {results[0]}".encode()


def test_tamper_on_s3_flipped_state_blob_is_refused(store, keys, root, tmp_path):
    publisher = Publisher(store, keys, root, domains={"route": SETTINGS}, config=CONFIG)
    publisher.publish("route", learned(0))
    client = SnapshotClient(store, tmp_path / "cache", root, domain="route")
    client.refresh()
    result = publisher.publish("route", learned(1))
    key = f"default/main/route/{result.entry.blob_key}"
    data = bytearray(store.get(key))
    data[-10] ^= 0x40
    store.put(key, bytes(data))
    with pytest.raises(HashMismatchError):
        client.refresh()
    assert client.current.version == "1.0.0"
