"""Pipeline benchmark: decisions + rewards in, posterior updated, on the embedded broker.

Everything runs as in production: the embedded Tansu broker (``LocalStack``, profile
``tansu``), the join and learner workers as their own ``banditstream`` processes with the
project's defaults (the run sets only the window, ``learn.emit_every_s`` 0.2 s and
``join.sweep_interval_s`` 0.2 s), events in the Avro single-object framing. The benchmark
process only produces traffic and reads topics. Steps, in order:

1. **Workload.** ``--pairs`` decisions (default 100,000) over three domains, one reward
   each, seeded: a per-arm Thompson router (d=16), a shared Thompson ranker with
   context x action interactions (d=32) and a per-arm LinUCB prompt picker (d=24);
   ``normalize`` off. A decision looks like a router's log (17 numeric and 3 categorical
   context features, 5 candidates with 3 numeric features each; a pair is ~740 bytes of
   Avro); its reward (``success``, ``latency_ms``) comes 5-60 % of the window after it.
   Events are built and encoded before each phase starts, so producing costs a
   ``Producer.produce`` call per event and nothing more.
2. **Broker baseline.** The same ``2 x pairs`` messages go to a scratch topic with as many
   partitions; a bare confluent-kafka ``Consumer`` (assigned at offset 0, no group) reads
   them back, best of three: ``broker_consume_per_s`` is messages per second (a pair is
   two messages). The workers are not started yet, so the broker and both cores are the
   consumer's.
3. **Warm-up.** The workers start; a few hundred live pairs go through until the posterior
   shows them, so group joins and first-batch costs stay out of the figures.
4. **Throughput** (``pairs_per_s``). The pairs are produced as a live stream at
   ``--offered-rate`` (default 20,000 pairs/s, twice the target, so the loop is saturated):
   each event when its timestamp comes, decisions and rewards interleaved in time order,
   stamped as a service would. ``pairs_per_s`` = pairs / (time from the first produce until
   the posterior topic's update counts, latest per shard key, sum to every pair). The
   stream is longer than the window, so windows close on event time as the join reads;
   ``pairs_per_s_excl_window`` takes the window's constant out. That time also holds the
   join's ``grace_s`` (2 s by default since 2026-11-24: a decision finalises once its
   rewards are read past its window's end plus the grace), a constant delay of every
   decision, not a rate: ``pairs_per_s_sustained`` is the rate itself, how fast the
   posterior's count rose from 20 % to 80 % of the phase's pairs. (A backlog stamped in the
   past and produced at once would not measure the loop: the join takes a rewards
   partition it found read to its end as complete up to then, less its in-flight margin,
   so it closes the windows of events stamped earlier before their rewards are read; in a
   trial most rewards came late.)
5. **Latency** (``reward_to_posterior_p50_s`` / ``_p99_s``). Fresh pairs at a steady rate the
   loop sustains (``--latency-rate``; default the target, or 70 % of the measured throughput
   when that is lower) for ``--latency-seconds``, then another window and two seconds of the
   same traffic so the measured windows close on event time. A decision's window closes at
   ``timestamp + window``; its update is in the posterior when a PosteriorShard of its shard
   key arrives whose watermark for the update's partition passes the update's offset
   (offsets read back from the updates topic; arrival at the benchmark's consumer, wall
   clock). The latency is that arrival minus the window close, split at the UpdateEvent's
   producer timestamp into the join's part and the learner's. The join's part is mostly how
   far behind the producer it reads (``join_*_behind_s``). The last window of traffic,
   closed by the join's sweeper after traffic stops, is reported apart.

Every phase checks what the workers did (joins by status, dead letters by reason): a run
whose rewards were not joined measures something else, and the table says so in red.

Where the time goes: CPU seconds of each process (join, learner, broker, this benchmark)
per phase from ``/proc``, as microseconds per pair; the process with the most is the
bottleneck (``bottleneck``: what one core of it allows). ``--profile`` runs both workers
under cProfile and prints their time by area and by function. Found on the 2-core machine
on 2026-11-22 (100,000 pairs, the defaults; the VM's speed varies by a quarter between
runs): two join processes reach ~10,500-12,000 pairs/s end to end (8,200-9,800 in the VM's
slowest states), one ~9,000-10,000. (On 2026-11-30, with the join's 2 s grace in every
pair's time: 8,000-8,700 end to end, 11,200-13,200 sustained, the join ~130 us CPU per pair;
the README says why.) The join needs ~80-110 us CPU per pair as one process, ~100-130 as two
(each also applies the other's changelog as a standby replica), the learner ~20-25, the
broker ~30-35 and the load generator ~10-12. One join process keeps one core busy (its main thread at
~90 %) while the other core is half idle; two share both. Sampled with py-spy, the join's
main thread spends about a quarter of its time decoding, validating and freeing each
batch's decisions, a tenth on feature hashing, a tenth on firing and finalising, and an
eighth persisting state (one changelog record and RocksDB put per decision, when it
finishes). What the join did before, and what it took: 5,000 pairs/s while faust's fetch
waits (1.5 s, answered late by Tansu) stalled it and every decision's entry was written
three times; 8,000 after those; 9,000-10,000 reading the sources with librdkafka. The bare
consumer reads the same messages from the same broker at ~300,000-400,000 pairs/s.

Run from the repository root::

    .venv/bin/python benchmarks/pipeline.py                 # 100,000 pairs, ~2 minutes
    .venv/bin/python benchmarks/pipeline.py --quick         # smoke run, 10,000 pairs
    .venv/bin/python benchmarks/pipeline.py --pairs 50000 --window 2 --partitions 8
    .venv/bin/python benchmarks/pipeline.py --join-workers 1     # one join process
    .venv/bin/python benchmarks/pipeline.py --quick --profile

Progress goes to stderr; the results table to stdout, and the last line of stdout is one
JSON object: ``pairs_per_s``, ``broker_consume_per_s``, ``reward_to_posterior_p50_s``,
``reward_to_posterior_p99_s``, then every other figure (pairs, window_s, partitions, load
averages, CPU per pair, ...). A PNG (what the join read, joined and the posterior showed
during the throughput phase; the latency histogram) goes to ``benchmarks/out/pipeline.png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.live import Live  # noqa: E402
from rich.table import Table  # noqa: E402

from banditstream.config import load_settings  # noqa: E402
from banditstream.devstack import LocalStack  # noqa: E402
from banditstream.workers import WorkerExited, WorkerProcesses  # noqa: E402
from streams.serde import AvroSerde  # noqa: E402
from streams.settings import KafkaSettings, TopicSettings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402
from streams.worker import NORMALIZER_POLICY  # noqa: E402

TARGET_PAIRS_PER_S = 10_000
ROOT = Path(__file__).resolve().parents[1]
RAW_TOPIC = "bench.raw"

TASKS = ("code", "chat", "summarise", "translate", "extract")
LANGS = ("en", "sv", "de", "fr")
ARMS = ("gpt-small", "gpt-large", "claude-haiku", "llama-70b", "mistral-7b")
REWARD_TERMS = [
    {"signal": "success", "weight": 1.0},
    {"signal": "latency_ms", "weight": -0.5, "scale": 2000.0, "cap": 2.0},
]
#: name -> (policy, params, features); every domain gets the run's window.
DOMAINS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "routing": ("lin_ts", {"v": 0.3, "seed": 1}, {"dimension": 16, "normalize": False}),
    "ranker": (
        "shared_lin_ts",
        {"v": 0.3, "seed": 2},
        {"dimension": 32, "shared": True, "interactions": True, "normalize": False},
    ),
    "prompts": ("lin_ucb", {"alpha": 0.5}, {"dimension": 24, "normalize": False}),
}


class BenchError(RuntimeError):
    """The benchmark could not run to the end (a worker died, the loop stalled)."""


@dataclass(frozen=True)
class BenchOptions:
    """Sizes and cadences of one run; ``quick()`` shrinks them for a smoke run."""

    pairs: int = 100_000
    window_s: float = 1.0
    partitions: int = 4
    seed: int = 0
    #: Join processes (one consumer group: the partitions are split between them), as the
    #: Helm chart deploys them: one join process keeps one core busy and leaves the other
    #: half idle here (~9,000-10,000 pairs/s against ~10,500-12,000 with two).
    join_workers: int = 2
    warmup_pairs: int = 600
    #: Offered rate of the latency phase, pairs/s; 0: the target, or 70 % of the measured
    #: throughput when that is lower.
    latency_rate: float = 0.0
    latency_seconds: float = 15.0
    emit_every_s: float = 0.2
    sweep_interval_s: float = 0.2
    #: Rate the throughput phase offers, pairs/s: above the target, so the loop is saturated.
    offered_rate: float = 2.0 * TARGET_PAIRS_PER_S
    #: Reads of the broker baseline; the best counts (the least disturbed on a shared machine).
    baseline_repeats: int = 3
    #: Run the workers under cProfile and print where their CPU time goes (slows them).
    profile: bool = False
    plot: Path | None = ROOT / "benchmarks" / "out" / "pipeline.png"
    workdir: Path | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> BenchOptions:
        return cls(**{"pairs": 10_000, "warmup_pairs": 300, "latency_seconds": 5.0, **overrides})

    def phase_timeout_s(self, pairs: int) -> float:
        return 60.0 + pairs / 500.0


# --------------------------------------------------------------------------------------------------
# Workload


def domain_config(window_s: float) -> dict[str, Any]:
    return {
        name: {
            "policy": policy,
            "params": params,
            "features": features,
            "reward": {"terms": REWARD_TERMS, "aggregate": "sum", "default_reward": 0.0, "window_s": window_s},
        }
        for name, (policy, params, features) in DOMAINS.items()
    }


def make_pairs(tag: str, n: int, rng: random.Random, window_s: float) -> tuple[list[dict], list[dict], np.ndarray]:
    """``n`` decisions with one reward each (timestamps unset) and each reward's delay (ms)."""
    decisions, rewards = [], []
    names = list(DOMAINS)
    for i in range(n):
        domain = names[i % len(names)]
        event_id = f"{tag}-{i:07d}"
        numeric = {f"f{j}": rng.gauss(0.0, 1.0) for j in range(16)}
        numeric["prompt_tokens"] = float(rng.randint(5, 4000))
        weights = [rng.random() + 0.05 for _ in ARMS]
        total = sum(weights)
        probabilities = [w / total for w in weights]
        probabilities[-1] = 1.0 - sum(probabilities[:-1])
        decisions.append({
            "event_id": event_id, "tenant": "default", "workspace": "main", "domain": domain, "timestamp": 0,
            "context": {
                "numeric": numeric,
                "categorical": {"task": rng.choice(TASKS), "lang": rng.choice(LANGS), "tier": rng.choice(("free", "pro"))},
                "vector": [],
            },
            "actions": [
                {"id": arm, "features": {"numeric": {"cost": rng.random(), "latency": rng.random(), "quality": rng.random()},
                                         "categorical": {}, "vector": []}}
                for arm in ARMS
            ],
            "chosen": rng.randrange(len(ARMS)), "probabilities": probabilities, "policy_version": "1.0.0",
            "mode": "live", "deferred": False, "recommended": -1,
        })  # fmt: skip
        rewards.append({
            "event_id": event_id, "reward_id": f"{event_id}-r0", "tenant": "default", "workspace": "main",
            "domain": domain, "timestamp": 0,
            "signals": {"success": float(rng.random() < 0.7), "latency_ms": rng.uniform(50.0, 3000.0)}, "value": None,
        })  # fmt: skip
    delays = np.array([rng.uniform(0.05, 0.6) * window_s * 1000.0 for _ in range(n)])
    return decisions, rewards, delays


@dataclass
class Traffic:
    """Encoded pairs and their planned times (ms since the epoch)."""

    keys: list[bytes]
    decisions: list[bytes]
    rewards: list[bytes]
    decision_ms: np.ndarray  # decision timestamps
    reward_ms: np.ndarray  # reward timestamps

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def payload_bytes(self) -> int:
        return sum(map(len, self.decisions)) + sum(map(len, self.rewards))


def encode_traffic(decisions: list[dict], rewards: list[dict], decision_ms: np.ndarray, delays: np.ndarray) -> Traffic:
    decision_serde = AvroSerde("decision", framing="single_object")
    reward_serde = AvroSerde("reward", framing="single_object")
    decision_ms = np.round(decision_ms).astype(np.int64)
    reward_ms = decision_ms + np.round(delays).astype(np.int64)
    for record, ts in zip(decisions, decision_ms.tolist()):
        record["timestamp"] = ts
    for record, ts in zip(rewards, reward_ms.tolist()):
        record["timestamp"] = ts
    return Traffic(
        [d["event_id"].encode() for d in decisions],
        decision_serde.encode_batch(decisions),
        reward_serde.encode_batch(rewards),
        decision_ms,
        reward_ms,
    )


def _freeze() -> None:
    """Keep the workload (millions of objects) out of the garbage collector's scans: a full
    collection over it stalls this process for a long moment, which would show up as
    latency and as a slow broker baseline."""
    gc.collect()
    gc.freeze()


# --------------------------------------------------------------------------------------------------
# Processes


def _cpu_seconds(pid: int) -> float:
    """user + system CPU of a process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Workers(WorkerProcesses):
    """The join and learner processes (banditstream.workers), run from the repository root."""

    def start(self, name: str, config: Path, *, profile: Path | None = None, command: str | None = None) -> None:
        super().start(name, config, profile=profile, cwd=ROOT, command=command)

    def joins(self) -> list[str]:
        """Names of the join processes (``join``, ``join-2``, ...)."""
        return [name for name in self.processes if name == "join" or name.startswith("join-")]

    def scrape_joins(self) -> dict[str, dict[str, float]]:
        """The join processes' metrics, summed sample by sample (one group, split partitions)."""
        merged: dict[str, dict[str, float]] = {}
        for name in self.joins():
            for family, samples in self.scrape(name).items():
                into = merged.setdefault(family, {})
                for labels, value in samples.items():
                    into[labels] = into.get(labels, 0.0) + value
        return merged

    def check(self) -> None:
        try:
            super().check()
        except WorkerExited as exc:
            raise BenchError(str(exc)) from None


def _total(samples: dict[str, dict[str, float]], family: str) -> float:
    return sum(samples.get(family, {}).values())


def _label(labels: str, name: str) -> str:
    match = re.search(rf'{name}="([^"]*)"', labels)
    return match.group(1) if match else labels


# --------------------------------------------------------------------------------------------------
# Reading the posterior


@dataclass
class PosteriorLog:
    """Every PosteriorShard the benchmark received, in arrival order."""

    recv_s: list[float] = field(default_factory=list)  # wall clock at arrival
    keys: list[str] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    watermarks: list[int] = field(default_factory=list)  # next offset of the updates partition
    learned: list[int] = field(default_factory=list)  # sum of the latest update_count per key, after it


class PosteriorWatch(threading.Thread):
    """Reads the posterior topic from the start (assigned, no group) while the run goes on."""

    def __init__(self, kafka: KafkaSettings, topics: TopicSettings):
        super().__init__(name="posterior-watch", daemon=True)
        self.kafka = kafka
        self.topics = topics
        self.log = PosteriorLog()
        self.learned = 0
        self.error: BaseException | None = None
        self._latest: dict[str, int] = {}
        self._halt = threading.Event()
        self._changed = threading.Condition()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by wait_for
            self.error = exc

    def _run(self) -> None:
        serde = AvroSerde("posterior", framing="single_object")
        consumer = Consumer(self.kafka.consumer_config("bench-posterior-watch", **{"fetch.wait.max.ms": 10}))
        partitions = range(self.topics.update_partitions)
        consumer.assign([TopicPartition(self.topics.posterior, p, OFFSET_BEGINNING) for p in partitions])
        updates = self.topics.updates
        log = self.log
        try:
            while not self._halt.is_set():
                messages = consumer.consume(500, 0.02)
                now = time.time()
                good = [m for m in messages if m.error() is None]
                if not good:
                    continue
                for message, record in zip(good, serde.decode_batch([m.value() for m in good])):
                    if isinstance(record, Exception):
                        raise BenchError(f"undecodable posterior record: {record}")
                    if record["policy"] == NORMALIZER_POLICY:  # a join partition's statistics, not a model
                        continue
                    key = message.key().decode()
                    partition = message.partition()
                    marks = [w["offset"] for w in record["watermark"] if (w["topic"], w["partition"]) == (updates, partition)]
                    self.learned += record["update_count"] - self._latest.get(key, 0)
                    self._latest[key] = record["update_count"]
                    log.recv_s.append(now)
                    log.keys.append(key)
                    log.partitions.append(partition)
                    log.watermarks.append(marks[0] if marks else -1)
                    log.learned.append(self.learned)
                with self._changed:
                    self._changed.notify_all()
        finally:
            consumer.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def wait_for(self, learned: int, timeout: float, poll) -> float:
        """Block until the posterior shows ``learned`` updates; the wall time it first did."""
        deadline = time.monotonic() + timeout
        while self.learned < learned:
            if self.error is not None:
                raise BenchError(f"the posterior reader failed: {self.error!r}")
            if time.monotonic() > deadline:
                raise BenchError(f"the posterior shows {self.learned:,} of {learned:,} updates after {timeout:.0f} s")
            poll()
            with self._changed:
                self._changed.wait(0.25)
        return self.first_showed(learned)

    def first_showed(self, learned: int) -> float:
        """The wall time the posterior first showed ``learned`` updates (it has)."""
        index = int(np.searchsorted(np.asarray(self.log.learned), learned))
        return self.log.recv_s[index]


def read_updates(
    kafka: KafkaSettings, topics: TopicSettings, expect: int, timeout: float = 60.0
) -> dict[str, tuple[str, int, int, int]]:
    """``event_id -> (shard key, partition, offset, producer ms)`` of every UpdateEvent."""
    serde = AvroSerde("update", framing="single_object")
    consumer = Consumer(kafka.consumer_config("bench-updates-read"))
    consumer.assign([TopicPartition(topics.updates, p, OFFSET_BEGINNING) for p in range(topics.update_partitions)])
    found: dict[str, tuple[str, int, int, int]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(found) < expect and time.monotonic() < deadline:
            good = [m for m in consumer.consume(5000, 0.2) if m.error() is None]
            for message, record in zip(good, serde.decode_batch([m.value() for m in good])):
                if isinstance(record, Exception):
                    raise BenchError(f"undecodable update: {record}")
                found.setdefault(
                    record["event_id"],
                    (message.key().decode(), message.partition(), message.offset(), message.timestamp()[1]),
                )
    finally:
        consumer.close()
    return found


def reflected_at(log: PosteriorLog, keys: list[str], partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Wall time at which each update (shard key, partition, offset) was first in the posterior
    (NaN if never): the first PosteriorShard of its key whose watermark passes its offset."""
    out = np.full(len(keys), np.nan)
    by_key: dict[tuple[str, int], list[int]] = {}
    for i, (key, partition) in enumerate(zip(log.keys, log.partitions)):
        by_key.setdefault((key, partition), []).append(i)
    recv = np.asarray(log.recv_s)
    marks = np.asarray(log.watermarks)
    wanted: dict[tuple[str, int], list[int]] = {}
    for j, (key, partition) in enumerate(zip(keys, partitions.tolist())):
        wanted.setdefault((key, partition), []).append(j)
    for group, rows in wanted.items():
        published = by_key.get(group)
        if not published:
            continue
        reach = np.maximum.accumulate(marks[published])
        rows = np.asarray(rows)
        first = np.searchsorted(reach, offsets[rows], side="right")
        hit = first < len(published)
        out[rows[hit]] = recv[np.asarray(published)[first[hit]]]
    return out


# --------------------------------------------------------------------------------------------------
# The run


def producer_config(kafka: KafkaSettings) -> dict[str, Any]:
    """The project's producer settings (idempotent, the profile's extras), batching for volume."""
    return kafka.producer_config(**{
        "linger.ms": 10, "batch.size": 1_000_000, "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000,
    })  # fmt: skip


def produce(producer: Producer, traffic: Traffic, topics: tuple[str, str], *, paced: bool, tick=None) -> np.ndarray:
    """Produce decisions and rewards merged in the order of their timestamps.

    ``paced``: each event when its timestamp comes, as a live service logs it (else as fast
    as the producer takes them). ``tick(decisions, rewards)`` is called with the numbers
    produced about every quarter second. Returns how many ms after its timestamp the
    producer was at each look at the clock (every event while it waits, every 500th while it
    is behind).
    """
    n = len(traffic)
    times = np.concatenate([traffic.decision_ms, traffic.reward_ms])
    order = np.argsort(times, kind="stable")
    due_s = (times[order] / 1000.0).tolist()
    decisions, rewards = topics
    events = [
        (decisions, traffic.keys[i], traffic.decisions[i]) if i < n else (rewards, traffic.keys[i - n], traffic.rewards[i - n])
        for i in order.tolist()
    ]
    decisions_before = np.cumsum(order < n).tolist()
    send, poll, now, sleep = producer.produce, producer.poll, time.time, time.sleep
    lags: list[float] = []
    clock = now()
    next_tick = time.monotonic()
    for j, (topic, key, value) in enumerate(events):
        if paced and (due_s[j] > clock or j % 500 == 0):
            clock = now()
            lags.append(clock - due_s[j])
            if due_s[j] - clock > 0.001:
                poll(0)
                sleep(due_s[j] - clock)
                clock = now()
        while True:
            try:
                send(topic, value=value, key=key)
                break
            except BufferError:
                poll(0.01)
        if j % 200 == 0:
            if j % 5000 == 0:
                poll(0)
            if tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + 0.25
                tick(decisions_before[j], j + 1 - decisions_before[j])
    poll(0)
    if tick is not None:
        tick(n, n)
    return np.maximum(np.asarray(lags or [0.0]), 0.0) * 1000.0


@dataclass(frozen=True)
class Counts:
    """The workers' counters at one moment (joins by status, dead letters by reason, ...)."""

    values: dict[str, float]

    def __sub__(self, other: Counts) -> dict[str, float]:
        return {k: v - other.values.get(k, 0.0) for k, v in self.values.items() if v - other.values.get(k, 0.0)}


class Bench:
    """The phases of one run against a started broker; figures accumulate in ``figures``."""

    def __init__(self, options: BenchOptions, workdir: Path, kafka: KafkaSettings, console: Console):
        self.o = options
        self.workdir = workdir
        self.kafka = kafka
        self.console = console
        self.topics = TopicSettings(partitions=options.partitions, update_partitions=options.partitions)
        self.workers = Workers(workdir)
        self.rng = random.Random(options.seed)
        self.producer: Producer | None = None
        self.watch: PosteriorWatch | None = None
        self.stack_pid: int | None = None
        self.expected = 0  # updates the posterior must show once everything produced is learned
        self.figures: dict[str, Any] = {}
        self.cpu: dict[str, dict[str, float]] = {}
        self.progress: list[dict[str, float]] = []  # throughput phase, see observe()
        self.latencies = np.array([])

    # -- set-up -------------------------------------------------------------------------

    def write_config(self, instance: int = 1) -> Path:
        """The workers' config; ``instance`` > 1: another join process's, with its own state."""
        state = self.workdir / ("state" if instance == 1 else f"state-{instance}")
        tree = {
            "kafka": {"bootstrap_servers": self.kafka.bootstrap_servers, "profile": self.kafka.profile},
            "topics": self.topics.model_dump(),
            "stores": {"state_dir": str(state), "snapshots": str(self.workdir / "snapshots")},
            "join": {"sweep_interval_s": self.o.sweep_interval_s},
            "learn": {"emit_every_s": self.o.emit_every_s},
            "domains": domain_config(self.o.window_s),
        }
        path = self.workdir / ("banditstream.json" if instance == 1 else f"banditstream-{instance}.json")
        path.write_text(json.dumps(tree, indent=2))
        load_settings(path, env={})  # refuse a bad tree here, not in two worker logs
        return path

    def profile_path(self, worker: str) -> Path | None:
        return self.workdir / f"{worker}.prof" if self.o.profile else None

    # -- phases -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        o = self.o
        self.figures["load_avg_start"] = round(os.getloadavg()[0], 2)
        with self.console.status(f"building {o.pairs:,} pairs…"):
            pairs = make_pairs("a", o.pairs, self.rng, o.window_s)
            # the broker baseline reads the same bytes (timestamps re-stamped for the run later)
            same = encode_traffic(*pairs[:2], time.time() * 1000.0 + np.arange(o.pairs), pairs[2])
            _freeze()
        self.figures["mean_pair_bytes"] = round(same.payload_bytes / len(same), 1)
        ensure_topics(self.kafka, self.topics)
        self.producer = Producer(producer_config(self.kafka))
        self.broker_baseline(same)
        del same

        config = self.write_config()
        for name in ("join", "learn"):
            self.workers.start(name, config, profile=self.profile_path(name))
        for instance in range(2, o.join_workers + 1):
            name = f"join-{instance}"
            self.workers.start(name, self.write_config(instance), profile=self.profile_path(name), command="join")
        self.watch = PosteriorWatch(self.kafka, self.topics)
        self.watch.start()
        self.warm_up()
        self.throughput(*pairs)
        del pairs
        self.latency()
        self.figures["load_avg_end"] = round(os.getloadavg()[0], 2)
        return self.figures

    def broker_baseline(self, traffic: Traffic) -> None:
        """Fill a scratch topic with the same 2 x pairs payloads; time a bare consumer reading them."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.kafka.client_config())
        for future in admin.create_topics([NewTopic(RAW_TOPIC, num_partitions=self.o.partitions, replication_factor=1)]).values():
            future.result(15)
        total = 2 * len(traffic)
        with self.console.status(f"broker baseline: writing {total:,} messages…"):
            produce(self.producer, traffic, (RAW_TOPIC, RAW_TOPIC), paced=False)
            if self.producer.flush(60):
                raise BenchError("the broker did not take the baseline's messages")
        rates = []
        with self.console.status(f"broker baseline: reading {total:,} messages…"):
            for attempt in range(self.o.baseline_repeats):
                rates.append(self._read_raw(total, f"bench-raw-{attempt}"))
        best = max(rates, key=lambda r: r[0])
        self.figures.update(
            broker_consume_per_s=round(best[0]),
            broker_consume_mb_per_s=round(best[1] / 1e6, 1),
            broker_consume_runs_per_s=[round(r[0]) for r in rates],
            broker_first_message_s=round(best[2], 3),
        )

    def _read_raw(self, total: int, group: str) -> tuple[float, float, float]:
        """(messages/s, bytes/s, seconds to the first message) of one read of the scratch topic,
        timed from ``assign`` to the last message. Assigned at offset 0, not OFFSET_BEGINNING:
        resolving a logical offset costs librdkafka a ~0.5 s retry timer before the first fetch."""
        consumer = Consumer({"bootstrap.servers": self.kafka.bootstrap_servers, "group.id": group, "enable.auto.commit": False})
        seen = size = 0
        first = None
        start = time.perf_counter()
        consumer.assign([TopicPartition(RAW_TOPIC, p, 0) for p in range(self.o.partitions)])
        deadline = time.monotonic() + 120
        try:
            while seen < total and time.monotonic() < deadline:
                messages = consumer.consume(10_000, 0.5)
                if messages and first is None:
                    first = time.perf_counter()
                for message in messages:
                    if message.error() is None:
                        seen += 1
                        size += len(message.value())
            elapsed = time.perf_counter() - start
        finally:
            consumer.close()
        if seen < total or first is None:
            raise BenchError(f"the baseline consumer read {seen:,} of {total:,} messages in 120 s")
        return total / elapsed, size / elapsed, first - start

    def warm_up(self) -> None:
        n = self.o.warmup_pairs
        decisions, rewards, delays = make_pairs("w", n, self.rng, self.o.window_s)
        traffic = encode_traffic(decisions, rewards, time.time() * 1000.0 + 200.0 + np.arange(n) * 2.0, delays)
        with self.console.status("starting the join and learner workers, warming up…"):
            produce(self.producer, traffic, self.event_topics, paced=True)
            self.expected += n
            self.watch.wait_for(self.expected, 120.0, self.workers.check)

    def throughput(self, decisions: list[dict], rewards: list[dict], delays: np.ndarray) -> None:
        o = self.o
        n = len(decisions)
        start_ms = time.time() * 1000.0 + 500.0 + n / 50.0  # after encoding
        traffic = encode_traffic(decisions, rewards, start_ms + np.arange(n) * (1000.0 / o.offered_rate), delays)
        counts = self.counts()
        start = start_ms / 1000.0
        _, zero = self.observe("", n, (0, 0), start, {})
        cpu0 = self.cpu_now()
        phase = f"throughput, {o.offered_rate:,.0f} pairs/s offered"
        with Live(console=self.console, refresh_per_second=4, transient=True) as live:

            def tick(decisions: int, rewards: int) -> None:
                self.workers.check()
                view, point = self.observe(phase, n, (decisions, rewards), start, zero)
                self.progress.append(point)
                live.update(view)

            lag = produce(self.producer, traffic, self.event_topics, paced=True, tick=tick)
            self.expected += n
            done = self.watch.wait_for(self.expected, o.phase_timeout_s(n), lambda: tick(n, n))
        elapsed = done - start
        self.cpu["throughput"] = self.cpu_used(cpu0, n)
        tick(n, n)
        before = self.expected - n  # updates the posterior showed before this phase
        t20, t80 = (self.watch.first_showed(before + round(share * n)) for share in (0.2, 0.8))
        self.figures.update(
            pairs=n,
            pairs_per_s=round(n / elapsed),
            throughput_s=round(elapsed, 2),
            pairs_per_s_excl_window=round(n / max(elapsed - o.window_s, 1e-9)),
            pairs_per_s_sustained=round((round(0.8 * n) - round(0.2 * n)) / max(t80 - t20, 1e-9)),
            offered_pairs_per_s=round(o.offered_rate),
            throughput_producer_lag_p99_ms=round(float(np.percentile(lag, 99)), 1),
            throughput_counts=self.counts() - counts,
        )

    def latency(self) -> None:
        o = self.o
        rate = o.latency_rate or min(TARGET_PAIRS_PER_S, 0.7 * self.figures["pairs_per_s"])
        measured = int(rate * o.latency_seconds)
        n = measured + int(rate * (o.window_s + 2.0))  # then traffic goes on while they close
        decisions, rewards, delays = make_pairs("b", n, self.rng, o.window_s)
        # each decision stamped with the time it is due to be produced (and produced then)
        start_ms = time.time() * 1000.0 + 500.0 + n / 50.0
        traffic = encode_traffic(decisions, rewards, start_ms + np.arange(n) * (1000.0 / rate), delays)
        del decisions, rewards
        _freeze()
        counts = self.counts()
        start = start_ms / 1000.0
        _, zero = self.observe("", n, (0, 0), start, {})
        cpu0 = self.cpu_now()
        phase = f"latency, {rate:,.0f} pairs/s offered"
        points: list[dict[str, float]] = []
        with Live(console=self.console, refresh_per_second=4, transient=True) as live:

            def tick(decisions: int, rewards: int) -> None:
                self.workers.check()
                view, point = self.observe(phase, n, (decisions, rewards), start, zero)
                points.append(point)
                live.update(view)

            lag = produce(self.producer, traffic, self.event_topics, paced=True, tick=tick)
            self.expected += n
            self.watch.wait_for(self.expected, o.phase_timeout_s(n), lambda: tick(n, n))
        if self.producer.flush(30):
            raise BenchError("the producer did not deliver every pair")
        self.cpu["latency"] = self.cpu_used(cpu0, n)
        self.figures["latency_counts"] = self.counts() - counts
        with self.console.status("reading the updates topic back…"):
            updates = read_updates(self.kafka, self.topics, self.expected)
        rows = [updates.get(f"b-{i:07d}") for i in range(n)]
        if None in rows:
            raise BenchError(f"{rows.count(None):,} decisions of the latency phase have no UpdateEvent")
        keys = [r[0] for r in rows]
        partitions = np.array([r[1] for r in rows])
        offsets = np.array([r[2] for r in rows])
        emitted_s = np.array([r[3] for r in rows]) / 1000.0
        reflected = reflected_at(self.watch.log, keys, partitions, offsets)
        if np.isnan(reflected).any():
            raise BenchError(f"{int(np.isnan(reflected).sum()):,} updates never showed in the posterior")
        closes = traffic.decision_ms / 1000.0 + o.window_s
        latency = reflected - closes
        steady = slice(0, measured)
        stopped = traffic.decision_ms > traffic.decision_ms[-1] - o.window_s * 1000.0  # closed by the sweeper
        self.latencies = latency[steady]
        pct = lambda a, q: round(float(np.percentile(a, q)), 3)  # noqa: E731
        self.figures.update(
            reward_to_posterior_p50_s=pct(latency[steady], 50),
            reward_to_posterior_p99_s=pct(latency[steady], 99),
            reward_to_posterior_max_s=pct(latency[steady], 100),
            latency_offered_pairs_per_s=round(rate),
            latency_pairs=measured,
            latency_pairs_all=n,
            window_close_to_update_p50_s=pct(emitted_s[steady] - closes[steady], 50),
            window_close_to_update_p99_s=pct(emitted_s[steady] - closes[steady], 99),
            update_to_posterior_p50_s=pct(reflected[steady] - emitted_s[steady], 50),
            update_to_posterior_p99_s=pct(reflected[steady] - emitted_s[steady], 99),
            after_traffic_stops_p50_s=pct(latency[stopped], 50),
            after_traffic_stops_max_s=pct(latency[stopped], 100),
            producer_lag_p99_ms=round(float(np.percentile(lag, 99)), 1),
        )
        # How far behind the producer the join handled each topic, while traffic flowed
        # (after its first 2 s): a window cannot close before the rewards up to it are read.
        flowing = [p for p in points if 2.0 <= p["t"] and p["decisions produced"] < n]
        for topic in ("decisions", "rewards"):
            behind = [(p[f"{topic} produced"] - p[f"{topic} read"]) / rate for p in flowing]
            self.figures[f"join_{topic}_behind_s"] = round(float(np.mean(behind)), 3) if behind else None

    @property
    def event_topics(self) -> tuple[str, str]:
        return self.topics.decisions, self.topics.rewards


    # -- accounting ---------------------------------------------------------------------

    def cpu_now(self) -> dict[str, float]:
        pids = {**self.workers.pids(), "bench": os.getpid()}
        if self.stack_pid:
            pids["broker"] = self.stack_pid
        used = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        for name in self.workers.joins()[1:]:  # the join's CPU is all its processes'
            used["join"] += used.pop(name)
        return {"wall": time.monotonic(), **used}

    def cpu_used(self, before: dict[str, float], pairs: int) -> dict[str, float]:
        after = self.cpu_now()
        return {name: after[name] - before[name] for name in before} | {"pairs": pairs}

    def counts(self) -> Counts:
        """The workers' Prometheus counters that say what a phase did and where time went."""
        join, learn = self.workers.scrape_joins(), self.workers.scrape("learn")
        values = {f"joins_{_label(k, 'status')}": v for k, v in join.get("banditstream_joins_total", {}).items()}
        for worker, samples in (("join", join), ("learn", learn)):
            for k, v in samples.get("banditstream_dead_letters_total", {}).items():
                values[f"dead_letters_{worker}_{_label(k, 'reason')}"] = v
            for k, v in samples.get("banditstream_duplicates_total", {}).items():
                values[f"duplicates_{worker}_{_label(k, 'kind')}"] = v
            for k, v in samples.get("banditstream_log_gaps_total", {}).items():  # (streams._gaps)
                key = f"log_gaps_{worker}_{_label(k, 'outcome')}"
                values[key] = values.get(key, 0.0) + v
        values.update(
            join_batches=_total(join, "banditstream_batch_size_count"),
            join_batched_records=_total(join, "banditstream_batch_size_sum"),
            learner_blocks=_total(learn, "banditstream_batch_size_count"),
            learner_apply_s=_total(learn, "banditstream_apply_latency_seconds_sum"),
            posterior_shards_emitted=_total(learn, "banditstream_posterior_shards_emitted_total"),
        )
        return Counts(values)

    def observe(
        self, phase: str, n: int, produced: tuple[int, int], since: float, before: dict[str, float]
    ) -> tuple[Table, dict[str, float]]:
        """One look at the run: the progress line, and the point it adds to the progress plot
        (counts since ``before``, the point taken when the phase started)."""
        join = self.workers.scrape_joins()
        read = {_label(k, "topic"): v for k, v in join.get("banditstream_records_in_total", {}).items()}
        point = {
            "t": max(0.0, time.time() - since),
            "decisions produced": float(produced[0]),
            "rewards produced": float(produced[1]),
            "decisions read": read.get(self.topics.decisions, 0.0),
            "rewards read": read.get(self.topics.rewards, 0.0),
            "joined": _total(join, "banditstream_joins_total"),
            "learned": float(self.watch.learned),
        }
        for name in ("decisions read", "rewards read", "joined", "learned"):
            point[name] -= before.get(name, 0.0)
        table = Table.grid(padding=(0, 2))
        table.add_row(
            f"[bold]{phase}[/]",
            f"produced {produced[0]:,}/{n:,}",
            f"join read {point['decisions read']:,.0f} decisions, {point['rewards read']:,.0f} rewards",
            f"joined {point['joined']:,.0f}",
            f"in posterior [bold]{point['learned']:,.0f}[/]",
            f"{point['learned'] / max(point['t'], 1e-9):,.0f} pairs/s",
            f"{point['t']:,.1f} s",
        )
        return table, point


# --------------------------------------------------------------------------------------------------
# Output


def profile_note(cpu: dict[str, float]) -> dict[str, float]:
    """CPU microseconds per pair of each process over a phase."""
    pairs = cpu["pairs"]
    return {name: round(value / pairs * 1e6, 1) for name, value in cpu.items() if name not in ("pairs", "wall")}


def bottleneck(cpu: dict[str, float]) -> dict[str, Any]:
    """The process with the most CPU per pair over a phase, and what one core of it allows."""
    per_pair = profile_note(cpu)
    name = max(per_pair, key=per_pair.get)
    busy = sum(v for k, v in cpu.items() if k not in ("pairs", "wall")) / cpu["wall"]
    return {
        "process": name,
        "cpu_us_per_pair": per_pair[name],
        "pairs_per_s_per_core": round(1e6 / per_pair[name]) if per_pair[name] else None,
        "cores_busy": round(busy, 2),
        "note": (
            f"{name} needs {per_pair[name]:,.0f} us CPU per pair, so one core of it does at most "
            f"{1e6 / per_pair[name]:,.0f} pairs/s; the other processes need "
            + ", ".join(f"{k} {v:,.0f}" for k, v in per_pair.items() if k != name)
            + f" us per pair; {busy:.2f} of {os.cpu_count()} cores were busy"
        ),
    }


def print_results(console: Console, figures: dict[str, Any], cpu: dict[str, dict[str, float]]) -> None:
    f = figures
    ok = f["pairs_per_s"] >= TARGET_PAIRS_PER_S
    table = Table("figure", "value", title="banditstream pipeline (Tansu, local)")
    table.add_row(
        "pairs (decision + reward)",
        f"{f['pairs']:,}, window {f['window_s']:g} s, {f['partitions']} partitions, "
        f"{f['join_workers']} join process{'es' if f['join_workers'] > 1 else ''}",
    )
    limited = f["pairs_per_s"] >= 0.9 * f["offered_pairs_per_s"]
    table.add_row(
        "end-to-end throughput",
        f"[bold]{f['pairs_per_s']:,} pairs/s[/] ({f['throughput_s']:.1f} s) "
        + ("[green]>= target[/]" if ok else f"[red]< target {TARGET_PAIRS_PER_S:,}[/]")
        + (" [yellow](near the offered rate: raise --offered-rate)[/]" if limited else ""),
    )
    table.add_row("  without the window's constant", f"{f['pairs_per_s_excl_window']:,} pairs/s (pairs / (time - window))")
    table.add_row(
        "  sustained",
        f"{f['pairs_per_s_sustained']:,} pairs/s (how fast the posterior's count rose from 20 % to 80 % of the pairs)",
    )
    table.add_row(
        "  offered",
        f"{f['offered_pairs_per_s']:,} pairs/s, producer behind schedule by {f['throughput_producer_lag_p99_ms']:.0f} ms at p99",
    )
    table.add_row(
        "broker raw consume, same messages",
        f"{f['broker_consume_per_s']:,} msg/s = {f['broker_consume_per_s'] // 2:,} pairs/s ({f['broker_consume_mb_per_s']} MB/s)",
    )
    table.add_row(
        "reward -> posterior beyond window",
        f"p50 [bold]{f['reward_to_posterior_p50_s']:.3f} s[/], p99 [bold]{f['reward_to_posterior_p99_s']:.3f} s[/] "
        f"at {f['latency_offered_pairs_per_s']:,} pairs/s offered ({f['latency_pairs']:,} pairs)",
    )
    table.add_row(
        "  window close -> UpdateEvent (join)",
        f"p50 {f['window_close_to_update_p50_s']:.3f} s, p99 {f['window_close_to_update_p99_s']:.3f} s",
    )
    table.add_row(
        "  UpdateEvent -> posterior (learner)",
        f"p50 {f['update_to_posterior_p50_s']:.3f} s, p99 {f['update_to_posterior_p99_s']:.3f} s",
    )
    table.add_row(
        "  join reads behind the producer",
        f"decisions {f['join_decisions_behind_s'] or 0:.2f} s, rewards {f['join_rewards_behind_s'] or 0:.2f} s (mean)",
    )
    table.add_row(
        "  last window, after traffic stops",
        f"p50 {f['after_traffic_stops_p50_s']:.3f} s, max {f['after_traffic_stops_max_s']:.3f} s",
    )
    for phase, used in cpu.items():
        per = profile_note(used)
        wall = used["wall"]
        parts = ", ".join(f"{name} {us:,.0f}" for name, us in per.items())
        busy = sum(v for k, v in used.items() if k not in ("pairs", "wall"))
        table.add_row(f"CPU µs/pair, {phase}", f"{parts} (cores busy {busy / wall:.2f} of {os.cpu_count()})")
    table.add_row("where the time goes", figures["bottleneck"]["note"])
    for phase, pairs in (("throughput", f["pairs"]), ("latency", f["latency_pairs_all"])):
        c = f[f"{phase}_counts"]
        rewarded = int(c.get("joins_rewarded", 0))
        dead = {k.removeprefix("dead_letters_"): int(v) for k, v in c.items() if k.startswith("dead_letters_")}
        style = "[green]" if rewarded == pairs and not dead else "[red]"
        table.add_row(
            f"joins, {phase} phase",
            f"{style}rewarded {rewarded:,} of {pairs:,}, default {int(c.get('joins_default', 0)):,}, "
            f"dead letters {dead or 0}[/]; join batch {c.get('join_batched_records', 0) / max(1, c.get('join_batches', 0)):,.0f} "
            f"records, learner fold {c.get('learner_apply_s', 0):.2f} s",
        )
    table.add_row("load average start / end", f"{f['load_avg_start']} / {f['load_avg_end']}")
    console.print(table)


def print_profile(console: Console, worker: str, path: Path, top: int = 20) -> None:
    """Where a worker's main thread spent its time (cProfile over the whole run), by area and
    by function. Waiting in ``epoll`` (the event loop idle) or in ``Consumer.consume`` is idle."""
    import pstats

    if not path.exists():
        console.print(f"no profile of the {worker} worker at {path}")
        return
    stats = pstats.Stats(str(path))
    total = stats.total_tt
    areas: dict[str, float] = {}
    for (filename, _line, name), (_cc, _calls, own, _cum, _callers) in stats.stats.items():
        areas[_area(filename, name)] = areas.get(_area(filename, name), 0.0) + own
    table = Table("area", "own s", "%", title=f"{worker} worker: time by area (cProfile, {total:.1f} s)")
    for area, own in sorted(areas.items(), key=lambda item: item[1], reverse=True)[:12]:
        table.add_row(area, f"{own:.2f}", f"{own / total:.0%}")
    console.print(table)
    table = Table("own s", "%", "with callees s", "calls", "function", title=f"{worker} worker: top functions")
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    for (filename, line, name), (_cc, calls, own, cumulative, _callers) in rows:
        where = f"{Path(filename).parent.name}/{Path(filename).name}:{line}" if line else ""
        table.add_row(f"{own:.2f}", f"{own / total:.0%}", f"{cumulative:.2f}", f"{calls:,}", f"{name} {where}".strip())
    console.print(table)
    console.print(f"stats: {path} (python -m pstats)")


def _area(filename: str, name: str) -> str:
    """A profile entry's package (site-packages), stdlib module, repository module, or built-in."""
    if filename == "~":
        return "idle: epoll wait" if "epoll" in name else f"built-in {name.split(' of ')[0].strip('<>')}"
    parts = Path(filename).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    if str(ROOT) in filename:
        return str(Path(filename).relative_to(ROOT))
    return f"stdlib {Path(filename).parent.name}/{Path(filename).stem}" if "python3" in filename else filename


def plot(path: Path, progress: list[dict[str, float]], pairs: int, latencies: np.ndarray, figures: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    t = [p["t"] for p in progress]
    for name in ("decisions read", "rewards read", "joined", "learned"):
        left.plot(t, [p[name] for p in progress], label=f"{name} (join)" if name != "learned" else "in the posterior")
    target = f"target {TARGET_PAIRS_PER_S:,} pairs/s"
    left.plot([0, pairs / TARGET_PAIRS_PER_S], [0, pairs], linestyle="--", color="grey", label=target)
    left.set_ylim(0, pairs * 1.05)
    left.set_xlabel(f"seconds since the first produce ({figures['offered_pairs_per_s']:,} pairs/s offered)")
    left.set_ylabel("pairs")
    left.set_title(f"throughput: {figures['pairs_per_s']:,} pairs/s end to end")
    left.legend()
    right.hist(latencies, bins=60)
    for q, style in ((50, "-"), (99, "--")):
        value = float(np.percentile(latencies, q))
        right.axvline(value, color="black", linestyle=style, label=f"p{q} {value:.3f} s")
    right.set_xlabel("seconds from window close to the posterior")
    right.set_ylabel("pairs")
    right.set_title(f"latency at {figures['latency_offered_pairs_per_s']:,} pairs/s offered")
    right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(options: BenchOptions, console: Console, out: Console) -> dict[str, Any]:
    """Run the benchmark; progress on ``console``, the results table on ``out``."""
    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="banditstream-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(workdir / "stack", s3=False)
    bench: Bench | None = None
    keep = options.workdir is not None
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        with console.status("starting the embedded broker…"):
            info = stack.up()
        kafka = KafkaSettings(bootstrap_servers=info.kafka_bootstrap, profile=info.kafka_profile)
        bench = Bench(options, workdir, kafka, console)
        bench.stack_pid = next((p.pid for p in info.processes if p.name == "tansu"), None)
        figures = bench.run()
        figures.update(window_s=options.window_s, partitions=options.partitions, seed=options.seed, join_workers=options.join_workers)
        figures["cpu_us_per_pair"] = {phase: profile_note(used) for phase, used in bench.cpu.items()}
        figures["bottleneck"] = bottleneck(bench.cpu["throughput"])
        print_results(out, figures, bench.cpu)
        if options.profile:
            bench.workers.stop()  # cProfile writes its stats as the process exits
            for name in ("join", "learn"):
                print_profile(out, name, bench.profile_path(name))
        if options.plot:
            plot(options.plot, bench.progress, figures["pairs"], bench.latencies, figures)
            console.print(f"plot: {options.plot}")
        return figures
    except BenchError:
        keep = True  # the worker logs say why
        console.print(f"worker logs and state kept in {workdir}")
        raise
    finally:
        if bench is not None:
            if bench.watch is not None:
                bench.watch.stop()
            bench.workers.stop()
            if bench.producer is not None:
                bench.producer.flush(5)
                bench.producer = None  # librdkafka closes it now, before its broker goes
        stack.down()
        signal.signal(signal.SIGTERM, previous)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _raise_keyboard_interrupt(*_):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, help="decision/reward pairs of the throughput phase (default 100,000)")
    parser.add_argument("--window", type=float, default=1.0, help="reward window of every domain, seconds")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--join-workers", type=int, default=BenchOptions.join_workers,
                        help="join processes in the group (they split the partitions)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--offered-rate", type=float, default=BenchOptions.offered_rate, help="pairs/s the throughput phase offers")
    parser.add_argument("--latency-rate", type=float, default=0.0, help="offered pairs/s of the latency phase (0: auto)")
    parser.add_argument("--latency-seconds", type=float, help="length of the latency phase (default 15)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10,000 pairs, 5 s of latency traffic")
    parser.add_argument("--plot", type=Path, default=BenchOptions.plot)
    parser.add_argument("--workdir", type=Path, help="keep the stack, state and worker logs here")
    parser.add_argument("--profile", action="store_true", help="run the workers under cProfile and print their hot spots")
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {
        "window_s": args.window, "partitions": args.partitions, "seed": args.seed,
        "latency_rate": args.latency_rate, "offered_rate": args.offered_rate, "plot": args.plot,
        "workdir": args.workdir, "profile": args.profile, "join_workers": args.join_workers,
    }  # fmt: skip
    if args.pairs:
        overrides["pairs"] = args.pairs
    if args.latency_seconds:
        overrides["latency_seconds"] = args.latency_seconds
    if args.join_workers < 1:
        parser.error(f"--join-workers must be at least 1, got {args.join_workers}")
    options = BenchOptions.quick(**overrides) if args.quick else BenchOptions(**overrides)
    console = Console(stderr=True)
    try:
        figures = run(options, console, Console())
    except KeyboardInterrupt:
        console.print("interrupted; everything started was stopped")
        return 130
    except BenchError as exc:
        console.print(f"[red]benchmark failed:[/] {exc}")
        return 1
    headline = ("pairs_per_s", "broker_consume_per_s", "reward_to_posterior_p50_s", "reward_to_posterior_p99_s")
    print(json.dumps({**{k: figures[k] for k in headline}, **figures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
