"""The worked examples (``examples/``), each run as its README says, in ``--quick`` mode, on
the real stack they start themselves; each test asserts the claim its README makes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# five stacks at once, each example's rewards inside a 1 s window: nothing else beside them
pytestmark = [pytest.mark.integration, pytest.mark.alone]


EXAMPLES = ("adaptation_loop", "core_rl", "assistant_routing", "interrogator", "rag_autotuner")


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Iterator[dict[str, tuple[subprocess.Popen, Path]]]:
    """Every example started at once (each waits on its own workers most of the time, so
    together they take little longer than the slowest): name -> (process, its output dir)."""
    started = {}
    for name in EXAMPLES:
        out = tmp_path_factory.mktemp(name)
        command = [sys.executable, str(ROOT / "examples" / name / "run.py"), "--quick", "--out", str(out)]
        started[name] = (subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out)
    yield started
    for process, _ in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()


def run_example(examples, name: str, timeout: float = 600) -> tuple[dict, Path]:
    """``python examples/NAME/run.py --quick --out OUT``, finished; its summary JSON and OUT."""
    process, out = examples[name]
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"{name} exited {process.returncode}:\n{output[-5000:]}"
    return json.loads((out / "summary.json").read_text()), out


def png(path: str | Path) -> bytes:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, f"{path} is no plot"
    return data


def test_adaptation_loop_evaluates_offline_and_a_warm_start_beats_a_cold_one(examples):
    s, out = run_example(examples, "adaptation_loop")
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
    assert (out / "reward_log.jsonl").stat().st_size > 100_000


def test_core_rl_shadow_changes_nothing_live_beats_the_baseline_and_shields_hold(examples):
    s, out = run_example(examples, "core_rl")
    domains = s["domains"]
    assert len(domains) == 5 and {d["policy"] for d in domains.values()} == {"beta_ts", "epsilon_greedy", "ucb1"}
    # shadow: every decision took the baseline (what users saw before)
    assert all(d["shadow_decisions"] > 0 and d["shadow_changed_for_users"] == 0 for d in domains.values())
    # live, once the flags are on: every domain beats its baseline, by 0.04 on average
    gains = [d["live_gain_over_baseline"] for d in domains.values()]
    assert min(gains) > 0 and sum(gains) / len(gains) >= 0.04
    assert all(d["last_round_reward"] <= d["best_allowed_reward"] + 1e-9 for d in domains.values())
    # shields: nothing over budget where a budget applied, though the policies do take those
    # actions where none did
    shields = s["shield_violations"]
    assert shields["cost"] == 0 and shields["latency"] == 0 and shields["taken_where_not_shielded"] > 0
    # dump and restore: the restored version is what the SDK holds, with the dumped state
    restore = s["restore"]
    assert restore["state_equal"] and restore["sdk_holds"] == restore["restored_as"] != restore["dumped"]
    assert (out / "dump").is_dir()
    png(s["plot"])


def test_assistant_routing_offline_estimate_agrees_with_the_online_result_and_the_monitor_is_quiet(examples):
    s, out = run_example(examples, "assistant_routing")
    # first the loop's health, which every claim below rests on (a reward lost or defaulted
    # would change what was learned): the monitor has no alert and nothing it could not read,
    # and every live decision was joined and rewarded
    monitor = s["monitor"]
    assert monitor["alerts"] == [] and monitor["problems"] == [] and not monitor["dead_letters"]
    live = s["rounds"] * s["per_round"]
    assert {name: (d["decisions"], d["rewarded_share"]) for name, d in monitor["domains"].items()} == {
        name: (live, 1.0) for name in ("route", "tools", "cache")}
    offline = s["offline"]["candidates"]
    agree = s["route_online_vs_offline"]
    router = offline[agree["candidate"]]
    # before deploying: every fixed candidate's IPS and SNIPS intervals cover its true value on
    # the log, and the router's (trained progressively on the log) cover its own
    assert s["offline_fixed_covered"] == {"ips": "3/3", "snips": "3/3"}
    assert all(router[e]["low"] <= router["truth"] <= router[e]["high"] for e in ("ips", "snips"))
    # the log says deploy it: the router's SNIPS lower bound is above the best fixed path's truth
    assert router["snips"]["low"] >= max(offline["always:fast"]["truth"], offline["always:deep"]["truth"]) + 0.02
    # the claim: what the deployed router earned live lies inside its offline intervals
    assert agree["online_mean_reward"] == s["domains"]["route"]["mean_reward"]
    assert agree["ips"]["covers_online"] and agree["snips"]["covers_online"]
    # each learned domain beats what the assistant did before, and its best fixed action or
    # uniform, by the stated margins
    route, tools, cache = (s["domains"][name] for name in ("route", "tools", "cache"))
    assert route["mean_reward"] >= route["best_fixed_reward"] + 0.03 and route["mean_reward"] >= route["uniform_reward"] + 0.05
    assert route["mean_reward"] <= route["oracle_reward"] + 1e-9
    assert tools["last_round_reward"] >= tools["baseline_reward"] + 0.15
    assert tools["last_round_reward"] >= tools["best_fixed_reward"] + 0.05
    assert tools["last_round_tool_per_intent"] == {"billing": "kb_lookup", "tech": "search", "chitchat": "none", "legal": "kb_lookup"}
    assert cache["last_round_reward"] >= cache["baseline_reward"] + 0.05 and cache["last_round_reward"] >= cache["uniform_reward"] + 0.02
    assert cache["last_round_top_action"] == "semantic"
    png(s["plot"])
    assert (out / "reward_log.jsonl").stat().st_size > 500_000


def test_interrogator_solves_in_fewer_steps_with_more_cache_hits_and_the_gate_holds(examples):
    s, out = run_example(examples, "interrogator")
    gate = s["gate"]
    fixed, policy = gate["candidates"]["fixed order"], gate["candidates"][gate["candidate"]]
    # the gate, before the policy goes on: every interval covers its true value on the log, and
    # the policy's SNIPS lower bound (and DR's) clears the fixed order's estimate less 5%
    assert all(row[e]["low"] <= row["truth"] <= row[e]["high"] for row in (fixed, policy) for e in ("snips", "dr"))
    assert gate["threshold"] == round(fixed["snips"]["value"] - 0.05 * abs(fixed["snips"]["value"]), 4)
    assert gate["decision"] == "on" and policy["snips"]["low"] >= gate["threshold"] and policy["dr"]["low"] >= gate["threshold"]
    # offline, no snapshot to be had (an empty repository): the local warm start decides every
    # step, its version on each, and beats the fixed order on the same tasks by the stated margins
    local = s["offline_local_warm_start"]
    assert local["version"].startswith("local:") and local["decided_by"] == [local["version"]]
    assert local["snapshot_held"] == "" and local["fallbacks_no_snapshot"] == local["decisions"] > 0
    assert local["refused_as"] == "not_found" and local["samples"] == s["log_rows"]
    assert local["policy"]["steps"] <= local["fixed"]["steps"] - 8
    assert local["policy"]["cache_hit_rate"] >= local["fixed"]["cache_hit_rate"] + 0.15
    # live: in every round, fewer steps to solve and more cache hits than the fixed order on
    # the same tasks; over the run by 9 steps and 20 points
    rounds, live = s["live"]["rounds"], s["live"]
    assert all(r["policy"]["steps"] <= r["fixed"]["steps"] - 8 for r in rounds)
    assert all(r["policy"]["cache_hit_rate"] >= r["fixed"]["cache_hit_rate"] + 0.15 for r in rounds)
    assert live["policy"]["steps"] <= live["fixed"]["steps"] - 9
    assert live["policy"]["cache_hit_rate"] >= live["fixed"]["cache_hit_rate"] + 0.2
    assert all(r["policy"]["solved"] == 1.0 for r in rounds)
    # it learns on from its live traffic: its last round takes fewer steps than its first, and
    # is within 0.3 steps of the oracle
    assert rounds[-1]["policy"]["steps"] < rounds[0]["policy"]["steps"]
    assert rounds[-1]["policy"]["steps"] <= rounds[-1]["oracle"]["steps"] + 0.3
    # every live decision names the snapshot that decided it, in the joined log too; each
    # round is decided by a newer snapshot than the last
    assert s["claims"]["live_decisions_name_their_snapshot"]
    assert live["joined_with_their_snapshot"] == live["decisions"] == live["policy"]["questions"]
    versions = [tuple(int(part) for part in r["snapshot"].split(".")) for r in rounds]
    assert all(r["decided_by"] == [r["snapshot"]] for r in rounds) and versions == sorted(set(versions))
    png(s["plot"])
    assert (out / "log.jsonl").stat().st_size > 1_000_000


def test_rag_autotuner_gates_hold_a_reset_is_rolled_back_and_releases_approach_the_frontier(examples):
    s, out = run_example(examples, "rag_autotuner")
    # offline, on the history: every SNIPS and DR interval covers its truth, and the tuner's lower
    # bound beats the hand-set configuration's estimate, so it goes on
    offline = s["offline"]["candidates"]
    assert all(row[e]["low"] <= row["truth"] <= row[e]["high"] for row in offline.values() for e in ("snips", "dr"))
    assert s["offline"]["decision"] == "on" and offline["tuner"]["snips"]["low"] > offline["hand-set"]["snips"]["value"]
    # shadow: users saw the hand-set configuration only; the tuner's picks, answered on
    # mirrored questions, earn 0.05 more and hold the gates the hand-set configuration breaks
    shadow = s["shadow"]
    assert shadow["changed_for_users"] == 0 and shadow["questions"] == s["per_round"]
    assert shadow["mirror_reward"] >= shadow["prod_reward"] + 0.05
    assert shadow["mirror_gates_held"] and not shadow["prod_gates"]["held"]
    # live: the gates (F, R >= 0.75, p95 <= 500 ms) hold in every round, and every round
    # earns 0.05 more than the hand-set configuration on the same questions
    rounds, claims = s["rounds"], s["claims"]
    assert claims["gates_held_every_live_round"] and all(r["gates"]["held"] for r in rounds)
    assert all(r["reward"] >= r["prod"] + 0.05 and r["reward"] <= r["oracle"] for r in rounds)
    # the reset (the priors, on the canary) is rolled back within five rounds and never
    # reaches stable; its requests earned less than stable's meanwhile
    reset_at, back_at = claims["reset_round"], claims["reset_rolled_back_at"]
    assert reset_at is not None and back_at is not None and reset_at <= back_at <= reset_at + 4
    assert claims["reset_never_stable"]
    during = [r for r in rounds if reset_at <= r["round"] <= back_at]
    assert all(r["canary"] == claims["reset_version"] and r["canary_reward"] < r["reward"] for r in during)
    # promotions only on evidence: each promoted canary's lower bound beat stable's value
    promoted = [r["verdict"] for r in rounds if r["verdict"]["action"] == "promote"]
    assert claims["promotions"] == len(promoted) >= 1
    assert all(v["canary_estimate"][1] > v["stable_estimate"][0] for v in promoted)
    # releases approach the true cost-quality frontier: the last is 0.015 closer than the
    # warm start and earns 0.01 more on the validation slice; both far above the hand-set one
    first, last = s["releases"][0], s["releases"][-1]
    assert last["frontier_gap"] <= first["frontier_gap"] - 0.015 and last["reward"] >= first["reward"] + 0.01
    assert first["reward"] >= s["hand_set"]["reward"] + 0.05 and s["hand_set"]["frontier_gap"] > first["frontier_gap"]
    png(s["plot"])
    assert (out / "log.jsonl").stat().st_size > 1_000_000
