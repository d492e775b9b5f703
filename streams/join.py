"""The join worker: decisions + rewards in, exactly one UpdateEvent per decision out.

A faust-streaming app: faust runs the consumer group, the partition assignment that keeps
the table's changelog co-partitioned with the sources, the changelog recovery, the RocksDB
table (rocksdict driver, one database per partition) and the sweeper timer. The
co-partitioned decisions and rewards topics (raw bytes: decoding and validation are ours,
so every failure is ours to dead-letter) are read by a librdkafka consumer assigned the
partitions faust assigns (:mod:`streams._join_reader`: rewards in time order with their
decisions) and handed over in batches, not through an agent's stream: faust's stream path
costs two asyncio tasks and a dozen loop callbacks per record, which capped the join at
about 3,000 decision/reward pairs/s on this 2-core machine, and its aiokafka consumer about
a fifth of the join's CPU more. The state is driven by :mod:`streams._join_state`. Per batch:

1. a record without a key, on another partition than its key's (``kafka.partitioner``), or
   keyed by anything but its event_id is dead-lettered (``null_key``, ``wrong_partition``,
   ``key_mismatch``): its decision and rewards could never be sure to meet; then decode
   (:class:`~streams.serde.AvroSerde`), validate (:class:`~streams.validation.Validator`);
   a record that fails goes to the dead-letter topic, the rest go on;
2. decisions open a join entry (features encoded now, the normaliser updated after),
   rewards attach to it, wait for it, or are late / duplicate (counted, and logged with an
   example);
3. the partition's clocks advance - event time, never the broker's record time (see
   :mod:`streams._join_state`: the event times read, and what the reader knows of each
   source partition's end) - and every due entry is finalised: its UpdateEvent is built;
4. **emit before marking done**: UpdateEvents and dead letters are produced and flushed,
   then the state changes - with the next source offset per topic - go to the table's
   changelog topic, then to local RocksDB (one write batch per partition) with the
   changelog offset faust recovers from. A crash between the steps can duplicate an
   UpdateEvent (the learner dedupes by event_id), never lose one.

Where reading resumes is the state's business, not faust's: the reader starts each
partition at the offsets the state stores (``replay_from``: the oldest record whose effect
the state holds in memory only); records read again up to the newest one handled rebuild
what was held, their outputs suppressed. (After kill -9, faust's own committed offsets were
seen *ahead* of what the state held - records acknowledged by faust's stream but never
joined - which lost decisions.)

A faust timer sweeps every ``sweep_interval_s``: when no batch came for that long it
advances every partition's clock, so default rewards fire when traffic stops, and every ``purge_interval_s`` purges old done
markers. A batch that cannot be emitted or persisted stops the process at once
(exit 70) before faust can commit it; a restart replays it.

Changelog writes bypass faust's per-key ``table[key] = value`` path (one aiokafka send per
key, about 2,000 writes/s here) and go through librdkafka in bulk to the same changelog
topic, in the format faust's recovery applies (raw key, raw value, the source partition).
On a broker whose queried end offsets cannot be trusted (Tansu: the base offset of the last
record batch + 1), each bulk write is closed with a one-record "fence" batch (a tombstone
of an unused key) and one more fence is written at start-up, so the queried end offset
faust recovers to is exact.

Limitations: normaliser statistics are per partition (each partition observes only its
own decisions, so partitions' features scale slightly differently until the statistics
converge); the deadline index is in memory (about 100 bytes per waiting decision).

A decision marked ``deferred`` (``deferActivation`` in ``banditstream serve``) is learned
only once activated - its window runs from the activation - and is emitted as
``not_activated`` (kept for evaluation, never learned) when no activation comes within
``activation_wait_s`` (see :mod:`streams._join_state`).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faust
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from faust.tables import TableManager
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.transport.drivers.aiokafka import Transport as AIOKafkaTransport
from faust.types import TP

from learner.statelock import StateLock
from streams._join_reader import RewardHold, SourceReader
from streams._join_state import (
    FENCE_KEY,
    DeadLetter,
    JoinCore,
    JoinError,
    JoinOptions,
    Outputs,
    PartitionState,
)
from streams.client import DeliveryError, EventProducer, discard_producer
from streams.deadletter import DeadLetters, reason_of
from streams.errors import DecodeError, ValidationError
from streams.metrics import WorkerMetrics
from streams.partitioning import key_partition
from streams.security import faust_credentials
from streams.topics import check_topics
from streams.validation import Validator
from streams.worker import NORMALIZER_POLICY, WorkerConfig, join_group

__all__ = ["JoinOptions", "JoinWorker", "run_join"]

log = logging.getLogger("banditstream.join")

TABLE_NAME = "join"
#: Raw bytes kept in a dead letter; a longer record (an oversize payload) keeps its first
#: bytes only, so the dead letter stays below the broker's message size.
MAX_DEAD_LETTER_VALUE = 512 * 1024


class Failpoint:
    """A testing aid: ``BANDITSTREAM_FAILPOINT=STAGE:N`` kills this process (SIGKILL, as
    ``kill -9``) the N-th time the join passes STAGE, so crash recovery is tested at exact
    points, not only where an outside kill happens to land:

    * ``read``: a batch applied to the state in memory, nothing emitted;
    * ``emitted``: its UpdateEvents and dead letters flushed, the changelog not written;
    * ``changelog``: the changelog flushed, the local state not written;
    * ``persisted``: the first partition's state written, the others' not.
    """

    STAGES = ("read", "emitted", "changelog", "persisted")

    def __init__(self, spec: str | None) -> None:
        self.stage, self.remaining = None, 0
        if spec:
            stage, _, count = spec.partition(":")
            if stage not in self.STAGES or not count.isdigit() or int(count) < 1:
                raise ValueError(f"BANDITSTREAM_FAILPOINT must be STAGE:N with STAGE one of {', '.join(self.STAGES)}, "
                                 f"got {spec!r}")
            self.stage, self.remaining = stage, int(count)

    def passed(self, stage: str) -> None:
        if stage == self.stage:
            self.remaining -= 1
            if self.remaining == 0:
                log.critical("join: failpoint %s reached: killing the process", stage)
                os.kill(os.getpid(), signal.SIGKILL)


def run_join(config: WorkerConfig, *, stop: threading.Event | None = None) -> None:
    """Run the join worker until SIGTERM/SIGINT (main thread) or ``stop`` is set.

    Returns normally after a graceful shutdown (batch finished, outputs flushed, offsets
    committed, group left); raises if the worker crashed, and at once with
    :class:`~learner.errors.StateDirLocked` if another worker holds ``state_dir/join``.
    """
    with StateLock(config.state_dir / "join"):
        JoinWorker(config).run(stop=stop)


class _Worker(faust.Worker):
    """faust's worker; signal handlers only where Python allows them (the main thread), and
    no terminal spinner.

    faust's start-up spinner sets the root logger to DEBUG so that every record spins it:
    every ``debug`` call of faust, mode and aiokafka then built and handled a log record
    (about 4 % of a join's CPU, most of it in the standby replicas' changelog path), and
    the spinner's escape codes went to the worker's log."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spinner = None

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            super().install_signal_handlers()

    async def _sentinel_task(self) -> None:
        """The last task before the loop closes: mode's sleeps a fixed second, for the tasks
        it has just cancelled to unwind; this waits until they have (at most that second),
        so a stopped join exits once it has let go of everything, not a second later."""
        this = asyncio.current_task()
        for _ in range(100):
            if all(task is this or task.done() for task in asyncio.all_tasks()):
                return
            await asyncio.sleep(0.01)


class _TableManager(TableManager):
    """faust's table manager without its start-up nap, and with a changelog queue that
    flow control never empties.

    faust's sleeps a second before it registers the tables (for tables an app defines while
    it starts); the join's one table is defined before the worker starts, so every start of
    the join (a restart after a crash, a scale-out, a rebalance's new member) waited that
    second for nothing.

    faust's queue of changelog records (its consumer -> its recovery) was emptied whenever
    flow control resumed, and a recovery resumes it with the standbys' changelogs already
    being read: the queued records were dropped while the consumer read on, the standby
    applied what followed, and its persisted offset passed a hole no later recovery reads. A
    standby promoted to active then held the join's newer ``replay_from`` without the "X" done
    markers written with or before it, and a decision read again whose early reward was not
    (before the rewards' ``replay_from``) was finalised afresh as ``default`` (the kill test:
    949 of one partition's 3,054 markers missing). Kept, a record fetched before a rebalance
    reaches the recovery before those read after it, and the recovery applies a record only
    if it has not seen its offset: nothing is applied twice or out of order."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    @property
    def changelog_queue(self) -> Any:
        if self._changelog_queue is None:
            self._changelog_queue = self.app.FlowControlQueue(
                maxsize=self.app.conf.stream_buffer_maxsize, clear_on_resume=False
            )
        return self._changelog_queue


class _ConsumerThread(AIOKafkaConsumerThread):
    """faust's consumer thread, with the broker profile's fetch wait.

    faust builds its aiokafka consumer with ``fetch_max_wait_ms=1500``. On a broker that
    answers a waiting fetch only when the wait runs out (Tansu: see streams.profiles) the
    join then stalled whenever it caught up with a partition: in a 100,000-pair run it sat
    idle 0.4-0.8 s every second or two with a backlog waiting (5,000-6,000 pairs/s; 8,200
    with a 0.2 s wait)."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        wait_ms = getattr(self.app, "fetch_max_wait_ms", None)
        if wait_ms is not None:
            consumer._fetch_max_wait_ms = wait_ms  # read when the consumer starts its fetcher
        return consumer


class _UnreadSourcesConsumer(AIOKafkaConsumer):
    """faust's aiokafka consumer, for everything but the join's sources.

    The source topics are subscribed through faust (so its assignor co-partitions the table's
    changelog with them) but read by the :class:`~streams._join_reader.SourceReader`; faust's
    consumer is paused on them after each assignment, and whatever it fetched of them
    before is dropped here. Nothing of the sources is acknowledged to faust, so faust never
    commits their offsets: where reading resumes is the join state's business
    (:meth:`JoinWorker._commit_state_offsets`). Records of other topics (the table's
    changelog during recovery) take faust's own path.
    """

    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - faust's fetcher task
        sources = self.app.unread_topics  # type: ignore[attr-defined]
        callback, getmany = self.callback, self.getmany
        set_read_offset = self._read_offset.__setitem__
        stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        try:
            while not (stopped() or fetcher_stopped()):
                async for tp, message in getmany(timeout=1.0):
                    set_read_offset(tp, message.offset)
                    if tp.topic not in sources:
                        await callback(message)
                await self.sleep(0)
        except self.consumer_stopped_errors:
            if not self.transport.app.should_stop:
                raise
        except asyncio.CancelledError:
            if not self.transport.app.should_stop:
                raise


class _Transport(AIOKafkaTransport):
    Consumer = _UnreadSourcesConsumer


class _JoinApp(faust.App):
    """A faust app that runs the group for topics it does not read itself (the sources)."""

    #: The broker profile's fetch wait for the consumer (:class:`_ConsumerThread`), ms.
    fetch_max_wait_ms: int | None = None
    #: Awaited before faust revokes partitions (its tables let go of their databases then)
    #: and before the app stops: the join finishes the batch in flight and lets go first.
    before_revoke: Callable[[set[TP]], Awaitable[None]] | None = None
    before_stop: Callable[[], Awaitable[None]] | None = None

    async def _on_partitions_revoked(self, revoked: set[TP]) -> None:
        if self.before_revoke is not None:
            await self.before_revoke(revoked)
        await super()._on_partitions_revoked(revoked)

    async def on_stop(self) -> None:
        if self.before_stop is not None:
            await self.before_stop()
        await super().on_stop()

    def subscribe_unread(self, topic: faust.TopicT) -> None:
        """Subscribe to ``topic`` through the conductor, so the assignor co-partitions the
        tables with it, without reading it (see :class:`_UnreadSourcesConsumer`)."""
        self.unread_source = topic
        self.unread_topics = frozenset(topic.topics)

    async def on_start(self) -> None:
        # Here, not when the app is built: the conductor is a service of the worker's loop.
        self.topics.add(self.unread_source)
        await super().on_start()

    def _new_transport(self) -> _Transport:
        return _Transport(self.conf.broker_consumer, self)


class JoinWorker:
    """The faust app, its table and the glue between faust, the join state and Kafka."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.options = JoinOptions.from_mapping(config.extra.get("join"))
        self.profile = config.kafka.broker_profile
        self.topics = config.topics
        self.core = JoinCore(config.domains, self.options)
        self.validator = Validator(config.limits)
        registry = config.registry_client()
        self.decision_serde = config.serde("decision", topic=config.topics.decisions, registry=registry)
        self.reward_serde = config.serde("reward", topic=config.topics.rewards, registry=registry)
        self.update_serde = config.serde("update", topic=config.topics.updates, registry=registry)
        self.posterior_serde = config.serde("posterior", topic=config.topics.posterior, registry=registry)
        self.metrics = WorkerMetrics("join")
        # Reports of failures only: flush() still raises on one, and a delivery callback per
        # UpdateEvent was ~3% of the join's CPU.
        self.producer = EventProducer(config.kafka, **{"delivery.report.only.error": True})
        self.changelog_producer = Producer(config.kafka.producer_config())
        self.deadletters = DeadLetters(
            self.producer, config.topics.deadletter, worker="join", serde=config.deadletter_serde(registry),
            on_dead_letter=self.metrics.dead_letter,
        )  # fmt: skip
        reader_config = config.kafka.consumer_config(f"{join_group(config.topics)}.reader")
        self.reader = SourceReader(
            reader_config, config.topics.decisions, config.topics.rewards,
            hold=RewardHold(int(self.options.reward_lead_s * 1000), self.options.rewards_held_max),
            fetch_wait_ms=int(reader_config.get("fetch.wait.max.ms", 500)),  # librdkafka's default
            batch_max=self.options.batch_max, gap_confirm_s=self.profile.gap_confirm_s,
            on_gap=lambda topic, outcome: self.metrics.log_gaps.labels("join", topic, outcome).inc(),
        )  # fmt: skip
        self._reading = ThreadPoolExecutor(1, thread_name_prefix="join-reader")
        self.parts: dict[int, PartitionState] = {}
        self._lock = asyncio.Lock()
        self._stopping = False  # the app is stopping: no batch or sweep may start
        self._stop: threading.Event | None = None
        self._next_purge = 0.0
        self._next_normalizers = 0.0
        self._next_lag_report = 0.0
        self._last_batch_at = 0.0  # monotonic time the last batch was joined
        self._next_duplicate_log = 0.0
        self._spill_warned: set[int] = set()  # partitions whose spilled entries were logged
        self.failpoint = Failpoint(os.environ.get("BANDITSTREAM_FAILPOINT"))
        #: Where a key belongs: the source topics' partition count (as found at start-up).
        self.partitioner = config.kafka.partitioner
        self.source_partitions = config.topics.partitions
        self.worker: _Worker | None = None
        self.app = self._build_app()

    # -- faust wiring --------------------------------------------------------------------

    def _build_app(self) -> faust.App:
        config, options = self.config, self.options
        app_id = join_group(config.topics)
        brokers = [f"kafka://{server.strip()}" for server in config.kafka.bootstrap_servers.split(",")]
        app = _JoinApp(
            app_id,
            broker=brokers,
            broker_credentials=faust_credentials(config.kafka),
            datadir=str(config.state_dir / "join"),
            store="rocksdb://",
            topic_partitions=config.topics.partitions,
            web_enabled=False,
            consumer_auto_offset_reset="earliest",
            TableManager=_TableManager,
            broker_max_poll_records=options.batch_max,
            **self.profile.faust,
        )
        longest_window = max((d.reward.window_s for d in config.domains.values()), default=600.0)
        retention_ms = int((2 * longest_window + options.done_retention_s + 3600) * 1000)
        self.table = app.Table(
            TABLE_NAME,
            partitions=config.topics.partitions,
            key_type=bytes,  # faust derives the changelog's (raw) serializers from these
            value_type=bytes,
            options={"driver": "rocksdict", "block_cache_size": 64 << 20, "write_buffer_size": 32 << 20},
            # Done markers are purged locally, never tombstoned: the topic's retention drops them.
            extra_topic_configs={"cleanup.policy": "compact,delete", "retention.ms": retention_ms},
        )
        source = app.topic(config.topics.decisions, config.topics.rewards, key_serializer="raw", value_serializer="raw")
        app.subscribe_unread(source)
        app.fetch_max_wait_ms = self.profile.fetch_max_wait_ms

        @app.task
        async def read():
            try:
                await self._read_sources()
            except Exception as exc:
                self._fail_stop(exc)

        @app.timer(options.sweep_interval_s, name="join-sweeper")
        async def sweeper():
            if self._stop is not None and self._stop.is_set() and self.worker is not None:
                self.worker._schedule_shutdown(signal.SIGTERM)  # the same path as a real SIGTERM
                return
            try:
                await self.sweep()
            except Exception as exc:
                self._fail_stop(exc)

        @self.table.on_recover
        async def recovered():  # after each assignment, once the tables are recovered
            async with self._lock:
                self._load_assigned()
                self._assign_reader()
                offsets = await self._commit_state_offsets()
                # Everything faust and the state hold by now lives as long as the worker: out
                # of the collector's sight (see run() for the collector itself).
                gc.collect()
                gc.freeze()
                log.info("join: resuming from the state's offsets (committed: %s)", sorted((tp.topic, tp.partition, o) for tp, o in offsets.items()))

        async def revoked(revoked: set[TP]) -> None:  # under the lock: never mid-batch
            async with self._lock:
                for tp in revoked:
                    if tp.topic in (config.topics.decisions, config.topics.rewards):
                        self.parts.pop(tp.partition, None)
                self._assign_reader()

        async def stopping() -> None:  # the batch in flight finishes; nothing joins after
            async with self._lock:
                self._stopping = True
                self.reader.assign({})
                try:
                    await self._commit_state_offsets()  # where a restart resumes, for Kafka's tools
                except Exception as exc:  # the state holds them anyway
                    log.warning("join: offsets not committed on the way out: %r", exc)

        app.before_revoke, app.before_stop = revoked, stopping
        return app

    @property
    def changelog_topic(self) -> str:
        return self.table.changelog_topic.get_topic_name()

    def run(self, *, stop: threading.Event | None = None) -> None:
        self.source_partitions = check_topics(self.config.kafka, self.topics)[self.topics.decisions]
        (self.config.state_dir / "join").mkdir(parents=True, exist_ok=True)
        port = self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
        log.warning("join worker: metrics on port %d", port)
        self._stop = stop
        if not self.profile.trusts_queried_end_offsets:
            self._fence_existing_changelog()
        main = threading.current_thread() is threading.main_thread()
        if main:
            # A batch keeps thousands of decoded records alive at once; the collector, set off
            # by their allocations, went through every live object again and again: a third of
            # the join's CPU. The records hold no reference cycles (reference counting frees
            # them), so the process collects once per purge interval, from the sweeper.
            gc.disable()
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loglevel = os.environ.get("BANDITSTREAM_JOIN_LOGLEVEL", "WARNING")  # INFO: clocks every purge_interval_s
        self.worker = _Worker(
            self.app, loop=loop, loglevel=loglevel, quiet=True, override_logging=main, redirect_stdouts=False
        )
        try:
            self.worker.execute_from_commandline()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        finally:
            self._reading.shutdown(wait=True)  # a poll in progress ends within batch_within_s
            self.reader.close()
            self.producer.flush()
            self.changelog_producer.flush(10)
            self.metrics.close()
            gc.enable()

    def _fail_stop(self, exc: BaseException) -> None:
        """A batch could not be emitted or persisted (broker down past the timeouts, a bug).

        Stop at once: a restart resumes from the offsets the state stores, so the batch is
        read again (at-least-once). Records never get here; they are dead-lettered one by one.
        """
        log.critical("join: stopping without committing the current batch: %r", exc, exc_info=exc)
        if threading.current_thread() is threading.main_thread():
            os._exit(70)
        raise exc  # a worker thread (tests): the thread's owner sees the error

    # -- partitions ----------------------------------------------------------------------

    def _store(self):
        return self.table.data

    def _part(self, partition: int) -> PartitionState:
        part = self.parts.get(partition)
        if part is None:
            db = self._store()._db_for_partition(partition)
            part = self.parts[partition] = PartitionState(partition, db, self.core.domains, self.options.entry_cache)
        return part

    def _assign_reader(self) -> None:
        """Read the sources of the partitions held now, from where their state resumes.

        faust's own consumer is paused on them (it would fetch them again after each
        assignment; what it fetched is dropped, see :class:`_UnreadSourcesConsumer`)."""
        sources = (self.topics.decisions, self.topics.rewards)
        self.reader.assign({(topic, p): part.position.get(topic) for p, part in self.parts.items() for topic in sources})
        try:
            consumer = self.app.consumer._thread._ensure_consumer()  # the aiokafka consumer
            consumer.pause(*[tp for tp in consumer.assignment() if tp.topic in sources])
        except Exception as exc:  # not started or stopping: it fetches nothing then either
            log.debug("join: faust's consumer not paused on the sources: %r", exc)

    async def _read_sources(self) -> None:
        """Hand the sources over in batches: once ``batch_max`` records are collected,
        ``batch_within_s`` passed since the first, or a poll found nothing new."""
        loop = asyncio.get_running_loop()
        reader, within, batch_max = self.reader, self.options.batch_within_s, self.options.batch_max
        pending: list = []
        first_at, generation = 0.0, None
        while not (self.app.should_stop or self._stopping):
            read_generation, records, fetched = await loop.run_in_executor(self._reading, reader.read, within)
            if pending and read_generation != generation:
                pending = []  # assigned anew meanwhile: read again from the state's offsets
            if records and read_generation == reader.generation:
                if not pending:
                    first_at, generation = time.monotonic(), read_generation
                pending.extend(records)
            if pending and (len(pending) >= batch_max or not fetched or time.monotonic() - first_at >= within):
                await self.process(pending, generation)
                pending = []

    def _load_assigned(self) -> None:
        """Rebuild the index of every active changelog partition not loaded yet."""
        for tp in self.app.assignor.assigned_actives():
            if tp.topic == self.changelog_topic and tp.partition not in self.parts:
                self._part(tp.partition)

    # -- the batch -----------------------------------------------------------------------

    async def process(self, messages: list, generation: int | None = None) -> None:
        """Join one batch of source records (librdkafka ``Message``s, in the order read), read
        in the reader's assignment ``generation`` (dropped if it has changed since)."""
        async with self._lock:
            if self._stopping or (generation is not None and generation != self.reader.generation):
                return  # stopping, or assigned anew while waiting: read again from the state's offsets
            assigned = self.reader.assigned
            now = time.time() * 1000.0
            future = int(now + self.options.max_clock_skew_s * 1000)
            out = Outputs()
            counts: dict[str, int] = {}
            decisions = self.topics.decisions
            validate_decision = self.validator.validate_decision
            validate_reward = self.validator.validate_reward
            core = self.core
            # Records read again after a restart (see streams._join_state) rebuild what was
            # held in memory; what they output was sent the first time, so it goes here.
            replayed = Outputs()
            accepted: list[tuple[PartitionState, bool, Any, Outputs]] = []
            misplaced = self._misplaced
            for message in messages:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                if (topic, partition) not in assigned:  # revoked while the batch was collected
                    continue
                counts[topic] = counts.get(topic, 0) + 1
                part = self._part(partition)
                if not self._in_sequence(part, topic, offset):
                    continue
                sink = replayed if part.replaying(topic, offset) else out
                part.handled(topic, offset)
                refused = misplaced(message)
                if refused is not None:  # its decision and rewards can never meet here
                    sink.dead.append(refused)
                    continue
                accepted.append((part, topic == decisions, message, sink))
            # Decoded per topic in one call each (the C reader's batch path), then in order.
            decoded_decisions = iter(self.decision_serde.decode_batch([m.value() or b"" for _, d, m, _ in accepted if d]))
            decoded_rewards = iter(self.reward_serde.decode_batch([m.value() or b"" for _, d, m, _ in accepted if not d]))
            handled: list[tuple[PartitionState, bool, dict, DeadLetter, Outputs]] = []
            for part, is_decision, message, sink in accepted:
                raw = message.value()
                source = DeadLetter(message.topic(), message.partition(), message.offset(), message.key(), raw)
                size = len(raw) if raw is not None else 0
                try:
                    record = next(decoded_decisions if is_decision else decoded_rewards)
                    if isinstance(record, DecodeError):
                        raise record
                    record = (validate_decision if is_decision else validate_reward)(record, encoded_size=size)
                except (DecodeError, ValidationError) as error:
                    source.error = error
                    sink.dead.append(source)
                    continue
                if source.key != record["event_id"].encode():  # placed by another key than its event's
                    source.reason = "key_mismatch"
                    source.error = JoinError("key_mismatch", f"the record's key {source.key[:100]!r} is not its "
                                                             f"event_id {record['event_id']!r}")
                    sink.dead.append(source)
                    continue
                handled.append((part, is_decision, record, source, sink))
            encoded = iter(core.encode([record for _, is_decision, record, _, _ in handled if is_decision]))
            for part, is_decision, record, source, sink in handled:
                part.observe(is_decision, min(record["timestamp"], future))
                try:
                    if is_decision:
                        core.decision(part, record, source, sink, next(encoded))
                    else:
                        core.reward(part, record, source, sink)
                except Exception as error:  # a record must never stop the worker
                    if sink is out:
                        log.warning("join: %s/%d@%d refused: %r", source.topic, source.partition, source.offset, error)
                    source.error = error
                    sink.dead.append(source)
            self._cap_clocks(now)
            for part in self.parts.values():
                part.batch_read(now)
            for topic, n in counts.items():
                self.metrics.records_in.labels("join", topic).inc(n)
            n_replayed = sum(1 for *_, sink in accepted if sink is replayed)
            if n_replayed:
                self.metrics.duplicates.labels("join", "replayed").inc(n_replayed)
            clocks = await self._clocks()
            for partition, part in self.parts.items():
                core.fire(part, now, out, *clocks.get(partition, (None, None, None)))
            self._report_duplicates(out)
            self.failpoint.passed("read")
            self.metrics.batch_size.labels("join").observe(len(messages))
            await asyncio.shield(self._commit(out, self.parts.values()))
            self._last_batch_at = time.monotonic()

    def _misplaced(self, message: Any) -> DeadLetter | None:
        """A dead letter for a record whose decision and rewards cannot meet on this partition
        (no key, or a key that the configured partitioner places elsewhere), else None."""
        key, partition = message.key(), message.partition()
        if not key:
            reason = "null_key"
            text = "the record has no key: decisions and rewards are keyed by event_id to meet on one partition"
        else:
            expected = key_partition(key, self.source_partitions, self.partitioner)
            if expected == partition:
                return None
            reason = "wrong_partition"
            text = (f"its key belongs in partition {expected} of {self.source_partitions} "
                    f"(kafka.partitioner {self.partitioner}), it came in partition {partition}")
        return DeadLetter(message.topic(), partition, message.offset(), key, message.value(), JoinError(reason, text), reason)

    def _report_duplicates(self, out: Outputs) -> None:
        """Duplicates are counted (metrics) and told, with an example, at most every 10 s."""
        if out.duplicates and time.monotonic() >= self._next_duplicate_log:
            self._next_duplicate_log = time.monotonic() + 10.0
            log.warning("join: duplicates dropped in this batch: %s (e.g. %s)",
                        ", ".join(f"{n} {kind}" for kind, n in sorted(out.duplicates.items())),
                        ", ".join(f"{kind} {sample}" for kind, sample in sorted(out.duplicate_samples.items())))

    def _in_sequence(self, part: PartitionState, topic: str, offset: int) -> bool:
        """Whether to handle this record: this session has not read it yet.

        The reader starts each partition where the state resumes (:meth:`_assign_reader`).
        A record below the position is handled already (read twice: skipped). One above it
        follows a hole in the log (transaction markers, compaction): taken, and logged.
        """
        expected = part.position.get(topic)
        if expected is None or offset == expected:
            return True
        if offset < expected:
            self.metrics.duplicates.labels("join", "refetched").inc()
            return False
        log.info("join: %s/%d has no records %d..%d", topic, part.partition, expected, offset - 1)
        return True

    async def _commit_state_offsets(self) -> dict[TP, int]:
        """Commit the offsets the state resumes from to the group: on assignment and from the
        sweeper, so the group's lag is visible to Kafka's tools. (The reader itself starts
        from the state's offsets; faust commits only what its streams acknowledge, and the
        sources never pass through one.)
        """
        consumer = self.app.consumer
        assigned = consumer.assignment()
        sources = (self.topics.decisions, self.topics.rewards)
        offsets = {
            TP(topic, partition): offset
            for partition, part in self.parts.items()
            for topic, offset in part.resume.items()
            if topic in sources and TP(topic, partition) in assigned
            and consumer._committed_offset.get(TP(topic, partition)) != offset
        }
        if offsets:
            await consumer._thread.commit(offsets)  # on the consumer's thread
            for tp, offset in offsets.items():
                consumer._committed_offset[tp] = offset
        return offsets

    async def sweep(self) -> None:
        async with self._lock:
            if self._stopping:
                return
            now = time.time() * 1000.0
            clocks = None
            if time.monotonic() - self._last_batch_at >= self.options.sweep_interval_s:
                # (a batch fires on the same clocks: this matters when none comes)
                out = Outputs()
                clocks = await self._clocks()
                self._cap_clocks(now)
                for partition, part in self.parts.items():
                    self.core.fire(part, now, out, *clocks.get(partition, (None, None, None)))
                await asyncio.shield(self._commit(out, self.parts.values()))
            if time.monotonic() >= self._next_purge:
                self._next_purge = time.monotonic() + self.options.purge_interval_s
                self._log_status(clocks if clocks is not None else await self._clocks())
                retention_ms = self.options.done_retention_s * 1000.0
                for part in self.parts.values():
                    part.purge_done(now, retention_ms, self.options.purge_scan)
                gc.collect()
            if time.monotonic() >= self._next_normalizers:
                self._next_normalizers = time.monotonic() + self.options.normalizer_every_s
                self._publish_normalizers()
            if time.monotonic() >= self._next_lag_report:  # for Kafka's tools and /metrics only
                self._next_lag_report = time.monotonic() + 1.0
                await self._commit_state_offsets()
                await self._report_lag()

    def _publish_normalizers(self) -> None:
        """Each partition's changed normaliser statistics, to the posterior topic (see
        :data:`~streams.worker.NORMALIZER_POLICY`) for the publisher to ship in snapshots.

        Every ``normalizer_every_s``, when they changed (and once after each assignment); sent
        within the producer's linger, a failed delivery fails the next flush like any output."""
        encode, topic = self.posterior_serde.encode, self.topics.posterior
        for part in self.parts.values():
            for name in sorted(part.norm_unpublished):
                normalizer, domain = part.normalizers.get(name), self.core.domains.get(name)
                if normalizer is None or domain is None:
                    continue
                export = normalizer.export()
                record = {
                    "tenant": self.config.tenant, "workspace": self.config.workspace, "domain": name,
                    "arm": f"p{part.partition}", "policy": NORMALIZER_POLICY, "dimension": domain.features.dimension,
                    "state": json.dumps(export, sort_keys=True).encode(), "state_major": 1,
                    "update_count": normalizer.observations(),
                    "watermark": [], "feature_hash": domain.feature_hash, "drift_trace": 0.0, "drift_norm": 0.0,
                    "emitted_at": int(time.time() * 1000), "reset_time": 0,
                }  # fmt: skip
                self.producer.send_raw(topic, encode(record), key=f"~normalizer/{name}/p{part.partition}")
            part.norm_unpublished.clear()

    def _log_status(self, clocks: dict[int, tuple[float | None, float | None, float | None]]) -> None:
        for partition, part in sorted(self.parts.items()):
            decisions_end, rewards_end, _ = clocks.get(partition, (None, None, None))
            log.info(
                "join p%d: reward clock %d, decision clock %d, stream time %d, waiting %d (next deadline %s), "
                "decisions read to their end at %s, rewards at %s, positions %s",
                partition, part.reward_clock, part.decision_clock, part.stream_time, len(part.heap),
                part.heap[0][0] if part.heap else None, decisions_end, rewards_end,
                [part.position.get(t) for t in (self.topics.decisions, self.topics.rewards)],
            )  # fmt: skip

    async def _clocks(self) -> dict[int, tuple[float | None, float | None, float | None]]:
        """Per partition: ``(decisions_end, rewards_end, resumed)``, the wall ms up to which
        each source partition is known handed over to its end, or None while it has records
        left, and when their broker was last heard again after a silence (see
        :meth:`streams._join_state.PartitionState.advance` for what the clocks make of them)."""
        return {
            partition: (await self._read_to_end(self.topics.decisions, partition),
                        await self._read_to_end(self.topics.rewards, partition),
                        self._resumed(partition))
            for partition in self.parts
        }  # fmt: skip

    def _cap_clocks(self, now_ms: float) -> None:
        """No clock passes what a broker outage may still hold back. While a partition's broker
        is away, and for ``in_flight_margin_s`` after it answers again, every producer sends what
        it held, stamped from the outage's start on, in whatever order their batches reach the
        log: one producer's records stamped 19 s into a freeze can come before another's stamped
        at its start (the memory soak: 740 decisions learned as default right after a 20 s
        freeze, although their rewards were in the log 0.5 s later). So the clocks stop at the
        last time the broker was heard before the outage, less the margin, until then."""
        margin = self.options.in_flight_margin_s * 1000.0
        for partition, part in self.parts.items():
            cap = None
            for topic in (self.topics.decisions, self.topics.rewards):
                outage = self.reader.outage(topic, partition)
                if outage is None:
                    continue
                silenced, resumed = outage
                if resumed is None or now_ms < resumed + margin:
                    cap = silenced - margin if cap is None else min(cap, silenced - margin)
            part.clock_cap = cap

    def _resumed(self, partition: int) -> float | None:
        times = [t for t in (self.reader.resumed_at(self.topics.decisions, partition),
                             self.reader.resumed_at(self.topics.rewards, partition)) if t is not None]  # fmt: skip
        return max(times) if times else None

    async def _read_to_end(self, topic: str, partition: int) -> int | None:
        """The wall time (ms) up to which this partition is known handled to its end, or
        None while records are left (or nothing is known yet); see
        :meth:`~streams._join_reader.SourceReader.complete_at`."""
        part = self.parts.get(partition)
        return self.reader.complete_at(topic, partition, None if part is None else part.position.get(topic))

    # -- emitting and persisting ---------------------------------------------------------

    async def _commit(self, out: Outputs, parts: Iterable[PartitionState]) -> None:
        """Emit, then changelog, then local state: the order that can duplicate, never lose."""
        updates_topic, encode = self.topics.updates, self.update_serde.encode
        updates = [(shard, encode(record)) for shard, record in out.updates]
        dead_letters = []
        for dead in out.dead:
            value, reason = dead.value, dead.reason or reason_of(dead.error)
            if value is not None and len(value) > MAX_DEAD_LETTER_VALUE:  # keep the dead letter itself producible
                value = value[:MAX_DEAD_LETTER_VALUE]
            dead_letters.append(self.deadletters.encode(
                source_topic=dead.topic, partition=dead.partition, offset=dead.offset,
                key=dead.key, value=value, error=dead.error, reason=reason,
            ))  # fmt: skip
            self.deadletters.counted(reason)
        if updates or dead_letters:

            def emit() -> None:
                self.producer.send_many(updates_topic, updates)
                self.producer.send_many(self.topics.deadletter, dead_letters)
                self.producer.flush(self.options.output_timeout_s)

            await self._deliver("outputs", emit, self.producer.rebuild)
            self.failpoint.passed("emitted")
        self._count(out)

        changes = [(part, part.changes()) for part in parts]
        for part, _ in changes:
            if part.spilled:
                self._spilled(part)
        changes = [(part, items) for part, items in changes if items]
        if not changes:
            return
        topic = self.changelog_topic
        last: dict[int, int] = {}

        def write() -> None:
            failures: list[Any] = []

            def delivered(error, message) -> None:
                if error is not None:
                    failures.append(error)
                else:
                    p = message.partition()
                    if message.offset() > last.get(p, -1):
                        last[p] = message.offset()

            clog = self.changelog_producer
            last.clear()
            for part, items in changes:
                for key, value in items:
                    _produce(clog, topic, key, value, part.partition, delivered)
            remaining = clog.flush(self.options.output_timeout_s)
            if not remaining and not failures and not self.profile.trusts_queried_end_offsets:
                for part, _ in changes:
                    _produce(clog, topic, FENCE_KEY, None, part.partition, delivered)
                remaining = clog.flush(self.options.output_timeout_s)
            if remaining or failures or len(last) < len(changes):
                raise DeliveryError(f"changelog writes failed: {failures[:1] or f'{remaining} not delivered'}")

        await self._deliver("changelog", write, self._rebuild_changelog_producer)
        self.failpoint.passed("changelog")

        store = self._store()
        for part, items in changes:
            part.write(items)
            store.set_persisted_offset(TP(topic, part.partition), last[part.partition])
            self.failpoint.passed("persisted")

    def _spilled(self, part: PartitionState) -> None:
        """Count the open entries a partition wrote because they aged out of memory; say so once."""
        self.metrics.join_spilled.labels(str(part.partition)).inc(part.spilled)
        if part.partition not in self._spill_warned:
            self._spill_warned.add(part.partition)
            log.warning(
                "join: partition %d holds more open decisions and early rewards than join.entry_cache (%d); "
                "%d of the oldest were written to the changelog and RocksDB, and each will be read back. "
                "The join is slower while this lasts: raise entry_cache if memory allows (~2-4 KB each), "
                "or spread the load over more partitions. Counted in banditstream_join_spilled_entries_total.",
                part.partition, self.options.entry_cache, part.spilled,
            )  # fmt: skip

    async def _deliver(self, what: str, send: Callable[[], None], rebuild: Callable[[], None]) -> None:
        """Run ``send`` (produce and flush; raises unless every record is acknowledged) until it
        succeeds: through a broker restart or outage the join waits, and a producer that
        failed (fatal, fenced, records expired) is rebuilt and the batch sent again. Records
        acknowledged before the failure go twice; readers dedupe (the learner by event id,
        the changelog by key). Only a stop ends the wait: the batch is then read again."""
        loop = asyncio.get_running_loop()
        started, attempts = time.monotonic(), 0
        while True:
            try:
                await loop.run_in_executor(None, send)
            # (SystemError: what confluent-kafka's flush raised on a producer gone fatal)
            except (KafkaException, BufferError, RuntimeError, SystemError) as exc:
                attempts += 1
                if self._stopping or (self._stop is not None and self._stop.is_set()):
                    raise
                self.metrics.output_retries.labels("join", what).inc()
                log.warning("join: %s not delivered after %.0fs (%r); rebuilding the producer, sending again",
                            what, time.monotonic() - started, exc)
                await loop.run_in_executor(None, rebuild)
                await asyncio.sleep(min(5.0, 0.25 * 2**attempts))
                continue
            if attempts:
                log.warning("join: %s delivered after %d retries, %.1fs", what, attempts, time.monotonic() - started)
            return

    def _rebuild_changelog_producer(self) -> None:
        old, self.changelog_producer = self.changelog_producer, Producer(self.config.kafka.producer_config())
        discard_producer(old)

    def _count(self, out: Outputs) -> None:
        metrics = self.metrics
        # the normalisers first: a scrape that counts a decision joined counts it observed
        held: dict[str, int] = {}
        for part in self.parts.values():
            for name, normalizer in part.normalizers.items():
                held[name] = held.get(name, 0) + normalizer.observations()
        for name, observations in held.items():
            metrics.normalizer_observations.labels(name).set(observations)
        statuses: dict[str, int] = {}
        for _, record in out.updates:
            status = record["join_status"]
            statuses[status] = statuses.get(status, 0) + 1
        for status, n in statuses.items():
            metrics.joins.labels(status).inc(n)
        for kind, n in out.duplicates.items():
            metrics.duplicates.labels("join", kind).inc(n)
        if out.late_rewards:
            metrics.late_rewards.inc(out.late_rewards)

    async def _report_lag(self) -> None:
        """Each partition's lag, from librdkafka's cached end offsets, asked off the event loop:
        each ask waits for the client's lock and the GIL (~20 ms in a profile of the pipeline
        benchmark, four asks a second per worker)."""
        positions = [(partition, topic, position) for partition, part in self.parts.items()
                     for topic, position in part.position.items()]

        def report() -> None:
            for partition, topic, position in positions:
                highwater = self.reader.highwater(topic, partition)
                if highwater is not None:
                    self.metrics.consumer_lag.labels(topic, str(partition)).set(max(0, highwater - position))

        await asyncio.get_running_loop().run_in_executor(None, report)

    def _fence_existing_changelog(self) -> None:
        """Close the changelog with one-record batches before faust reads its end offsets."""
        topic = self.changelog_topic
        try:
            # all topics: asking for one by name can make a broker auto-create it
            metadata = AdminClient(self.config.kafka.client_config()).list_topics(timeout=10)
        except KafkaException:
            return
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            return
        for partition in info.partitions:
            _produce(self.changelog_producer, topic, FENCE_KEY, None, partition, None)
            self.changelog_producer.flush(10)


def _produce(producer: Producer, topic: str, key: bytes, value: bytes | None, partition: int, callback) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, partition=partition, on_delivery=callback)
            return
        except BufferError:
            producer.poll(0.05)
