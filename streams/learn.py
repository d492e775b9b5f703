"""The learner worker: UpdateEvents in, posterior state in RocksDB and on the posterior topic.

The workflow, in the order a record meets it:

1. **Consume.** One member of the consumer group ``banditstream-learn.<updates topic>``
   (``options.group_id`` overrides it). Each updates partition is one shard, keyed by
   ``tenant/workspace/domain/arm`` (per-arm models) or ``tenant/workspace/domain`` (a model
   shared across arms), so every model has one writer.
2. **Decode and validate** in bulk. A record that does not decode, fails
   :meth:`~streams.validation.Validator.validate_update`, names a domain that is not configured,
   carries a feature vector of another length than the domain's dimension, a ``feature_hash``
   other than the domain's (when not empty), a negative weight, a feature, reward or weight of
   magnitude 1e100 or more (whose squares could overflow the statistics), or sits under
   another key than its shard key goes to the dead-letter topic with its reason and raw
   bytes. The worker never stops for one record. Offsets are committed only once every dead
   letter sent so far is acknowledged (failed ones are sent again, by a new producer if need
   be), and a restart checks the records from the committed offset on again, even those its
   store has learned already: a dead letter is never lost to a crash or a broker restart.
   (So it may come twice: at-least-once, and a dead letter's key is
   ``topic/partition/offset`` for readers that dedupe.)
3. **Fold in offset-aligned blocks** (:mod:`streams._learn_shard`). Block ``k`` of a partition
   is every record with ``k*B <= offset < (k+1)*B`` (``B = options.block_size``). A complete
   block is deduplicated, grouped by domain and folded with one rank-k ``update_batch`` per
   domain; the touched models' states and the offset ``(k+1)*B`` are written in one RocksDB
   write batch (:meth:`learner.store.Shard.apply`): each block as it is folded with
   ``options.wal``, else every block folded since the last publication at the next one (one
   write of each changed model instead of one per block). Nothing else is ever persisted, so the
   stored state is always "blocks 0..k folded, in order, from the prior", whatever polls,
   crashes and restarts did: floating-point sums, forgetting and refactorisation see the same
   sequence, and a worker restarting on its own disk reproduces the uninterrupted run **bit
   for bit**. A block is complete when its last offset, or any later one, was read (offsets
   may have gaps). The trailing, incomplete block is folded into scratch copies only when
   publishing; a restart re-reads it (at most ``B - 1`` records per partition). The write
   batches skip RocksDB's write-ahead log (``options.wal``, off by default): the updates topic
   is the log. Each publication flushes the shards (in the background while its records go
   out, and finished before the group's offset is committed). After a crash a shard holds
   whole blocks and their offset, every complete block before the committed offset among
   them, and the restart reads the records after that offset again: the same blocks, so the
   same bytes.
4. **Skip what is not learned as acted.** UpdateEvents whose ``mode`` is ``shadow`` or ``off``
   describe decisions the policy did not act on: they are counted
   (``banditstream_updates_not_learned{mode}``) and kept out of the posterior (they stay on
   the updates topic for off-policy evaluation). ``join_status=default`` updates are learned:
   their reward is the domain's default reward. ``join_status=not_activated`` updates (a
   deferred decision never activated) are not learned either (counted under
   ``mode="not_activated"``).
   A **reset marker** (``reset = true``, :mod:`streams.reset`) returns every model of its
   tenant/workspace/domain in that partition to its priors at the marker's offset, inside the
   block's fold, so a reset replays as exactly as any update (``banditstream_learner_resets``).
5. **Dedupe.** After a crash the join may emit an UpdateEvent twice (same ``event_id``, same
   key, so the same partition). An update is a duplicate when its ``event_id`` was seen
   earlier in its block or in the ``window_blocks`` blocks before it
   (``options.dedupe_window`` records, rounded up to blocks); duplicates are counted
   (``banditstream_duplicates{kind="update"}``, as their block is folded) and skipped; the
   first copy wins. A copy further back than the window is learned again. The window is a
   function of the log, not stored: on assignment the worker reads the window's records before
   the resume offset again (they only fill the window). So the store holds models and offsets
   only, bounded by the number of models, and the decision is the same on every owner,
   including one that rebuilt the shard from the posterior topic.
6. **Publish.** Every ``options.emit_every_updates`` valid updates read or
   ``options.emit_every_s`` seconds, on revocation and on shutdown, each changed model's
   PosteriorShard (trailing block included) goes to the compacted posterior topic under its
   shard key, **to the partition number of its updates partition**, with the watermark
   ``[{updates topic, partition, next offset}]``. A worker's first publication of a shard
   carries every model the shard holds. After a publication is delivered the group's offset
   is committed to that watermark (lag, and the rebuild below); the store, not the committed
   offset, says where learning resumes.
7. **Assignment.** The shard is opened from the local store and consumption seeks to the
   window's start before the stored offset. If the local store lacks the shard (a new
   worker; in Kubernetes a pod whose volume never held it), or holds one older than the log's
   start, the shard is rebuilt from the posterior topic (:mod:`streams._learn_rebuild`): the
   latest PosteriorShard per key, each model resuming at its own watermark. That is exact
   (nothing lost or counted twice) but not bit for bit: the previous owner's trailing block is
   cut where it published. A stale local shard (the partition lived elsewhere meanwhile) is
   still correct: the state at any offset is a function of the log, so replaying from the
   stale offset recomputes it. On revocation the worker publishes and commits before it lets
   go, so the next owner starts from both. Each worker needs its own ``state_dir`` (a revoked
   shard stays open until the new assignment shows whether it comes back): a second worker
   started on one is refused at once (:class:`~learner.statelock.StateLock` on
   ``state_dir/learn/LOCK``; the CLI prints one line and exits 2).
8. **Shut down** on SIGTERM/SIGINT (or ``stop``): finish the batch, publish, commit, close the
   consumer so the group rebalances at once, close the shards, exit 0.

Options (:class:`LearnerOptions`) come from the configuration's ``learn`` section
(``WorkerConfig.extra["learn"]``), e.g. ``BANDITSTREAM_LEARN__BLOCK_SIZE=2048``.

Metrics (Prometheus, ``config.metrics_port``; 0 picks a free port, which is logged): records
in, block sizes, apply latency (fold + state write per block), shards emitted, dead letters by
reason, consumer lag per partition (librdkafka statistics), duplicates, updates not learned by
mode, partitions assigned.

    config = load_settings("banditstream.toml").worker_config()
    run_learner(config)                  # until SIGTERM
"""

from __future__ import annotations

import logging
import shutil
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from prometheus_client import Counter, Gauge

from learner.policies import SHARED_ARM
from learner.policies.base import FORMAT_MAJOR
from learner.statelock import StateLock
from learner.store import ArmKey, PosteriorStore
from streams._gaps import GapCheck
from streams._learn_rebuild import read_published
from streams._learn_shard import RESET, BlockStats, DomainModel, ShardLearner, Update
from streams.client import EventProducer
from streams.deadletter import DeadLetters
from streams.errors import DecodeError, UnknownDomain, ValidationError, WrongDimension
from streams.metrics import WorkerMetrics
from streams.topics import TopicError, check_topics
from streams.validation import Validator
from streams.worker import WorkerConfig

__all__ = [
    "FeatureHashMismatch",
    "InvalidId",
    "Learner",
    "LearnerOptions",
    "MissingArm",
    "NegativeWeight",
    "ValueOutOfRange",
    "WrongShardKey",
    "run_learner",
]

log = logging.getLogger("banditstream.learn")

WORKER = "learn"
_MODEL_KEY_CACHE = 100_000
#: Bound on |feature|, |reward| and weight: squares and sums of many stay far from overflow,
#: so one record can never make a model's statistics infinite (and every later block fail).
_MAGNITUDE = 1e100


# -- what the learner refuses beyond the boundary validator ----------------------------------


class FeatureHashMismatch(ValidationError):
    """The update's features were hashed with another feature configuration than the domain's."""

    reason = "feature_hash_mismatch"


class NegativeWeight(ValidationError):
    """An importance weight below zero."""

    reason = "negative_weight"


class ValueOutOfRange(ValidationError):
    """A finite feature, reward or weight so large that the statistics it feeds could overflow."""

    reason = "out_of_range"


class MissingArm(ValidationError):
    """A per-arm model's update without the acted arm's id."""

    reason = "missing_arm"


class InvalidId(ValidationError):
    """A tenant, workspace or arm id the store cannot key (empty, or containing NUL)."""

    reason = "invalid_id"


class WrongShardKey(ValidationError):
    """The record's Kafka key is not its model's shard key, so it may sit in another model's shard."""

    reason = "wrong_shard_key"


# -- options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LearnerOptions:
    """The learner's knobs; defaults suit production. Read from ``WorkerConfig.extra``."""

    #: Consumer group; default ``banditstream-learn.<updates topic>``.
    group_id: str | None = None
    #: Records per block (see the module docstring): the unit of folding and of persistence.
    block_size: int = 1024
    #: Records per partition whose event_ids are remembered for dedupe (rounded up to blocks).
    dedupe_window: int = 16_384
    #: Publish after this many learned updates ...
    emit_every_updates: int = 5_000
    #: ... or after this many seconds, whichever comes first.
    emit_every_s: float = 2.0
    #: Records per ``consume`` call.
    max_poll_records: int = 5_000
    poll_timeout_s: float = 0.2
    #: How long a publication may take to be acknowledged before it is retried.
    flush_timeout_s: float = 30.0
    #: How long reading the posterior topic for a rebuild may take.
    rebuild_timeout_s: float = 120.0
    #: Write RocksDB's write-ahead log. Off by default: the updates topic is the log. Each
    #: publication writes the blocks folded since the last one and flushes the shards before it
    #: commits, and a crash loses only the blocks since then, which the restart reads again from
    #: the topic and folds to the same bytes. With it on every block is written as it is folded.
    #: Turn it on when the topic's retention may not outlast the time between publications.
    wal: bool = False

    def __post_init__(self) -> None:
        for name in ("block_size", "emit_every_updates", "max_poll_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dedupe_window < 0:
            raise ValueError(f"dedupe_window must be >= 0, got {self.dedupe_window}")
        for name in ("emit_every_s", "poll_timeout_s", "flush_timeout_s", "rebuild_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not isinstance(self.wal, bool):
            raise ValueError(f"wal must be true or false, got {self.wal!r}")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> LearnerOptions:
        """Options from ``WorkerConfig.extra``: its ``learn`` section (the configuration's
        ``learn:``), or else its top level, where other workers' sections (mappings) are
        skipped. An unknown option raises TypeError naming it, a bad value ValueError."""
        if "learn" in extra:
            return cls(**dict(extra["learn"] or {}))
        return cls(**{k: v for k, v in extra.items() if not isinstance(v, Mapping)})

    @property
    def window_blocks(self) -> int:
        return -(-self.dedupe_window // self.block_size)

    def group(self, updates_topic: str) -> str:
        return self.group_id or f"banditstream-learn.{updates_topic}"


# -- the worker ------------------------------------------------------------------------------


class Learner:
    """One learner worker process. :func:`run_learner` is the entry point."""

    def __init__(self, config: WorkerConfig, options: LearnerOptions | None = None) -> None:
        self.config = config
        self.options = options or LearnerOptions.from_extra(config.extra)
        self.topic = config.topics.updates
        self.group_id = self.options.group(self.topic)
        self.domains = {name: DomainModel.of(settings) for name, settings in config.domains.items()}
        self.validator = Validator(config.limits)
        registry = config.registry_client()
        # (a shared model's candidate rows are for evaluation: stepped over, never built)
        self.update_serde = config.serde("update", topic=self.topic, registry=registry, skip=("candidate_features",))
        self.posterior_serde = config.serde("posterior", topic=config.topics.posterior, registry=registry)
        self.store = PosteriorStore(config.state_dir / WORKER, wal=self.options.wal)

        self.metrics = WorkerMetrics(WORKER)
        registry_ = self.metrics.registry
        self.not_learned = Counter(
            "banditstream_updates_not_learned",
            "Valid updates not learned as acted, by mode (shadow, off, not_activated; before_reset: decided before the domain's reset).",
            ["worker", "mode"], registry=registry_,
        )  # fmt: skip
        self.resets = Counter(
            "banditstream_learner_resets", "Model-reset markers read (a domain's models in one partition back to their priors).",
            ["domain"], registry=registry_,
        )  # fmt: skip
        self.assigned = Gauge("banditstream_partitions_assigned", "Updates partitions owned.", ["worker"], registry=registry_)
        self.stored_offset = Gauge(
            "banditstream_learner_stored_offset",
            "Offset after the last block written to the store, per partition (every block with "
            "learn.wal on; with it off, each publication writes and flushes the blocks folded since the last).",
            ["partition"], registry=registry_,
        )  # fmt: skip

        self.dead_letters = DeadLetters(
            EventProducer(config.kafka),
            config.topics.deadletter,
            worker=WORKER,
            serde=config.deadletter_serde(registry),
            on_dead_letter=self.metrics.dead_letter,
        )
        self._producer = Producer(config.kafka.producer_config())
        self._delivery_failures = 0
        self._consumer: Consumer | None = None
        self._gaps: GapCheck  # on the consumer, once it is made

        self._shards: dict[int, ShardLearner] = {}
        self._parked: dict[int, ShardLearner] = {}  # revoked, kept in case they come straight back
        self._dead_letter_from: dict[int, int] = {}
        self._publish_all: set[int] = set()  # shards whose next publication carries every model
        self._fed_since_publish = 0  # valid updates read since the last publication
        self._model_keys: dict[tuple[str, str, str, str], tuple[ArmKey, bytes]] = {}
        self._last_publish = time.monotonic()

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Learn until ``stop`` is set. Refused at once with :class:`~learner.errors.StateDirLocked`
        when another worker holds this state directory (two writers would corrupt it)."""
        lock = StateLock(self.store.root)  # before anything reads or writes the state
        try:
            self._run(stop)
        finally:
            lock.close()  # after _shutdown closed the shards

    def _run(self, stop: threading.Event) -> None:
        counts = check_topics(self.config.kafka, self.config.topics)
        posterior = self.config.topics.posterior
        if counts[posterior] < counts[self.topic]:
            raise TopicError(
                f"topic {posterior!r} has {counts[posterior]} partitions, fewer than {self.topic!r} "
                f"({counts[self.topic]}): the learner publishes shard p to posterior partition p"
            )
        port = self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
        log.info("learner metrics on http://%s:%d/metrics; group %s", self.config.metrics_host, port, self.group_id)
        consumer = Consumer(
            self.config.kafka.consumer_config(
                self.group_id,
                **{"stats_cb": self.metrics.on_stats, "statistics.interval.ms": 5000, "enable.partition.eof": False},
            )
        )
        self._consumer = consumer
        self._gaps = GapCheck(consumer, self.config.kafka.broker_profile.gap_confirm_s,
                              on_gap=lambda topic, outcome: self.metrics.log_gaps.labels(WORKER, topic, outcome).inc())
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        try:
            while not stop.is_set():
                messages = consumer.consume(self.options.max_poll_records, self.options.poll_timeout_s)
                self._gaps.tick()
                if messages:
                    self._handle(messages)
                self._maybe_publish()
        finally:
            self._shutdown()

    def _handle(self, messages: list[Message]) -> None:
        good: list[Message] = []
        admit = self._gaps.admit
        for message in messages:
            error = message.error()
            if error is None:
                if admit(message):  # (else read again: see streams._gaps)
                    good.append(message)
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume error: %s", error.str())
        if not good:
            return
        self.metrics.records_in.labels(WORKER, self.topic).inc(len(good))
        decoded = self.update_serde.decode_batch([m.value() or b"" for m in good])
        shards = self._shards
        fed = 0
        dead_letter_from = self._dead_letter_from
        for message, record in zip(good, decoded):
            partition = message.partition()
            shard = shards.get(partition)
            offset = message.offset()
            if shard is None:
                continue
            # Before the shard's position a record was learned already; it is only checked
            # again from the committed offset on, for dead letters a crash may have lost.
            fresh = offset >= shard.position
            if not fresh and offset < dead_letter_from.get(partition, 0):
                continue
            update = None
            if isinstance(record, DecodeError):
                self._dead_letter(message, record)
            elif record["reset"]:
                update = self._reset_marker(record, partition, offset, fresh)
            else:
                try:
                    update = self._parse(record, message.key(), offset, len(message.value() or b""))
                except ValidationError as error:
                    self._dead_letter(message, error)
            if fresh:
                fed += update is not None
                shard.feed(offset, update)
        self._fed_since_publish += fed
        self.dead_letters.producer.poll(0)

    def _parse(self, record: dict, key: bytes | None, offset: int, size: int | None = None) -> Update:
        """The update in ``record`` (decoded from ``size`` bytes), or the ValidationError that
        dead-letters it."""
        self.validator.validate_update(record, encoded_size=size)
        domain = record["domain"]
        model = self.domains.get(domain)
        if model is None:
            known = ", ".join(sorted(self.domains)) or "none"
            raise UnknownDomain("domain", domain, f"not a configured domain (known: {known})")
        features = record["features"]
        if len(features) != model.dimension:
            raise WrongDimension(
                "len(features)", len(features), f"domain {domain!r} learns rows of dimension {model.dimension}"
            )
        feature_hash = record["feature_hash"]
        if feature_hash and feature_hash != model.feature_hash:
            raise FeatureHashMismatch(
                "feature_hash", feature_hash, f"domain {domain!r} hashes features with configuration {model.feature_hash}"
            )
        weight, reward = record["weight"], record["reward"]
        if weight < 0:
            raise NegativeWeight("weight", weight, "importance weights must be >= 0")
        if not (-_MAGNITUDE < min(features) and max(features) < _MAGNITUDE):
            worst = max(features, key=abs)
            raise ValueOutOfRange("features", worst, f"magnitudes must stay below {_MAGNITUDE:g}")
        for name, value in (("reward", reward), ("weight", weight)):
            if not -_MAGNITUDE < value < _MAGNITUDE:
                raise ValueOutOfRange(name, value, f"magnitudes must stay below {_MAGNITUDE:g}")
        ids = (record["tenant"], record["workspace"], domain, record["arm"])
        known_key = self._model_keys.get(ids)
        if known_key is None:
            known_key = self._model_key(ids, model)
        model_key, shard_key = known_key
        if key != shard_key:
            raise WrongShardKey("key", key, f"an update of this model is keyed {shard_key.decode()!r}")
        # a deferred decision never activated is kept for evaluation, never learned
        mode = "not_activated" if record["join_status"] == "not_activated" else record["mode"]
        return Update(offset, record["event_id"], model_key, features, reward, weight, mode, record["decision_time"])

    def _reset_marker(self, record: dict, partition: int, offset: int, fresh: bool) -> Update | None:
        """The reset marker in ``record`` as an update to fold, or None for a domain not
        configured here (there is nothing of it to reset)."""
        if record["domain"] not in self.domains:
            return None
        key = ArmKey(record["tenant"], record["workspace"], record["domain"], SHARED_ARM)
        if fresh:
            self.resets.labels(key.domain).inc()
            log.warning("partition %d, offset %d: %s reset to its priors", partition, offset, "/".join(key[:3]))
        return Update(offset, record["event_id"], key, [], 0.0, 0.0, RESET, record["decision_time"])

    def _model_key(self, ids: tuple[str, str, str, str], model: DomainModel) -> tuple[ArmKey, bytes]:
        """The model an update of (tenant, workspace, domain, arm) folds into, and its shard key."""
        tenant, workspace, domain, arm = ids
        for name, value in (("tenant", tenant), ("workspace", workspace)):
            if not value or "\x00" in value:
                raise InvalidId(name, value, "must be non-empty and free of NUL")
        if "\x00" in arm:
            raise InvalidId("arm", arm, "must be free of NUL")
        if model.shared:
            model_key = ArmKey(tenant, workspace, domain, SHARED_ARM)
        elif not arm:
            raise MissingArm("arm", arm, f"domain {domain!r} keeps one model per arm and needs the acted arm's id")
        else:
            model_key = ArmKey(tenant, workspace, domain, arm)
        if len(self._model_keys) >= _MODEL_KEY_CACHE:
            self._model_keys.clear()
        known = self._model_keys[ids] = (model_key, str(model_key).encode())
        return known

    def _dead_letter(self, message: Message, error: Exception) -> None:
        partition = message.partition()
        if message.offset() < self._dead_letter_from.get(partition, 0):
            return  # read again after a restart: dead-lettered when it was first read
        self.dead_letters.send(
            source_topic=message.topic(), partition=partition, offset=message.offset(), key=message.key(),
            value=message.value(), error=error,
        )  # fmt: skip

    def _on_block(self, stats: BlockStats) -> None:
        self.metrics.batch_size.labels(WORKER).observe(stats.learned)
        self.metrics.apply_latency.labels(WORKER).observe(stats.seconds)
        if stats.duplicates:
            self.metrics.duplicates.labels(WORKER, "update").inc(stats.duplicates)
        for mode, count in stats.not_acted.items():
            self.not_learned.labels(WORKER, mode).inc(count)

        if stats.persisted:
            shard = self._shards.get(stats.partition)
            if shard is not None:
                self.stored_offset.labels(str(stats.partition)).set(shard.stored_offset or 0)

    # -- publishing ------------------------------------------------------------------------

    def _maybe_publish(self) -> None:
        if self._fed_since_publish >= self.options.emit_every_updates or (
            time.monotonic() - self._last_publish >= self.options.emit_every_s
        ):
            self._publish(list(self._shards))

    def _publish(self, partitions: list[int], *, sync_commit: bool = False) -> bool:
        """Publish the changed models of ``partitions``; commit their watermarks once delivered.

        Returns whether every publication was delivered. On failure nothing is committed and
        the models stay marked as changed, so the next publication carries them again.
        """
        if not self.options.wal:  # the blocks folded so far: written, then to disk while the records go out
            self._persist(partitions)
            self._flush_stores(partitions, wait=False)
        posterior = self.config.topics.posterior
        produced: list[tuple[int, int, set[ArmKey]]] = []
        failures_before = self._delivery_failures
        now_ms = int(time.time() * 1000)
        for partition in partitions:
            shard = self._shards.get(partition)
            if shard is None or not shard.publishable:
                continue
            keys = set(shard.dirty)
            if partition in self._publish_all:
                keys.update(shard.keys())
            watermark = shard.position
            for model in shard.snapshot(sorted(keys)) if keys else ():
                key, state, drift, reset_time = model
                record = {
                    "tenant": key.tenant,
                    "workspace": key.workspace,
                    "domain": key.domain,
                    "arm": key.arm,
                    "policy": state.policy,
                    "dimension": state.dimension,
                    "state": state.state,
                    "state_major": FORMAT_MAJOR,
                    "update_count": state.update_count,
                    "watermark": [{"topic": self.topic, "partition": partition, "offset": watermark}],
                    "feature_hash": state.feature_hash,
                    "drift_trace": drift.cov_trace,
                    "drift_norm": drift.spectral_norm,
                    "emitted_at": now_ms,
                    "reset_time": reset_time,
                }
                self._produce(posterior, partition, str(key), self.posterior_serde.encode(record))
            produced.append((partition, watermark, keys))
        self._fed_since_publish = 0
        self._last_publish = time.monotonic()
        if not produced:
            return True
        remaining = self._producer.flush(self.options.flush_timeout_s)
        if remaining or self._delivery_failures != failures_before:
            log.warning(
                "publication not acknowledged (%d pending, %d failed); retrying with the next one",
                remaining, self._delivery_failures - failures_before,
            )  # fmt: skip
            return False
        offsets = []
        for partition, watermark, keys in produced:
            self._shards[partition].dirty.difference_update(keys)
            self._publish_all.discard(partition)
            offsets.append(TopicPartition(self.topic, partition, watermark))
        # Nor the blocks the store holds: after a crash the store has every block before the
        # committed offset (waits for the flush started above, if it has not finished).
        if not self.options.wal:
            self._flush_stores([partition for partition, _, _ in produced], wait=True)
        # A committed offset never passes a bad record whose dead letter is not on the topic:
        # a restart checks again from the committed offset on (see _open).
        if self.dead_letters.settle(self.options.flush_timeout_s):
            self._commit(offsets, asynchronous=not sync_commit)
        else:
            log.warning("offsets not committed: %d dead letters not acknowledged; sending them again",
                        self.dead_letters.outstanding)
        return True

    def _persist(self, partitions: Iterable[int]) -> None:
        """Write each shard's folded blocks not written yet (learn.wal off: see
        :meth:`ShardLearner.persist`)."""
        for partition in partitions:
            shard = self._shards.get(partition)
            if shard is not None and shard.persist():
                self.stored_offset.labels(str(partition)).set(shard.stored_offset or 0)

    def _flush_stores(self, partitions: list[int], *, wait: bool) -> None:
        for partition in partitions:
            if partition in self._shards:
                self._shards[partition].shard.flush(wait=wait)

    def _produce(self, topic: str, partition: int, key: str, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, partition=partition, on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            self.metrics.shards_emitted.inc()
        else:
            self._delivery_failures += 1
            log.warning("posterior shard %s not delivered: %s", message.key(), error.str())

    def _commit(self, offsets: list[TopicPartition], *, asynchronous: bool) -> None:
        if not offsets or self._consumer is None:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except KafkaException as exc:  # e.g. the group moved on; the store is the truth anyway
            log.warning("offset commit failed: %s", exc.args[0].str() if exc.args else exc)

    # -- partition ownership ---------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        fresh = [tp.partition for tp in partitions if tp.partition not in self._parked]
        opened = self._open(consumer, fresh)
        for tp in partitions:
            parked = self._parked.pop(tp.partition, None)
            shard = parked or opened[tp.partition]
            self._shards[tp.partition] = shard
            if parked is not None:  # everything before its position was checked by this process
                self._dead_letter_from[tp.partition] = shard.position
            tp.offset = min(shard.position, self._dead_letter_from[tp.partition])
        self._gaps.expect({(self.topic, tp.partition): tp.offset for tp in partitions})
        consumer.assign(partitions)
        for partition in list(self._parked):
            self._close(self._parked.pop(partition))
        self.assigned.labels(WORKER).set(len(self._shards))
        log.info("assigned %s", sorted(self._shards))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._gaps.forget((self.topic, tp.partition) for tp in partitions)
        owned = [tp.partition for tp in partitions if tp.partition in self._shards]
        self._publish(owned, sync_commit=True)
        for partition in owned:
            self._parked[partition] = self._shards.pop(partition)
        self.assigned.labels(WORKER).set(len(self._shards))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another member may own them already: publish and commit nothing.
        self._gaps.forget((self.topic, tp.partition) for tp in partitions)
        for tp in partitions:
            shard = self._shards.pop(tp.partition, None)
            if shard is not None:
                self._close(shard)
        self.assigned.labels(WORKER).set(len(self._shards))
        log.warning("lost partitions %s", sorted(tp.partition for tp in partitions))

    def _open(self, consumer: Consumer, partitions: list[int]) -> dict[int, ShardLearner]:
        """The shards of ``partitions``: from the local store, else rebuilt from the posterior topic."""
        if not partitions:
            return {}
        tps = [TopicPartition(self.topic, p) for p in partitions]
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10) if tp.offset >= 0}
        common = dict(
            block_size=self.options.block_size, window_blocks=self.options.window_blocks, on_block=self._on_block,
            persist_every_block=self.options.wal,  # without the log, a write lasts only once flushed: see _publish
        )  # fmt: skip
        shards: dict[int, ShardLearner] = {}
        rebuild: dict[int, tuple[Any, int]] = {}
        lows: dict[int, int] = {}
        for tp in tps:
            partition = tp.partition
            low, _ = consumer.get_watermark_offsets(tp, timeout=10, cached=False)  # the low end is trustworthy
            lows[partition] = low
            db = self.store.shard(partition)
            stored = db.offsets().get((self.topic, partition))
            if stored is not None and stored < low:
                log.warning(
                    "shard %d: local state ends at offset %d but the log starts at %d; rebuilding",
                    partition, stored, low,
                )  # fmt: skip
                self.store.close_shard(partition)
                shutil.rmtree(self.store.shard_path(partition))
                db, stored = self.store.shard(partition), None
            if stored is None:
                rebuild[partition] = (db, low)
                continue
            shard = ShardLearner(partition, self.topic, self.domains, db, start=stored, **common)
            loaded = shard.load_stored()
            log.info("shard %d: %d models from the local store at offset %d", partition, loaded, stored)
            shards[partition] = shard
        if rebuild:
            published = read_published(
                self.config.kafka, self.config.topics.posterior, self.topic, sorted(rebuild), self.posterior_serde,
                timeout=self.options.rebuild_timeout_s,
            )  # fmt: skip
            for partition, (db, low) in rebuild.items():
                start = committed.get(partition, low)
                shards[partition] = self._rebuild(partition, db, start, published[partition], common)
        for partition, shard in shards.items():
            # From the committed offset on, a bad record's dead letter may have died with the
            # previous process (sent, not acknowledged): check those records again.
            self._dead_letter_from[partition] = committed.get(partition, lows[partition])
            self._publish_all.add(partition)
        return shards

    def _rebuild(self, partition: int, db, committed: int, published: dict, common: dict) -> ShardLearner:
        """A shard from its models' latest published states (see :mod:`streams._learn_rebuild`)."""
        usable = {key: p for key, p in published.items() if key.domain in self.domains}
        floors = {key: p.watermark for key, p in usable.items()}
        start = min([committed, *floors.values()])
        if not usable:
            # Nothing learned before ``start`` (see _learn_rebuild): the empty state at ``start``
            # is exact, so store it now. A restart then folds the same blocks from the local
            # store instead of rebuilding from publications of a trailing block, which would
            # cut that block differently (exact, but not bit for bit).
            db.apply({}, {(self.topic, partition): start})
        shard = ShardLearner(
            partition, self.topic, self.domains, db,
            start=start, floors=floors, persist_from=max(floors.values(), default=start), **common,
        )  # fmt: skip
        for key, p in usable.items():
            r = p.record
            shard.load_published(key, r["policy"], r["dimension"], r["feature_hash"], r["state"], r["reset_time"])
        log.info(
            "shard %d: not in the local store; rebuilt %d models from %s, resuming at offset %d",
            partition, len(usable), self.config.topics.posterior, start,
        )  # fmt: skip
        return shard

    def _close(self, shard: ShardLearner) -> None:
        try:
            shard.persist()  # the blocks folded since the last publication (closing flushes them)
        except Exception:  # closing goes on: the restart folds those blocks again from the topic
            log.exception("shard %d: could not write its last blocks before closing", shard.partition)
        self.store.close_shard(shard.partition)

    # -- shutdown --------------------------------------------------------------------------

    def _shutdown(self) -> None:
        consumer, self._consumer = self._consumer, None
        try:
            if consumer is not None:
                self._consumer = consumer
                self._publish(list(self._shards), sync_commit=True)
                self._consumer = None
                consumer.close()  # leaves the group: the others rebalance at once
                log.info("stopped: published, committed and left the group")
        finally:
            for shard in [*self._shards.values(), *self._parked.values()]:
                self._close(shard)
            self._shards.clear()
            self._parked.clear()
            if not self.dead_letters.settle(self.options.flush_timeout_s):
                log.warning("%d dead letters not acknowledged at shutdown; the next start sends them again",
                            self.dead_letters.outstanding)
            self._producer.flush(self.options.flush_timeout_s)
            self.store.close()
            self.metrics.close()


def run_learner(
    config: WorkerConfig,
    *,
    stop: threading.Event | None = None,
    options: LearnerOptions | None = None,
) -> None:
    """Run the learner until ``stop`` is set or SIGTERM/SIGINT arrives (then shut down cleanly).

    Signal handlers are installed only when called from the main thread.
    """
    stop = stop if stop is not None else threading.Event()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        Learner(config, options).run(stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
