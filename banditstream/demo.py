"""`banditstream demo`: the whole loop on one machine, learning a simulated workload.

What runs (every piece real, every process stopped at the end, on error and on Ctrl-C):

- the embedded stack: the Tansu broker (and SeaweedFS S3 with ``--s3``; otherwise the
  snapshot repository is a local directory);
- the join, learner and publisher workers, each its own ``banditstream`` process;
- the SDK (:class:`~banditstream.decider.Decider`, one per domain) pulling verified snapshots
  and deciding for a simulated workload with a known ground truth
  (:mod:`banditstream.simulate`); rewards come back with realistic delays, some never
  (the join's default reward), a few too late (dead-lettered).

The workload runs in lockstep rounds: the SDK decides a round of requests with the snapshot
it holds, their rewards are sent, and the next round starts once a snapshot that has learned
from every decision so far is published, verified and swapped in. Event time is simulated:
the decisions of a round are stamped one millisecond apart (and their rewards by their
simulated delays), so the join emits the same updates in the same order, the learner folds
them in the same blocks, and every snapshot the SDK decides with holds the same state on
every run. So the seed alone fixes the workload, every decision, and the reward, regret and
off-policy figures. What varies with the machine's timing is reported as such
(``timing_dependent`` in the summary): how many intermediate snapshots the publisher made
between rounds, and so the versions' numbers, decide latency and wall time. A run stays
exact as long as every reward reaches the join before its decision's window is closed; the
summary says so (``reproducible``) and names what broke it otherwise.

Waiting for learning has no fixed limit: a round may go without visible progress (joins,
learned updates, snapshots) for the join's wait plus 30 s plus ten times as long as deciding
the round took, so a slow or busy machine is given proportionally longer. Progress shows
as a live panel on a terminal, and as a plain line every few seconds otherwise. A failure
keeps the working directory and names it, with the last lines of the worker that failed.

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
from banditstream.playground import EventClock, Stalled, status, wait_for_snapshots, worker_progress
from banditstream.simulate import ENVIRONMENTS, Environment, make_environment
from banditstream.workers import WorkerExited, WorkerProcesses
from learner.domain import DomainSettings
from learner.policies import Portfolio
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import ensure_topics

DEFAULT_DOMAINS = ("llm_routing", "support_templates")


class DemoError(RuntimeError):
    """The demo could not run to the end (a worker died, the loop stalled)."""


@dataclass
class DemoOptions:
    events: int = 20_000
    domains: tuple[str, ...] = DEFAULT_DOMAINS
    policy: str = "portfolio"
    seed: int = 7
    round_size: int = 1000
    window_s: float = 3.0
    no_reward_rate: float = 0.10
    late_rate: float = 0.03
    s3: bool = False
    json_path: Path | None = None
    plot_path: Path | None = Path("banditstream-demo.png")
    workdir: Path | None = None
    #: A round may go this many times as long as deciding it took without visible progress
    #: (on top of the join's wait and 30 s) before the demo gives up.
    patience: float = 10.0
    #: Seconds between progress lines when the output is not a terminal.
    progress_every_s: float = 5.0


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
    """Run the demo; returns the summary (also written to ``options.json_path``).

    On a failure the working directory (worker logs, state, snapshots) is kept and named."""
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
    failed = False
    try:
        with status(console, "starting the embedded stack…"):
            info = stack.up()
        console.print(f"broker [bold]{info.kafka_bootstrap}[/]" + (f", S3 [bold]{info.s3_endpoint}[/]" if info.s3_endpoint else ""))
        return _Demo(options, workdir, info, workers, console).run()
    except DemoError:
        failed = True  # its message names the kept directory
        raise
    except Exception:
        failed = True
        console.print(f"the demo failed; its worker logs are kept in {workdir}", highlight=False, soft_wrap=True)
        raise
    finally:
        workers.stop()
        stack.down()
        signal.signal(signal.SIGTERM, previous)
        if options.workdir is None and not failed:
            shutil.rmtree(workdir, ignore_errors=True)


def _raise_keyboard_interrupt(*_):
    raise KeyboardInterrupt


class _Display:
    """The live panel on a terminal (at most four redraws a second); elsewhere a plain
    progress line every ``every_s`` seconds, and the final panel once at the end."""

    def __init__(self, console: Console, panel, line, every_s: float):
        self.console, self.panel, self.line = console, panel, line
        self.every_s = every_s if not console.is_terminal else 0.25
        self._live: Live | None = None
        self._next = 0.0

    def __enter__(self) -> "_Display":
        self._next = time.monotonic() + self.every_s
        if self.console.is_terminal:
            self._live = Live(self.panel(), console=self.console, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
        elif exc[0] is None:
            self.console.print(self.panel())

    def update(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every_s
        if self._live is not None:
            self._live.update(self.panel())
        else:
            self.console.print(self.line(), highlight=False, soft_wrap=True)


def live_panel(head: str, counts: str, rows: list[tuple]) -> Group:
    """The panel shown while the demo runs; ``rows``: (domain, snapshot version, swaps,
    then the mean expected reward of the last 500 decisions: the SDK's, oracle, random)."""
    table = Table("domain", "snapshot", "swaps", "reward", "oracle", "random",
                  caption="expected reward of the last 500 decisions")  # fmt: skip
    for name, version, swaps, *rewards in rows:
        table.add_row(name, version or "baseline", str(swaps), *("-" if r is None else f"{r:.3f}" for r in rewards))
    return Group(head, counts, table)


def _acting(decider: Decider | None) -> dict[str, Any]:
    """A portfolio domain's acting member at the end, and how many switches its snapshot records."""
    active = None if decider is None else decider.active_policy
    if active is None or not isinstance(active.policy, Portfolio):
        return {}
    return {"acting": active.policy.acting_label, "switches": len(active.policy.switches)}


def summary_tables(summary: dict[str, Any]) -> list[Table]:
    """The tables printed at the end (each readable at 80 columns)."""
    p = summary["pipeline"]
    pipeline = Table("figure", "value", title="pipeline", caption="* varies with timing, not the seed")
    pipeline.add_row("events (decisions)", f"{summary['events']:,}")
    pipeline.add_row("rounds", f"{summary['rounds']:,}")
    for key, value in p.items():
        star = " *" if f"pipeline.{key}" in summary["timing_dependent"] else ""
        pipeline.add_row(key.replace("_", " ") + star, f"{value:,}")
    pipeline.add_row("SDK decide p50 / p99 *", f"{summary['sdk_decide_p50_us']:.0f} / {summary['sdk_decide_p99_us']:.0f} µs")
    pipeline.add_row("wall time *", f"{summary['seconds']:.0f} s")
    acting = [f"{name}: {d['acting']} ({d['switches']} switches)" for name, d in summary["domains"].items() if "acting" in d]
    rewards = Table("domain", "learned", "random", "oracle", "gain over random", "regret", title="reward over the last quarter",
                    caption=f"acting at the end: {'; '.join(acting)}" if acting else None)  # fmt: skip
    for name, d in summary["domains"].items():
        rewards.add_row(name, f"{d['learned_reward']:.3f}", f"{d['random_reward']:.3f}", f"{d['oracle_reward']:.3f}",
                        f"{d['gain_ratio']:.0%}", f"{d['cumulative_regret']:,.0f}")  # fmt: skip
    rewards.add_row("[bold]mean[/]", f"{summary['learned_reward']:.3f}", f"{summary['random_reward']:.3f}",
                    f"{summary['oracle_reward']:.3f}", f"{summary['gain_ratio']:.0%}", "")  # fmt: skip
    evaluation = Table("domain", "policy", "SNIPS", "95% interval", "DR", title="off-policy, from the updates topic")
    for name, figures in summary.get("evaluation", {}).items():
        for candidate in ("learned", "logging", "uniform"):
            if candidate in figures:
                snips, dr = figures[candidate]["snips"], figures[candidate]["dr"]
                label = f"learned {figures['snapshot']}" if candidate == "learned" else candidate
                evaluation.add_row(name if candidate == "learned" else "", label, f"{snips['estimate']:.3f}",
                                   f"{snips['lower']:.3f}-{snips['upper']:.3f}", f"{dr['estimate']:.3f}")  # fmt: skip
    return [pipeline, rewards, evaluation]


class _Workers(WorkerProcesses):
    def check(self) -> None:
        try:
            super().check()
        except WorkerExited as exc:
            raise DemoError(f"the {exc.name} worker {exc.how}\n{self.kept(exc.name)}") from None

    def metric(self, name: str, family: str) -> dict[str, float]:
        """``labels -> value`` of one metric family from a worker's /metrics."""
        return self.scrape(name).get(family, {})

    def kept(self, name: str, lines: int = 20) -> str:
        """Where the logs are kept, and the last ``lines`` of the named worker's."""
        tail = "\n".join(f"  {line}" for line in self.tail(name, lines)) or "  (empty)"
        return f"worker logs kept in {self.workdir}; the last lines of {self.log_path(name).name}:\n{tail}"


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
        self.clock = EventClock()
        self.deciders: dict[str, Decider] = {}
        self.rounds = 0
        self.drift_flagged = 0  # swaps to a snapshot whose drift flag made the SDK use its baseline
        self.stage = "starting the workers"
        self.display = _Display(console, self._view, self._line, options.progress_every_s)

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
            params: dict[str, Any] = {"seed": self.o.seed}  # the default policy runs with its defaults
            if self.o.policy in ("lin_ts", "shared_lin_ts"):  # the settings these were run with before lin_igw
                params.update(v=0.3, eps0=0.02)
            elif self.o.policy in ("lin_ucb", "shared_lin_ucb"):
                params.update(alpha=0.5, eps0=0.02)
            shared = self.o.policy.startswith("shared_")
            domains[name] = {
                "policy": self.o.policy,
                "params": params,
                "features": {"dimension": 128, "normalize": False, "shared": shared, "interactions": shared},
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
        repository = "s3://banditstream-demo/snapshots" if self.o.s3 else str(self.workdir / "snapshots")
        deciders = self.deciders
        sources: dict[str, PulledSnapshots] = {}
        for i, name in enumerate(self.o.domains):
            client = SnapshotClient(
                repository, self.workdir / "cache" / name, self.workdir / "keys" / "root.json", domain=name,
                s3=self._s3_kwargs() if self.o.s3 else None,
            )  # fmt: skip
            sources[name] = PulledSnapshots(client)
            deciders[name] = Decider(
                name, kafka=self.kafka, settings=domain_settings[name], topics=self.topics, seed=self.o.seed + i,
                spool_path=self.workdir / "spool" / f"{name}.spool", clock=self.clock,
            )  # fmt: skip
        rng = np.random.default_rng(self.o.seed)
        per_domain = {name: 0 for name in self.o.domains}
        try:
            with self.display:
                made = 0
                while made < self.o.events:
                    self.workers.check()
                    # a short first round: the baseline decides it, so learning starts sooner
                    size = min(self.o.round_size if made else max(10, self.o.round_size // 5), self.o.events - made)
                    self.stage = f"deciding round {self.rounds + 1}"
                    began = time.monotonic()
                    self._round(size, made, rng, per_domain)
                    made += size
                    self.rounds += 1
                    self.stage = f"learning round {self.rounds}"
                    self._await_learning(per_domain, sources, self._patience(time.monotonic() - began))
                self._send_late()  # the last round's too-late rewards, for the join to refuse
                for decider in deciders.values():
                    decider.flush(30)
                self.stage = "refusing late rewards"
                self._await_dead_letters(self._patience(0.0))
            summary = self._summary(deciders)
            with status(self.console, "evaluating the learned policies on the logged decisions…"):
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

    def _round(self, size: int, offset: int, rng, per_domain) -> None:
        """Decide ``size`` requests, each reward sent once simulated time reaches its stamp."""
        self._send_late()
        rewards: list[tuple[int, str, Decider, dict[str, float]]] = []  # a heap by due time
        window_ms = int(self.o.window_s * 1000)
        # A millisecond apart, ending about now: never ahead of the wall clock (the join caps
        # such stamps), always after the previous round.
        start = max(int(time.time() * 1000) - size, self.clock.ms + 1)
        for k in range(size):
            decided_at = self.clock.ms = start + k
            self._send_due(rewards, decided_at)
            name = self.o.domains[(offset + k) % len(self.o.domains)]
            decider, log = self.deciders[name], self.logs[name]
            env = log.env
            context = env.sample_context(rng)
            t0 = time.perf_counter()
            decision = decider.decide(context, env.actions, event_id=f"{name}-{offset + k:07d}")
            self.decide_us.append((time.perf_counter() - t0) * 1e6)
            outcome = env.outcome(context, decision.action, rng)
            values = env.expected_rewards(context)
            log.expected.append(float(values[decision.index]))
            log.oracle.append(float(values.max()))
            log.random.append(float(values.mean()))
            log.realised.append(outcome.reward)
            per_domain[name] += 1
            fate = rng.random()
            if fate < self.o.no_reward_rate:
                self.sent["none"] += 1
            elif fate < self.o.no_reward_rate + self.o.late_rate:
                self.late_pending.append((name, decider, decision.event_id, outcome.signals, decided_at + int(1.5 * window_ms)))
            else:
                delay = min(rng.exponential(0.1 * window_ms), 0.5 * window_ms)
                heapq.heappush(rewards, (decided_at + int(delay), decision.event_id, decider, outcome.signals))
            if k % 100 == 99:
                self.display.update()
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

    def _patience(self, decide_s: float) -> float:
        """How long a round may go without visible progress: the join's wait (the window,
        its 2 s grace and 1 s in-flight margin), 30 s, ``patience`` times as long as deciding
        the round took (a slow or busy machine is slow at both), and two minutes more while
        the workers start."""
        startup = 120.0 if self.rounds <= 1 else 0.0
        return self.o.window_s + 3.0 + 30.0 + self.o.patience * decide_s + startup

    def _progress(self) -> tuple[float, float, float]:
        return worker_progress(self.workers)

    def _await_dead_letters(self, patience: float) -> None:
        """Let the join refuse the last late rewards before the summary counts them; the
        summary says so if it has not after ``patience`` seconds."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            self.workers.check()
            late = sum(self.workers.metric("join", "banditstream_late_rewards_total").values())
            if late >= self.sent["late"]:
                return
            self.display.update()
            time.sleep(0.2)

    def _await_learning(self, per_domain, sources, patience: float) -> None:
        """Wait for a snapshot per domain that learned from every decision made so far; give
        up only when nothing has moved (see :meth:`_progress`) for ``patience`` seconds."""

        def swapped(name: str, active) -> None:
            log = self.logs[name]
            if not log.swaps or log.swaps[-1][1] != active.version:
                log.swaps.append((len(log.expected), active.version))
                self.drift_flagged += active.drift_flag

        try:
            wait_for_snapshots(sources, self.deciders, per_domain, progress=self._progress, check=self.workers.check,
                               patience_s=patience, on_swap=swapped, tick=self.display.update)  # fmt: skip
        except Stalled as stall:
            made = sum(per_domain.values())
            joined, learned, _ = stall.progress
            silent = [name for name in ("join", "learn", "publish") if not self.workers.scrape(name)]
            stage = silent[0] if silent else "join" if joined < made else "learn" if learned < made else "publish"
            read = {topic: sum(v for k, v in self.workers.metric("join", "banditstream_records_in_total").items()
                               if f'topic="{topic}"' in k) for topic in (self.topics.decisions, self.topics.rewards)}  # fmt: skip
            raise DemoError(
                f"round {self.rounds}: nothing moved for {patience:.0f}s while waiting for a snapshot of "
                f"{', '.join(stall.pending)} that learned from all {made:,} decisions so far "
                f"({joined:,.0f} joined, {learned:,.0f} read by the learner"
                + (f"; the {stage} worker does not answer on /metrics" if silent else "")
                + f"; the join read {read[self.topics.decisions]:,.0f} decisions and {read[self.topics.rewards]:,.0f} "
                f"rewards; the SDK holds {sum(d.in_flight for d in self.deciders.values()):,} events in its "
                f"producers and {sum(d.spool_depth for d in self.deciders.values()):,} in its spools"
                + f")\n{self.workers.kept(stage)}"
            ) from None

    # -- output ---------------------------------------------------------------------------

    def _joins(self) -> dict[str, float]:
        raw = self.workers.metric("join", "banditstream_joins_total")
        return {re.sub(r'status="(\w+)"', r"\1", k): v for k, v in raw.items()}

    def _made(self) -> int:
        return sum(len(log.expected) for log in self.logs.values())

    def _view(self) -> Group:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        made = self._made()
        joins = self._joins()
        published = sum(self.workers.metric("publish", "banditstream_snapshots_published_total").values())
        rows = [
            (name, self.deciders[name].policy_version if name in self.deciders else "", len(log.swaps),
             *(float(np.mean(values[-500:])) if values else None for values in (log.expected, log.oracle, log.random)))
            for name, log in self.logs.items()
        ]  # fmt: skip
        return live_panel(
            f"events [bold]{made:,}[/]/{self.o.events:,}  {made / elapsed:,.0f} decisions/s  {self.stage}",
            f"joined [bold]{joins.get('rewarded', 0):,.0f}[/] rewarded + [bold]{joins.get('default', 0):,.0f}[/] default  "
            f"late rewards {self.sent['late']:,}  snapshots {published:,.0f}",
            rows,
        )

    def _line(self) -> str:
        """One plain progress line, for output that is not a terminal."""
        joined = sum(self._joins().values())
        published = sum(self.workers.metric("publish", "banditstream_snapshots_published_total").values())
        return (f"{time.monotonic() - self.started:5.0f}s  {self._made():,}/{self.o.events:,} decided, {joined:,.0f} joined, "
                f"{published:,.0f} snapshots; {self.stage}")  # fmt: skip

    def _summary(self, deciders) -> dict[str, Any]:
        per_domain = {name: log.figures() | _acting(deciders.get(name)) for name, log in self.logs.items()}
        joins = self._joins()
        dead = self.workers.metric("join", "banditstream_dead_letters_total")
        late = self.workers.metric("join", "banditstream_late_rewards_total")
        published = self.workers.metric("publish", "banditstream_snapshots_published_total")
        mean = lambda key: round(float(np.mean([d[key] for d in per_domain.values()])), 6)  # noqa: E731
        learned, random, oracle = mean("learned_reward"), mean("random_reward"), mean("oracle_reward")
        broken = []  # what made this run differ from another with the same seed, if anything
        rewarded, refused = int(joins.get("rewarded", 0)), int(sum(late.values()))
        if (rewarded, refused) != (self.sent["in_window"], self.sent["late"]):
            broken.append(f"the join counted {rewarded:,} rewarded and {refused:,} late of {self.sent['in_window']:,} and "
                          f"{self.sent['late']:,} sent: rewards reached it after their window closed (a stall), or it "
                          f"had not counted them all")  # fmt: skip
        if self.drift_flagged:
            broken.append(f"{self.drift_flagged} snapshot(s) carried a drift flag, which depends on the intermediate snapshots")
        switched = [name for name, d in per_domain.items() if d.get("switches")]
        if switched:  # the publisher rates the members on each row with the snapshot before it
            broken.append(f"the portfolio of {', '.join(switched)} switched members, on evidence that depends on the "
                          "intermediate snapshots")  # fmt: skip
        return {
            "events": self._made(),
            "seed": self.o.seed,
            "policy": self.o.policy,
            "rounds": self.rounds,
            "reproducible": not broken,
            "not_reproducible_because": broken,
            #: figures that depend on the machine's timing, not on the seed
            "timing_dependent": ["pipeline.snapshots_published", "evaluation.*.snapshot", "sdk_decide_p50_us",
                                 "sdk_decide_p99_us", "seconds"],
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

        deadline = time.monotonic() + 60
        while True:
            updates, report = read_updates(self.kafka, self.topics.updates, AvroSerde("update", framing="single_object"))
            if report.records >= self._made():  # one update per decision
                break
            # a read of the embedded broker came back short once, under load: read again
            if time.monotonic() > deadline:
                raise DemoError(f"reading {self.topics.updates} back gave {report.records:,} of {self._made():,} updates; "
                                f"worker logs kept in {self.workdir}")  # fmt: skip
            self.console.print(f"read {report.records:,} of {self._made():,} updates back; reading again", highlight=False)
            time.sleep(1.0)
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
        for table in summary_tables(summary):
            self.console.print(table)
        for reason in summary["not_reproducible_because"]:
            self.console.print(f"[yellow]not reproducible:[/] {reason}", highlight=False)

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
