"""The publisher's half of a portfolio domain: who acts, decided at each publish from the log.

A portfolio's members learn side by side in the learners (:mod:`learner.policies.portfolio`);
which of them acts is a property of the snapshot, decided here, because only the publisher holds
every arm's state of every member (a per-arm domain's arms live on many learner shards, and a
member's probability of an action needs all the candidates' models).

At each publish of a portfolio domain (:meth:`PortfolioJudge.judge`):

1. **The rows.** The joined log's rows (tailed from the updates topic by :class:`PortfolioLog`,
   a consumer group of its own) that the new snapshot has learned and the previous one had not:
   on each updates partition, the offsets from the previous snapshot's watermark up to the new
   one's. Each row is judged once, by models that had not learned it (progressive validation).
2. **Scored by the previous snapshot's members**, each with its own decide step and model, on
   the row's context and candidates: their probabilities and predicted rewards of every
   candidate, the row's logged propensity and its reward go into the evidence
   (``Portfolio.observe``, a doubly robust estimate). Before the first snapshot, by the members
   at their priors.
3. **Carried and chosen.** The new policy takes the previous snapshot's acting member and
   evidence, adds the rows', and switches when a challenger's lower bound beats the acting
   member (``Portfolio.select``). The snapshot carries the evidence, the acting member and the
   switches: a publisher restarted later continues from the latest snapshot.

The rows are let go once a snapshot that judged them is published; a publish the guards hold
back leaves them to the next, so each row counts once, in the snapshot that learned it. The
tail is read up to the new snapshot's offsets before it is judged (they are in the log: the
learners read them), so the verdict is a function of the snapshots and the log, not of how
fast the tail read; only a tail that cannot reach them within a budget (30 s, a warning) leaves
rows unjudged, never judged twice. Exported:
``banditstream_portfolio_acting{domain, member}`` (1 for the acting member),
``banditstream_portfolio_switches_total{domain}``, ``banditstream_portfolio_judged_rows_total{domain}``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from learner.evaluation import LoggedBandit, logged_choices
from learner.policies import Policy, Portfolio
from publisher.errors import PublisherError
from publisher.snapshot import Snapshot, SourceOffset
from streams.client import BatchConsumer

__all__ = ["PortfolioJudge", "PortfolioLog", "PortfolioMetrics", "Verdict"]

log = logging.getLogger(__name__)


class PortfolioLog:
    """The joined log of the portfolio domains, tailed from the updates topic from its earliest
    record, each row with its partition and offset; at most ``max_rows`` per domain."""

    def __init__(self, config: Any, domains: Iterable[str], max_rows: int) -> None:
        self.tenant, self.workspace, self.topic = config.tenant, config.workspace, config.topics.updates
        self.serde = config.serde("update", topic=self.topic)
        self.consumer = BatchConsumer(config.kafka, f"banditstream-portfolio-{uuid.uuid4().hex[:8]}", [self.topic])
        self.rows: dict[str, deque[tuple[int, int, dict[str, Any]]]] = {d: deque(maxlen=max_rows) for d in domains}
        #: partition -> the next offset to read (every record counts, of any domain or none)
        self.position: dict[int, int] = {}

    def poll(self, timeout: float = 0.0) -> int:
        """One poll; the records read (any domain)."""
        batch = self.consumer.poll_batch(self.serde, max_records=10_000, timeout=timeout)
        for update, message in zip(batch.records, batch.messages):
            rows = self.rows.get(update["domain"])
            if rows is not None and update["tenant"] == self.tenant and update["workspace"] == self.workspace and not update["reset"]:
                rows.append((message.partition(), message.offset(), update))
        for (topic, partition), offset in batch.next_offsets.items():
            if topic == self.topic:
                self.position[partition] = max(offset, self.position.get(partition, 0))
        return len(batch.messages) + len(batch.failures)

    def read_until(self, until: Mapping[int, int], budget_s: float = 30.0) -> bool:
        """Poll until every partition p is read up to ``until[p]`` (the offsets a snapshot
        learned to, which are in the log already); False when ``budget_s`` ran out first."""
        deadline = time.monotonic() + budget_s
        while any(self.position.get(p, 0) < offset for p, offset in until.items()):
            if time.monotonic() >= deadline:
                return False
            self.poll(0.2)
        return True

    def take(self, domain: str, since: Mapping[int, int], until: Mapping[int, int]) -> list[dict[str, Any]]:
        """The domain's rows at offsets ``since[p] <= offset < until[p]`` of each updates
        partition p (``since`` 0 where absent)."""
        return [update for partition, offset, update in self.rows[domain]
                if since.get(partition, 0) <= offset < until.get(partition, -1)]  # fmt: skip

    def release(self, domain: str, until: Mapping[int, int]) -> None:
        """Let go of the domain's rows below ``until`` (judged in a published snapshot)."""
        rows = self.rows[domain]
        kept = [row for row in rows if row[1] >= until.get(row[0], -1)]
        rows.clear()
        rows.extend(kept)

    def close(self) -> None:
        self.consumer.close()


class PortfolioMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        kw = {"registry": registry} if registry is not None else {}
        self.acting = Gauge("banditstream_portfolio_acting", "1 for the member of a portfolio domain that acts", ["domain", "member"], **kw)
        self.switches = Counter("banditstream_portfolio_switches", "Times a portfolio domain switched its acting member", ["domain"], **kw)
        self.judged = Counter("banditstream_portfolio_judged_rows", "Logged rows a portfolio's members were scored on", ["domain"], **kw)


@dataclass
class Verdict:
    """One publish's judgement: the rows judged, who acts, the switch (if any), the estimates."""

    domain: str
    rows: int
    acting: str
    switch: dict[str, Any] | None = None
    estimates: list[dict[str, Any]] = field(default_factory=list)


def _offsets(offsets: Iterable[SourceOffset], topic: str) -> dict[int, int]:
    return {int(o.partition): int(o.offset) for o in offsets if o.topic == topic}


class PortfolioJudge:
    """Who acts in each portfolio domain, snapshot by snapshot (see the module docstring)."""

    def __init__(self, publisher: Any, log_: PortfolioLog, settings: Mapping[str, Any], metrics: PortfolioMetrics | None = None,
                 seed: int = 0) -> None:  # fmt: skip
        self.publisher = publisher
        self.log = log_
        self.settings = settings
        self.metrics = metrics
        self.seed = seed
        #: domain -> (the last published portfolio, its source offsets on the updates topic)
        self._previous: dict[str, tuple[Portfolio, dict[int, int]]] = {}
        #: domain -> the verdict of the publish under way (counted once it is published)
        self._pending: dict[str, Verdict] = {}

    def _last_published(self, domain: str) -> tuple[Portfolio, dict[int, int]] | None:
        held = self._previous.get(domain)
        if held is not None:
            return held
        try:
            entry = self.publisher.repository(domain).latest()
            if entry is None:
                return None
            snapshot = Snapshot.from_bytes(self.publisher.repository(domain).fetch(entry))
        except PublisherError as exc:
            log.warning("%s: the latest snapshot does not load (%s); the portfolio's evidence starts over", domain, exc)
            return None
        policy = snapshot.load_policy()
        if not isinstance(policy, Portfolio):
            return None
        return policy, _offsets(snapshot.source_offsets, self.log.topic)

    def judge(self, domain: str, policy: Policy, offsets: Iterable[SourceOffset]) -> Verdict | None:
        """Carry the previous snapshot's choice into ``policy`` and add the rows it learned
        since; None when ``policy`` is not a portfolio."""
        if not isinstance(policy, Portfolio):
            return None
        until = _offsets(offsets, self.log.topic)
        previous = self._last_published(domain)
        if previous is not None and not policy.adopt_selection(previous[0]):
            log.info("%s: the portfolio's members changed; its evidence starts over", domain)
            previous = None
        scorer = previous[0] if previous is not None else self.settings[domain].make_policy()
        if not self.log.read_until(until):
            log.warning("%s: the updates topic was not read up to the snapshot's offsets in time; the rows not read "
                        "are not judged", domain)  # fmt: skip
        rows = self.log.take(domain, previous[1] if previous is not None else {}, until)
        switch = None
        judged = 0
        if rows:
            logged = LoggedBandit.from_updates(rows, domain=domain, tenant=self.log.tenant, workspace=self.log.workspace)
            judged = len(logged)
            if judged:
                candidates, chosen = logged_choices(logged, range(judged))
                switch = policy.judge(logged.context, candidates, chosen, logged.pscore, logged.reward, scored_by=scorer,
                                      rng=self.seed)  # fmt: skip
        verdict = Verdict(domain, judged, policy.acting_label, switch, policy.estimates())
        self._pending[domain] = verdict
        return verdict

    def published(self, domain: str, policy: Policy, offsets: Iterable[SourceOffset]) -> None:
        """Remember what was published: the next publish's rows are scored by its members."""
        if isinstance(policy, Portfolio):
            until = _offsets(offsets, self.log.topic)
            self._previous[domain] = (policy.scoring_view(), until)
            self.log.release(domain, until)
        verdict = self._pending.pop(domain, None)
        if verdict is not None and verdict.switch is not None:
            switch = verdict.switch
            log.info("%s: the portfolio switched from %s to %s after %d rows (gain %.4f per decision, lower bound %.4f)",
                     domain, switch["from"], switch["to"], switch["rows"], switch["gain"], switch["lower"])  # fmt: skip
        if verdict is not None and self.metrics is not None:
            for label in policy.labels:
                self.metrics.acting.labels(domain, label).set(1.0 if label == verdict.acting else 0.0)
            self.metrics.judged.labels(domain).inc(verdict.rows)
            if verdict.switch is not None:
                self.metrics.switches.labels(domain).inc()

    def close(self) -> None:
        self.log.close()
