"""The whole loop on one machine, for a program of one's own: :class:`Playground`.

What ``banditstream demo`` runs, as a library: the embedded broker, the join, learner and
publisher workers (each its own ``banditstream`` process), signed snapshots in a local
directory, and one SDK :class:`~banditstream.decider.Decider` per domain, pulling and
verifying them. The examples (``examples/``) play their systems' decision loops on it.

    >>> with Playground({"router": {"policy": "beta_ts", "reward": {"expression": "value"}}}) as loop:  # doctest: +SKIP
    ...     decision = loop.decide("router", {"intent": "billing"}, ["a", "b"])
    ...     loop.reward("router", decision, 1.0)
    ...     loop.learn()          # a snapshot that learned from every decision so far
    ...     loop.decider("router").policy_version
    '1.1.0'

The play is in lockstep rounds, as the demo's: decide a round with the snapshot held, send
its rewards, then :meth:`Playground.learn` waits for a snapshot per domain that learned from
every decision so far and swaps it in. Event time is simulated (:class:`EventClock`: the
decisions of a round are stamped a millisecond apart, ending about now, and each reward by
its simulated delay), and every topic has one partition, so a seed gives the same updates in
the same order, the same learner state and the same decisions on every run.

The publisher runs without a timer: the loop asks it to publish (``SIGUSR2``) once it holds
the state learned from every decision so far, so every snapshot is a whole number of rounds,
never a part of one, however the machine's load moves the workers.

A domain with a ``promotion`` canary share is *gated*, as in production: the publisher sends
its new versions to the canary channel, the SDK routes the canary share of decisions to it,
and the product's promotion gate (:class:`~publisher.gate.Gate`) promotes or rolls it back.
Here the gate runs when the program calls :meth:`Playground.gate` (at a round's end, over the
whole log so far) rather than on the publisher's timer, so it judges at round ends only; when
no canary awaits a verdict, what was learned is published as the canary first, and its
evidence starts with the next round. :meth:`Playground.release` promotes by hand (the
operator's ``snapshot promote``) and :meth:`Playground.reset` publishes the priors (a model
reset), which a gated domain's canary receives. A gated domain's decisions are stamped at the
wall clock (the gate counts the rows decided after the canary was published), up to a round's
length in milliseconds ahead of it; a canary is published only once the wall clock has passed
the last stamp.

Waiting has no fixed limit: :meth:`Playground.learn` gives up only when nothing moved
(joins, updates learned, snapshots published) for ``patience_s``. On a failure the working
directory is kept and named; otherwise it is removed, unless it was given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from banditstream.decider import Decider, PulledSnapshots
from banditstream.devstack import LocalStack
from banditstream.workers import WorkerProcesses
from learner.domain import DomainSettings
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import ensure_topics

__all__ = ["EventClock", "Playground", "PlaygroundError", "Stalled", "estimates_table", "example_arguments", "status",
           "wait_for_snapshots", "worker_progress", "write_summary"]


class PlaygroundError(RuntimeError):
    """The loop could not go on (a worker died, nothing moved for too long)."""


class EventClock:
    """The SDK's clock (``Decider(clock=...)``): simulated event time in ms, set by the caller
    before each decision."""

    def __init__(self) -> None:
        self.ms = 0

    def __call__(self) -> float:
        return (self.ms + 0.5) / 1000  # decide() stamps int(clock() * 1000): exactly ``ms``


class Stalled(Exception):
    """:func:`wait_for_snapshots` saw nothing move for its patience."""

    def __init__(self, pending: dict[str, int], progress: tuple[float, float, float]) -> None:
        super().__init__(f"nothing moved while waiting for a snapshot of {', '.join(pending)}")
        self.pending = pending
        #: (decisions joined, updates the learner read, snapshots published)
        self.progress = progress


def wait_for_snapshots(
    sources: Mapping[str, PulledSnapshots],
    deciders: Mapping[str, Decider],
    pending: Mapping[str, int],
    *,
    progress: Callable[[], tuple[float, float, float]],
    check: Callable[[], None],
    patience_s: float,
    on_swap: Callable[[str, Any], None] | None = None,
    tick: Callable[[], None] | None = None,
) -> None:
    """Wait until each domain of ``pending`` (name -> decisions) has a verified snapshot that
    learned from at least that many, and swap it into the domain's SDK (``on_swap(name,
    active)`` after each). ``check()`` raises if a worker died; ``progress()`` is what moves
    while learning goes on; raises :class:`Stalled` when it has not moved for ``patience_s``.
    ``tick()`` runs every round of polling (a live display)."""
    pending = dict(pending)
    seen, moved = None, time.monotonic()
    while pending:
        check()
        for name in list(pending):
            try:
                active = sources[name].latest()
            except Exception:  # noqa: BLE001 - nothing published yet, or mid-publish
                active = None
            if active is not None and active.samples >= pending[name]:
                deciders[name].use(active)
                if on_swap is not None:
                    on_swap(name, active)
                del pending[name]
        if not pending:
            return
        now = progress()
        if now != seen:
            seen, moved = now, time.monotonic()
        elif time.monotonic() - moved > patience_s:
            raise Stalled(pending, now)
        if tick is not None:
            tick()
        time.sleep(0.2)


def worker_progress(workers: WorkerProcesses) -> tuple[float, float, float]:
    """Decisions joined, updates the learner read, snapshots published: what moves while a
    round is learned (from the workers' /metrics)."""

    def total(worker: str, family: str) -> float:
        return sum(workers.scrape(worker).get(family, {}).values())

    return (total("join", "banditstream_joins_total"), total("learn", "banditstream_records_in_total"),
            total("publish", "banditstream_snapshots_published_total"))  # fmt: skip


def status(console: Console, text: str):
    """A spinner on a terminal; elsewhere the text, printed once."""
    if console.is_terminal:
        return console.status(text)
    console.print(text, highlight=False)
    return contextlib.nullcontext()


class Playground:
    """Start the loop for ``domains`` (name -> a domain's settings, as in the config file's
    ``domains``); see the module docstring.

    ``seed`` seeds every domain's policy and SDK draws; ``window_s`` is the default reward
    window of domains that set none (short, so rounds are quick); ``patience_s`` how long
    :meth:`learn` waits without visible progress; ``workdir`` is kept after the run when
    given."""

    def __init__(
        self,
        domains: Mapping[str, Mapping[str, Any]],
        *,
        seed: int = 0,
        workdir: str | Path | None = None,
        console: Console | None = None,
        window_s: float = 1.0,
        patience_s: float = 90.0,
    ) -> None:
        if not domains:
            raise PlaygroundError("a playground needs at least one domain")
        self.seed = seed
        self.console = console or Console()
        self.window_s = window_s
        self.patience_s = patience_s
        self._given_workdir = workdir is not None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="banditstream-playground-"))
        self._domain_trees = {name: dict(tree) for name, tree in domains.items()}
        #: the gated domains (a ``promotion.canary_share`` above 0) and each one's gate verdicts
        self.gated = {name for name, tree in domains.items() if float((tree.get("promotion") or {}).get("canary_share") or 0) > 0}
        self.verdicts: dict[str, list[Any]] = {name: [] for name in self.gated}
        self.canary_sources: dict[str, PulledSnapshots] = {}
        # Decisions are stamped at most this far behind the wall clock. A gated domain's are
        # not behind at all: the gate counts the rows decided after its canary was published.
        self._lag_ms = 0 if self.gated else 5_000
        self._publisher: Any = None
        self.clock = EventClock()
        self.topics = TopicSettings(partitions=1, update_partitions=1)  # one order, every run
        self.workers = WorkerProcesses(self.workdir / "logs")
        self.settings: dict[str, DomainSettings] = {}
        self.sources: dict[str, PulledSnapshots] = {}
        self.deciders: dict[str, Decider] = {}
        #: domain -> decisions acted on (by the SDK, live, and replayed): what :meth:`learn`
        #: waits for; and every decision made, each of which the join turns into one update
        self.made: dict[str, int] = dict.fromkeys(domains, 0)
        self.decided = 0
        self._stamps: dict[str, int] = {}  # event id -> its decision's event time, until rewarded
        self._spooled: dict[str, int] = {}  # domain -> events its SDK had spooled when last said
        self.kafka: KafkaSettings | None = None
        self.config_path: Path | None = None
        self._stack: LocalStack | None = None
        self._publisher_log_level: int | None = None
        self._failed = False

    # -- start and stop -------------------------------------------------------------------

    def __enter__(self) -> "Playground":
        try:
            self._start()
        except BaseException:
            self._failed = True
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._failed = self._failed or exc_type is not None
        self.close()

    def _start(self) -> None:
        from publisher import SnapshotClient
        from publisher.cli_ops import generate_keys

        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        quiet = logging.getLogger("publisher")  # "nothing published yet" while polling; put back on close
        self._publisher_log_level = quiet.level
        quiet.setLevel(logging.ERROR)
        self._stack = LocalStack(self.workdir / "stack", s3=False)
        with status(self.console, "starting the embedded broker…"):
            info = self._stack.up()
        self.kafka = KafkaSettings(bootstrap_servers=info.kafka_bootstrap, profile=info.kafka_profile)
        generate_keys(self.workdir / "keys")
        self.config_path = self._write_config()
        ensure_topics(self.kafka, self.topics)
        for name in ("join", "learn", "publish"):
            self.workers.start(name, self.config_path)
        for i, name in enumerate(self._domain_trees):
            client = SnapshotClient(str(self.workdir / "snapshots"), self.workdir / "cache" / name,
                                    self.workdir / "keys" / "root.json", domain=name)  # fmt: skip
            self.sources[name] = PulledSnapshots(client)
            if name in self.gated:
                self.canary_sources[name] = PulledSnapshots(SnapshotClient(
                    str(self.workdir / "snapshots"), self.workdir / "cache" / f"{name}.canary", self.workdir / "keys" / "root.json",
                    domain=name, channel="canary"))  # fmt: skip
            self.deciders[name] = Decider(
                name, kafka=self.kafka, settings=self.settings[name], topics=self.topics, seed=self.seed + i,
                spool_path=self.workdir / "spool" / f"{name}.spool", clock=self.clock,
            )  # fmt: skip

    def _write_config(self) -> Path:
        from banditstream.config import load_settings

        domains = {}
        for name, tree in self._domain_trees.items():
            tree = json.loads(json.dumps(tree))  # a copy, and only what JSON can hold
            tree.setdefault("params", {}).setdefault("seed", self.seed)
            tree.setdefault("reward", {}).setdefault("window_s", self.window_s)
            if name in self.gated:  # judged by gate(), not on the publisher's timer
                tree["promotion"] = {**tree["promotion"], "every_s": 1e9}
            domains[name] = tree
        config = {
            "kafka": {"bootstrap_servers": self.kafka.bootstrap_servers, "profile": self.kafka.profile},
            "topics": self.topics.model_dump(),
            "stores": {"state_dir": str(self.workdir / "state"), "snapshots": str(self.workdir / "snapshots")},
            # no timer: the loop asks (SIGUSR2) once the publisher holds a whole round
            "publish": {"keys_dir": str(self.workdir / "keys"), "every_updates": 1 << 40, "every_seconds": 1e9,
                        "on_drift": "flag"},
            "sdk": {"cache_dir": str(self.workdir / "cache")},
            # one partition on loopback: records arrive at once (from an SDK per domain; a gap a
            # fetch steps over meanwhile is read again, streams._gaps)
            "join": {"sweep_interval_s": 0.2, "grace_s": 0.25, "in_flight_margin_s": 0.25, "normalizer_every_s": 0.2},
            "learn": {"emit_every_s": 0.3},
            "domains": domains,
        }  # fmt: skip
        path = self.workdir / "banditstream.json"
        path.write_text(json.dumps(config, indent=2))
        self.settings = dict(load_settings(path, env={}).domains)
        return path

    def close(self) -> None:
        """Close the SDKs (flushing their events), stop the workers and the broker; remove the
        working directory unless it was given or something failed (then it is named)."""
        for decider in self.deciders.values():
            with contextlib.suppress(Exception):
                decider.close(timeout=5)
        self.deciders.clear()
        self.workers.stop()
        if self._stack is not None:
            self._stack.down()
            self._stack = None
        if self._publisher_log_level is not None:  # the process's logging as it was before the loop
            logging.getLogger("publisher").setLevel(self._publisher_log_level)
            self._publisher_log_level = None
        if self._failed:
            self.console.print(f"worker logs and state kept in {self.workdir}", highlight=False, soft_wrap=True)
        elif not self._given_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- playing --------------------------------------------------------------------------

    def config(self) -> Any:
        """The loop's configuration tree (a ``banditstream.config.Settings``), as its workers
        load it: for the tools that take one, e.g. ``banditstream.monitor.check(loop.config())``."""
        from banditstream.config import load_settings

        return load_settings(self.config_path, env={})

    def decider(self, domain: str) -> Decider:
        try:
            return self.deciders[domain]
        except KeyError:
            raise PlaygroundError(f"no domain {domain!r} here (domains: {', '.join(self.deciders)})") from None

    def decide(self, domain: str, context: Mapping[str, Any], actions: Sequence[str], **kwargs: Any):
        """One decision, stamped a millisecond after the previous one (and no further behind
        the wall clock than 5 s, none for a gated loop). Without an ``event_id`` it gets the
        domain's name and the decision's number: the canary share is routed by the event id's
        hash, so a random one would route differently on every run."""
        self.clock.ms = max(self.clock.ms + 1, int(time.time() * 1000) - self._lag_ms)
        if kwargs.get("event_id") is None:
            kwargs["event_id"] = f"{domain}-{self.decided:09d}"
        decision = self.decider(domain).decide(context, actions, **kwargs)
        self.decided += 1
        if decision.mode == "live":  # shadow and off decisions are joined, never learned
            self.made[domain] += 1
        self._stamps[decision.event_id] = self.clock.ms
        return decision

    def reward(self, domain: str, decision: Any, value: float | Mapping[str, float], *, delay_ms: int = 1) -> None:
        """The reward of ``decision`` (a value, or named signals), stamped ``delay_ms`` after
        it (inside the window: the join counts it)."""
        stamp = self._stamps.get(decision.event_id, self.clock.ms) + delay_ms
        self.decider(domain).reward(decision.event_id, value, timestamp_ms=stamp)

    def replay(self, domain: str, path: str | Path, *, actions: Sequence[str] | None = None):
        """Produce a logged history (the JSONL interaction log or Avro files ``banditstream
        replay`` reads) as the domain's decisions and rewards; :meth:`learn` then waits for
        them too. Returns the replay's result (events, problems, assumptions)."""
        from banditstream.replay import produce, read_log
        from streams.client import EventProducer

        result = read_log(path, domain=domain, actions=list(actions) if actions else None)
        produce(result, EventProducer(self.kafka), decisions_topic=self.topics.decisions, rewards_topic=self.topics.rewards)
        self.made[domain] += len(result.decisions)
        self.decided += len(result.decisions)
        return result

    def learn(self) -> dict[str, str]:
        """Wait for a snapshot per domain that learned from every decision made so far, and
        swap it into the domain's SDK; returns domain -> version. Gives up (with the worker's
        last lines) only when nothing moved for ``patience_s``."""
        for decider in self.deciders.values():
            decider.flush(30)
        self._stamps.clear()  # the round's rewards are sent
        self._say_spooled()
        versions: dict[str, str] = {}
        for name in sorted(self.gated):
            if self.made[name]:
                versions[name] = self._follow_gated(name)
        pending = {name: n for name, n in self.made.items() if n and name not in self.gated}
        if not pending:
            return versions
        try:
            wait_for_snapshots(self.sources, self.deciders, pending, progress=lambda: worker_progress(self.workers),
                               check=self._check, patience_s=self.patience_s, tick=self._publish_asker(pending),
                               on_swap=lambda name, active: versions.__setitem__(name, active.version))  # fmt: skip
        except Stalled as stall:
            joined, learned, _ = stall.progress
            stage = "join" if joined < self.decided else "learn" if learned < sum(self.made.values()) else "publish"
            tail = "\n".join(self.workers.tail(stage, 10))
            raise PlaygroundError(f"nothing moved for {self.patience_s:.0f}s while waiting for a snapshot of "
                                  f"{', '.join(stall.pending)} ({joined:,.0f} joined, {learned:,.0f} learned of "
                                  f"{sum(self.made.values()):,} decisions); the {stage} worker's last lines:\n{tail}") from None  # fmt: skip
        return versions

    # -- gated domains ---------------------------------------------------------------------

    def gate(self, domain: str) -> Any:
        """Judge ``domain``'s pending canary now with the product's promotion gate (as
        ``banditstream snapshot gate`` does) over every decision so far; after a promotion or a
        rollback, wait for the canary carrying all that was learned and swap both channels into
        the SDK. Returns the :class:`~publisher.gate.GateDecision` (also kept in ``verdicts``)."""
        from publisher.gate import Gate, GateConfig
        from streams.evaluation_log import domain_log_reader

        self._gated(domain)
        # every decision on the log, and learned into the state the publisher holds: what a
        # verdict releases as the next canary is then all that was learned
        self._until(lambda: worker_progress(self.workers)[0] >= self.decided and self._held(domain) >= self.made[domain],
                    f"{domain}'s decisions joined and learned")  # fmt: skip
        if not self._awaiting_verdict(domain):  # what was learned goes out as the canary; its rows start now
            self._follow_gated(domain)
        settings = self.config()
        topic = settings.topics.updates
        read_log = domain_log_reader(self.kafka, topic, settings.worker_config().serde("update", topic=topic))
        decision = Gate(self._publisher_for(), read_log).run(domain, GateConfig.from_settings(settings.domains[domain].promotion))
        self.verdicts[domain].append(decision)
        if decision.committed:
            self._follow_gated(domain)
        return decision

    def release(self, domain: str) -> str:
        """Promote ``domain``'s canary to stable by hand (``banditstream snapshot promote``):
        e.g. the offline stage's warm start, once evaluated. Returns the stable version."""
        self._gated(domain)
        while True:  # a canary that awaited a verdict holds part of what was learned: promote again
            self._follow_gated(domain)
            self._publisher_for().promote(domain, None, "stable", source="canary")
            version = self._follow_gated(domain)
            if self._latest(self.sources[domain]).samples >= self.made[domain]:
                return version

    def reset(self, domain: str) -> str:
        """Publish ``domain``'s priors (a model reset; the learner's state stays): a gated
        domain's canary receives them and the gate judges them. Returns the version."""
        self._gated(domain)
        version = self._publisher_for().reset(domain).version
        self._until(lambda: getattr(self._latest(self.canary_sources[domain]), "version", None) == version, f"{domain}'s reset")
        self.decider(domain).use(self._latest(self.canary_sources[domain]), channel="canary")
        return version

    def _follow_gated(self, name: str) -> str:
        """Ask the publisher to publish once it holds everything learned, and wait until the
        canary channel holds what a round's end should: a version that learned from every
        decision so far, or one awaiting the gate's verdict once the publisher holds all that
        (it holds the new state until the verdict). Swap both channels into the SDK; returns
        the stable version."""

        def ready() -> bool:
            canary = self._latest(self.canary_sources[name])
            if canary is None or self._latest(self.sources[name]) is None:
                return False
            return canary.samples >= self.made[name] or (self._awaiting_verdict(name) and self._held(name) >= self.made[name])

        self._until(ready, f"a canary of {name} that learned from {self.made[name]:,} decisions", tick=self._publish_asker([name]))
        stable = self._latest(self.sources[name])
        self.decider(name).use(stable)
        self.decider(name).use(self._latest(self.canary_sources[name]), channel="canary")
        return stable.version

    def _say_spooled(self) -> None:
        """Say so when an SDK spooled events (a delivery slower than its timeout): they reach
        Kafka out of order, and a reward the join reads after its window is dead-lettered while
        the default is learned, so the run differs from one where nothing was spooled."""
        for name, decider in self.deciders.items():
            stats = decider.emitter_stats
            spooled = stats.spooled if stats is not None else 0
            if spooled > self._spooled.get(name, 0):
                self.console.print(f"warning: {name}'s SDK spooled {spooled - self._spooled.get(name, 0):,} events (deliveries "
                                   "slower than the emitter's timeout): they reached Kafka late and out of order", highlight=False)  # fmt: skip
                self._spooled[name] = spooled

    def _awaiting_verdict(self, name: str) -> bool:
        """The canary channel holds a version the gate has not judged yet."""
        from publisher.gate import nothing_to_gate

        head = self._publisher_for().repository(name).head()
        return nothing_to_gate(head.channel_head("stable"), head.channel_head("canary")) is None

    def _publish_asker(self, names: Iterable[str], every_s: float = 2.0) -> Callable[[], None]:
        """A tick for the waits: it asks the publisher to publish what it holds (SIGUSR2) once
        that is what a snapshot of ``names`` should hold (:meth:`_publishable`) and the wall
        clock has passed every decision's stamp (the gate counts the rows decided after a
        canary's publication, and stamps run up to a round's length ahead); then again every
        ``every_s`` (a guard failure or a lost version race publishes nothing; asking again
        when nothing is new publishes nothing)."""
        names, asked = list(names), [-math.inf]

        def ask() -> None:
            if time.monotonic() - asked[0] >= every_s and time.time() * 1000 > self.clock.ms + 1 and self._publishable(names):
                asked[0] = time.monotonic()
                os.kill(self.workers.pids()["publish"], signal.SIGUSR2)

        ask()
        return ask

    def _publishable(self, names: Iterable[str]) -> bool:
        """The publisher holds what a snapshot of ``names`` should: the state learned from every
        decision made, and for a normalising domain the join's statistics of every decision."""
        publisher = self.workers.scrape("publish")
        learned = publisher.get("banditstream_publisher_learned_updates", {})
        if not all(learned.get(f'domain="{name}"', 0.0) >= self.made[name] for name in names):
            return False
        normalising = [name for name in names if self.settings[name].features.normalize]
        if not normalising:
            return True
        join = self.workers.scrape("join")
        if sum(join.get("banditstream_joins_total", {}).values()) < self.decided:
            return False
        held = join.get("banditstream_join_normalizer_observations", {})
        shipped = publisher.get("banditstream_publisher_normalizer_observations", {})
        return all(shipped.get(f'domain="{name}"', 0.0) == held.get(f'domain="{name}"', 0.0) for name in normalising)

    def _held(self, domain: str) -> float:
        """The updates learned into the state the publisher holds for ``domain``."""
        learned = self.workers.scrape("publish").get("banditstream_publisher_learned_updates", {})
        return learned.get(f'domain="{domain}"', 0.0)

    def _gated(self, domain: str) -> None:
        self.decider(domain)
        if domain not in self.gated:
            raise PlaygroundError(f"{domain} is not gated (give it a promotion.canary_share above 0)")

    def _publisher_for(self) -> Any:
        if self._publisher is None:
            self._publisher = self.config().publisher()
        return self._publisher

    @staticmethod
    def _latest(source: PulledSnapshots) -> Any:
        try:
            return source.latest()
        except Exception:  # noqa: BLE001 - nothing published yet, or mid-publish
            return None

    def _until(self, ready: Callable[[], bool], what: str, tick: Callable[[], None] | None = None) -> None:
        """Poll ``ready`` until it holds (``tick()`` between polls); give up only when the
        workers made no progress for ``patience_s``."""
        seen, moved = None, time.monotonic()
        while not ready():
            self._check()
            if tick is not None:
                tick()
            now = worker_progress(self.workers)
            if now != seen:
                seen, moved = now, time.monotonic()
            elif time.monotonic() - moved > self.patience_s:
                self._failed = True
                raise PlaygroundError(f"nothing moved for {self.patience_s:.0f}s while waiting for {what}")
            time.sleep(0.2)

    def updates(self, domain: str | None = None) -> list[dict[str, Any]]:
        """The joined log (UpdateEvents) read back from the updates topic, for evaluation and
        stats: every decision's, once each is joined (waits as :meth:`learn` does)."""
        from streams.evaluation_log import read_updates
        from streams.serde import AvroSerde

        want = self.decided
        moved, seen = time.monotonic(), -1
        while True:
            updates, report = read_updates(self.kafka, self.topics.updates, AvroSerde("update", framing="single_object"))
            if report.records >= want:
                break
            if report.records != seen:
                moved, seen = time.monotonic(), report.records
            elif time.monotonic() - moved > self.patience_s:
                raise PlaygroundError(f"the updates topic holds {report.records:,} of {want:,} updates")
            self._check()
            time.sleep(0.5)
        return [u for u in updates if domain is None or u["domain"] == domain]

    def rounds(self, n: int, description: str = "playing") -> Any:
        """Iterate it: ``0 .. n-1`` under a rich progress bar (elapsed time included, so a
        slow :meth:`learn` shows); without a terminal, a plain line every fifth of the way."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=self.console, transient=False, disable=not self.console.is_terminal)  # fmt: skip
        with progress:
            task = progress.add_task(description, total=n)
            for i in range(n):
                yield i
                progress.advance(task)
                if not self.console.is_terminal and (i + 1) % max(1, n // 5) == 0:
                    self.console.print(f"{description}: round {i + 1}/{n}", highlight=False)

    # -- helpers --------------------------------------------------------------------------

    def _check(self) -> None:
        try:
            self.workers.check()
        except Exception as error:
            self._failed = True
            raise PlaygroundError(str(error)) from error


def example_arguments(argv: list[str] | None, *, description: str, seed: int, out: Path) -> argparse.Namespace:
    """The command line every example takes: ``--quick``, ``--seed``, ``--out DIR`` (created),
    ``--json PATH`` (default ``OUT/summary.json``) and ``--workdir DIR`` (kept)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a smaller run (under a minute)")
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--out", type=Path, default=out, help="where the PNG, the JSON and other outputs go")
    parser.add_argument("--json", type=Path, default=None, help="write the summary here (default OUT/summary.json)")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the stack's files here (default: removed)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.json = args.json or args.out / "summary.json"
    return args


def estimates_table(title: str, candidates: Mapping[str, Mapping[str, Any]], estimators: Sequence[str], *,
                    digits: int = 4) -> Any:
    """A rich table of offline estimates against the truth an example knows: per candidate
    (name -> ``{"truth": v, estimator: {"value", "low", "high"}}``), one row per estimator,
    as ``banditstream evaluate`` prints them, and whether each interval covers the truth."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("candidate", "est.", "value", "95% interval", "truth", "covers it"):
        table.add_column(column, justify="left" if column in ("candidate", "est.", "95% interval") else "right")
    for name, row in candidates.items():
        for i, estimator in enumerate(estimators):
            e = row[estimator]
            table.add_row(name if i == 0 else "", estimator.upper(), f"{e['value']:.{digits}f}",
                          f"[{e['low']:.{digits}f}, {e['high']:.{digits}f}]", f"{row['truth']:.{digits}f}" if i == 0 else "",
                          "yes" if e["low"] <= row["truth"] <= e["high"] else "NO")  # fmt: skip
    return table


def write_summary(summary: dict[str, Any], args: argparse.Namespace, console: Console, *, plot: Path, started: float) -> int:
    """An example's last step: its wall time and plot into ``summary``, the JSON to
    ``args.json``, and where both are; returns the exit code (0)."""
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["plot"] = str(plot)
    args.json.write_text(json.dumps(summary, indent=2))
    console.print(f"plot: [bold]{plot}[/]  summary: [bold]{args.json}[/]")
    return 0
