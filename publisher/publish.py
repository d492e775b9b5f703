"""The publisher: policy state in, a signed and versioned snapshot out.

:meth:`Publisher.publish` runs the steps in order, each a named method:

1. ``_build``: the snapshot of the policy (scoring view, arms, configs, provenance);
2. ``_check_guards``: no NaN/inf, minimum samples, drift of the context features over every
   decision against the data of the snapshots accepted before (:mod:`publisher.guards`); a
   failure aborts with a reason in the log and ``banditstream_snapshot_guard_failures_total{reason=...}``
   counted;
3. ``_choose_version``: patch for more data, minor when the policy, its hyper-parameters or
   the feature/reward configuration changed, major when the state layout did;
4. ``_upload``: serialise (Avro + zstd), add the target with its custom fields, sign and
   commit through the domain's :class:`~publisher.repository.Repository` (which prunes to the
   last N versions and appends to the audit log).

:meth:`Publisher.rollback` publishes a *new* version carrying an older version's state, so
no client ever moves backwards; :meth:`Publisher.promote` moves a channel's head forward.

    >>> import tempfile, numpy as np
    >>> from learner.domain import DomainSettings
    >>> from publisher.repository import create_root
    >>> from publisher.signing import KeyRing
    >>> from publisher.stores import DirectoryStore
    >>> keys = KeyRing.generate()
    >>> settings = DomainSettings(policy="lin_ucb", features={"dimension": 4})
    >>> publisher = Publisher(DirectoryStore(tempfile.mkdtemp()), keys, create_root(keys), domains={"route": settings})
    >>> policy = settings.make_policy()
    >>> _ = policy.update_batch(np.eye(4), ["a", "b", "a", "b"], [1.0, 0.0, 1.0, 0.5])
    >>> publisher.publish("route", policy).version
    '1.0.0'
    >>> _ = policy.update_batch(np.eye(4), ["a", "b", "a", "b"], [1.0, 0.0, 1.0, 0.5])
    >>> publisher.publish("route", policy).version
    '1.0.1'
    >>> publisher.rollback("route", "1.0.0").version      # older state, newer version
    '1.0.2'
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from learner.domain import DomainSettings
from learner.features import Normalizer
from learner.policies import Drift, Policy
from publisher.errors import DriftGuardFailed, GuardFailed, MajorVersionError, RepositoryError, SnapshotFormatError, VersionConflict
from publisher.guards import FeatureHistory, GuardConfig, check
from publisher.repository import CHANNELS, Commit, Head, Repository, RepositoryConfig, TargetEntry
from publisher.signing import KeyRing
from publisher.snapshot import STATE_MAJOR, SemVer, Snapshot, SourceOffset, git_commit
from publisher.stores import SnapshotStore

__all__ = ["PublishResult", "Publisher", "PublisherConfig", "PublisherMetrics", "target_custom"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherConfig:
    """How snapshots are checked, versioned and kept."""

    repository: RepositoryConfig = field(default_factory=RepositoryConfig)
    guards: GuardConfig = field(default_factory=GuardConfig)
    #: Channels a new version joins. ("canary",) stages every version for a later promote.
    channels: tuple[str, ...] = CHANNELS
    #: Commit recorded in snapshots; None reads ``git rev-parse HEAD`` once.
    git_commit: str | None = None
    zstd_level: int = 1


class PublisherMetrics:
    """The publisher's Prometheus metrics, in a registry of their own (or the one given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.published = Counter(
            "banditstream_snapshots_published", "Snapshot versions committed, by event (publish, rollback, restore, reset).",
            ["domain", "event"], registry=r,
        )  # fmt: skip
        self.guard_failures = Counter(
            "banditstream_snapshot_guard_failures", "Publishes a guard aborted (or flagged), by reason.", ["domain", "reason"], registry=r
        )
        self.conflicts = Counter(
            "banditstream_snapshot_publish_conflicts", "Publishes that lost a version to another publisher.", ["domain"], registry=r
        )
        self.snapshot_bytes = Gauge("banditstream_snapshot_bytes", "Size of the last published snapshot.", ["domain"], registry=r)
        self.samples = Gauge("banditstream_snapshot_samples", "Samples in the last published snapshot.", ["domain"], registry=r)
        self.learned = Gauge(
            "banditstream_publisher_learned_updates",
            "Updates in the learned state the publisher holds, published or not (a gated domain's waits for its verdict).",
            ["domain"], registry=r,
        )  # fmt: skip
        self.normalizer_observations = Gauge(
            "banditstream_publisher_normalizer_observations",
            "Decisions in a normalising domain's feature statistics as a snapshot would ship them (the join's newest).",
            ["domain"], registry=r,
        )  # fmt: skip
        self.alarms = Gauge(
            "banditstream_snapshot_change_alarms",
            "Times the learner's change detector sent an arm back to its prior, over the arms of the last published snapshot.",
            ["domain"], registry=r,
        )  # fmt: skip
        self.published_at = Gauge(
            "banditstream_snapshot_published_timestamp_seconds", "When the last snapshot was committed.", ["domain"], registry=r
        )
        self.publish_seconds = Histogram(
            "banditstream_snapshot_publish_seconds", "Build, guard, serialise, sign and upload one snapshot.", ["domain"], registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )  # fmt: skip


@dataclass(frozen=True)
class PublishResult:
    """One committed snapshot version."""

    domain: str
    version: str
    entry: TargetEntry
    commit: Commit
    snapshot: Snapshot
    size: int

    @property
    def drift_flag(self) -> bool:
        return self.snapshot.drift_flag


def target_custom(snapshot: Snapshot, created_at: datetime | None = None) -> dict[str, Any]:
    """The custom fields a snapshot's TUF target carries (readable without the blob)."""
    created = created_at or datetime.fromtimestamp(snapshot.created_at / 1000, tz=timezone.utc)
    return {
        "version": snapshot.version,
        "state_major": snapshot.state_major,
        "git_commit": snapshot.git_commit,
        "dimension": snapshot.dimension,
        "arms": len(snapshot.arms),
        "samples": snapshot.samples,
        "source_offsets": [o._asdict() for o in snapshot.source_offsets],
        "created_at": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "policy": snapshot.policy,
        "config_hash": hashlib.sha256(snapshot.config_signature().encode("utf-8")).hexdigest()[:16],
        "feature_hash": snapshot.feature_hash,
        "reward_hash": snapshot.reward_hash,
        "drift_flag": snapshot.drift_flag,
        "derived_from": snapshot.derived_from,
        "tenant": snapshot.tenant,
        "workspace": snapshot.workspace,
        "domain": snapshot.domain,
        **({"acting": snapshot.summary()["portfolio"]["acting"]} if snapshot.policy == "portfolio" else {}),
    }


class Publisher:
    """Builds, guards, versions, signs and uploads the snapshots of one tenant/workspace.

    ``keys`` holds the targets, snapshot and timestamp signers; ``root`` is the deployment's
    signed root metadata; ``domains`` the configured domains (others are refused).
    """

    def __init__(
        self,
        store: SnapshotStore,
        keys: KeyRing,
        root: bytes,
        *,
        domains: Mapping[str, DomainSettings],
        tenant: str = "default",
        workspace: str = "main",
        config: PublisherConfig | None = None,
        metrics: PublisherMetrics | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.root = root
        self.domains = dict(domains)
        self.tenant = tenant
        self.workspace = workspace
        self.config = config or PublisherConfig()
        self.metrics = metrics or PublisherMetrics()
        self.clock = clock
        self.commit = self.config.git_commit if self.config.git_commit is not None else git_commit()
        self._repositories: dict[str, Repository] = {}
        self._history: dict[str, FeatureHistory] = {}
        #: per domain, the change detector's alarms per arm at the last publish
        self._alarms: dict[str, dict[str, int]] = {}
        #: per domain, the drift acknowledgement its history starts from
        self._acknowledged: dict[str, datetime | None] = {}

    def repository(self, domain: str) -> Repository:
        """The domain's repository (created in the store on first commit)."""
        repo = self._repositories.get(domain)
        if repo is None:
            extra = {"clock": self.clock} if self.clock is not None else {}
            repo = Repository(
                self.store, keys=self.keys, root=self.root, domain=domain, tenant=self.tenant,
                workspace=self.workspace, config=self.config.repository, **extra,
            )  # fmt: skip
            self._repositories[domain] = repo
        return repo

    def settings(self, domain: str) -> DomainSettings:
        try:
            return self.domains[domain]
        except KeyError:
            known = ", ".join(sorted(self.domains)) or "none"
            raise RepositoryError(f"unknown domain {domain!r}; configured: {known}", subject=domain) from None

    # --- the publish workflow --------------------------------------------------------------------

    def publish(
        self,
        domain: str,
        policy: Policy,
        *,
        normalizer: Normalizer | None = None,
        drift: Mapping[str, Drift] | None = None,
        source_offsets: Iterable[SourceOffset | tuple[str, int, int]] = (),
        channels: Iterable[str] | None = None,
        force: bool = False,
        fresh: bool = False,
    ) -> PublishResult:
        """Build, guard, version and commit a snapshot of ``policy`` for ``domain``.

        Raises a :class:`~publisher.errors.GuardFailed` subclass (nothing written) or
        :class:`~publisher.errors.VersionConflict` (another publisher committed first: call
        again). ``force`` skips the drift and minimum-samples guards, never the finite one.
        """
        started = time.perf_counter()
        settings = self.settings(domain)
        repo = self.repository(domain)
        head = repo.head()
        try:
            snapshot = self._build(domain, settings, policy, normalizer, drift, source_offsets)
            snapshot = self._check_guards(domain, repo, head, snapshot, force=force)
        except GuardFailed as exc:
            self.metrics.guard_failures.labels(domain, exc.reason).inc()
            log.warning("%s/%s/%s: publish aborted by the %s guard: %s", self.tenant, self.workspace, domain, exc.reason, exc)
            raise
        snapshot = self._choose_version(head, snapshot, fresh=fresh)
        result = self._upload(repo, head, snapshot, channels, event="reset" if fresh else "publish")
        self._report_alarms(domain, policy)
        self.metrics.publish_seconds.labels(domain).observe(time.perf_counter() - started)
        return result

    def _report_alarms(self, domain: str, policy: Policy) -> None:
        """Export the change detector's alarms over the published arms; name the arms it flagged
        since the last publish (each went back to its prior: a drift the learner followed)."""
        alarms = {arm: policy.alarms(arm) for arm in policy.arm_ids()}
        before = self._alarms.get(domain)
        if before is not None:
            flagged = sorted(arm for arm, n in alarms.items() if n > before.get(arm, 0))
            if flagged:
                log.warning("%s: the change detector flagged %s since the last snapshot: their rewards moved, "
                            "each started over from its prior", domain, ", ".join(map(repr, flagged)))  # fmt: skip
        self._alarms[domain] = alarms
        self.metrics.alarms.labels(domain).set(sum(alarms.values()))

    def reset(self, domain: str) -> PublishResult:
        """A new minor version of ``domain`` holding its policy's priors (Personalizer's model
        reset; the major version is the state layout, which a reset keeps). The learners' state
        is reset by markers in the updates log (:func:`publisher.cli_ops.reset_model` sends
        both). A gated domain's reset goes to the canary channel only, like any new version of
        it: the promotion gate judges it before users see it."""
        settings = self.settings(domain)
        promotion = getattr(settings, "promotion", None)
        gated = promotion is not None and promotion.canary_share > 0
        stable = self.repository(domain).channel_head("stable") if gated else None
        channels = ("canary",) if stable is not None else None
        return self.publish(domain, settings.make_policy(), channels=channels, force=True, fresh=True)

    def _build(
        self,
        domain: str,
        settings: DomainSettings,
        policy: Policy,
        normalizer: Normalizer | None,
        drift: Mapping[str, Drift] | None,
        source_offsets: Iterable[SourceOffset | tuple[str, int, int]],
    ) -> Snapshot:
        return Snapshot.build(
            policy, settings, domain=domain, tenant=self.tenant, workspace=self.workspace, normalizer=normalizer,
            drift=drift, source_offsets=source_offsets, commit=self.commit,
        )  # fmt: skip

    def _check_guards(self, domain: str, repo: Repository, head: Head, snapshot: Snapshot, *, force: bool) -> Snapshot:
        guards = self.config.guards
        if force:  # an operator's override: only the finite guard still applies
            guards, history = dataclasses.replace(guards, min_samples=0), FeatureHistory(guards)
        else:
            history = self._drift_history(domain, repo, head)
        try:
            result = check(snapshot.arms, snapshot.samples, history, guards, snapshot.normalizer)
        except DriftGuardFailed:
            if not self._newly_acknowledged(domain, repo, history, snapshot):
                raise
            return snapshot
        if result.ok or self._newly_acknowledged(domain, repo, history, snapshot):
            return snapshot
        self.metrics.guard_failures.labels(domain, "drift").inc()
        log.warning("%s: drift flagged (deciders holding an unflagged snapshot keep it): %s", domain, result.reason)
        return snapshot.replace(drift_flag=True, drift_reason=result.reason)

    def _newly_acknowledged(self, domain: str, repo: Repository, history: FeatureHistory, snapshot: Snapshot) -> bool:
        """Whether an operator acknowledged the domain's drift since its history was read; if
        so, the history starts over from this snapshot's data."""
        acknowledged = repo.drift_acknowledged_at()
        if acknowledged is None or acknowledged == self._acknowledged.get(domain):
            return False
        self._acknowledged[domain] = acknowledged
        history.acknowledge(snapshot.normalizer)
        log.warning("%s: drift acknowledged at %s: judging from this snapshot's data on", domain, acknowledged.isoformat())
        return True

    def _drift_history(self, domain: str, repo: Repository, head: Head) -> FeatureHistory:
        """The data of the kept snapshots the guard accepted, read once from the repository:
        unflagged ones, since the last drift acknowledgement."""
        history = self._history.get(domain)
        if history is None:
            history = FeatureHistory(self.config.guards)
            acknowledged = self._acknowledged[domain] = repo.drift_acknowledged_at()
            for entry in head.entries()[-self.config.guards.history :]:
                if entry.custom.get("drift_flag"):
                    continue
                try:
                    old = Snapshot.from_bytes(repo.fetch(entry))
                except (SnapshotFormatError, MajorVersionError, RepositoryError) as exc:
                    log.warning("%s: %s left out of the drift history: %s", domain, entry.version, exc)
                    continue
                if acknowledged is None or old.created_at >= acknowledged.timestamp() * 1000:
                    history.accept(old.normalizer)
            self._history[domain] = history
        return history

    def _choose_version(self, head: Head, snapshot: Snapshot, *, fresh: bool = False) -> Snapshot:
        """Patch: more data. Minor: policy, hyper-parameters, features or reward changed, or a
        reset (``fresh``). Major: state layout."""
        entries = head.entries()
        if not entries:
            return snapshot.replace(version=str(SemVer(STATE_MAJOR, 0, 0)))
        latest = entries[-1]
        if latest.version.major > STATE_MAJOR:
            raise MajorVersionError(
                f"{snapshot.domain} holds state major {latest.version.major}; this publisher writes {STATE_MAJOR}",
                subject=snapshot.domain,
            )
        if latest.version.major < STATE_MAJOR:
            version = SemVer(STATE_MAJOR, 0, 0)
        elif fresh or latest.custom.get("config_hash") != target_custom(snapshot)["config_hash"]:
            version = latest.version.bump_minor()
        else:
            version = latest.version.bump_patch()
        return snapshot.replace(version=str(version))

    def _upload(
        self, repo: Repository, head: Head, snapshot: Snapshot, channels: Iterable[str] | None, *, event: str
    ) -> PublishResult:
        blob = snapshot.to_bytes(level=self.config.zstd_level)
        try:
            commit = repo.publish(blob, target_custom(snapshot), channels=channels or self.config.channels, head=head, event=event)
        except VersionConflict:
            self.metrics.conflicts.labels(snapshot.domain).inc()
            raise
        self._remember(snapshot)
        m = self.metrics
        m.published.labels(snapshot.domain, event).inc()
        m.snapshot_bytes.labels(snapshot.domain).set(len(blob))
        m.samples.labels(snapshot.domain).set(snapshot.samples)
        m.published_at.labels(snapshot.domain).set(time.time())
        log.info(
            "%s/%s/%s: %s %s (%d arms, %d samples, %d bytes) to %s",
            self.tenant, self.workspace, snapshot.domain, event, snapshot.version, len(snapshot.arms), snapshot.samples,
            len(blob), ", ".join(commit.entry.channels),
        )  # fmt: skip
        return PublishResult(snapshot.domain, snapshot.version, commit.entry, commit, snapshot, len(blob))

    def _remember(self, snapshot: Snapshot) -> None:
        """A published snapshot's data becomes part of the reference, unless it was flagged."""
        history = self._history.get(snapshot.domain)
        if history is not None and not snapshot.drift_flag:
            history.accept(snapshot.normalizer)

    # --- rollback, restore, promote, refresh -----------------------------------------------------

    def rollback(self, domain: str, to_version: str | None = None, *, channels: Iterable[str] | None = None) -> PublishResult:
        """Publish a new version carrying the state of ``to_version`` (default: the one before
        the newest). Clients move forward to it; the audit log says what it derives from."""
        repo = self.repository(domain)
        head = repo.head()
        entries = head.entries()
        if to_version is None:
            if len(entries) < 2:
                raise RepositoryError(f"{domain} keeps {len(entries)} version(s): nothing to roll back to", subject=domain)
            target = entries[-2]
        else:
            target = repo.entry(to_version, head)
        old = Snapshot.from_bytes(repo.fetch(target))
        snapshot = old.replace(created_at=int(time.time() * 1000), derived_from=old.version, git_commit=self.commit)
        snapshot = self._choose_version(head, snapshot)
        return self._upload(repo, head, snapshot, channels, event="rollback")

    def restore(self, snapshot: Snapshot, *, channels: Iterable[str] | None = None) -> PublishResult:
        """Publish a snapshot read from elsewhere (a backup) as the domain's next version."""
        self.settings(snapshot.domain)
        if snapshot.state_major != STATE_MAJOR:
            raise MajorVersionError(
                f"{snapshot.domain} {snapshot.version} has state major {snapshot.state_major}; this code reads {STATE_MAJOR}",
                subject=snapshot.domain,
            )
        repo = self.repository(snapshot.domain)
        head = repo.head()
        restored = snapshot.replace(
            tenant=self.tenant, workspace=self.workspace, created_at=int(time.time() * 1000), derived_from=snapshot.version,
            git_commit=self.commit,
        )  # fmt: skip
        restored = self._choose_version(head, restored)
        return self._upload(repo, head, restored, channels, event="restore")

    def promote(self, domain: str, version: str | None = None, channel: str = "stable", *, source: str = "canary") -> Commit | None:
        """Make ``version`` (default: the head of ``source``) the head of ``channel``."""
        repo = self.repository(domain)
        head = repo.head()
        if version is None:
            current = head.channel_head(source)
            if current is None:
                raise RepositoryError(f"{domain} has no {source} snapshot to promote", subject=domain)
            version = str(current.version)
        return repo.promote(version, channel, head=head)

    def refresh(self, domain: str, *, force: bool = False) -> list[str]:
        """Re-sign the domain's metadata that is about to expire (see Repository.refresh)."""
        return self.repository(domain).refresh(force=force)
