"""The verifying pull client: every tampering is refused with a typed error, the last good
snapshot is kept, and the refusal is counted by kind."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from tuf.api.metadata import Metadata, Timestamp

from learner.domain import DomainSettings
from publisher.errors import (
    ExpiredMetadataError,
    HashMismatchError,
    LengthMismatchError,
    MajorVersionError,
    RepositoryUnavailable,
    RollbackError,
    SignatureError,
    StoreUnavailable,
)
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig, target_custom
from publisher.pull import SnapshotClient
from publisher.repository import Repository, create_root
from publisher.signing import KeyRing, NaclSigner
from publisher.snapshot import Snapshot
from publisher.stores import DirectoryStore

DIM = 5
ARMS = ["a", "b", "c"]
PREFIX = "default/main/route"
SETTINGS = DomainSettings(policy="lin_ucb", params={"alpha": 0.5}, features={"dimension": DIM})


def learn(policy, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((60, DIM))
    policy.update_batch(X, [ARMS[i % 3] for i in range(60)], rng.random(60))
    return policy


class Repo:
    """A published repository and a client that already holds its first snapshot."""

    def __init__(self, tmp_path, keys=None, root=None, **publisher_kwargs):
        self.keys = keys or KeyRing.generate()
        self.root = root or create_root(self.keys)
        self.store = DirectoryStore(tmp_path / "repo")
        self.policy = SETTINGS.make_policy()
        self.publisher = self.make_publisher(**publisher_kwargs)
        self.publisher.publish("route", learn(self.policy, 0))
        self.client = SnapshotClient(self.store, tmp_path / "cache", self.root, domain="route")
        assert self.client.refresh().version == "1.0.0"

    def make_publisher(self, **kwargs):
        config = PublisherConfig(guards=GuardConfig(min_samples=1))
        return Publisher(self.store, kwargs.pop("keys", self.keys), self.root, domains={"route": SETTINGS}, config=config, **kwargs)

    def publish(self, seed: int = 1):
        return self.publisher.publish("route", learn(self.policy, seed))

    def path(self, key: str):
        return self.store.root / PREFIX / key

    def flip(self, key: str, at: int | None = None):
        path = self.path(key)
        data = bytearray(path.read_bytes())
        data[len(data) // 2 if at is None else at] ^= 0x01
        path.write_bytes(bytes(data))

    def failures(self, kind: str) -> float:
        value = self.client.metrics.registry.get_sample_value(
            "banditstream_snapshot_verification_failures_total", {"domain": "route", "kind": kind}
        )
        return value or 0.0

    def refused(self, error: type, kind: str, held: str = "1.0.0"):
        with pytest.raises(error) as err:
            self.client.refresh()
        assert self.client.current is not None and self.client.current.version == held  # last good kept
        assert self.failures(kind) == 1
        assert self.client.last_error is err.value
        return err.value


@pytest.fixture
def repo(tmp_path) -> Repo:
    return Repo(tmp_path)


def test_tamper_flipped_byte_in_a_state_blob_is_refused(repo):
    result = repo.publish()
    repo.flip(result.entry.blob_key)
    err = repo.refused(HashMismatchError, "hash_mismatch")
    assert result.entry.path in str(err)


def test_tamper_bytes_appended_to_a_state_blob_are_refused(repo):
    result = repo.publish()
    path = repo.path(result.entry.blob_key)
    path.write_bytes(path.read_bytes() + b"\0" * 64)
    repo.refused(LengthMismatchError, "length_mismatch")


def test_tamper_flipped_byte_in_targets_metadata_is_refused(repo):
    result = repo.publish()
    repo.flip(f"metadata/{result.commit.targets_version}.targets.json", at=200)
    repo.refused(HashMismatchError, "hash_mismatch")


def test_tamper_rollback_attack_replaying_an_older_timestamp_is_refused(repo):
    old_timestamp = repo.path("metadata/timestamp.json").read_bytes()
    repo.publish()
    assert repo.client.refresh().version == "1.0.1"
    repo.path("metadata/timestamp.json").write_bytes(old_timestamp)  # a mirror serves yesterday's state
    err = repo.refused(RollbackError, "rollback", held="1.0.1")
    assert "timestamp version 1 must be >= 2" in str(err)


def test_tamper_rollback_attack_replaying_an_older_snapshot_is_refused(repo):
    repo.publish()
    assert repo.client.refresh().version == "1.0.1"
    repo.publish(2)
    # Serve the older, validly signed snapshot metadata under the new name: the timestamp
    # pins the snapshot's hash, so the replay cannot pass for the new one.
    repo.path("metadata/3.snapshot.json").write_bytes(repo.path("metadata/2.snapshot.json").read_bytes())
    repo.refused(HashMismatchError, "hash_mismatch", held="1.0.1")


def test_freeze_attack_expired_timestamp_is_refused(tmp_path):
    repo = Repo(tmp_path)
    stale_clock = lambda: datetime.now(timezone.utc) - timedelta(days=3)  # noqa: E731
    frozen = repo.make_publisher(clock=stale_clock)
    frozen.publish("route", learn(repo.policy, 1))  # validly signed, but expired two days ago
    err = repo.refused(ExpiredMetadataError, "expired")
    assert "expired" in str(err)


def test_tamper_signature_by_an_untrusted_key_is_refused(repo):
    repo.publish()
    timestamp = Metadata[Timestamp].from_bytes(repo.path("metadata/timestamp.json").read_bytes())
    timestamp.signed.version += 1
    timestamp.sign(NaclSigner.generate())  # a key the root does not name
    repo.path("metadata/timestamp.json").write_bytes(timestamp.to_bytes())
    err = repo.refused(SignatureError, "signature")
    assert "timestamp" in str(err)


def test_threshold_of_two_targets_keys_is_enforced(tmp_path):
    keys = KeyRing.generate({"targets": 2})
    root = create_root(keys, thresholds={"targets": 2})
    repo = Repo(tmp_path, keys=keys, root=root)  # both targets keys sign: accepted
    one_key = KeyRing({"targets": keys.signers("targets")[:1], "snapshot": keys.signers("snapshot"),
                       "timestamp": keys.signers("timestamp")})  # fmt: skip
    repo.make_publisher(keys=one_key).publish("route", learn(repo.policy, 1))
    err = repo.refused(SignatureError, "signature")
    assert "targets" in str(err)


def test_another_state_major_is_refused(repo):
    snap = Snapshot.from_bytes(repo.store.get(f"{PREFIX}/{repo.client.current.target.blob_key}"))
    future = snap.replace(state_major=2, version="2.0.0")
    repository = Repository(repo.store, keys=repo.keys, root=repo.root, domain="route")
    repository.publish(future.to_bytes(), target_custom(future))
    err = repo.refused(MajorVersionError, "major_version")
    assert "state major 2" in str(err)


class FlakyStore(DirectoryStore):
    down = False

    def get_tagged(self, key):
        if self.down:
            raise StoreUnavailable("connection refused", subject=key)
        return super().get_tagged(key)


def test_repository_unavailable_keeps_the_last_good_snapshot_and_restarts_from_cache(tmp_path):
    repo = Repo(tmp_path)
    flaky = FlakyStore(repo.store.root)
    client = SnapshotClient(flaky, tmp_path / "cache", repo.root, domain="route")
    assert client.refresh().version == "1.0.0"
    flaky.down = True
    with pytest.raises(RepositoryUnavailable):
        client.refresh()
    assert client.current.version == "1.0.0"

    restarted = SnapshotClient(flaky, tmp_path / "cache", repo.root, domain="route")
    loaded = restarted.load_cached()  # offline: re-verified from the cache alone
    assert loaded.version == "1.0.0" and not loaded.expired()
    assert loaded.snapshot.load_policy().arm_ids() == ARMS


def test_refresh_without_changes_downloads_nothing_new(repo):
    first = repo.client.current
    again = repo.client.refresh()
    assert again.snapshot is first.snapshot
    assert repo.client.metrics.registry.get_sample_value(
        "banditstream_snapshot_refreshes_total", {"domain": "route", "outcome": "unchanged"}
    ) == 1
    repo.publish()
    assert repo.client.refresh().version == "1.0.1"
    assert [p.name.split(".", 1)[1] for p in (repo.client._targets_dir).iterdir()] == ["snapshot-1.0.1.avro.zst"]
