"""Per-arm statistics and the leaderboard (banditstream.stats), from UpdateEvents."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from rich.console import Console

from banditstream.stats import leaderboard, parse_window, table
from learner.policies import LinUCB

T0 = 1_800_000_000_000
TRUTH = {"gpt": 0.7, "llama": 0.4, "small": 0.2}


def updates(n: int, seed: int, *, t0: int = T0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        arm = rng.choices(list(TRUTH), (5, 3, 2))[0]
        rewarded = rng.random() < 0.8
        out.append({
            "event_id": f"e-{seed}-{i}", "tenant": "default", "workspace": "main", "domain": "routing", "arm": arm,
            "features": [1.0, rng.gauss(0, 1)], "reward": (float(rng.random() < TRUTH[arm]) if rewarded else 0.0),
            "reward_count": int(rewarded), "join_status": "rewarded" if rewarded else "default", "mode": "live",
            "decision_time": t0 + i,
        })  # fmt: skip
    return out


def test_each_arm_counts_its_decisions_rewards_and_defaults_and_the_best_mean_ranks_first():
    rows = updates(3000, seed=1)
    extra = [
        {**rows[0]},  # a duplicate delivery: counted once
        {**rows[1], "event_id": "shadowed", "mode": "shadow"},
        {**rows[2], "event_id": "never", "join_status": "not_activated"},
        {**rows[3], "event_id": "elsewhere", "domain": "other"},
        {**rows[4], "event_id": "too-old", "decision_time": T0 - 1},
    ]
    board = leaderboard(rows + extra, tenant="default", workspace="main", domain="routing", since_ms=T0)
    assert [a.arm for a in board.arms] == ["gpt", "llama", "small"]  # the truth's order
    assert board.decisions == 3000 and board.not_acted == {"shadow": 1, "not_activated": 1}
    for arm in board.arms:
        mine = [u for u in rows if u["arm"] == arm.arm]
        r = np.array([u["reward"] for u in mine])
        assert arm.decisions == len(mine) and arm.share == pytest.approx(len(mine) / 3000)
        assert arm.rewarded == arm.rewards == sum(u["join_status"] == "rewarded" for u in mine)
        assert arm.default_share == pytest.approx(sum(u["join_status"] == "default" for u in mine) / len(mine))
        assert arm.mean_reward == pytest.approx(r.mean())
        half = 1.959964 * r.std(ddof=1) / math.sqrt(len(mine))
        assert (arm.low, arm.high) == pytest.approx((r.mean() - half, r.mean() + half), abs=1e-6)
        assert arm.low < 0.8 * TRUTH[arm.arm] < arm.high  # 80% of rows rewarded, the rest default 0
        assert arm.posterior_mean is None


def test_posterior_means_are_the_snapshots_expectations_on_the_arms_own_rows():
    rows = updates(2000, seed=2)
    policy = LinUCB(dim=2, eps0=0.0)
    policy.update_batch(np.array([u["features"] for u in rows]), [u["arm"] for u in rows], [u["reward"] for u in rows])
    board = leaderboard(rows, tenant="default", workspace="main", domain="routing", policy=policy, snapshot_version="1.4.0")
    for arm in board.arms:
        X = np.array([u["features"] for u in rows if u["arm"] == arm.arm])
        assert arm.posterior_mean == pytest.approx(float((X @ policy.posterior_mean(arm.arm)).mean()))
        assert abs(arm.posterior_mean - arm.mean_reward) < 0.05
    unknown = leaderboard([{**rows[0], "arm": "new"}], tenant="default", workspace="main", domain="routing", policy=policy)
    assert unknown.arms[0].posterior_mean is None and unknown.arms[0].low is None  # one row: no interval
    text = Console(width=120, record=True)
    text.print(table(board))
    rendered = text.export_text()
    assert "snapshot 1.4.0" in rendered and "gpt" in rendered and "95% interval" in rendered
    assert board.to_dict()["arms"][0]["rank"] == 1


@pytest.mark.parametrize(("text", "seconds"), [("3600", 3600), ("90s", 90), ("15m", 900), ("24h", 86400), ("7d", 604800), (30, 30)])
def test_windows_read_as_seconds_or_with_a_unit(text, seconds):
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", "1w", "-5m", "0", "h", "1.5.2h"])
def test_a_window_that_is_not_one_is_refused_by_name(text):
    with pytest.raises(ValueError, match="window"):
        parse_window(text)
