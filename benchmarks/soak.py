"""Soak: a bounded chaos run of the whole loop, checked against a fault-free reference.

What runs (all real, all on loopback, all stopped at the end):

- a Tansu broker on its memory storage (the default, the storage INFRA.md supports), whose
  restart would lose everything, so the broker is frozen (SIGSTOP, 10-20 s) instead; or with
  ``--storage s3`` the S3 server (SeaweedFS) and a Tansu keeping its log in a bucket there,
  killed and restarted (see :mod:`benchmarks._soak_stack` for what was measured: after a
  restart that storage hands out offsets from 0 again, which no Kafka broker does, and the
  workers then skip the records written at offsets they had passed);
- the join, learner and publisher, each a ``banditstream`` process (:class:`banditstream.workers.WorkerProcesses`);
- this process: the producers, a reader of the updates, dead-letter and posterior topics,
  the fault injector and the checks.

The workload, for ``--minutes`` (default 15):

1. a **backlog**: ``--backlog`` decision/reward pairs stamped an hour in the past, produced at
   full speed as soon as the workers run (a spool drained after an outage);
2. **live traffic**: ``--pairs-per-s`` decisions over two domains (a per-arm Thompson router
   summing its rewards, a shared Thompson template picker keeping the best reward; realistic
   contexts from :mod:`banditstream.simulate`), a reward window of ``--window`` seconds: per
   decision no reward (15 %: the default reward), one reward in the window, 2-3 of them (15 %),
   only a late one (5 %), or one in the window and one late (5 %). 15 % of the decisions come
   from a **clock-skewed producer** whose clock is ``--skew`` seconds behind (within the
   join's ``grace_s``): its events are stamped that far in the past. Every event's timestamp
   is its event time; rewards are produced when their timestamp comes. 2 % of the good records
   are produced twice (duplicates: sent again once the broker acknowledged the first, as a
   retry or a spool drain re-sends);
3. ``--bad-records`` **fuzzed bad records** drawn with hypothesis (:mod:`benchmarks._soak_fuzz`),
   spread over the run, on the decisions, rewards and updates topics;
4. ``--faults`` **faults** at seeded random times between 10 % and 80 % of the run: ``kill -9``
   of the join, the learner or the publisher (restarted at once or after up to 5 s), a broker
   ``kill -9`` and restart (or a 10-20 s SIGSTOP with ``--storage memory``), a burst of
   three seconds' worth of pairs from the skewed producer at full speed. The first five are
   one of each kind.

The join's tolerances: on memory storage its defaults. On S3 storage the broker acknowledges
records in ~0.1-0.35 s (p50), 2-3.3 s (p99), up to ~5 s under the soak's load on two cores, so a
record reaches a partition's log later than the join's default ``in_flight_margin_s`` (1 s)
assumes and seconds out of event-time order relative to other producers' records; the soak
then sets ``in_flight_margin_s`` 5 s and ``grace_s`` 6 s (``--in-flight-margin``, ``--grace``).
With the defaults on S3 storage a fault-free run found 2-5 wrong statuses per minute, every one
a reward the broker acknowledged 2-3 s after it was sent. The report gives the broker's
acknowledgement times and flags every wrong outcome one of whose rewards was acknowledged later
than the margin.

The checks, continuously (the live table's ``wrong status`` and ``overdue``) and at the end,
against the outcome a correct pipeline gives, computed from the produced events alone
(:mod:`benchmarks._soak_workload`): every good decision yields one distinct update (copies of
the same update are allowed: the learner dedupes them) whose ``join_status``, ``reward`` and
``reward_count`` are the expected ones; every bad record and every late reward is in the
dead-letter topic (matched by source topic, partition and offset) with a reason, and no good
record is; no update for anything but a good decision; the published posterior equals a
reference fold of the expected updates (``posterior_max_rel_err``; 0.0 in fault-free runs); no
worker crashed - a worker that exits by itself, or a traceback in any worker's log, is a crash.
Before the end checks, the records the broker acknowledged within 15 s before to 30 s after a
broker fault, and any it acknowledged without an offset, are looked up in their partition by
their bytes (``acked_checked_in_log``; ``acked_not_in_log``, ``acked_at_other_offset``: the
broker's own losses, which no worker can be blamed for; such records are left out of the
expected outcomes), and the topics the checks read are read once more from the start by a fresh
consumer (``reader_missed``).

At the end: tables (figures, bad records by kind, samples of every failure with expected vs
got, with when each event was sent, acknowledged and emitted, and the faults near it), a PNG
timeline of faults, lag and broker acknowledgement times in ``--out`` (default
``benchmarks/out``), and as the last line of stdout one JSON object: ``decisions``, ``faults``,
``lost``, ``wrong_status``, ``bad_records``, ``dead_lettered``, ``crashes`` and more
(``wrong_reward``, ``duplicates``, ``posterior_max_rel_err``, ...). ``--json PATH`` writes the
full summary with samples. Exit code 0 only when nothing was lost, no status or reward was
wrong, no update was unexpected, every bad record and late reward was dead-lettered and no good
record was, the posterior matches and no worker crashed.

Run from the repository root::

    .venv/bin/python benchmarks/soak.py                        # 15 minutes, 30 faults, 100,000 bad records
    .venv/bin/python benchmarks/soak.py --minutes 1 --bad-records 2000 --faults 4   # ~90 s
    make soak ARGS="--minutes 30 --seed 3"
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import heapq
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from rich.console import Console, Group  # noqa: E402
from rich.live import Live  # noqa: E402
from rich.table import Table  # noqa: E402

from banditstream.config import load_settings  # noqa: E402
from banditstream.devstack import LocalStack, StackError, StackInfo  # noqa: E402
from banditstream.workers import WorkerProcesses  # noqa: E402
from benchmarks._soak_fuzz import BadRecord, Fuzzer, kinds  # noqa: E402
from benchmarks._soak_stack import PersistentBroker  # noqa: E402
from benchmarks._soak_workload import (  # noqa: E402
    Decision,
    Reward,
    Workload,
    compare_posterior,
    domain_tree,
    reference_posterior,
)
from learner.store import ArmKey  # noqa: E402
from streams._join_state import JoinOptions  # noqa: E402
from streams.serde import AvroSerde  # noqa: E402
from streams.settings import KafkaSettings, TopicSettings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402

ROLES = ("join", "learn", "publish")
FAULT_KINDS = ("kill_join", "broker", "kill_learn", "kill_publish", "skew_burst")
FAULT_WEIGHTS = (0.35, 0.2, 0.2, 0.1, 0.15)
LIBRDKAFKA_QUIET = {"log_level": 2}  # broker restarts are the point: no FAIL lines on stderr
BAD_UPDATE_VERSION = "soak-bad"  # policy_version of the fuzzer's UpdateEvents
#: Reading a topic to its end: one fetch per partition lists every batch object of the
#: partition on S3 storage, so each fetch should bring back as much as it can.
_BIG_FETCHES = {"enable.partition.eof": True, "max.partition.fetch.bytes": 64 << 20, "fetch.max.bytes": 128 << 20}


@dataclass
class Options:
    minutes: float = 15.0
    seed: int = 1
    pairs_per_s: float = 150.0
    bad_records: int = 100_000
    faults: int = 30
    window_s: float = 4.0
    skew_s: float | None = None  # default: 0.6 x the join's default grace_s
    backlog: int | None = None  # default: a sixth of the live pairs, at most 20,000
    partitions: int = 4
    block_size: int = 256
    storage: str = "memory"  # memory (broker freezes) or s3 (broker restarts)
    #: The join's ``in_flight_margin_s``: how late a record may reach the broker's log after its
    #: producer stamped it. Default: the join's own (1 s) on memory storage; 5 s on S3 storage,
    #: whose acknowledgements take up to ~2.5 s (p99) and ~5 s (max) under the soak's load.
    in_flight_margin_s: float | None = None
    #: The join's ``grace_s``. Default: the join's own (2 s) on memory storage; 6 s on S3
    #: storage, whose acknowledgement times vary by seconds between producers, so records of a
    #: partition reach its log that far out of event-time order even from producers whose
    #: clocks agree.
    grace_s: float | None = None
    settle_s: float = 15.0
    json_path: Path | None = None
    out_dir: Path = Path(__file__).resolve().parent / "out"
    workdir: Path | None = None
    keep: bool = False

    @property
    def seconds(self) -> float:
        return self.minutes * 60.0


@dataclass
class Fault:
    at: float  # seconds after the start of live traffic
    kind: str
    pause: float
    started: float | None = None
    ended: float | None = None
    detail: str = ""


# -- the workers ---------------------------------------------------------------------------------


class Fleet:
    """The three workers, each role restartable; every incarnation logs to ``<role>-<n>.log``."""

    def __init__(self, workdir: Path, config: Path):
        self.procs = WorkerProcesses(workdir)
        self.workdir = workdir
        self.config = config
        self.lock = threading.RLock()
        self.current: dict[str, str] = {}
        self.incarnations: Counter = Counter()
        self.crashes: list[dict[str, Any]] = []
        self.shutdown_codes: dict[str, int | None] = {}

    def start(self, role: str) -> None:
        with self.lock:
            self.incarnations[role] += 1
            name = f"{role}-{self.incarnations[role]}"
            self.procs.start(name, self.config, command=role)
            self.current[role] = name

    def kill(self, role: str) -> str:
        """``kill -9`` the role's process group; returns the incarnation's name."""
        with self.lock:
            name = self.current.pop(role)
            process = self.procs.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        return name

    def check(self, elapsed: float) -> None:
        """A worker that ended by itself is a crash: recorded, and the role restarted."""
        with self.lock:
            for role, name in list(self.current.items()):
                process = self.procs.processes[name]
                if process.poll() is None:
                    continue
                self.procs.processes.pop(name)
                del self.current[role]
                self.crashes.append({"worker": name, "kind": "exit", "code": process.returncode, "at_s": round(elapsed, 1),
                                     "log_tail": _tail(self.workdir / f"{name}.log")})  # fmt: skip
                self.start(role)

    def metric(self, role: str, family: str) -> float:
        with self.lock:
            name = self.current.get(role)
        if name is None:
            return math.nan
        samples = self.procs.scrape(name).get(family)
        return math.nan if samples is None else float(sum(samples.values()))

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every worker, wait, record exit codes (non-zero: a crash), SIGKILL leftovers."""
        with self.lock:
            running = {name: self.procs.processes[name] for name in self.current.values()}
        for process in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, process in running.items():
            with contextlib.suppress(Exception):
                process.wait(max(0.1, deadline - time.monotonic()))
            self.shutdown_codes[name] = process.poll()
            if process.poll() not in (0, None):
                self.crashes.append({"worker": name, "kind": "shutdown", "code": process.returncode,
                                     "log_tail": _tail(self.workdir / f"{name}.log")})  # fmt: skip
            elif process.poll() is None:
                self.crashes.append({"worker": name, "kind": "shutdown", "code": None,
                                     "message": f"did not stop within {timeout:.0f}s of SIGTERM"})  # fmt: skip
        self.procs.stop()
        self.current.clear()

    def tracebacks(self) -> list[dict[str, Any]]:
        """Every traceback in every worker log: (worker, the exception line)."""
        found = []
        for log in sorted(self.workdir.glob("*-[0-9]*.log")):
            if not log.stem.split("-")[0] in ROLES:
                continue
            text = log.read_text(errors="replace")
            for block in text.split("Traceback (most recent call last):")[1:]:
                lines = [ln for ln in block.splitlines() if ln.strip()]
                exception = next((ln.strip() for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault)\b", ln)),
                                 lines[-1].strip() if lines else "?")  # fmt: skip
                found.append({"worker": log.stem, "kind": "traceback", "exception": exception[:300]})
        return found


def _tail(path: Path, n: int = 6) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-n:])[-1200:]
    except OSError:
        return ""


# -- what the pipeline wrote ---------------------------------------------------------------------


@dataclass(slots=True)
class SeenUpdate:
    partition: int
    offset: int
    status: str
    reward: float
    count: int
    arm: str
    probability: float
    features: np.ndarray
    produced_ms: int  # the UpdateEvent's record timestamp: when the join emitted it


def content_digest(key: bytes | None, value: bytes | None) -> bytes:
    """Identifies a record by its bytes: how a dead letter is matched to a record whose
    delivery report carried no offset (an idempotent retry after a broker restart)."""
    return hashlib.blake2b((b"\x00" if key is None else b"\x01" + key) + b"|" + (value or b""), digest_size=16).digest()


class Reader:
    """Reads the updates, dead-letter and posterior topics from the start, as they grow
    (assigned partitions, no group: a broker restart only makes it reconnect). Records are
    kept by (topic, partition, offset), so anything read twice counts once."""

    def __init__(self, kafka: KafkaSettings, topics: TopicSettings):
        self.kafka, self.topics = kafka, topics
        self.updates: dict[str, list[SeenUpdate]] = {}
        self.update_coords: set[tuple[int, int]] = set()
        self.seen: set[tuple[str, int, int]] = set()
        self.missing_sample: list[dict[str, Any]] = []
        self.unexpected: dict[str, tuple[int, int]] = {}
        self.dead: dict[tuple[str, int, int], tuple[str, str, str]] = {}
        self.dead_by_content: dict[tuple[str, int, bytes], tuple[str, str, str]] = {}
        self.dead_records = 0
        self.posterior: dict[ArmKey, dict[str, Any]] = {}
        self.posterior_at: dict[ArmKey, int] = {}
        self.posterior_records = 0
        self.errors: Counter = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="soak-reader", daemon=True)
        self.is_good: Any = None  # event_id -> bool, set by the soak

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)

    def sweep(self, timeout: float = 120.0) -> int:
        """Read every partition again from the start to its end with a fresh consumer; returns
        how many records the live reader had not seen (it should be none)."""
        before = len(self.update_coords) + self.dead_records + self.posterior_records
        self.stop.clear()
        self._read(sweep=True, timeout=timeout)
        return len(self.update_coords) + self.dead_records + self.posterior_records - before

    def _run(self) -> None:
        self._read(sweep=False)

    def verify(self, produced: list[tuple[str, Any]], windows: list[tuple[float, float]], timeout: float = 300.0) -> Counter:
        """Check that records the broker acknowledged are in their partition, at the offset the
        acknowledgement named, by reading the partition and comparing the bytes: every record
        acknowledged without an offset, and every one acknowledged within one of ``windows``
        (wall-time spans around the broker's faults; reading whole partitions back from S3
        storage takes minutes). A record found elsewhere in its partition gets that offset; one
        not found is marked undelivered (``failed``): no outcome may be expected from it. Returns
        counts: ``checked``, ``at_offset``, ``located`` (acknowledged without an offset),
        ``moved`` (found at another offset than acknowledged) and ``missing``."""
        def in_window(target) -> bool:
            return target.where[1] is None or any(lo <= target.acked <= hi for lo, hi in windows)

        by_partition: dict[tuple[str, int], list[Any]] = {}
        for topic, target in produced:
            if in_window(target):
                by_partition.setdefault((topic, target.where[0]), []).append(target)
        tally: Counter = Counter()
        for (topic, partition), targets in sorted(by_partition.items(), key=lambda item: item[0]):
            known = [t.where[1] for t in targets if t.where[1] is not None]
            # offset-less ones were acknowledged among their neighbours in time: read around those too
            for lone in (t for t in targets if t.where[1] is None):
                near = [o.where[1] for t, o in produced if t == topic and o.where is not None and o.where[0] == partition
                        and o.where[1] is not None and abs(o.acked - lone.acked) < 30]  # fmt: skip
                known.extend(near or [0])
            first, last = max(0, min(known) - 2000), max(known) + 2000
            at: dict[int, bytes] = {}
            where: dict[bytes, list[int]] = {}
            consumer = Consumer(self.kafka.consumer_config("soak-verify", **LIBRDKAFKA_QUIET, **_BIG_FETCHES))
            consumer.assign([TopicPartition(topic, partition, first)])
            deadline = time.monotonic() + timeout
            try:
                done = False
                while not done and time.monotonic() < deadline:
                    for message in consumer.consume(5000, 0.5):
                        if message.error() is not None:
                            done = done or message.error().code() == KafkaError._PARTITION_EOF
                            continue
                        digest = content_digest(message.key(), message.value())
                        at[message.offset()] = digest
                        where.setdefault(digest, []).append(message.offset())
                        done = done or message.offset() >= last
            finally:
                consumer.close()
            for target in targets:
                tally["checked"] += 1
                offset = target.where[1]
                if offset is not None and at.get(offset) == target.digest:
                    tally["at_offset"] += 1
                    continue
                found = [o for o in where.get(target.digest, ()) if o != offset]
                if found:
                    target.where = (partition, found[0])
                    tally["located" if offset is None else "moved"] += 1
                else:
                    target.where, target.failed = None, f"acknowledged at {topic}/{partition}/{offset}, not in the log"
                    tally["missing"] += 1
                    if len(self.missing_sample) < 10:
                        self.missing_sample.append({"topic": topic, "partition": partition, "acked_offset": offset,
                                                    "at_that_offset_now": "another record" if offset in at else "nothing",
                                                    "what": getattr(target, "event_id", None) or getattr(target, "reward_id", None)
                                                    or getattr(target, "kind", "?")})  # fmt: skip
        return tally

    def _read(self, *, sweep: bool, timeout: float = 0.0) -> None:
        serdes = {
            self.topics.updates: AvroSerde("update", framing="single_object", max_payload_bytes=8_000_000),
            self.topics.deadletter: AvroSerde("deadletter", framing="single_object", max_payload_bytes=16_000_000),
            self.topics.posterior: AvroSerde("posterior", framing="single_object", max_payload_bytes=16_000_000),
        }
        consumer = Consumer(self.kafka.consumer_config("soak-reader", **LIBRDKAFKA_QUIET,
                                                      **(_BIG_FETCHES if sweep else {"fetch.wait.max.ms": 100})))  # fmt: skip
        partitions = (
            [TopicPartition(self.topics.updates, p, OFFSET_BEGINNING) for p in range(self.topics.update_partitions)]
            + [TopicPartition(self.topics.posterior, p, OFFSET_BEGINNING) for p in range(self.topics.update_partitions)]
            + [TopicPartition(self.topics.deadletter, 0, OFFSET_BEGINNING)]
        )
        consumer.assign(partitions)
        at_end: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout
        seen = self.seen
        try:
            while not self.stop.is_set():
                if sweep and (len(at_end) == len(partitions) or time.monotonic() > deadline):
                    break
                for message in consumer.consume(2000, 0.2):
                    if message.error() is not None:
                        if message.error().code() == KafkaError._PARTITION_EOF:
                            at_end.add((message.topic(), message.partition()))
                        else:
                            self.errors[message.error().name()] += 1
                        continue
                    topic = message.topic()
                    at_end.discard((topic, message.partition()))
                    where = (topic, message.partition(), message.offset())
                    if where in seen:  # read again (a reconnect, the sweep): counted once
                        continue
                    seen.add(where)
                    try:
                        record = serdes[topic].decode(message.value())
                    except Exception:  # noqa: BLE001 - the fuzzer's garbage on the updates topic
                        continue
                    if topic == self.topics.updates:
                        self._update(record, message.partition(), message.offset(), message.timestamp()[1])
                    elif topic == self.topics.deadletter:
                        self.dead_records += 1
                        where = (record["source_topic"], record["source_partition"], record["source_offset"])
                        what = (record["reason"], record["worker"], record["message"][:200], where)
                        self.dead.setdefault(where, what)
                        digest = content_digest(record["key"], record["value"])
                        self.dead_by_content.setdefault((record["source_topic"], record["source_partition"], digest), what)
                    else:
                        self.posterior_records += 1
                        key = ArmKey(record["tenant"], record["workspace"], record["domain"], record["arm"])
                        if message.offset() >= self.posterior_at.get(key, -1):  # the latest per key, as compaction keeps
                            self.posterior[key] = record
                            self.posterior_at[key] = message.offset()
        finally:
            consumer.close()

    def _update(self, record: dict[str, Any], partition: int, offset: int, produced_ms: int) -> None:
        event_id = record["event_id"]
        if record["policy_version"] == BAD_UPDATE_VERSION:
            return  # the fuzzer's own records on the updates topic, not the join's
        self.update_coords.add((partition, offset))
        if not self.is_good(event_id):
            self.unexpected.setdefault(event_id, (partition, offset))
            return
        seen = SeenUpdate(partition, offset, record["join_status"], float(record["reward"]), int(record["reward_count"]),
                          record["arm"], float(record["probability"]), np.asarray(record["features"], dtype=np.float64),
                          produced_ms)  # fmt: skip
        self.updates.setdefault(event_id, []).append(seen)


# -- producing -----------------------------------------------------------------------------------


@dataclass(slots=True)
class BadSent:
    kind: str
    topic: str
    target: str | None
    digest: bytes = b""
    where: tuple[int, int | None] | None = None  # (partition, offset); offset None if not reported
    failed: str | None = None
    acked: float = 0.0


class Driver:
    """Produces the backlog, the live and skewed traffic, the rewards when their time comes,
    duplicates, bursts and the fuzzer's bad records (one thread, one producer per source)."""

    DUP_RATE = 0.02
    SKEWED_SHARE = 0.15

    def __init__(self, o: Options, kafka: KafkaSettings, topics: TopicSettings, workload: Workload, skew_ms: int):
        self.o, self.topics, self.workload, self.skew_ms = o, topics, workload, skew_ms
        # One S3 object per produce request and partition, and every fetch of a partition lists
        # all of them: on S3 storage the producers linger 0.5 s (inside the join's margin) so a
        # 15-minute run leaves ~5,000 objects per partition instead of ~27,000.
        linger = 500 if o.storage == "s3" else 50
        config = kafka.producer_config(**LIBRDKAFKA_QUIET, **{"linger.ms": linger, "message.timeout.ms": 600_000})
        self.producers = {name: Producer(config) for name in ("live", "skewed", "backlog", "bad")}
        self.serdes = {"decisions": AvroSerde("decision", framing="single_object"),
                       "rewards": AvroSerde("reward", framing="single_object")}  # fmt: skip
        self.rng = np.random.default_rng(o.seed + 1)
        self.decisions: list[Decision] = []
        self.by_id: dict[str, Decision] = {}
        self.bad: list[BadSent] = []
        self.dups: list[BadSent] = []
        #: copies to send again once their original is acknowledged (role, key, value)
        self.dups_ready: deque[tuple[str, bytes | None, bytes]] = deque()
        self.rewards_heap: list[tuple[float, int, str, str, bytes, Reward]] = []
        self.seq = 0
        self.recent: deque[Decision] = deque()
        self.bursts: deque[int] = deque()
        self.fuzzer = Fuzzer(workload, o.partitions, o.partitions, o.seed, self._recent_target)
        self.stop = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._guarded, name="soak-driver", daemon=True)
        self.t0 = 0.0
        self.sent = Counter()
        #: (wall time of the delivery report, seconds since produce) of every record: the broker's part
        self.ack_latency: list[tuple[float, float]] = []

    # -- callbacks --------------------------------------------------------------------------

    def _placed(self, target, digest: bytes):
        sent = time.time()

        def on_delivery(error, message):
            now = time.time()
            self.ack_latency.append((now, now - sent))
            if error is not None:
                target.failed = error.str()
                return
            offset = message.offset()
            target.digest = digest
            target.where = (message.partition(), offset if offset is not None and offset >= 0 else None)
            target.acked = now

        return on_delivery

    def produced(self) -> list[tuple[str, Any]]:
        """(topic, target) of every record the broker acknowledged."""
        roles = {"decisions": self.topics.decisions, "rewards": self.topics.rewards, "updates": self.topics.updates}
        out = []
        for d in self.decisions:
            if d.where is not None:
                out.append((self.topics.decisions, d))
            out.extend((self.topics.rewards, r) for r in d.rewards if r.where is not None)
        out.extend((roles[b.topic], b) for b in [*self.bad, *self.dups] if b.where is not None)
        return out

    def _send(self, producer: str, role: str, key: bytes | None, value: bytes, target, partition: int | None = None) -> None:
        topic = self.topics.decisions if role == "decisions" else self.topics.rewards if role == "rewards" else self.topics.updates
        p = self.producers[producer]
        kwargs = {} if partition is None else {"partition": partition}
        on_delivery = self._placed(target, content_digest(key, value))
        if producer != "bad" and self.rng.random() < self.DUP_RATE:
            # The same record again once the broker has it, as a retry or a spool drain sends
            # it (never re-duplicated). Sent at once from an idle producer, a copy overtook its
            # loaded producer's queue by seconds: disorder past any grace, which no service
            # re-sending its own events produces.
            placed = on_delivery

            def on_delivery(error, message, placed=placed):
                placed(error, message)
                if error is None:
                    self.dups_ready.append((role, key, value))

        while True:
            try:
                p.produce(topic, value=value, key=key, on_delivery=on_delivery, **kwargs)
                break
            except BufferError:
                p.poll(0.05)
        self.sent[role] += 1

    def _send_ready_dups(self) -> None:
        """Send the copies whose originals were acknowledged since the last call."""
        while self.dups_ready:
            role, key, value = self.dups_ready.popleft()
            dup = BadSent("duplicate", role, None, content_digest(key, value))
            self.dups.append(dup)
            self._send("bad", role, key, value, dup)

    # -- good events ------------------------------------------------------------------------

    def _decide(self, source: str, ts: int, producer: str, shift_ms: int) -> None:
        """One decision now (stamped ``ts``) and its rewards: sent when their stamp + shift comes."""
        d, record = self.workload.decision(source, ts)
        d.sent_wall = time.time()
        self.decisions.append(d)
        self.by_id[d.event_id] = d
        self._send(producer, "decisions", d.event_id.encode(), self.serdes["decisions"].encode(record), d)
        final = d.sent_wall
        for ts_r, reward_record in self.workload.plan_rewards(d, record):
            reward = next(r for r in d.rewards if r.reward_id == reward_record["reward_id"])
            send_at = (ts_r + shift_ms) / 1000.0
            final = max(final, send_at)
            self.seq += 1
            heapq.heappush(self.rewards_heap, (send_at, self.seq, producer, d.event_id,
                                               self.serdes["rewards"].encode(reward_record), reward))  # fmt: skip
        d.final_wall = final + 0.5
        if source == "live":
            self.recent.append(d)

    def _send_due_rewards(self, now: float | None) -> None:
        heap = self.rewards_heap
        while heap and (now is None or heap[0][0] <= now):
            _, _, producer, event_id, value, reward = heapq.heappop(heap)
            self._send(producer, "rewards", event_id.encode(), value, reward)

    def _recent_target(self, now_ms: int) -> Decision | None:
        """A good live decision whose window stays open for at least 800 ms more."""
        horizon = now_ms - self.workload.window_ms + 800
        while self.recent and self.recent[0].ts < horizon:
            self.recent.popleft()
        if not self.recent:
            return None
        return self.recent[int(self.rng.integers(len(self.recent)))]

    def backlog(self, pairs: int) -> None:
        """Pairs stamped an hour ago, produced at full speed in event-time order (decisions
        and rewards interleaved by timestamp, as a spool drains)."""
        start = int(time.time() * 1000) - 3_600_000
        step = 1000.0 / self.o.pairs_per_s
        for i in range(pairs):
            ts = start + int(i * step)
            self._send_due_rewards(ts / 1000.0)  # the backlog's rewards stamped before this decision
            self._decide("backlog", ts, "backlog", 0)
            if i % 1000 == 0:
                self.producers["backlog"].poll(0)
                self._send_ready_dups()
        self._send_due_rewards(None)
        self.producers["backlog"].flush(300)
        self._send_ready_dups()
        self.producers["bad"].flush(300)

    # -- the loop ---------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the soak
            self.error = exc
        finally:
            self.done.set()

    def _run(self) -> None:
        o = self.o
        self.t0 = time.time()
        tail = self.workload.window_ms / 1000.0 + 3.5 + self.skew_ms / 1000.0
        produce_for = max(5.0, o.seconds - tail)
        made = bad_made = 0
        while not self.stop.is_set():
            now = time.time()
            elapsed = now - self.t0
            if elapsed < produce_for:
                due = int(elapsed * o.pairs_per_s) - made
                for _ in range(due):
                    if self.rng.random() < self.SKEWED_SHARE:
                        self._decide("skewed", int(now * 1000) - self.skew_ms, "skewed", self.skew_ms)
                    else:
                        self._decide("live", int(now * 1000), "live", 0)
                    made += 1
                bad_due = int(elapsed / produce_for * o.bad_records) - bad_made
                for _ in range(bad_due):
                    self._bad(int(now * 1000))
                    bad_made += 1
                while self.bursts:
                    n = self.bursts.popleft()
                    for k in range(n):
                        self._decide("burst", int(now * 1000) - self.skew_ms - int(300 * k / n), "skewed", self.skew_ms)
            else:
                while bad_made < o.bad_records:  # the rounding's remainder
                    self._bad(int(now * 1000))
                    bad_made += 1
                if not self.rewards_heap:
                    break
            self._send_due_rewards(now)
            for p in self.producers.values():
                p.poll(0)
            self._send_ready_dups()
            time.sleep(0.01)
        self._send_due_rewards(None)
        for p in self.producers.values():
            p.flush(300)
        self._send_ready_dups()
        self.producers["bad"].flush(300)

    def _bad(self, now_ms: int) -> None:
        record: BadRecord = self.fuzzer.next(now_ms)
        sent = BadSent(record.kind, record.role, record.target, content_digest(record.key, record.value))
        self.bad.append(sent)
        self._send("bad", record.role, record.key, record.value, sent, partition=record.partition)


# -- the soak ------------------------------------------------------------------------------------


class Soak:
    def __init__(self, o: Options, console: Console, report: Console):
        self.o = o
        self.console = console  # progress (stderr)
        self.report = report  # results (stdout)
        self.workdir = Path(o.workdir or tempfile.mkdtemp(prefix="banditstream-soak-")).absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.faults: list[Fault] = []
        self.timeline: list[dict[str, float]] = []
        self.live_wrong: list[dict[str, Any]] = []
        self.live_checked = 0
        self.overdue = 0
        self.harness_errors: list[str] = []
        defaults = JoinOptions()
        s3 = o.storage == "s3"
        self.margin_s = o.in_flight_margin_s if o.in_flight_margin_s is not None else (
            max(5.0, defaults.in_flight_margin_s) if s3 else defaults.in_flight_margin_s)
        default_grace = getattr(defaults, "grace_s", 0.0)  # a join without grace_s: none
        self.grace_s = o.grace_s if o.grace_s is not None else (max(6.0, default_grace) if s3 and default_grace else default_grace)
        self.skew_ms = int(1000 * (o.skew_s if o.skew_s is not None else (0.6 * default_grace if default_grace else 1.0)))

    # -- set-up -----------------------------------------------------------------------------

    def _join_options(self) -> dict[str, Any]:
        """The join's options the soak sets (those this version of the join knows)."""
        known = {f.name for f in fields(JoinOptions)}
        options: dict[str, Any] = {"sweep_interval_s": 0.2, "in_flight_margin_s": self.margin_s, "grace_s": self.grace_s}
        return {k: v for k, v in options.items() if k in known}

    def _config(self, bootstrap: str) -> Path:
        from publisher.cli_ops import generate_keys

        keys = self.workdir / "keys"
        generate_keys(keys, overwrite=True)
        join_options = self._join_options()
        tree = {
            "kafka": {"bootstrap_servers": bootstrap, "profile": "tansu"},
            "topics": self.topics.model_dump(),
            "stores": {"state_dir": str(self.workdir / "state"), "snapshots": str(self.workdir / "snapshots")},
            "publish": {"keys_dir": str(keys), "every_updates": 100_000, "every_seconds": 1.0, "on_drift": "flag"},
            "join": join_options,
            "learn": {"emit_every_s": 0.5, "block_size": self.o.block_size},
            "domains": domain_tree(self.o.window_s, self.o.seed),
        }
        path = self.workdir / "banditstream.json"
        path.write_text(json.dumps(tree, indent=2))
        self.settings = load_settings(path, env={})
        return path

    def run(self) -> tuple[dict[str, Any], int]:
        o = self.o
        self.topics = TopicSettings(partitions=o.partitions, update_partitions=o.partitions)
        skew_s = self.skew_ms / 1000
        backlog = o.backlog if o.backlog is not None else int(min(20_000, o.pairs_per_s * o.seconds / 6))
        s3_stack = LocalStack(self.workdir / "s3", broker=False, s3=True) if o.storage == "s3" else None
        fleet = reader = driver = broker = None
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        try:
            with self.console.status("starting S3 and the broker…"):
                s3_info = _up_with_retries(s3_stack) if s3_stack else None
                broker = PersistentBroker(self.workdir, s3_info)
                broker.start()
            self.broker = broker
            self.kafka = KafkaSettings(bootstrap_servers=broker.bootstrap, profile="tansu")
            config = self._config(broker.bootstrap)
            ensure_topics(self.kafka, self.topics)
            fleet = Fleet(self.workdir, config)
            for role in ROLES:
                fleet.start(role)
            settings = dict(self.settings.domains)
            workload = Workload(settings, int(o.window_s * 1000), o.seed)
            driver = Driver(o, self.kafka, self.topics, workload, self.skew_ms)
            reader = Reader(self.kafka, self.topics)
            reader.is_good = driver.by_id.__contains__
            reader.start()
            self.console.print(
                f"broker {broker.bootstrap} ({'S3 storage: restarts' if broker.persistent else 'memory storage: freezes'}), "
                f"workdir {self.workdir}; window {o.window_s:g}s, grace {self.grace_s:g}s, in-flight margin "
                f"{self.margin_s:g}s, skew {skew_s:g}s, backlog {backlog:,} pairs", highlight=False)  # fmt: skip
            with self.console.status(f"producing the backlog ({backlog:,} pairs stamped an hour ago)…"):
                driver.backlog(backlog)
            self.faults = self._schedule(broker.persistent)
            started = time.time()
            driver.start()
            injector = threading.Thread(target=self._inject, args=(fleet, driver, broker, started), daemon=True)
            injector.start()
            self._monitor(fleet, driver, reader, started, workload)
            injector.join(120)
            if driver.error is not None:
                raise driver.error
            summary = self._final(fleet, driver, reader, workload, settings, started)
        finally:
            if reader is not None:
                reader.close()
            if fleet is not None and fleet.current:
                fleet.stop()
            if broker is not None:
                broker.stop()
            if s3_stack is not None:
                s3_stack.down()
            signal.signal(signal.SIGTERM, previous)
        code = 0 if summary["ok"] else 1
        self._print(summary)
        return summary, code

    # -- faults -----------------------------------------------------------------------------

    def _schedule(self, persistent: bool) -> list[Fault]:
        o = self.o
        rng = np.random.default_rng(o.seed + 2)
        tail = o.window_s + 3.5 + self.skew_ms / 1000.0
        span = max(5.0, o.seconds - tail)
        times = sorted(rng.uniform(0.1 * span, 0.8 * span, o.faults))
        chosen = list(FAULT_KINDS[: min(o.faults, len(FAULT_KINDS))])
        rng.shuffle(chosen)
        while len(chosen) < o.faults:
            chosen.append(FAULT_KINDS[int(rng.choice(len(FAULT_KINDS), p=FAULT_WEIGHTS))])
        out = []
        for at, kind in zip(times, chosen):
            if kind == "broker":
                kind = "broker_restart" if persistent else "broker_freeze"
            if kind.startswith("kill_"):
                pause = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.5, 5.0))
            elif kind == "broker_restart":
                pause = float(rng.uniform(0.0, 3.0))
            elif kind == "broker_freeze":
                pause = float(rng.uniform(10.0, 20.0))
            else:
                pause = 0.0
            out.append(Fault(float(at), kind, pause))
        return out

    def _inject(self, fleet: Fleet, driver: Driver, broker: PersistentBroker, started: float) -> None:
        for fault in self.faults:
            while time.time() - started < fault.at:
                if driver.done.is_set():
                    return
                time.sleep(0.05)
            fault.started = time.time() - started
            try:
                if fault.kind.startswith("kill_"):
                    role = fault.kind[len("kill_"):]
                    name = fleet.kill(role)
                    time.sleep(fault.pause)
                    fleet.start(role)
                    fault.detail = f"{name} killed, restarted after {fault.pause:.1f}s"
                elif fault.kind == "broker_restart":
                    broker.restart(fault.pause)
                    fault.detail = f"kill -9, restarted after {fault.pause:.1f}s"
                elif fault.kind == "broker_freeze":
                    broker.freeze(fault.pause)
                    fault.detail = f"SIGSTOP for {fault.pause:.1f}s"
                else:
                    n = max(50, int(3 * self.o.pairs_per_s))
                    driver.bursts.append(n)
                    fault.detail = f"{n} pairs stamped {self.skew_ms / 1000:g}s in the past at full speed"
            except Exception as exc:  # noqa: BLE001 - the soak goes on; the report says so
                fault.detail = f"FAILED: {exc}"
                self.harness_errors.append(f"fault {fault.kind} at {fault.at:.1f}s: {exc}")
            fault.ended = time.time() - started

    # -- watching ---------------------------------------------------------------------------

    def _monitor(self, fleet: Fleet, driver: Driver, reader: Reader, started: float, workload: Workload) -> None:
        pointer = ack_seen = 0
        pending: dict[str, Decision] = {}
        last_sample = 0.0
        with Live(self._view(fleet, driver, reader, started), console=self.console, refresh_per_second=2, transient=False) as live:
            while not driver.done.is_set():
                now = time.time()
                fleet.check(now - started)
                pointer = self._check_live(driver, reader, workload, pending, pointer, now)
                if now - last_sample >= 1.0:
                    last_sample = now
                    acks = driver.ack_latency[ack_seen:]
                    ack_seen += len(acks)
                    self.timeline.append({
                        "ack_max_s": max((lat for _, lat in acks), default=0.0),
                        "t": now - started, "join_lag": fleet.metric("join", "banditstream_consumer_lag"),
                        "learn_lag": fleet.metric("learn", "banditstream_consumer_lag"), "overdue": self.overdue,
                        "decisions": len(driver.decisions), "updates": len(reader.updates), "dead": len(reader.dead),
                    })  # fmt: skip
                    live.update(self._view(fleet, driver, reader, started))
                time.sleep(0.25)
        self._pending_live = pending

    def _check_live(self, driver: Driver, reader: Reader, workload: Workload, pending: dict, pointer: int, now: float) -> int:
        """Decisions whose rewards have all been sent and delivered get their expected
        outcome; those whose update came are compared at once."""
        decisions = driver.decisions
        while pointer < len(decisions):
            d = decisions[pointer]
            if d.final_wall > now or (d.where is None and d.failed is None):
                break
            if any(r.where is None and r.failed is None for r in d.rewards):
                break
            if d.where is not None:
                d.expected = workload.expected(d)
                pending[d.event_id] = d
            pointer += 1
        overdue = 0
        for event_id in list(pending):
            d = pending[event_id]
            seen = reader.updates.get(event_id)
            if seen:
                del pending[event_id]
                self.live_checked += 1
                if any(s.status != d.expected[0] for s in seen):
                    self.live_wrong.append({"event_id": event_id, "expected": d.expected[0], "got": [s.status for s in seen]})
            elif now > d.final_wall + workload.window_ms / 1000 + self.grace_s + 15:
                overdue += 1
        self.overdue = overdue
        return pointer

    def _view(self, fleet: Fleet, driver: Driver, reader: Reader, started: float) -> Group:
        elapsed = time.time() - started
        done = sum(1 for f in self.faults if f.ended is not None)
        head = Table.grid(padding=(0, 2))
        head.add_row(
            f"elapsed [bold]{elapsed:,.0f}[/]/{self.o.seconds:,.0f} s",
            f"decisions [bold]{len(driver.decisions):,}[/]",
            f"updates [bold]{len(reader.updates):,}[/]",
            f"dead letters [bold]{len(reader.dead):,}[/] (bad sent {len(driver.bad):,})",
            f"faults [bold]{done}[/]/{len(self.faults)}",
        )
        lag = Table.grid(padding=(0, 2))
        last = self.timeline[-1] if self.timeline else {}
        lag.add_row(
            f"join lag {_fmt(last.get('join_lag'))}",
            f"learner lag {_fmt(last.get('learn_lag'))}",
            f"overdue {self.overdue:,}",
            f"checked {self.live_checked:,}",
            f"wrong status [bold {'red' if self.live_wrong else 'green'}]{len(self.live_wrong):,}[/]",
            f"crashes [bold {'red' if fleet.crashes else 'green'}]{len(fleet.crashes)}[/]",
        )
        recent = Table("at s", "fault", "detail", box=None)
        for f in [f for f in self.faults if f.started is not None][-4:]:
            recent.add_row(f"{f.started:.0f}", f.kind, f.detail)
        return Group(head, lag, recent)

    # -- the end ----------------------------------------------------------------------------

    def _settle(self, fleet: Fleet, driver: Driver, reader: Reader, workload: Workload, settings, started: float) -> None:
        """Wait until every expected outcome is in (or nothing changes for ``settle_s``)."""
        good = [d for d in driver.decisions if d.where is not None]
        bad_where = {(self._topic(b.topic), *b.where) for b in driver.bad if b.where is not None}
        deadline = time.time() + max(300.0, 4 * self.o.settle_s)  # while progress is made
        last_change, last_sig, posterior = time.time(), None, None
        with self.console.status("settling: waiting for the last updates, dead letters and posterior…") as status:
            while time.time() < deadline:
                fleet.check(time.time() - started)
                missing = sum(1 for d in good if d.event_id not in reader.updates)
                undead = len(bad_where - reader.dead.keys())
                sig = (len(reader.update_coords), len(reader.dead), reader.posterior_records)
                if sig != last_sig:
                    last_sig, last_change = sig, time.time()
                if missing == 0 and undead == 0:
                    posterior = self._posterior(driver, reader, settings)
                    if not posterior["mismatched"] and not posterior["unexpected_models"]:
                        break
                status.update(f"settling: {missing:,} updates and {undead:,} dead letters missing; "
                              f"{time.time() - last_change:.0f}s without change")  # fmt: skip
                if time.time() - last_change > self.o.settle_s:
                    break
                time.sleep(1.0)

    def _topic(self, role: str) -> str:
        return {"decisions": self.topics.decisions, "rewards": self.topics.rewards, "updates": self.topics.updates}[role]

    def _posterior(self, driver: Driver, reader: Reader, settings) -> dict:
        for d in driver.decisions:
            if d.where is not None and d.expected is None:
                d.expected = driver.workload.expected(d)
        first_seen = {eid: min((s.partition, s.offset) for s in seen) for eid, seen in reader.updates.items()}
        reference = reference_posterior(driver.decisions, first_seen, settings, self.o.block_size, self.topics.update_partitions)
        return compare_posterior(dict(reader.posterior), reference, settings)

    def _final(self, fleet: Fleet, driver: Driver, reader: Reader, workload: Workload, settings, started: float) -> dict:
        self._settle(fleet, driver, reader, workload, settings, started)
        lag = fleet.metric("join", "banditstream_consumer_lag")
        self.lag_at_end = None if math.isnan(lag) else lag
        fleet.stop()
        time.sleep(1.0)  # the reader sees what the workers flushed on their way out
        reader.close()
        with self.console.status("reading the outputs again from the start…"):
            self.reader_missed = reader.sweep()  # a fresh read of everything: the checks never rest on a reader glitch
        produced = driver.produced()
        self.acked_without_offset = sum(1 for _, t in produced if t.where[1] is None)
        windows = [(started + f.started - 15, started + (f.ended or f.started) + 30) for f in self.faults
                   if f.kind.startswith("broker") and f.started is not None]  # fmt: skip
        with self.console.status("checking that the records acknowledged around broker faults are in the log…"):
            self.log_check = reader.verify(produced, windows)
        for d in driver.decisions:  # what a correct pipeline gives, now every record's fate is known
            d.expected = workload.expected(d) if d.where is not None else None
        posterior = self._posterior(driver, reader, settings)
        crashes = _merge_crashes(fleet.crashes, fleet.tracebacks())
        o = self.o
        fault_times = [(f.started or f.at, f.kind) for f in self.faults]

        def near_faults(d: Decision) -> list[str]:
            t = d.sent_wall - started
            return [f"{k}@{a:.0f}s" for a, k in fault_times if t - 15 <= a <= t + o.window_s + self.grace_s + 5]

        good = [d for d in driver.decisions if d.where is not None]
        lost, wrong_status, wrong_reward, wrong_fields, conflicting = [], [], [], [], 0
        slow_ack = 0
        margin = self.margin_s
        lost_when: Counter = Counter()  # (decisions partition, minute of the run) -> decisions lost
        duplicates = 0
        by_source: dict[str, Counter] = {}
        for d in good:
            exp_status, exp_reward, exp_count = d.expected or workload.expected(d)
            seen = reader.updates.get(d.event_id, [])
            tally = by_source.setdefault(d.source, Counter())
            tally["decisions"] += 1
            shift = self.skew_ms if d.source in ("skewed", "burst") else 0
            sample = {"event_id": d.event_id, "source": d.source, "domain": d.domain, "decision_ts": d.ts,
                      "decided_at_s": round(d.sent_wall - started, 2),
                      "expected": exp_status, "expected_reward": round(exp_reward, 6), "expected_count": exp_count,
                      "rewards": [{"ts": r.ts, "offset_ms": r.ts - d.ts, "late": r.late, "delivered": r.where is not None,
                                   "sent_at_s": round(max((r.ts + shift) / 1000, d.sent_wall) - started, 2),
                                   "acked_at_s": round(r.acked - started, 2)}
                                  for r in d.rewards],
                      "decision_acked_at_s": round(d.acked - started, 2),
                      "emitted_at_s": [round(u.produced_ms / 1000 - started, 2) for u in seen],
                      "partition": d.where[0], "faults_near": near_faults(d),
                      # a reward the broker acknowledged later than the join's in-flight margin after it
                      # was sent: the join's assumption may not have held for it
                      "reward_acked_past_margin": any(
                          r.acked - max((r.ts + shift) / 1000, d.sent_wall) > margin for r in d.rewards if not r.late)}  # fmt: skip
            if not seen:
                lost.append(sample)
                tally["lost"] += 1
                lost_when[(d.where[0], int((d.sent_wall - started) // 60))] += 1
                continue
            duplicates += len(seen) - 1
            if len({(s.status, s.reward, s.count) for s in seen}) > 1:
                conflicting += 1
            wrong = any(s.status != exp_status or abs(s.reward - exp_reward) > 1e-9 * (1 + abs(exp_reward)) or s.count != exp_count
                        for s in seen)  # fmt: skip
            slow_ack += wrong and sample["reward_acked_past_margin"]
            if any(s.status != exp_status for s in seen):
                wrong_status.append({**sample, "got": [s.status for s in seen], "got_reward": [round(s.reward, 6) for s in seen],
                                     "got_count": [s.count for s in seen]})  # fmt: skip
                tally["wrong_status"] += 1
            elif any(abs(s.reward - exp_reward) > 1e-9 * (1 + abs(exp_reward)) or s.count != exp_count for s in seen):
                wrong_reward.append({**sample, "got": [s.status for s in seen], "got_reward": [round(s.reward, 6) for s in seen],
                                     "got_count": [s.count for s in seen]})  # fmt: skip
                tally["wrong_reward"] += 1
            first = seen[0]
            if first.arm != d.arm or abs(first.probability - d.probability) > 1e-12 or not np.allclose(first.features, d.features, rtol=1e-12, atol=1e-12):
                wrong_fields.append({"event_id": d.event_id, "arm": (first.arm, d.arm), "probability": (first.probability, d.probability)})

        # dead letters, matched by source coordinates
        coords: dict[tuple[str, int, int], tuple[str, Any]] = {}
        for d in driver.decisions:
            if d.where is not None:
                coords[(self.topics.decisions, *d.where)] = ("decision", d)
            for r in d.rewards:
                if r.where is not None:  # a reward whose decision never reached the log has nothing to join
                    tag = "late_reward" if r.late else "reward" if d.where is not None else "orphaned"
                    coords[(self.topics.rewards, *r.where)] = (tag, (r, d))
        for b in driver.dups:
            if b.where is not None:
                coords[(self._topic(b.topic), *b.where)] = ("duplicate", b)
        per_kind: dict[str, dict[str, Any]] = {k: {"sent": 0, "dead_lettered": 0, "reasons": Counter(), "missing": []} for k in kinds()}
        bad_sent = bad_dead = 0
        for b in driver.bad:
            if b.where is None:
                continue
            where = (self._topic(b.topic), *b.where)
            coords[where] = ("bad", b)
            entry = per_kind[b.kind]
            entry["sent"] += 1
            bad_sent += 1
            dead = reader.dead.get(where) or reader.dead_by_content.get((where[0], where[1], b.digest))
            if dead is not None:
                entry["dead_lettered"] += 1
                bad_dead += 1
                entry["reasons"][dead[0]] += 1
            elif len(entry["missing"]) < 5:
                t = b.acked - started
                entry["missing"].append({"topic": where[0], "partition": where[1], "offset": where[2], "target": b.target,
                                         "acked_at_s": round(t, 2),
                                         "faults_near": [f"{k}@{a:.0f}s" for a, k in fault_times if t - 20 <= a <= t + 10]})  # fmt: skip
        good_dead, late_missing, unknown_dead = [], [], 0
        late_total = late_dead = 0
        dup_dead: Counter = Counter()
        for where, (reason, worker, message, _) in reader.dead.items():
            tag = coords.get(where)
            if tag is None:
                unknown_dead += 1
            elif tag[0] in ("decision", "reward"):
                d = tag[1] if tag[0] == "decision" else tag[1][1]
                good_dead.append({"record": tag[0], "event_id": d.event_id, "source": d.source, "reason": reason,
                                  "worker": worker, "message": message, "faults_near": near_faults(d)})  # fmt: skip
            elif tag[0] == "duplicate":
                dup_dead[reason] += 1
        for d in driver.decisions:
            for r in d.rewards:
                if r.late and r.where is not None:
                    late_total += 1
                    if (self.topics.rewards, *r.where) in reader.dead:
                        late_dead += 1
                    elif len(late_missing) < 10:
                        late_missing.append({"event_id": d.event_id, "reward_id": r.reward_id, "offset_ms": r.ts - d.ts})
        unexpected = [{"event_id": e, "partition": p, "offset": off} for e, (p, off) in reader.unexpected.items()]
        undelivered = sum(1 for d in driver.decisions if d.failed) + sum(1 for b in driver.bad if b.failed)
        late_not_dead = late_total - late_dead
        ok = (not lost and not wrong_status and not wrong_reward and not crashes and bad_dead == bad_sent
              and not unexpected and not good_dead and late_not_dead == 0 and not posterior["mismatched"]
              and not posterior["unexpected_models"] and not self.harness_errors)  # fmt: skip
        return {
            "decisions": len(good),
            "faults": sum(1 for f in self.faults if f.ended is not None and not f.detail.startswith("FAILED")),
            "lost": len(lost),
            "wrong_status": len(wrong_status),
            "bad_records": bad_sent,
            "dead_lettered": bad_dead,
            "crashes": len(crashes),
            "wrong_reward": len(wrong_reward),
            "wrong_fields": len(wrong_fields),
            "unexpected_updates": len(unexpected),
            "good_dead_lettered": len(good_dead),
            "late_rewards": late_total,
            "late_dead_lettered": late_dead,
            "duplicates": duplicates,
            "conflicting_duplicates": conflicting,
            "duplicates_sent": sum(1 for b in driver.dups if b.where is not None),
            "duplicates_dead_lettered": sum(dup_dead.values()),
            "delivered_without_offset": self.acked_without_offset,
            "unknown_dead_letters": unknown_dead,
            "reader_missed": self.reader_missed,
            "join_lag_at_end": self.lag_at_end,
            **_ack_figures(driver.ack_latency, started, self.margin_s),
            "wrong_with_slow_ack": slow_ack,
            "acked_not_in_log": self.log_check["missing"],
            "acked_at_other_offset": self.log_check["moved"],
            "acked_checked_in_log": self.log_check["checked"],
            "undelivered": undelivered,
            "posterior_models": posterior["models"],
            "posterior_mismatched": len(posterior["mismatched"]),
            "posterior_max_rel_err": posterior["max_rel_err"],
            "minutes": self.o.minutes,
            "seed": self.o.seed,
            "storage": self.o.storage,
            "window_s": self.o.window_s,
            "grace_s": self.grace_s,
            "skew_s": self.skew_ms / 1000,
            "in_flight_margin_s": self.margin_s,
            "by_source": {k: dict(v) for k, v in by_source.items()},
            "wall_s": round(time.time() - started, 1),
            "ok": ok,
            # details, for the tables and --json
            "_samples": {
                "lost": _per_source(lost), "wrong_status": _per_source(wrong_status), "wrong_reward": _per_source(wrong_reward),
                "wrong_fields": wrong_fields[:10], "unexpected_updates": unexpected[:10], "good_dead_lettered": good_dead[:20],
                "late_not_dead_lettered": late_missing, "posterior_mismatched": posterior["mismatched"][:20],
                "posterior_unexpected_models": posterior["unexpected_models"][:10], "live_wrong_status": self.live_wrong[:10],
                "acked_not_in_log": reader.missing_sample,
            },  # fmt: skip
            "_wrong_status_reasons": _reason_counts(wrong_status),
            "_lost_by_partition_and_minute": {f"p{p}/min{m}": n for (p, m), n in sorted(lost_when.items())},
            "_good_dead_reasons": dict(Counter(g["reason"] for g in good_dead)),
            "_duplicate_dead_reasons": dict(dup_dead),
            "_bad_by_kind": {k: {**v, "reasons": dict(v["reasons"])} for k, v in per_kind.items()},
            "_crashes": crashes,
            "_faults": [{"at_s": round(f.started if f.started is not None else f.at, 1), "kind": f.kind, "detail": f.detail,
                         "took_s": round((f.ended or 0) - (f.started or 0), 1)} for f in self.faults],  # fmt: skip
            "_harness_errors": self.harness_errors,
            "_reader_errors": dict(reader.errors),
            "_workdir": str(self.workdir),
            "_timeline": self.timeline,
        }

    # -- output -----------------------------------------------------------------------------

    def _print(self, s: dict) -> None:
        c = self.report
        table = Table("figure", "value", title="soak")
        red = lambda n: f"[bold red]{n:,}[/]" if n else f"[green]{n:,}[/]"  # noqa: E731
        for key in ("decisions", "faults", "bad_records", "dead_lettered", "late_rewards", "late_dead_lettered",
                    "duplicates_sent", "duplicates_dead_lettered", "duplicates", "posterior_models", "undelivered",
                    "delivered_without_offset", "unknown_dead_letters", "reader_missed"):  # fmt: skip
            table.add_row(key.replace("_", " "), f"{s[key]:,}")
        for key in ("lost", "wrong_status", "wrong_reward", "wrong_fields", "unexpected_updates", "good_dead_lettered",
                    "acked_not_in_log", "acked_at_other_offset",
                    "conflicting_duplicates", "posterior_mismatched", "crashes"):  # fmt: skip
            table.add_row(key.replace("_", " "), red(s[key]))
        table.add_row("bad records not dead-lettered", red(s["bad_records"] - s["dead_lettered"]))
        table.add_row("late rewards not dead-lettered", red(s["late_rewards"] - s["late_dead_lettered"]))
        table.add_row("posterior max rel err", f"{s['posterior_max_rel_err']:.2e}")
        table.add_row("broker ack p50 / p99 / max", f"{s['ack_p50_ms']:.1f} ms / {s['ack_p99_ms']:.1f} ms / {s['ack_max_s']:.2f} s "
                      f"({s['acks_over_margin']:,} records acked later than the join's {s['in_flight_margin_s']:g} s in-flight margin)")
        table.add_row("wrong outcomes with a reward acked past the margin", f"{s['wrong_with_slow_ack']:,}")
        table.add_row("by source", "; ".join(f"{k}: " + ", ".join(f"{n} {v:,}" for n, v in c_.items()) for k, c_ in s["by_source"].items()))
        table.add_row("wall time", f"{s['wall_s']:.0f} s")
        table.add_row("result", "[bold green]OK[/]" if s["ok"] else "[bold red]FAILED[/]")
        c.print(table)
        kinds_table = Table("bad record kind", "sent", "dead-lettered", "reasons", "not dead-lettered (sample)", title="fuzzed bad records")
        for kind, v in s["_bad_by_kind"].items():
            missing = "; ".join(f"{m['topic']}/{m['partition']}/{m['offset']} (acked at {m['acked_at_s']} s"
                                + (f", near {' '.join(m['faults_near'])})" if m["faults_near"] else ")") for m in v["missing"][:3])
            style = "red" if v["dead_lettered"] < v["sent"] else ""
            kinds_table.add_row(kind, f"{v['sent']:,}", f"[{style}]{v['dead_lettered']:,}[/]" if style else f"{v['dead_lettered']:,}",
                                ", ".join(f"{r} {n}" for r, n in sorted(v["reasons"].items(), key=lambda x: -x[1])), missing)  # fmt: skip
        c.print(kinds_table)
        faults = Table("at s", "fault", "detail", "took s", title="faults")
        for f in s["_faults"]:
            faults.add_row(f"{f['at_s']:.0f}", f["kind"], f["detail"], f"{f['took_s']:.1f}")
        c.print(faults)
        samples = s["_samples"]
        for name in ("wrong_status", "wrong_reward", "lost"):
            rows = samples[name]
            if not rows:
                continue
            t = Table("event id", "source", "decided/acked at s", "expected", "got (emitted at s)",
                      "rewards: ms after decision (sent/acked at s); L = late", "faults near", title=f"{name} (sample of {len(rows)})")
            for r in rows[:16]:
                got = ", ".join(f"{st} {rw} ({at})" for st, rw, at in zip(r.get("got", []), r.get("got_reward", []), r["emitted_at_s"])) or "nothing"
                rewards = " ".join(f"{x['offset_ms']}{'L' if x['late'] else ''} ({x['sent_at_s']}/{x['acked_at_s']})"
                                   for x in r["rewards"]) or "none"
                t.add_row(r["event_id"], r["source"], f"{r['decided_at_s']}/{r['decision_acked_at_s']}",
                          f"{r['expected']} {r['expected_reward']}", got, rewards,
                          " ".join(r["faults_near"]) + (" [reward acked past the margin]" if r["reward_acked_past_margin"] else ""))
            c.print(t)
        if s["_wrong_status_reasons"]:
            c.print(f"wrong statuses by (expected -> got): {s['_wrong_status_reasons']}")
        if s["_lost_by_partition_and_minute"]:
            c.print(f"lost decisions by partition and minute of the run: {s['_lost_by_partition_and_minute']} "
                    f"(the join's consumer lag when the checks stopped waiting: {_fmt(s['join_lag_at_end'])} records)")
        if s["_good_dead_reasons"]:
            c.print(f"good records dead-lettered, by reason: {s['_good_dead_reasons']}")
        if s["_duplicate_dead_reasons"]:
            c.print(f"re-sent good records dead-lettered, by reason (allowed): {s['_duplicate_dead_reasons']}")
        for name in ("good_dead_lettered", "unexpected_updates", "late_not_dead_lettered", "posterior_mismatched", "wrong_fields",
                     "acked_not_in_log"):
            if samples[name]:
                c.print(f"[bold]{name}[/] (sample): {json.dumps(samples[name][:5], default=str)}", highlight=False)
        if s["_crashes"]:
            t = Table("worker", "kind", "what", title="crashes")
            for cr in s["_crashes"][:20]:
                t.add_row(cr["worker"], cr["kind"], str(cr.get("exception") or cr.get("log_tail") or cr.get("message") or cr.get("code"))[:200])
            c.print(t)
        for err in s["_harness_errors"]:
            c.print(f"[red]harness:[/] {err}")
        png = self._plot(s)
        c.print(f"timeline: [bold]{png}[/]; worker logs: {s['_workdir']}", highlight=False)

    def _plot(self, s: dict) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.o.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.o.out_dir / "soak-timeline.png"
        t = [p["t"] for p in self.timeline]
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
        ax1.plot(t, [p["join_lag"] for p in self.timeline], label="join consumer lag (records)")
        ax1.plot(t, [p["learn_lag"] for p in self.timeline], label="learner consumer lag (records)")
        ax1.plot(t, [p["overdue"] for p in self.timeline], label="overdue decisions (no update yet)", linestyle="--")
        ax1.set_ylabel("records")
        ax1.legend(loc="center left", fontsize=8)
        ack = ax1.twinx()
        ack.plot(t, [p["ack_max_s"] for p in self.timeline], color="tab:red", linewidth=0.8, label="slowest broker ack (s)")
        ack.set_ylabel("broker ack, s")
        ack.legend(loc="center right", fontsize=8)
        ax2.plot(t, [p["decisions"] for p in self.timeline], label="good decisions produced")
        ax2.plot(t, [p["updates"] for p in self.timeline], label="decisions with an update")
        ax2.plot(t, [p["dead"] for p in self.timeline], label="dead letters (distinct sources)")
        ax2.set_xlabel("seconds since live traffic started")
        ax2.legend(loc="upper left", fontsize=8)
        colors = {"kill_join": "red", "kill_learn": "purple", "kill_publish": "grey", "broker_restart": "black",
                  "broker_freeze": "black", "skew_burst": "orange"}  # fmt: skip
        for f in s["_faults"]:
            for ax in (ax1, ax2):
                ax.axvspan(f["at_s"], f["at_s"] + max(f["took_s"], 0.3), color=colors.get(f["kind"], "blue"), alpha=0.25)
            ax1.annotate(f["kind"].replace("kill_", "-9 "), (f["at_s"], 1.0), xycoords=("data", "axes fraction"),
                         rotation=90, fontsize=7, va="top")  # fmt: skip
        verdict = "OK" if s["ok"] else "FAILED"
        fig.suptitle(f"banditstream soak ({s['minutes']:g} min, seed {s['seed']}): {verdict} - lost {s['lost']}, "
                     f"wrong status {s['wrong_status']}, crashes {s['crashes']}, "
                     f"bad dead-lettered {s['dead_lettered']:,}/{s['bad_records']:,}")  # fmt: skip
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def _up_with_retries(stack: LocalStack, attempts: int = 3) -> StackInfo:
    """Start the S3 server; again (on new ports) if a port it picked was taken meanwhile
    by another process of this busy machine."""
    for attempt in range(attempts):
        try:
            return stack.up()
        except StackError:
            stack.down()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def _ack_figures(acks: list[tuple[float, float]], started: float, margin_s: float) -> dict[str, float]:
    """How long the broker took to acknowledge what the soak produced (live traffic only),
    and how many records took longer than the join's in-flight margin assumes."""
    latencies = np.array([lat for at, lat in acks if at >= started] or [0.0])
    return {
        "ack_p50_ms": round(float(np.percentile(latencies, 50)) * 1000, 1),
        "ack_p99_ms": round(float(np.percentile(latencies, 99)) * 1000, 1),
        "ack_max_s": round(float(latencies.max()), 2),
        "acks_over_margin": int((latencies > margin_s).sum()),
    }


def _merge_crashes(exits: list[dict[str, Any]], tracebacks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One crash per event: an incarnation that exited by itself is one crash (with the
    exception its log ends on); a traceback in the log of one that did not is one more."""
    out = [dict(c) for c in exits]
    exited = {c["worker"]: c for c in out}
    for tb in tracebacks:
        crash = exited.get(tb["worker"])
        if crash is not None:
            crash.setdefault("exception", tb["exception"])
        else:
            out.append(tb)
    return out


def _per_source(rows: list[dict], n: int = 8) -> list[dict]:
    """A sample of up to ``n`` rows per source (backlog, live, skewed, burst), in order."""
    taken: Counter = Counter()
    out = []
    for row in rows:
        if taken[row["source"]] < n:
            taken[row["source"]] += 1
            out.append(row)
    return out


def _reason_counts(rows: list[dict]) -> dict[str, int]:
    return dict(Counter(f"{r['expected']}->{'/'.join(r['got'])} ({r['source']})" for r in rows))


def _fmt(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.0f}"


def _raise_keyboard_interrupt(*_):
    raise KeyboardInterrupt


def compact(summary: dict[str, Any]) -> dict[str, Any]:
    """The last line's JSON: every figure, plus a few samples of what went wrong."""
    out = {k: v for k, v in summary.items() if not k.startswith("_")}
    samples = summary["_samples"]
    out["wrong_status_sample"] = [{"event_id": r["event_id"], "expected": r["expected"], "got": r["got"]} for r in samples["wrong_status"][:5]]
    out["lost_sample"] = [r["event_id"] for r in samples["lost"][:5]]
    out["crash_sample"] = [str(c.get("exception") or c.get("log_tail") or c.get("code"))[:160] for c in summary["_crashes"][:3]]
    return out


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15.0, help="length of the live traffic (default 15)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pairs-per-s", type=float, default=150.0, help="decisions per second (default 150)")
    parser.add_argument("--bad-records", type=int, default=100_000, help="fuzzed bad records over the run (default 100,000)")
    parser.add_argument("--faults", type=int, default=30, help="faults injected over the run (default 30)")
    parser.add_argument("--window", type=float, default=4.0, help="reward window of both domains, seconds (default 4)")
    parser.add_argument("--skew", type=float, default=None,
                        help="clock skew of the skewed producer, seconds (default 0.6 x the join's default grace_s)")
    parser.add_argument("--grace", type=float, default=None, help="the join's grace_s (default: 2 s on memory storage, 6 s on S3)")
    parser.add_argument("--backlog", type=int, default=None, help="pairs stamped an hour ago, produced first (default: a sixth of the live pairs, <= 20,000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    parser.add_argument("--block-size", type=int, default=256, help="the learner's block size (default 256)")
    parser.add_argument("--storage", choices=("memory", "s3"), default="memory", help="broker storage: memory (freezes, the default) or s3 (restarts)")
    parser.add_argument("--in-flight-margin", type=float, default=None,
                        help="the join's in_flight_margin_s (default: 1 s on memory storage, 5 s on S3 storage)")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds without progress before the end checks give up waiting")
    parser.add_argument("--json", type=Path, default=None, help="write the full summary (with samples) here")
    parser.add_argument("--out", type=Path, default=Options.out_dir, help="directory of the PNG timeline (default benchmarks/out)")
    parser.add_argument("--workdir", type=Path, default=None, help="state, logs and config here (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory even when the run is OK")
    a = parser.parse_args(argv)
    if a.faults < 0 or a.bad_records < 0 or a.minutes <= 0 or a.pairs_per_s <= 0 or a.partitions < 2:
        parser.error("--minutes and --pairs-per-s must be > 0, --faults and --bad-records >= 0, --partitions >= 2")
    return Options(minutes=a.minutes, seed=a.seed, pairs_per_s=a.pairs_per_s, bad_records=a.bad_records, faults=a.faults,
                   window_s=a.window, skew_s=a.skew, backlog=a.backlog, partitions=a.partitions, block_size=a.block_size,
                   storage=a.storage, in_flight_margin_s=a.in_flight_margin, grace_s=a.grace, settle_s=a.settle, json_path=a.json, out_dir=a.out, workdir=a.workdir, keep=a.keep)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    soak = Soak(options, Console(stderr=True), Console(width=200))
    summary, code = soak.run()
    if options.json_path:
        options.json_path.write_text(json.dumps({k: v for k, v in summary.items() if k != "_timeline"}, indent=2, default=str))
    if summary["ok"] and not options.keep and options.workdir is None:
        shutil.rmtree(soak.workdir, ignore_errors=True)
    sys.stdout.flush()
    print(json.dumps(compact(summary), default=str), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
