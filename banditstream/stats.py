"""Per-arm statistics of a domain and its leaderboard, from the joined log.

What ``GET /v1/stats`` (``banditstream serve``) and ``banditstream stats`` show: for each arm
of one tenant/workspace/domain, over the decisions stamped in a window, how often it was
chosen, how many rewards came back, its mean learned reward with an interval, the share of
its decisions that got the domain's default reward (no reward in the window), and what the
current snapshot's model expects of it on those same decisions (its posterior mean, averaged
over the arm's logged rows). Arms are ranked by mean reward: the leaderboard.

Rows are the UpdateEvents the join emitted (the updates topic), live decisions only: a shadow
or off decision did not act, and a deferred decision never activated has no outcome (both
are counted apart).

    board = leaderboard(updates, tenant="default", workspace="main", domain="llm_routing",
                        policy=snapshot.load_policy(), snapshot_version=snapshot.version)
    console.print(table(board))
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["ArmStats", "Leaderboard", "leaderboard", "live_rows", "parse_window", "table"]

_WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_window(text: str | float | int) -> float:
    """A window in seconds from ``3600``, ``90s``, ``15m``, ``24h`` or ``7d``; ValueError otherwise."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _WINDOW.match(str(text))
        if match is None:
            raise ValueError(f"{text!r} is not a window: give seconds, or a number with s, m, h or d (e.g. 15m, 24h)")
        seconds = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if not 0 < seconds < math.inf:
        raise ValueError(f"the window must be positive, got {text!r}")
    return seconds


@dataclass(frozen=True)
class ArmStats:
    """One arm's figures over the window."""

    arm: str
    #: live decisions that chose it, and their share of the domain's
    decisions: int
    share: float
    #: decisions whose reward arrived in the window, and the distinct rewards they got
    rewarded: int
    rewards: int
    #: mean learned reward (the default reward where none came) and its interval
    mean_reward: float
    low: float | None
    high: float | None
    #: share of its decisions learned with the domain's default reward
    default_share: float
    #: the snapshot's expected reward for the arm, averaged over the arm's logged rows (None
    #: without a snapshot, or one that does not know the arm)
    posterior_mean: float | None


@dataclass
class Leaderboard:
    """A domain's arms over a window of decision time, best mean reward first."""

    tenant: str
    workspace: str
    domain: str
    since_ms: int | None
    until_ms: int | None
    level: float
    #: live decisions in the window (the arms' rows)
    decisions: int
    #: decisions in the window that did not act: shadow/off mode, and deferred never activated
    not_acted: dict[str, int] = field(default_factory=dict)
    snapshot_version: str = ""
    arms: list[ArmStats] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["arms"] = [{**asdict(arm), "rank": i + 1} for i, arm in enumerate(self.arms)]
        return out


def leaderboard(
    updates: Iterable[Mapping[str, Any]],
    *,
    tenant: str,
    workspace: str,
    domain: str,
    since_ms: int | None = None,
    until_ms: int | None = None,
    policy: Any = None,
    snapshot_version: str = "",
    level: float = 0.95,
) -> Leaderboard:
    """The leaderboard of ``domain`` from UpdateEvents (decoded dicts; duplicates of an event
    id, from at-least-once delivery, count once). ``policy``: the snapshot's policy, for the
    posterior means (anything with ``expected_rewards(X, arms)``)."""
    if not 0.5 <= level < 1.0:
        raise ValueError(f"level must be in [0.5, 1), got {level!r}")
    rows, not_acted = live_rows(updates, tenant=tenant, workspace=workspace, domain=domain, since_ms=since_ms,
                                until_ms=until_ms)
    by_arm: dict[str, list[Mapping[str, Any]]] = {}
    for update in rows:
        by_arm.setdefault(update["arm"], []).append(update)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    total = len(rows)
    arms = []
    for arm, mine in by_arm.items():
        rewards = np.array([u["reward"] for u in mine], dtype=float)
        n = len(mine)
        mean = float(rewards.mean())
        half = z * float(rewards.std(ddof=1)) / math.sqrt(n) if n > 1 else None
        arms.append(ArmStats(
            arm=arm,
            decisions=n,
            share=n / total,
            rewarded=sum(u.get("join_status") == "rewarded" for u in mine),
            rewards=sum(int(u.get("reward_count") or 0) for u in mine),
            mean_reward=mean,
            low=None if half is None else mean - half,
            high=None if half is None else mean + half,
            default_share=sum(u.get("join_status") == "default" for u in mine) / n,
            posterior_mean=_posterior_mean(policy, arm, mine),
        ))  # fmt: skip
    arms.sort(key=lambda a: (-a.mean_reward, -a.decisions, a.arm))
    return Leaderboard(tenant, workspace, domain, since_ms, until_ms, level, total, not_acted, snapshot_version, arms)


def live_rows(
    updates: Iterable[Mapping[str, Any]],
    *,
    tenant: str,
    workspace: str,
    domain: str,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> tuple[list[Mapping[str, Any]], dict[str, int]]:
    """The live decisions of one domain decided in ``[since_ms, until_ms)``, each event id once
    (the first copy), and the count of those that did not act, by mode (``not_activated`` for a
    deferred decision never activated)."""
    rows: dict[str, Mapping[str, Any]] = {}
    not_acted: dict[str, int] = {}
    for update in updates:
        if (update["tenant"], update["workspace"], update["domain"]) != (tenant, workspace, domain):
            continue
        t = update["decision_time"]
        if (since_ms is not None and t < since_ms) or (until_ms is not None and t >= until_ms):
            continue
        if update["event_id"] in rows:
            continue
        mode = update.get("mode") or "live"
        if update.get("join_status") == "not_activated":
            mode = "not_activated"
        if mode != "live":
            not_acted[mode] = not_acted.get(mode, 0) + 1
            continue
        rows[update["event_id"]] = update
    return list(rows.values()), not_acted


def _posterior_mean(policy: Any, arm: str, rows: list[Mapping[str, Any]]) -> float | None:
    if policy is None:
        return None
    X = np.array([u["features"] for u in rows], dtype=float)
    if X.ndim != 2 or X.shape[1] != getattr(policy, "dim", X.shape[1]):
        return None  # rows encoded for another model than the snapshot's
    expected = policy.expected_rewards(X, [arm] * len(rows))
    expected = expected[~np.isnan(expected)]
    return float(expected.mean()) if expected.size else None


def table(board: Leaderboard):
    """The leaderboard as a rich Table."""
    from rich.table import Table

    def number(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    percent = f"{board.level:.0%}"
    title = f"{board.tenant}/{board.workspace}/{board.domain}: {board.decisions:,} live decisions"
    if board.snapshot_version:
        title += f", snapshot {board.snapshot_version}"
    out = Table(title=title)
    for name, justify in (("#", "right"), ("arm", "left"), ("decisions", "right"), ("share", "right"),
                          ("rewards", "right"), ("mean reward", "right"), (f"{percent} interval", "right"),
                          ("default", "right"), ("posterior mean", "right")):  # fmt: skip
        out.add_column(name, justify=justify)
    for rank, arm in enumerate(board.arms, 1):
        interval = "-" if arm.low is None else f"[{arm.low:.3f}, {arm.high:.3f}]"
        out.add_row(str(rank), arm.arm, f"{arm.decisions:,}", f"{arm.share:.1%}", f"{arm.rewards:,}",
                    number(arm.mean_reward), interval, f"{arm.default_share:.0%}", number(arm.posterior_mean))
    if board.not_acted:
        out.caption = "not acted (not in the table): " + ", ".join(f"{k} {v:,}" for k, v in sorted(board.not_acted.items()))
    return out
