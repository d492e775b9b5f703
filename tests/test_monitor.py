"""``banditstream monitor`` reads the loop's records on the real broker and snapshot store and
raises the alert rules' alerts: a default-reward share that jumped, a dead-letter rate above
1 %, a group lagging (and growing between checks), a stale stable snapshot; a healthy loop
raises none. The joined log is made here (UpdateEvents stamped in the window and the one
before), so each alert's cause is known exactly."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from banditstream.cli import main
from banditstream.config import Settings
from banditstream.monitor import Alert, Report, Thresholds, check, transitions
from publisher.cli_ops import generate_keys, load_keys
from publisher.publish import Publisher
from publisher.stores import open_store
from streams.client import EventProducer
from streams.deadletter import DeadLetters
from streams.topics import ensure_topics
from tests.learn_helpers import make_updates

WINDOW_MS = 600_000


def _update(event_id: str, domain: str, decision_time: int, status: str, rng: random.Random) -> dict:
    """A valid UpdateEvent (``learn_helpers.make_updates``' shape) of this domain, time and status."""
    rewarded = status == "rewarded"
    return {**make_updates(1, rng.randrange(1 << 30), modes=False)[0],
            "event_id": event_id, "domain": domain, "decision_time": decision_time, "join_status": status,
            "reward": 1.0 if rewarded else 0.0, "reward_count": 1 if rewarded else 0,
            "reward_time": decision_time + 100 if rewarded else None}  # fmt: skip


@pytest.fixture
def loop(kafka, topics, tmp_path):
    """Topics holding a joined log (routing: 10 % default before, 60 % now; prompts: steady),
    five dead letters, and a stable snapshot of routing."""
    ensure_topics(kafka, topics)
    generate_keys(tmp_path / "keys")
    tree = {"kafka": kafka.model_dump(), "topics": topics.model_dump(),
            "stores": {"state_dir": str(tmp_path / "state"), "snapshots": str(tmp_path / "snapshots")},
            "publish": {"keys_dir": str(tmp_path / "keys")},
            "domains": {"routing": {"features": {"dimension": 8}}, "prompts": {"features": {"dimension": 8}}}}  # fmt: skip
    (tmp_path / "bs.json").write_text(json.dumps(tree))
    settings = Settings.model_validate(tree)
    rng, now = random.Random(4), int(time.time() * 1000)
    serde = settings.worker_config().serde("update", topic=topics.updates)
    producer = EventProducer(kafka)
    for i in range(200):
        before = i < 100
        when = now - WINDOW_MS - 60_000 - i * 100 if before else now - 60_000 - i * 100
        default = rng.random() < (0.1 if before else 0.6)
        producer.send(topics.updates, serde, _update(f"r-{i}", "routing", when, "default" if default else "rewarded", rng))
        producer.send(topics.updates, serde, _update(f"p-{i}", "prompts", when, "rewarded", rng))
    letters = DeadLetters(producer, topics.deadletter, worker="join", serde=settings.worker_config().deadletter_serde())
    for offset in range(5):
        letters.send(source_topic=topics.decisions, partition=0, offset=offset, key=b"k", value=b"\x07bad",
                     error=ValueError("not an event"), reason="unknown_framing")
    producer.flush()
    keys, root = load_keys(tmp_path / "keys")
    policy = settings.domains["routing"].make_policy(seed=1)
    policy.update_batch(np.ones((10, 8)), ["a", "b"] * 5, np.ones(10))
    Publisher(open_store(tmp_path / "snapshots"), keys, root, domains=settings.domains).publish("routing", policy)
    return settings, tmp_path


def test_each_cause_raises_its_alert_and_names_its_runbook_section(loop):
    settings, _ = loop
    report = check(settings, Thresholds(window_s=WINDOW_MS / 1000, lag=100))
    assert not report.problems, report.problems
    by_domain = {h.domain: h for h in report.domains}
    routing, prompts = by_domain["routing"], by_domain["prompts"]
    assert routing.decisions == prompts.decisions == 100
    assert 0.45 < routing.default_share < 0.75 and routing.previous_default_share < 0.2
    assert prompts.default_share == 0.0 and prompts.mean_reward == 1.0
    assert routing.stable_version == "1.0.0" and routing.stable_age_s < 600 and prompts.stable_version is None
    assert report.dead_letters == {"unknown_framing": 5}
    assert report.lag[f"banditstream-learn.{settings.topics.updates} {settings.topics.updates}"] == 400  # nothing learned
    fired = {(a.name, a.subject) for a in report.alerts}
    assert fired == {
        ("BanditstreamDefaultRewardShareJump", "routing"),
        ("BanditstreamDeadLetterRateHigh", "dead letters"),
        ("BanditstreamConsumerLagGrowing", f"banditstream-learn.{settings.topics.updates} {settings.topics.updates}"),
    }, report.alerts
    assert all(a.runbook.startswith("docs/runbook.md#banditstream") for a in report.alerts)
    runbook = open("docs/runbook.md").read().lower()
    assert all(f"## {a.name.lower()}" in runbook for a in report.alerts)

    again = check(settings, Thresholds(window_s=WINDOW_MS / 1000, lag=100), previous=report)
    assert not any(a.name == "BanditstreamConsumerLagGrowing" for a in again.alerts)  # behind, but not growing
    stale = check(settings, Thresholds(window_s=WINDOW_MS / 1000, stale_s=0.0, dead_letter_share=1.0, default_share_jump=1.0))
    assert {(a.name, a.subject) for a in stale.alerts} == {("BanditstreamSnapshotStale", "routing")}


def test_monitor_once_exits_1_on_an_alert_and_writes_the_report(loop, capsys):
    settings, tmp_path = loop
    out = tmp_path / "health.json"
    code = main(["--config", str(tmp_path / "bs.json"), "monitor", "--once", "--window", "10m", "--json", str(out)])
    assert code == 1
    printed = capsys.readouterr().out
    assert "BanditstreamDefaultRewardShareJump" in printed and "routing" in printed
    report = json.loads(out.read_text())
    assert {a["name"] for a in report["alerts"]} >= {"BanditstreamDefaultRewardShareJump", "BanditstreamDeadLetterRateHigh"}


def test_a_healthy_loop_raises_nothing_and_monitor_once_exits_0(kafka, topics, tmp_path, capsys):
    ensure_topics(kafka, topics)
    generate_keys(tmp_path / "keys")
    tree = {"kafka": kafka.model_dump(), "topics": topics.model_dump(),
            "stores": {"state_dir": str(tmp_path / "state"), "snapshots": str(tmp_path / "snapshots")},
            "publish": {"keys_dir": str(tmp_path / "keys")}, "domains": {"prompts": {"features": {"dimension": 8}}}}  # fmt: skip
    (tmp_path / "bs.json").write_text(json.dumps(tree))
    settings, rng, now = Settings.model_validate(tree), random.Random(5), int(time.time() * 1000)
    producer = EventProducer(kafka)
    serde = settings.worker_config().serde("update", topic=topics.updates)
    for i in range(100):
        producer.send(topics.updates, serde, _update(f"p-{i}", "prompts", now - 1000 * (i + 1), "rewarded", rng))
    producer.flush()
    assert main(["--config", str(tmp_path / "bs.json"), "monitor", "--once", "--window", "10m"]) == 0
    printed = capsys.readouterr().out
    assert "no alert" in printed and "prompts" in printed


def test_monitor_needs_once_or_interval(tmp_path, capsys):
    assert main(["monitor"]) == 2
    assert "--once or --interval" in capsys.readouterr().err


def test_between_checks_only_the_changes_are_announced():
    jump, stale = Alert("BanditstreamDefaultRewardShareJump", "routing", ""), Alert("BanditstreamSnapshotStale", "routing", "")
    first, second = Report(at_ms=0, window_s=60, alerts=[jump]), Report(at_ms=1, window_s=60, alerts=[stale])
    assert transitions(first, second) == ["FIRING BanditstreamSnapshotStale routing",
                                          "RESOLVED BanditstreamDefaultRewardShareJump routing"]
    assert transitions(second, second) == []


def test_monitor_interval_checks_until_stopped_and_exits_0(loop):
    _, tmp_path = loop
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "COLUMNS": "200"}
    process = subprocess.Popen([sys.executable, "-m", "banditstream.cli", "--config", str(tmp_path / "bs.json"), "monitor",
                                "--interval", "1", "--window", "10m", "--json", str(tmp_path / "health.json")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp_path / "health.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    first = json.loads((tmp_path / "health.json").read_text())["at_ms"]
    while json.loads((tmp_path / "health.json").read_text() or "{}").get("at_ms") == first and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert output.count("ALERT BanditstreamDefaultRewardShareJump routing") >= 2  # each check reports what fires
