"""Personalizer's offline evaluations, as ``banditstream serve`` runs them: on the domain's
joined log (the updates topic) over ``[startTime, endTime)`` of decision time, with
banditstream's evaluation engine (:func:`banditstream.evaluate.evaluate_candidates`).

An evaluation runs when it is created (synchronously: the create call answers once it is
done) and rates, each with self-normalised IPS (SNIPS) and a 95% Gaussian (delta-method)
interval, on the same rows:

* ``online`` (policySource Online): the logged decisions themselves, whatever snapshot made
  them (the logging distribution: its value is the mean logged reward);
* ``baseline`` (Baseline): always the first candidate of the decision, what a domain does
  without a snapshot (Personalizer's baseline: the first action of the rank request);
* ``random`` (Random): uniform over each decision's candidates;
* every policy of the request (Custom): a banditstream policy and its hyper-parameters,
  trained progressively on the window in time order, in batches of 200 (each batch scored by
  the model of the rows before it), as ``banditstream evaluate``'s ``POLICY(param=v)``
  candidates are, with seed ``--seed`` (default 0).

What is kept per policy: the estimate (:class:`~learner.evaluation.intervals.Estimate`) and,
from the estimator's per-row terms (the importance weight ``w = pi(a|x) / p(a|x)`` of the
logged action and ``w * r``), their sums per 5-minute bucket of decision time: rows ``n``,
``sum w``, ``sum w r``, ``sum w^2``, ``sum (w r)^2``, ``sum w^2 r`` and the rows with
``w > 0``. Those give v1.0's summaries (``ipsEstimatorNumerator = sum w r``,
``ipsEstimatorDenominator = n``, ``snipsEstimatorDenominator = sum w``, ``nonZeroProbability``,
``sumOfSquares = sum (w r)^2``, ``confidenceInterval``: the half-width of the 95% interval) and
the preview's time series (SNIPS and its interval per aggregation interval, expanding or
rolling), exactly the delta-method interval of the rows they cover.

Evaluations are kept in memory per domain and written to
``<stores.state_dir>/serve/<tenant>/<workspace>/<domain>.evaluations/``, one JSON file each,
read back at start (like the domain's saved configuration, per process).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from banditstream.serve_api import PREVIEW, V1, ApiError, EvaluationContract, bad, format_duration, iso_time, iso_time_ms
from learner.evaluation import Candidate, Logging, LoggedBandit, Progressive, Uniform

log = logging.getLogger(__name__)

LEVEL = 0.95
ESTIMATOR = "snips"
#: progressive candidates learn in batches of this many rows (``banditstream evaluate``'s default)
BATCH_SIZE = 200
BUCKET_MS = 5 * 60_000
#: the preview's aggregation intervals, in minutes
INTERVALS = (5, 60, 360, 720, 1440)
#: v1.0 summaries: the smallest interval giving at most this many buckets over the evaluation
_V1_MAX_BUCKETS = 288
_Z = NormalDist().inv_cdf(0.5 + LEVEL / 2.0)
# bucket statistics, in order
_N, _SW, _SC, _SWW, _SCC, _SCW, _NZ = range(7)

#: status names per API version
STATUS = {V1: {"succeeded": "completed", "failed": "failed"}, PREVIEW: {"succeeded": "Succeeded", "failed": "Failed"}}


class FirstAction(Candidate):
    """The baseline: always the decision's first candidate (``first``: event id -> action id)."""

    name = "baseline"

    def __init__(self, first: Mapping[str, str]):
        self.first = first

    def action_dist(self, log: LoggedBandit, progress=None) -> np.ndarray:
        index = {action: k for k, action in enumerate(log.actions)}
        dist = np.zeros((len(log), log.n_actions))
        dist[np.arange(len(log)), [index[self.first[e]] for e in log.event_id]] = 1.0
        return dist


class _Recorded(Candidate):
    """A candidate whose distribution is kept once the engine has asked for it."""

    def __init__(self, inner: Candidate):
        self.inner = inner
        self.dist: np.ndarray | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    def rows(self, log: LoggedBandit):
        return self.inner.rows(log)

    def action_dist(self, log: LoggedBandit, progress=None) -> np.ndarray:
        self.dist = self.inner.action_dist(log, progress)
        return self.dist


@dataclass
class PolicyOutcome:
    name: str
    arguments: str
    #: Online, Baseline, Random or Custom (the preview's policySource)
    source: str
    #: the engine's Estimate (``Estimate.to_dict()``)
    estimate: dict[str, Any]
    #: over every row: n, ips_numerator, snips_denominator, non_zero, sum_of_squares
    totals: dict[str, float]
    #: 5-minute bucket start (epoch ms) -> [n, sum w, sum w r, sum w^2, sum (w r)^2, sum w^2 r, rows with w > 0]
    buckets: dict[int, list[float]]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PolicyOutcome":
        return cls(data["name"], data["arguments"], data["source"], dict(data["estimate"]), dict(data["totals"]),
                   {int(k): list(v) for k, v in data["buckets"].items()})  # fmt: skip


@dataclass
class StoredEvaluation:
    id: str
    name: str
    since_ms: int
    until_ms: int
    created_s: float
    #: succeeded or failed
    status: str
    description: str
    rows: int = 0
    policies: list[PolicyOutcome] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for policy in data["policies"]:
            policy["buckets"] = {str(k): v for k, v in policy["buckets"].items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StoredEvaluation":
        fields = {k: v for k, v in data.items() if k != "policies"}
        return cls(**fields, policies=[PolicyOutcome.from_json(p) for p in data.get("policies", [])])


# -- running --------------------------------------------------------------------------------


def run_evaluation(evaluation_id: str, contract: EvaluationContract, updates: list[Mapping[str, Any]],
                   scope: tuple[str, str, str], *, now: float | None = None) -> StoredEvaluation:  # fmt: skip
    """Rate the online, baseline, random and requested policies on ``updates`` (the domain's
    updates of the contract's decision-time range). Raises :class:`ApiError`
    (NoLogsExistInDateRange) when the range holds no live decision; a failure of the engine
    gives a ``failed`` evaluation saying why."""
    from banditstream.evaluate import evaluate_candidates

    tenant, workspace, domain = scope
    created = time.time() if now is None else now
    stored = StoredEvaluation(evaluation_id, contract.name, contract.since_ms, contract.until_ms, created, "failed", "")
    try:
        logged = LoggedBandit.from_updates(updates, domain=domain, tenant=tenant, workspace=workspace)
    except ValueError as exc:
        stored.description = f"the log of {tenant}/{workspace}/{domain} cannot be evaluated: {exc}"
        return stored
    if len(logged) == 0:
        raise bad("startTime", f"no live decision of {tenant}/{workspace}/{domain} was logged between "
                  f"{iso_time_ms(contract.since_ms)} and {iso_time_ms(contract.until_ms)}", "NoLogsExistInDateRange")  # fmt: skip
    first = {u["event_id"]: u["actions"][0] for u in updates if u.get("actions")}
    entries: list[tuple[str, str, str, Candidate]] = [
        ("online", "", "Online", Logging()), ("baseline", "", "Baseline", FirstAction(first)), ("random", "", "Random", Uniform()),
    ]  # fmt: skip
    for p in contract.policies:
        entries.append((p.name, p.arguments, "Custom", Progressive(p.name, dict(p.params), batch_size=BATCH_SIZE, seed=p.seed)))
    recorded = [_Recorded(candidate) for *_, candidate in entries]
    try:
        run = evaluate_candidates(logged, recorded, estimators=(ESTIMATOR,), method="gaussian", level=LEVEL, seed=0)
    except Exception as exc:  # noqa: BLE001 - the evaluation fails, the service goes on
        log.exception("evaluation %s of %s/%s/%s failed", evaluation_id, tenant, workspace, domain)
        stored.description = f"the evaluation engine failed: {type(exc).__name__}: {exc}"
        return stored
    n = len(logged)
    buckets = (logged.decision_time // BUCKET_MS) * BUCKET_MS  # sorted: the log is in decision-time order
    starts, first_rows = np.unique(buckets, return_index=True)
    for (name, arguments, source, _), candidate, result in zip(entries, recorded, run.results):
        w = candidate.dist[np.arange(n), logged.action] / logged.pscore
        c = w * logged.reward
        totals = {"n": n, "ips_numerator": float(c.sum()), "snips_denominator": float(w.sum()),
                  "non_zero": int(np.count_nonzero(w)), "sum_of_squares": float((c * c).sum())}  # fmt: skip
        stats = np.stack([np.ones(n), w, c, w * w, c * c, c * w, (w != 0).astype(float)], axis=1)
        sums = np.add.reduceat(stats, first_rows, axis=0)
        stored.policies.append(PolicyOutcome(
            name, arguments, source, result.estimates[ESTIMATOR].to_dict(), totals,
            {int(start): [float(x) for x in row] for start, row in zip(starts, sums)},
        ))  # fmt: skip
    stored.status, stored.rows = "succeeded", n
    stored.description = (f"SNIPS estimates with {LEVEL:.0%} Gaussian intervals on {n} logged decisions of "
                          f"{tenant}/{workspace}/{domain}; custom policies trained progressively on them")  # fmt: skip
    if contract.optimize:
        stored.description += "; policy optimization was asked for and is not done here"
    return stored


# -- keeping --------------------------------------------------------------------------------


class EvaluationStore:
    """One domain's evaluations, in memory and one JSON file each in ``directory``. The
    class attributes name what is kept (feature importances are kept the same way)."""

    item_type: Any = StoredEvaluation
    noun = "evaluation"
    id_field = "evaluationId"
    not_found_code = "EvaluationNotFound"
    exists_code = "EvaluationAlreadyExists"

    def __init__(self, directory: Path):
        self.directory = directory
        self._items: dict[str, StoredEvaluation] = {}
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.json")):
            try:
                item = self.item_type.from_json(json.loads(path.read_text(encoding="utf-8")))
            except Exception as exc:  # noqa: BLE001 - one unreadable file must not stop the service
                log.warning("ignoring unreadable %s %s: %s", self.noun, path, exc)
                continue
            self._items[item.id] = item

    def _path(self, evaluation_id: str) -> Path:
        return self.directory / f"{hashlib.sha256(evaluation_id.encode()).hexdigest()[:40]}.json"

    def get(self, evaluation_id: str) -> Any:
        item = self._items.get(evaluation_id)
        if item is None:
            raise ApiError(f"{self.id_field}: no {self.noun} {evaluation_id!r} here", "not_found", code=self.not_found_code,
                           field=self.id_field)  # fmt: skip
        return item

    def list(self) -> list[Any]:
        """Newest first."""
        with self._lock:
            items = list(self._items.values())
        return sorted(items, key=lambda e: (-e.created_s, e.id))

    def reserve(self, evaluation_id: str) -> None:
        """Claim an id for an evaluation about to run (409 when it is taken)."""
        with self._lock:
            if evaluation_id in self._items or evaluation_id in self._running:
                raise ApiError(f"{self.id_field}: the {self.noun} {evaluation_id!r} exists already", "conflict",
                               code=self.exists_code, field=self.id_field)  # fmt: skip
            self._running.add(evaluation_id)

    def release(self, evaluation_id: str) -> None:
        with self._lock:
            self._running.discard(evaluation_id)

    def add(self, item: Any) -> None:
        with self._lock:
            self._write(item)
            self._items[item.id] = item
            self._running.discard(item.id)

    def _write(self, item: Any) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(item.id)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(item.to_json(), separators=(",", ":")) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def delete(self, evaluation_id: str) -> None:
        self.get(evaluation_id)
        with self._lock:  # (with the file: a job finishing meanwhile, :meth:`add`, cannot bring it back)
            self._items.pop(evaluation_id, None)
            self._path(evaluation_id).unlink(missing_ok=True)


# -- answering ------------------------------------------------------------------------------


def snips_from_sums(sums: list[float]) -> tuple[float, tuple[float, float] | None]:
    """SNIPS and its Gaussian (delta-method) interval from a bucket's sums: the estimate's
    :meth:`~learner.evaluation.estimators.Terms.influence` summed in closed form; None with
    fewer than 2 rows."""
    n, sw, sc, sww, scc, scw = sums[_N], sums[_SW], sums[_SC], sums[_SWW], sums[_SCC], sums[_SCW]
    value = (sc / n) / (sw / n) if sw != 0.0 else 0.0
    if n < 2:
        return value, None
    half = 0.0
    if sw != 0.0:
        mean_w = sw / n
        squares = max(scc - 2.0 * value * scw + value * value * sww, 0.0) / (mean_w * mean_w)
        half = _Z * math.sqrt(squares / (n * (n - 1)))
    return value, (value - half, value + half)


def _merged(buckets: list[list[float]]) -> list[float]:
    return [float(x) for x in np.sum(np.asarray(buckets, dtype=float), axis=0)]


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def _grouped(policy: PolicyOutcome, since_ms: int, until_ms: int, interval_ms: int) -> list[tuple[int, list[float]]]:
    """The policy's 5-minute buckets that overlap ``[since_ms, until_ms)``, merged per interval
    (aligned on UTC multiples of it), non-empty intervals only, oldest first."""
    since_ms = since_ms // BUCKET_MS * BUCKET_MS
    groups: dict[int, list[list[float]]] = {}
    for start, sums in policy.buckets.items():
        if since_ms <= start < until_ms:
            groups.setdefault(start // interval_ms * interval_ms, []).append(sums)
    return [(start, _merged(groups[start])) for start in sorted(groups)]


def v1_interval_minutes(since_ms: int, until_ms: int) -> int:
    span = until_ms - since_ms
    return next((m for m in INTERVALS if math.ceil(span / (m * 60_000)) <= _V1_MAX_BUCKETS), INTERVALS[-1])


def _v1_summary(time_ms: int, window: str, totals: Mapping[str, float], half: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "timeStamp": iso_time_ms(time_ms), "ipsEstimatorNumerator": totals["ips_numerator"],
        "ipsEstimatorDenominator": totals["n"], "snipsEstimatorDenominator": totals["snips_denominator"],
        "aggregateTimeWindow": window, "nonZeroProbability": totals["non_zero"], "sumOfSquares": totals["sum_of_squares"],
    }  # fmt: skip
    if half is not None and math.isfinite(half):
        out["confidenceInterval"] = half
    return out


def v1_body(item: StoredEvaluation) -> dict[str, Any]:
    """An Evaluation (v1.0): per policy the summaries of its buckets and the total one."""
    body: dict[str, Any] = {"id": item.id, "name": item.name, "startTime": iso_time_ms(item.since_ms),
                            "endTime": iso_time_ms(item.until_ms), "status": STATUS[V1][item.status]}  # fmt: skip
    minutes = v1_interval_minutes(item.since_ms, item.until_ms)
    window = format_duration(minutes * 60)
    results = []
    for policy in item.policies:
        summary = []
        for start, sums in _grouped(policy, item.since_ms, item.until_ms, minutes * 60_000):
            _, interval = snips_from_sums(sums)
            totals = {"n": int(sums[_N]), "ips_numerator": sums[_SC], "snips_denominator": sums[_SW],
                      "non_zero": int(sums[_NZ]), "sum_of_squares": sums[_SCC]}  # fmt: skip
            summary.append(_v1_summary(start, window, totals, None if interval is None else (interval[1] - interval[0]) / 2))
        e = policy.estimate
        half = (e["upper"] - e["lower"]) / 2 if _finite(e["lower"], e["upper"]) else None
        total = _v1_summary(item.until_ms, format_duration((item.until_ms - item.since_ms) / 1000), policy.totals, half)
        results.append({"name": policy.name, "arguments": policy.arguments, "summary": summary, "totalSummary": total})
    body["policyResults"] = results
    return body


def preview_details(item: StoredEvaluation) -> dict[str, Any]:
    """An EvaluationDetails (the preview's list entries)."""
    return {"id": item.id, "name": item.name, "startTime": iso_time_ms(item.since_ms), "endTime": iso_time_ms(item.until_ms),
            "creationTime": iso_time(item.created_s), "status": STATUS[PREVIEW][item.status], "evaluationType": "Manual"}  # fmt: skip


def preview_body(item: StoredEvaluation, since_ms: int | None = None, until_ms: int | None = None,
                 interval_minutes: int = 5, window: str = "Expanding") -> dict[str, Any]:  # fmt: skip
    """An Evaluation (preview): per policy its summary (the engine's estimate and interval)
    and its time series over ``[since_ms, until_ms)`` (within the evaluation's range), per
    ``interval_minutes``: ``Expanding`` from the range's start to each interval's end,
    ``Rolling`` each interval alone; intervals without rows are left out."""
    body = preview_details(item)
    if item.description:
        body["description"] = item.description
    if item.status != "succeeded":
        return body
    interval_ms = interval_minutes * 60_000
    lo = max(item.since_ms, since_ms if since_ms is not None else item.since_ms)
    hi = min(item.until_ms, until_ms if until_ms is not None else item.until_ms)
    values = []
    for policy in item.policies:
        e = policy.estimate
        summary: dict[str, Any] = {"expectedReward": e["estimate"]}
        if _finite(e["lower"], e["upper"]):
            summary["confidenceInterval"] = [e["lower"], e["upper"]]
        data = []
        running: list[float] | None = None
        for start, sums in _grouped(policy, lo, hi, interval_ms):
            if window == "Expanding":
                running = sums if running is None else [a + b for a, b in zip(running, sums)]
                sums = running
            value, interval = snips_from_sums(sums)
            point: dict[str, Any] = {"timeStamp": iso_time_ms(start), "expectedReward": value}
            if interval is not None and _finite(*interval):
                point["confidenceInterval"] = list(interval)
            data.append(point)
        values.append({"name": policy.name, "arguments": policy.arguments, "policySource": policy.source,
                       "summary": summary, "timeseries": {"data": data}})  # fmt: skip
    body["content"] = {"startTime": iso_time_ms(lo), "endTime": iso_time_ms(hi), "intervalInMinutes": interval_minutes,
                       "value": values}  # fmt: skip
    return body


def best_custom(item: StoredEvaluation, policy_name: str) -> PolicyOutcome:
    """The evaluated policy ``policy_name`` names (the best by its estimate among several of
    that name), for configurations/applyFromEvaluation."""
    if item.status != "succeeded":
        raise bad("evaluationId", f"evaluation {item.id!r} has status {STATUS[PREVIEW][item.status]}; "
                  "only a succeeded one can be applied", "InvalidContract")  # fmt: skip
    matches = [p for p in item.policies if p.name == policy_name]
    if not matches:
        names = ", ".join(sorted({p.name for p in item.policies}))
        raise ApiError(f"policyName: evaluation {item.id!r} has no policy {policy_name!r}; it has {names}", "not_found",
                       code="LearningSettingsNotFound", field="policyName")  # fmt: skip
    return max(matches, key=lambda p: p.estimate["estimate"])
