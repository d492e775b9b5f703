"""The worked examples (``examples/``), each run as its README says, in ``--quick`` mode, on
the real stack they start themselves; each test asserts the claim its README makes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


def run_example(name: str, out: Path, *args: str, timeout: float = 600) -> dict:
    """``python examples/NAME/run.py --quick --out OUT``; its summary JSON."""
    summary = out / "summary.json"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / name / "run.py"), "--quick", "--out", str(out),
                           "--json", str(summary), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(summary.read_text())


def png(path: str | Path) -> bytes:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, f"{path} is no plot"
    return data


def test_adaptation_loop_evaluates_offline_and_a_warm_start_beats_a_cold_one(tmp_path):
    s = run_example("adaptation_loop", tmp_path)
    offline = s["offline"]["candidates"]
    # offline: every fixed candidate's DR interval covers its true value, and the best agent
    # by DR is the best agent in truth; the router's policy, trained progressively on the
    # log, is estimated above the best single agent's true value
    assert s["offline_dr_covers_truth"] == "5/5" and s["offline_picks_the_best_agent"]
    best_truth = max(row["truth"] for row in offline.values() if row["truth"] is not None)
    assert offline["lin_igw"]["dr"]["low"] > best_truth
    # live: the warm-started router is better from its first round by the stated margin (0.05)
    warm, cold = s["routers"]["router_warm"], s["routers"]["router_cold"]
    assert s["warm_start_first_round_gain"] >= 0.05
    assert warm["first_round_reward"] > s["best_single_agent_reward"]
    assert warm["regret"] < cold["regret"]
    # both learn: by their last round they beat uniform routing clearly
    assert min(warm["last_round_reward"], cold["last_round_reward"]) > s["uniform_reward"] + 0.05
    # the leaderboard of the warm router's live traffic covers every agent it chose, once
    shares = [arm["share"] for arm in s["leaderboard"]]
    assert abs(sum(shares) - 1.0) < 0.01 and len(shares) >= 2
    png(s["plot"])
    assert (tmp_path / "reward_log.jsonl").stat().st_size > 100_000
