"""The dashboard ``banditstream serve`` answers at ``/``: one page per domain, drawn on the server.

From the same window of the joined log as ``GET /v1/stats`` (:mod:`banditstream.stats`):

* **reward over time**: the mean learned reward of the live decisions, per time bucket, against
  the baseline's - the policy that always takes the first candidate (what a domain does without
  a snapshot) - estimated off-policy from the same decisions (self-normalised IPS);
* **arm shares** and the **leaderboard** table (the numbers of ``/v1/stats``);
* **snapshots** in use per channel, with their versions and ages;
* **evaluation**: off-policy estimates (SNIPS, with intervals) of the logging policy, the uniform
  policy and always-one-arm policies (:mod:`learner.evaluation`);
* **cost-quality**: when the rewards carry a cost and a quality signal, each arm's mean cost
  against its mean quality, with the Pareto front.

Charts are inline SVG (:mod:`banditstream.charts`): no script, nothing fetched, so the page
works air-gapped. Every number in the leaderboard table carries its raw value in a
``data-value`` attribute, for tests and scrapers.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from banditstream import charts
from banditstream.stats import Leaderboard, live_rows

__all__ = ["DomainView", "build_view", "render"]

#: always-one-arm candidates evaluated at most (the most chosen arms)
_MAX_ARMS_EVALUATED = 6


@dataclass
class DomainView:
    """Everything one domain's page shows."""

    board: Leaderboard
    #: series name -> [(bucket start ms, mean reward)]
    reward_series: dict[str, list[tuple[float, float]]]
    #: (channel, version, age in seconds) of the snapshots in use
    snapshots: list[tuple[str, str, float | None]]
    #: (candidate, estimate, low, high) of the off-policy evaluation, and why it is missing
    evaluation: list[tuple[str, float, float | None, float | None]]
    evaluation_note: str = ""
    #: (arm, mean cost, mean quality) when both signals were logged
    pareto: list[tuple[str, float, float]] = field(default_factory=list)
    signals: tuple[str, str] = ("cost", "quality")
    generated_at: float = field(default_factory=time.time)


def build_view(
    updates: Sequence[Mapping[str, Any]],
    board: Leaderboard,
    *,
    snapshots: Sequence[tuple[str, str, float | None]] = (),
    buckets: int = 20,
    cost_signal: str = "cost",
    quality_signal: str = "quality",
) -> DomainView:
    """A domain's page from its UpdateEvents of the leaderboard's window."""
    rows, _ = live_rows(updates, tenant=board.tenant, workspace=board.workspace, domain=board.domain,
                        since_ms=board.since_ms, until_ms=board.until_ms)
    return DomainView(
        board=board,
        reward_series=_reward_series(rows, board, buckets),
        snapshots=list(snapshots),
        evaluation=(evaluation := _evaluation(rows, board))[0],
        evaluation_note=evaluation[1],
        pareto=_pareto(rows, cost_signal, quality_signal),
        signals=(cost_signal, quality_signal),
    )


def _reward_series(rows: list[Mapping[str, Any]], board: Leaderboard, buckets: int) -> dict[str, list[tuple[float, float]]]:
    if not rows:
        return {}
    times = np.array([u["decision_time"] for u in rows], dtype=float)
    start = board.since_ms if board.since_ms is not None else times.min()
    end = board.until_ms if board.until_ms is not None else times.max() + 1
    edges = np.linspace(start, end, buckets + 1)
    which = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, buckets - 1)
    reward = np.array([u["reward"] for u in rows], dtype=float)
    # the baseline takes the first candidate: weight 1/p where the log did too (self-normalised IPS)
    weight = np.array([(u.get("arm_index") == 0) / u["probability"] if u.get("probability") else 0.0 for u in rows])
    policy, baseline = [], []
    for b in range(buckets):
        mask = which == b
        mid = float((edges[b] + edges[b + 1]) / 2)
        if not mask.any():
            continue
        policy.append((mid, float(reward[mask].mean())))
        w = weight[mask]
        baseline.append((mid, float((w * reward[mask]).sum() / w.sum()) if w.sum() > 0 else math.nan))
    return {"policy (logged)": policy, "baseline (first action, estimated)": baseline}


def _evaluation(rows: list[Mapping[str, Any]], board: Leaderboard) -> tuple[list[tuple[str, float, float | None, float | None]], str]:
    if len(rows) < 20:
        return [], f"{len(rows)} live decisions in the window: too few to evaluate"
    from banditstream.evaluate import evaluate_candidates, parse_candidates
    from learner.evaluation import LoggedBandit

    try:
        log = LoggedBandit.from_updates(rows, domain=board.domain, tenant=board.tenant, workspace=board.workspace)
        arms = [a.arm for a in sorted(board.arms, key=lambda a: -a.decisions)[:_MAX_ARMS_EVALUATED]]
        candidates = parse_candidates(",".join(["logging", "uniform", *(f"always:{arm}" for arm in arms)]), snapshots=None)
        run = evaluate_candidates(log, candidates, estimators=["snips"], method="gaussian", level=board.level, seed=0)
    except (ValueError, KeyError) as exc:  # e.g. rows of two feature configurations
        return [], f"not evaluated: {exc}"
    out = []
    for result in run.results:
        estimate = result.estimates["snips"]
        out.append((result.name, float(estimate.estimate), _finite(estimate.lower), _finite(estimate.upper)))
    return out, f"SNIPS over {run.rows:,} decisions, {board.level:.0%} intervals"


def _finite(value: float) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _pareto(rows: list[Mapping[str, Any]], cost: str, quality: str) -> list[tuple[str, float, float]]:
    sums: dict[str, list[float]] = {}
    for u in rows:
        signals = u.get("signals") or {}
        if cost in signals and quality in signals:
            acc = sums.setdefault(u["arm"], [0.0, 0.0, 0.0])
            acc[0] += signals[cost]
            acc[1] += signals[quality]
            acc[2] += 1
    return [(arm, c / n, q / n) for arm, (c, q, n) in sorted(sums.items())]


# -- the page ---------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:15px;margin:18px 0 6px}
.meta{color:#666;font-size:13px;margin-bottom:12px}
.grid{display:flex;flex-wrap:wrap;gap:16px}.card{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:10px}
table{border-collapse:collapse;font-size:13px;background:#fff}th,td{padding:4px 10px;border-bottom:1px solid #eee;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}.note{color:#666;font-size:12px}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _clock(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M")


def _age(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def _cell(value: float | None, text: str, left: bool = False) -> str:
    raw = "" if value is None else f' data-value="{value!r}"'
    return f'<td{" class=l" if left else ""}{raw}>{_esc(text)}</td>'


def render(view: DomainView, *, window: str = "") -> str:
    """The page, as one HTML document."""
    board = view.board
    where = f"{board.tenant}/{board.workspace}/{board.domain}"
    rows = []
    for rank, arm in enumerate(board.arms, 1):
        interval = "-" if arm.low is None else f"[{arm.low:.3f}, {arm.high:.3f}]"
        rows.append(
            f'<tr data-arm="{_esc(arm.arm)}">' + _cell(rank, str(rank)) + _cell(None, arm.arm, left=True)
            + _cell(arm.decisions, f"{arm.decisions:,}") + _cell(arm.share, f"{arm.share:.1%}")
            + _cell(arm.rewards, f"{arm.rewards:,}") + _cell(arm.mean_reward, f"{arm.mean_reward:.3f}")
            + _cell(None, interval) + _cell(arm.default_share, f"{arm.default_share:.0%}")
            + _cell(arm.posterior_mean, "-" if arm.posterior_mean is None else f"{arm.posterior_mean:.3f}") + "</tr>"
        )
    table = (
        '<table id="leaderboard"><tr><th>#</th><th class=l>arm</th><th>decisions</th><th>share</th><th>rewards</th>'
        f'<th>mean reward</th><th>{board.level:.0%} interval</th><th>default</th><th>posterior mean</th></tr>'
        + "".join(rows) + "</table>"
    )
    snapshots = "".join(
        f'<tr data-channel="{_esc(channel)}"><td class=l>{_esc(channel)}</td><td class=l>{_esc(version or "none")}</td>'
        f"<td>{_esc(_age(age))}</td></tr>"
        for channel, version, age in view.snapshots
    ) or '<tr><td class=l colspan=3>no snapshot: the baseline decides</td></tr>'
    not_acted = ", ".join(f"{k} {v:,}" for k, v in sorted(board.not_acted.items())) or "none"
    cost, quality = view.signals
    pareto = (
        charts.scatter("cost against quality per arm (Pareto front dashed)", view.pareto, x_label=f"mean {cost}",
                       y_label=f"mean {quality}")
        if view.pareto else f'<p class="note">no cost-quality chart: the rewards carry no "{_esc(cost)}" and "{_esc(quality)}" signals</p>'
    )
    shares = {arm.arm: arm.share for arm in board.arms}
    generated = datetime.fromtimestamp(view.generated_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>banditstream: {_esc(where)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,"><style>{_STYLE}</style></head>
<body>
<h1>{_esc(where)}</h1>
<div class="meta" id="meta" data-decisions="{board.decisions}">{board.decisions:,} live decisions in the last {_esc(window or "window")}
 &middot; not acted: {_esc(not_acted)} &middot; generated {generated}</div>
<div class="grid">
<div class="card">{charts.lines("mean reward over time", view.reward_series, x_format=_clock, y_label="mean reward")}</div>
<div class="card">{charts.bars("arm shares", shares)}</div>
</div>
<h2>leaderboard</h2>
{table}
<h2>snapshots</h2>
<table id="snapshots"><tr><th class=l>channel</th><th class=l>version</th><th>age</th></tr>{snapshots}</table>
<h2>evaluation</h2>
<div class="card">{charts.intervals("estimated reward of other policies", view.evaluation)}
<p class="note">{_esc(view.evaluation_note)}</p></div>
<h2>cost and quality</h2>
<div class="card">{pareto}</div>
</body></html>
"""
