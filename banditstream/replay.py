"""`banditstream replay`: warm-start the loop from logs you already have.

Two inputs:

- **A JSONL interaction log** (one JSON object per line), as assistants and RAG services
  commonly keep one: an interaction line has ``interaction_id``, the ``question`` (or a
  ``context`` object of numbers, strings, booleans and at most one list of numbers, the dense
  vector), the ``agent`` that answered, and optionally ``category``, ``top_k``,
  ``num_sources``, ``timestamp`` (epoch seconds or milliseconds, or ISO 8601), ``probability``;
  a feedback line has ``interaction_id`` and ``reward`` (a line may carry both). Each
  interaction becomes a DecisionEvent (the agents seen in the log, or ``--actions``, are the
  candidates; the logged agent is the chosen one, with the logged ``probability`` or, when
  there is none, the uniform 1/K — an assumption the summary states); each feedback becomes
  a RewardEvent with the reward as its ``value``. An interaction may list its own candidates
  with their features (``actions``: ``[{"id", "features": {name: number | string | bool}}]``,
  what a shared model learns from, e.g. a RAG configuration's knobs) and the whole logged
  distribution (``probabilities``, one per candidate).
- **Avro container files** of DecisionEvents and/or RewardEvents (any schema version).

Every line is validated; a bad line is reported with its line number and skipped, never
fatal. Valid events are produced to the decisions and rewards topics, keyed by event_id.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import fastavro

import schemas
from learner.domain import DomainSettings
from learner.features import FeatureEncoder

from streams.client import EventProducer
from streams.errors import BanditstreamError
from streams.settings import RegistrySettings
from streams.validation import Validator


@dataclass
class Problem:
    source: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.message}"


@dataclass
class ReplayResult:
    decisions: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    assumed_uniform: int = 0
    lines: int = 0


class ReplayError(BanditstreamError):
    """The replay input as a whole cannot be used (missing file, unknown format)."""

    reason = "replay"


def read_log(
    path: str | Path,
    *,
    domain: str,
    actions: Sequence[str] | None = None,
    tenant: str = "default",
    workspace: str = "main",
    validator: Validator | None = None,
) -> ReplayResult:
    """Parse and validate a JSONL log or an Avro file into events (nothing is produced)."""
    path = Path(path)
    if not path.exists():
        raise ReplayError("path", str(path), "no such file")
    validator = validator or Validator()
    if path.suffix == ".avro":
        return _read_avro(path, validator)
    return _read_jsonl(path, domain, actions, tenant, workspace, validator)


def produce(result: ReplayResult, producer: EventProducer, *, decisions_topic: str, rewards_topic: str,
            registry: RegistrySettings | None = None, progress=None) -> int:
    """Send the events (decisions first, each reward after its decision), framed as the
    deployment's ``registry`` says (None: single-object); returns the count."""
    events = registry or RegistrySettings()
    client = events.client()
    decision_serde = events.serde("decision", decisions_topic, client=client)
    reward_serde = events.serde("reward", rewards_topic, client=client)
    sent = 0
    for decision in result.decisions:
        producer.send(decisions_topic, decision_serde, decision)
        sent += 1
        if progress is not None:
            progress(1)
    for reward in result.rewards:
        producer.send(rewards_topic, reward_serde, reward)
        sent += 1
        if progress is not None:
            progress(1)
    producer.flush()
    return sent


# -- JSONL --------------------------------------------------------------------------------


def _read_jsonl(path, domain, actions, tenant, workspace, validator) -> ReplayResult:
    result = ReplayResult()
    parsed: list[tuple[int, dict[str, Any]]] = []
    for number, text in _lines(path):
        result.lines += 1
        try:
            line = json.loads(text)
        except json.JSONDecodeError as exc:
            result.problems.append(Problem(path.name, number, f"not JSON: {exc.msg} at column {exc.colno}"))
            continue
        if not isinstance(line, dict):
            result.problems.append(Problem(path.name, number, f"expected a JSON object, got {type(line).__name__}"))
            continue
        iid = line.get("interaction_id")
        if not isinstance(iid, (str, int)) or iid == "":
            result.problems.append(Problem(path.name, number, f"interaction_id is {iid!r}; every line needs one"))
            continue
        if "agent" not in line and "reward" not in line:
            result.problems.append(Problem(path.name, number, "neither an interaction (agent) nor feedback (reward)"))
            continue
        parsed.append((number, line))

    candidates = list(actions) if actions else sorted({str(line["agent"]) for _, line in parsed if "agent" in line})
    seen: dict[str, dict[str, Any]] = {}
    feedback_counts: dict[str, int] = {}
    for number, line in parsed:
        iid = str(line["interaction_id"])
        try:
            timestamp = _timestamp(line.get("timestamp"), default=None)
        except ValueError as exc:
            result.problems.append(Problem(path.name, number, str(exc)))
            continue
        if "agent" in line:
            if iid in seen:
                result.problems.append(Problem(path.name, number, f"interaction {iid!r} appears twice; the first is kept"))
            else:
                decision = _decision(line, iid, candidates, domain, tenant, workspace, timestamp)
                if isinstance(decision, str):
                    result.problems.append(Problem(path.name, number, decision))
                    continue
                try:
                    validator.validate_decision(decision)
                except BanditstreamError as exc:
                    result.problems.append(Problem(path.name, number, str(exc)))
                    continue
                seen[iid] = decision
                result.decisions.append(decision)
                result.assumed_uniform += "probability" not in line and "probabilities" not in line
        if "reward" in line:
            value = line["reward"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                result.problems.append(Problem(path.name, number, f"reward is {value!r}; expected a finite number"))
                continue
            decision = seen.get(iid)
            if decision is None:
                result.problems.append(Problem(path.name, number, f"feedback for interaction {iid!r} comes before (or without) it"))
                continue
            n = feedback_counts.get(iid, 0)
            feedback_counts[iid] = n + 1
            reward = {
                "event_id": iid,
                "reward_id": str(line.get("feedback_id") or f"{iid}/feedback-{n}"),
                "tenant": tenant,
                "workspace": workspace,
                "domain": domain,
                "timestamp": timestamp if timestamp is not None else decision["timestamp"] + 1 + n,
                "signals": {},
                "value": float(value),
            }
            try:
                validator.validate_reward(reward)
            except BanditstreamError as exc:
                result.problems.append(Problem(path.name, number, str(exc)))
                continue
            result.rewards.append(reward)
    result.problems.sort(key=lambda problem: problem.line)
    return result


def _line_actions(line: dict[str, Any], candidates: list[str]) -> tuple[list[str], list[dict[str, Any]]] | str:
    """The interaction's candidates: its own ``actions`` (ids with features) when it has them,
    else the log's candidates without features."""
    actions = line.get("actions")
    if actions is None:
        return candidates, [{"id": a, "features": {"numeric": {}, "categorical": {}, "vector": []}} for a in candidates]
    if not isinstance(actions, list) or not actions:
        return "actions must be a non-empty list of {id, features} objects"
    ids, records = [], []
    for i, action in enumerate(actions):
        if not isinstance(action, dict) or not isinstance(action.get("id"), str) or not action["id"]:
            return f"actions[{i}] needs an id (a non-empty string)"
        features = action.get("features", {})
        if not isinstance(features, dict):
            return f"actions[{i}].features must be an object of numbers, strings and booleans"
        numeric, categorical = {}, {}
        for name, value in features.items():
            if isinstance(value, bool):
                categorical[name] = "true" if value else "false"
            elif isinstance(value, str):
                categorical[name] = value
            elif isinstance(value, (int, float)) and math.isfinite(value):
                numeric[name] = float(value)
            else:
                return f"actions[{i}].features.{name} is {value!r}; expected a finite number, a string or a boolean"
        ids.append(action["id"])
        records.append({"id": action["id"], "features": {"numeric": numeric, "categorical": categorical, "vector": []}})
    if len(set(ids)) != len(ids):
        return "actions has duplicate ids"
    return ids, records


def _decision(line, iid, candidates, domain, tenant, workspace, timestamp) -> dict[str, Any] | str:
    agent = str(line["agent"])
    found = _line_actions(line, candidates)
    if isinstance(found, str):
        return found
    candidates, action_records = found
    if agent not in candidates:
        return f"agent {agent!r} is not among the candidates {candidates}"
    k = len(candidates)
    chosen = candidates.index(agent)
    logged = line.get("probability")
    given = line.get("probabilities")
    if given is not None:
        if not isinstance(given, list) or len(given) != k or not all(
            isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 <= p <= 1.0 for p in given
        ):
            return f"probabilities must be {k} numbers in [0, 1], one per candidate"
        if abs(math.fsum(given) - 1.0) > 1e-6 or given[chosen] <= 0.0:
            return "probabilities must sum to 1 and give the chosen candidate more than 0"
        probabilities = [float(p) for p in given]
    elif logged is None:
        probabilities = [1.0 / k] * k
    else:
        if isinstance(logged, bool) or not isinstance(logged, (int, float)) or not 0.0 < logged <= 1.0:
            return f"probability is {logged!r}; expected a number in (0, 1]"
        rest = (1.0 - logged) / (k - 1) if k > 1 else 0.0
        probabilities = [rest] * k
        probabilities[chosen] = float(logged)
    numeric: dict[str, float] = {}
    categorical: dict[str, str] = {}
    vector: list[float] = []
    if isinstance(line.get("context"), dict):
        for name, value in line["context"].items():  # as the SDK reads a context
            if isinstance(value, bool):  # as the SDK and serve encode a boolean
                categorical[name] = "true" if value else "false"
            elif isinstance(value, str):
                categorical[name] = value
            elif isinstance(value, (int, float)):
                numeric[name] = float(value)
            elif isinstance(value, list):  # the dense vector (an embedding): one per context
                if vector:
                    return f"context.{name} is a second list; a context has one dense vector"
                if not value or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value):
                    return f"context.{name} must be a non-empty list of finite numbers (the dense vector)"
                vector = [float(x) for x in value]
            elif value is not None:
                return f"context.{name} is {type(value).__name__}; expected a number, a string, a boolean or a list of numbers"
    question = line.get("question")
    if isinstance(question, str):
        numeric["question_words"] = float(len(question.split()))
    for name in ("top_k", "num_sources"):
        value = line.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"{name} is {value!r}; expected a number"
            numeric[name] = float(value)
    if line.get("category") is not None:
        categorical["category"] = str(line["category"])
    return {
        "event_id": iid,
        "tenant": tenant,
        "workspace": workspace,
        "domain": domain,
        "timestamp": timestamp if timestamp is not None else 0,
        "context": {"numeric": numeric, "categorical": categorical, "vector": vector},
        "actions": action_records,
        "chosen": chosen,
        "probabilities": probabilities,
        "policy_version": str(line.get("policy_version", "replay")),
        "mode": "live",
        "deferred": False,
        "recommended": -1,
    }


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if text.strip():
                yield number, text


def _timestamp(value: Any, default: int | None) -> int | None:
    """Epoch milliseconds from seconds, milliseconds or ISO 8601."""
    if value is None:
        return default
    if isinstance(value, bool):
        raise ValueError(f"timestamp is {value!r}")
    if isinstance(value, (int, float)):
        return int(value * 1000) if value < 10**11 else int(value)
    if isinstance(value, str):
        try:
            return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            raise ValueError(f"timestamp {value!r} is neither epoch time nor ISO 8601") from None
    raise ValueError(f"timestamp is {value!r}")


# -- Avro ---------------------------------------------------------------------------------


def _read_avro(path: Path, validator: Validator) -> ReplayResult:
    result = ReplayResult()
    try:
        with open(path, "rb") as f:
            name = fastavro.reader(f).writer_schema.get("name", "")
        kind = {"DecisionEvent": "decision", "RewardEvent": "reward"}.get(name.rsplit(".", 1)[-1])
        if kind is None:
            raise ReplayError("schema", name, "an Avro replay file must hold DecisionEvents or RewardEvents")
        with open(path, "rb") as f:
            reader = fastavro.reader(f, reader_schema=schemas.parsed(kind))  # older versions read as current
            for number, record in enumerate(reader, start=1):
                result.lines += 1
                record = _millis(record)
                try:
                    if kind == "decision":
                        validator.validate_decision(record)
                        result.decisions.append(record)
                    else:
                        validator.validate_reward(record)
                        result.rewards.append(record)
                except BanditstreamError as exc:
                    result.problems.append(Problem(path.name, number, str(exc)))
    except (ValueError, EOFError) as exc:
        if isinstance(exc, ReplayError):
            raise
        result.problems.append(Problem(path.name, result.lines + 1, f"unreadable Avro: {exc}"))
    return result


def _millis(record: dict[str, Any]) -> dict[str, Any]:
    ts = record.get("timestamp")
    if isinstance(ts, datetime):
        record["timestamp"] = int(ts.timestamp() * 1000)
    return record


def joined_events(path: str | Path, domain: str, settings: DomainSettings, *, tenant: str = "default",
                  workspace: str = "main", actions: Sequence[str] | None = None,
                  encoder: FeatureEncoder | None = None) -> list[dict[str, Any]]:
    """The log's decisions of ``domain`` joined here, in time order, as UpdateEvent-like rows:
    each with the aggregate of its rewards (the domain's reward engine; none: the default
    reward) and its context features encoded as the join encodes them, a normalising domain's
    z-scored with the statistics of the decisions before it (observed into ``encoder``, a fresh
    one if None: as one partition would)."""
    result = read_log(path, domain=domain, actions=actions, tenant=tenant, workspace=workspace)
    engine = settings.reward_engine()
    encoder = encoder or FeatureEncoder(settings.features)
    rewards: dict[str, list[dict]] = {}
    for reward in result.rewards:
        rewards.setdefault(reward["event_id"], []).append(reward)
    out = []
    for d in sorted(result.decisions, key=lambda d: d["timestamp"]):
        if d["domain"] != domain:
            continue
        got = rewards.get(d["event_id"], [])
        value = float(engine.aggregate(got)[0]) if got else float(engine.default_reward)
        context = d.get("context") or {}
        candidate_features: list[list[float]] = []
        if settings.features.shared:  # a shared model's rows: the acted candidate's, and every candidate's
            features = encoder.acted_matrix([d])[0].tolist()
            candidate_features = encoder.action_matrix(context, d["actions"]).tolist()
        else:
            features = encoder.context_vector(context).tolist()
        if settings.features.normalize:  # after encoding, so a value never normalises itself
            encoder.observe(d.get("context") or {}, d["actions"])
        out.append({
            "event_id": d["event_id"], "tenant": d["tenant"], "workspace": d["workspace"], "domain": domain,
            "actions": [a["id"] for a in d["actions"]], "probabilities": list(d["probabilities"]),
            "arm_index": d["chosen"], "reward": value, "features": features,
            "decision_time": int(d["timestamp"]), "policy_version": d.get("policy_version", ""),
            "mode": d.get("mode") or "live", "join_status": "rewarded" if got else "default",
            "feature_hash": settings.features.config_hash(),
            "recommended_probabilities": list(d.get("recommended_probabilities") or ()),
            "recommended_version": d.get("recommended_version", ""), "candidate_features": candidate_features,
        })  # fmt: skip
    return out
