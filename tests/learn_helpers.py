"""Builders and probes for the learner worker's integration tests.

UpdateEvents are made here directly (the join is not involved), produced pre-encoded with
their partition and offset recorded from the delivery reports, and the outcome is read back
from the posterior topic, the group's committed offsets, the dead-letter topic, the store and
the worker's Prometheus endpoint.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from learner.domain import DomainSettings
from learner.policies import SHARED_ARM, Policy
from learner.store import ArmKey
from streams.serde import AvroSerde
from streams.settings import KafkaSettings, RegistrySettings, TopicSettings
from streams.validation import ValidationLimits
from streams.worker import WorkerConfig

REPO = Path(__file__).resolve().parents[1]
DIM = 8

#: Domains of every shape the worker handles: per-arm Thompson, per-arm UCB with forgetting,
#: and one model shared across arms. Their per-arm ones turn robust learning off (``huber_q``
#: 0), so that one fold of every row is the reference; ROBUST_DOMAINS leave it on, as it comes
#: by default: it weighs a row by the model as its block finds it, so there the learner must
#: give the fold of its offset-aligned blocks bit for bit.
ROBUST_DOMAINS: dict[str, dict] = {
    "route": {"policy": "lin_ts", "params": {"v": 0.5}, "features": {"dimension": DIM}},
    "prompt": {"policy": "lin_ucb", "params": {"alpha": 1.0, "gamma": 0.999}, "features": {"dimension": DIM}},
    "tool": {"policy": "shared_lin_ucb", "params": {"alpha": 0.5}, "features": {"dimension": DIM, "shared": True}},
}
DOMAINS: dict[str, dict] = {
    name: spec if spec["features"].get("shared") else {**spec, "params": {**spec["params"], "huber_q": 0}}
    for name, spec in ROBUST_DOMAINS.items()
}
ARMS = {"route": ["gpt", "claude", "llama", "mistral", "small"], "prompt": ["p1", "p2", "p3"], "tool": ["search", "calc", "code"]}


def domain_settings(domains: Mapping[str, dict] = DOMAINS) -> dict[str, DomainSettings]:
    return {name: DomainSettings.model_validate(spec) for name, spec in domains.items()}


def worker_config(kafka: KafkaSettings, topics: TopicSettings, state_dir: Path, domains: Mapping[str, dict] = DOMAINS, **extra) -> WorkerConfig:
    """The config ``run_learner`` gets in-thread; ``extra`` holds LearnerOptions fields."""
    return WorkerConfig(
        kafka=kafka,
        topics=topics,
        registry=RegistrySettings(),
        domains=domain_settings(domains),
        limits=ValidationLimits(max_payload_bytes=extra.pop("max_payload_bytes", 1_000_000)),
        state_dir=Path(state_dir),
        metrics_port=0,
        extra=extra,
    )


#: The group session of a learner the test kills (``write_config(..., doomed=True)``). A
#: SIGKILLed member holds its partitions until its session expires: with the profile's 6 s
#: the next member waited ~11 s for them (Tansu lets the join complete with the dead member,
#: then rebalances once it expires), with 2 s ~4 s. How long the group waits for a dead
#: member is no part of what the tests check (what the next learner resumes from).
DOOMED_SESSION_MS = 2_000


def write_config(path: Path, kafka: KafkaSettings, topics: TopicSettings, state_dir: Path, metrics_port: int,
                 *, doomed: bool = False, domains: Mapping[str, dict] = DOMAINS) -> Path:
    """A config file for ``banditstream learn`` in a subprocess (single-object framing);
    ``doomed`` for a learner the test will SIGKILL (a short group session)."""
    extra = {"extra": {"session.timeout.ms": DOOMED_SESSION_MS}} if doomed else {}
    tree = {
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "profile": kafka.profile, **extra},
        "topics": topics.model_dump(),
        "stores": {"state_dir": str(state_dir)},
        "metrics": {"port": metrics_port},
        "domains": dict(domains),
    }
    path.write_text(json.dumps(tree))
    return path


def start_learner(config_path: Path, log_path: Path) -> subprocess.Popen:
    """``python -m banditstream.cli learn`` in its own process, output to ``log_path``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env = {k: v for k, v in env.items() if not k.startswith("BANDITSTREAM_")}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "banditstream.cli", "--config", str(config_path), "learn"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


# -- updates ---------------------------------------------------------------------------------


def shard_key(update: Mapping) -> str:
    shared = DOMAINS[update["domain"]]["features"].get("shared", False)
    parts = [update["tenant"], update["workspace"], update["domain"]]
    return "/".join(parts if shared else [*parts, update["arm"]])


def model_key(update: Mapping) -> ArmKey:
    shared = DOMAINS[update["domain"]]["features"].get("shared", False)
    return ArmKey(update["tenant"], update["workspace"], update["domain"], SHARED_ARM if shared else update["arm"])


def make_updates(n: int, seed: int, *, prefix: str = "u", modes: bool = True) -> list[dict]:
    """``n`` valid UpdateEvents over every domain and arm; with ``modes`` about 3% are shadow
    or off and 1% deferred decisions never activated (none of them learned), and 20% carry
    the default reward."""
    rng = random.Random(seed)
    hashes = {name: s.features.config_hash() for name, s in domain_settings().items()}
    names = list(DOMAINS)
    out = []
    for i in range(n):
        domain = rng.choice(names)
        arm = rng.choice(ARMS[domain])
        default = rng.random() < 0.2
        mode = rng.choices(("live", "shadow", "off"), (0.97, 0.02, 0.01))[0] if modes else "live"
        status = "not_activated" if modes and rng.random() < 0.01 else "default" if default else "rewarded"
        out.append(
            {
                "event_id": f"{prefix}-{i:07d}",
                "tenant": "default",
                "workspace": "main",
                "domain": domain,
                "arm": arm,
                "arm_index": ARMS[domain].index(arm),
                "actions": [],
                "probabilities": [],
                "probability": 0.5,
                "features": [1.0] + [rng.gauss(0.0, 1.0) for _ in range(DIM - 1)],
                "feature_hash": hashes[domain] if rng.random() < 0.5 else "",
                "reward": 0.0 if default else rng.random(),
                "signals": {},
                "reward_count": 0 if default else 1,
                "join_status": status,
                "mode": mode,
                "policy_version": "1.0.0",
                "decision_time": 1_700_000_000_000 + i,
                "reward_time": None if default else 1_700_000_000_500 + i,
                "weight": 1.0 if rng.random() < 0.9 else 0.5,
            }
        )
    return out


@dataclass
class Produced:
    """Where each produced record landed: ``placed[i] = (partition, offset)``."""

    placed: list[tuple[int, int]]

    def ends(self) -> dict[int, int]:
        """Next offset per partition after everything produced."""
        ends: dict[int, int] = {}
        for partition, offset in self.placed:
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        return ends


def folded(produced: Produced, block: int):
    """A predicate on (partition, offset): is the record in a block the learner has folded
    (every block but the trailing, incomplete one of its partition)?"""
    ends = produced.ends()
    return lambda where: where[1] < ends[where[0]] // block * block


def produce(kafka: KafkaSettings, topic: str, items: Iterable[tuple[str | bytes | None, bytes | None]]) -> Produced:
    """Produce (key, value) pairs in order and wait for every delivery report."""
    producer = Producer(kafka.producer_config(**{"linger.ms": 20, "batch.num.messages": 10000}))
    items = list(items)
    placed: list[tuple[int, int] | None] = [None] * len(items)
    failed = []

    def report(i):
        def on_delivery(error, message):
            if error is not None:
                failed.append(error)
            else:
                placed[i] = (message.partition(), message.offset())

        return on_delivery

    for i, (key, value) in enumerate(items):
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=report(i))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0 and not failed, failed[:3]
    return Produced(placed)  # type: ignore[arg-type]


def encode_updates(updates: Iterable[Mapping]) -> list[tuple[str, bytes]]:
    serde = AvroSerde("update", framing="single_object")
    return [(shard_key(u), serde.encode(u)) for u in updates]


# -- reading outcomes ------------------------------------------------------------------------


def read_topic(kafka: KafkaSettings, topic: str, partitions: int, serde: AvroSerde, timeout: float = 30.0) -> list[tuple[Mapping, int, int, bytes | None]]:
    """Every record of ``topic`` (decoded, partition, offset, key), to the end of each partition."""
    consumer = Consumer(kafka.consumer_config("learn-test-reader", **{"enable.partition.eof": True}))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    done: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(done) < partitions:
            assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout}s"
            for message in consumer.consume(1000, 0.5):
                if message.error() is not None:
                    assert message.error().code() == KafkaError._PARTITION_EOF, message.error().str()
                    done.add(message.partition())
                    continue
                out.append((serde.decode(message.value()), message.partition(), message.offset(), message.key()))
    finally:
        consumer.close()
    return out


def latest_posterior(kafka: KafkaSettings, topics: TopicSettings) -> dict[ArmKey, dict]:
    """The last PosteriorShard per key, as a compacting reader (the publisher) sees it."""
    serde = AvroSerde("posterior", framing="single_object")
    latest = {}
    for record, partition, _offset, key in read_topic(kafka, topics.posterior, topics.update_partitions, serde):
        model = ArmKey(record["tenant"], record["workspace"], record["domain"], record["arm"])
        assert key.decode() == str(model)
        assert record["watermark"][0]["partition"] == partition  # shard p publishes to partition p
        latest[model] = record
    return latest


def committed(kafka: KafkaSettings, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(kafka.consumer_config(group))
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in tps}


def wait_until(predicate, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(interval)


def wait_published(kafka: KafkaSettings, group: str, topics: TopicSettings, ends: Mapping[int, int], timeout: float) -> None:
    """Until the group has committed every partition's end: the learner publishes, then commits
    the watermark it published, so everything up to the end is on the posterior topic."""
    partitions = topics.update_partitions

    def caught_up():
        done = committed(kafka, group, topics.updates, partitions)
        return all(done.get(p, -1) >= end for p, end in ends.items())

    wait_until(caught_up, timeout, f"group {group} to commit {dict(ends)}")


def metric(port: int, name: str, **labels: str) -> float:
    """One sample from a worker's /metrics (0 when absent)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric_name, _, label_text = head.partition("{")
        if metric_name != name:
            continue
        pairs = dict(kv.split("=", 1) for kv in label_text.rstrip("}").split(",") if kv)
        if all(pairs.get(k, "").strip('"') == v for k, v in labels.items()):
            total += float(value)
    return total


# -- the expected outcome, computed in-process -------------------------------------------------


def reference(
    updates: Iterable[Mapping], placed: Iterable[tuple[int, int]], *, block: int | None = None, domains: Mapping[str, dict] = DOMAINS
) -> dict[ArmKey, Policy]:
    """The posterior the learner should reach: every live update, once, folded per model in
    its partition's offset order: one ``update_batch`` over all of a domain's rows, or with
    ``block``, one per domain and block of each partition (offsets ``k*block`` to
    ``(k+1)*block``), as the learner folds them."""
    settings = domain_settings(domains)
    rows: dict[str, list[tuple[tuple[int, int], Mapping]]] = {}
    seen: set[str] = set()
    for update, where in sorted(zip(updates, placed), key=lambda item: item[1]):
        if update["event_id"] in seen:
            continue
        seen.add(update["event_id"])
        if update["mode"] != "live" or update["join_status"] == "not_activated":
            continue
        rows.setdefault(update["domain"], []).append((where, update))
    models: dict[ArmKey, Policy] = {}
    for domain, items in rows.items():
        policy = settings[domain].make_policy()
        cuts: dict[tuple[int, int], list[Mapping]] = {}
        for (partition, offset), u in items:
            cuts.setdefault((partition, offset // block) if block else (0, 0), []).append(u)
        for us in cuts.values():  # in offset order per partition; partitions hold disjoint models
            policy.update_batch(
                np.array([u["features"] for u in us]), [model_key(u).arm for u in us],
                [u["reward"] for u in us], [u["weight"] for u in us],
            )  # fmt: skip
            for u in us:
                models[model_key(u)] = policy
    return models


def assert_matches_reference(
    published: Mapping[ArmKey, Mapping], expected: Mapping[ArmKey, Policy], rtol: float = 1e-9, domains: Mapping[str, dict] = DOMAINS
) -> None:
    """Every expected model is published with its exact update count and statistics within
    ``rtol``; nothing else is published."""
    assert set(published) == set(expected)
    settings = domain_settings(domains)
    for key, record in published.items():
        policy = expected[key]
        assert record["update_count"] == policy.update_count(key.arm), key
        mine = settings[key.domain].make_policy()
        mine.load_arm_state(key.arm, record["state"])
        want = policy.arm_statistics(key.arm)
        got = mine.arm_statistics(key.arm)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=rtol, err_msg=f"{key} {name}")
