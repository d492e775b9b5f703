"""The learning engine (seed 002) on banditstream: one service, five decision domains, each
starting in shadow and switched live by its feature flag, shields on budget and latency,
and a snapshot dump and restore of one domain.

    python examples/core_rl/run.py [--quick] [--seed 2] [--out DIR] [--json PATH]

What runs (see README.md here): the embedded broker, the join, learner and publisher, and the
SDK deciding in five domains for a simulated service (``service.py``) with ε-greedy, UCB1 and
Thompson sampling, one reward expression over quality, groundedness, safety, cost and latency.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import service
from banditstream.playground import Playground, example_arguments, write_summary
from learner.reward import RewardConfig, RewardEngine

HERE = Path(__file__).parent
#: (shadow rounds, live rounds, requests per round)
SIZES = {"quick": (1, 4, 150), "full": (2, 10, 400)}
RESTORED = "retrieval_scoring"  # the domain dumped and restored


def domain_settings(domain: service.Domain) -> dict:
    """Shadow first; conservative priors: the baseline (the first action) starts as a known
    good action (0.65 over 20 pseudo-observations), every other one below it (0.5 over 2), so
    the policy moves off the baseline only on evidence."""
    baseline = domain.actions[0].name
    params = {**domain.params, "prior_mean": 0.5, "prior_strength": 2.0, "arm_priors": {baseline: [0.65, 20.0]}}
    return {"policy": domain.policy, "params": params, "mode": "shadow", "features": {"dimension": 8},
            "reward": {"expression": service.REWARD, "clip": [0.0, 1.0], "default_reward": 0.0}}  # fmt: skip


def flag(domain: str) -> str:
    return "ENABLE_RL_" + re.sub(r"[^A-Za-z0-9]", "_", domain).upper()


def main(argv: list[str] | None = None) -> int:
    args = example_arguments(argv, description=__doc__.splitlines()[0], seed=2, out=HERE / "out")
    console = Console()
    n_shadow, n_live, per_round = SIZES["quick" if args.quick else "full"]
    started = time.monotonic()
    for domain in service.DOMAINS:  # every flag off: the domains run as configured (shadow)
        os.environ.pop(flag(domain.name), None)
    os.environ["ENABLE_RL_GLOBAL"] = "1"

    engine = RewardEngine(RewardConfig.from_expression(service.REWARD, clip=(0.0, 1.0)))
    truth = {d.name: service.expected_rewards(d, engine, seed=args.seed) for d in service.DOMAINS}
    rng = np.random.default_rng(args.seed)
    record = {d.name: [] for d in service.DOMAINS}  # (phase, round, chosen index, allowed indices, shielded)
    violations = {"cost": 0, "latency": 0, "taken_where_not_shielded": 0}
    with Playground({d.name: domain_settings(d) for d in service.DOMAINS}, seed=args.seed, console=console,
                    workdir=args.workdir) as loop:  # fmt: skip
        prime_shields(loop, rng)
        for phase, rounds in (("shadow", n_shadow), ("live", n_live)):
            if phase == "live":
                for domain in service.DOMAINS:  # the per-domain feature flags go on
                    os.environ[flag(domain.name)] = "1"
                console.print("feature flags on: " + ", ".join(flag(d.name) + "=1" for d in service.DOMAINS), highlight=False)
            for r in loop.rounds(rounds, f"{phase} rounds"):
                for j in range(per_round):
                    free, interactive = rng.random() < 0.5, rng.random() < 0.6
                    context = {"tier": "free" if free else "paid", "interactive": "yes" if interactive else "no"}
                    for domain in service.DOMAINS:
                        budget = {}
                        if domain.name == "model_routing" and free:
                            budget["max_cost"] = service.FREE_MAX_COST_USD
                        if domain.name == "plugin_budget" and interactive:
                            budget["max_latency_ms"] = service.INTERACTIVE_MAX_LATENCY_MS
                        d = loop.decide(domain.name, context, domain.ids, event_id=f"{domain.name}-{phase}-{r}-{j}", **budget)
                        action = domain.actions[d.index]
                        violations["cost"] += int(action.cost_usd > budget.get("max_cost", np.inf))
                        p95 = action.latency_ms * np.exp(1.645 * service.LATENCY_SIGMA)
                        violations["latency"] += int(p95 > budget.get("max_latency_ms", np.inf))
                        if not budget and domain.name in ("model_routing", "plugin_budget"):  # the same action,
                            # on a request its shield did not cover: the policy does pick them
                            violations["taken_where_not_shielded"] += int(action.cost_usd > service.FREE_MAX_COST_USD
                                                                          or p95 > service.INTERACTIVE_MAX_LATENCY_MS)
                        allowed = [k for k, a in enumerate(domain.actions) if a.cost_usd <= budget.get("max_cost", np.inf)
                                   and a.latency_ms * np.exp(1.645 * service.LATENCY_SIGMA) <= budget.get("max_latency_ms", np.inf)]  # fmt: skip
                        record[domain.name].append((phase, r, int(d.index), allowed, bool(budget)))
                        loop.reward(domain.name, d, service.signals(rng, action))
                if phase == "live":
                    loop.learn()
        restore = dump_and_restore(loop, args.out / "dump", console)
    summary = summarise(record, truth, violations, restore, args, n_shadow, n_live, per_round)
    console.print(summary_table(summary))
    plot(record, truth, n_live, args.out / "core_rl.png")
    return write_summary(summary, args, console, plot=args.out / "core_rl.png", started=started)


def prime_shields(loop: Playground, rng: np.random.Generator) -> None:
    """The service knows its prices, and load-tested each action's latency before going
    live: the shields start from that (and follow the signals every reward then carries)."""
    for domain in service.DOMAINS:
        decider = loop.decider(domain.name)
        for action in domain.actions:
            for _ in range(50):
                decider.observe(action.name, cost_usd=action.cost_usd, latency_ms=service.signals(rng, action)["latency_ms"])


def cli(loop: Playground, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "banditstream.cli", "--config", str(loop.config_path), *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"banditstream {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def dump_and_restore(loop: Playground, folder: Path, console: Console) -> dict:
    """``banditstream snapshot dump`` one domain's head to ``folder``, ``snapshot restore`` it
    as the domain's next version, and check what the SDK then verifies and holds."""
    shutil.rmtree(folder, ignore_errors=True)  # restore takes the newest backup it finds there
    dumped = json.loads(cli(loop, "snapshot", "dump", RESTORED, "--out", str(folder), "--verbose"))
    said = cli(loop, "snapshot", "restore", str(folder), "--domains", RESTORED)
    match = re.search(r"\sas\s+(\S+)\s*$", said)  # (the console wraps its line anywhere)
    if match is None:
        raise RuntimeError(f"snapshot restore said: {said!r}")
    version = match.group(1)
    restored = json.loads(cli(loop, "snapshot", "dump", RESTORED, "--version", version, "--verbose"))
    held = loop.sources[RESTORED].latest()  # pulled and verified as every client does
    loop.decider(RESTORED).use(held)
    same = ["policy", "params", "samples", "arm_rows", "state_bytes", "feature_hash", "reward_hash"]
    console.print(f"restored {RESTORED} {dumped['version']} as {version}; the SDK holds {held.version}", highlight=False)
    return {"domain": RESTORED, "dumped": dumped["version"], "restored_as": version, "sdk_holds": held.version,
            "state_equal": all(dumped[k] == restored[k] for k in same), "compared": same}  # fmt: skip


def summarise(record, truth, violations, restore, args, n_shadow, n_live, per_round) -> dict:
    out: dict = {"seed": args.seed, "quick": args.quick, "shadow_rounds": n_shadow, "live_rounds": n_live,
                 "per_round": per_round, "domains": {}, "shield_violations": violations, "restore": restore,
                 "timing_dependent": ["restore.dumped", "restore.restored_as", "restore.sdk_holds", "seconds"]}  # fmt: skip
    for domain in service.DOMAINS:
        rows, value = record[domain.name], truth[domain.name]
        shadow = [row for row in rows if row[0] == "shadow"]
        last = [row for row in rows if row[0] == "live" and row[1] == n_live - 1]
        live = [row for row in rows if row[0] == "live"]
        baseline = [value[row[3][0]] for row in last]  # the first allowed action: what the service did
        best = [max(value[k] for k in row[3]) for row in last]
        out["domains"][domain.name] = {
            "policy": domain.policy,
            "shadow_decisions": len(shadow),
            "shadow_changed_for_users": sum(1 for row in shadow if row[2] != row[3][0]),
            "live_decisions": len(live),
            "baseline_reward": round(float(np.mean(baseline)), 4),
            "last_round_reward": round(float(np.mean([value[row[2]] for row in last])), 4),
            "best_allowed_reward": round(float(np.mean(best)), 4),
            "best_action": domain.actions[int(np.argmax(value))].name,
            "last_round_top_action": domain.actions[int(np.bincount([row[2] for row in last]).argmax())].name,
        }
        d = out["domains"][domain.name]
        d["live_gain_over_baseline"] = round(d["last_round_reward"] - d["baseline_reward"], 4)
    return out


def summary_table(summary: dict) -> Table:
    table = Table(title=f"{summary['live_rounds']} live rounds of {summary['per_round']} requests after "
                        f"{summary['shadow_rounds']} in shadow (expected reward of the action taken)")  # fmt: skip
    for column in ("domain", "policy", "shadow: changed", "baseline", "last live round", "best allowed", "most chosen"):
        table.add_column(column, justify="left" if column in ("domain", "policy", "most chosen") else "right")
    for name, d in summary["domains"].items():
        table.add_row(name, d["policy"], f"{d['shadow_changed_for_users']}/{d['shadow_decisions']}", f"{d['baseline_reward']:.3f}",
                      f"{d['last_round_reward']:.3f}", f"{d['best_allowed_reward']:.3f}", d["last_round_top_action"])  # fmt: skip
    v, r = summary["shield_violations"], summary["restore"]
    table.caption = (f"shield violations: cost {v['cost']}, latency {v['latency']} (over-budget actions taken where no shield "
                     f"applied: {v['taken_where_not_shielded']}); {r['domain']} dumped at {r['dumped']}, "
                     f"restored as {r['restored_as']}, state equal: {r['state_equal']}")  # fmt: skip
    return table


def plot(record, truth, n_live: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(service.DOMAINS), figsize=(18, 3.8), sharey=True)
    for ax, domain in zip(axes, service.DOMAINS):
        rows, value = record[domain.name], truth[domain.name]
        phases = [("shadow", r) for r in sorted({row[1] for row in rows if row[0] == "shadow"})]
        phases += [("live", r) for r in range(n_live)]
        taken = [np.mean([value[row[2]] for row in rows if (row[0], row[1]) == key]) for key in phases]
        base = [np.mean([value[row[3][0]] for row in rows if (row[0], row[1]) == key]) for key in phases]
        best = [np.mean([max(value[k] for k in row[3]) for row in rows if (row[0], row[1]) == key]) for key in phases]
        x = range(1, len(phases) + 1)
        ax.plot(x, taken, "-o", label="taken")
        ax.plot(x, base, "--", color="grey", label="baseline")
        ax.plot(x, best, ":", color="black", label="best allowed")
        shadow = sum(1 for p, _ in phases if p == "shadow")
        ax.axvspan(0.5, shadow + 0.5, color="C1", alpha=0.12, label="shadow")
        ax.set(title=f"{domain.name} ({domain.policy})", xlabel="round")
        ax.set_xticks(list(x))
    axes[0].set_ylabel("expected reward")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
