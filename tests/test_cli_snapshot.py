"""`banditstream keys` and `banditstream snapshot ...` as a user runs them (a real repository)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from banditstream.config import load_settings
from publisher.cli_ops import load_keys
from publisher.publish import Publisher
from publisher.stores import open_store

CONFIG = {
    "domains": {
        "route": {"policy": "lin_ucb", "features": {"dimension": 8, "normalize": False}},
        "cache": {"policy": "lin_ts", "features": {"dimension": 8, "normalize": False}},
    },
}


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "banditstream.cli", "--config", str(tmp_path / "bs.json"), *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )  # fmt: skip


def _publish(tmp_path, domain: str, rows: int, seed: int) -> str:
    settings = load_settings(tmp_path / "bs.json", env={})
    keys, root = load_keys(tmp_path / settings.publish.keys_dir)
    store = open_store(tmp_path / settings.stores.snapshots)
    policy = settings.domains[domain].make_policy(seed=seed)
    rng = np.random.default_rng(seed)
    policy.update_batch(rng.normal(size=(rows, 8)), [f"arm{i % 3}" for i in range(rows)], rng.normal(size=rows))
    return Publisher(store, keys, root, domains=settings.domains).publish(domain, policy).version


def test_keys_then_list_verify_dump_promote_rollback_restore(tmp_path):
    (tmp_path / "bs.json").write_text(json.dumps(CONFIG))
    generated = _cli(tmp_path, "keys", "generate")
    assert generated.returncode == 0, generated.stderr
    assert "trusted root" in generated.stdout
    again = _cli(tmp_path, "keys", "generate")
    assert again.returncode == 2 and "refusing to replace" in again.stderr and "Traceback" not in again.stderr

    first = _publish(tmp_path, "route", 50, 1)
    second = _publish(tmp_path, "route", 80, 2)
    _publish(tmp_path, "cache", 40, 3)

    listed = _cli(tmp_path, "snapshot", "list", "--domains", "route")
    assert listed.returncode == 0, listed.stderr
    assert first in listed.stdout and second in listed.stdout and "cache" not in listed.stdout

    verified = _cli(tmp_path, "snapshot", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "route" in verified.stdout and "cache" in verified.stdout

    dumped = _cli(tmp_path, "snapshot", "dump", "route", "--out", str(tmp_path / "backup"))
    assert dumped.returncode == 0, dumped.stderr
    assert json.loads(dumped.stdout)["version"] == second

    rolled = _cli(tmp_path, "snapshot", "rollback", "--domains", "route", "--to", first)
    assert rolled.returncode == 0, rolled.stderr
    assert f"with the state of {first}" in rolled.stdout
    head = json.loads(_cli(tmp_path, "snapshot", "dump", "route").stdout)
    assert head["version"] > second  # a NEW version: no client moves backwards

    promoted = _cli(tmp_path, "snapshot", "promote", "--domains", "cache")
    assert promoted.returncode == 0, promoted.stderr

    restored = _cli(tmp_path, "snapshot", "restore", str(tmp_path / "backup"))
    assert restored.returncode == 0, restored.stderr
    assert "restored route" in restored.stdout

    acknowledged = _cli(tmp_path, "snapshot", "ack-drift", "--domain", "route", "--note", "new tokenizer")
    assert acknowledged.returncode == 0 and "drift acknowledged" in acknowledged.stdout, acknowledged.stderr
    manifest = (tmp_path / ".banditstream" / "snapshots" / "default" / "main" / "route" / "manifest.jsonl").read_text()
    assert json.loads(manifest.splitlines()[-1])["note"] == "new tokenizer"

    unknown = _cli(tmp_path, "snapshot", "rollback", "--domains", "nope")
    assert unknown.returncode == 2 and "unknown domain" in unknown.stderr

    (tmp_path / ".banditstream" / "snapshots" / "default" / "main" / "route" / "metadata" / "timestamp.json").write_text("{}")
    tampered = _cli(tmp_path, "snapshot", "verify", "--domains", "route")
    assert tampered.returncode == 1 and "False" in tampered.stdout


def test_snapshot_reset_writes_a_marker_per_updates_partition_and_publishes_the_priors(tmp_path, kafka, topics):
    from streams.evaluation_log import read_updates
    from streams.serde import AvroSerde
    from streams.topics import ensure_topics

    ensure_topics(kafka, topics)
    (tmp_path / "bs.json").write_text(json.dumps({**CONFIG, "kafka": kafka.model_dump(), "topics": topics.model_dump()}))
    assert _cli(tmp_path, "keys", "generate").returncode == 0
    learned = _publish(tmp_path, "route", 50, 1)

    unconfirmed = _cli(tmp_path, "snapshot", "reset", "--domain", "route")
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr and "Traceback" not in unconfirmed.stderr
    unknown = _cli(tmp_path, "snapshot", "reset", "--domain", "nope", "--yes")
    assert unknown.returncode == 2 and "--domain" in unknown.stderr and "'nope'" in unknown.stderr

    done = _cli(tmp_path, "snapshot", "reset", "--domain", "route", "--yes")
    assert done.returncode == 0, done.stderr
    assert f"{topics.update_partitions} markers on {topics.updates}" in done.stdout
    head = json.loads(_cli(tmp_path, "snapshot", "dump", "route").stdout)
    major, minor, _ = learned.split(".")
    assert head["version"] == f"{major}.{int(minor) + 1}.0" and head["samples"] == 0

    # one marker on every partition, and no decision in the log for evaluation to read
    decisions, report = read_updates(kafka, topics.updates, AvroSerde("update", framing="single_object"), timeout_s=60)
    assert decisions == [] and report.resets == report.records == topics.update_partitions
