"""A portfolio domain through the whole loop: the embedded broker, the join, learner and
publisher worker processes, signed snapshots and the SDK (banditstream.playground).

The portfolio's first member explores 90 % of the time; the second is a sound LinUCB. The
publisher judges each new snapshot's rows with the previous snapshot's members, switches to the
sound one once the log shows it better, and the SDK acts with it from the next snapshot. A
publisher killed and restarted afterwards takes the choice and the evidence from the latest
snapshot and goes on adding to it.
"""

from __future__ import annotations

import os
import signal

import numpy as np

from banditstream.playground import Playground
from publisher import SnapshotClient
from publisher.cli_ops import list_snapshots
from publisher.stores import DirectoryStore

ARMS = ["a", "b", "c"]
POOR = {"policy": "lin_ucb", "alpha": 0.1, "eps0": 0.9, "arm_priors": {"c": [2.0, 1e6]}, "label": "poor"}
SOUND = {"policy": "lin_ucb", "alpha": 0.1, "eps0": 0.05, "label": "sound"}
DOMAIN = {
    "policy": "portfolio",
    "params": {"members": [POOR, SOUND], "min_rows": 600},  # two rounds at least with the poor one acting
    "features": {"dimension": 16, "normalize": False},
    "reward": {"expression": "value"},
}


def truth(arm: str, x1: float) -> float:
    return {"a": 0.5 + 0.3 * x1, "b": 0.5 - 0.3 * x1, "c": 0.45}[arm]


def latest_summary(loop: Playground) -> dict:
    client = SnapshotClient(str(loop.workdir / "snapshots"), loop.workdir / "cache" / "check", loop.workdir / "keys" / "root.json",
                            domain="route")  # fmt: skip
    return client.refresh().snapshot.summary()


def test_the_publisher_switches_a_portfolio_to_the_member_the_log_rates_best_and_keeps_it_across_a_restart(tmp_path):
    rng = np.random.default_rng(11)

    def play(loop: Playground, n: int = 300) -> list[float]:
        top = []
        for _ in range(n):
            x1 = float(rng.normal())
            decision = loop.decide("route", {"numeric": {"bias": 1.0, "x1": x1}}, ARMS)
            top.append(max(decision.probabilities))
            loop.reward("route", decision, truth(decision.action, x1) + float(rng.normal(0, 0.1)))
        loop.learn()
        return top

    with Playground({"route": DOMAIN}, seed=4, workdir=tmp_path / "loop") as loop:
        acting = []
        for _ in range(12):
            play(loop)
            policy = loop.decider("route").active_policy.policy
            acting.append(policy.acting_label)
            if policy.acting_label == "sound":
                break
        assert acting[-1] == "sound", f"no switch in {len(acting)} rounds: {acting}"
        assert acting[0] == "poor"
        summary = latest_summary(loop)
        (switch,) = summary["portfolio"]["switches"]
        assert summary["portfolio"]["acting"] == "sound" and (switch["from"], switch["to"]) == ("poor", "sound")
        assert switch["lower"] > 0 and switch["rows"] >= 600
        listed = list_snapshots(DirectoryStore(loop.workdir / "snapshots"))  # `banditstream snapshot list`
        assert listed[0]["acting"] == "poor" and listed[-1]["acting"] == "sound"
        top = play(loop)  # the SDK now decides with the sound member: mostly greedy, not 90 % uniform
        assert np.median(top) > 0.9, np.median(top)
        metrics = loop.workers.scrape("publish")["banditstream_portfolio_acting"]
        assert metrics == {'domain="route",member="poor"': 0.0, 'domain="route",member="sound"': 1.0}, metrics
        seen = loop.decider("route").active_policy.policy.rows_seen

        publisher = loop.workers.processes["publish"]
        os.killpg(publisher.pid, signal.SIGKILL)
        publisher.wait(30)
        loop.workers.start("publish", loop.config_path)
        play(loop)
        after = loop.decider("route").active_policy.policy
        assert after.acting_label == "sound" and after.switches == [switch]
        assert after.rows_seen > seen  # the evidence carried over and grew: not started over
