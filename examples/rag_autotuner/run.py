"""The RAG auto-tuner (seed 001) on banditstream: a shared linear model over retrieval and
generation configurations tunes a RAG service per question category, offline from its log,
then in shadow, then as a gated canary that is promoted on evidence and rolled back when worse.

    python examples/rag_autotuner/run.py [--quick] [--seed 1] [--out DIR] [--json PATH]

The stages, every one through the real stack (see README.md here):

1. ``log.jsonl``: the service's history under its hand-set configuration, half of it randomised
   over each request's slate of configurations, logged with the configurations' knobs and the
   whole logged distribution;
2. offline: SNIPS and DR, with 95% intervals, of the tuner (``shared_lin_ucb``, trained
   progressively on the log) and of the hand-set configuration; the tuner goes on only if its
   lower bound beats the hand-set configuration's estimate;
3. the embedded broker, join, learner and publisher; the log replayed; the warm start released
   to stable by hand (``snapshot promote``);
4. shadow: the hand-set configuration answers, the tuner recommends; each recommendation is
   answered on a mirrored copy of the question and judged, never shown;
5. canary: the domain goes live; 10% of requests decide with the canary snapshot; after every
   round the promotion gate judges it (promote when its lower bound beats stable, roll back
   when its upper bound falls below); halfway, an operator resets the model to its priors,
   which goes to the canary like any version, and the gate rolls it back;
6. every release judged on a fixed validation slice (its cost and quality against the true
   cost-quality frontier), a summary table, a PNG and the figures as JSON.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import ragservice as sim
from banditstream.evaluate import load_log, parse_candidates
from banditstream.playground import Playground, estimates_table, example_arguments, write_summary
from learner.domain import DomainSettings
from learner.evaluation import AlwaysArm, Candidate
from learner.evaluation.run import evaluate_candidates

HERE = Path(__file__).parent
DOMAIN = "rag"
#: the environment switch that takes the domain from shadow to live (the feature flag)
FLAG = "ENABLE_RL_RAG"
SLATE = 12
#: the tuner: one ridge regression over configuration features, shared by every configuration
#: - shared + interactions: a row is intercept + context + the configuration's knobs + every
#:   context x knob product, so what is learned of k = 12 tells about k = 16, per category;
#: - action_id false: the knobs describe a configuration completely (its id would add one
#:   hashed feature per configuration and per context feature, learned separately);
#: - alpha 0.2: a reward is a few tenths; eps0 0.1 keeps every offered configuration at 0.1/12
#:   or more, so the gate's estimates stay usable.
CONFIG = {
    "policy": "shared_lin_ucb",
    "params": {"alpha": 0.2, "eps0": 0.1},
    "features": {"dimension": 256, "shared": True, "interactions": True, "action_id": False},
    # every reward is sent right after its answer: a short window keeps the rounds quick
    "reward": {"expression": sim.REWARD, "default_reward": 0.0, "window_s": 0.3},
    "mode": "shadow",
    "promotion": {"canary_share": 0.1, "min_events": 1200, "estimator": "on_policy", "level": 0.95, "tolerated_regression": 0.01},
}
CANDIDATE = "shared_lin_ucb(alpha=0.2,eps0=0.1)"
#: the offline log: the share of requests answered with a uniformly drawn configuration
EXPLORE = 0.5
#: (log lines, shadow rounds, canary rounds, requests per round, the round the model is reset, validation questions)
SIZES = {"quick": (3000, 1, 14, 600, 4, 300), "full": (6000, 2, 24, 500, 9, 600)}


def main(argv: list[str] | None = None) -> int:
    args = example_arguments(argv, description=__doc__.splitlines()[0], seed=1, out=HERE / "out")
    console = Console()
    n_log, n_shadow, n_canary, per_round, reset_round, n_valid = SIZES["quick" if args.quick else "full"]
    started = time.monotonic()
    os.environ.pop(FLAG, None)  # the domain starts as configured: shadow

    # 1. the log the service kept before the tuner
    log_path = args.out / "log.jsonl"
    truth = write_log(log_path, n_log, args.seed, start_ms=int(time.time() * 1000) - 86_400_000)
    console.print(f"[bold]1.[/] {log_path}: {n_log:,} answered questions, {EXPLORE:.0%} with a configuration drawn from "
                  f"their slate of {SLATE}", highlight=False)  # fmt: skip

    # 2. offline: does the tuner beat the hand-set configuration on the log?
    offline = evaluate_offline(log_path, truth, args.seed)
    console.print("[bold]2.[/] offline, from the log")
    console.print(offline_table(offline))
    console.print(f"   {offline['reason']}: the tuner goes [bold]{offline['decision']}[/]", highlight=False)
    if offline["decision"] != "on":
        console.print("[red]the tuner does not go on; nothing more to do[/]")
        return 1

    valid_rng = np.random.default_rng(args.seed + 7)
    validation = [(q, sim.slate(valid_rng, SLATE)) for q in sim.questions(n_valid, valid_rng)]
    traffic = np.random.default_rng(args.seed + 3)
    judge = np.random.default_rng(args.seed + 5)
    rounds: list[dict] = []
    releases: list[dict] = []
    shadow_rounds: list[dict] = []
    with Playground({DOMAIN: CONFIG}, seed=args.seed, console=console, workdir=args.workdir) as loop:
        # 3. the warm start: the log replayed and learned, released to stable by hand
        replayed = loop.replay(DOMAIN, log_path)
        loop.learn()
        stable = loop.release(DOMAIN)
        releases.append(release(loop, "warm start (offline)", validation, rounds=0))
        console.print(f"[bold]3.[/] replayed {len(replayed.decisions):,} decisions; the warm start {stable} released to stable",
                      highlight=False)  # fmt: skip

        # 4. shadow: the hand-set configuration answers; the tuner's pick is answered on a mirror
        for r in loop.rounds(n_shadow, "shadow rounds"):
            shadow_rounds.append(play_shadow(loop, traffic, judge, per_round))
            loop.learn()
        s = pooled(shadow_rounds)
        console.print(f"[bold]4.[/] shadow, {n_shadow * per_round:,} questions: {s['changed_for_users']} answers changed for "
                      f"users; on their mirrors the tuner's picks earn {s['mirror_reward']:.3f} against the hand-set "
                      f"{s['prod_reward']:.3f} (F {s['mirror_f']:.3f}, R {s['mirror_r']:.3f}, p95 {s['mirror_p95_ms']:.0f} ms)",
                      highlight=False)  # fmt: skip

        # 5. canary: live, 10% on the canary, the gate after every round, a reset halfway
        os.environ[FLAG] = "1"
        console.print(f"[bold]5.[/] live ({FLAG}=1): {CONFIG['promotion']['canary_share']:.0%} of requests on the canary; "
                      "the gate judges it after every round")  # fmt: skip
        for r in loop.rounds(n_canary, "canary rounds"):
            reset = None
            if r == reset_round:
                reset = loop.reset(DOMAIN)
                console.print(f"   round {r + 1}: an operator resets the model: {reset} (the priors) goes to the canary",
                              highlight=False)  # fmt: skip
            played = play_live(loop, traffic, judge, per_round)
            loop.learn()
            verdict = loop.gate(DOMAIN)
            played.update(round=r + 1, reset=reset, verdict=verdict_dict(verdict))
            rounds.append(played)
            if verdict.action in ("promote", "rollback"):
                console.print(f"   round {r + 1}: {verdict.action} — {verdict.reason}", highlight=False)
            if verdict.action == "promote":
                releases.append(release(loop, f"release {len(releases)} (round {r + 1})", validation, rounds=r + 1))
        os.environ.pop(FLAG, None)

    summary = summarise(args, offline, shadow_rounds, rounds, releases, validation, n_log, per_round, reset_round)
    console.print(rounds_table(summary))
    console.print(releases_table(summary))
    path = args.out / "rag_autotuner.png"
    plot(summary, path)
    return write_summary(summary, args, console, plot=path, started=started)


# -- 1. the log --------------------------------------------------------------------------


def write_log(path: Path, n: int, seed: int, *, start_ms: int) -> dict[str, float]:
    """The service's history as a JSONL interaction log; returns event id -> the expected
    reward of every logged request's hand-set configuration and of its slate (for the truth)."""
    rng = np.random.default_rng(seed)
    truth: dict[str, dict] = {}
    with open(path, "w", encoding="utf-8") as f:
        for i, question in enumerate(sim.questions(n, rng)):
            offered = sim.slate(rng, SLATE)
            probabilities = [EXPLORE / SLATE + (1.0 - EXPLORE if j == 0 else 0.0) for j in range(SLATE)]
            chosen = offered[int(rng.choice(SLATE, p=probabilities))]
            answer = sim.answer(question, chosen, rng, upgraded=False)  # before the embedding upgrade
            iid = f"log-{i:05d}"
            truth[iid] = {c.id: sim.expected_reward(question, c, upgraded=False) for c in offered}
            f.write(json.dumps({"interaction_id": iid, "timestamp": start_ms + i, "context": question.context(),
                                "actions": [c.action() for c in offered], "probabilities": probabilities,
                                "agent": chosen.id, "reward": round(answer.reward, 6)}) + "\n")  # fmt: skip
    return truth


# -- 2. offline ----------------------------------------------------------------------------


class Kept(Candidate):
    """A candidate that keeps the distribution it was scored with, for its truth on the log."""

    def __init__(self, candidate: Candidate) -> None:
        self.candidate, self.name, self.dist = candidate, candidate.name, None

    def check(self, log) -> None:
        self.candidate.check(log)

    def action_dist(self, log, progress=None) -> np.ndarray:
        self.dist = self.candidate.action_dist(log, progress)
        return self.dist


def evaluate_offline(log_path: Path, truth: dict[str, dict], seed: int) -> dict:
    """SNIPS and DR with 95% intervals of the hand-set configuration and of the tuner trained
    progressively on the log (no row scored by a model that learned from it), each one's true
    value on the logged questions, and the decision: on when the tuner's SNIPS lower bound beats
    the hand-set configuration's SNIPS estimate."""
    settings = DomainSettings.model_validate({**CONFIG, "params": {**CONFIG["params"], "seed": seed}})
    log = load_log(str(log_path), domain=DOMAIN, domain_settings=settings)
    candidates = [Kept(AlwaysArm(sim.PROD.id)), *(Kept(c) for c in parse_candidates(CANDIDATE, snapshots=None,
                                                                                    batch_size=100, seed=seed))]  # fmt: skip
    run = evaluate_candidates(log, candidates, estimators=("snips", "dr"), seed=seed)
    values = np.zeros((len(log), log.n_actions))
    for i, event_id in enumerate(log.event_id):
        for k in np.flatnonzero(log.candidates[i]):
            values[i, k] = truth[event_id][log.actions[k]]
    rows = {}
    for candidate, result in zip(candidates, run.results):
        label = "hand-set" if isinstance(candidate.candidate, AlwaysArm) else "tuner"
        rows[label] = {"truth": round(float((candidate.dist * values).sum(axis=1).mean()), 4),
                       **{name: {"value": round(e.estimate, 4), "low": round(e.lower, 4), "high": round(e.upper, 4),
                                 "ess": round(e.ess, 1)} for name, e in result.estimates.items()}}  # fmt: skip
    tuner, prod = rows["tuner"]["snips"], rows["hand-set"]["snips"]
    on = tuner["low"] > prod["value"]
    reason = (f"the tuner's SNIPS lower bound {tuner['low']:.4f} is {'above' if on else 'NOT above'} the hand-set "
              f"configuration's {prod['value']:.4f}")  # fmt: skip
    return {"rows": len(log), "candidate": CANDIDATE, "candidates": rows, "log_mean_reward": round(run.on_policy_value, 4),
            "decision": "on" if on else "off", "reason": reason}  # fmt: skip


def offline_table(offline: dict) -> Table:
    table = estimates_table(f"offline, from {offline['rows']:,} logged questions (expected reward per question)",
                            offline["candidates"], ("snips", "dr"))  # fmt: skip
    table.caption = f"the tuner: {offline['candidate']}, in batches of 100; the log's mean reward {offline['log_mean_reward']:.4f}"
    return table


# -- 4. and 5. rounds ----------------------------------------------------------------------


def request(loop: Playground, question: sim.Question, offered: list[sim.Config]):
    return loop.decide(DOMAIN, question.context(), [c.action() for c in offered])


def play_shadow(loop: Playground, traffic, judge, n: int) -> dict:
    """One round in shadow: the hand-set configuration answers and is rewarded; the tuner's
    recommendation is answered on a mirrored copy and judged (never shown)."""
    out = {"n": n, "changed_for_users": 0, "prod": [], "mirror": []}
    for question in sim.questions(n, traffic):
        offered = sim.slate(traffic, SLATE)
        decision = request(loop, question, offered)
        acted = sim.BY_ID[decision.action]
        out["changed_for_users"] += acted != sim.PROD
        shown = sim.answer(question, acted, judge)
        loop.reward(DOMAIN, decision, shown.signals())
        out["prod"].append((shown, sim.expected_reward(question, acted)))
        mirror = sim.BY_ID[decision.recommended]
        out["mirror"].append((sim.answer(question, mirror, judge), sim.expected_reward(question, mirror)))
    return out


def play_live(loop: Playground, traffic, judge, n: int) -> dict:
    """One live round: every request decided by the SDK (stable or canary), answered, rewarded."""
    decider = loop.decider(DOMAIN)
    out = {"stable": decider.policy_version, "canary": decider.canary_version, "answers": [], "expected": [], "channel": [],
           "prod_expected": [], "oracle_expected": []}  # fmt: skip
    for question in sim.questions(n, traffic):
        offered = sim.slate(traffic, SLATE)
        decision = request(loop, question, offered)
        acted = sim.BY_ID[decision.action]
        shown = sim.answer(question, acted, judge)
        loop.reward(DOMAIN, decision, shown.signals())
        out["answers"].append(shown)
        out["expected"].append(sim.expected_reward(question, acted))
        out["channel"].append(decision.channel)
        out["prod_expected"].append(sim.expected_reward(question, sim.PROD))
        out["oracle_expected"].append(max(sim.expected_reward(question, c) for c in offered))
    return out


def verdict_dict(verdict) -> dict:
    d = {"action": verdict.action, "reason": verdict.reason, "stable": verdict.stable_version, "canary": verdict.canary_version,
         "rows": verdict.rows, "canary_rows": verdict.canary_rows}  # fmt: skip
    for name in ("stable", "canary"):
        e = getattr(verdict, name)
        if e is not None:
            d[f"{name}_estimate"] = [round(e.estimate, 4), round(e.lower, 4), round(e.upper, 4)]
    return d


# -- 6. releases on the validation slice ----------------------------------------------------


def release(loop: Playground, label: str, validation, *, rounds: int) -> dict:
    """The stable snapshot's exact distribution on every validation question, and what it
    costs and earns there in expectation."""
    active = loop.decider(DOMAIN).active_policy
    rng = np.random.default_rng(0)
    cost = quality = value = 0.0
    for question, offered in validation:
        X = active.encoder.action_matrix(_context(question), [_action(c) for c in offered])
        p = active.policy.probabilities(X, [c.id for c in offered], rng).probabilities
        for weight, config in zip(p, offered):
            f, r = sim.quality(question, config)
            cost += weight * config.cost_usd
            quality += weight * (f + r) / 2
            value += weight * sim.expected_reward(question, config)
    n = len(validation)
    return {"label": label, "version": active.version, "after_round": rounds, "cost_usd": round(cost / n, 6),
            "quality": round(quality / n, 4), "reward": round(value / n, 4)}  # fmt: skip


def _context(question: sim.Question) -> dict:
    return {"numeric": {"words": float(question.words)}, "categorical": {"category": question.category}, "vector": []}


def _action(config: sim.Config) -> dict:
    numeric, categorical = {}, {}
    for name, value in config.features().items():
        if isinstance(value, bool):
            categorical[name] = "true" if value else "false"
        elif isinstance(value, str):
            categorical[name] = value
        else:
            numeric[name] = float(value)
    return {"id": config.id, "features": {"numeric": numeric, "categorical": categorical, "vector": []}}


def fixed_point(validation, choose) -> dict:
    """Cost, quality and reward on the validation slice of a rule ``choose(question, offered) -> config``."""
    picks = [(q, choose(q, offered)) for q, offered in validation]
    return {"cost_usd": round(float(np.mean([c.cost_usd for _, c in picks])), 6),
            "quality": round(float(np.mean([sum(sim.quality(q, c)) / 2 for q, c in picks])), 4),
            "reward": round(float(np.mean([sim.expected_reward(q, c) for q, c in picks])), 4)}  # fmt: skip


def frontier(validation, weights=np.linspace(0.0, 0.6, 25)) -> list[dict]:
    """The true cost-quality frontier of the slates: for each price of cost, every question's
    best configuration by quality less that price times its normalised cost."""
    out = []
    for w in weights:
        out.append(fixed_point(validation, lambda q, offered, w=w: max(
            offered, key=lambda c: sum(sim.quality(q, c)) / 2 - w * c.cost_usd / sim.COST_SCALE_USD)))  # fmt: skip
    return sorted(out, key=lambda p: p["cost_usd"])


def frontier_gap(point: dict, front: list[dict]) -> float:
    """How far below the frontier ``point`` is: the frontier's quality at its cost (interpolated) less its own."""
    costs = [p["cost_usd"] for p in front]
    return round(float(np.interp(point["cost_usd"], costs, [p["quality"] for p in front])) - point["quality"], 4)


# -- summary -------------------------------------------------------------------------------


def gates(answers: list[sim.Answer]) -> dict:
    f = float(np.mean([a.faithfulness for a in answers]))
    r = float(np.mean([a.relevancy for a in answers]))
    p95 = float(np.percentile([a.latency_ms for a in answers], 95))
    return {"faithfulness": round(f, 4), "relevancy": round(r, 4), "p95_latency_ms": round(p95, 1),
            "held": f >= sim.QUALITY_FLOOR and r >= sim.QUALITY_FLOOR and p95 <= sim.P95_BUDGET_MS}  # fmt: skip


def pooled(shadow_rounds: list[dict]) -> dict:
    prod = [a for s in shadow_rounds for a in s["prod"]]
    mirror = [a for s in shadow_rounds for a in s["mirror"]]
    g = gates([a for a, _ in mirror])
    return {"questions": len(prod), "changed_for_users": sum(s["changed_for_users"] for s in shadow_rounds),
            "prod_reward": round(float(np.mean([e for _, e in prod])), 4), "mirror_reward": round(float(np.mean([e for _, e in mirror])), 4),
            "mirror_f": g["faithfulness"], "mirror_r": g["relevancy"], "mirror_p95_ms": g["p95_latency_ms"], "mirror_gates_held": g["held"],
            "prod_gates": gates([a for a, _ in prod])}  # fmt: skip


def summarise(args, offline, shadow_rounds, rounds, releases, validation, n_log, per_round, reset_round) -> dict:
    front = frontier(validation)
    prod = fixed_point(validation, lambda q, offered: sim.PROD)
    for point in (*releases, prod):
        point["frontier_gap"] = frontier_gap(point, front)
    live_rounds = []
    for r in rounds:
        canary = [a for a, ch in zip(r["answers"], r["channel"]) if ch == "canary"]
        live_rounds.append({"round": r["round"], "stable": r["stable"], "canary": r["canary"], "reset": r["reset"],
                            "reward": round(float(np.mean(r["expected"])), 4), "prod": round(float(np.mean(r["prod_expected"])), 4),
                            "oracle": round(float(np.mean(r["oracle_expected"])), 4),
                            "canary_share": round(len(canary) / len(r["answers"]), 3),
                            "canary_reward": round(float(np.mean([e for e, ch in zip(r["expected"], r["channel"]) if ch == "canary"])), 4)
                            if canary else None,
                            "gates": gates(r["answers"]), "verdict": r["verdict"]})  # fmt: skip
    verdicts = [r["verdict"]["action"] for r in live_rounds]
    reset_at = next((r["round"] for r in live_rounds if r["reset"]), None)
    rolled = [r["round"] for r in live_rounds if r["verdict"]["action"] == "rollback" and reset_at and r["round"] >= reset_at]
    reset_version = next((r["reset"] for r in live_rounds if r["reset"]), None)
    return {
        "seed": args.seed, "quick": args.quick, "log_rows": n_log, "per_round": per_round, "slate": SLATE,
        "offline": offline, "shadow": pooled(shadow_rounds), "rounds": live_rounds, "releases": releases,
        "hand_set": prod, "frontier": front,
        "live": {"reward": round(float(np.mean([r["reward"] for r in live_rounds])), 4),
                 "prod": round(float(np.mean([r["prod"] for r in live_rounds])), 4),
                 "oracle": round(float(np.mean([r["oracle"] for r in live_rounds])), 4)},
        "claims": {
            "promotions": verdicts.count("promote"), "rollbacks": verdicts.count("rollback"),
            "reset_round": reset_at, "reset_version": reset_version, "reset_rolled_back_at": rolled[0] if rolled else None,
            "reset_never_stable": all(r["stable"] != reset_version for r in live_rounds),
            "gates_held_every_live_round": all(r["gates"]["held"] for r in live_rounds),
            "shadow_changed_nothing": pooled(shadow_rounds)["changed_for_users"] == 0,
        },
    }  # fmt: skip


def rounds_table(summary: dict) -> Table:
    table = Table(title=f"live, {len(summary['rounds'])} rounds of {summary['per_round']} questions (expected reward)")
    for column in ("round", "stable", "canary", "reward", "hand-set", "oracle", "canary\nreward", "F", "R", "p95 ms", "gate"):
        table.add_column(column, justify="left" if column in ("stable", "canary", "gate") else "right")
    for r in summary["rounds"]:
        g = r["gates"]
        canary = f"{r['canary']} (reset)" if r["reset"] else r["canary"] or "-"
        verdict = r["verdict"]["action"]
        style = {"promote": "[green]", "rollback": "[red]"}.get(verdict, "")
        table.add_row(str(r["round"]), r["stable"], canary, f"{r['reward']:.3f}", f"{r['prod']:.3f}", f"{r['oracle']:.3f}",
                      f"{r['canary_reward']:.3f}" if r["canary_reward"] is not None else "-", f"{g['faithfulness']:.3f}",
                      f"{g['relevancy']:.3f}", f"{g['p95_latency_ms']:.0f}", f"{style}{verdict}")  # fmt: skip
    c = summary["claims"]
    table.caption = (f"gates (F, R ≥ {sim.QUALITY_FLOOR}, p95 ≤ {sim.P95_BUDGET_MS:.0f} ms) held in every live round: "
                     f"{'yes' if c['gates_held_every_live_round'] else 'NO'}; promotions {c['promotions']}, rollbacks "
                     f"{c['rollbacks']}")  # fmt: skip
    return table


def releases_table(summary: dict) -> Table:
    table = Table(title=f"releases on the validation slice ({len(summary['frontier'])}-point true frontier)")
    for column in ("release", "version", "cost $/answer", "quality (F+R)/2", "below frontier", "reward"):
        table.add_column(column, justify="left" if column in ("release", "version") else "right")
    for p in (dict(summary["hand_set"], label="hand-set configuration", version="-"), *summary["releases"]):
        table.add_row(p["label"], p["version"], f"{p['cost_usd']:.5f}", f"{p['quality']:.4f}", f"{p['frontier_gap']:.4f}",
                      f"{p['reward']:.4f}")  # fmt: skip
    return table


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rounds, ax_front) = plt.subplots(1, 2, figsize=(15, 6.2))
    rounds = summary["rounds"]
    x = [r["round"] for r in rounds]
    ax_rounds.plot(x, [r["reward"] for r in rounds], "-o", color="C0", label="live (stable + canary)")
    ax_rounds.plot(x, [r["canary_reward"] if r["canary_reward"] is not None else math.nan for r in rounds], "^", color="C1",
                   label="canary's requests")  # fmt: skip
    ax_rounds.plot(x, [r["prod"] for r in rounds], "--", color="grey", label="hand-set configuration, same questions")
    ax_rounds.plot(x, [r["oracle"] for r in rounds], ":", color="black", label="oracle (best in each slate)")
    top = ax_rounds.get_xaxis_transform()  # x in data, y in axes fraction
    for r in rounds:
        action = r["verdict"]["action"]
        if action in ("promote", "rollback"):
            ax_rounds.axvline(r["round"], color="C2" if action == "promote" else "C3", alpha=0.5)
            ax_rounds.annotate(f"{action}\n{r['verdict']['canary']}", (r["round"], 0.97), xycoords=top, fontsize=8,
                               ha="right", va="top")  # fmt: skip
        if r["reset"]:
            ax_rounds.axvline(r["round"], color="C3", linestyle="--", alpha=0.5)
            ax_rounds.annotate(f"reset to priors\n{r['reset']} to the canary", (r["round"], 0.97), xycoords=top, fontsize=8,
                               ha="right", va="top")  # fmt: skip
    ax_rounds.set(xlabel="live round", ylabel="expected reward per question", title="canary rounds: the gate's verdicts")
    ax_rounds.set_ylim(top=ax_rounds.get_ylim()[1] + 0.03)
    ax_rounds.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    front = summary["frontier"]
    ax_front.plot([p["cost_usd"] for p in front], [p["quality"] for p in front], "-", color="black", alpha=0.6,
                  label="true frontier (best per slate at each price of cost)")  # fmt: skip
    hand = summary["hand_set"]
    ax_front.plot(hand["cost_usd"], hand["quality"], "s", color="grey", markersize=9, label="hand-set configuration")
    releases = summary["releases"]
    colors = plt.cm.viridis(np.linspace(0.1, 0.9, len(releases)))
    for p, color in zip(releases, colors):
        ax_front.plot(p["cost_usd"], p["quality"], "o", color=color, markersize=9, label=f"{p['label']}: {p['version']}")
    ax_front.plot([p["cost_usd"] for p in releases], [p["quality"] for p in releases], "-", color="C0", alpha=0.4)
    ax_front.axhline(sim.QUALITY_FLOOR, color="C3", linestyle=":", label=f"quality gate {sim.QUALITY_FLOOR}")
    ax_front.set(xlabel="cost per answer ($)", ylabel="quality (F + R) / 2", title="cost-quality, per release (validation slice)")
    ax_front.set_ylim(min(hand["quality"], sim.QUALITY_FLOOR) - 0.02, None)
    ax_front.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
