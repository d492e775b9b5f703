"""Builders and readers for the join worker's integration tests.

Events carry wall-clock timestamps (the join's clock follows event time while traffic flows
and the wall clock when it stops). The join runs either in a thread (``run_join(config,
stop=event)``) or as ``python -m banditstream.cli join`` with a JSON config file.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from banditstream.config import Settings
from streams.client import EventProducer
from streams.serde import AvroSerde
from streams.settings import KafkaSettings, TopicSettings

ROOT = Path(__file__).resolve().parent.parent

#: Domains of the tests: per-arm and shared models, several aggregate modes, short windows.
DOMAINS: dict[str, dict[str, Any]] = {
    "routing": {
        "policy": "lin_ucb",
        "features": {"dimension": 16, "normalize": True},
        "reward": {
            "terms": [
                {"signal": "success", "weight": 1.0},
                {"signal": "latency_ms", "weight": -0.5, "scale": 2000.0, "cap": 2.0},
            ],
            "aggregate": "sum",
            "default_reward": 0.0,
            "window_s": 2.0,
        },
    },
    "ranker": {
        "policy": "shared_lin_ts",
        "features": {"dimension": 32, "shared": True, "interactions": True, "normalize": False},
        "reward": {"terms": [{"signal": "success", "weight": 2.0}], "aggregate": "max",
                   "default_reward": -0.25, "window_s": 2.0, "clip": [-1.0, 1.5]},
    },
    "prompts": {
        "policy": "ucb1",
        "features": {"dimension": 8, "normalize": False},
        "reward": {"terms": [{"signal": "quality", "weight": 1.0}], "aggregate": "mean",
                   "default_reward": 0.1, "window_s": 2.0},
    },
}

ARMS = ("gpt-small", "gpt-large", "claude-haiku", "llama-70b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(kafka: KafkaSettings, topics: TopicSettings, state_dir: Path, *, domains=None, metrics_port: int = 0,
             join: dict[str, Any] | None = None) -> Settings:
    return Settings.model_validate({
        "kafka": kafka.model_dump(),
        "topics": topics.model_dump(),
        "stores": {"state_dir": str(state_dir)},
        "metrics": {"port": metrics_port},
        "domains": domains or DOMAINS,
        "join": join or {},
    })  # fmt: skip


def now_ms() -> int:
    return int(time.time() * 1000)


def decision(event_id: str, domain: str, rng: random.Random, ts: int, *, mode: str = "live") -> dict:
    n = rng.randint(2, len(ARMS))
    weights = [rng.random() + 0.05 for _ in range(n)]
    total = sum(weights)
    probabilities = [w / total for w in weights]
    probabilities[-1] = 1.0 - sum(probabilities[:-1])
    return {
        "event_id": event_id,
        "tenant": "default",
        "workspace": "main",
        "domain": domain,
        "timestamp": ts,
        "context": {
            "numeric": {"prompt_tokens": float(rng.randint(5, 4000)), "f1": rng.gauss(0, 1)},
            "categorical": {"task": rng.choice(("code", "chat", "extract")), "lang": rng.choice(("en", "sv"))},
            "vector": [],
        },
        "actions": [
            {"id": ARMS[a], "features": {"numeric": {"cost": rng.random()}, "categorical": {}, "vector": []}}
            for a in range(n)
        ],
        "chosen": rng.randrange(n),
        "probabilities": probabilities,
        "policy_version": "1.2.3",
        "mode": mode,
        "deferred": False,
        "recommended": -1,
    }


def reward(event_id: str, reward_id: str, domain: str, rng: random.Random, ts: int) -> dict:
    return {
        "event_id": event_id,
        "reward_id": reward_id,
        "tenant": "default",
        "workspace": "main",
        "domain": domain,
        "timestamp": ts,
        "signals": {"success": float(rng.random() < 0.6), "latency_ms": rng.uniform(50, 3000), "quality": rng.random()},
        "value": None,
    }


class Sender:
    """Produces events in the single-object framing (a registry-free wire format across processes)."""

    def __init__(self, kafka: KafkaSettings, topics: TopicSettings):
        self.topics = topics
        self.producer = EventProducer(kafka, **{"message.max.bytes": 4_000_000})
        self.decisions = AvroSerde("decision", framing="single_object", max_payload_bytes=4_000_000)
        self.rewards = AvroSerde("reward", framing="single_object", max_payload_bytes=4_000_000)

    def decision(self, record: dict) -> None:
        self.producer.send(self.topics.decisions, self.decisions, record)

    def reward(self, record: dict) -> None:
        self.producer.send(self.topics.rewards, self.rewards, record)

    def raw(self, topic: str, key: str, value: bytes) -> None:
        self.producer.send_raw(topic, value, key=key)

    def flush(self) -> None:
        self.producer.flush(60)


def read_topic(kafka: KafkaSettings, topic: str, serde_name: str, *, expect: int | None = None,
               idle_s: float = 3.0, timeout_s: float = 120.0, check=None, until=None) -> list[tuple[bytes | None, dict]]:
    """Every record of ``topic`` as (key, decoded value), read from the start.

    Reads until the records satisfy ``until(records)`` (default: at least ``expect`` of
    them, or anything) and then ``idle_s`` pass without a new one (so extra records are seen
    too), or ``timeout_s``. ``check()`` is called between polls (e.g. to fail fast when the
    worker died).
    """
    serde = AvroSerde(serde_name, framing="single_object", max_payload_bytes=8_000_000)
    consumer = Consumer(kafka.consumer_config(f"reader-{topic}-{time.monotonic_ns()}", **{"enable.partition.eof": False}))
    described = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if described is not None and described.error is None and described.partitions:
        # every partition from the start, without a group join (which takes seconds)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(described.partitions)])
    else:  # not created yet: the group assigns it once it exists
        consumer.subscribe([topic])
    if until is None:
        def until(records):
            return expect is None or len(records) >= expect
    out: list[tuple[bytes | None, dict]] = []
    deadline = time.monotonic() + timeout_s
    last = None  # idle time counts from the first assignment (a group join takes seconds)
    try:
        while time.monotonic() < deadline:
            messages = consumer.consume(5000, 0.5)
            for message in messages:
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(message.error().str())
                out.append((message.key(), serde.decode(message.value())))
            if check is not None:
                check()
            if last is None and consumer.assignment():
                last = time.monotonic()
            if messages:
                last = time.monotonic()
            elif last is not None and until(out) and time.monotonic() - last > idle_s:
                break
    finally:
        consumer.close()
    return out


def every_event(event_ids) -> callable:
    """``until`` for :func:`read_topic`: an update for each of ``event_ids`` was read."""
    wanted = set(event_ids)

    def done(records) -> bool:
        return wanted <= {record["event_id"] for _, record in records}

    return done


class JoinThread:
    """``run_join`` in a thread, stopped through its ``stop`` event."""

    def __init__(self, config):
        from streams.join import run_join

        self.stop = threading.Event()
        self.error: BaseException | None = None

        def target():
            try:
                run_join(config, stop=self.stop)
            except BaseException as exc:  # reported by join()
                self.error = exc

        self.thread = threading.Thread(target=target, name="join-worker", daemon=True)

    def __enter__(self) -> "JoinThread":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check(self) -> None:
        """Raise if the worker thread ended by itself."""
        if not self.thread.is_alive() and not self.stop.is_set():
            raise AssertionError(f"join worker ended early: {self.error!r}")

    def close(self, timeout: float = 60.0) -> None:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "join worker did not stop"
        if self.error is not None:
            raise self.error


def join_process(config_path: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """``banditstream join`` as a subprocess (its own process group), output to ``log_path``."""
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    log = open(log_path, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "banditstream.cli", "--config", str(config_path), "join"],
        cwd=str(ROOT), env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def process_env(kafka: KafkaSettings, topics: TopicSettings, state_dir: Path, metrics_port: int) -> dict[str, str]:
    env = {
        "BANDITSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "BANDITSTREAM_KAFKA__PROFILE": kafka.profile,
        "BANDITSTREAM_STORES__STATE_DIR": str(state_dir),
        "BANDITSTREAM_METRICS__PORT": str(metrics_port),
    }
    for role, name in topics.names().items():
        env[f"BANDITSTREAM_TOPICS__{role.upper()}"] = name
    env["BANDITSTREAM_TOPICS__PARTITIONS"] = str(topics.partitions)
    env["BANDITSTREAM_TOPICS__UPDATE_PARTITIONS"] = str(topics.update_partitions)
    return env


def write_config(path: Path, domains: dict | None = None) -> Path:
    path.write_text(json.dumps({"domains": domains or DOMAINS}))
    return path


def by_event_id(updates: list[tuple[bytes | None, dict]]) -> Counter:
    return Counter(record["event_id"] for _, record in updates)


def raw_records(kafka: KafkaSettings, topic: str, partitions: int, *, idle_s: float = 2.0) -> list:
    """Every record of the topic as librdkafka messages, undecoded: read from the start until
    each partition reported its end, or nothing came for ``idle_s``."""
    consumer = Consumer(kafka.consumer_config(f"raw-{topic}-{random.random()}", **{"enable.partition.eof": True}))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, ended, last = [], set(), time.monotonic()
    while len(ended) < partitions and time.monotonic() - last < idle_s:
        message = consumer.poll(0.2)
        if message is None:
            continue
        last = time.monotonic()
        if message.error() is not None:
            ended.add(message.partition())
        else:
            records.append(message)
    consumer.close()
    return records


class Message:
    """What SourceReader reads of a librdkafka Message (or of an end-of-partition event)."""

    def __init__(self, topic: str, partition: int, offset: int, timestamp: int = 0, eof: bool = False):
        self._topic, self._partition, self._offset, self._timestamp = topic, partition, offset, timestamp
        self._error = KafkaError(KafkaError._PARTITION_EOF) if eof else None

    def error(self):
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)
