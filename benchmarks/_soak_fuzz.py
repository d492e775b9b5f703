"""Bad records for the soak, drawn with hypothesis: every one must reach the dead-letter topic.

Each kind of bad record has a hypothesis strategy for its parameters (the bytes, the field to
break, the value to put there, the size, the partition shift, ...). Parameters are drawn in
seeded chunks (``@seed`` + ``@given`` with the generate phase only, no example database), so
a soak seed gives the same records on every run; a :class:`Fuzzer` turns a draw into a
record - a key, the value's bytes, and an explicit partition where the kind needs one.

Kinds on the join's sources (decisions, rewards): random bytes; valid Avro truncated; NaN or
infinity in a context feature, an action feature, a probability, a signal or a reward value;
probabilities that do not sum to one, are negative or one short; ``chosen`` out of range; an
unknown domain; strings past the size limits (ids, feature names, categorical values, signal
names); a null key; a key whose partition is not the record's (produced with an explicit
``partition=``); a reward whose decision never comes; a reward naming another domain than its
decision. Kinds on the learner's source (updates): random or truncated bytes; NaN/infinite
features, reward or weight, a negative weight, a wrong dimension, an unknown domain; a valid
update under another model's key. Rewards of the kinds that could change an outcome if they
were accepted (non-finite signals, null key, wrong partition, another domain, oversize signal
names) name a good decision whose window is open, stamped inside it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from benchmarks._soak_workload import TENANT, WORKSPACE, Decision, Workload, key_partition
from streams.serde import AvroSerde

_NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
_SALT = st.integers(0, 2**32 - 1)
_SOURCE = st.sampled_from(["decisions", "rewards"])

#: kind -> (strategy of its parameters, weight)
STRATEGIES: dict[str, tuple[st.SearchStrategy, float]] = {
    "random_bytes": (st.fixed_dictionaries({"topic": _SOURCE, "value": st.binary(max_size=512), "salt": _SALT}), 1.0),
    "truncated": (st.fixed_dictionaries({"topic": _SOURCE, "cut": st.floats(0.0, 1.0, exclude_max=True), "salt": _SALT}), 1.0),
    "nonfinite": (st.fixed_dictionaries({
        "target": st.sampled_from(["context", "action_feature", "probability", "signal", "value"]),
        "x": _NONFINITE, "salt": _SALT}), 1.0),
    "wrong_probabilities": (st.fixed_dictionaries({
        "how": st.sampled_from(["scaled", "negative", "one_short", "one_extra"]),
        "factor": st.one_of(st.floats(1.0001, 10.0), st.floats(0.0, 0.9999)), "salt": _SALT}), 1.0),
    "chosen_out_of_range": (st.fixed_dictionaries({
        "chosen": st.one_of(st.integers(-(2**31), -1), st.integers(0, 2**31 - 100)), "salt": _SALT}), 1.0),
    "unknown_domain": (st.fixed_dictionaries({"topic": _SOURCE, "name": st.text(min_size=1, max_size=40), "salt": _SALT}), 1.0),
    "oversize_string": (st.fixed_dictionaries({
        "field": st.sampled_from(["event_id", "action_id", "policy_version", "feature_name", "categorical", "signal_name"]),
        "size": st.integers(0, 20_000), "salt": _SALT}), 1.0),
    "null_key": (st.fixed_dictionaries({"topic": _SOURCE, "salt": _SALT}), 1.0),
    "wrong_partition": (st.fixed_dictionaries({"topic": _SOURCE, "shift": st.integers(1, 1 << 16), "salt": _SALT}), 1.0),
    "orphan_reward": (st.fixed_dictionaries({"salt": _SALT}), 0.5),
    "reward_other_domain": (st.fixed_dictionaries({"salt": _SALT}), 0.5),
    "update_garbage": (st.fixed_dictionaries({
        "how": st.sampled_from(["random", "truncated"]), "value": st.binary(max_size=512),
        "cut": st.floats(0.0, 1.0, exclude_max=True), "salt": _SALT}), 0.7),
    "update_invalid": (st.fixed_dictionaries({
        "how": st.sampled_from(["nonfinite_feature", "nonfinite_reward", "nonfinite_weight", "negative_weight",
                                "wrong_dimension", "unknown_domain"]),
        "x": _NONFINITE, "salt": _SALT}), 0.7),
    "update_wrong_key": (st.fixed_dictionaries({"salt": _SALT}), 0.4),
}  # fmt: skip


def draw(strategy: st.SearchStrategy, n: int, seed_value: int) -> list[Any]:
    """``n`` draws of ``strategy`` (fewer if hypothesis finds its space exhausted), the same
    for the same seed."""
    out: list[Any] = []

    @seed(seed_value)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(strategy)
    def collect(value):
        out.append(value)

    collect()
    return out


@dataclass
class BadRecord:
    kind: str
    role: str  # decisions, rewards, updates
    key: bytes | None
    value: bytes
    partition: int | None = None  # explicit partition, else the producer's partitioner
    target: str | None = None  # the good decision a bad reward names, if any


class Fuzzer:
    """Turns hypothesis draws into bad records, in a seeded order of kinds."""

    CHUNK = 250

    def __init__(self, workload: Workload, partitions: int, update_partitions: int, seed_value: int,
                 recent: Callable[[int], Decision | None]):  # fmt: skip
        self.workload = workload
        self.partitions = partitions
        self.update_partitions = update_partitions
        self.seed = seed_value
        self.recent = recent  # now_ms -> a good decision whose window is open, or None
        self.kinds = list(STRATEGIES)
        weights = np.array([STRATEGIES[k][1] for k in self.kinds])
        self.weights = weights / weights.sum()
        self.rng = np.random.default_rng(seed_value + 7919)
        self.pools: dict[str, list[Any]] = {k: [] for k in self.kinds}
        self.chunks: dict[str, int] = {k: 0 for k in self.kinds}
        self.serdes = {role: AvroSerde(name, framing="single_object", max_payload_bytes=8_000_000)
                       for role, name in (("decisions", "decision"), ("rewards", "reward"), ("updates", "update"))}  # fmt: skip
        self.count = 0
        self.domains = list(workload.settings)

    def _params(self, kind: str) -> dict[str, Any]:
        pool = self.pools[kind]
        if not pool:
            chunk = self.chunks[kind]
            self.chunks[kind] += 1
            chunk_seed = zlib.crc32(f"{self.seed}/{kind}/{chunk}".encode())  # not hash(): salted per process
            pool.extend(reversed(draw(STRATEGIES[kind][0], self.CHUNK, chunk_seed)))
        return pool.pop()

    def next(self, now_ms: int) -> BadRecord:
        kind = self.kinds[int(self.rng.choice(len(self.kinds), p=self.weights))]
        params = self._params(kind)
        self.count += 1
        rng = np.random.default_rng(params["salt"])
        return getattr(self, f"_{kind}")(kind, params, rng, now_ms, f"bad-{self.count:08d}")

    # -- helpers ----------------------------------------------------------------------------

    def _decision(self, event_id: str, rng, now_ms: int) -> dict[str, Any]:
        domain = self.domains[int(rng.integers(len(self.domains)))]
        return self.workload.record(event_id, domain, now_ms, rng)

    def _reward(self, event_id: str, rng, now_ms: int, *, target: Decision | None = None) -> dict[str, Any]:
        domain = target.domain if target else self.domains[int(rng.integers(len(self.domains)))]
        signals = {"success": float(rng.random() < 0.5), "resolved": float(rng.random() < 0.5),
                   "latency_ms": float(rng.uniform(50, 3000))}  # fmt: skip
        return Workload.reward_record(target.event_id if target else event_id, f"{event_id}-bad", domain, now_ms, signals)

    def _target(self, now_ms: int) -> Decision | None:
        return self.recent(now_ms)

    def _encode(self, role: str, record: dict[str, Any]) -> bytes:
        return self.serdes[role].encode(record)

    def _keyed(self, kind: str, role: str, record: dict[str, Any], **extra) -> BadRecord:
        return BadRecord(kind, role, record["event_id"].encode(), self._encode(role, record), **extra)

    def _source_record(self, role: str, event_id: str, rng, now_ms: int, *, target_rewards: bool) -> tuple[dict, str | None]:
        if role == "decisions":
            return self._decision(event_id, rng, now_ms), None
        target = self._target(now_ms) if target_rewards else None
        return self._reward(event_id, rng, now_ms, target=target), (target.event_id if target else None)

    def _update(self, event_id: str, rng) -> tuple[dict[str, Any], str]:
        """A valid UpdateEvent of a decision that was never made, and its shard key."""
        domain = self.domains[int(rng.integers(len(self.domains)))]
        settings = self.workload.settings[domain]
        actions = list(self.workload.envs[domain].actions)
        arm_index = int(rng.integers(len(actions)))
        shared = settings.features.shared
        p = [1.0 / len(actions)] * len(actions)
        record = {
            "event_id": event_id, "tenant": TENANT, "workspace": WORKSPACE, "domain": domain,
            "arm": actions[arm_index], "arm_index": arm_index, "actions": actions, "probabilities": p,
            "probability": p[arm_index], "features": [1.0] + [float(x) for x in rng.normal(0, 1, settings.features.dimension - 1)],
            "feature_hash": settings.features.config_hash(), "reward": float(rng.random()), "signals": {},
            "reward_count": 1, "join_status": "rewarded", "mode": "live", "policy_version": "soak-bad",
            "decision_time": 1_700_000_000_000, "reward_time": None, "weight": 1.0,
        }  # fmt: skip
        key = f"{TENANT}/{WORKSPACE}/{domain}" if shared else f"{TENANT}/{WORKSPACE}/{domain}/{actions[arm_index]}"
        return record, key

    # -- the kinds --------------------------------------------------------------------------

    def _random_bytes(self, kind, params, rng, now_ms, event_id):
        return BadRecord(kind, params["topic"], event_id.encode(), params["value"])

    def _truncated(self, kind, params, rng, now_ms, event_id):
        record, _ = self._source_record(params["topic"], event_id, rng, now_ms, target_rewards=False)
        value = self._encode(params["topic"], record)
        cut = min(len(value) - 1, max(1, int(len(value) * params["cut"])))
        return BadRecord(kind, params["topic"], event_id.encode(), value[:cut])

    def _nonfinite(self, kind, params, rng, now_ms, event_id):
        target, x = params["target"], params["x"]
        if target in ("signal", "value"):
            good = self._target(now_ms)
            record = self._reward(event_id, rng, now_ms, target=good)
            if target == "signal":
                record["signals"]["latency_ms"] = x
            else:
                record["value"] = x
            return self._keyed(kind, "rewards", record, target=good.event_id if good else None)
        record = self._decision(event_id, rng, now_ms)
        if target == "context":
            name = next(iter(record["context"]["numeric"]))
            record["context"]["numeric"][name] = x
        elif target == "action_feature":
            record["actions"][int(rng.integers(len(record["actions"])))]["features"]["numeric"]["price"] = x
        else:
            record["probabilities"][int(rng.integers(len(record["probabilities"])))] = x
        return self._keyed(kind, "decisions", record)

    def _wrong_probabilities(self, kind, params, rng, now_ms, event_id):
        record = self._decision(event_id, rng, now_ms)
        p = record["probabilities"]
        how = params["how"]
        if how == "scaled":
            record["probabilities"] = [x * params["factor"] for x in p]
        elif how == "negative":
            i, j = (int(k) for k in rng.choice(len(p), 2, replace=False))
            delta = p[i] + 0.01 * params["factor"] + 1e-3  # p[i] below zero, the sum still one
            p[i], p[j] = p[i] - delta, p[j] + delta
        elif how == "one_short":
            record["probabilities"] = p[:-1]
            record["chosen"] = min(record["chosen"], len(p) - 2)
        else:
            record["probabilities"] = [*p[:-1], p[-1] / 2, p[-1] / 2]
        return self._keyed(kind, "decisions", record)

    def _chosen_out_of_range(self, kind, params, rng, now_ms, event_id):
        record = self._decision(event_id, rng, now_ms)
        chosen = params["chosen"]
        record["chosen"] = chosen if chosen < 0 else len(record["actions"]) + chosen
        return self._keyed(kind, "decisions", record)

    def _unknown_domain(self, kind, params, rng, now_ms, event_id):
        name = params["name"] if params["name"] not in self.workload.settings else params["name"] + "-unknown"
        record, _ = self._source_record(params["topic"], event_id, rng, now_ms, target_rewards=False)
        record["domain"] = name
        return self._keyed(kind, params["topic"], record)

    def _oversize_string(self, kind, params, rng, now_ms, event_id):
        field_name = params["field"]
        is_id = field_name in ("event_id", "action_id", "policy_version")
        size = (257 + params["size"] % 5_000) if is_id else (1_025 + params["size"])
        text = "".join(chr(c) for c in rng.integers(97, 123, size))
        if field_name == "signal_name":
            good = self._target(now_ms)
            record = self._reward(event_id, rng, now_ms, target=good)
            record["signals"][text] = 1.0
            return self._keyed(kind, "rewards", record, target=good.event_id if good else None)
        record = self._decision(event_id, rng, now_ms)
        if field_name == "event_id":
            record["event_id"] = f"{event_id}-{text}"
        elif field_name == "action_id":
            record["actions"][int(rng.integers(len(record["actions"])))]["id"] = text
        elif field_name == "policy_version":
            record["policy_version"] = text
        elif field_name == "feature_name":
            record["context"]["numeric"][text] = 1.0
        else:
            name = next(iter(record["context"]["categorical"]))
            record["context"]["categorical"][name] = text
        return self._keyed(kind, "decisions", record)

    def _null_key(self, kind, params, rng, now_ms, event_id):
        record, target = self._source_record(params["topic"], event_id, rng, now_ms, target_rewards=True)
        return BadRecord(kind, params["topic"], None, self._encode(params["topic"], record), target=target)

    def _wrong_partition(self, kind, params, rng, now_ms, event_id):
        record, target = self._source_record(params["topic"], event_id, rng, now_ms, target_rewards=True)
        key = record["event_id"].encode()
        right = key_partition(key, self.partitions)
        wrong = (right + 1 + params["shift"] % (self.partitions - 1)) % self.partitions
        return BadRecord(kind, params["topic"], key, self._encode(params["topic"], record), partition=wrong, target=target)

    def _orphan_reward(self, kind, params, rng, now_ms, event_id):
        return self._keyed(kind, "rewards", self._reward(event_id, rng, now_ms))

    def _reward_other_domain(self, kind, params, rng, now_ms, event_id):
        good = self._target(now_ms)
        record = self._reward(event_id, rng, now_ms, target=good)
        record["domain"] = next(d for d in self.domains if d != record["domain"])
        return self._keyed(kind, "rewards", record, target=good.event_id if good else None)

    def _update_garbage(self, kind, params, rng, now_ms, event_id):
        record, key = self._update(event_id, rng)
        if params["how"] == "random":
            value = params["value"]
        else:
            value = self._encode("updates", record)
            value = value[: min(len(value) - 1, max(1, int(len(value) * params["cut"])))]
        return BadRecord(kind, "updates", key.encode(), value)

    def _update_invalid(self, kind, params, rng, now_ms, event_id):
        record, key = self._update(event_id, rng)
        how, x = params["how"], params["x"]
        if how == "nonfinite_feature":
            record["features"][int(rng.integers(1, len(record["features"])))] = x
        elif how == "nonfinite_reward":
            record["reward"] = x
        elif how == "nonfinite_weight":
            record["weight"] = x
        elif how == "negative_weight":
            record["weight"] = -float(rng.uniform(0.01, 5))
        elif how == "wrong_dimension":
            record["features"] = record["features"] + [0.5]
        else:
            record["domain"] = "no_such_domain"
            key = key.replace(key.split("/")[2], "no_such_domain", 1)
        return BadRecord(kind, "updates", key.encode(), self._encode("updates", record))

    def _update_wrong_key(self, kind, params, rng, now_ms, event_id):
        record, key = self._update(event_id, rng)
        other = next(d for d in self.domains if d != record["domain"])
        wrong = f"{TENANT}/{WORKSPACE}/{other}/{record['arm']}"
        return BadRecord(kind, "updates", wrong.encode(), self._encode("updates", record))


def kinds() -> Sequence[str]:
    return list(STRATEGIES)
