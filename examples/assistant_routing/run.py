"""The assistant's routing (seed 003) on banditstream: evaluate a contextual router offline
from the old router's log, deploy it warm-started from that log beside a tool bandit and a
cache bandit, check the loop's health, and compare the offline estimate with what it earned.

    python examples/assistant_routing/run.py [--quick] [--seed 3] [--out DIR] [--json PATH]

Five steps, every one through the real stack (see README.md here):

1. the assistant's ``reward_log.jsonl``: its old router picked the fast or the deep model path
   uniformly at random, and logged the probability;
2. before deploying: IPS and SNIPS estimates, with 95% intervals, of the router it would run
   (``lin_ucb``, trained progressively on the log), of each fixed path and of uniform routing,
   against the simulator's truth;
3. the embedded broker, join, learner and publisher; the log replayed into ``route``; then
   live rounds of ``route`` (LinUCB), ``tools`` (linear Thompson sampling over the intent) and
   ``cache`` (ε-greedy), each round decided by the SDK with the last verified snapshot;
4. ``banditstream monitor``'s check of the loop: its tables and its alerts;
5. a summary table, a PNG and, with ``--json``, the figures.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import assistant
from banditstream.evaluate import load_log, parse_candidates
from banditstream.monitor import Thresholds, alert_lines, check, tables
from banditstream.playground import Playground, estimates_table, example_arguments, write_summary
from learner.domain import DomainSettings
from learner.evaluation.run import evaluate_candidates

HERE = Path(__file__).parent
#: One reward for the three: the judged quality less 0.1 per second and 10 per dollar, from
#: the signals the SDK sends with each reward.
REWARD = {"expression": assistant.REWARD, "default_reward": 0.0}
DOMAINS = {
    # per-arm ridge regressions over 11 hashed features (64 slots: no two collide), the text
    # length and the confidence z-scored with the running statistics the join keeps
    "route": {"policy": "lin_ucb", "params": {"alpha": 1.0}, "features": {"dimension": 64, "normalize": True},
              "reward": REWARD},
    # one Gaussian posterior per tool over the intent alone; prior mean 0.5, near a typical
    # reward, so a tool not tried yet is worth trying
    "tools": {"policy": "lin_ts", "params": {"v": 0.3, "prior_mean": 0.5}, "features": {"dimension": 16},
              "reward": REWARD},
    # context-free; exploration that decays with the rows learned
    "cache": {"policy": "epsilon_greedy", "params": {"eps_start": 0.3, "decay": 0.998, "eps_min": 0.05, "prior_mean": 0.5},
              "features": {"dimension": 8}, "reward": REWARD},
}  # fmt: skip
ACTIONS = {"route": assistant.PATHS, "tools": assistant.TOOLS, "cache": assistant.CACHES}
#: the route candidate evaluated offline: the deployed policy, with its parameters
CANDIDATE = "{policy}({knobs})".format(policy=DOMAINS["route"]["policy"],
                                       knobs=",".join(f"{k}={v}" for k, v in DOMAINS["route"]["params"].items()))
#: progressive validation learns the log in batches of this many rows
BATCH = 50
#: (log lines, live rounds, requests per round)
SIZES = {"quick": (3000, 4, 200), "full": (8000, 8, 400)}


def main(argv: list[str] | None = None) -> int:
    args = example_arguments(argv, description=__doc__.splitlines()[0], seed=3, out=HERE / "out")
    console = Console()
    n_log, n_rounds, per_round = SIZES["quick" if args.quick else "full"]
    started = time.monotonic()

    # 1. the log the assistant kept before banditstream
    log_path = args.out / "reward_log.jsonl"
    history = assistant.write_reward_log(log_path, n_log, seed=args.seed, start_ms=int(time.time() * 1000) - 86_400_000)
    console.print(f"[bold]1.[/] {log_path}: {n_log:,} requests of the old router (uniform over fast and deep)")

    # 2. before deploying: offline evaluation from that log
    offline = evaluate_offline(log_path, history, args.seed)
    console.print("[bold]2.[/] offline evaluation of the route from the log, before deploying")
    console.print(offline_table(offline))

    # 3. deploy: the log replayed into route, then live rounds of the three domains
    console.print("[bold]3.[/] the loop: embedded broker, join, learner, publisher; the log replayed into route")
    live = {name: {"expected": [], "means": [], "chosen": []} for name in DOMAINS}
    with Playground(DOMAINS, seed=args.seed, console=console, workdir=args.workdir) as loop:
        replayed = loop.replay("route", log_path, actions=assistant.PATHS)
        loop.learn()
        console.print(f"   replayed {len(replayed.decisions):,} decisions and {len(replayed.rewards):,} rewards; "
                      f"route now decides with snapshot {loop.decider('route').policy_version}")  # fmt: skip
        requests = np.random.default_rng(args.seed + 1)
        outcomes = {name: np.random.default_rng(args.seed + 2 + i) for i, name in enumerate(DOMAINS)}
        for r in loop.rounds(n_rounds, "live rounds"):
            for j in range(per_round):
                request = assistant.request(requests, f"live-{r:03d}-{j:04d}")
                for name in DOMAINS:
                    decision = loop.decide(name, context(name, request), ACTIONS[name], event_id=f"{name}-{request.interaction_id}")
                    loop.reward(name, decision, outcome(name, outcomes[name], request, decision.action))
                    means = truth(name, request)
                    live[name]["expected"].append(float(means[decision.index]))
                    live[name]["means"].append(means)
                    live[name]["chosen"].append((request.intent, decision.action))
            loop.learn()
        versions = {name: loop.decider(name).policy_version for name in DOMAINS}

        # 4. the loop's health, as `banditstream monitor --once` reports it
        console.print("[bold]4.[/] banditstream monitor")
        report = check(loop.config(), Thresholds())
        for table in tables(report):
            console.print(table)
        for line in alert_lines(report):
            console.print(f"   {line}", highlight=False)

    summary = summarise(live, offline, report, versions, args, n_log, n_rounds, per_round)
    console.print(summary_table(summary))
    plot(live, summary, n_rounds, args.out / "assistant_routing.png")
    return write_summary(summary, args, console, plot=args.out / "assistant_routing.png", started=started)


def context(domain: str, request: assistant.Request) -> dict:
    """What each domain decides on: the route all five features, the tools the intent, the
    cache nothing."""
    return {"route": request.context(), "tools": {"intent": request.intent}, "cache": {}}[domain]


def outcome(domain: str, rng: np.random.Generator, request: assistant.Request, action: str) -> dict[str, float]:
    if domain == "route":
        return assistant.route_outcome(rng, request, action)
    if domain == "tools":
        return assistant.tool_outcome(rng, request, action)
    return assistant.cache_outcome(rng, action)


def truth(domain: str, request: assistant.Request) -> np.ndarray:
    """The expected reward of each of the domain's actions on this request."""
    if domain == "route":
        return assistant.route_means(request)
    if domain == "tools":
        return assistant.tool_means(request)
    return assistant.cache_means()


# -- 2. offline ---------------------------------------------------------------------------


def evaluate_offline(log_path: Path, history: list[assistant.Request], seed: int) -> dict:
    """Each fixed path, uniform routing and the router's policy (trained progressively on the
    log, no row scored by a model that learned from it), estimated from the log with IPS and
    SNIPS; every candidate's true value on the logged requests from the simulator."""
    settings = DomainSettings.model_validate(DOMAINS["route"])
    log = load_log(str(log_path), domain="route", domain_settings=settings)  # z-scored as the join does
    specs = [f"always:{path}" for path in assistant.PATHS] + ["uniform", CANDIDATE]
    candidates = parse_candidates(",".join(specs), snapshots=None, batch_size=BATCH, seed=seed)
    run = evaluate_candidates(log, candidates, estimators=("ips", "snips"), seed=seed)
    by_id = {r.interaction_id: assistant.route_means(r) for r in history}
    columns = [assistant.PATHS.index(action) for action in log.actions]  # the log's action order
    means = np.array([by_id[event_id] for event_id in log.event_id])[:, columns]
    rows = {}
    for candidate, result in zip(candidates, run.results):
        # every candidate's action_dist is seeded: the distribution evaluate_candidates scored
        value = float((candidate.action_dist(log) * means).sum(axis=1).mean())
        rows[result.name] = {"truth": round(value, 4),
                             **{name: {"value": round(e.estimate, 4), "low": round(e.lower, 4), "high": round(e.upper, 4)}
                                for name, e in result.estimates.items()}}  # fmt: skip
    return {"rows": len(log), "candidate": run.results[-1].name, "candidates": rows}


def offline_table(offline: dict) -> Table:
    """One row per candidate and estimator, as ``banditstream evaluate`` prints them."""
    return estimates_table(f"route, offline, from {offline['rows']:,} logged requests", offline["candidates"], ("ips", "snips"),
                           digits=3)  # fmt: skip


# -- 5. summary ---------------------------------------------------------------------------


def summarise(live, offline, report, versions, args, n_log, n_rounds, per_round) -> dict:
    out: dict = {"seed": args.seed, "quick": args.quick, "log_rows": n_log, "rounds": n_rounds, "per_round": per_round,
                 # what depends on the machine's timing (how many snapshots were published, and
                 # when), not on the seed: everything else is the same on every run of a seed
                 "timing_dependent": ["domains.*.snapshot", "monitor.domains.*.stable_version",
                                      "monitor.domains.*.stable_age_s", "seconds"]}  # fmt: skip
    out["domains"] = {name: domain_figures(name, figures, n_rounds, per_round, versions[name]) for name, figures in live.items()}
    route, tools = out["domains"]["route"], out["domains"]["tools"]
    means, taken = np.array(live["route"]["means"]), np.array(live["route"]["expected"])
    route["right_path_share"] = round(float(np.mean(taken >= means.max(axis=1))), 3)  # the truly better path taken
    last = Counter(live["route"]["chosen"][-per_round:])
    route["last_round_deep_share_per_intent"] = {
        intent: round(last[(intent, "deep")] / max(1, last[(intent, "deep")] + last[(intent, "fast")]), 3)
        for intent in assistant.INTENTS
    }
    last = Counter(live["tools"]["chosen"][-per_round:])
    tools["last_round_tool_per_intent"] = {intent: max(assistant.TOOLS, key=lambda t, i=intent: last[(i, t)])
                                           for intent in assistant.INTENTS}  # fmt: skip

    out["offline"] = offline
    row = offline["candidates"][offline["candidate"]]
    online = route["mean_reward"]
    out["route_online_vs_offline"] = {
        "candidate": offline["candidate"],
        "online_mean_reward": online,
        **{e: {**row[e], "covers_online": row[e]["low"] <= online <= row[e]["high"]} for e in ("ips", "snips")},
    }
    fixed = [row for name, row in offline["candidates"].items() if name != offline["candidate"]]
    out["offline_fixed_covered"] = {e: f"{sum(r[e]['low'] <= r['truth'] <= r[e]['high'] for r in fixed)}/{len(fixed)}"
                                    for e in ("ips", "snips")}  # fmt: skip
    out["monitor"] = {
        "alerts": [alert.name for alert in report.alerts],
        "problems": report.problems,
        "domains": {h.domain: {"decisions": h.decisions, "rewarded_share": h.rewarded_share, "default_share": h.default_share,
                               "mean_reward": None if h.mean_reward is None else round(h.mean_reward, 4),
                               "stable_version": h.stable_version,
                               "stable_age_s": None if h.stable_age_s is None else round(h.stable_age_s, 1)}
                    for h in report.domains},
        "dead_letters": report.dead_letters,
        "lag": report.lag,
    }  # fmt: skip
    return out


def domain_figures(name: str, figures: dict, n_rounds: int, per_round: int, version: str) -> dict:
    """One domain's live figures: the expected reward of what it took, per round and over the
    run, against what the assistant did before (uniform routing; the first tool and cache
    strategy), the best fixed action, uniform and the oracle, on the same requests."""
    expected, means = np.array(figures["expected"]), np.array(figures["means"])
    per = expected.reshape(n_rounds, -1).mean(axis=1)
    fixed = means.mean(axis=0)
    best = int(np.argmax(fixed))
    d = {
        "policy": DOMAINS[name]["policy"],
        "snapshot": version,
        "per_round": [round(float(v), 4) for v in per],
        "first_round_reward": round(float(per[0]), 4),
        "last_round_reward": round(float(per[-1]), 4),
        "mean_reward": round(float(expected.mean()), 4),
        "baseline": "uniform" if name == "route" else ACTIONS[name][0],
        "baseline_reward": round(float(means.mean() if name == "route" else fixed[0]), 4),
        "best_fixed": ACTIONS[name][best],
        "best_fixed_reward": round(float(fixed[best]), 4),
        "uniform_reward": round(float(means.mean()), 4),
        "oracle_reward": round(float(means.max(axis=1).mean()), 4),
        "last_round_top_action": Counter(a for _, a in figures["chosen"][-per_round:]).most_common(1)[0][0],
    }
    d["last_round_gain_over_baseline"] = round(d["last_round_reward"] - d["baseline_reward"], 4)
    d["last_round_gain_over_best_fixed"] = round(d["last_round_reward"] - d["best_fixed_reward"], 4)
    return d


POLICY_NAMES = {"lin_ucb": "LinUCB", "lin_ts": "LinTS", "epsilon_greedy": "ε-greedy"}


def summary_table(summary: dict) -> Table:
    table = Table(title=f"live: {summary['rounds']} rounds of {summary['per_round']} requests (expected reward of the action taken)")
    for column in ("domain", "policy", "first\nround", "last\nround", "whole\nrun", "baseline", "best\nfixed", "oracle"):
        table.add_column(column, justify="left" if column in ("domain", "policy") else "right")
    for name, d in summary["domains"].items():
        table.add_row(name, POLICY_NAMES[d["policy"]], f"{d['first_round_reward']:.3f}", f"{d['last_round_reward']:.3f}",
                      f"{d['mean_reward']:.3f}", f"{d['baseline_reward']:.3f}", f"{d['best_fixed_reward']:.3f}",
                      f"{d['oracle_reward']:.3f}")  # fmt: skip
    agree = summary["route_online_vs_offline"]
    domains = summary["domains"].items()
    table.caption = ("baseline: " + ", ".join(f"{name} {d['baseline']}" for name, d in domains)
                     + "; best fixed: " + ", ".join(f"{name} {d['best_fixed']}" for name, d in domains)
                     + f".\nroute online {agree['online_mean_reward']:.3f}; offline {agree['candidate']}: "
                     + ", ".join(f"{e.upper()} [{agree[e]['low']:.3f}, {agree[e]['high']:.3f}] "
                                 f"({'covers' if agree[e]['covers_online'] else 'MISSES'} it)" for e in ("ips", "snips"))
                     + f".\nmonitor alerts: {', '.join(summary['monitor']['alerts']) or 'none'}")  # fmt: skip
    return table


def plot(live: dict, summary: dict, n_rounds: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (forest, *curves) = plt.subplots(1, 4, figsize=(20, 4.6), gridspec_kw={"width_ratios": [1.3, 1, 1, 1]})
    offline = summary["offline"]["candidates"]
    names = list(offline)
    for i, name in enumerate(names):
        for shift, (estimator, color) in zip((-0.12, 0.12), (("ips", "C0"), ("snips", "C2"))):
            e = offline[name][estimator]
            forest.errorbar(e["value"], i + shift, xerr=[[e["value"] - e["low"]], [e["high"] - e["value"]]], fmt="o",
                            color=color, label=estimator.upper() if i == 0 else None)  # fmt: skip
        forest.plot(offline[name]["truth"], i, "x", color="C3", label="truth on the log" if i == 0 else None)
    online = summary["route_online_vs_offline"]["online_mean_reward"]
    forest.plot(online, names.index(summary["offline"]["candidate"]), "*", color="black", markersize=13,
                label="online: what the deployed policy earned")  # fmt: skip
    forest.set_yticks(range(len(names)), names)
    forest.set(xlabel="expected reward (95% intervals)", title="route: offline from the log vs online")
    forest.legend(fontsize=8, loc="upper left")
    x = range(1, n_rounds + 1)
    for ax, name in zip(curves, DOMAINS):
        d = summary["domains"][name]
        ax.plot(x, d["per_round"], "-o", label=f"{name} ({d['policy']})")
        means = np.array(live[name]["means"]).reshape(n_rounds, -1, len(ACTIONS[name]))
        if name == "route":
            band = summary["route_online_vs_offline"]["snips"]
            ax.axhspan(band["low"], band["high"], color="C4", alpha=0.15, label="offline SNIPS 95% interval")
            for k, action in enumerate(ACTIONS[name]):
                ax.plot(x, means[:, :, k].mean(axis=1), "--", label=f"always {action}")
        else:
            ax.plot(x, means[:, :, 0].mean(axis=1), "--", color="grey", label=f"baseline ({ACTIONS[name][0]})")
            best = ACTIONS[name].index(d["best_fixed"])
            ax.plot(x, means[:, :, best].mean(axis=1), "--", label=f"best fixed ({d['best_fixed']})")
        ax.plot(x, means.mean(axis=2).mean(axis=1), "-.", color="grey", label="uniform")
        ax.plot(x, means.max(axis=2).mean(axis=1), ":", color="black", label="oracle")
        ax.set(xlabel="live round", title=f"{name}: per round", ylabel="mean expected reward" if name == "route" else None)
        ax.set_xticks(list(x))
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
