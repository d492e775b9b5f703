"""``banditstream monitor``: the loop's health read from what it writes, and its alerts.

Without Prometheus (a laptop, a cron job, a first deployment), the same questions the alert
rules ask (``helm/banditstream/files/prometheus-rules.yml``), answered from the loop's own
records with the deployment's configuration:

* per domain, from the joined log (the updates topic) of the last ``window_s`` and of the window
  before: decisions joined, the shares rewarded / default / not activated, the mean reward ->
  **BanditstreamDefaultRewardShareJump** when the default share rose more than
  ``default_share_jump`` (20 points) over the window before;
* the dead letters of the window by reason, against the records joined (decisions and their
  rewards) -> **BanditstreamDeadLetterRateHigh** above ``dead_letter_share`` (1 %);
* the consumer lag of the join's group (decisions, rewards) and the learner's (updates): the
  group's committed offsets against each partition's end as fetching finds it ->
  **BanditstreamConsumerLagGrowing** above ``lag`` records (1000) and, when an earlier check is
  known (``--interval``), growing since;
* per domain, the stable snapshot's version and age (the signed repository, verified against
  the trusted root) -> **BanditstreamSnapshotStale** past ``stale_s`` (an hour), and
  **BanditstreamDriftFlagged** when the newest snapshot carries the publisher's drift flag.

Each alert names its section of ``docs/runbook.md``. The clients' own alerts (signature
failures, SDK drift fallbacks) live in their processes' metrics only: Prometheus's.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from rich.table import Table

__all__ = ["Alert", "DomainHealth", "Report", "Thresholds", "alert_lines", "check", "tables", "transitions"]

RUNBOOK = "docs/runbook.md"


@dataclass(frozen=True)
class Thresholds:
    """When a check becomes an alert (the defaults are the Prometheus rules')."""

    window_s: float = 900.0
    dead_letter_share: float = 0.01
    default_share_jump: float = 0.20
    lag: int = 1000
    stale_s: float = 3600.0


@dataclass
class DomainHealth:
    domain: str
    decisions: int = 0
    rewarded_share: float | None = None
    default_share: float | None = None
    previous_default_share: float | None = None
    not_activated_share: float | None = None
    mean_reward: float | None = None
    stable_version: str | None = None
    stable_age_s: float | None = None
    drift_flag: bool = False


@dataclass(frozen=True)
class Alert:
    name: str
    subject: str
    summary: str

    @property
    def runbook(self) -> str:
        return f"{RUNBOOK}#{self.name.lower()}"


@dataclass
class Report:
    at_ms: int
    window_s: float
    domains: list[DomainHealth] = field(default_factory=list)
    dead_letters: dict[str, int] = field(default_factory=dict)
    records: int = 0
    #: "<group> <topic>" -> records behind the end, summed over partitions
    lag: dict[str, int] = field(default_factory=dict)
    alerts: list[Alert] = field(default_factory=list)
    #: what could not be read (a topic, the snapshot store), as one line each
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["alerts"] = [{**asdict(alert), "runbook": alert.runbook} for alert in self.alerts]
        return out


def check(settings: Any, thresholds: Thresholds = Thresholds(), *, previous: Report | None = None,
          now_ms: int | None = None) -> Report:
    """One look at the loop ``settings`` (a ``banditstream.config.Settings``) describes."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    window_ms = int(thresholds.window_s * 1000)
    report = Report(at_ms=now_ms, window_s=thresholds.window_s)
    domains = {name: DomainHealth(name) for name in sorted(settings.domains)}
    config = settings.worker_config()
    registry = config.registry_client()
    _joined(settings, config.serde("update", topic=settings.topics.updates, registry=registry), report, domains, now_ms,
            window_ms)
    _dead_letters(settings, config.deadletter_serde(registry), report, now_ms, window_ms)
    _lag(settings, config, report)
    _snapshots(settings, report, domains, now_ms)
    report.domains = list(domains.values())
    report.alerts = _alerts(report, thresholds, previous)
    return report


def _joined(settings, serde, report: Report, domains: dict[str, DomainHealth], now_ms: int, window_ms: int) -> None:
    from streams.evaluation_log import LogRange, read_updates

    topic = settings.topics.updates
    try:
        updates, _ = read_updates(settings.kafka, topic, serde,
                                  log_range=LogRange(since_ms=now_ms - 2 * window_ms, until_ms=now_ms), timeout_s=120)
    except Exception as exc:  # a monitor reports what it cannot read, and goes on
        report.problems.append(f"{topic}: {exc}")
        return
    current: dict[str, list[dict]] = {name: [] for name in domains}
    before: dict[str, Counter] = {name: Counter() for name in domains}
    for update in updates:
        if update["tenant"] != settings.tenant or update["workspace"] != settings.workspace or update["domain"] not in domains:
            continue
        if update["decision_time"] >= now_ms - window_ms:
            current[update["domain"]].append(update)
            report.records += 1 + update["reward_count"]
        else:
            before[update["domain"]][update["join_status"]] += 1
    for name, rows in current.items():
        health = domains[name]
        health.decisions = len(rows)
        if rows:
            statuses = Counter(row["join_status"] for row in rows)
            health.rewarded_share = statuses["rewarded"] / len(rows)
            health.default_share = statuses["default"] / len(rows)
            health.not_activated_share = statuses["not_activated"] / len(rows)
            health.mean_reward = sum(row["reward"] for row in rows) / len(rows)
        earlier = before[name]
        if sum(earlier.values()):
            health.previous_default_share = earlier["default"] / sum(earlier.values())


def _dead_letters(settings, serde, report: Report, now_ms: int, window_ms: int) -> None:
    from streams.evaluation_log import LogRange, read_updates

    topic = settings.topics.deadletter
    try:
        letters, _ = read_updates(settings.kafka, topic, serde,
                                  log_range=LogRange(since_ms=now_ms - window_ms, until_ms=now_ms, field="timestamp"),
                                  timeout_s=120)
    except Exception as exc:
        report.problems.append(f"{topic}: {exc}")
        return
    report.dead_letters = dict(Counter(letter["reason"] for letter in letters).most_common())


def _lag(settings, config, report: Report) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from streams.evaluation_log import log_ends
    from streams.learn import LearnerOptions
    from streams.worker import join_group

    t = settings.topics
    groups = [(join_group(t), t.decisions), (join_group(t), t.rewards),
              (LearnerOptions.from_extra(config.extra).group(t.updates), t.updates)]
    for group, topic in groups:
        try:
            ends = log_ends(settings.kafka, topic)
            consumer = Consumer(settings.kafka.consumer_config(group))
            try:
                committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=10)
            finally:
                consumer.close()
        except Exception as exc:
            report.problems.append(f"lag of {group} on {topic}: {exc}")
            continue
        offsets = {tp.partition: tp.offset for tp in committed}
        report.lag[f"{group} {topic}"] = sum(end - max(0, offsets.get(p, 0)) for p, end in ends.items())


def _snapshots(settings, report: Report, domains: dict[str, DomainHealth], now_ms: int) -> None:
    from publisher.cli_ops import list_snapshots
    from publisher.stores import open_store

    try:
        store = open_store(settings.stores.snapshots, s3=settings.s3_client_kwargs())
        rows = list_snapshots(store, tenant=settings.tenant, workspace=settings.workspace, domains=sorted(domains),
                              trusted_root=settings.trusted_root_path, verbose=True)
    except Exception as exc:
        report.problems.append(f"snapshots at {settings.stores.snapshots}: {str(exc).splitlines()[0]}")
        return
    for row in rows:  # newest last per domain
        health = domains.get(row["domain"])
        if health is None:
            continue
        health.drift_flag = bool(row.get("drift_flag"))
        if "stable" in row["channels"] and row.get("created_at") is not None:
            health.stable_version = row["version"]
            created = datetime.fromisoformat(str(row["created_at"]).replace("Z", "+00:00")).timestamp() * 1000.0
            health.stable_age_s = max(0.0, (now_ms - created) / 1000.0)


def _alerts(report: Report, thresholds: Thresholds, previous: Report | None) -> list[Alert]:
    alerts: list[Alert] = []
    for health in report.domains:
        if health.default_share is not None and health.previous_default_share is not None:
            rise = health.default_share - health.previous_default_share
            if rise > thresholds.default_share_jump:
                alerts.append(Alert("BanditstreamDefaultRewardShareJump", health.domain,
                                    f"default-reward share {health.default_share:.0%}, up {rise * 100:.0f} points "
                                    f"on the {thresholds.window_s:.0f} s before"))
        if health.stable_age_s is not None and health.stable_age_s > thresholds.stale_s:
            alerts.append(Alert("BanditstreamSnapshotStale", health.domain,
                                f"stable snapshot {health.stable_version} is {health.stable_age_s:.0f} s old"))
        if health.drift_flag:
            alerts.append(Alert("BanditstreamDriftFlagged", health.domain, "the newest snapshot carries the drift flag"))
    dead = sum(report.dead_letters.values())
    if dead and dead / (dead + report.records) > thresholds.dead_letter_share:
        reasons = ", ".join(f"{reason} {n}" for reason, n in report.dead_letters.items())
        alerts.append(Alert("BanditstreamDeadLetterRateHigh", "dead letters",
                            f"{dead} dead letters against {report.records} records joined ({reasons})"))
    for subject, lag in report.lag.items():
        if lag <= thresholds.lag:
            continue
        before = None if previous is None else previous.lag.get(subject)
        if before is None:
            alerts.append(Alert("BanditstreamConsumerLagGrowing", subject, f"{lag} records behind (no earlier check to compare)"))
        elif lag > before:
            alerts.append(Alert("BanditstreamConsumerLagGrowing", subject, f"{lag} records behind, {lag - before} more than before"))
    return alerts


def tables(report: Report) -> list[Table]:
    """The report as tables: the domains, and the pipeline (dead letters, lag, what was not read)."""
    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.0%}"

    domains = Table("domain", "decisions", "rewarded", "default", "(before)", "mean reward", "stable", "age",
                    title=f"the last {report.window_s:.0f} s")
    for h in report.domains:
        domains.add_row(h.domain, str(h.decisions), share(h.rewarded_share), share(h.default_share),
                        share(h.previous_default_share), "-" if h.mean_reward is None else f"{h.mean_reward:.3f}",
                        h.stable_version or "-", "-" if h.stable_age_s is None else f"{h.stable_age_s:.0f} s")
    pipeline = Table("what", "value", title="pipeline")
    pipeline.add_row("records joined", str(report.records))
    pipeline.add_row("dead letters", ", ".join(f"{r} {n}" for r, n in report.dead_letters.items()) or "0")
    for subject, lag in report.lag.items():
        pipeline.add_row(f"lag {subject}", str(lag))
    for problem in report.problems:
        pipeline.add_row("[yellow]not read[/]", problem)
    return [domains, pipeline]


def alert_lines(report: Report) -> list[str]:
    """One line per alert firing (whole, for logs and grep), or one saying there is none."""
    if not report.alerts:
        return ["no alert"]
    return [f"ALERT {alert.name} {alert.subject}: {alert.summary} (see {alert.runbook})" for alert in report.alerts]


def transitions(previous: Report, report: Report) -> list[str]:
    """What changed between two checks: alerts that started firing, and those that stopped."""
    before = {(a.name, a.subject) for a in previous.alerts}
    now = {(a.name, a.subject) for a in report.alerts}
    return ([f"FIRING {name} {subject}" for name, subject in sorted(now - before)]
            + [f"RESOLVED {name} {subject}" for name, subject in sorted(before - now)])
