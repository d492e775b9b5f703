"""The model adaptation loop (seed 004) on banditstream: evaluate agents offline from the
reward log, warm-start a router over them from it, and compare it live with a cold start.

    python examples/adaptation_loop/run.py [--quick] [--seed 4] [--out DIR] [--json PATH]

Four steps, every one through the real stack (see README.md here):

1. the assistant's ``reward_log.jsonl`` (a legacy router that picked agents uniformly);
2. offline evaluation of each agent, of uniform routing and of the router banditstream would
   run, from that log (SNIPS and DR, 95% intervals) against the simulator's truth;
3. the embedded broker, join, learner and publisher; the log replayed into ``router_warm``;
   ``router_cold`` starts from nothing; both route the same live questions, in rounds, each
   round decided by the SDK with the last verified snapshot;
4. the leaderboard (``banditstream stats``) of the warm router's live traffic, a summary
   table, a PNG and, with ``--json``, the figures.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import assistant
from banditstream.evaluate import load_log, parse_candidates
from banditstream.playground import Playground, example_arguments, write_summary
from banditstream.stats import leaderboard
from banditstream.stats import table as leaderboard_table
from learner.domain import DomainSettings
from learner.evaluation.run import evaluate_candidates

HERE = Path(__file__).parent
#: Both routers: the default policy (a portfolio of lin_igw and lin_igw forgetting) over the
#: question's category, length and top_k; the judged score is the reward, 0 when none comes.
ROUTER = {"features": {"dimension": 64}, "reward": {"expression": "value", "default_reward": 0.0}}
DOMAINS = ("router_cold", "router_warm")
#: (log lines, live rounds, questions per round)
SIZES = {"quick": (1500, 4, 150), "full": (6000, 12, 400)}


def main(argv: list[str] | None = None) -> int:
    args = example_arguments(argv, description=__doc__.splitlines()[0], seed=4, out=HERE / "out")
    console = Console()
    n_log, n_rounds, per_round = SIZES["quick" if args.quick else "full"]
    started = time.monotonic()

    # 1. the log the assistant kept before banditstream
    log_path = args.out / "reward_log.jsonl"
    history = assistant.write_reward_log(log_path, n_log, seed=args.seed, start_ms=int(time.time() * 1000) - 86_400_000)
    console.print(f"[bold]1.[/] {log_path}: {n_log:,} interactions of the legacy router (uniform over {len(assistant.AGENTS)} agents)")

    # 2. offline evaluation from that log
    offline = evaluate_offline(log_path, history, args.seed)
    console.print("[bold]2.[/] offline evaluation from the log")
    console.print(offline_table(offline))

    # 3. live: warm start vs cold start, through the whole loop
    console.print("[bold]3.[/] the loop: embedded broker, join, learner, publisher; the log replayed into router_warm")
    live = {name: {"chosen": [], "expected": [], "oracle": [], "uniform": [], "best_agent": []} for name in DOMAINS}
    with Playground({name: ROUTER for name in DOMAINS}, seed=args.seed, console=console, workdir=args.workdir) as loop:
        replayed = loop.replay("router_warm", log_path, actions=assistant.AGENTS)
        loop.learn()
        console.print(f"   replayed {len(replayed.decisions):,} decisions and {len(replayed.rewards):,} rewards; "
                      f"router_warm now decides with snapshot {loop.decider('router_warm').policy_version}")
        live_since = int(time.time() * 1000) - 10_000
        questions = np.random.default_rng(args.seed + 1)
        judges = {name: np.random.default_rng(args.seed + 2 + i) for i, name in enumerate(DOMAINS)}
        best_overall = int(np.argmax(np.mean([assistant.means(q) for q in history], axis=0)))
        for r in loop.rounds(n_rounds, "live rounds"):
            for j in range(per_round):
                q = assistant.ask(questions, f"live-{r:03d}-{j:04d}")
                truth = assistant.means(q)
                for name in DOMAINS:
                    decision = loop.decide(name, q.context(), assistant.AGENTS, event_id=f"{name}-{q.interaction_id}")
                    loop.reward(name, decision, assistant.judge(judges[name], q, decision.action))
                    figures = live[name]
                    figures["chosen"].append((q.category, decision.action, r))
                    figures["expected"].append(float(truth[decision.index]))
                    figures["oracle"].append(float(truth.max()))
                    figures["uniform"].append(float(truth.mean()))
                    figures["best_agent"].append(float(truth[best_overall]))
            loop.learn()
        held = loop.decider("router_warm").active_policy
        board = leaderboard(loop.updates("router_warm"), tenant="default", workspace="main", domain="router_warm",
                            since_ms=live_since, policy=held.policy, snapshot_version=held.version)  # fmt: skip
        versions = {name: loop.decider(name).policy_version for name in DOMAINS}
    console.print("[bold]4.[/] the warm router's live leaderboard (banditstream stats)")
    console.print(leaderboard_table(board))

    summary = summarise(live, offline, n_rounds, per_round, args, versions, board)
    console.print(summary_table(summary))
    plot(live, offline, n_rounds, args.out / "adaptation_loop.png")
    return write_summary(summary, args, console, plot=args.out / "adaptation_loop.png", started=started)


def evaluate_offline(log_path: Path, history: list[assistant.Question], seed: int) -> dict:
    """Each agent, uniform routing and the router's policy (trained progressively on the log,
    no row scored by a model that learned from it), estimated from the log with SNIPS and DR;
    each fixed candidate's true value from the simulator."""
    settings = DomainSettings.model_validate(ROUTER)
    log = load_log(str(log_path), domain="router", domain_settings=settings)
    specs = [f"always:{agent}" for agent in assistant.AGENTS] + ["uniform", "lin_igw()"]
    run = evaluate_candidates(log, parse_candidates(",".join(specs), snapshots=None, seed=seed),
                              estimators=("snips", "dr"), seed=seed)  # fmt: skip
    by_id = {q.interaction_id: assistant.means(q) for q in history}
    truth_rows = np.array([by_id[event_id] for event_id in log.event_id])
    truth = {f"always:{agent}": float(truth_rows[:, k].mean()) for k, agent in enumerate(assistant.AGENTS)}
    truth["uniform"] = float(truth_rows.mean())
    rows = {}
    for result in run.results:
        rows[result.name] = {
            "truth": truth.get(result.name),
            **{name: {"value": e.estimate, "low": e.lower, "high": e.upper} for name, e in result.estimates.items()},
        }
    return {"rows": len(log), "candidates": rows}


def offline_table(offline: dict) -> Table:
    table = Table(title=f"offline, from {offline['rows']:,} logged interactions (95% intervals)")
    for column in ("candidate", "SNIPS", "DR", "truth", "DR covers truth"):
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for name, row in offline["candidates"].items():
        truth = row["truth"]
        covers = "-" if truth is None else "yes" if row["dr"]["low"] <= truth <= row["dr"]["high"] else "NO"
        table.add_row(name, *(f"{row[e]['value']:.3f} [{row[e]['low']:.3f}, {row[e]['high']:.3f}]" for e in ("snips", "dr")),
                      "-" if truth is None else f"{truth:.3f}", covers)  # fmt: skip
    return table


def summarise(live: dict, offline: dict, n_rounds: int, per_round: int, args, versions: dict, board) -> dict:
    first = slice(0, per_round)  # the first round: decided with the snapshot each router started with
    out: dict = {"seed": args.seed, "quick": args.quick, "rounds": n_rounds, "per_round": per_round, "routers": {},
                 # what depends on the machine's timing (how many snapshots were published between
                 # rounds), not on the seed: everything else is the same on every run of a seed
                 "timing_dependent": ["routers.*.snapshot", "leaderboard snapshot version", "seconds"]}
    for name, figures in live.items():
        expected = np.array(figures["expected"])
        out["routers"][name] = {
            "snapshot": versions[name],
            "first_round_reward": round(float(expected[first].mean()), 4),
            "last_round_reward": round(float(expected[-per_round:].mean()), 4),
            "mean_reward": round(float(expected.mean()), 4),
            "regret": round(float(np.sum(np.subtract(figures["oracle"], expected))), 2),
        }
    any_router = live[DOMAINS[0]]
    out["oracle_reward"] = round(float(np.mean(any_router["oracle"])), 4)
    out["uniform_reward"] = round(float(np.mean(any_router["uniform"])), 4)
    out["best_single_agent_reward"] = round(float(np.mean(any_router["best_agent"])), 4)
    warm, cold = out["routers"]["router_warm"], out["routers"]["router_cold"]
    out["warm_start_first_round_gain"] = round(warm["first_round_reward"] - cold["first_round_reward"], 4)
    covered = [name for name, row in offline["candidates"].items()
               if row["truth"] is not None and row["dr"]["low"] <= row["truth"] <= row["dr"]["high"]]  # fmt: skip
    fixed = [name for name, row in offline["candidates"].items() if row["truth"] is not None]
    out["offline"] = offline
    out["offline_dr_covers_truth"] = f"{len(covered)}/{len(fixed)}"
    truth_best = max(fixed, key=lambda name: offline["candidates"][name]["truth"])
    dr_best = max(fixed, key=lambda name: offline["candidates"][name]["dr"]["value"])
    out["offline_picks_the_best_agent"] = truth_best == dr_best
    out["leaderboard"] = [{"arm": a.arm, "share": round(a.share, 3), "mean_reward": round(a.mean_reward, 4)} for a in board.arms]
    return out


def summary_table(summary: dict) -> Table:
    table = Table(title=f"live: {summary['rounds']} rounds of {summary['per_round']} questions (expected judged score)")
    for column in ("router", "first round", "last round", "whole run", "regret"):
        table.add_column(column, justify="left" if column == "router" else "right")
    for name, row in summary["routers"].items():
        table.add_row(name, f"{row['first_round_reward']:.3f}", f"{row['last_round_reward']:.3f}",
                      f"{row['mean_reward']:.3f}", f"{row['regret']:.1f}")  # fmt: skip
    for label, key in (("best single agent", "best_single_agent_reward"), ("uniform", "uniform_reward"),
                       ("oracle", "oracle_reward")):  # fmt: skip
        table.add_row(label, "", "", f"{summary[key]:.3f}", "")
    return table


def plot(live: dict, offline: dict, n_rounds: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve, forest, shares) = plt.subplots(1, 3, figsize=(16, 4.8))
    for name, style in (("router_warm", "-o"), ("router_cold", "-s")):
        per_round = np.array(live[name]["expected"]).reshape(n_rounds, -1).mean(axis=1)
        curve.plot(range(1, n_rounds + 1), per_round, style, label=name)
    for key, label, style in (("oracle", "oracle", ":"), ("best_agent", "best single agent", "--"), ("uniform", "uniform", "-.")):
        curve.axhline(np.mean(live["router_cold"][key]), linestyle=style, color="grey", label=label)
    curve.set(xlabel="live round", ylabel="mean expected judged score", title="warm start vs cold start")
    curve.set_xticks(range(1, n_rounds + 1))
    curve.legend(fontsize=8)
    names = list(offline["candidates"])
    for i, name in enumerate(names):
        row = offline["candidates"][name]
        dr = row["dr"]
        forest.errorbar(dr["value"], i, xerr=[[dr["value"] - dr["low"]], [dr["high"] - dr["value"]]], fmt="o", color="C0")
        if row["truth"] is not None:
            forest.plot(row["truth"], i, "x", color="C3")
    forest.set_yticks(range(len(names)), names)
    forest.set(xlabel="DR estimate, 95% interval (x: truth)", title="offline, from reward_log.jsonl")
    chosen = live["router_warm"]["chosen"]
    last = [(c, a) for c, a, r in chosen if r == n_rounds - 1]
    bottom = np.zeros(len(assistant.CATEGORIES))
    for agent in assistant.AGENTS:
        counts = np.array([sum(1 for c, a in last if c == cat and a == agent) for cat in assistant.CATEGORIES], float)
        totals = np.array([max(1, sum(1 for c, _ in last if c == cat)) for cat in assistant.CATEGORIES], float)
        shares.bar(assistant.CATEGORIES, counts / totals, bottom=bottom, label=agent)
        bottom += counts / totals
    shares.set(ylabel="share of questions", title="router_warm, last round: agent per category")
    shares.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
