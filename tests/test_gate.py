"""The promotion gate on a real signed repository (directory store, real Ed25519 keys) and a
log with a known truth: a canary whose arm means are learned wrong is rolled back by itself,
a better one is promoted, and a client pulling the channels follows each change."""

from __future__ import annotations


import numpy as np
import pytest

from learner.domain import DomainSettings
from publisher.gate import Gate, GateConfig, GateMetrics
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig
from publisher.pull import SnapshotClient
from publisher.stores import DirectoryStore

DIM = 4
ARMS = ["a", "b", "c"]
THETA = np.array([[0.2, 0.5, 0.0, 0.0], [0.2, -0.5, 0.0, 0.0], [0.3, 0.0, 0.0, 0.0]])  # the best arm depends on x1


def settings() -> DomainSettings:
    return DomainSettings(policy="lin_ucb", params={"alpha": 0.1, "eps0": 0.05, "seed": 1}, features={"dimension": DIM})


def contexts(n: int, seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(n, DIM))
    X[:, 0] = 1.0
    return X


def trained(theta: np.ndarray, seed: int, n: int = 3000):
    """A policy that learned from uniform traffic whose arms pay ``x . theta[arm]``."""
    policy = settings().make_policy()
    rng = np.random.default_rng(seed)
    X = contexts(n, seed)
    arms = rng.integers(0, 3, n)
    policy.update_batch(X, [ARMS[a] for a in arms], (X * theta[arms]).sum(axis=1) + rng.normal(0, 0.1, n))
    return policy


def uniform_log(n: int, seed: int, since_ms: int) -> list[dict]:
    """Live decisions logged by a uniform policy since ``since_ms``, rewarded by the truth."""
    rng = np.random.default_rng(seed)
    X = contexts(n, seed + 100)
    arms = rng.integers(0, 3, n)
    rewards = (X * THETA[arms]).sum(axis=1) + rng.normal(0, 0.1, n)
    return [{"event_id": f"g{seed}-{i}", "tenant": "default", "workspace": "main", "domain": "route", "actions": ARMS,
             "probabilities": [1 / 3] * 3, "arm_index": int(arms[i]), "reward": float(rewards[i]), "features": X[i].tolist(),
             "decision_time": since_ms + 1 + i, "policy_version": "1.0.0", "mode": "live", "join_status": "rewarded"}
            for i in range(n)]


@pytest.fixture
def repo(tmp_path, keys, root):
    store = DirectoryStore(tmp_path / "repo")
    config = PublisherConfig(guards=GuardConfig(min_samples=1), channels=("canary",))
    return store, Publisher(store, keys, root, domains={"route": settings()}, config=config)


def test_a_worse_canary_is_rolled_back_a_better_one_promoted_and_a_client_follows(repo, tmp_path, root):
    store, publisher = repo
    publisher.publish("route", trained(THETA * np.array([[1, 0, 1, 1]]), seed=1), channels=("canary", "stable"))  # mediocre: no x1
    stable_client = SnapshotClient(store, tmp_path / "cache-stable", root, domain="route", channel="stable")
    canary_client = SnapshotClient(store, tmp_path / "cache-canary", root, domain="route", channel="canary")
    assert stable_client.refresh().version == "1.0.0"
    log: list[dict] = []
    metrics = GateMetrics()
    gate = Gate(publisher, lambda domain, since: [u for u in log if u["decision_time"] >= since], metrics=metrics)
    config = GateConfig(min_events=2000, estimator="snips", tolerated_regression=0.02)

    worse = publisher.publish("route", trained(-THETA, seed=2))  # learned upside down: picks the worst arm
    assert canary_client.refresh().version == worse.version
    decision = gate.run("route", config)
    assert decision.action == "wait" and "0 of 2000" in decision.reason
    log += uniform_log(4000, seed=3, since_ms=worse.snapshot.created_at)
    decision = gate.run("route", config)
    assert decision.action == "rollback", decision.reason
    assert decision.canary.upper < decision.stable.estimate - 0.02
    back = canary_client.refresh()  # the client moves forward, to the stable's state
    assert back.version == decision.committed and back.version not in ("1.0.0", worse.version)
    assert stable_client.refresh().version == "1.0.0"
    assert gate.run("route", config).action == "nothing"  # the canary carries the stable's state

    better = publisher.publish("route", trained(THETA, seed=4))
    log += uniform_log(4000, seed=5, since_ms=better.snapshot.created_at)
    decision = gate.run("route", config)
    assert decision.action == "promote", decision.reason
    assert decision.canary.lower > decision.stable.estimate
    assert metrics.rows.labels("route")._value.get() == decision.rows >= 4000
    assert metrics.estimate.labels("route", "canary", "lower")._value.get() == decision.canary.lower
    assert stable_client.refresh().version == better.version == decision.committed
    assert gate.run("route", config).action == "nothing"
    assert metrics.decisions.labels("route", "promote")._value.get() == 1
    assert metrics.decisions.labels("route", "rollback")._value.get() == 1


def test_overlapping_intervals_wait_and_say_why(repo):
    store, publisher = repo
    publisher.publish("route", trained(THETA, seed=1), channels=("canary", "stable"))
    twin = publisher.publish("route", trained(THETA, seed=2))  # as good as stable
    log = uniform_log(3000, seed=6, since_ms=twin.snapshot.created_at)
    decision = Gate(publisher, lambda domain, since: log).run("route", GateConfig(min_events=1000, margin=0.05))
    assert decision.action == "wait" and "no verdict at 95%" in decision.reason
    assert decision.to_dict()["canary"]["estimator"] == "snips"


def channel_log(policies: dict[str, object], n: int, seed: int, since_ms: int, canary_share: float = 0.1) -> list[dict]:
    """Live decisions routed at random, ``canary_share`` to the canary: each row decided by
    its channel's snapshot (version -> policy) with its own step, rewarded by the truth."""
    rng = np.random.default_rng(seed)
    X = contexts(n, seed + 100)
    (stable, s_policy), (canary, c_policy) = policies.items()
    rows = []
    for i in range(n):
        version, policy = (canary, c_policy) if rng.random() < canary_share else (stable, s_policy)
        choice = policy.probabilities(np.repeat(X[i][None, :], 3, axis=0), ARMS, rng)
        arm = int(rng.choice(3, p=choice.probabilities))
        rows.append({"event_id": f"c{seed}-{i}", "tenant": "default", "workspace": "main", "domain": "route", "actions": ARMS,
                     "probabilities": list(choice.probabilities), "arm_index": arm, "features": X[i].tolist(),
                     "reward": float(X[i] @ THETA[arm] + rng.normal(0, 0.1)), "decision_time": since_ms + 1 + i,
                     "policy_version": version, "mode": "live", "join_status": "rewarded"})  # fmt: skip
    return rows


def test_the_on_policy_gate_is_an_a_b_test_of_each_channel_s_own_decisions(repo):
    """Near-greedy policies that disagree: off-policy, neither's choices are found often enough
    in the other's traffic; on its own decisions the worse canary is rolled back at once."""
    store, publisher = repo
    good, bad = trained(THETA, seed=1), trained(-THETA, seed=2)
    publisher.publish("route", good, channels=("canary", "stable"))
    worse = publisher.publish("route", bad)
    log = channel_log({"1.0.0": good, worse.version: bad}, 3000, seed=7, since_ms=worse.snapshot.created_at)
    few = Gate(publisher, lambda domain, since: log[:150]).run("route", GateConfig(min_events=100, estimator="on_policy"))
    assert few.action == "wait" and "fewer than 30" in few.reason
    gate = Gate(publisher, lambda domain, since: log)
    snips = gate.run("route", GateConfig(min_events=1000, estimator="snips"))
    assert snips.action == "wait" and "effective sample size" in snips.reason
    decision = gate.run("route", GateConfig(min_events=1000, estimator="on_policy"))
    assert decision.action == "rollback", decision.reason
    canary_rows = [u["reward"] for u in log if u["policy_version"] == worse.version]
    assert decision.canary.n == len(canary_rows) and decision.canary.estimate == pytest.approx(np.mean(canary_rows))
    assert decision.stable.n == len(log) - len(canary_rows) and decision.canary.upper < decision.stable.estimate - 0.02


@pytest.mark.parametrize("field, value, message", [
    ("estimator", "magic", "unknown estimator"), ("level", 1.2, "level"), ("interval", "guess", "interval"),
    ("margin", -1.0, "margin"), ("min_events", 0, "min_events"),
])
def test_a_bad_gate_setting_is_refused_by_name(field, value, message):
    with pytest.raises(Exception, match=message):
        GateConfig(**{field: value})


def test_snapshot_gate_reads_the_updates_topic_and_rolls_a_worse_canary_back(kafka, topics, tmp_path, capsys):
    """`banditstream snapshot gate` once, on the real broker: the log is the updates topic."""
    import json

    from banditstream.cli import main
    from publisher import cli_ops
    from streams.serde import AvroSerde
    from streams.topics import ensure_topics
    from tests.learn_helpers import produce

    ensure_topics(kafka, topics)
    cli_ops.generate_keys(tmp_path / "keys")
    keys, root = cli_ops.load_keys(tmp_path / "keys")
    store = DirectoryStore(tmp_path / "snapshots")
    config = PublisherConfig(guards=GuardConfig(min_samples=1), channels=("canary",))
    publisher = Publisher(store, keys, root, domains={"route": settings()}, config=config)
    publisher.publish("route", trained(THETA * np.array([[1, 0, 1, 1]]), seed=1), channels=("canary", "stable"))
    worse = publisher.publish("route", trained(-THETA, seed=2))
    serde = AvroSerde("update", framing="single_object")
    extra = {"arm": "", "probability": 1 / 3, "feature_hash": "", "signals": {}, "reward_count": 1, "reward_time": None,
             "weight": 1.0}
    log = uniform_log(3000, seed=3, since_ms=worse.snapshot.created_at)
    produce(kafka, topics.updates, [(u["event_id"], serde.encode({**extra, **u})) for u in log])
    path = tmp_path / "banditstream.json"
    path.write_text(json.dumps({
        "kafka": kafka.model_dump(), "topics": topics.model_dump(),
        "stores": {"snapshots": str(tmp_path / "snapshots"), "state_dir": str(tmp_path / "state")},
        "publish": {"keys_dir": str(tmp_path / "keys"), "channels": ["canary"], "min_samples": 1},
        "domains": {"route": settings().model_dump(mode="json")},
    }))
    out = tmp_path / "gate.json"
    assert main(["--config", str(path), "snapshot", "gate", "--domain", "route", "--json", str(out)]) == 0
    decision = json.loads(out.read_text())
    assert decision["action"] == "rollback" and decision["rows"] == 3000, decision["reason"]
    assert "rollback" in capsys.readouterr().out
    assert publisher.repository("route").channel_head("canary").custom["derived_from"] == "1.0.0"
