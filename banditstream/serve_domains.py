"""What ``banditstream serve`` holds per tenant/workspace/domain: one :class:`~banditstream.decider.Decider`
(the same verified snapshots, the same decide step, the same events as the SDK), the domain's
settings with the Personalizer configuration applied, and the event ids it ranked.

Configuration changed through the API (service configuration, policy) is kept in memory
and written to ``<stores.state_dir>/serve/<tenant>/<workspace>/<domain>.json``, read back at
start; the domain's offline evaluations beside it, in ``<domain>.evaluations/``
(:mod:`banditstream.serve_evaluations`), and its feature importances in
``<domain>.featureImportances/`` (:mod:`banditstream.serve_feature_importances`). That file is this process's; several replicas do not share it (a shared
configuration store is not built yet). Its ``domain`` entry has the form of the config
tree's ``domains.<name>`` section, so it can be copied there for the workers.

Events the service emits, all through the Decider's public ``decide`` / ``reward``:

* rank: one DecisionEvent (``deferred`` true when ``deferActivation`` was asked);
* multi-slot rank: one DecisionEvent per slot, event id ``<eventId>/<slotId>``;
* reward: a RewardEvent with ``value``; multi-slot: one per slot, on the slot's event id;
* activate: a RewardEvent with ``reward_id`` ``"activate"``, no signals and no value (for a
  multi-slot event: one per slot). Repeated activations carry the same reward id, so the
  join's deduplication makes them one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from banditstream.config import Settings
from banditstream.decider import Decider
from banditstream.serve_api import ACTIVATION_REWARD_ID, ServiceExtras
from banditstream.serve_evaluations import EvaluationStore
from banditstream.serve_feature_importances import FeatureImportanceStore
from learner.domain import DomainSettings

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Where:
    tenant: str
    workspace: str
    domain: str

    def __str__(self) -> str:
        return f"{self.tenant}/{self.workspace}/{self.domain}"


class Ranked(NamedTuple):
    """An event ranked here."""

    at: float
    deferred: bool
    #: the slot ids of a multi-slot event, None for a single-slot one
    slots: tuple[str, ...] | None = None


class EventMemory:
    """The event ids ranked by this process, newest kept (``capacity`` of them).

    :meth:`surely_unknown` says when an id missing here was certainly never ranked by this
    process within the last ``window_s`` (a reward for anything older is late anyway): the
    process has run longer than the window and dropped nothing ranked within it.

    Each event is held as a plain tuple, which the garbage collector stops tracking at its
    first pass (it does so for exact tuples of untracked values only, not for a
    :class:`Ranked`): as objects, the ``capacity`` held (200,000 by default) were scanned
    by every full collection, which stalled every request for 15-40 ms at a time. What a
    full collection still walks is the dict's entries: about 5 ms at 200,000.
    """

    def __init__(self, capacity: int, clock=time.time):
        self.capacity = capacity
        self._clock = clock
        self._events: OrderedDict[str, tuple] = OrderedDict()
        self._started = clock()
        self._newest_dropped = float("-inf")
        self._lock = threading.Lock()

    def add(self, event_id: str, ranked: Ranked) -> None:
        with self._lock:
            self._events[event_id] = tuple(ranked)
            self._events.move_to_end(event_id)
            while len(self._events) > self.capacity:
                _, dropped = self._events.popitem(last=False)
                self._newest_dropped = max(self._newest_dropped, dropped[0])

    def get(self, event_id: str) -> Ranked | None:
        held = self._events.get(event_id)
        return None if held is None else Ranked._make(held)

    def surely_unknown(self, event_id: str, window_s: float) -> bool:
        if event_id in self._events:
            return False
        now = self._clock()
        return now - self._started > window_s and now - self._newest_dropped > window_s

    @property
    def oldest(self) -> float | None:
        first = next(iter(self._events.values()), None)
        return first[0] if first else None


class DomainLoop:
    """One tenant/workspace/domain as the service serves it."""

    def __init__(self, where: Where, settings: Settings, *, seed: int | None = None):
        self.where = where
        self.settings = settings
        self.base = settings.domains.get(where.domain) or DomainSettings()
        self.path = Path(settings.stores.state_dir) / "serve" / where.tenant / where.workspace / f"{where.domain}.json"
        self.domain_settings, self.extras = self._load_overrides()
        self.events = EventMemory(settings.serve.remember_events)
        self.decider = self._build_decider(seed)
        self._lock = threading.Lock()
        self._stats: dict[tuple[float, float], tuple[float, Any]] = {}
        #: the domain's offline evaluations (:mod:`banditstream.serve_evaluations`), kept beside its configuration
        self.evaluations = EvaluationStore(self.path.parent / f"{where.domain}.evaluations")
        self.feature_importances = FeatureImportanceStore(self.path.parent / f"{where.domain}.featureImportances")

    # -- building -------------------------------------------------------------------------

    def _load_overrides(self) -> tuple[DomainSettings, ServiceExtras]:
        default_export = self.settings.sdk.refresh_interval_s
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return self.base, ServiceExtras(default_export)
        except (OSError, ValueError) as exc:
            log.warning("%s: ignoring unreadable saved configuration %s: %s", self.where, self.path, exc)
            return self.base, ServiceExtras(default_export)
        try:
            domain = DomainSettings.model_validate(saved["domain"])
        except Exception as exc:  # noqa: BLE001 - a stale file must not stop the service
            log.warning("%s: ignoring saved configuration %s that no longer validates: %s", self.where, self.path, exc)
            return self.base, ServiceExtras(default_export)
        return domain, ServiceExtras.from_json(saved.get("service", {}), default_export)

    def _build_decider(self, seed: int | None) -> Decider:
        s, w = self.settings, self.where
        root = s.trusted_root_path
        stable = canary = self.snapshot_client = None
        if root.exists():
            from publisher import SnapshotClient

            def client(channel: str) -> SnapshotClient:
                return SnapshotClient(
                    s.stores.snapshots, Path(s.sdk.cache_dir) / "serve" / channel, root, tenant=w.tenant,
                    workspace=w.workspace, domain=w.domain, channel=channel, s3=s.s3_client_kwargs(),
                )  # fmt: skip

            stable = self.snapshot_client = client(s.sdk.channel)
            if self.domain_settings.promotion.canary_share > 0 and s.sdk.channel == "stable":
                canary = client("canary")
        else:
            log.warning("%s: no trusted root at %s; deciding with the baseline only", w, root)
        spool = Path(s.stores.state_dir) / "serve" / "spool" / f"{w.tenant}.{w.workspace}.{w.domain}.spool"
        return Decider(
            w.domain, stable, kafka=s.kafka, settings=self.domain_settings, tenant=w.tenant, workspace=w.workspace,
            topics=s.topics, refresh_interval_s=self.extras.model_export_frequency_s, spool_path=spool,
            limits=s.validation_limits(), seed=seed, canary_repository=canary, schema_registry=s.registry,
        )  # fmt: skip

    # -- deciding -------------------------------------------------------------------------

    @property
    def window_s(self) -> float:
        return self.domain_settings.reward.window_s

    def decide(self, context: dict[str, Any], candidates: list[dict[str, Any]], event_id: str, deferred: bool):
        return self.decider.decide(context, candidates, event_id, deferred=deferred)

    def reward(self, event_id: str, value: float) -> None:
        self.decider.reward(event_id, value=value)

    def activate(self, event_id: str) -> None:
        self.decider.reward(event_id, reward_id=ACTIVATION_REWARD_ID)

    # -- configuration --------------------------------------------------------------------

    def configure(self, domain_settings: DomainSettings, extras: ServiceExtras | None = None) -> None:
        """Take new settings: the mode applies to the next decision; everything is saved."""
        with self._lock:
            self.domain_settings = domain_settings
            if extras is not None:
                self.extras = extras
            self.decider.settings = domain_settings  # read by Decider.mode on every decision
            self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"domain": self.domain_settings.model_dump(mode="json"), "service": self.extras.to_json()}
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)

    # -- statistics -----------------------------------------------------------------------

    def stats(self, window_s: float, level: float = 0.95):
        """The domain's leaderboard over the decisions of the last ``window_s`` seconds, from
        the updates topic, with the posterior means of the snapshot in use; a result is
        reused for ``serve.stats_cache_s`` seconds (every replica reads the topic itself)."""
        return self._window(window_s, level)[1]

    def dashboard(self, window_s: float, *, cost_signal: str = "cost", quality_signal: str = "quality"):
        """The dashboard's view of the domain (:mod:`banditstream.dashboard`) over the same
        window and cache as :meth:`stats`."""
        from banditstream.dashboard import build_view

        updates, board = self._window(window_s, 0.95)
        now = time.time()
        snapshots = []
        for channel, active in (("stable", self.decider.active_policy), ("canary", self.decider.canary_policy),
                                ("shadow", self.decider.shadow_policy)):  # fmt: skip
            if active is not None or channel == "stable":
                snapshots.append((channel, "" if active is None else active.version,
                                  None if active is None else now - active.created_at))
        return build_view(updates, board, snapshots=snapshots, cost_signal=cost_signal, quality_signal=quality_signal)

    def _window(self, window_s: float, level: float):
        from banditstream.stats import leaderboard
        from streams.evaluation_log import LogRange, read_updates

        key = (window_s, level)
        now = time.time()
        ttl = self.settings.serve.stats_cache_s
        with self._lock:
            cached = self._stats.get(key)
            if cached is not None and now - cached[0] < ttl:
                return cached[1]
        until_ms = int(now * 1000)
        since_ms = until_ms - int(window_s * 1000)
        topic = self.settings.topics.updates
        updates, _ = read_updates(self.settings.kafka, topic, self.settings.worker_config().serde("update", topic=topic),
                                  log_range=LogRange(since_ms=since_ms), timeout_s=60)
        active = self.decider.active_policy
        w = self.where
        board = leaderboard(updates, tenant=w.tenant, workspace=w.workspace, domain=w.domain, since_ms=since_ms,
                            until_ms=until_ms, policy=None if active is None else active.policy,
                            snapshot_version="" if active is None else active.version, level=level)
        mine = [u for u in updates if (u["tenant"], u["workspace"], u["domain"]) == (w.tenant, w.workspace, w.domain)]
        with self._lock:
            self._stats = {k: v for k, v in self._stats.items() if now - v[0] < ttl}
            self._stats[key] = (now, (mine, board))
        return mine, board

    def read_log(self, since_ms: int, until_ms: int) -> list[dict[str, Any]]:
        """The domain's updates decided in ``[since_ms, until_ms)``, from the updates topic
        (what an evaluation rates the policies on)."""
        from streams.evaluation_log import LogRange, read_updates

        topic = self.settings.topics.updates
        updates, _ = read_updates(self.settings.kafka, topic, self.settings.worker_config().serde("update", topic=topic),
                                  log_range=LogRange(since_ms=since_ms, until_ms=until_ms), timeout_s=60)
        w = self.where
        return [u for u in updates if (u["tenant"], u["workspace"], u["domain"]) == (w.tenant, w.workspace, w.domain)]

    def read_decisions(self, since_ms: int, until_ms: int) -> list[dict[str, Any]]:
        """The domain's DecisionEvents stamped in ``[since_ms, until_ms)``, from the decisions
        topic: the contexts by name, which the updates keep only hashed."""
        from streams.evaluation_log import LogRange, read_updates

        topic = self.settings.topics.decisions
        decisions, _ = read_updates(self.settings.kafka, topic, self.settings.worker_config().serde("decision", topic=topic),
                                    log_range=LogRange(since_ms=since_ms, until_ms=until_ms, field="timestamp"), timeout_s=60)
        w = self.where
        return [d for d in decisions if (d["tenant"], d["workspace"], d["domain"]) == (w.tenant, w.workspace, w.domain)]

    # -- snapshots ------------------------------------------------------------------------

    def close(self) -> None:
        self.decider.close()
