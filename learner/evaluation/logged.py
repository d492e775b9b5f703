"""The joined log as arrays: what off-policy estimators and counterfactual candidates read.

The join writes one UpdateEvent per decision: the context features exactly as the learner
folds them, the candidates, the full distribution the logging policy drew from, the chosen
index, its reward, the snapshot version that decided. :class:`LoggedBandit` lines a domain's
updates up in decision-time order over one action universe (every action id seen, in order of
first appearance), in Open Bandit Pipeline's convention:

* ``action (n,)``: index of the logged action in :attr:`LoggedBandit.actions`;
* ``reward (n,)``, ``pscore (n,)``: its reward and the logging policy's probability of it;
* ``logged_dist (n, K)``: the logging policy's whole distribution (0 for an action that was
  not a candidate on that row), and ``candidates (n, K)``, which actions were;
* ``context (n, d)``: the hashed feature row the learner saw (for a per-arm model the
  context vector, the same for every candidate);
* ``recommended_dist (n, K)``: the distribution a policy that recommended without acting
  logged on the row (the SDK's shadow snapshot, or the policy in shadow mode), aligned like
  ``logged_dist``; ``has_recommendation (n,)`` marks the rows that carry one (the others are
  0) and ``recommended_version (n,)`` names its snapshot ("" where none).

Where the updates come from (the updates topic, Avro files) is the business of the readers
(:mod:`streams.evaluation_log`); this module is pure numpy.

    >>> updates = [
    ...     {"event_id": "e1", "tenant": "default", "workspace": "main", "domain": "d", "actions": ["a", "b"],
    ...      "probabilities": [0.25, 0.75], "arm_index": 1, "reward": 1.0, "features": [1.0, 0.5],
    ...      "decision_time": 2, "policy_version": "1.0.0", "mode": "live", "join_status": "rewarded"},
    ...     {"event_id": "e0", "tenant": "default", "workspace": "main", "domain": "d", "actions": ["c", "a"],
    ...      "probabilities": [0.5, 0.5], "arm_index": 0, "reward": 0.0, "features": [1.0, -0.5],
    ...      "decision_time": 1, "policy_version": "1.0.0", "mode": "live", "join_status": "default"},
    ... ]
    >>> log = LoggedBandit.from_updates(updates)
    >>> log.actions, log.action.tolist(), log.pscore.tolist()
    (['c', 'a', 'b'], [0, 2], [0.5, 0.75])
    >>> log.logged_dist.tolist()
    [[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]]
    >>> updates[0] |= {"recommended_probabilities": [0.0, 1.0], "recommended_version": "1.1.0"}
    >>> log = LoggedBandit.from_updates(updates)
    >>> log.recommended_dist.tolist(), log.has_recommendation.tolist(), log.recommended_version.tolist()
    ([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]], [False, True], ['', '1.1.0'])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["LoggedBandit"]


@dataclass(frozen=True)
class LoggedBandit:
    """One domain's logged decisions in decision-time order (see the module's doc)."""

    actions: list[str]
    action: np.ndarray
    reward: np.ndarray
    pscore: np.ndarray
    logged_dist: np.ndarray
    candidates: np.ndarray
    context: np.ndarray
    decision_time: np.ndarray
    event_id: np.ndarray
    policy_version: np.ndarray
    mode: np.ndarray
    join_status: np.ndarray
    recommended_dist: np.ndarray
    has_recommendation: np.ndarray
    recommended_version: np.ndarray
    #: (tenant, workspace, domain) the rows belong to
    scope: tuple[str, str, str] = ("default", "main", "")
    feature_hash: str = ""
    #: rows the readers left out, by reason (another domain, shadow decisions, ...)
    skipped: dict[str, int] = field(default_factory=dict)
    #: a shared model's log: per row, every candidate's encoded row (k_i, d), in the order of
    #: the row's candidate columns (``np.flatnonzero(candidates[i])``); None for per-arm logs
    candidate_rows: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.action.shape[0])

    @property
    def n_actions(self) -> int:
        return len(self.actions)

    @property
    def dimension(self) -> int:
        return int(self.context.shape[1])

    @classmethod
    def from_updates(
        cls,
        updates: Iterable[Mapping],
        *,
        domain: str | None = None,
        tenant: str = "default",
        workspace: str = "main",
        modes: Sequence[str] = ("live",),
    ) -> "LoggedBandit":
        """Line up UpdateEvents (decoded dicts) of one tenant/workspace/domain.

        ``domain`` None takes the domain of the first update of the tenant/workspace. Only
        decisions whose logged ``mode`` is in ``modes`` are rows (a shadow decision's logged
        distribution is its recommendation, not what acted: it is a candidate, not the
        logging policy). Rows are sorted by ``decision_time`` (then event id), duplicates of
        one event id (at-least-once delivery) kept once.
        """
        rows: dict[str, Mapping] = {}
        skipped: dict[str, int] = {}
        feature_hash = None
        for update in updates:
            if (update["tenant"], update["workspace"]) != (tenant, workspace):
                reason = "other_scope"
            elif domain is not None and update["domain"] != domain:
                reason = "other_domain"
            elif update.get("mode", "live") not in modes:
                reason = f"mode_{update.get('mode')}"
            elif update.get("join_status") == "not_activated":  # never acted on: no outcome
                reason = "not_activated"
            elif update["event_id"] in rows:
                reason = "duplicate"
            else:
                if domain is None:
                    domain = update["domain"]
                if feature_hash is None:
                    feature_hash = update.get("feature_hash", "")
                elif update.get("feature_hash", "") != feature_hash:
                    raise ValueError(
                        f"event {update['event_id']!r} was encoded with features {update.get('feature_hash')!r}, "
                        f"earlier rows with {feature_hash!r}: evaluate one feature configuration at a time"
                    )
                rows[update["event_id"]] = update
                continue
            skipped[reason] = skipped.get(reason, 0) + 1
        if domain is None:
            raise ValueError(f"no updates of tenant {tenant!r}, workspace {workspace!r} in the log")
        ordered = sorted(rows.values(), key=lambda u: (u["decision_time"], u["event_id"]))
        index: dict[str, int] = {}
        for update in ordered:
            for action in update["actions"]:
                index.setdefault(action, len(index))
        n, K = len(ordered), len(index)
        dims = {len(u["features"]) for u in ordered}
        if len(dims) > 1:
            raise ValueError(f"feature rows of {len(dims)} different lengths {sorted(dims)} in one domain's log")
        d = dims.pop() if dims else 0
        logged = np.zeros((n, K))
        candidates = np.zeros((n, K), dtype=bool)
        recommended = np.zeros((n, K))
        has_recommendation = np.zeros(n, dtype=bool)
        action = np.empty(n, dtype=np.int64)
        shared_rows = sum(1 for u in ordered if u.get("candidate_features"))
        if shared_rows not in (0, n):
            raise ValueError(f"{shared_rows} of {n} rows carry their candidates' feature rows: evaluate a shared "
                             "model's log or a per-arm model's, not both")  # fmt: skip
        candidate_rows = np.empty(n, dtype=object) if shared_rows else None
        for i, update in enumerate(ordered):
            columns = [index[a] for a in update["actions"]]
            if candidate_rows is not None:
                rows = np.asarray(update["candidate_features"], dtype=float)
                if rows.shape != (len(columns), d):
                    raise ValueError(f"event {update['event_id']!r} carries candidate rows of shape {rows.shape} "
                                     f"for {len(columns)} actions of dimension {d}")  # fmt: skip
                candidate_rows[i] = rows[np.argsort(columns, kind="stable")]
            if not 0 <= update["arm_index"] < len(columns) or len(update["probabilities"]) != len(columns):
                raise ValueError(
                    f"event {update['event_id']!r} logs arm_index {update['arm_index']} and "
                    f"{len(update['probabilities'])} probabilities for {len(columns)} actions"
                )
            logged[i, columns] = update["probabilities"]
            candidates[i, columns] = True
            action[i] = columns[update["arm_index"]]
            shadow = update.get("recommended_probabilities")
            if shadow:
                if len(shadow) != len(columns):
                    raise ValueError(
                        f"event {update['event_id']!r} recommends {len(shadow)} probabilities for {len(columns)} actions"
                    )
                recommended[i, columns] = shadow
                has_recommendation[i] = True
        return cls(
            actions=list(index),
            action=action,
            reward=np.fromiter((u["reward"] for u in ordered), dtype=float, count=n),
            pscore=logged[np.arange(n), action] if n else np.zeros(0),
            logged_dist=logged,
            candidates=candidates,
            context=np.array([u["features"] for u in ordered], dtype=float).reshape(n, d),
            decision_time=np.fromiter((u["decision_time"] for u in ordered), dtype=np.int64, count=n),
            event_id=np.array([u["event_id"] for u in ordered], dtype=object),
            policy_version=np.array([u.get("policy_version", "") for u in ordered], dtype=object),
            mode=np.array([u.get("mode", "live") for u in ordered], dtype=object),
            join_status=np.array([u.get("join_status", "") for u in ordered], dtype=object),
            recommended_dist=recommended,
            has_recommendation=has_recommendation,
            recommended_version=np.array(
                [u.get("recommended_version", "") if has else "" for u, has in zip(ordered, has_recommendation)], dtype=object
            ),
            scope=(tenant, workspace, domain),
            feature_hash=feature_hash or "",
            skipped=skipped,
            candidate_rows=candidate_rows,
        )

    def select(self, mask: np.ndarray) -> "LoggedBandit":
        """The rows where ``mask`` is true (e.g. one policy version, a time range)."""
        keep = np.asarray(mask, dtype=bool)
        return LoggedBandit(
            actions=self.actions, action=self.action[keep], reward=self.reward[keep], pscore=self.pscore[keep],
            logged_dist=self.logged_dist[keep], candidates=self.candidates[keep], context=self.context[keep],
            decision_time=self.decision_time[keep], event_id=self.event_id[keep],
            policy_version=self.policy_version[keep], mode=self.mode[keep], join_status=self.join_status[keep],
            recommended_dist=self.recommended_dist[keep], has_recommendation=self.has_recommendation[keep],
            recommended_version=self.recommended_version[keep],
            scope=self.scope, feature_hash=self.feature_hash, skipped=dict(self.skipped),
            candidate_rows=None if self.candidate_rows is None else self.candidate_rows[keep],
        )  # fmt: skip
