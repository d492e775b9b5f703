"""The publisher: snapshot format, guards, versions, channels, rollback, retention, audit log,
restore, the CLI's library calls and the worker over the real broker."""

from __future__ import annotations

import contextlib

import dataclasses
import json
import logging
import os
import stat
import threading
import time

import numpy as np
import pytest

from learner.domain import DomainSettings
from learner.features import Normalizer
from learner.policies import Policy
from publisher import cli_ops
from publisher.errors import (
    ChannelError,
    DriftGuardFailed,
    KeyFileError,
    MajorVersionError,
    NonFiniteState,
    SnapshotNotFound,
    TooFewSamples,
)
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig, PublisherMetrics
from publisher.pull import SnapshotClient
from publisher.repository import RepositoryConfig, target_name
from publisher.signing import NaclSigner
from publisher.snapshot import STATE_MAJOR, SemVer, Snapshot
from publisher.stores import DirectoryStore
from publisher.worker import PublisherSettings, run_publisher
from streams.client import EventProducer
from streams.topics import ensure_topics
from tests.learn_helpers import wait_until

DIM = 6
ARMS = ["small", "medium", "large"]


def settings(**params) -> DomainSettings:
    return DomainSettings(policy="lin_ts", params={"seed": 3, **params}, features={"dimension": DIM})


def learn(policy: Policy, n: int = 120, *, seed: int = 0, scale: float = 1.0) -> Policy:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, DIM)) * scale
    X[:, 0] = 1.0
    arms = [ARMS[i % len(ARMS)] for i in range(n)]
    rewards = X[:, 1] * 0.3 + rng.normal(0, 0.1, n)
    policy.update_batch(X, arms, rewards)
    return policy


@pytest.fixture
def store(tmp_path) -> DirectoryStore:
    return DirectoryStore(tmp_path / "repo")


def make_publisher(store, keys, root, *, domains=None, **config) -> Publisher:
    guards = config.pop("guards", GuardConfig(min_samples=1))
    return Publisher(
        store, keys, root, domains=domains or {"route": settings()}, config=PublisherConfig(guards=guards, **config)
    )


def client(store, tmp_path, root, channel="stable", domain="route") -> SnapshotClient:
    return SnapshotClient(store, tmp_path / f"cache-{channel}-{domain}", root, domain=domain, channel=channel)


# --- format and round trip -----------------------------------------------------------------------


def test_publish_pull_load_round_trip_directory_store(store, keys, root, tmp_path):
    publisher = make_publisher(store, keys, root)
    policy = learn(settings().make_policy())
    result = publisher.publish("route", policy, source_offsets=[("bandit.updates", 0, 120)])

    loaded = client(store, tmp_path, root).refresh()

    assert (result.version, loaded.version) == ("1.0.0", "1.0.0")
    snap = loaded.snapshot
    assert snap.domain == "route" and snap.state_major == STATE_MAJOR and snap.samples == 120
    assert [a.arm for a in snap.arms] == ARMS and all(a.count == 40 for a in snap.arms)
    assert snap.feature_hash == settings().features.config_hash()
    assert [tuple(o) for o in snap.source_offsets] == [("bandit.updates", 0, 120)]
    sdk = loaded.policy  # loaded once, while verifying
    assert sdk.scoring_only and sdk.arm_ids() == ARMS
    for arm in ARMS:  # posterior means and factors arrive exactly
        for name, value in policy.scoring_arrays(arm).items():
            np.testing.assert_array_equal(sdk.scoring_arrays(arm)[name], value)
    choice = sdk.probabilities(np.ones((3, DIM)), ARMS, rng=1)
    assert abs(choice.probabilities.sum() - 1.0) < 1e-12
    custom = loaded.target.custom
    assert {k: custom[k] for k in ("version", "dimension", "arms", "samples", "state_major")} == {
        "version": "1.0.0", "dimension": DIM, "arms": 3, "samples": 120, "state_major": 1,
    }  # fmt: skip
    assert custom["git_commit"] and custom["created_at"].endswith("Z") and custom["channels"] == ["canary", "stable"]


def test_snapshot_bytes_round_trip_every_field_and_refuse_another_major():
    snap = Snapshot.build(learn(settings().make_policy()), settings(), domain="route", created_at=1_700_000_000_000)
    snap = snap.replace(normalizer={"format": 1, "features": {"tokens": [3, 2.0, 0.5]}}, derived_from="1.0.0")
    again = Snapshot.from_bytes(snap.to_bytes())
    assert again == snap
    assert again.frozen_normalizer().frozen and again.features() == settings().features

    other = snap.replace(state_major=STATE_MAJOR + 1, version=f"{STATE_MAJOR + 1}.0.0").to_bytes()
    with pytest.raises(MajorVersionError):
        Snapshot.from_bytes(other)
    assert Snapshot.from_bytes(other, expect_major=None).state_major == STATE_MAJOR + 1


def test_versions_bump_patch_for_data_and_minor_for_hyper_parameters(store, keys, root):
    policy = learn(settings().make_policy())
    publisher = make_publisher(store, keys, root)
    assert publisher.publish("route", policy).version == "1.0.0"
    learn(policy, seed=1)
    assert publisher.publish("route", policy).version == "1.0.1"

    changed = settings(v=0.5)
    retuned = make_publisher(store, keys, root, domains={"route": changed})
    assert retuned.publish("route", learn(changed.make_policy())).version == "1.1.0"
    assert retuned.publish("route", learn(changed.make_policy(), seed=2)).version == "1.1.1"


# --- guards --------------------------------------------------------------------------------------


def metric(publisher: Publisher, name: str, **labels) -> float:
    value = publisher.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_guard_non_finite_state_aborts_with_reason_logged_and_counted(store, keys, root, caplog):
    publisher = make_publisher(store, keys, root)
    policy = learn(settings().make_policy())
    policy._arrays["b"][1, 2] = np.nan  # a learner bug: NaN in one arm's statistics

    with caplog.at_level(logging.WARNING, logger="publisher.publish"), pytest.raises(NonFiniteState) as err:
        publisher.publish("route", policy)

    assert "NaN" in str(err.value)
    assert metric(publisher, "banditstream_snapshot_guard_failures_total", domain="route", reason="non_finite") == 1
    assert "non_finite guard" in caplog.text and "NaN" in caplog.text
    assert publisher.repository("route").versions() == []


def test_guard_minimum_samples_aborts(store, keys, root):
    publisher = make_publisher(store, keys, root, guards=GuardConfig(min_samples=500))
    with pytest.raises(TooFewSamples, match="120 samples, the minimum to publish is 500"):
        publisher.publish("route", learn(settings().make_policy()))
    assert metric(publisher, "banditstream_snapshot_guard_failures_total", domain="route", reason="min_samples") == 1
    assert publisher.repository("route").versions() == []


def observed(normalizer: Normalizer, n: int, *, seed: int, tokens: tuple[float, float] = (5.0, 1.0), region: bool = True) -> Normalizer:
    """``n`` more decisions' context features counted, as the join counts every decision's."""
    rng = np.random.default_rng(seed)
    for value in rng.normal(*tokens, size=n):
        normalizer.observe("c:tokens", float(value))
        if region:
            normalizer.observe("c:region", float(rng.integers(0, 4)))
    return normalizer


def test_guard_drift_judges_the_context_features_of_every_decision_until_acknowledged(store, keys, root, caplog):
    guards = GuardConfig(min_samples=1, drift_window=500)
    publisher = make_publisher(store, keys, root, guards=guards)
    policy, totals = learn(settings().make_policy(), n=600), Normalizer()
    for seed in range(4):  # 2,000 decisions of one context distribution: the reference builds up
        publisher.publish("route", policy, normalizer=observed(totals, 500, seed=seed))
    # An arm's own statistics jump (here, each arm is shown contexts 8x as large): what a policy
    # does when it changes which contexts an arm sees. The decisions' contexts did not change.
    learn(policy, n=3000, seed=2, scale=8.0)
    assert publisher.publish("route", policy, normalizer=observed(totals, 500, seed=4)).version == "1.0.4"

    # The contexts change upstream: tokens' mean moves by 4 standard deviations.
    with caplog.at_level(logging.WARNING), pytest.raises(DriftGuardFailed) as err:
        publisher.publish("route", policy, normalizer=observed(totals, 500, seed=5, tokens=(9.0, 1.0)))
    assert err.value.features == ("c:tokens",) and "reference standard deviations" in str(err.value)
    assert metric(publisher, "banditstream_snapshot_guard_failures_total", domain="route", reason="drift") == 1
    assert "drift guard" in caplog.text
    assert str(publisher.repository("route").latest().version) == "1.0.4"  # the last good one stays

    # A fresh publisher reads the accepted history back from the repository and agrees; flagging,
    # it publishes, and the flagged snapshot does not become a reference: the next is flagged too.
    flagging = make_publisher(store, keys, root, guards=dataclasses.replace(guards, on_drift="flag"))
    flagged = flagging.publish("route", policy, normalizer=observed(totals, 500, seed=6, tokens=(9.0, 1.0)))
    assert flagged.snapshot.drift_flag and flagged.entry.custom["drift_flag"] is True and "c:tokens" in flagged.snapshot.drift_reason
    assert flagging.publish("route", policy, normalizer=observed(totals, 500, seed=7, tokens=(9.0, 1.0))).snapshot.drift_flag

    # Acknowledged, the guard judges from the current data on: the new normal passes, in this
    # publisher and in one started afterwards.
    flagging.repository("route").acknowledge_drift("the new tokenizer")
    assert not flagging.publish("route", policy, normalizer=observed(totals, 500, seed=8, tokens=(9.0, 1.0))).snapshot.drift_flag
    assert not flagging.publish("route", policy, normalizer=observed(totals, 500, seed=9, tokens=(9.0, 1.0))).snapshot.drift_flag
    later = make_publisher(store, keys, root, guards=guards)
    assert not later.publish("route", policy, normalizer=observed(totals, 600, seed=10, tokens=(9.0, 1.0))).snapshot.drift_flag
    assert [line["note"] for line in later.repository("route").manifest() if line["event"] == "ack-drift"] == ["the new tokenizer"]


def test_guard_drift_names_a_feature_that_went_missing_or_changed_its_spread(store, keys, root):
    publisher = make_publisher(store, keys, root, guards=GuardConfig(min_samples=1, drift_window=500, on_drift="flag"))
    policy, totals = learn(settings().make_policy()), Normalizer()
    for seed in range(3):
        publisher.publish("route", policy, normalizer=observed(totals, 500, seed=seed))
    missing = publisher.publish("route", policy, normalizer=observed(totals, 500, seed=3, region=False)).snapshot
    assert missing.drift_flag and "'c:region': in 0.0% of the decisions" in missing.drift_reason
    wider = publisher.publish("route", policy, normalizer=observed(totals, 500, seed=4, tokens=(5.0, 3.0))).snapshot
    assert wider.drift_flag and "'c:tokens': standard deviation" in wider.drift_reason
    # Statistics that restarted (a join partition lost its totals) are no drift: judging starts over.
    restarted = publisher.publish("route", policy, normalizer=observed(Normalizer(), 500, seed=5)).snapshot
    assert not restarted.drift_flag


def test_guard_drift_finds_its_windows_across_many_small_publishes():
    """Publishes of a few decisions each still add up to judged windows; the totals kept shrink
    to what two windows need."""
    from publisher.guards import FeatureHistory, check

    config = GuardConfig(drift_window=100, on_drift="flag")
    history, totals = FeatureHistory(config), Normalizer()
    for seed in range(60):  # 600 decisions, published 10 at a time
        history.accept(observed(totals, 10, seed=seed).export())
    assert 3 <= len(history) <= 22  # 200 decisions' worth, and the one before
    for seed in range(60, 70):
        result = check((), 1, history, config, observed(totals, 10, seed=seed, tokens=(9.0, 1.0)).export())
    assert result.drifted == ("c:tokens",)


# --- channels, rollback, retention, audit log ----------------------------------------------------


def test_channels_promote_moves_a_channel_forward_only(store, keys, root, tmp_path):
    publisher = make_publisher(store, keys, root, channels=("canary",))
    policy = learn(settings().make_policy())
    publisher.publish("route", policy)
    with pytest.raises(SnapshotNotFound):
        client(store, tmp_path, root, "stable").refresh()
    assert client(store, tmp_path, root, "canary").refresh().version == "1.0.0"

    assert publisher.promote("route") is not None  # canary's head to stable
    stable = client(store, tmp_path, root, "stable")
    assert stable.refresh().version == "1.0.0"
    publisher.publish("route", learn(policy, seed=1))
    assert stable.refresh().version == "1.0.0"  # stable waits for a promotion
    assert publisher.promote("route", "1.0.0") is None  # already there
    publisher.promote("route", "1.0.1")
    assert stable.refresh().version == "1.0.1"
    with pytest.raises(ChannelError, match="roll back instead"):
        publisher.promote("route", "1.0.0")
    heads = {str(e.version): e.channels for e in publisher.repository("route").versions()}
    assert heads == {"1.0.0": (), "1.0.1": ("canary", "stable")}


def test_rollback_publishes_a_new_version_with_older_state_so_no_client_moves_backwards(store, keys, root, tmp_path):
    publisher = make_publisher(store, keys, root)
    policy = learn(settings().make_policy())
    publisher.publish("route", policy)
    first_theta = policy.scoring_arrays("small")["theta"].copy()
    publisher.publish("route", learn(policy, n=300, seed=5))
    sdk = client(store, tmp_path, root)
    assert sdk.refresh().version == "1.0.1"

    result = publisher.rollback("route", "1.0.0")

    loaded = sdk.refresh()
    assert result.version == loaded.version == "1.0.2" and SemVer.parse(loaded.version) > SemVer.parse("1.0.1")
    assert loaded.snapshot.derived_from == "1.0.0" and loaded.snapshot.samples == 120
    np.testing.assert_array_equal(loaded.snapshot.load_policy().scoring_arrays("small")["theta"], first_theta)
    assert publisher.repository("route").manifest()[-1]["event"] == "rollback"


def test_prune_keeps_the_last_n_versions_and_every_channel_head(store, keys, root):
    config = RepositoryConfig(keep_versions=2, keep_metadata=2)
    publisher = make_publisher(store, keys, root, repository=config, channels=("canary",))
    policy = learn(settings().make_policy())
    publisher.publish("route", policy)
    publisher.promote("route", "1.0.0")  # stable's head must survive pruning
    for seed in range(1, 5):
        publisher.publish("route", learn(policy, seed=seed))

    kept = publisher.repository("route").versions()
    assert [str(e.version) for e in kept] == ["1.0.0", "1.0.3", "1.0.4"]
    blobs = [i.key for i in store.list("default/main/route/targets/")]
    assert sorted(k.split("snapshot-")[1].removesuffix(".avro.zst") for k in blobs) == ["1.0.0", "1.0.3", "1.0.4"]
    assert all(any(k.endswith(e.blob_key) for e in kept) for k in blobs)  # pruned blobs are deleted
    targets_files = [i.key for i in store.list("default/main/route/metadata/") if i.key.endswith(".targets.json")]
    assert len(targets_files) == 2  # keep_metadata


def test_manifest_is_append_only_and_lists_every_version(store, keys, root):
    publisher = make_publisher(store, keys, root, repository=RepositoryConfig(keep_versions=2))
    key = "default/main/route/manifest.jsonl"
    policy = learn(settings().make_policy())
    seen = b""
    steps = [
        lambda: publisher.publish("route", policy),
        lambda: publisher.publish("route", learn(policy, seed=1)),
        lambda: publisher.publish("route", learn(policy, seed=2)),
        lambda: publisher.rollback("route"),
        lambda: publisher.repository("route").prune(keep=1),
    ]
    for step in steps:
        step()
        now = store.get(key)
        assert now.startswith(seen) and len(now) > len(seen)  # only ever appended to
        seen = now

    lines = [json.loads(line) for line in seen.decode().splitlines()]
    assert [line["event"] for line in lines] == ["publish", "publish", "publish", "rollback", "prune"]
    assert [line["version"] for line in lines[:4]] == ["1.0.0", "1.0.1", "1.0.2", "1.0.3"]
    assert lines[3]["derived_from"] == "1.0.1"
    assert "1.0.0" in lines[2]["removed"]  # pruned from targets, still in the log
    assert [str(e.version) for e in publisher.repository("route").versions()] == ["1.0.3"]


# --- restore and the CLI's library calls ---------------------------------------------------------


def test_restore_skips_unknown_domains_and_other_majors_with_messages(store, keys, root, tmp_path):
    publisher = make_publisher(store, keys, root, domains={"route": settings(), "tools": settings()})
    publisher.publish("route", learn(settings().make_policy()))
    backup = tmp_path / "backup"
    dumped = cli_ops.dump_snapshot(store, root, domain="route", out=backup)
    assert dumped["version"] == "1.0.0" and os.path.exists(dumped["written"])
    snap = Snapshot.from_bytes(open(dumped["written"], "rb").read())
    (backup / "legacy.avro.zst").write_bytes(snap.replace(domain="legacy_domain").to_bytes())
    (backup / "tools-v2.avro.zst").write_bytes(snap.replace(domain="tools", state_major=2, version="2.0.0").to_bytes())

    fresh = DirectoryStore(tmp_path / "restored")
    report = cli_ops.restore_snapshots(
        backup, fresh, keys, root, domains_config={"route": settings(), "tools": settings()}
    )

    assert [r["domain"] for r in report.restored] == ["route"]
    assert report.restored[0]["source_version"] == "1.0.0" and report.restored[0]["version"] == "1.0.0"
    assert any("ignored" in m and "unknown domain 'legacy_domain'" in m for m in report.messages)
    assert any("skipped" in m and "state major 2" in m for m in report.messages)
    loaded = client(fresh, tmp_path, root).refresh()
    assert loaded.snapshot.derived_from == "1.0.0" and loaded.snapshot.samples == 120


def test_cli_ops_keys_list_verify_promote_rollback(tmp_path, store):
    report = cli_ops.generate_keys(tmp_path / "keys")
    assert stat.S_IMODE(os.stat(report.key_files[0]).st_mode) == 0o600
    with pytest.raises(KeyFileError, match="refusing to replace"):
        cli_ops.generate_keys(tmp_path / "keys")
    keys, root = cli_ops.load_keys(tmp_path / "keys")
    assert keys.roles() == ["timestamp", "snapshot", "targets"]  # the root key stays offline
    domains = {"route": settings(), "tools": settings()}
    publisher = Publisher(store, keys, root, domains=domains, config=PublisherConfig(channels=("canary",)))
    for domain in domains:
        publisher.publish(domain, learn(settings().make_policy()))
        publisher.publish(domain, learn(learn(settings().make_policy()), seed=1))

    rows = cli_ops.list_snapshots(store, domains=["route"], verbose=True)
    assert [(r["domain"], r["version"], r["channels"]) for r in rows] == [("route", "1.0.0", []), ("route", "1.0.1", ["canary"])]
    assert rows[0]["sha256"] and rows[0]["targets_version"] == 2

    promoted = cli_ops.promote(store, keys, root, domains_config=domains, domains=["route"])
    assert promoted[0]["version"] == "1.0.1" and promoted[0]["changed"]
    rolled = cli_ops.rollback(store, keys, root, domains_config=domains)
    assert [(r["domain"], r["version"], r["state_of"]) for r in rolled] == [("route", "1.0.2", "1.0.0"), ("tools", "1.0.2", "1.0.0")]

    checks = cli_ops.verify_snapshots(store, tmp_path / "keys" / "root.json", verbose=True)
    assert checks and all(c["ok"] for c in checks)
    blob = next(i.key for i in store.list("default/main/tools/targets/") if "1.0.2" in i.key)
    data = bytearray(store.get(blob))
    data[len(data) // 2] ^= 0x01
    store.put(blob, bytes(data))
    failed = [c for c in cli_ops.verify_snapshots(store, root) if not c["ok"]]
    assert {(c["domain"], c["kind"]) for c in failed} == {("tools", "hash_mismatch"), ("tools", "repository")}


def test_signing_keys_round_trip_through_files_and_private_key_uris(tmp_path):
    signer = NaclSigner.generate()
    path = signer.save(tmp_path / "targets.key.json")
    again = NaclSigner.load(path)
    assert again.public_key == signer.public_key
    from securesystemslib.signer import Signer

    loaded = Signer.from_priv_key_uri(f"nacl:{path}", signer.public_key)
    loaded.public_key.verify_signature(loaded.sign(b"payload"), b"payload")
    path.write_text('{"keytype": "rsa"}')
    with pytest.raises(KeyFileError):
        NaclSigner.load(path)


# --- the worker over the real broker -------------------------------------------------------------


def worker_config(kafka, topics, tmp_path, domain_settings):
    from streams.settings import RegistrySettings
    from streams.validation import ValidationLimits
    from streams.worker import WorkerConfig

    return WorkerConfig(
        kafka=kafka, topics=topics, registry=RegistrySettings(), domains={"route": domain_settings},
        limits=ValidationLimits(), state_dir=tmp_path / "state",
    )  # fmt: skip


def produce_posteriors(kafka, topics, domain_settings, learner, *, offset: int = 100, arms=None) -> None:
    """One posterior record per arm of ``learner`` (arm i from updates partition i, watermark
    ``offset + i``; or ``arms``: {arm: partition}), and one of a domain nobody configured."""
    from streams.serde import AvroSerde

    serde = AvroSerde("posterior", framing="single_object")
    producer = EventProducer(kafka)
    for arm, partition in (arms or {arm: i for i, arm in enumerate(ARMS)}).items():
        drift = learner.drift(arm)
        record = {
            "tenant": "default", "workspace": "main", "domain": "route", "arm": arm, "policy": "lin_ts",
            "dimension": DIM, "state": learner.arm_state_bytes(arm), "state_major": 1,
            "update_count": learner.update_count(arm),
            "watermark": [{"topic": topics.updates, "partition": partition, "offset": offset + partition}],
            "feature_hash": domain_settings.features.config_hash(), "drift_trace": drift.cov_trace,
            "drift_norm": drift.spectral_norm, "emitted_at": int(time.time() * 1000),
        }  # fmt: skip
        producer.send(topics.posterior, serde, record, key=f"default/main/route/{arm}")
    other = dict(record, domain="not_configured")
    producer.send(topics.posterior, serde, other, key="default/main/not_configured/x")
    producer.flush()


def test_worker_publishes_snapshots_from_the_posterior_topic(kafka, topics, tmp_path, keys, root):
    ensure_topics(kafka, topics)
    domain_settings = settings()
    config = worker_config(kafka, topics, tmp_path, domain_settings)
    learner = learn(domain_settings.make_policy(), n=300)
    produce_posteriors(kafka, topics, domain_settings, learner)

    store = DirectoryStore(tmp_path / "repo")
    stop = threading.Event()
    out = {}
    publisher_settings = PublisherSettings(
        store, keys, root, config=PublisherConfig(guards=GuardConfig(min_samples=1)), every_updates=100, every_seconds=30,
        poll_timeout=0.2,
    )  # fmt: skip
    thread = threading.Thread(target=lambda: out.update(stats=run_publisher(config, publisher_settings, stop=stop)))
    thread.start()
    deadline = time.monotonic() + 60
    while not store.exists("default/main/route/metadata/timestamp.json") and time.monotonic() < deadline:
        time.sleep(0.1)
    loaded = client(store, tmp_path, root).refresh()
    stop.set()
    thread.join(timeout=30)

    assert loaded.version == "1.0.0"
    assert sorted(a.arm for a in loaded.snapshot.arms) == sorted(ARMS) and loaded.snapshot.samples == 300
    assert [tuple(o) for o in loaded.snapshot.source_offsets] == [(topics.updates, p, 100 + p) for p in range(3)]
    for arm in ARMS:
        np.testing.assert_allclose(
            loaded.snapshot.load_policy().scoring_arrays(arm)["theta"], learner.scoring_arrays(arm)["theta"], rtol=1e-12
        )
    stats = out["stats"]
    assert stats.published == [("route", "1.0.0")] and stats.ignored == 1 and stats.records == 4
    assert target_name("1.0.0") in {e.path for e in Publisher(store, keys, root, domains={"route": domain_settings}).repository("route").versions()}


@contextlib.contextmanager
def publisher_on_request(kafka, topics, tmp_path, keys, root):
    """A publisher worker in a thread with both timers out of reach: it publishes only when
    ``publish_now`` is set. Yields (domain settings, store, publish_now, the learned-updates
    gauge as a function, the dict its stats land in once it has stopped)."""
    ensure_topics(kafka, topics)
    domain_settings = settings()
    config = worker_config(kafka, topics, tmp_path, domain_settings)
    store = DirectoryStore(tmp_path / "repo")
    stop, publish_now, out = threading.Event(), threading.Event(), {}
    publisher_settings = PublisherSettings(store, keys, root, config=PublisherConfig(guards=GuardConfig(min_samples=1)),
                                           every_updates=1 << 40, every_seconds=1e9, poll_timeout=0.1)  # fmt: skip
    metrics = PublisherMetrics()
    thread = threading.Thread(target=lambda: out.update(
        stats=run_publisher(config, publisher_settings, stop=stop, metrics=metrics, publish_now=publish_now)))  # fmt: skip
    thread.start()
    read = lambda: metrics.registry.get_sample_value("banditstream_publisher_learned_updates", {"domain": "route"})  # noqa: E731
    try:
        yield domain_settings, store, publish_now, read, out
    finally:
        stop.set()
        thread.join(timeout=30)


def test_worker_without_timers_publishes_when_asked_and_only_what_is_new(kafka, topics, tmp_path, keys, root):
    """``publish_now`` (SIGUSR2 in ``banditstream publish``): with both timers out of reach,
    nothing is published until it is set; then every domain with new learning, once; asked
    again with nothing new, nothing."""
    with publisher_on_request(kafka, topics, tmp_path, keys, root) as (domain_settings, store, publish_now, read, out):
        produce_posteriors(kafka, topics, domain_settings, learn(domain_settings.make_policy(), n=300))
        wait_until(lambda: read() == 300, 60, "the publisher to read the posteriors", 0.05)
        time.sleep(1.0)  # several polls: the timers would have fired by now if they could
        assert not store.exists("default/main/route/metadata/timestamp.json")

        publish_now.set()
        wait_until(lambda: store.exists("default/main/route/metadata/timestamp.json"), 60, "a publish when asked", 0.05)
        assert client(store, tmp_path, root).refresh().snapshot.samples == 300
        wait_until(lambda: not publish_now.is_set(), 60, "the request to be taken", 0.05)

        publish_now.set()  # nothing new since: nothing published
        wait_until(lambda: not publish_now.is_set(), 60, "the second request to be taken", 0.05)
        produce_posteriors(kafka, topics, domain_settings, learn(domain_settings.make_policy(), n=450), offset=500)
        wait_until(lambda: read() == 450, 60, "the publisher to read the newer posteriors", 0.05)
        time.sleep(1.0)
        assert [str(v.version) for v in Publisher(store, keys, root, domains={"route": domain_settings}).repository("route").versions()] == ["1.0.0"]
        publish_now.set()
        wait_until(lambda: client(store, tmp_path, root).refresh().snapshot.samples == 450, 60, "the newer state when asked", 0.05)
    assert out["stats"].published == [("route", "1.0.0"), ("route", "1.0.1")]


def test_state_arriving_after_a_publish_with_the_same_watermark_is_published(kafka, topics, tmp_path, keys, root):
    """A learner's emission can reach the publisher in two reads (large states, a busy broker):
    arms learned up to the same watermark as the snapshot just published are new state all the
    same, and are published (a check meant for restarts once took equal offsets for nothing new,
    and the domain stalled until more traffic came)."""
    with publisher_on_request(kafka, topics, tmp_path, keys, root) as (domain_settings, store, publish_now, read, out):
        learner = learn(domain_settings.make_policy(), n=300)
        produce_posteriors(kafka, topics, domain_settings, learner, arms={"small": 0})
        wait_until(lambda: read() == 100, 60, "the publisher to read the first arm", 0.05)
        publish_now.set()
        wait_until(lambda: store.exists("default/main/route/metadata/timestamp.json"), 60, "a publish when asked", 0.05)
        produce_posteriors(kafka, topics, domain_settings, learner, arms={"medium": 0})  # the same watermark
        wait_until(lambda: read() == 200, 60, "the publisher to read the second arm", 0.05)
        publish_now.set()
        wait_until(lambda: client(store, tmp_path, root).refresh().snapshot.samples == 200, 60, "the second arm published", 0.05)
    assert out["stats"].published == [("route", "1.0.0"), ("route", "1.0.1")]


def test_posterior_table_keeps_the_latest_state_per_arm_and_skips_foreign_shards():
    from publisher.worker import PosteriorTable, policy_from_shards

    domain_settings = settings()
    learner = learn(domain_settings.make_policy(), n=90)

    def shard(arm, count, at=None, **extra):
        return {
            "tenant": "default", "workspace": "main", "domain": "route", "arm": arm, "policy": "lin_ts", "dimension": DIM,
            "state": learner.arm_state_bytes(arm), "state_major": 1, "update_count": count,
            "watermark": [{"topic": "u", "partition": 0, "offset": count if at is None else at}], "feature_hash": "",
            "drift_trace": 0.0, "drift_norm": 0.0, **extra,
        }  # fmt: skip

    table = PosteriorTable("default", "main", ["route"])
    assert table.put(shard("small", 30)) and table.new_updates("route") == 30
    assert not table.put(shard("small", 20))  # a replayed older state
    assert table.put(shard("small", 30)) and table.new_updates("route") == 30  # same count: nothing new
    assert not table.put(shard("small", 40, tenant="other"))
    table.put(shard("medium", 30, feature_hash="0123456789abcdef"))  # learned under other features
    table.mark("route")
    assert table.new_updates("route") == 0

    # A model reset lowers the count further along the partition: the later state wins and the
    # domain is due; the state from before the reset, delivered again, does not come back.
    assert table.put(shard("small", 2, at=60)) and table.new_updates("route") == 2
    assert not table.put(shard("small", 30))
    assert table.learned("route") == 2 + 30  # small after its reset, and medium
    assert table.put(shard("small", 30, at=90)) and table.new_updates("route") == 2 + 28
    table.mark("route")
    # records without watermarks (older learners) are still ordered by their counts
    assert table.put(shard("large", 5, watermark=[])) and not table.put(shard("large", 4, watermark=[]))

    policy, drift, offsets, skipped = policy_from_shards(domain_settings, table.shards("route"))
    assert policy.arm_ids() == ["large", "small"] and drift == {}
    assert [tuple(o) for o in offsets] == [("u", 0, 90)]
    assert len(skipped) == 1 and "medium" in skipped[0] and "features" in skipped[0]


def test_a_default_domain_takes_in_the_lin_igw_state_it_had_before_the_default_was_a_portfolio():
    """Until the learner republishes them as the portfolio's, the posterior topic holds the
    domain's lin_igw states: the snapshot takes them in (both members start from them) rather
    than leaving the arms out; a policy of another kind is still left out, with a warning."""
    from learner.domain import DomainSettings
    from learner.policies import Portfolio, make_policy
    from publisher.worker import policy_from_shards

    default = DomainSettings(features={"dimension": DIM})
    old = make_policy("lin_igw", dim=DIM)
    other = make_policy("lin_ucb", dim=DIM)
    rng = np.random.default_rng(2)
    for model in (old, other):
        model.update_batch(rng.normal(size=(20, DIM)), ["a", "b"] * 10, rng.random(20))

    def shard(arm, model):
        return {"arm": arm, "policy": model.name, "dimension": DIM, "state": model.arm_state_bytes(arm), "state_major": 1,
                "update_count": model.update_count(arm), "watermark": [{"topic": "u", "partition": 0, "offset": 20}],
                "feature_hash": "", "drift_trace": 0.0, "drift_norm": 0.0}  # fmt: skip

    policy, _, offsets, skipped = policy_from_shards(default, [shard("a", old), shard("b", other)])
    assert isinstance(policy, Portfolio) and policy.arm_ids() == ["a"]
    assert [m.arm_state_bytes("a") for m in policy.members[:2]] == [old.arm_state_bytes("a")] * 2
    assert policy.members[2].update_count("a") == 0  # the Fourier member learns on other features: at its prior
    assert len(skipped) == 1 and "arm 'b': lin_ucb" in skipped[0]
    assert [tuple(o) for o in offsets] == [("u", 0, 20)]


@pytest.mark.parametrize("module", ["snapshot", "guards", "signing", "stores", "repository", "publish"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"publisher.{module}"), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_worker_ships_the_joins_merged_normaliser_in_a_normalising_domains_snapshot(store, keys, root, tmp_path):
    """Normaliser records (one per join partition, any tenant) merge into the snapshot the SDK
    scores with; statistics recorded under another feature configuration are left out."""
    from learner.features import Normalizer
    from publisher.worker import _PublisherWorker
    from streams.settings import KafkaSettings, RegistrySettings, TopicSettings
    from streams.validation import ValidationLimits
    from streams.worker import NORMALIZER_POLICY, WorkerConfig

    domain_settings = DomainSettings(policy="lin_ts", params={"seed": 3}, features={"dimension": DIM, "normalize": True})
    config = WorkerConfig(
        kafka=KafkaSettings(), topics=TopicSettings(), registry=RegistrySettings(), domains={"route": domain_settings},
        limits=ValidationLimits(), state_dir=tmp_path / "state",
    )  # fmt: skip
    worker = _PublisherWorker(config, PublisherSettings(store, keys, root, config=PublisherConfig(guards=GuardConfig(min_samples=1))), None)
    learner = learn(domain_settings.make_policy(), n=90)
    feature_hash = domain_settings.features.config_hash()
    for arm in ARMS:
        assert worker.table.put({
            "tenant": "default", "workspace": "main", "domain": "route", "arm": arm, "policy": "lin_ts", "dimension": DIM,
            "state": learner.arm_state_bytes(arm), "state_major": 1, "update_count": learner.update_count(arm),
            "watermark": [{"topic": "u", "partition": 0, "offset": 90}], "feature_hash": feature_hash,
            "drift_trace": 0.0, "drift_norm": 0.0,
        })  # fmt: skip
    rng = np.random.default_rng(5)
    partitions, whole = [], Normalizer()
    for p in range(3):
        part = Normalizer()
        for x in rng.normal(100.0 * (p + 1), 10.0, 50):
            part.observe("c:tokens", float(x))
            whole.observe("c:tokens", float(x))
        partitions.append(part)

    def normaliser_record(p, normalizer, **extra):
        return {
            "tenant": "another-tenant", "workspace": "main", "domain": "route", "arm": f"p{p}", "policy": NORMALIZER_POLICY,
            "dimension": DIM, "state": json.dumps(normalizer.export()).encode(), "state_major": 1, "update_count": 50,
            "watermark": [], "feature_hash": feature_hash, "drift_trace": 0.0, "drift_norm": 0.0, **extra,
        }  # fmt: skip

    stale = Normalizer()
    stale.observe("c:tokens", 1e6)
    assert worker.table.put(normaliser_record(7, stale, feature_hash="0123456789abcdef"))  # other features: left out
    for p, part in enumerate(partitions):
        assert worker.table.put(normaliser_record(p, Normalizer({"c:tokens": [1.0, 0.0, 0.0]})))  # superseded below
        assert worker.table.put(normaliser_record(p, part))
    assert worker.table.new_updates("route") == 90  # statistics are not updates
    # what the Playground compares with the join's banditstream_join_normalizer_observations
    assert worker.table.normalizer_observations("route", feature_hash) == 3 * 50

    worker._publish("route")
    shipped = client(store, tmp_path, root).refresh().snapshot.frozen_normalizer()
    assert shipped is not None and shipped.frozen
    assert shipped.count("c:tokens") == 150
    assert shipped.mean("c:tokens") == pytest.approx(whole.mean("c:tokens"), rel=1e-12)
    assert shipped.std("c:tokens") == pytest.approx(whole.std("c:tokens"), rel=1e-12)


def test_the_change_detectors_alarms_are_exported_and_the_flagged_arms_named(store, keys, root, caplog):
    publisher = make_publisher(store, keys, root)
    policy = settings().make_policy()
    rng = np.random.default_rng(3)
    for _ in range(10):  # in batches, as the learner folds them: the detector calibrates on these
        X = np.column_stack([np.ones(50), rng.normal(size=(50, DIM - 1))])
        policy.update_batch(X, ["small"] * 50, X[:, 1] * 0.5 + rng.normal(0.0, 0.1, size=50))
    publisher.publish("route", policy)
    assert metric(publisher, "banditstream_snapshot_change_alarms", domain="route") == 0
    for _ in range(10):  # the arm's rewards turn around: its residuals leave their band
        X = np.column_stack([np.ones(50), rng.normal(size=(50, DIM - 1))])
        policy.update_batch(X, ["small"] * 50, -X[:, 1] * 0.5 + 2.0)
    assert policy.alarms("small") >= 1
    with caplog.at_level(logging.WARNING):
        publisher.publish("route", policy)
    assert metric(publisher, "banditstream_snapshot_change_alarms", domain="route") == policy.alarms("small")
    assert "the change detector flagged 'small' since the last snapshot" in caplog.text
