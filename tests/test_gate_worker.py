"""The promotion gate end to end on the real broker, run by the publisher worker on its schedule.

A running SDK decides with canary routing from signed snapshots it pulls (stable and canary
channels of a directory store), its decisions and rewards go through Kafka and the real
join, and the publisher worker tails the joined log and judges every pending canary: one
whose arm means were learned upside down is rolled back by itself, a better one promoted,
and the SDK follows each change. A gated domain's new state waits while its canary does.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from banditstream.config import Settings
from banditstream.decider import Decider
from learner.domain import DomainSettings
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig, PublisherMetrics
from publisher.pull import SnapshotClient
from publisher.stores import DirectoryStore
from publisher.worker import PublisherSettings, _PublisherWorker, run_publisher
from streams.topics import ensure_topics
from tests import join_helpers as H

ARMS = ["a", "b", "c"]
PROMOTION = {"canary_share": 0.3, "min_events": 1500, "estimator": "snips", "every_s": 0.5, "tolerated_regression": 0.02}


def domain(promotion: dict | None = PROMOTION) -> DomainSettings:
    return DomainSettings.model_validate({
        "policy": "lin_ucb", "params": {"alpha": 0.05, "eps0": 0.3, "seed": 1},
        "features": {"dimension": 16, "normalize": False}, "reward": {"window_s": 0.5},
        **({"promotion": promotion} if promotion else {}),
    })  # fmt: skip


def truth(arm: str, x1: float) -> float:
    return {"a": 0.2 + 0.5 * x1, "b": 0.2 - 0.5 * x1, "c": 0.3}[arm]


def context(x1: float) -> dict:
    return {"numeric": {"bias": 1.0, "x1": x1}}


def trained(sign: float, *, use_x1: bool = True, n: int = 3000, seed: int = 0):
    """A policy that learned from uniform traffic paying ``sign * truth`` (x1 hidden if not ``use_x1``)."""
    settings = domain()
    policy, encoder = settings.make_policy(), settings.encoder()
    rng = np.random.default_rng(seed)
    x1s = rng.normal(size=n)
    X = np.stack([encoder.context_vector({"numeric": {"bias": 1.0, "x1": x if use_x1 else 0.0}, "categorical": {}, "vector": []})
                  for x in x1s])
    arms = [ARMS[i] for i in rng.integers(0, 3, n)]
    policy.update_batch(X, arms, [sign * truth(a, x) + rng.normal(0, 0.1) for a, x in zip(arms, x1s)])
    return policy


def wait_for(what: str, done, timeout_s: float, step=None):
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f}s"
        if step is not None:
            step()
        else:
            time.sleep(0.05)


def test_the_worker_rolls_a_worse_canary_back_and_promotes_a_better_one_while_an_sdk_follows(kafka, topics, tmp_path, keys, root):
    ensure_topics(kafka, topics)
    store = DirectoryStore(tmp_path / "snapshots")
    pconfig = PublisherConfig(guards=GuardConfig(min_samples=1))
    publisher = Publisher(store, keys, root, domains={"route": domain()}, config=pconfig)
    stable = publisher.publish("route", trained(1.0, use_x1=False, seed=1), channels=("canary", "stable"))  # mediocre: always c

    settings = H.settings(kafka, topics, tmp_path / "state", domains={"route": domain().model_dump(mode="json")})
    config = settings.worker_config()
    stop = threading.Event()
    stats = {}
    worker = threading.Thread(target=lambda: stats.update(vars(run_publisher(
        config, PublisherSettings(store, keys, root, config=pconfig), stop=stop, metrics=PublisherMetrics()))), daemon=True)
    rng = np.random.default_rng(7)
    sdk = Decider(
        "route", SnapshotClient(store, tmp_path / "cache-stable", root, domain="route", channel="stable"),
        kafka=kafka, topics=topics, settings=domain(), refresh_interval_s=0.2, seed=3, spool_path=tmp_path / "spool",
        canary_repository=SnapshotClient(store, tmp_path / "cache-canary", root, domain="route", channel="canary"),
    )  # fmt: skip
    decided = {"stable": 0, "canary": 0}

    def traffic(n: int = 200) -> None:
        """``n`` decisions through the SDK, each rewarded by the truth at once."""
        for _ in range(n):
            x1 = float(rng.normal())
            decision = sdk.decide(context(x1), ARMS)
            decided[decision.channel] += 1
            sdk.reward(decision.event_id, value=truth(decision.action, x1) + float(rng.normal(0, 0.1)))
        sdk.flush(10)
        join.check()
        time.sleep(0.05)

    canary = lambda: publisher.repository("route").channel_head("canary")  # noqa: E731
    with H.JoinThread(config) as join:
        worker.start()
        try:
            assert sdk.policy_version == stable.version
            worse = publisher.publish("route", trained(-1.0, seed=2), channels=("canary",))  # learned upside down
            wait_for("the SDK's canary", lambda: sdk.canary_version == worse.version, 30)
            wait_for("the gate's rollback", lambda: canary().custom.get("derived_from") == stable.version, 240, traffic)
            back = canary().version
            wait_for("the SDK following the rollback", lambda: sdk.canary_version == str(back), 30)
            assert sdk.policy_version == stable.version

            better = publisher.publish("route", trained(1.0, seed=4), channels=("canary",))
            wait_for("the SDK's new canary", lambda: sdk.canary_version == better.version, 30)
            repo = publisher.repository("route")
            wait_for("the gate's promotion", lambda: str(repo.channel_head("stable").version) == better.version, 240, traffic)
            wait_for("the SDK following the promotion", lambda: sdk.policy_version == better.version, 30)
        finally:
            stop.set()
            worker.join(30)
            sdk.close()
    actions = [d.action for d in stats["gate_decisions"]]
    assert "rollback" in actions and "promote" in actions, actions
    rolled = next(d for d in stats["gate_decisions"] if d.action == "rollback")
    assert rolled.canary.upper < rolled.stable.estimate - 0.02 and rolled.rows >= 1500, rolled.reason
    promoted = next(d for d in stats["gate_decisions"] if d.action == "promote")
    assert promoted.canary.lower > promoted.stable.estimate, promoted.reason
    assert decided["canary"] > 0.2 * sum(decided.values())  # the SDK routed its share to the canaries


def test_a_gated_domain_publishes_to_the_canary_only_and_holds_while_a_canary_waits(tmp_path, keys, root, kafka, topics):
    """The worker's publish step for a gated domain, on the store: the first version to both
    channels, later ones to the canary, none while a canary awaits the gate's verdict."""
    ensure_topics(kafka, topics)
    store = DirectoryStore(tmp_path / "snapshots")
    pconfig = PublisherConfig(guards=GuardConfig(min_samples=1))
    settings = Settings.model_validate({"kafka": kafka.model_dump(), "topics": topics.model_dump(),
                                        "domains": {"route": domain().model_dump(mode="json")}})
    worker = _PublisherWorker(settings.worker_config(), PublisherSettings(store, keys, root, config=pconfig), None)
    try:
        shard = {"tenant": "default", "workspace": "main", "domain": "route", "policy": "lin_ucb", "dimension": 16,
                 "feature_hash": "", "state_major": 1, "drift_trace": 0.0, "drift_norm": 0.0, "watermark": []}
        policy = trained(1.0, seed=5)
        for n, arm in enumerate(ARMS):
            worker.table.put({**shard, "arm": arm, "state": policy.arm_state_bytes(arm), "update_count": 100 + n})
        worker._publish("route")
        repo = worker.publisher.repository("route")
        first = repo.channel_head("stable")
        assert first is not None and repo.channel_head("canary").version == first.version
        worker.table.put({**shard, "arm": "a", "state": policy.arm_state_bytes("a"), "update_count": 500})
        worker._publish("route")
        assert repo.channel_head("stable").version == first.version
        pending = repo.channel_head("canary")
        assert pending.version != first.version  # the new state went to the canary only
        worker.table.put({**shard, "arm": "a", "state": policy.arm_state_bytes("a"), "update_count": 900})
        worker._publish("route")
        assert repo.channel_head("canary").version == pending.version and worker.stats.held == 1
        # The verdict (here a promotion) releases the held state at once, with no new update.
        worker.publisher.promote("route", pending.version, "stable", source="canary")
        worker._last_attempt["route"] = 0.0
        assert "route" in worker._due()
        worker._publish("route")
        carried = repo.channel_head("canary")
        assert carried.version not in (pending.version, first.version) and repo.channel_head("stable").version == pending.version
        assert worker.publisher.repository("route").latest().custom["samples"] >= 900
    finally:
        worker.gate_log.close()


def test_a_reset_of_a_gated_domain_goes_to_the_canary_and_of_an_ungated_one_to_every_channel(tmp_path, keys, root):
    """Personalizer's model reset publishes the priors; on a gated domain the gate judges it first."""
    store = DirectoryStore(tmp_path / "snapshots")
    pconfig = PublisherConfig(guards=GuardConfig(min_samples=1))
    publisher = Publisher(store, keys, root, domains={"route": domain(), "plain": domain(None)}, config=pconfig)
    for name in ("route", "plain"):
        publisher.publish(name, trained(1.0, seed=2), channels=("canary", "stable"))
        learned = publisher.repository(name).channel_head("stable")
        reset = publisher.reset(name)
        repo = publisher.repository(name)
        assert reset.snapshot.samples == 0 and str(repo.channel_head("canary").version) == reset.version
        expected_stable = learned.version if name == "route" else reset.version
        assert str(repo.channel_head("stable").version) == str(expected_stable), name
