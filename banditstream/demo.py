"""`banditstream demo`: the whole loop on one machine, learning a simulated workload.

What runs (every piece real, every process stopped at the end, on error and on Ctrl-C):

- the embedded stack: the Tansu broker (and SeaweedFS S3 with ``--s3``; otherwise the
  snapshot repository is a local directory);
- the join, learner and publisher workers, each its own ``banditstream`` process;
- the SDK (:class:`~banditstream.decider.Decider`, one per domain) pulling verified snapshots
  and deciding for a simulated workload with a known ground truth
  (:mod:`banditstream.simulate`); rewards come back with realistic delays, some never
  (the join's default reward), a few too late (dead-lettered).

The workload runs in rounds: the SDK decides a round of requests with the snapshot it holds,
their rewards are sent, and the next round starts once a snapshot that has learned from every
decision so far is published, verified and swapped in. So the numbers depend on the seed
only, not on how fast this machine is: the same seed gives the same figures.

At the end: a summary table, a PNG (cumulative regret and reward per domain, snapshot
swaps marked) and, with ``--json``, the figures as JSON.
"""

from __future__ import annotations

import heapq
import json
import logging
import re
import shutil
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from banditstream.decider import Decider, PulledSnapshots
from banditstream.devstack import LocalStack
from banditstream.simulate import ENVIRONMENTS, Environment, make_environment
from banditstream.workers import WorkerExited, WorkerProcesses
from learner.domain import DomainSettings
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import ensure_topics

DEFAULT_DOMAINS = ("llm_routing", "support_templates")


class DemoError(RuntimeError):
    """The demo could not run to the end (a worker died, the loop stalled)."""


@dataclass
class DemoOptions:
    events: int = 20_000
    domains: tuple[str, ...] = DEFAULT_DOMAINS
    policy: str = "lin_ts"
    seed: int = 7
    round_size: int = 1000
    window_s: float = 3.0
    no_reward_rate: float = 0.10
    late_rate: float = 0.03
    s3: bool = False
    json_path: Path | None = None
    plot_path: Path | None = Path("banditstream-demo.png")
    round_timeout_s: float = 60.0
    workdir: Path | None = None


@dataclass
class DomainLog:
    """What happened in one domain, decision by decision."""

    env: Environment
    expected: list[float] = field(default_factory=list)  # E[reward] of the SDK's choice
    oracle: list[float] = field(default_factory=list)
    random: list[float] = field(default_factory=list)
    realised: list[float] = field(default_factory=list)
    swaps: list[tuple[int, str]] = field(default_factory=list)  # (decision index, version)

    def figures(self) -> dict[str, float]:
        n = len(self.expected)
        tail = slice(n - n // 4, n)
        learned = float(np.mean(self.expected[tail]))
        random = float(np.mean(self.random[tail]))
        oracle = float(np.mean(self.oracle[tail]))
        gain = (learned - random) / (oracle - random) if oracle > random else float("nan")
        return {
            "decisions": n,
            "learned_reward": round(learned, 6),
            "random_reward": round(random, 6),
            "oracle_reward": round(oracle, 6),
            "gain_ratio": round(gain, 4),
            "cumulative_regret": round(float(np.sum(np.subtract(self.oracle, self.expected))), 3),
            "snapshots_used": len(self.swaps),
        }


def run(options: DemoOptions, console: Console | None = None) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``options.json_path``)."""
    console = console or Console()
    unknown = [d for d in options.domains if d not in ENVIRONMENTS]
    if unknown:
        raise DemoError(f"unknown domain(s) {', '.join(unknown)}; the simulator has {', '.join(ENVIRONMENTS)}")
    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="banditstream-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(workdir / "stack", s3=options.s3)
    workers = _Workers(workdir)
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    logging.getLogger("publisher").setLevel(logging.ERROR)  # "nothing published yet" while polling
    try:
        with console.status("starting the embedded stack…"):
            info = stack.up()
        console.print(f"broker [bold]{info.kafka_bootstrap}[/]" + (f", S3 [bold]{info.s3_endpoint}[/]" if info.s3_endpoint else ""))
        return _Demo(options, workdir, info, workers, console).run()
    finally:
        workers.stop()
        stack.down()
        signal.signal(signal.SIGTERM, previous)
        if options.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _raise_keyboard_interrupt(*_):
    raise KeyboardInterrupt


class _Workers(WorkerProcesses):
    def check(self) -> None:
        try:
            super().check()
        except WorkerExited as exc:
            raise DemoError(str(exc)) from None

    def metric(self, name: str, family: str) -> dict[str, float]:
        """``labels -> value`` of one metric family from a worker's /metrics."""
        return self.scrape(name).get(family, {})


class _Demo:
    def __init__(self, options: DemoOptions, workdir: Path, info, workers: _Workers, console: Console):
        self.o = options
        self.workdir = workdir
        self.info = info
        self.workers = workers
        self.console = console
        self.kafka = KafkaSettings(bootstrap_servers=info.kafka_bootstrap, profile=info.kafka_profile)
        # One partition per topic: the join then emits in deadline order and the learner folds
        # the same records in the same blocks on every run, so its floating-point state (and
        # with it every later draw) is identical for a seed. Production spreads over many.
        self.topics = TopicSettings(partitions=1, update_partitions=1)
        self.logs = {name: DomainLog(make_environment(name)) for name in options.domains}
        self.decide_us: list[float] = []
        self.late_pending: list[tuple[str, Decider, str, dict[str, float], int]] = []
        self.sent = Counter()
        self.started = time.monotonic()

    # -- set-up ---------------------------------------------------------------------------

    def _config(self) -> tuple[Path, dict[str, DomainSettings]]:
        from publisher.cli_ops import generate_keys

        keys = self.workdir / "keys"
        generate_keys(keys)
        if self.o.s3:
            repository = "s3://banditstream-demo/snapshots"
            import boto3

            boto3.client("s3", **self._s3_kwargs()).create_bucket(Bucket="banditstream-demo")
        else:
            repository = str(self.workdir / "snapshots")
        domains = {}
        for name, log in self.logs.items():
            params = {"eps0": 0.02, "seed": self.o.seed}
            if self.o.policy in ("lin_ts", "shared_lin_ts"):
                params["v"] = 0.3
            elif self.o.policy in ("lin_ucb", "shared_lin_ucb"):
                params["alpha"] = 0.5
            shared = self.o.policy.startswith("shared_")
            domains[name] = {
                "policy": self.o.policy,
                "params": params,
                "features": {"dimension": 32, "normalize": False, "shared": shared, "interactions": shared},
                "reward": {"expression": log.env.reward_expression, "window_s": self.o.window_s, "default_reward": 0.0},
            }
        tree = {
            "kafka": {"bootstrap_servers": self.kafka.bootstrap_servers, "profile": self.kafka.profile},
            "topics": self.topics.model_dump(),
            "stores": {"state_dir": str(self.workdir / "state"), "snapshots": repository},
            "publish": {"keys_dir": str(keys), "every_updates": 100_000, "every_seconds": 0.5, "on_drift": "flag"},
            "sdk": {"cache_dir": str(self.workdir / "cache")},
            "join": {"sweep_interval_s": 0.2},
            "learn": {"emit_every_s": 0.3},
            "domains": domains,
        }
        if self.o.s3:
            tree["s3"] = {
                "endpoint_url": self.info.s3_endpoint,
                "access_key_id": self.info.s3_access_key,
                "secret_access_key": self.info.s3_secret_key,
                "region": self.info.s3_region,
            }
        path = self.workdir / "banditstream.json"
        path.write_text(json.dumps(tree, indent=2))
        from banditstream.config import load_settings

        settings = load_settings(path, env={})
        return path, dict(settings.domains)

    def _s3_kwargs(self) -> dict[str, str]:
        return {
            "endpoint_url": self.info.s3_endpoint,
            "aws_access_key_id": self.info.s3_access_key,
            "aws_secret_access_key": self.info.s3_secret_key,
            "region_name": self.info.s3_region,
        }

    # -- the run --------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        from publisher import SnapshotClient

        config_path, domain_settings = self._config()
        ensure_topics(self.kafka, self.topics)
        for name in ("join", "learn", "publish"):
            self.workers.start(name, config_path)
        repository = f"s3://banditstream-demo/snapshots" if self.o.s3 else str(self.workdir / "snapshots")
        deciders: dict[str, Decider] = {}
        sources: dict[str, PulledSnapshots] = {}
        for i, name in enumerate(self.o.domains):
            client = SnapshotClient(
                repository, self.workdir / "cache" / name, self.workdir / "keys" / "root.json", domain=name,
                s3=self._s3_kwargs() if self.o.s3 else None,
            )  # fmt: skip
            sources[name] = PulledSnapshots(client)
            deciders[name] = Decider(
                name, kafka=self.kafka, settings=domain_settings[name], topics=self.topics, seed=self.o.seed + i,
                spool_path=self.workdir / "spool" / f"{name}.spool",
            )  # fmt: skip
        rng = np.random.default_rng(self.o.seed)
        per_domain = {name: 0 for name in self.o.domains}
        try:
            with Live(self._view(deciders), console=self.console, refresh_per_second=4, transient=False) as live:
                made = 0
                while made < self.o.events:
                    self.workers.check()
                    # a short first round: the baseline decides it, so learning starts sooner
                    size = min(self.o.round_size if made else max(10, self.o.round_size // 5), self.o.events - made)
                    self._round(size, made, deciders, rng, per_domain)
                    made += size
                    live.update(self._view(deciders))
                    self._await_learning(per_domain, deciders, sources, live)
                self._send_late()  # the last round's too-late rewards, for the join to refuse
                for decider in deciders.values():
                    decider.flush(30)
                self._await_dead_letters(live, deciders)
            summary = self._summary(deciders)
            summary["evaluation"] = self._evaluate(sources)
        finally:
            for decider in deciders.values():
                decider.close(timeout=5)
        self._print(summary)
        if self.o.plot_path:
            self._plot(self.o.plot_path)
            self.console.print(f"plot: [bold]{self.o.plot_path}[/]")
        if self.o.json_path:
            Path(self.o.json_path).write_text(json.dumps(summary, indent=2))
            self.console.print(f"summary: [bold]{self.o.json_path}[/]")
        return summary

    def _round(self, size: int, offset: int, deciders, rng, per_domain) -> None:
        """Decide ``size`` requests, then send their rewards (in timestamp order)."""
        self._send_late()
        rewards: list[tuple[int, str, Decider, str, dict[str, float]]] = []  # a heap by due time
        window_ms = int(self.o.window_s * 1000)
        for k in range(size):
            self._send_due(rewards, int(time.time() * 1000))
            name = self.o.domains[(offset + k) % len(self.o.domains)]
            log = self.logs[name]
            env = log.env
            context = env.sample_context(rng)
            t0 = time.perf_counter()
            decision = deciders[name].decide(context, env.actions, event_id=f"{name}-{offset + k:07d}")
            self.decide_us.append((time.perf_counter() - t0) * 1e6)
            outcome = env.outcome(context, decision.action, rng)
            values = env.expected_rewards(context)
            log.expected.append(float(values[decision.index]))
            log.oracle.append(float(values.max()))
            log.random.append(float(values.mean()))
            log.realised.append(outcome.reward)
            per_domain[name] += 1
            fate = rng.random()
            decided_at = int(time.time() * 1000)
            if fate < self.o.no_reward_rate:
                self.sent["none"] += 1
            elif fate < self.o.no_reward_rate + self.o.late_rate:
                self.late_pending.append((name, deciders[name], decision.event_id, outcome.signals, decided_at + int(1.5 * window_ms)))
            else:
                delay = min(rng.exponential(0.1 * window_ms), 0.5 * window_ms)
                heapq.heappush(rewards, (decided_at + int(delay), decision.event_id, deciders[name], outcome.signals))
        self._send_due(rewards, None)

    def _send_due(self, rewards: list, now_ms: int | None) -> None:
        """Send the rewards whose (simulated) arrival time has come; all of them if ``now_ms``
        is None. They leave in timestamp order, as their outcomes are observed."""
        while rewards and (now_ms is None or rewards[0][0] <= now_ms):
            ts, event_id, decider, signals = heapq.heappop(rewards)
            decider.reward(event_id, signals, timestamp_ms=ts)
            self.sent["in_window"] += 1

    def _send_late(self) -> None:
        """Rewards held back past their window (the previous round is finalised by now)."""
        for _, decider, event_id, signals, ts in self.late_pending:
            decider.reward(event_id, signals, timestamp_ms=ts)
            self.sent["late"] += 1
        self.late_pending = []

    def _await_dead_letters(self, live, deciders, timeout: float = 15.0) -> None:
        """Let the join refuse the last late rewards before the summary counts them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            late = sum(self.workers.metric("join", "banditstream_late_rewards_total").values())
            if late >= self.sent["late"]:
                return
            live.update(self._view(deciders))
            time.sleep(0.2)

    def _await_learning(self, per_domain, deciders, sources, live) -> None:
        """Wait for a snapshot per domain that learned from every decision made so far."""
        deadline = time.monotonic() + self.o.round_timeout_s
        pending = dict(per_domain)
        while pending:
            self.workers.check()
            for name in list(pending):
                try:
                    active = sources[name].latest()
                except Exception:  # noqa: BLE001 - nothing published yet, or mid-publish
                    active = None
                if active is not None and active.samples >= pending[name]:
                    deciders[name].use(active)
                    log = self.logs[name]
                    if not log.swaps or log.swaps[-1][1] != active.version:
                        log.swaps.append((len(log.expected), active.version))
                    del pending[name]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise DemoError(
                    f"no snapshot learned from all decisions within {self.o.round_timeout_s:.0f}s "
                    f"(waiting for {', '.join(pending)}); worker logs are in {self.workdir}"
                )
            live.update(self._view(deciders))
            time.sleep(0.2)

    # -- output ---------------------------------------------------------------------------

    def _joins(self) -> dict[str, float]:
        raw = self.workers.metric("join", "banditstream_joins_total")
        return {re.sub(r'status="(\w+)"', r"\1", k): v for k, v in raw.items()}

    def _view(self, deciders) -> Group:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        made = sum(len(log.expected) for log in self.logs.values())
        joins = self._joins()
        head = Table.grid(padding=(0, 2))
        head.add_row(
            f"events [bold]{made:,}[/]/{self.o.events:,}",
            f"{made / elapsed:,.0f} decisions/s",
            f"joins rewarded [bold]{joins.get('rewarded', 0):,.0f}[/] default [bold]{joins.get('default', 0):,.0f}[/]",
            f"late rewards sent {self.sent['late']:,}",
            f"snapshots published {sum(self.workers.metric('publish', 'banditstream_snapshots_published_total').values()):,.0f}",
        )
        table = Table("domain", "snapshot in use", "snapshots", "reward (last 500)", "oracle (last 500)", "random (last 500)")
        for name, log in self.logs.items():
            table.add_row(
                name,
                deciders[name].policy_version or "baseline",
                str(len(log.swaps)),
                f"{np.mean(log.expected[-500:]):.3f}" if log.expected else "-",
                f"{np.mean(log.oracle[-500:]):.3f}" if log.oracle else "-",
                f"{np.mean(log.random[-500:]):.3f}" if log.random else "-",
            )
        return Group(head, table)

    def _summary(self, deciders) -> dict[str, Any]:
        per_domain = {name: log.figures() for name, log in self.logs.items()}
        joins = self._joins()
        dead = self.workers.metric("join", "banditstream_dead_letters_total")
        late = self.workers.metric("join", "banditstream_late_rewards_total")
        published = self.workers.metric("publish", "banditstream_snapshots_published_total")
        mean = lambda key: round(float(np.mean([d[key] for d in per_domain.values()])), 6)  # noqa: E731
        learned, random, oracle = mean("learned_reward"), mean("random_reward"), mean("oracle_reward")
        return {
            "events": int(sum(len(log.expected) for log in self.logs.values())),
            "seed": self.o.seed,
            "policy": self.o.policy,
            "learned_reward": learned,
            "random_reward": random,
            "oracle_reward": oracle,
            "gain_ratio": round((learned - random) / (oracle - random), 4) if oracle > random else None,
            "domains": per_domain,
            "pipeline": {
                "joins_rewarded": int(joins.get("rewarded", 0)),
                "joins_default": int(joins.get("default", 0)),
                "late_rewards": int(sum(late.values())),
                "dead_letters": int(sum(dead.values())),
                "snapshots_published": int(sum(published.values())),
                "rewards_sent_in_window": self.sent["in_window"],
                "rewards_never_sent": self.sent["none"],
                "rewards_sent_late": self.sent["late"],
            },
            "sdk_decide_p50_us": round(float(np.percentile(self.decide_us, 50)), 1),
            "sdk_decide_p99_us": round(float(np.percentile(self.decide_us, 99)), 1),
            "seconds": round(time.monotonic() - self.started, 1),
        }

    def _evaluate(self, sources: dict[str, PulledSnapshots]) -> dict[str, Any]:
        """Off-policy, from the joined log read back from the updates topic: the last snapshot
        each SDK held against uniform random and the logging policies (SNIPS and DR, 95%)."""
        from learner.evaluation import Fixed, LoggedBandit, Logging, Uniform
        from learner.evaluation.run import evaluate_candidates
        from streams.evaluation_log import read_updates
        from streams.serde import AvroSerde

        with self.console.status("evaluating the learned policies on the logged decisions…"):
            updates, _ = read_updates(self.kafka, self.topics.updates, AvroSerde("update", framing="single_object"))
            out: dict[str, Any] = {}
            for name, source in sources.items():
                held = source.latest()
                log = LoggedBandit.from_updates(updates, domain=name)
                candidates = [Uniform(), Logging()]
                if held is not None and not held.policy.shared:
                    candidates.append(Fixed(held.policy, "learned", seed=self.o.seed))
                run = evaluate_candidates(log, candidates, estimators=("snips", "dr"), seed=self.o.seed)
                out[name] = {"rows": len(log), "snapshot": held.version if held is not None else None,
                             **{r.name: {e: est.to_dict() for e, est in r.estimates.items()} for r in run.results}}
        return out

    def _print(self, summary: dict[str, Any]) -> None:
        p = summary["pipeline"]
        table = Table("figure", "value", title="pipeline")
        for key, label in [
            ("events", "events (decisions)"),
        ]:
            table.add_row(label, f"{summary[key]:,}")
        for key, value in p.items():
            table.add_row(key.replace("_", " "), f"{value:,}")
        table.add_row("SDK decide p50 / p99", f"{summary['sdk_decide_p50_us']:.0f} / {summary['sdk_decide_p99_us']:.0f} µs")
        table.add_row("wall time", f"{summary['seconds']:.0f} s")
        self.console.print(table)
        rewards = Table("domain", "learned", "random", "oracle", "gain over random", "regret", title="reward over the last quarter")
        for name, d in summary["domains"].items():
            rewards.add_row(name, f"{d['learned_reward']:.3f}", f"{d['random_reward']:.3f}", f"{d['oracle_reward']:.3f}",
                            f"{d['gain_ratio']:.0%}", f"{d['cumulative_regret']:,.0f}")  # fmt: skip
        rewards.add_row("[bold]mean[/]", f"{summary['learned_reward']:.3f}", f"{summary['random_reward']:.3f}",
                        f"{summary['oracle_reward']:.3f}", f"{summary['gain_ratio']:.0%}", "")  # fmt: skip
        self.console.print(rewards)
        evaluation = Table("domain", "policy", "SNIPS", "95% interval", "DR", title="off-policy, from the updates topic")
        for name, figures in summary.get("evaluation", {}).items():
            for candidate in ("learned", "logging", "uniform"):
                if candidate in figures:
                    snips, dr = figures[candidate]["snips"], figures[candidate]["dr"]
                    label = f"learned {figures['snapshot']}" if candidate == "learned" else candidate
                    evaluation.add_row(name if candidate == "learned" else "", label, f"{snips['estimate']:.3f}",
                                       f"{snips['lower']:.3f}-{snips['upper']:.3f}", f"{dr['estimate']:.3f}")
        self.console.print(evaluation)

    def _plot(self, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(2, len(self.logs), figsize=(6 * len(self.logs), 7), squeeze=False)
        for col, (name, log) in enumerate(self.logs.items()):
            t = np.arange(1, len(log.expected) + 1)
            regret = np.cumsum(np.subtract(log.oracle, log.expected))
            random_regret = np.cumsum(np.subtract(log.oracle, log.random))
            ax = axes[0][col]
            ax.plot(t, regret, label="learned (SDK)")
            ax.plot(t, random_regret, label="uniform random", linestyle="--")
            ax.set_title(f"{name}: cumulative regret")
            ax.set_xlabel("decision")
            ax.legend()
            ax = axes[1][col]
            window = max(1, min(500, len(t) // 10))
            kernel = np.ones(window) / window
            ax.plot(t[window - 1 :], np.convolve(log.expected, kernel, mode="valid"), label="learned (SDK)")
            ax.plot(t[window - 1 :], np.convolve(log.oracle, kernel, mode="valid"), label="oracle")
            ax.plot(t[window - 1 :], np.convolve(log.random, kernel, mode="valid"), label="uniform random", linestyle="--")
            ax.set_title(f"{name}: expected reward (moving average of {window})")
            ax.set_xlabel("decision")
            for row in (0, 1):
                for index, _version in log.swaps:
                    axes[row][col].axvline(index, color="grey", alpha=0.25, linewidth=0.8)
            ax.legend()
        fig.suptitle("banditstream demo: grey lines are snapshot swaps in the SDK")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
