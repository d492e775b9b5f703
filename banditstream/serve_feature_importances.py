"""Personalizer's feature importances, as ``banditstream serve`` computes them: how much the
domain's reward model relies on each context feature, over the decisions of
``[startTime, endTime)``, with the evaluation engine's reward model and
:func:`learner.evaluation.permutation_importance`.

A feature importance is a job, as in the hosted service: the create call (PUT) stores it
``Running`` and answers 200 at once; the job then runs on the service's one job thread and
the record becomes ``Succeeded`` (with ``featureScores``) or ``Failed`` (``description`` says
why). Gets poll it.

The steps of the job:

1. **Rows.** The domain's joined log (the updates topic: reward, logged action, live
   decisions only, as evaluations read it) over the range, each row joined by event id to its
   DecisionEvent on the decisions topic, which holds the context by name (the updates hold
   only the hashed vector, where features share slots and lose their names).
2. **Features**, named as the encoder names them (``user.age``, the dotted path of the
   Personalizer JSON) and grouped as Personalizer groups them: ``namespace`` is the name up to
   its first dot (the top-level key of a ``contextFeatures`` object; ``""`` for a top-level
   value), ``featureName`` the rest. A numeric feature is one column, z-scored (absent: 0, the
   mean); a categorical one an indicator per value, its :data:`MAX_VALUES` most frequent
   values (the rest: no indicator). Each feature is its own column block, never hashed, so no
   feature can take credit for another it collides with.
3. **Importance.** :func:`~learner.evaluation.permutation_importance`: a per-action ridge
   reward model ``q(x, a)`` cross-fitted over 5 seeded folds, and per feature the rise of its
   held-out squared error ``(r - q(x, a))^2`` when the feature's columns are shuffled across
   the held-out rows (5 seeded shuffles, seed 0: the same log gives the same scores).
4. **Scores.** ``score = max(rise, 0) / max(rise)``: 1 for the feature the model relies on
   most, 0 for one it does not use; sorted descending (the API's "normalized feature scores
   sorted in descending order").

Why this measure: the policies banditstream learns are linear reward models of the context,
per action, so "what the model relies on" is what the reward model of the same family
learns from the log. Permutation importance scores a feature by what losing it costs the
model's predictions on rows it did not train on, so it is scale-free (unlike raw weights),
sees a categorical feature's values together, and gives a feature that only fits noise a
rise near 0. A feature that raises every action's reward alike counts too, though it changes
no choice.

Records are kept like evaluations: in memory per domain and one JSON file each in
``<stores.state_dir>/serve/<tenant>/<workspace>/<domain>.featureImportances/``, read back at
start; one that was still ``Running`` when the process stopped reads back ``Failed``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from banditstream.serve_api import FeatureImportanceContract, iso_time, iso_time_ms
from banditstream.serve_evaluations import EvaluationStore
from learner.evaluation import permutation_importance

log = logging.getLogger(__name__)

#: a categorical feature's most frequent values that get an indicator column each
MAX_VALUES = 32
#: at most this many columns in all (the ridge solves a d x d system per action and fold)
MAX_COLUMNS = 2048
#: at most this many cells (rows x columns) in the design matrix: more rows are sampled
MAX_CELLS = 20_000_000
#: fewer joined rows than this: the job fails (5 folds need a few rows each)
MIN_ROWS = 20
N_FOLDS = 5
REPEATS = 5
SEED = 0

#: status names of the preview's FeatureImportanceStatus
STATUS = {"running": "Running", "succeeded": "Succeeded", "failed": "Failed"}


@dataclass
class StoredFeatureImportance:
    id: str
    name: str
    since_ms: int
    until_ms: int
    created_s: float
    #: running, succeeded or failed
    status: str = "running"
    description: str = ""
    rows: int = 0
    #: sorted by score, descending: namespace, featureName, score, and the raw rise and its standard error
    scores: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StoredFeatureImportance":
        return cls(**{k: v for k, v in data.items() if k != "scores"}, scores=[dict(s) for s in data.get("scores", [])])


# -- running --------------------------------------------------------------------------------


def started(feature_importance_id: str, contract: FeatureImportanceContract, *, now: float | None = None) -> StoredFeatureImportance:
    """The record of a job just submitted: Running."""
    created = time.time() if now is None else now
    return StoredFeatureImportance(feature_importance_id, contract.name, contract.since_ms, contract.until_ms, created)


def run_feature_importance(item: StoredFeatureImportance, updates: list[Mapping[str, Any]], decisions: list[Mapping[str, Any]],
                           scope: tuple[str, str, str]) -> StoredFeatureImportance:  # fmt: skip
    """The finished record: ``item`` rated on ``updates`` (the domain's, of its decision-time
    range) and ``decisions`` (DecisionEvents of the same range); Failed, saying why, when the
    rows cannot be rated."""
    tenant, workspace, domain = scope
    where = f"{tenant}/{workspace}/{domain}"
    contexts = {d["event_id"]: d.get("context") or {} for d in decisions
                if (d["tenant"], d["workspace"], d["domain"]) == scope}  # fmt: skip
    rows, missing = _rows(updates, scope, contexts)
    span = f"between {iso_time_ms(item.since_ms)} and {iso_time_ms(item.until_ms)}"
    if not rows:
        return failed(item, f"no live decision of {where} was logged {span}" + (
            f" with its DecisionEvent still on the decisions topic ({missing} have none)" if missing else ""))
    if len(rows) < MIN_ROWS:
        return failed(item, f"{len(rows)} logged decisions of {where} {span}; at least {MIN_ROWS} are needed")
    layout = feature_layout([contexts[u["event_id"]] for u in rows])
    width = sum(block.width for block in layout)
    if not layout:
        return failed(item, f"the {len(rows)} logged decisions of {where} {span} carry no context features")
    if width > MAX_COLUMNS:
        return failed(item, f"the context features of {where} need {width} columns (one per numeric feature, up to "
                            f"{MAX_VALUES} per categorical one); at most {MAX_COLUMNS} are rated")  # fmt: skip
    logged = len(rows)
    if logged * width > MAX_CELLS:  # a seeded sample, in time order, bounds the design matrix's memory
        keep = np.sort(np.random.default_rng(SEED).choice(logged, MAX_CELLS // width, replace=False))
        rows = [rows[i] for i in keep]
    X, blocks = feature_columns([contexts[u["event_id"]] for u in rows], layout)
    names = [split_name(block.name) for block in layout]
    actions = sorted({a for u in rows for a in u["actions"]})
    index = {a: k for k, a in enumerate(actions)}
    action = np.array([index[u["arm"]] for u in rows], dtype=np.intp)
    reward = np.array([u["reward"] for u in rows], dtype=float)
    try:
        result = permutation_importance(X, blocks, action, reward, n_actions=len(actions), n_folds=N_FOLDS, repeats=REPEATS,
                                        random_state=SEED)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the job fails, the service goes on
        log.exception("feature importance %s of %s failed", item.id, where)
        return failed(item, f"the importance could not be computed: {type(exc).__name__}: {exc}")
    scored = [{"namespace": ns, "featureName": name, "score": float(score), "rise": float(rise), "stderr": float(se)}
              for (ns, name), score, rise, se in zip(names, result.scores(), result.drop, result.stderr)]  # fmt: skip
    scored.sort(key=lambda s: (-s["score"], -s["rise"], s["namespace"], s["featureName"]))
    description = (
        f"permutation importance on {len(rows)} logged decisions of {where}: a per-action ridge reward model cross-fitted "
        f"over {N_FOLDS} folds has a held-out squared error of {result.loss:.4g}; a feature's score is the rise of that "
        f"error when the feature is shuffled (mean of {REPEATS} shuffles) over the largest rise "
        f"({max(float(result.drop.max(initial=0.0)), 0.0):.4g})"
    )  # fmt: skip
    if len(rows) < logged:
        description += f"; a seeded sample of {len(rows)} of the {logged} decisions is rated (at most {MAX_CELLS:,} cells)"
    if missing:
        description += f"; {missing} logged decisions without a DecisionEvent on the decisions topic are left out"
    return StoredFeatureImportance(**{**asdict(item), "status": "succeeded", "description": description, "rows": len(rows),
                                      "scores": scored})  # fmt: skip


def failed(item: StoredFeatureImportance, reason: str) -> StoredFeatureImportance:
    return StoredFeatureImportance(**{**asdict(item), "status": "failed", "scores": [], "description": reason})


def _rows(updates: list[Mapping[str, Any]], scope: tuple[str, str, str], contexts: Mapping[str, Any]):
    """The live, acted-on updates of ``scope`` that have a context, once per event id, in
    decision-time order; and how many had none."""
    seen: dict[str, Mapping[str, Any]] = {}
    missing: set[str] = set()
    for u in updates:
        if (u["tenant"], u["workspace"], u["domain"]) != scope or u.get("mode", "live") != "live":
            continue
        if u.get("join_status") == "not_activated":  # never acted on: no outcome
            continue
        if u["event_id"] not in contexts:
            missing.add(u["event_id"])
        else:
            seen.setdefault(u["event_id"], u)  # at-least-once delivery: the first copy
    return sorted(seen.values(), key=lambda u: (u["decision_time"], u["event_id"])), len(missing)


def split_name(name: str) -> tuple[str, str]:
    """(namespace, featureName) of a flattened feature name: ``user.age`` -> (user, age);
    ``timeOfDay`` -> ("", timeOfDay)."""
    namespace, dot, rest = name.partition(".")
    return (namespace, rest) if dot and namespace and rest else ("", name)


@dataclass(frozen=True)
class FeatureBlock:
    """One feature's columns: a z-scored one when it is numeric in some row, then an
    indicator per kept categorical value."""

    name: str
    numeric: bool
    values: tuple[str, ...]

    @property
    def width(self) -> int:
        return int(self.numeric) + len(self.values)


def feature_layout(contexts: list[Mapping[str, Any]]) -> list[FeatureBlock]:
    """The contexts' features, sorted by name; a categorical feature keeps its
    :data:`MAX_VALUES` most frequent values (ties by value)."""
    numeric: set[str] = set()
    values: dict[str, Counter] = {}
    for context in contexts:
        numeric.update(context.get("numeric") or {})
        for name, value in (context.get("categorical") or {}).items():
            values.setdefault(name, Counter())[value] += 1
    layout = []
    for name in sorted(numeric | set(values)):
        counts = values.get(name, Counter())
        kept = tuple(v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_VALUES])
        layout.append(FeatureBlock(name, name in numeric, kept))
    return layout


def feature_columns(contexts: list[Mapping[str, Any]], layout: list[FeatureBlock]) -> tuple[np.ndarray, list[slice]]:
    """The design matrix (n, sum of widths) of ``contexts`` in ``layout``, and each feature's
    slice of its columns. Numeric: z-scored over the rows that carry it (absent: 0, the mean;
    no spread: 0); categorical: 1 in the column of the row's value, if kept."""
    n = len(contexts)
    X = np.zeros((n, sum(block.width for block in layout)))
    blocks: list[slice] = []
    start = 0
    for block in layout:
        column = start
        if block.numeric:
            rows = [i for i, c in enumerate(contexts) if block.name in (c.get("numeric") or {})]
            xs = np.array([float(contexts[i]["numeric"][block.name]) for i in rows])
            spread = xs.std()
            if spread > 0:
                X[rows, column] = (xs - xs.mean()) / spread
            column += 1
        if block.values:
            position = {v: j for j, v in enumerate(block.values)}
            for i, context in enumerate(contexts):
                j = position.get((context.get("categorical") or {}).get(block.name))
                if j is not None:
                    X[i, column + j] = 1.0
        blocks.append(slice(start, start + block.width))
        start += block.width
    return X, blocks


# -- keeping --------------------------------------------------------------------------------


class FeatureImportanceStore(EvaluationStore):
    """One domain's feature importances, in memory and one JSON file each in ``directory``.
    A record is stored Running when its job is submitted (:meth:`start`) and replaced when it
    ends (:meth:`finish`); one deleted meanwhile stays deleted."""

    item_type = StoredFeatureImportance
    noun = "feature importance"
    id_field = "featureImportanceId"
    not_found_code = "FeatureImportanceNotFound"
    exists_code = "FeatureImportanceAlreadyExists"

    def _load(self) -> None:
        super()._load()
        for item_id, item in list(self._items.items()):
            if item.status == "running":  # the process stopped while it ran: it never will finish
                self._items[item_id] = failed(item, "the service stopped before the job finished; create it again")

    def start(self, item: StoredFeatureImportance) -> None:
        """Store a submitted job's Running record (409 when its id is taken)."""
        self.reserve(item.id)
        self.add(item)

    def finish(self, running: StoredFeatureImportance, done: StoredFeatureImportance) -> None:
        """Store a job's outcome in place of its Running record, unless that was deleted while
        the job ran (its id may name a newer job by now)."""
        with self._lock:
            if self._items.get(running.id) is running:
                self._write(done)
                self._items[done.id] = done


# -- answering ------------------------------------------------------------------------------


def details(item: StoredFeatureImportance) -> dict[str, Any]:
    """A FeatureImportanceDetails (the list's entries)."""
    return {"id": item.id, "name": item.name, "startTime": iso_time_ms(item.since_ms), "endTime": iso_time_ms(item.until_ms),
            "creationTime": iso_time(item.created_s), "status": STATUS[item.status]}  # fmt: skip


def body(item: StoredFeatureImportance) -> dict[str, Any]:
    """A FeatureImportance: the details, the description and, once succeeded, the scores."""
    out = details(item)
    if item.description:
        out["description"] = item.description
    if item.status == "succeeded":
        out["featureScores"] = [{"namespace": s["namespace"], "featureName": s["featureName"], "score": s["score"]}
                                for s in item.scores]  # fmt: skip
    return out

