"""The LLM interrogator (seed 000) on banditstream: a question-asking agent picks one of 50
question templates per step from its embedded conversation, with linear Thompson sampling;
gated offline before it goes on, warm-started from the old order's log, offline and live.

    python examples/interrogator/run.py [--quick] [--seed 0] [--out DIR] [--json PATH]

Five steps, every one through the real stack (see README.md here):

1. the interrogator's ``log.jsonl``: its fixed template order, made ε-random so every template
   has data, logged {state (the 256-D embedding), action, reward} with the exact probability;
2. the regression gate: SNIPS estimates, with 95% intervals, of the policy it would run
   (``lin_ts``, trained progressively on the log) and of the fixed order, from that log; the
   policy goes on only if its lower bound is no worse than the fixed order's estimate less 5%;
3. offline: the policy learned in-process from the log (``local_policy``) decides for an SDK
   that holds no snapshot (its repository is empty), against the fixed order on the same tasks;
4. live: the embedded broker, join, learner and publisher; the log replayed; then rounds of
   interrogations, every step decided by the SDK with the last verified snapshot, against the
   fixed order on the same tasks;
5. a summary table, a PNG and, with ``--json``, the figures.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import interrogator as sim
from banditstream.decider import Decider, PulledSnapshots
from banditstream.evaluate import load_log, parse_candidates
from banditstream.playground import Playground, estimates_table, example_arguments, write_summary
from banditstream.warmstart import local_policy
from learner.domain import DomainSettings
from learner.evaluation import Candidate
from learner.evaluation.run import evaluate_candidates
from publisher import SnapshotClient
from publisher.cli_ops import generate_keys

HERE = Path(__file__).parent
DOMAIN = "interrogator"
#: One linear Thompson sampling posterior per template, over the embedding:
#: - vector_layout "direct": the 256 values go into slots 1..256 exactly (slot 0 is the
#:   intercept), unhashed, so no two values share a slot and none is mixed into another's;
#:   dimension 258 leaves the one hashed slot the layout requires (nothing else is in the context);
#: - normalize false: the embedding enters as the embedder made it, about unit length (dense
#:   vectors are never z-scored, and the context has no named number to z-score);
#: - a reward is about 0.1, so the posterior scale v is 0.01 (the default 1 would explore on
#:   noise alone), and the prior weighs 0.1 of a row (the default 1 would weigh as much as a
#:   whole row of this scale).
CONFIG = {
    "policy": "lin_ts",
    "params": {"v": 0.01, "prior_strength": 0.1, "eps0": 0.02},
    "features": {"dimension": 258, "vector_dim": sim.DIM, "vector_layout": "direct", "normalize": False},
    # the seed's reward, from the signals the SDK sends with each reward; a replayed line's
    # reward is used as it is
    "reward": {"expression": f"sim_gain - {sim.CACHE_PENALTY}*cache_miss", "default_reward": 0.0},
}
#: the candidate gated offline: the deployed policy, with its parameters
CANDIDATE = "{policy}({knobs})".format(policy=CONFIG["policy"], knobs=",".join(f"{k}={v}" for k, v in CONFIG["params"].items()))
#: the policy goes on only if its SNIPS lower bound is at least the fixed order's estimate less this share of it
TOLERATED = 0.05
#: the gate decides on SNIPS; DR is shown beside it
ESTIMATORS = ("snips", "dr")
#: progressive validation learns the log in batches of this many rows
BATCH = 100
#: (log lines, tasks offline, live rounds, tasks per round)
SIZES = {"quick": (3000, 60, 3, 50), "full": (6000, 150, 8, 60)}


def main(argv: list[str] | None = None) -> int:
    args = example_arguments(argv, description=__doc__.splitlines()[0], seed=0, out=HERE / "out")
    console = Console()
    n_log, n_offline, n_rounds, per_round = SIZES["quick" if args.quick else "full"]
    started = time.monotonic()

    # 1. the log the interrogator kept before banditstream
    log_path = args.out / "log.jsonl"
    logged = sim.write_log(log_path, n_log, seed=args.seed, start_ms=int(time.time() * 1000) - 86_400_000)
    console.print(f"[bold]1.[/] {log_path}: {n_log:,} steps of the fixed order, {sim.EPSILON:.0%} of them a uniform template")

    # 2. the regression gate, before the policy goes on
    gate = evaluate_gate(log_path, logged, args.seed)
    console.print("[bold]2.[/] the regression gate, offline from the log")
    console.print(gate_table(gate))
    console.print(f"   {gate['reason']}: the policy goes [bold]{gate['decision']}[/]", highlight=False)

    # 3. offline: the local warm start decides while no snapshot is held
    settings = DomainSettings.model_validate({**CONFIG, "params": {**CONFIG["params"], "seed": args.seed}})
    offline = local_warm_start(log_path, settings, n_offline, args.seed)
    console.print(f"[bold]3.[/] offline, an empty repository ({offline['refreshes_refused']} refresh refused: "
                  f"{offline['refused_as']}): {offline['decisions']:,} steps decided by {', '.join(offline['decided_by'])}, "
                  f"learned from {offline['samples']:,} logged steps; {n_offline} tasks in {offline['policy']['steps']:.2f} "
                  f"steps on average (the fixed order {offline['fixed']['steps']:.2f}), "
                  f"{offline['policy']['cache_hit_rate']:.0%} cache hits ({offline['fixed']['cache_hit_rate']:.0%})",
                  highlight=False)  # fmt: skip

    # 4. live: the log replayed, then rounds of interrogations
    console.print("[bold]4.[/] the loop: embedded broker, join, learner, publisher; the log replayed")
    domain = {**CONFIG, "mode": "live" if gate["decision"] == "on" else "off"}
    tasks = np.random.default_rng(args.seed + 3)
    live: list[dict] = []
    named: dict[str, str] = {}  # event id -> the snapshot version its decision names
    with Playground({DOMAIN: domain}, seed=args.seed, console=console, workdir=args.workdir) as loop:
        replayed = loop.replay(DOMAIN, log_path, actions=sim.TEMPLATES)
        swapped = loop.learn()[DOMAIN]
        console.print(f"   replayed {len(replayed.decisions):,} decisions and {len(replayed.rewards):,} rewards; "
                      f"the SDK now decides with snapshot {swapped}")  # fmt: skip
        for r in loop.rounds(n_rounds, "live rounds"):
            held = loop.decider(DOMAIN).policy_version
            round_tasks = [sim.task(tasks, f"live-{r:02d}-{j:03d}") for j in range(per_round)]
            decisions: list = []
            played = sim.play(round_tasks, lambda c: decide(loop, c, decisions),
                              lambda answer: loop.reward(DOMAIN, decisions[-1], signals(answer)))
            named.update((d.event_id, d.policy_version) for d in decisions)
            live.append({"snapshot": held, "decided_by": sorted({d.policy_version for d in decisions}),
                         "policy": outcomes(played), "fixed": outcomes(sim.play(round_tasks, sim.fixed_order)),
                         "oracle": outcomes(sim.play(round_tasks, sim.oracle))})  # fmt: skip
            if r < n_rounds - 1:
                loop.learn()
        # what the events logged: the joined log, read back from the updates topic
        loop.decider(DOMAIN).flush(30)
        joined = {u["event_id"]: u["policy_version"] for u in loop.updates(DOMAIN) if u["event_id"] in named}
        console.print(f"   the joined log: {sum(joined.get(e) == v for e, v in named.items()):,} of {len(named):,} live "
                      "decisions logged with the snapshot that decided them", highlight=False)  # fmt: skip

    summary = summarise(gate, offline, live, named, joined, args, n_log, n_offline, n_rounds, per_round)
    console.print(summary_table(summary))
    plot(summary, args.out / "interrogator.png")
    return write_summary(summary, args, console, plot=args.out / "interrogator.png", started=started)


def decide(loop: Playground, conversation: sim.Conversation, decisions: list) -> str:
    """One step through the SDK (kept in ``decisions``)."""
    event_id = f"{conversation.task.task_id}-{conversation.steps:02d}"
    decision = loop.decide(DOMAIN, {"embedding": conversation.state().tolist()}, candidates(conversation), event_id=event_id)
    decisions.append(decision)
    return decision.action


def signals(answer: sim.Answer) -> dict[str, float]:
    """What the SDK sends as the step's reward: the join applies the domain's expression."""
    return {"sim_gain": answer.sim_gain, "cache_miss": float(not answer.cache_hit)}


def candidates(conversation: sim.Conversation) -> list[str]:
    """Every template, the fixed order's first: the SDK's baseline (what acts with the policy
    off, or with no policy at all) is the first candidate, so it is the fixed order."""
    order = sim.fixed_order(conversation)
    return [order, *(t for t in sim.TEMPLATES if t != order)]


# -- 2. the regression gate ---------------------------------------------------------------


class FixedOrder(Candidate):
    """The fixed order on the log: on each logged step, the template the order asks at that
    step of its task (the step number is the simulator's; a logger would keep it too)."""

    name = "fixed order"

    def __init__(self, logged: dict[str, sim.Logged]) -> None:
        self.logged = logged

    def action_dist(self, log, progress=None) -> np.ndarray:
        dist = np.zeros((len(log), log.n_actions))
        for i, event_id in enumerate(log.event_id):
            dist[i, log.actions.index(sim.FIXED_ORDER[self.logged[event_id].step])] = 1.0
        return dist


class Kept(Candidate):
    """A candidate that keeps the distribution it was scored with, for its truth on the log
    (a progressively trained policy is not scored twice)."""

    def __init__(self, candidate: Candidate) -> None:
        self.candidate, self.name, self.dist = candidate, candidate.name, None

    def action_dist(self, log, progress=None) -> np.ndarray:
        self.dist = self.candidate.action_dist(log, progress)
        return self.dist


def evaluate_gate(log_path: Path, logged: dict[str, sim.Logged], seed: int) -> dict:
    """SNIPS and DR, with 95% intervals, of the fixed order and of the policy (trained
    progressively on the log: no row is scored by a model that learned from it), each one's
    true value on the logged steps from the simulator, and the gate's decision, on SNIPS."""
    settings = DomainSettings.model_validate(CONFIG)
    log = load_log(str(log_path), domain=DOMAIN, domain_settings=settings)
    policy = parse_candidates(CANDIDATE, snapshots=None, batch_size=BATCH, seed=seed)
    candidates = [Kept(c) for c in (FixedOrder(logged), *policy)]
    began = time.monotonic()
    run = evaluate_candidates(log, candidates, estimators=ESTIMATORS, seed=seed)
    seconds = time.monotonic() - began
    columns = [sim.TEMPLATES.index(action) for action in log.actions]  # the log's action order
    means = np.array([logged[event_id].means for event_id in log.event_id])[:, columns]
    rows = {}
    for candidate, result in zip(candidates, run.results):
        rows[result.name] = {"truth": round(float((candidate.dist * means).sum(axis=1).mean()), 4),
                             **{name: {"value": round(e.estimate, 4), "low": round(e.lower, 4), "high": round(e.upper, 4),
                                       "ess": round(e.ess, 1), "warnings": list(e.warnings)}
                                for name, e in result.estimates.items()}}  # fmt: skip
    fixed, policy = rows["fixed order"]["snips"], rows[run.results[-1].name]["snips"]
    threshold = round(fixed["value"] - TOLERATED * abs(fixed["value"]), 4)
    on = policy["low"] >= threshold
    reason = (f"the policy's SNIPS lower bound {policy['low']:.4f} is {'at or above' if on else 'BELOW'} the fixed order's "
              f"{fixed['value']:.4f} less {TOLERATED:.0%}, {threshold:.4f}")  # fmt: skip
    return {"rows": len(log), "candidate": run.results[-1].name, "candidates": rows, "estimator": "snips",
            # the logging policy's (the ε-random order's) value: the log's mean reward
            "log_mean_reward": round(run.on_policy_value, 4),
            "tolerated": TOLERATED, "threshold": threshold, "decision": "on" if on else "off", "reason": reason,
            "seconds": round(seconds, 1)}  # fmt: skip


def gate_table(gate: dict) -> Table:
    """One row per candidate and estimator, as ``banditstream evaluate`` prints them."""
    rows = {"lin_ts (the policy)" if name == gate["candidate"] else name: row for name, row in gate["candidates"].items()}
    table = estimates_table(f"the gate, from {gate['rows']:,} logged steps (expected reward per step)", rows, ESTIMATORS)
    table.caption = (f"the policy: {gate['candidate']}, in batches of {BATCH}; the log's mean reward "
                     f"(the ε-random order's value) {gate['log_mean_reward']:.4f}")  # fmt: skip
    return table


# -- 3. offline: the local warm start ------------------------------------------------------


def local_warm_start(log_path: Path, settings: DomainSettings, n_tasks: int, seed: int) -> dict:
    """The policy learned in this process from the log decides for an SDK whose repository
    holds no snapshot (the deployment's trusted root, an empty directory: nothing published
    yet, as offline), on the same tasks as the fixed order."""
    local = local_policy(DOMAIN, settings, log_path, actions=sim.TEMPLATES, seed=seed)
    rng = np.random.default_rng(seed + 2)
    tasks = [sim.task(rng, f"offline-{j:03d}") for j in range(n_tasks)]
    with tempfile.TemporaryDirectory(prefix="interrogator-offline-") as tmp, only_errors("publisher", "banditstream.decider"):
        root = Path(tmp)
        generate_keys(root / "keys")
        (root / "repository").mkdir()
        client = SnapshotClient(root / "repository", root / "cache", root / "keys" / "root.json", domain=DOMAIN)
        decider = Decider(DOMAIN, PulledSnapshots(client), settings=settings, fallback=local, seed=seed, refresh_interval_s=3600)
        decisions = []

        def choose(conversation: sim.Conversation) -> str:
            decision = decider.decide({"embedding": conversation.state().tolist()}, candidates(conversation))
            decisions.append(decision)
            return decision.action

        try:
            policy = outcomes(sim.play(tasks, choose))
        finally:
            decider.close()
    no_snapshot = decider.metrics.registry.get_sample_value(
        "banditstream_sdk_fallbacks_total", {"domain": DOMAIN, "reason": "no_snapshot", "channel": "stable"})
    refused = {sample.labels["kind"]: int(sample.value) for metric in decider.metrics.verification_failures.collect()
               for sample in metric.samples if sample.name.endswith("_total")}  # fmt: skip
    fixed = outcomes(sim.play(tasks, sim.fixed_order))
    return {"version": local.version, "samples": local.samples, "decisions": len(decisions),
            "snapshot_held": decider.policy_version, "refreshes_refused": sum(refused.values()),
            "refused_as": ", ".join(sorted(refused)),
            "decided_by": sorted({d.policy_version for d in decisions}), "fallbacks_no_snapshot": int(no_snapshot),
            "tasks": n_tasks, "policy": policy, "fixed": fixed}  # fmt: skip


@contextlib.contextmanager
def only_errors(*loggers: str) -> Iterator[None]:
    """Only errors from these loggers while inside: the SDK's refresh warns that the repository
    is empty, as it should, and here that is the point."""
    held = [(logging.getLogger(name), logging.getLogger(name).level) for name in loggers]
    for logger, _ in held:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in held:
            logger.setLevel(level)


# -- outcomes -----------------------------------------------------------------------------


def outcomes(played: sim.Played) -> dict:
    """Mean steps to solve (a task given up counts its cap), the share solved, the questions
    asked, the cache-hit rate over them, and the mean reward per step."""
    conversations = played.conversations
    questions, hits = sum(c.steps for c in conversations), sum(c.cache_hits for c in conversations)
    return {"tasks": len(conversations), "steps": round(questions / len(conversations), 3),
            "solved": round(float(np.mean([c.solved for c in conversations])), 3), "questions": questions,
            "cache_hits": hits, "cache_hit_rate": round(hits / questions, 4),
            "reward_per_step": round(float(np.mean([a.reward for a in played.answers])), 4)}  # fmt: skip


def pooled(figures: list[dict]) -> dict:
    """:func:`outcomes` of several rounds, as one."""
    tasks, questions, hits = (sum(f[key] for f in figures) for key in ("tasks", "questions", "cache_hits"))
    solved = sum(f["solved"] * f["tasks"] for f in figures) / tasks
    return {"tasks": tasks, "steps": round(questions / tasks, 3), "solved": round(solved, 3), "questions": questions,
            "cache_hits": hits, "cache_hit_rate": round(hits / questions, 4)}  # fmt: skip


# -- 5. summary ---------------------------------------------------------------------------


def summarise(gate, offline, live, named, joined, args, n_log, n_offline, n_rounds, per_round) -> dict:
    out: dict = {"seed": args.seed, "quick": args.quick, "log_rows": n_log, "offline_tasks": n_offline, "rounds": n_rounds,
                 "per_round": per_round,
                 # what depends on the machine's timing (how many snapshots were published, and
                 # when; the log's timestamps, so its digest), not on the seed: everything else
                 # is the same on every run of a seed
                 "timing_dependent": ["live.rounds.*.snapshot", "live.rounds.*.decided_by", "offline_local_warm_start.version",
                                      "offline_local_warm_start.decided_by", "gate.seconds", "seconds"]}  # fmt: skip
    out["gate"] = gate
    out["offline_local_warm_start"] = offline
    rounds = live
    whole = {who: pooled([r[who] for r in live]) for who in ("policy", "fixed", "oracle")}
    out["live"] = {
        "rounds": rounds, **whole, "decisions": len(named),
        # every live decision names the snapshot the SDK held when it decided (a published and
        # verified one: never empty, never the local warm start's) ...
        "decisions_name_their_snapshot": all(r["decided_by"] == [r["snapshot"]] and r["snapshot"] != ""
                                             and not r["snapshot"].startswith("local:") for r in rounds),
        # ... and its event, joined, carries that version
        "joined_with_their_snapshot": sum(joined.get(event_id) == version for event_id, version in named.items()),
    }  # fmt: skip
    policy, fixed, last = whole["policy"], whole["fixed"], rounds[-1]
    out["claims"] = {
        "gate": gate["decision"],
        "live_fewer_steps": round(fixed["steps"] - policy["steps"], 3),
        "live_more_cache_hits": round(policy["cache_hit_rate"] - fixed["cache_hit_rate"], 4),
        "live_last_round_fewer_steps": round(last["fixed"]["steps"] - last["policy"]["steps"], 3),
        "live_last_round_more_cache_hits": round(last["policy"]["cache_hit_rate"] - last["fixed"]["cache_hit_rate"], 4),
        "offline_fewer_steps": round(offline["fixed"]["steps"] - offline["policy"]["steps"], 3),
        "offline_more_cache_hits": round(offline["policy"]["cache_hit_rate"] - offline["fixed"]["cache_hit_rate"], 4),
        "offline_decided_by_local_warm_start": offline["decided_by"] == [offline["version"]] and offline["snapshot_held"] == ""
                                               and offline["fallbacks_no_snapshot"] == offline["decisions"],
        "live_decisions_name_their_snapshot": out["live"]["decisions_name_their_snapshot"]
                                              and out["live"]["joined_with_their_snapshot"] == len(named),
    }  # fmt: skip
    return out


def summary_table(summary: dict) -> Table:
    live, local = summary["live"], summary["offline_local_warm_start"]
    table = Table(title=f"offline, {local['tasks']} tasks; live, {summary['rounds']} rounds of {summary['per_round']} tasks")
    for column in ("", "decided by", "steps", "fixed\norder", "oracle", "cache\nhits", "fixed\norder", "oracle"):
        table.add_column(column, justify="left" if column in ("", "decided by") else "right")

    def row(label: str, version: str, figures: dict, bold: str = "") -> None:
        policy, fixed, oracle = figures["policy"], figures["fixed"], figures.get("oracle")
        table.add_row(label, version, f"{bold}{policy['steps']:.2f}", f"{fixed['steps']:.2f}",
                      f"{oracle['steps']:.2f}" if oracle else "", f"{bold}{policy['cache_hit_rate']:.0%}",
                      f"{fixed['cache_hit_rate']:.0%}", f"{oracle['cache_hit_rate']:.0%}" if oracle else "")  # fmt: skip

    row("offline", local["version"], local)
    for i, r in enumerate(live["rounds"], start=1):
        row(f"round {i}", r["snapshot"], r)
    row("live", "", live, bold="[bold]")
    table.caption = ("steps: mean steps to solve; cache hits: the share of questions the cache answered.\n"
                     f"gate: {summary['gate']['decision']}. Every live decision names the snapshot that decided: "
                     f"{'yes' if summary['claims']['live_decisions_name_their_snapshot'] else 'NO'}")  # fmt: skip
    return table


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (forest, steps, hits) = plt.subplots(1, 3, figsize=(17, 4.6), gridspec_kw={"width_ratios": [1.2, 1, 1]})
    gate = summary["gate"]
    names = list(gate["candidates"])
    for i, name in enumerate(names):
        row = gate["candidates"][name]
        for shift, estimator, color in ((0.08, "snips", "C0"), (-0.08, "dr", "C2")):
            e = row[estimator]
            forest.errorbar(e["value"], i + shift, xerr=[[e["value"] - e["low"]], [e["high"] - e["value"]]], fmt="o",
                            color=color, label=f"{estimator.upper()}, 95% interval" if i == 0 else None)  # fmt: skip
        forest.plot(row["truth"], i, "x", color="C3", markersize=9, label="truth on the log" if i == 0 else None)
    forest.axvline(gate["threshold"], linestyle="--", color="grey", label=f"the bar: fixed order less {gate['tolerated']:.0%}")
    forest.set_yticks(range(len(names)), ["lin_ts\n(the policy)" if n == gate["candidate"] else n for n in names])
    forest.set_ylim(-0.5, len(names) - 0.5)
    forest.set(xlabel="expected reward per step", title=f"the gate, from the log: the policy goes {gate['decision']}")
    forest.legend(fontsize=8, loc="lower right")
    live, local = summary["live"], summary["offline_local_warm_start"]
    x = list(range(1, len(live["rounds"]) + 1))
    for ax, key, label in ((steps, "steps", "mean steps to solve"), (hits, "cache_hit_rate", "cache-hit rate")):
        ax.plot(x, [r["policy"][key] for r in live["rounds"]], "-o", color="C0", label="lin_ts, live (snapshots)")
        ax.plot(x, [r["fixed"][key] for r in live["rounds"]], "--s", color="grey", label="fixed order, same tasks")
        ax.plot(x, [r["oracle"][key] for r in live["rounds"]], ":", color="black", label="oracle")
        ax.plot([0], [local["policy"][key]], "D", color="C2", label="offline: local warm start")
        ax.plot([0], [local["fixed"][key]], "s", color="grey", fillstyle="none", label="fixed order, offline tasks")
        ax.set_xticks([0, *x], ["offline", *map(str, x)])
        ax.set(xlabel="live round", ylabel=label, title=f"{label}, per round", ylim=(0, None))
        ax.legend(fontsize=8, loc="best")
    hits.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
