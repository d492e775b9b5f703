"""The publisher worker: the compacted posterior topic in, signed snapshots out.

The only module of the publisher that reads Kafka (through :mod:`streams`). It runs:

1. **Read.** Consume every partition of the posterior topic from the beginning (its own
   consumer group, never committed: the topic is compacted, so a restart re-reads the latest
   state of every model) and keep the latest PosteriorShard per model key
   (tenant/workspace/domain/arm) of this worker's tenant and workspace, and the latest
   normaliser statistics of each join partition per domain (``policy`` ``normalizer``, any
   tenant: a domain's join normalises every tenant's features alike).
2. **Decide.** A domain is due when ``every_updates`` updates arrived since its last publish
   attempt, or ``every_seconds`` passed since then with at least one new update, or when asked
   (``publish_now``, set by ``SIGUSR2`` in ``banditstream publish``): then every domain with a
   new update is due at once, whatever the timers say.
3. **Publish.** Rebuild the domain's policy from its shards (each arm's state blob, the
   learner's drift statistics, the watermarks as source offsets) and hand it to
   :meth:`~publisher.publish.Publisher.publish`, with the join partitions' normaliser
   statistics merged (for a domain that normalises): guards, version, sign, upload. A guard
   failure or a lost version race is logged and counted; the domain is tried again at its
   next due time.
4. **Keep metadata fresh.** Every ``refresh_every_seconds``, re-sign the timestamp (and
   snapshot/targets) of each published domain that is about to expire, so clients never see
   expired metadata while the publisher runs, even without new data.
5. **Gate.** A domain with a ``promotion`` canary share is *gated*: its first version goes to
   both channels, every later one to ``canary`` only, and never while a canary awaits its
   verdict (learning goes on in the state; the next canary carries it). Every
   ``promotion.every_s`` the :class:`~publisher.gate.Gate` judges the pending canary from the
   joined log, which the worker tails from the updates topic (:class:`GateLog`): promote,
   roll back, or wait and say why; logged and exported as metrics.
6. **Portfolio.** A domain whose policy is a ``portfolio`` is judged at each publish
   (:mod:`publisher.portfolio`): the rows the new snapshot learned since the previous one,
   tailed from the updates topic, are scored by the previous snapshot's members, and the
   snapshot carries who acts.

    run_publisher(settings.worker_config(), PublisherSettings(store, keys, root), stop=event)
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from learner.domain import DomainSettings
from learner.features import Normalizer
from learner.policies import FORMAT_MAJOR, Drift, Policy, PolicyError, Portfolio
from learner.evaluation.errors import EvaluationError
from publisher.errors import GuardFailed, PublisherError, VersionConflict
from publisher.gate import Gate, GateConfig, GateDecision, GateMetrics, nothing_to_gate
from publisher.portfolio import PortfolioJudge, PortfolioLog, PortfolioMetrics, Verdict
from publisher.publish import Publisher, PublisherConfig, PublisherMetrics
from publisher.signing import KeyRing
from publisher.snapshot import SourceOffset
from publisher.stores import SnapshotStore
from streams.client import BatchConsumer
from streams.topics import check_topics
from streams.worker import NORMALIZER_POLICY, WorkerConfig

__all__ = ["PosteriorTable", "PublisherSettings", "PublisherStats", "policy_from_shards", "run_publisher"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherSettings:
    """What the publisher worker needs besides the WorkerConfig: where and how to publish."""

    store: SnapshotStore
    keys: KeyRing
    root: bytes
    config: PublisherConfig = field(default_factory=PublisherConfig)
    #: Publish a domain once this many updates arrived since its last attempt ...
    every_updates: int = 1000
    #: ... or once this long passed since then, if anything arrived.
    every_seconds: float = 60.0
    #: How often expiring metadata is re-signed.
    refresh_every_seconds: float = 60.0
    poll_timeout: float = 0.5
    max_records: int = 1000
    #: Consumer group; default: one of its own per process, so every replica reads everything.
    group_id: str | None = None
    #: Newest logged decisions kept per gated domain for the gate (since its canary).
    gate_max_rows: int = 200_000
    #: Logged rows kept per portfolio domain awaiting the publish that judges them.
    portfolio_max_rows: int = 200_000


@dataclass
class PublisherStats:
    """What a run did (returned when it stops)."""

    records: int = 0
    undecodable: int = 0
    ignored: int = 0
    published: list[tuple[str, str]] = field(default_factory=list)
    guard_failures: int = 0
    conflicts: int = 0
    errors: int = 0
    #: publishes of a gated domain held back while its canary awaited a verdict
    held: int = 0
    #: the newest gate decisions
    gate_decisions: deque[GateDecision] = field(default_factory=lambda: deque(maxlen=100))
    #: the newest portfolio verdicts (one per publish of a portfolio domain)
    verdicts: deque[Verdict] = field(default_factory=lambda: deque(maxlen=100))


class PosteriorTable:
    """The latest PosteriorShard per model key, and per domain the updates seen since a mark."""

    def __init__(self, tenant: str, workspace: str, domains: Iterable[str]) -> None:
        self.tenant, self.workspace = tenant, workspace
        self.domains = set(domains)
        self._shards: dict[str, dict[tuple[str, str], dict[str, Any]]] = {d: {} for d in self.domains}
        self._new_updates: dict[str, int] = {d: 0 for d in self.domains}
        #: domain -> join partition (``arm``) -> its latest normaliser record
        self._normalizers: dict[str, dict[str, Mapping[str, Any]]] = {d: {} for d in self.domains}

    def put(self, record: Mapping[str, Any]) -> bool:
        """Keep ``record`` if it is ours and not older than what is held; False if ignored.

        Newer means further along its updates partition (the watermark); a model reset lowers
        the update count, so the count only decides between records without watermarks."""
        if record["policy"] == NORMALIZER_POLICY:
            if record["domain"] not in self.domains:
                return False
            self._normalizers[record["domain"]][record["arm"]] = record
            return True
        if record["tenant"] != self.tenant or record["workspace"] != self.workspace or record["domain"] not in self.domains:
            return False
        shards = self._shards[record["domain"]]
        key = (record["arm"], record["policy"])
        held = shards.get(key)
        if held is not None and _older(record, held):
            return False  # a replayed older state (at-least-once delivery)
        shards[key] = dict(record)  # an equal position may still carry a newer emission
        count = record["update_count"]
        if held is None or count < held["update_count"]:  # new, or reset since
            new = max(1, count)
        else:
            new = count - held["update_count"]
        self._new_updates[record["domain"]] += new
        return True

    def normalizer(self, domain: str, feature_hash: str) -> Normalizer | None:
        """The domain's join partitions' statistics merged, from those recorded under this
        feature configuration (None if there are none)."""
        parts = [
            Normalizer.from_export(json.loads(record["state"]))
            for _, record in sorted(self._normalizers[domain].items())
            if record["feature_hash"] in ("", feature_hash)
        ]
        return Normalizer.merged(parts) if parts else None

    def normalizer_observations(self, domain: str, feature_hash: str) -> int:
        """The decisions in the normaliser records :meth:`normalizer` merges, summed."""
        return sum(int(r["update_count"]) for r in self._normalizers[domain].values() if r["feature_hash"] in ("", feature_hash))

    def shards(self, domain: str) -> list[dict[str, Any]]:
        return [self._shards[domain][k] for k in sorted(self._shards[domain])]

    def new_updates(self, domain: str) -> int:
        return self._new_updates[domain]

    def learned(self, domain: str) -> int:
        """The updates in the domain's held state: its models' update counts, summed."""
        return sum(int(shard["update_count"]) for shard in self._shards[domain].values())

    def mark(self, domain: str) -> None:
        self._new_updates[domain] = 0


def _position(record: Mapping[str, Any]) -> int | None:
    """How far along its updates partition a PosteriorShard is (its furthest watermark)."""
    offsets = [int(mark["offset"]) for mark in record["watermark"]]
    return max(offsets) if offsets else None


def _older(record: Mapping[str, Any], held: Mapping[str, Any]) -> bool:
    """Whether ``record`` is an older state of the model ``held`` is."""
    mine, theirs = _position(record), _position(held)
    if mine is not None and theirs is not None:
        return mine < theirs
    return held["update_count"] > record["update_count"]


def policy_from_shards(
    settings: DomainSettings, shards: Iterable[Mapping[str, Any]]
) -> tuple[Policy, dict[str, Drift], list[SourceOffset], list[str]]:
    """The domain's policy rebuilt from its shards, the learner's drift statistics, the source
    offsets (per updates partition, the furthest watermark) and warnings for shards left out.
    A portfolio domain takes in state a member's policy learned alone (its model before it
    became a portfolio) until the learner republishes it as the portfolio's."""
    policy = settings.make_policy()
    adopts = policy.adopts if isinstance(policy, Portfolio) else lambda name: False
    feature_hash = settings.features.config_hash()
    drift: dict[str, Drift] = {}
    offsets: dict[tuple[str, int], int] = {}
    skipped: list[str] = []
    for shard in shards:
        arm = shard["arm"]
        adopted = shard["policy"] != settings.policy and adopts(shard["policy"])
        if (shard["policy"] != settings.policy and not adopted) or shard["dimension"] != settings.features.dimension:
            skipped.append(f"arm {arm!r}: {shard['policy']} at d={shard['dimension']}, the domain is {settings.policy} at d={policy.dim}")
            continue
        if shard["feature_hash"] and shard["feature_hash"] != feature_hash:
            skipped.append(f"arm {arm!r}: learned with features {shard['feature_hash']}, the domain hashes with {feature_hash}")
            continue
        if shard["state_major"] != FORMAT_MAJOR:
            skipped.append(f"arm {arm!r}: state major {shard['state_major']}, this code reads {FORMAT_MAJOR}")
            continue
        try:
            if adopted:
                policy.adopt_arm_state(arm, shard["policy"], shard["state"])
            else:
                policy.load_arm_state(arm, shard["state"])
        except PolicyError as exc:
            skipped.append(f"arm {arm!r}: state does not load: {exc}")
            continue
        if shard["drift_trace"] or shard["drift_norm"]:
            drift[arm] = Drift(float(shard["drift_trace"]), float(shard["drift_norm"]))
        for mark in shard["watermark"]:
            key = (mark["topic"], int(mark["partition"]))
            offsets[key] = max(offsets.get(key, 0), int(mark["offset"]))
    sources = [SourceOffset(topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())]
    return policy, drift, sources, skipped


class GateLog:
    """The joined log of the gated domains, tailed from the updates topic (a consumer group of
    its own, from the earliest record): each domain's logged decisions since its pending
    canary was published, the newest ``max_rows``."""

    def __init__(self, config: WorkerConfig, domains: Iterable[str], max_rows: int) -> None:
        self.tenant, self.workspace = config.tenant, config.workspace
        self.serde = config.serde("update", topic=config.topics.updates)
        self.consumer = BatchConsumer(config.kafka, f"banditstream-gate-{uuid.uuid4().hex[:8]}", [config.topics.updates])
        self.rows: dict[str, deque[dict[str, Any]]] = {d: deque(maxlen=max_rows) for d in domains}
        self.since: dict[str, int] = {d: 0 for d in domains}

    def poll(self, timeout: float = 0.0) -> int:
        """One poll; the records read (any domain)."""
        batch = self.consumer.poll_batch(self.serde, max_records=10_000, timeout=timeout)
        for update in batch.records:
            rows = self.rows.get(update["domain"])
            if (rows is not None and update["tenant"] == self.tenant and update["workspace"] == self.workspace
                    and update["decision_time"] >= self.since[update["domain"]] and not update["reset"]):
                rows.append(update)
        return len(batch.messages) + len(batch.failures)

    def read_to_end(self, budget_s: float = 5.0) -> None:
        """Poll until a poll finds nothing (or ``budget_s`` runs out)."""
        deadline = time.monotonic() + budget_s
        while self.poll(0.2) and time.monotonic() < deadline:
            pass

    def read(self, domain: str, since_ms: int) -> list[dict[str, Any]]:
        """The domain's rows decided at or after ``since_ms``; older ones are let go."""
        self.since[domain] = since_ms
        rows = self.rows[domain]
        if any(row["decision_time"] < since_ms for row in rows):
            kept = [row for row in rows if row["decision_time"] >= since_ms]
            rows.clear()
            rows.extend(kept)
        return list(rows)

    def close(self) -> None:
        self.consumer.close()


class _PublisherWorker:
    """One run of the worker loop; see the module docstring for the steps."""

    def __init__(
        self, config: WorkerConfig, settings: PublisherSettings, metrics: PublisherMetrics | None,
        publish_now: threading.Event | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.settings = settings
        self.publisher = Publisher(
            settings.store, settings.keys, settings.root, domains=config.domains, tenant=config.tenant,
            workspace=config.workspace, config=settings.config, metrics=metrics,
        )  # fmt: skip
        self.table = PosteriorTable(config.tenant, config.workspace, config.domains)
        self.stats = PublisherStats()
        now = time.monotonic()
        self._last_attempt = {d: now for d in config.domains}
        self._last_refresh = now
        self._started = now
        #: No publish before the compacted topic has been read to its end once (an empty poll),
        #: or every_seconds after the start: a snapshot built half-way would lack arms.
        self._caught_up = False
        self._published: set[str] = set()
        #: set (by SIGUSR2 in the CLI) to make every domain with new learning due at once
        self._publish_now = publish_now or threading.Event()
        #: domain -> its gate's settings, for the domains with a canary share
        self.gated = {
            name: GateConfig.from_settings(d.promotion)
            for name, d in config.domains.items() if getattr(d, "promotion", None) is not None and d.promotion.canary_share > 0
        }  # fmt: skip
        self.gate_log: GateLog | None = None
        self.gate: Gate | None = None
        if self.gated:
            self.gate_log = GateLog(config, self.gated, settings.gate_max_rows)
            self.gate = Gate(self.publisher, self.gate_log.read,
                             metrics=GateMetrics(metrics.registry) if metrics is not None else None)
        self._next_gate = {d: now + config.domains[d].promotion.every_s for d in self.gated}
        portfolios = [name for name, d in config.domains.items() if getattr(d, "policy", None) == "portfolio"]
        self.judge: PortfolioJudge | None = None
        if portfolios:
            self.judge = PortfolioJudge(
                self.publisher, PortfolioLog(config, portfolios, settings.portfolio_max_rows), config.domains,
                metrics=PortfolioMetrics(metrics.registry) if metrics is not None else None,
            )  # fmt: skip

    def run(self, stop: threading.Event, idle_timeout: float | None) -> PublisherStats:
        s = self.settings
        group = s.group_id or f"banditstream-publisher-{self.config.tenant}-{self.config.workspace}-{uuid.uuid4().hex[:8]}"
        serde = self.config.serde("posterior", topic=self.config.topics.posterior)
        last_record = time.monotonic()
        try:
            with BatchConsumer(self.config.kafka, group, [self.config.topics.posterior]) as consumer:
                while not stop.is_set():
                    batch = consumer.poll_batch(serde, max_records=s.max_records, timeout=s.poll_timeout)
                    if batch.next_offsets:
                        last_record = time.monotonic()
                    else:
                        self._caught_up = True
                    self._read(batch)
                    if self.gate_log is not None:
                        self.gate_log.poll()
                    if self.judge is not None:
                        self.judge.log.poll()
                    if not self._caught_up and time.monotonic() - self._started < s.every_seconds:
                        continue
                    for domain in self._due():
                        self._publish(domain)
                    self._run_gates()
                    self._refresh_metadata()
                    if idle_timeout is not None and time.monotonic() - last_record > idle_timeout:
                        break
        finally:
            if self.gate_log is not None:
                self.gate_log.close()
            if self.judge is not None:
                self.judge.close()
        return self.stats

    def _read(self, batch: Any) -> None:
        for failure in batch.failures:
            self.stats.undecodable += 1
            log.warning("posterior record %s[%d]@%d does not decode: %s", failure.topic, failure.partition, failure.offset, failure.error)
        touched = set()
        for record in batch.records:
            self.stats.records += 1
            if not self.table.put(record):
                self.stats.ignored += 1
            else:
                touched.add(record["domain"])
        for domain in touched & self.table.domains:
            self.publisher.metrics.learned.labels(domain).set(self.table.learned(domain))
            if self.config.domains[domain].features.normalize:
                observations = self.table.normalizer_observations(domain, self.config.domains[domain].features.config_hash())
                self.publisher.metrics.normalizer_observations.labels(domain).set(observations)

    def _due(self) -> list[str]:
        now = time.monotonic()
        asked = self._publish_now.is_set()
        if asked:
            self._publish_now.clear()
            log.info("asked to publish now")
        due = []
        for domain in self.config.domains:
            new = self.table.new_updates(domain)
            if new >= self.settings.every_updates or (new > 0 and (asked or now - self._last_attempt[domain] >= self.settings.every_seconds)):
                due.append(domain)
        return due

    def _publish(self, domain: str) -> None:
        self._last_attempt[domain] = time.monotonic()
        channels = None
        if domain in self.gated:
            try:
                head = self.publisher.repository(domain).head()
            except PublisherError as exc:
                self.stats.errors += 1
                log.error("%s: reading the channels failed: %s", domain, exc)
                return
            stable, canary = head.channel_head("stable"), head.channel_head("canary")
            if stable is not None:
                if nothing_to_gate(stable, canary) is None:
                    self.stats.held += 1
                    log.info("%s: canary %s awaits the gate's verdict; the new state waits", domain, canary.version)
                    return
                channels = ("canary",)
        # Marked only now: state learned while a canary was held still counts as new, so it
        # ships as the next canary right after the verdict, without waiting for more traffic.
        self.table.mark(domain)
        policy, drift, offsets, skipped = policy_from_shards(self.config.domains[domain], self.table.shards(domain))
        for warning in skipped:
            log.warning("%s: shard left out of the snapshot: %s", domain, warning)
        if self._unchanged(domain, policy, offsets):
            return
        if self.judge is not None:
            try:
                verdict = self.judge.judge(domain, policy, offsets)
            except (EvaluationError, PolicyError, ValueError) as exc:
                self.stats.errors += 1
                log.error("%s: judging the portfolio failed (%s); its acting member stays", domain, exc)
            else:
                if verdict is not None:
                    self.stats.verdicts.append(verdict)
        try:
            features = self.config.domains[domain].features
            normalizer = self.table.normalizer(domain, features.config_hash()) if features.normalize else None
            result = self.publisher.publish(domain, policy, normalizer=normalizer, drift=drift, source_offsets=offsets,
                                            channels=channels)
        except GuardFailed:
            self.stats.guard_failures += 1  # logged and counted by the publisher
        except VersionConflict as exc:
            self.stats.conflicts += 1
            log.info("%s: %s; trying again at the next due time", domain, exc)
        except PublisherError as exc:
            self.stats.errors += 1
            log.error("%s: publish failed: %s", domain, exc)
        else:
            self.stats.published.append((domain, result.version))
            self._published.add(domain)
            if self.judge is not None:
                self.judge.published(domain, policy, offsets)

    def _run_gates(self) -> None:
        now = time.monotonic()
        due = [d for d, at in self._next_gate.items() if now >= at]
        if not due:
            return
        self.gate_log.read_to_end()
        for domain in due:
            self._next_gate[domain] = time.monotonic() + self.config.domains[domain].promotion.every_s
            try:
                decision = self.gate.run(domain, self.gated[domain])
            except (PublisherError, EvaluationError, ValueError) as exc:
                self.stats.errors += 1
                log.error("%s: the gate failed: %s", domain, exc)
                continue
            self.stats.gate_decisions.append(decision)

    def _unchanged(self, domain: str, policy: Policy, offsets: list[SourceOffset]) -> bool:
        """The newest published version already holds this state (e.g. after a restart): the
        same offsets, arms and samples. Offsets alone do not say it: one emission of the
        learner (every model it changed, all with its watermark) can reach this worker in two
        reads, and the models of the second are new with the offsets of the first."""
        try:
            latest = self.publisher.repository(domain).latest()
        except PublisherError:
            return False
        if latest is None or latest.custom.get("derived_from") is not None or not offsets:
            return False
        arms = policy.arm_ids()
        return (latest.custom.get("source_offsets") == [o._asdict() for o in offsets]
                and latest.custom.get("arms") == len(arms)
                and latest.custom.get("samples") == sum(policy.update_count(arm) for arm in arms))  # fmt: skip

    def _refresh_metadata(self) -> None:
        if time.monotonic() - self._last_refresh < self.settings.refresh_every_seconds:
            return
        self._last_refresh = time.monotonic()
        for domain in sorted(self._published):
            try:
                roles = self.publisher.refresh(domain)
            except PublisherError as exc:
                log.error("%s: re-signing expiring metadata failed: %s", domain, exc)
                continue
            if roles:
                log.info("%s: re-signed %s", domain, ", ".join(roles))


def run_publisher(
    config: WorkerConfig,
    settings: PublisherSettings,
    *,
    stop: threading.Event | None = None,
    metrics: PublisherMetrics | None = None,
    idle_timeout: float | None = None,
    publish_now: threading.Event | None = None,
) -> PublisherStats:
    """Run the publisher until ``stop`` is set (or ``idle_timeout`` seconds pass without records).
    Setting ``publish_now`` makes every domain with a new update due at once (then it is cleared)."""
    if not config.domains:
        raise PublisherError("the publisher needs at least one configured domain")
    check_topics(config.kafka, config.topics)  # a broker away or refusing the credentials: said now
    worker = _PublisherWorker(config, settings, metrics, publish_now)
    log.info(
        "publisher for %s/%s: domains %s, every %d updates or %gs, to %s",
        config.tenant, config.workspace, ", ".join(sorted(config.domains)), settings.every_updates,
        settings.every_seconds, settings.store.location,
    )  # fmt: skip
    return worker.run(stop or threading.Event(), idle_timeout)
