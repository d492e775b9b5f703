"""The soak's good events, what a correct pipeline makes of them, and the reference posterior.

A :class:`Workload` makes DecisionEvents with realistic contexts (the simulated domains of
:mod:`banditstream.simulate`) and plans each decision's rewards: none (the domain's default
reward), one or several inside the window, one after it (late: dead-lettered, never learned),
or one of each. Every event is stamped with its producer's clock: event time.

The :class:`Ledger` remembers what was produced and where it landed (delivery reports), so
the expected outcome of every decision follows from the events alone, without the workers:
*rewarded* iff at least one delivered, good reward is stamped in ``[decision.ts,
decision.ts + window]``, its reward the domain's aggregate of those rewards computed by the
project's own reward engine (:meth:`learner.reward.RewardEngine.aggregate`); *default*
otherwise. :func:`reference_posterior` folds those expected updates the way the learner folds
its partitions (offset-aligned blocks, one ``update_batch`` per domain and block, rows in
offset order, the first copy of an event id wins), so the learner's published state must
equal it up to float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from banditstream.simulate import Environment, make_environment
from learner.domain import DomainSettings
from learner.features import FeatureEncoder
from learner.policies import SHARED_ARM, Policy
from learner.store import ArmKey

try:
    from streams.partitioning import key_partition
except ImportError:  # older tree: Kafka's murmur2, as librdkafka's murmur2_random places keys
    def key_partition(key: bytes, partitions: int, partitioner: str = "murmur2_random") -> int:
        m, mask = 0x5BD1E995, 0xFFFFFFFF
        h = (0x9747B28C ^ len(key)) & mask
        full = len(key) - len(key) % 4
        for i in range(0, full, 4):
            k = (int.from_bytes(key[i : i + 4], "little") * m) & mask
            k = ((k ^ (k >> 24)) * m) & mask
            h = ((h * m) & mask) ^ k
        tail = len(key) % 4
        if tail == 3:
            h ^= key[full + 2] << 16
        if tail >= 2:
            h ^= key[full + 1] << 8
        if tail >= 1:
            h = ((h ^ key[full]) * m) & mask
        h = ((h ^ (h >> 13)) * m) & mask
        return ((h ^ (h >> 15)) & 0x7FFFFFFF) % partitions


TENANT, WORKSPACE = "default", "main"


def domain_tree(window_s: float, seed: int) -> dict[str, dict]:
    """The soak's two domains: a per-arm Thompson router summing its rewards, and a shared
    Thompson template picker keeping the best reward; both with a short window."""
    routing, templates = make_environment("llm_routing"), make_environment("support_templates")
    return {
        "llm_routing": {
            "policy": "lin_ts", "params": {"v": 0.3, "eps0": 0.02, "seed": seed},
            "features": {"dimension": 32, "normalize": False},
            "reward": {"expression": routing.reward_expression, "window_s": window_s, "default_reward": 0.0,
                       "aggregate": "sum"},
        },
        "support_templates": {
            "policy": "shared_lin_ts", "params": {"v": 0.3, "eps0": 0.02, "seed": seed + 1},
            "features": {"dimension": 64, "normalize": False, "shared": True, "interactions": True},
            "reward": {"expression": templates.reward_expression, "window_s": window_s, "default_reward": -0.1,
                       "aggregate": "max"},
        },
    }  # fmt: skip


@dataclass(slots=True)
class Reward:
    reward_id: str
    ts: int
    signals: dict[str, float]
    late: bool  # stamped after its decision's window: to be dead-lettered, never learned
    where: tuple[int, int | None] | None = None  # (partition, offset) once delivered
    failed: str | None = None
    digest: bytes | None = None  # its bytes' digest (key and value), once delivered
    acked: float = 0.0  # wall time its delivery report came


@dataclass(slots=True)
class Decision:
    event_id: str
    domain: str
    ts: int
    source: str  # live, skewed, burst, backlog
    arm: str
    arm_index: int
    probability: float
    features: np.ndarray
    sent_wall: float = 0.0  # wall time it was produced
    final_wall: float = 0.0  # wall time its last reward is produced (its outcome is then known)
    rewards: list[Reward] = field(default_factory=list)
    where: tuple[int, int | None] | None = None
    failed: str | None = None
    digest: bytes | None = None  # its bytes' digest (key and value), once delivered
    acked: float = 0.0  # wall time its delivery report came
    expected: tuple[str, float, int] | None = None  # (status, reward, reward_count), once final

    def shard_key(self, shared: bool) -> str:
        return f"{TENANT}/{WORKSPACE}/{self.domain}" if shared else f"{TENANT}/{WORKSPACE}/{self.domain}/{self.arm}"

    def model_key(self, shared: bool) -> ArmKey:
        return ArmKey(TENANT, WORKSPACE, self.domain, SHARED_ARM if shared else self.arm)


class Workload:
    """Seeded good events for the soak's domains."""

    #: How a decision's rewards go: no reward, late only, several in the window, one in the
    #: window and one late; the rest get one reward in the window.
    P_DEFAULT, P_LATE, P_MULTI, P_MIXED = 0.15, 0.05, 0.15, 0.05

    def __init__(self, settings: Mapping[str, DomainSettings], window_ms: int, seed: int):
        self.settings = dict(settings)
        self.window_ms = window_ms
        self.envs: dict[str, Environment] = {name: make_environment(name) for name in self.settings}
        self.encoders = {name: FeatureEncoder(s.features) for name, s in self.settings.items()}
        self.engines = {name: s.reward_engine() for name, s in self.settings.items()}
        self.shared = {name: s.features.shared for name, s in self.settings.items()}
        self.rng = np.random.default_rng(seed)
        self.names = list(self.settings)
        self.count = 0

    def record(self, event_id: str, domain: str, ts: int, rng: np.random.Generator | None = None) -> dict[str, Any]:
        """A DecisionEvent as a service logs it: a context, the candidates, the distribution
        the chosen one was drawn from."""
        rng = rng or self.rng
        env = self.envs[domain]
        context = env.sample_context(rng)
        actions = list(env.actions)
        scores = rng.normal(0.0, 1.0, len(actions))
        p = np.exp(scores - scores.max())
        p = 0.9 * p / p.sum() + 0.1 / len(actions)
        probabilities = [float(x) for x in p]
        probabilities[-1] = 1.0 - math.fsum(probabilities[:-1])
        chosen = int(rng.choice(len(actions), p=np.array(probabilities) / math.fsum(probabilities)))
        return {
            "event_id": event_id, "tenant": TENANT, "workspace": WORKSPACE, "domain": domain, "timestamp": ts,
            "context": context,
            "actions": [{"id": a, "features": {"numeric": {}, "categorical": {}, "vector": []}} for a in actions],
            "chosen": chosen, "probabilities": probabilities, "policy_version": "soak-1.0.0", "mode": "live",
            "deferred": False, "recommended": -1,
        }  # fmt: skip

    def decision(self, source: str, ts: int) -> tuple[Decision, dict[str, Any]]:
        domain = self.names[self.count % len(self.names)]
        event_id = f"{source[:2]}-{domain[:3]}-{self.count:08d}"
        self.count += 1
        record = self.record(event_id, domain, ts)
        chosen = record["chosen"]
        features = self.encoders[domain].acted_matrix((record,))[0].astype(np.float64)
        decision = Decision(event_id, domain, ts, source, record["actions"][chosen]["id"], chosen,
                            record["probabilities"][chosen], features)  # fmt: skip
        return decision, record

    def plan_rewards(self, decision: Decision, record: Mapping[str, Any]) -> list[tuple[int, dict[str, Any]]]:
        """The decision's rewards as (timestamp, RewardEvent), added to ``decision.rewards``."""
        rng, w = self.rng, self.window_ms
        fate = rng.random()
        stamps: list[tuple[int, bool]] = []
        in_window = lambda: decision.ts + int(rng.uniform(20, w - 300))  # noqa: E731
        late = lambda: decision.ts + w + int(rng.uniform(500, 2500))  # noqa: E731
        if fate < self.P_DEFAULT:
            pass
        elif fate < self.P_DEFAULT + self.P_LATE:
            stamps.append((late(), True))
        elif fate < self.P_DEFAULT + self.P_LATE + self.P_MULTI:
            stamps.extend((in_window(), False) for _ in range(int(rng.integers(2, 4))))
        elif fate < self.P_DEFAULT + self.P_LATE + self.P_MULTI + self.P_MIXED:
            stamps.extend([(in_window(), False), (late(), True)])
        else:
            stamps.append((in_window(), False))
        env = self.envs[decision.domain]
        out = []
        for j, (ts, is_late) in enumerate(sorted(stamps)):
            signals = env.outcome(record["context"], decision.arm, rng).signals
            reward = Reward(f"{decision.event_id}-r{j}", ts, signals, is_late)
            decision.rewards.append(reward)
            out.append((ts, self.reward_record(decision.event_id, reward.reward_id, decision.domain, ts, signals)))
        return out

    @staticmethod
    def reward_record(event_id: str, reward_id: str, domain: str, ts: int, signals: Mapping[str, float]) -> dict[str, Any]:
        return {"event_id": event_id, "reward_id": reward_id, "tenant": TENANT, "workspace": WORKSPACE,
                "domain": domain, "timestamp": ts, "signals": dict(signals), "value": None}  # fmt: skip

    def expected(self, decision: Decision) -> tuple[str, float, int]:
        """What a correct join emits for the decision: (join_status, reward, reward_count)."""
        end = decision.ts + self.window_ms
        on_time = [{"reward_id": r.reward_id, "timestamp": r.ts, "signals": r.signals, "value": None}
                   for r in decision.rewards if r.where is not None and decision.ts <= r.ts <= end]  # fmt: skip
        engine = self.engines[decision.domain]
        if not on_time:
            return "default", float(engine.default_reward), 0
        reward, _signals, count = engine.aggregate(on_time)
        return "rewarded", float(reward), int(count)


def reference_posterior(
    decisions: list[Decision],
    first_seen: Mapping[str, tuple[int, int]],
    settings: Mapping[str, DomainSettings],
    block_size: int,
    update_partitions: int,
) -> dict[ArmKey, Policy]:
    """The posterior a correct loop reaches: every expected update once, folded per updates
    partition in blocks of ``block_size`` offsets, one ``update_batch`` per domain and block,
    rows in offset order (as :mod:`streams._learn_shard` folds). A decision whose update was
    first seen at (partition, offset) sits there; one never seen (lost) is appended to the
    partition its shard key belongs to, after everything else."""
    shared = {name: s.features.shared for name, s in settings.items()}
    rows: dict[int, list[tuple[float, int, Decision]]] = {}
    for order, d in enumerate(decisions):
        if d.expected is None:
            continue
        where = first_seen.get(d.event_id)
        if where is None:
            partition = key_partition(d.shard_key(shared[d.domain]).encode(), update_partitions)
            where = (partition, math.inf)
        rows.setdefault(where[0], []).append((where[1], order, d))
    models: dict[ArmKey, Policy] = {}
    for partition, items in rows.items():
        items.sort(key=lambda item: (item[0], item[1]))
        policies: dict[str, Policy] = {}
        block_rows: dict[Any, dict[str, list[Decision]]] = {}
        for offset, _order, d in items:
            block = offset // block_size if offset != math.inf else math.inf
            block_rows.setdefault(block, {}).setdefault(d.domain, []).append(d)
        for block in sorted(block_rows):
            for domain, ds in block_rows[block].items():
                policy = policies.get(domain)
                if policy is None:
                    policy = policies[domain] = settings[domain].make_policy()
                X = np.array([d.features for d in ds], dtype=np.float64)
                arms = [SHARED_ARM if shared[domain] else d.arm for d in ds]
                rewards = np.array([d.expected[1] for d in ds], dtype=np.float64)
                policy.update_batch(X, arms, rewards, np.ones(len(ds)))
                for d in ds:
                    models[d.model_key(shared[domain])] = policy
    return models


def compare_posterior(
    published: Mapping[ArmKey, Mapping[str, Any]],
    expected: Mapping[ArmKey, Policy],
    settings: Mapping[str, DomainSettings],
    rtol: float = 1e-6,
) -> dict[str, Any]:
    """Published PosteriorShards against the reference: the largest relative error of any
    statistic, and the models whose statistics or update counts differ (or are missing)."""
    worst = 0.0
    mismatched: list[dict[str, Any]] = []
    for key, policy in expected.items():
        record = published.get(key)
        if record is None:
            mismatched.append({"model": str(key), "problem": "not published"})
            continue
        mine = settings[key.domain].make_policy()
        mine.load_arm_state(key.arm, record["state"])
        want, got = policy.arm_statistics(key.arm), mine.arm_statistics(key.arm)
        err = 0.0
        for name, w in want.items():
            g = got[name]
            scale = max(float(np.max(np.abs(w))) if w.size else 0.0, 1e-12)
            err = max(err, float(np.max(np.abs(g - w))) / scale if w.size else 0.0)
        worst = max(worst, err)
        counts = (int(record["update_count"]), policy.update_count(key.arm))
        if err > rtol or counts[0] != counts[1]:
            mismatched.append({"model": str(key), "rel_err": err, "update_count": counts[0], "expected_count": counts[1]})
    extra = [str(k) for k in published if k not in expected]
    return {"models": len(expected), "max_rel_err": worst, "mismatched": mismatched, "unexpected_models": extra}
