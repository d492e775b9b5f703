"""The SDK: decide locally from a verified snapshot, emit what happened, never block.

    from banditstream import Decider

    decider = Decider("llm_routing", repository=client, kafka=settings.kafka)
    d = decider.decide({"task": "code", "prompt_tokens": 812.0}, ["gpt-small", "gpt-large", "llama-70b"])
    ...                                   # act on d.action
    decider.reward(d.event_id, {"success": 1.0, "latency_ms": 950.0, "cost_usd": 0.002})

    # A tenth of the users decide with the canary channel's snapshot while the gate weighs it:
    decider = Decider("llm_routing", repository=stable_client, canary_repository=canary_client, canary_share=0.1)
    d = decider.decide(context, actions, unit_key=user_id)      # d.channel: "stable" or "canary"

    # A candidate rides along, never acting: every event logs its distribution for evaluation.
    decider = Decider("llm_routing", repository=stable_client, shadow_repository=candidate_client)
    d = decider.decide(context, actions)      # d.recommended_probabilities, d.recommended_version

What ``decide`` does, in order (microseconds; no network, no locks on the hot path):

1. **Mode.** ``off`` (the baseline acts), ``shadow`` (the policy recommends, the baseline
   acts) or ``live``; from ``ENABLE_RL_GLOBAL`` / ``ENABLE_RL_<DOMAIN>`` in the environment,
   then the ``mode`` argument, then the domain's settings.
2. **Channel.** With a canary snapshot held (``canary_repository``) that differs from the
   stable one, the decision goes to the canary when ``stable_hash(unit_key or event_id) <
   canary_share``: a unit (user, session) keeps its channel across decisions and processes.
   Otherwise, and always when ``canary_share`` is 0, the stable channel decides. Everything
   below is the same on both channels; the event logs the channel, and the version of the
   snapshot that decided (empty when the baseline acted).
3. **Shields.** Candidates whose tracked cost or p95 latency exceeds the caller's budget are
   dropped before choosing (costs and latencies are tracked from the signals passed to
   :meth:`reward` and :meth:`observe`).
4. **Snapshot.** The policy of the channel's newest verified snapshot, swapped in atomically
   by a background refresh; a new snapshot whose drift flag is set is declined while an
   unflagged one is held (the last good snapshot keeps deciding, and the refresh says so once).
   No snapshot, an expired one, or only a drift-flagged one: the ``fallback`` policy (a local
   warm start) decides if given, else the baseline, and the fallback is counted by reason.
5. **Choice.** The policy's full distribution (exploration floor included) and a draw. In
   ``shadow`` mode the baseline acts, and the policy's distribution and version are logged as
   the recommendation (``recommended_probabilities``, ``recommended_version``).
6. **Shadow.** With a shadow snapshot held (``shadow_repository``; in any mode), it scores
   the same context and candidates (0 for the shielded-out ones), and its distribution and
   version are logged as the recommendation instead; it never acts, and draws from its own
   generator, so the acting policy's draws are those it would draw without it. That log
   makes the shadow a candidate for off-policy evaluation with no live traffic of its own.
7. **Emit.** The DecisionEvent goes to Kafka without waiting (delivery callbacks), or to the
   local spool while Kafka is unreachable. An event the join would dead-letter for its size
   (:class:`~streams.validation.ValidationLimits`) is refused instead: ``decide`` raises
   :class:`~streams.errors.FieldTooLarge` or :class:`~streams.errors.TooManyActions` and
   emits nothing. Candidate count and ids are checked before choosing; features when the
   event is encoded, and only when its encoding is too large to prove them (the usual event
   costs nothing). Without Kafka nothing is emitted, so features are not size-checked.

The baseline is the first remaining candidate.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import operator
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from learner.domain import DomainSettings
from learner.features import FeatureEncoder
from learner.policies import Policy
from streams.errors import EmptyActions, NonFiniteFeature, TooManyActions, WrongDimension
from streams.settings import KafkaSettings, RegistrySettings, TopicSettings
from streams.validation import ValidationLimits, Validator

log = logging.getLogger(__name__)

Mode = Literal["live", "shadow", "off"]
MODES = ("live", "shadow", "off")
#: snapshot channels a decision can be routed to (the DecisionEvent's ``channel``)
CHANNELS = ("stable", "canary")
_STABLE, _CANARY = CHANNELS
#: the snapshot slot that only recommends (scored beside every decision, never routed to)
_SHADOW = "shadow"
_SLOTS = (*CHANNELS, _SHADOW)
_FALSE = {"0", "false", "no", "off", "disabled"}
_TRUE = {"1", "true", "yes", "on", "enabled"}
_EVENT_FORM = frozenset(("numeric", "categorical", "vector"))
#: candidate lists of plain ids kept with their records (past it, the cache starts over)
_KNOWN_CANDIDATES = 1024
_ID = operator.itemgetter("id")


@dataclass(frozen=True)
class ActivePolicy:
    """A verified snapshot, ready to score: swapped in as one object."""

    version: str
    policy: Policy
    encoder: FeatureEncoder
    #: epoch seconds after which the snapshot must not be used (its metadata expired)
    expires_at: float = math.inf
    drift_flag: bool = False
    drift_reason: str = ""
    created_at: float = field(default_factory=time.time)
    #: updates the snapshot's state has learned from
    samples: int = 0


class SnapshotSource(Protocol):
    """Where the Decider's refresh thread gets verified snapshots (see publisher.pull)."""

    def latest(self) -> ActivePolicy | None:
        """The newest verified snapshot; raises a typed error when verification fails."""


class PulledSnapshots:
    """A :class:`SnapshotSource` over the verifying pull client (``publisher.SnapshotClient``).

    Every refresh runs the client's whole verification chain; the scoring objects are built
    once per new version. At start-up, when the repository cannot be reached, the last good
    snapshot in the client's cache is used (re-checked against its cached metadata) until it
    expires.
    """

    def __init__(self, client: Any):
        self.client = client
        self._last: ActivePolicy | None = None
        self._tried_cache = False

    def latest(self) -> ActivePolicy | None:
        try:
            loaded = self.client.refresh()
        except Exception:
            if self._last is None and not self._tried_cache:  # start-up while unreachable
                self._tried_cache = True
                cached = self.client.load_cached()
                if cached is not None:
                    log.warning("repository unreachable at start-up: using cached snapshot %s", cached.version)
                    self._last = self._active(cached)
                    return self._last
            raise  # the Decider counts it and keeps its last good snapshot
        if self._last is None or self._last.version != loaded.version:
            self._last = self._active(loaded)
        return self._last

    @staticmethod
    def _active(loaded: Any) -> ActivePolicy:
        snapshot = loaded.snapshot
        return ActivePolicy(
            version=snapshot.version,
            policy=loaded.policy,
            encoder=FeatureEncoder(snapshot.features(), snapshot.frozen_normalizer()),
            expires_at=loaded.expires.timestamp(),
            drift_flag=snapshot.drift_flag,
            drift_reason=snapshot.drift_reason,
            created_at=snapshot.created_at / 1000,
            samples=int(getattr(snapshot, "samples", 0)),
        )


@dataclass(frozen=True)
class Decision:
    """What ``decide`` returns."""

    action: str
    index: int
    probabilities: tuple[float, ...]
    event_id: str
    policy_version: str
    mode: str
    #: the policy's pick in shadow mode (the baseline acted); None otherwise
    recommended: str | None = None
    fallback: str | None = None
    #: the snapshot channel the decision was routed to: ``stable`` or ``canary``
    channel: str = _STABLE
    #: the distribution over the actions of the policy that recommended without acting (the
    #: shadow snapshot's, else the policy's in shadow mode); empty when none did
    recommended_probabilities: tuple[float, ...] = ()
    #: the version of the snapshot that gave ``recommended_probabilities``
    recommended_version: str = ""


class _Tracker:
    """Per-arm cost and p95 latency from observed signals (last ``window`` observations)."""

    def __init__(self, window: int = 256):
        self.window = window
        self._cost: dict[str, deque] = {}
        self._latency: dict[str, deque] = {}
        self._p95: dict[str, float] = {}
        self._mean_cost: dict[str, float] = {}

    def observe(self, arm: str, cost: float | None, latency_ms: float | None) -> None:
        if cost is not None and math.isfinite(cost):
            q = self._cost.setdefault(arm, deque(maxlen=self.window))
            q.append(cost)
            self._mean_cost[arm] = sum(q) / len(q)
        if latency_ms is not None and math.isfinite(latency_ms):
            q = self._latency.setdefault(arm, deque(maxlen=self.window))
            q.append(latency_ms)
            self._p95[arm] = float(np.percentile(np.fromiter(q, float), 95))

    def cost(self, arm: str) -> float | None:
        return self._mean_cost.get(arm)

    def p95_latency(self, arm: str) -> float | None:
        return self._p95.get(arm)


class DeciderMetrics:
    """The SDK's Prometheus metrics; every series names the snapshot channel (stable, canary),
    the snapshot series also the shadow's (channel ``shadow``)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "banditstream_sdk_decisions", "Decisions made, by domain, mode and channel.", ["domain", "mode", "channel"], registry=r
        )
        self.fallbacks = Counter(
            "banditstream_sdk_fallbacks", "Baseline decisions, by reason and channel.", ["domain", "reason", "channel"], registry=r
        )
        self.snapshot_version = Gauge(
            "banditstream_sdk_snapshot_info", "The snapshot in use per channel (value 1; version as a label).",
            ["domain", "channel", "version"], registry=r,
        )  # fmt: skip
        self.snapshot_age = Gauge(
            "banditstream_sdk_snapshot_age_seconds", "Age of the snapshot in use, per channel.", ["domain", "channel"], registry=r
        )
        self.verification_failures = Counter(
            "banditstream_sdk_verification_failures", "Snapshots refused, by channel and kind.", ["domain", "channel", "kind"],
            registry=r,
        )  # fmt: skip
        self.spool_depth = Gauge("banditstream_sdk_spool_depth", "Events waiting in the local spool.", ["domain"], registry=r)
        self.decide_latency = Histogram(
            "banditstream_sdk_decide_seconds", "Time spent in decide().", ["domain"], registry=r,
            buckets=(10e-6, 25e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 5e-3),
        )  # fmt: skip


class Decider:
    """Decide for one domain from verified snapshots; emit decisions and rewards.

    Parameters:
        domain: the decision point's name.
        repository: a :class:`SnapshotSource`, or a ``publisher.SnapshotClient`` (wrapped in
            :class:`PulledSnapshots`); None runs on the baseline only.
        canary_repository: the same for the canary channel's snapshots (e.g. a
            ``SnapshotClient(channel="canary")`` with its own ``cache_dir``); refreshed by
            the same background thread and swapped in the same way. None: no canary.
        canary_share: the share of units routed to the canary, in [0, 1); default the
            domain's ``settings.promotion.canary_share``.
        shadow_repository: the same for a shadow snapshot, scored beside every decision and
            logged as its recommendation, never acting (e.g. a ``SnapshotClient`` of the
            candidate's channel with its own ``cache_dir``). None: no shadow.
        kafka: where to emit events (``KafkaSettings`` or a bootstrap string); None emits
            nothing (offline use, tests).
        fallback: what decides instead of the baseline when no usable snapshot is held (none
            pulled or verified yet, expired, flagged for drift): a policy learned locally, e.g.
            :func:`banditstream.warmstart.local_policy` from a logged file. Its decisions log
            its version; the fallback is counted by reason all the same.
        schema_registry: the deployment's registry and framing (``settings.registry``), so
            the events are framed as every other producer of their topics frames them; None:
            the single-object encoding (a deployment without a registry). With the Confluent
            framing the schemas' ids are looked up (or registered) here, once, not in decide().
        mode: ``live``, ``shadow`` or ``off``; environment switches override it.
        settings: the domain's settings (policy, features, reward); default settings if None.
        refresh_interval_s: how often the background thread looks for a newer snapshot.
        spool_path: the local spool file for events while Kafka is unreachable.
        spool_max_bytes, spool_overflow: the spool's bound, and which events go past it:
            ``drop_newest`` (new events are refused) or ``drop_oldest``; counted either way.
        seed: seeds the choice draws (same seed and snapshot: same choices); the shadow's
            own generator is seeded alike, so it logs the distributions a Decider with this
            seed deciding with the shadow snapshot would.
    """

    def __init__(
        self,
        domain: str,
        repository: SnapshotSource | None = None,
        kafka: KafkaSettings | str | None = None,
        mode: Mode | None = None,
        *,
        settings: DomainSettings | None = None,
        tenant: str = "default",
        workspace: str = "main",
        topics: TopicSettings | None = None,
        refresh_interval_s: float = 5.0,
        spool_path: str | os.PathLike | None = None,
        spool_max_bytes: int = 64 << 20,
        spool_overflow: str = "drop_newest",
        seed: int | None = None,
        env: Mapping[str, str] | None = None,
        registry: CollectorRegistry | None = None,
        limits: ValidationLimits | None = None,
        remember_decisions: int = 100_000,
        clock: Callable[[], float] = time.time,
        canary_repository: SnapshotSource | None = None,
        canary_share: float | None = None,
        shadow_repository: SnapshotSource | None = None,
        schema_registry: RegistrySettings | None = None,
        fallback: ActivePolicy | None = None,
    ):
        self.domain = domain
        self.tenant = tenant
        self.workspace = workspace
        self.settings = settings or DomainSettings()
        self.topics = topics or TopicSettings()
        self.metrics = DeciderMetrics(registry)
        self._clock = clock
        self._env = os.environ if env is None else env
        self._explicit_mode = mode
        self._domain_switch = f"ENABLE_RL_{_env_name(domain)}"
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self._rng = np.random.default_rng(seed)
        self._shadow_rng = np.random.default_rng(seed)  # its own: the acting draws never depend on the shadow
        self._validator = Validator(limits or ValidationLimits())
        self._max_actions = self._validator.max_actions_of(self.settings.max_actions)
        for name, value in (("tenant", tenant), ("workspace", workspace), ("domain", domain)):
            self._validator.check_id_size(value, name)
        events = schema_registry or RegistrySettings()
        client = events.client() if kafka is not None else None
        self._serde_decision = events.serde("decision", self.topics.decisions, client=client)
        self._serde_reward = events.serde("reward", self.topics.rewards, client=client)
        if client is not None:  # the ids now: a registry away fails here, not inside decide()
            self._serde_decision.header()
            self._serde_reward.header()
        self._tracker = _Tracker()
        self._decisions = {c: {m: self.metrics.decisions.labels(domain, m, c) for m in MODES} for c in CHANNELS}
        self._decide_latency = self.metrics.decide_latency.labels(domain)
        self._recent: OrderedDict[str, str] = OrderedDict()  # event_id -> acted arm, for cost tracking
        self._known_candidates: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        self._remember = remember_decisions
        self._active: ActivePolicy | None = None
        self._fallback = fallback
        #: per channel, the drift-flagged version last declined (it is said once)
        self._drift_held: dict[str, str] = {}
        self._canary: ActivePolicy | None = None
        self._shadow: ActivePolicy | None = None
        self.canary_share = self.settings.promotion.canary_share if canary_share is None else canary_share
        if getattr(canary_repository, "channel", _CANARY) != _CANARY:
            raise ValueError(f"canary_repository follows the {canary_repository.channel!r} channel; give it channel='canary'")
        self._repository = _source(repository)
        self._canary_repository = _source(canary_repository)
        self._shadow_repository = _source(shadow_repository)
        self._emitter = None
        if kafka is not None:
            from banditstream.emitter import EventEmitter

            kafka_settings = kafka if isinstance(kafka, KafkaSettings) else KafkaSettings(bootstrap_servers=kafka)
            path = Path(spool_path) if spool_path else Path(".banditstream") / "spool" / f"{tenant}.{workspace}.{domain}.spool"
            self._emitter = EventEmitter(
                kafka_settings,
                spool_path=path,
                spool_max_bytes=spool_max_bytes,
                overflow=spool_overflow,
                on_spool_depth=self.metrics.spool_depth.labels(domain).set,
            )
        self._stop = threading.Event()
        self._refresh_thread = None
        if any(s is not None for s in (self._repository, self._canary_repository, self._shadow_repository)):
            self.refresh()  # first snapshots synchronously, so decide() starts informed
            self._refresh_thread = threading.Thread(
                target=self._refresh_loop, args=(refresh_interval_s,), name=f"banditstream-refresh-{domain}", daemon=True
            )
            self._refresh_thread.start()

    # -- deciding -------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The effective mode: environment switches, then the argument, then settings."""
        flag = self._env.get("ENABLE_RL_GLOBAL")
        if flag is not None and flag.strip().lower() in _FALSE:
            return "off"
        domain_flag = self._env.get(self._domain_switch)
        if domain_flag is not None:
            value = domain_flag.strip().lower()
            if value in _FALSE:
                return "off"
            if value in MODES:
                return value
            if value in _TRUE:
                return "live"
        return self._explicit_mode or self.settings.mode

    @property
    def policy_version(self) -> str:
        """The stable snapshot's version; empty without one."""
        active = self._active
        return active.version if active is not None else ""

    @property
    def active_policy(self) -> ActivePolicy | None:
        """The stable snapshot in use (its policy, version, encoder); None without one."""
        return self._active

    @property
    def canary_policy(self) -> ActivePolicy | None:
        """The canary snapshot held; None without one."""
        return self._canary

    @property
    def shadow_policy(self) -> ActivePolicy | None:
        """The shadow snapshot held; None without one."""
        return self._shadow

    @property
    def canary_version(self) -> str:
        """The canary snapshot's version; empty without one."""
        canary = self._canary
        return canary.version if canary is not None else ""

    @property
    def shadow_version(self) -> str:
        """The shadow snapshot's version; empty without one."""
        shadow = self._shadow
        return shadow.version if shadow is not None else ""

    @property
    def canary_share(self) -> float:
        """The share of units routed to the canary snapshot (while one is held)."""
        return self._canary_share

    @canary_share.setter
    def canary_share(self, share: float) -> None:
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share < 1.0:
            raise ValueError(f"canary_share must be a number in [0, 1), got {share!r}")
        self._canary_share = float(share)

    def decide(
        self,
        context: Mapping[str, Any],
        actions: Sequence[str | Mapping[str, Any]],
        event_id: str | None = None,
        *,
        unit_key: str | None = None,
        max_cost: float | None = None,
        max_latency_ms: float | None = None,
        deferred: bool = False,
    ) -> Decision:
        """Choose among ``actions`` for ``context``; see the module docstring for the steps.

        ``context``: ``{name: number | string | list}`` (numbers are numeric features, strings
        categorical, a list the dense vector) or the event form ``{numeric, categorical,
        vector}``. ``actions``: ids, or ``{"id": ..., "features": {...}}``. ``unit_key``:
        what keeps a channel (a user or session id); without it each event id is its own unit.
        ``deferred``: the decision is logged as deferred, to be learned only once activated
        (Personalizer's ``deferActivation``; the activation is a reward with the reserved id
        ``activate``).
        """
        started = time.perf_counter()
        ctx = _context_record(context)
        acts = self._action_records(actions)
        _check_inputs(ctx, acts, self.settings.features.vector_dim, self._max_actions)
        if event_id:
            self._validator.check_id_size(event_id, "event_id")
        event_id = event_id or _random_id()
        mode = self.mode
        active = self._active
        channel = _STABLE
        if self._canary_share:  # 0.0 without canary traffic: one test, nothing more
            canary = self._canary
            if canary is not None and (active is None or canary.version != active.version):
                if unit_key is not None and type(unit_key) is not str:
                    raise TypeError(f"unit_key must be a str, got {type(unit_key).__name__}")
                if stable_hash(unit_key or event_id) < self._canary_share:
                    active, channel = canary, _CANARY
        allowed = self._shield(acts, max_cost, max_latency_ms, channel)
        fallback = None
        recommended_index = -1
        recommended_probabilities: list[float] = []
        recommended_version = ""
        probabilities = [0.0] * len(acts)
        baseline = allowed[0]
        if mode == "off":
            chosen = baseline
            probabilities[baseline] = 1.0
        else:
            if active is None:
                fallback = "no_snapshot"
            elif self._clock() > active.expires_at:
                fallback = "expired"
            elif active.drift_flag:
                fallback = "drift"
            if fallback is not None:
                self.metrics.fallbacks.labels(self.domain, fallback, channel).inc()
                active = self._fallback  # the local warm start, if given, decides instead of the baseline
            if active is None:
                chosen = baseline
                probabilities[baseline] = 1.0
            else:
                candidates = acts if len(allowed) == len(acts) else [acts[i] for i in allowed]
                X = active.encoder.action_matrix(ctx, candidates)
                choice = active.policy.probabilities(X, [a["id"] for a in candidates], rng=self._rng)
                if mode == "shadow":
                    recommended_index = allowed[choice.chosen]
                    chosen = baseline
                    probabilities[baseline] = 1.0
                    recommended_probabilities = _spread(choice.probabilities, allowed, len(acts))
                    recommended_version = active.version
                elif len(allowed) == len(acts):
                    chosen = choice.chosen
                    probabilities = choice.probabilities.tolist()
                else:
                    chosen = allowed[choice.chosen]
                    for slot, p in zip(allowed, choice.probabilities.tolist()):
                        probabilities[slot] = p
        shadow = self._shadow
        if shadow is not None and self._clock() <= shadow.expires_at and not shadow.drift_flag:
            candidates = acts if len(allowed) == len(acts) else [acts[i] for i in allowed]
            X = shadow.encoder.action_matrix(ctx, candidates)
            scored = shadow.policy.probabilities(X, [a["id"] for a in candidates], rng=self._shadow_rng)
            recommended_probabilities = _spread(scored.probabilities, allowed, len(acts))
            recommended_version = shadow.version
        version = active.version if (active is not None and mode != "off") else ""
        event = {
            "event_id": event_id,
            "tenant": self.tenant,
            "workspace": self.workspace,
            "domain": self.domain,
            "timestamp": int(self._clock() * 1000),
            "context": ctx,
            "actions": acts,
            "chosen": chosen,
            "probabilities": probabilities,
            "policy_version": version,
            "mode": mode,
            "deferred": deferred,
            "recommended": recommended_index,
            "channel": channel,
            "recommended_probabilities": recommended_probabilities,
            "recommended_version": recommended_version,
        }
        if self._emitter is not None:
            payload = self._serde_decision.encode(event)
            if len(payload) > self._validator.small_event_bytes:  # too big to prove the sizes
                _check_sizes(ctx, acts, self._validator)
            self._emitter.emit(self.topics.decisions, event_id, payload)
        self._remember_arm(event_id, acts[chosen]["id"])
        self._decisions[channel][mode].inc()
        self._decide_latency.observe(time.perf_counter() - started)
        # A frozen dataclass's __init__ sets each of its eleven fields through object.__setattr__
        # (~0.25 us each): the same fields in one update of the new instance's dict.
        decision = object.__new__(Decision)
        decision.__dict__.update(
            action=acts[chosen]["id"],
            index=chosen,
            probabilities=tuple(probabilities),
            event_id=event_id,
            policy_version=version,
            mode=mode,
            recommended=acts[recommended_index]["id"] if recommended_index >= 0 else None,
            fallback=fallback,
            channel=channel,
            recommended_probabilities=tuple(recommended_probabilities),
            recommended_version=recommended_version,
        )
        return decision

    def reward(
        self,
        event_id: str,
        signals: Mapping[str, float] | float | None = None,
        *,
        value: float | None = None,
        reward_id: str | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Emit a RewardEvent for a decision: named ``signals`` or a plain ``value``."""
        if isinstance(signals, (int, float)):
            value, signals = float(signals), None
        signals = {k: float(v) for k, v in (signals or {}).items()}
        event = {
            "event_id": event_id,
            "reward_id": reward_id or _random_id(),
            "tenant": self.tenant,
            "workspace": self.workspace,
            "domain": self.domain,
            "timestamp": timestamp_ms if timestamp_ms is not None else int(self._clock() * 1000),
            "signals": signals,
            "value": value,
        }
        self._validator.validate_reward(event)
        arm = self._recent.get(event_id)
        if arm is not None:
            self._tracker.observe(arm, signals.get("cost_usd"), signals.get("latency_ms"))
        if self._emitter is not None:
            self._emitter.emit(self.topics.rewards, event_id, self._serde_reward.encode(event))

    def observe(self, arm: str, *, cost_usd: float | None = None, latency_ms: float | None = None) -> None:
        """Feed the shields' cost and latency tracking directly."""
        self._tracker.observe(arm, cost_usd, latency_ms)

    # -- snapshots ------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Look for newer verified snapshots now (stable, canary, shadow); True if one was swapped in."""
        swapped = False
        sources = ((_STABLE, self._repository), (_CANARY, self._canary_repository), (_SHADOW, self._shadow_repository))
        for channel, source in sources:
            if source is not None:
                swapped = self._refresh(channel, source) or swapped
        return swapped

    def use(self, active: ActivePolicy | None, *, channel: str = _STABLE) -> None:
        """Swap in a snapshot directly (tests, embedded use); ``channel="canary"`` for the canary,
        ``"shadow"`` for the shadow."""
        if channel not in _SLOTS:
            raise ValueError(f"channel must be one of {', '.join(_SLOTS)}, got {channel!r}")
        if active is not None:
            _warm(active)
        self._swap(channel, active)

    def _refresh(self, channel: str, source: SnapshotSource) -> bool:
        try:
            fresh = source.latest()
        except Exception as exc:  # noqa: BLE001 - any failure keeps the last good snapshot
            kind = getattr(exc, "kind", None) or _snake(type(exc).__name__)
            self.metrics.verification_failures.labels(self.domain, channel, kind).inc()
            held = self._held(channel)
            if held is not None:
                keeping = held.version
            elif channel != _STABLE:
                keeping = f"no {channel}"
            else:
                keeping = "the baseline" if self._fallback is None else f"the local warm start {self._fallback.version}"
            # An empty canary (or shadow) channel is the usual state between experiments, not a fault.
            level = logging.DEBUG if channel != _STABLE and kind == "not_found" else logging.WARNING
            log.log(level, "%s snapshot refresh for %s failed (%s): keeping %s", channel, self.domain, exc, keeping)
            return False
        current = self._held(channel)
        if fresh is None or (current is not None and fresh.version == current.version):
            self._update_age()
            return False
        if fresh.drift_flag and current is not None and not current.drift_flag:
            if self._drift_held.get(channel) != fresh.version:  # said once per flagged version
                self._drift_held[channel] = fresh.version
                log.warning("%s snapshot %s of %s is flagged for drift (%s): keeping %s", channel, fresh.version,
                            self.domain, fresh.drift_reason or "no reason given", current.version)  # fmt: skip
            self._update_age()
            return False
        _warm(fresh)
        self._swap(channel, fresh)
        self._update_age()
        if channel == _SHADOW:
            log.info("domain %s now scores snapshot %s in the shadow of its decisions", self.domain, fresh.version)
        else:
            log.info("domain %s now decides its %s traffic with snapshot %s", self.domain, channel, fresh.version)
        return True

    def _held(self, channel: str) -> ActivePolicy | None:
        return self._canary if channel == _CANARY else self._shadow if channel == _SHADOW else self._active

    def _swap(self, channel: str, fresh: ActivePolicy | None) -> None:
        current = self._held(channel)
        # one reference assignment: decide() sees old or new, never half
        if channel == _CANARY:
            self._canary = fresh
        elif channel == _SHADOW:
            self._shadow = fresh
        else:
            self._active = fresh
        if current is not None and (fresh is None or fresh.version != current.version):
            with contextlib.suppress(KeyError):
                self.metrics.snapshot_version.remove(self.domain, channel, current.version)
        if fresh is not None:
            self.metrics.snapshot_version.labels(self.domain, channel, fresh.version).set(1)

    def _refresh_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.refresh()

    def _update_age(self) -> None:
        for channel in _SLOTS:
            held = self._held(channel)
            if held is not None:
                self.metrics.snapshot_age.labels(self.domain, channel).set(max(0.0, self._clock() - held.created_at))

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def spool_depth(self) -> int:
        return self._emitter.spool_depth if self._emitter is not None else 0

    @property
    def in_flight(self) -> int:
        """Events handed to Kafka and not yet acknowledged (nor failed into the spool)."""
        return self._emitter.in_flight if self._emitter is not None else 0

    @property
    def emitter_stats(self):
        """The event emitter's counters (``EmitterStats``: sent, spooled, drained, ...); None
        without Kafka."""
        return self._emitter.stats if self._emitter is not None else None

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every emitted event is acknowledged by Kafka (spool drained)."""
        return self._emitter.flush(timeout) if self._emitter is not None else True

    def close(self, timeout: float = 10.0):
        """Stop; returns the emitter's ``CloseReport`` (what stays in the spool), None without Kafka."""
        self._stop.set()
        if self._refresh_thread is not None:
            self._refresh_thread.join(timeout)
        return self._emitter.close(timeout) if self._emitter is not None else None

    def __enter__(self) -> "Decider":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _shield(self, acts: list[dict], max_cost: float | None, max_latency_ms: float | None, channel: str) -> list[int]:
        if max_cost is None and max_latency_ms is None:
            return list(range(len(acts)))
        allowed = []
        for i, act in enumerate(acts):
            cost = self._tracker.cost(act["id"]) if max_cost is not None else None
            p95 = self._tracker.p95_latency(act["id"]) if max_latency_ms is not None else None
            if cost is not None and cost > max_cost:
                continue
            if p95 is not None and p95 > max_latency_ms:
                continue
            allowed.append(i)
        if not allowed:  # every candidate breaks the budget: keep the baseline rather than fail
            self.metrics.fallbacks.labels(self.domain, "all_shielded", channel).inc()
            return [0]
        return allowed

    def _action_records(self, actions: Sequence[str | Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The candidates as records; a list of plain ids usually repeats, so its records are
        kept (they are only read: by the encoder and the event's serialisation)."""
        key = tuple(actions)
        try:
            acts = self._known_candidates.get(key)
        except TypeError:  # unhashable: actions with features, recorded afresh
            acts = [_action_record(a) for a in key]
            if sum(map(len, map(_ID, acts))) > self._validator.short_ids_chars:
                self._validator.check_id_sizes(list(map(_ID, acts)), "actions[{}].id")
            return acts
        if acts is None:
            acts = [_action_record(a) for a in key]
            self._validator.check_id_sizes(list(map(_ID, acts)), "actions[{}].id")
            if all(type(a) is str for a in key):
                if len(self._known_candidates) >= _KNOWN_CANDIDATES:
                    self._known_candidates.clear()
                self._known_candidates[key] = acts
        return acts

    def _remember_arm(self, event_id: str, arm: str) -> None:
        recent = self._recent
        recent[event_id] = arm
        if len(recent) > self._remember:
            recent.popitem(last=False)


def stable_hash(key: str) -> float:
    """The key's place in [0, 1), the same in every process, release and platform.

    ``h = blake2b(key.encode("utf-8"), digest_size=8)`` read as a big-endian integer; its top
    53 bits over 2**53 (exactly representable, so never 1.0). A unit goes to the canary when
    ``stable_hash(unit_key) < canary_share``: raising the share only adds units.

        >>> stable_hash("user-42") == stable_hash("user-42")
        True
        >>> 0.0 <= stable_hash("") < 1.0
        True
    """
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) * _UNIT


_UNIT = 2.0**-53


def _spread(p: np.ndarray, allowed: list[int], n: int) -> list[float]:
    """A distribution over the ``allowed`` candidates as one over all ``n`` (0 for the others)."""
    if len(allowed) == n:
        return p.tolist()
    out = [0.0] * n
    for slot, value in zip(allowed, p.tolist()):
        out[slot] = value
    return out


def _source(source: Any) -> SnapshotSource | None:
    """A :class:`SnapshotSource` as given, or a ``publisher.SnapshotClient`` wrapped in one."""
    if source is not None and not hasattr(source, "latest") and hasattr(source, "refresh"):
        return PulledSnapshots(source)
    return source


def _warm(active: ActivePolicy) -> None:
    """Score once over the snapshot's arms before it goes live, so lazily built caches are
    built here, in the refresh thread, and not in the first decide after the swap."""
    arms = [a for a in active.policy.arm_ids() if a]
    if arms:
        X = np.zeros((len(arms), active.policy.dim))
        X[:, 0] = 1.0
        active.policy.probabilities(X, arms, rng=0)


def _check_inputs(ctx: dict[str, Any], acts: list[dict[str, Any]], vector_dim: int, max_actions: int) -> None:
    """The caller's part of a DecisionEvent, validated at the boundary (the rest is ours).

    Sizes are checked against the join's limits (:class:`~streams.validation.ValidationLimits`),
    so what ``decide`` accepts is never dead-lettered for its size: the number of candidates
    here, their ids when their records are built (once per list of plain ids), the features'
    sizes in :func:`_check_sizes`.
    """
    if not acts:
        raise EmptyActions("actions", [], "decide needs at least one candidate")
    if len(acts) > max_actions:
        raise TooManyActions("len(actions)", len(acts), f"at most {max_actions} candidates are allowed")
    _check_features("context", ctx, vector_dim)
    for i, act in enumerate(acts):
        features = act["features"]
        if features["numeric"] or features["vector"]:
            _check_features(f"actions[{i}].features", features, 0)


def _check_sizes(ctx: dict[str, Any], acts: list[dict[str, Any]], validator: Validator) -> None:
    """The context's and candidates' features within the size limits; ``decide`` runs this
    on an event it is about to emit whose encoding is too large to prove them."""
    validator.check_feature_sizes(ctx)
    for i, act in enumerate(acts):
        features = act["features"]
        if features["numeric"] or features["categorical"] or features["vector"]:
            validator.check_feature_sizes(features, i)


def _check_features(where: str, record: dict[str, Any], vector_dim: int) -> None:
    """One Features record: finite numbers; a dense vector of ``vector_dim`` values if set."""
    for name, value in record["numeric"].items():
        if not math.isfinite(value):
            raise NonFiniteFeature(f"{where}.numeric[{name!r}]", value, "features must be finite")
    vector = record["vector"]
    if vector:
        if vector_dim and len(vector) != vector_dim:
            raise WrongDimension(f"{where}.vector", len(vector), f"expected {vector_dim} values")
        if not all(map(math.isfinite, vector)):
            raise NonFiniteFeature(f"{where}.vector", vector, "features must be finite")


def _context_record(context: Mapping[str, Any]) -> dict[str, Any]:
    if context and context.keys() <= _EVENT_FORM:
        return {
            "numeric": {k: float(v) for k, v in context.get("numeric", {}).items()},
            "categorical": {k: str(v) for k, v in context.get("categorical", {}).items()},
            "vector": [float(x) for x in context.get("vector", [])],
        }
    numeric: dict[str, float] = {}
    categorical: dict[str, str] = {}
    vector: list[float] = []
    for name, value in context.items():
        if type(value) is float:  # the usual case, first
            numeric[name] = value
        elif isinstance(value, bool):
            categorical[name] = "true" if value else "false"
        elif isinstance(value, (int, float)):
            numeric[name] = float(value)
        elif isinstance(value, str):
            categorical[name] = value
        elif isinstance(value, (list, tuple, np.ndarray)):
            vector = [float(x) for x in value]
        else:
            raise TypeError(f"context[{name!r}] is a {type(value).__name__}; use a number, a string or a list")
    return {"numeric": numeric, "categorical": categorical, "vector": vector}


def _action_record(action: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(action, str):
        return {"id": action, "features": {"numeric": {}, "categorical": {}, "vector": []}}
    features = action.get("features") or {}
    return {"id": str(action["id"]), "features": _context_record(features) if features else {"numeric": {}, "categorical": {}, "vector": []}}


def _random_id() -> str:
    """32 random hex digits (128 bits from the OS), a quarter of the cost of ``uuid4().hex``."""
    return os.urandom(16).hex()


def _env_name(domain: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", domain).upper()


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
