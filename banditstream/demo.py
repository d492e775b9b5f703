"""`banditstream demo`: the main job on the embedded default.

Today it proves the foundation end to end: it starts the embedded stack, creates the topics,
sends seeded DecisionEvents and RewardEvents through the broker in the configured framing,
reads them back through a consumer group, checks every one arrived intact, and stops
everything it started (on success, on error and on Ctrl-C).
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from banditstream.devstack import LocalStack
from streams.client import BatchConsumer, EventProducer
from streams.serde import AvroSerde
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import ensure_topics


@dataclass
class RoundTrip:
    topic: str
    sent: int
    received: int
    intact: bool
    seconds: float


def sample_decision(i: int, rng: random.Random, domain: str) -> dict:
    actions = ["gpt-small", "gpt-large", "claude-haiku", "llama-70b"]
    weights = [rng.random() + 0.1 for _ in actions]
    total = sum(weights)
    probabilities = [w / total for w in weights]
    probabilities[-1] = 1.0 - sum(probabilities[:-1])
    return {
        "event_id": f"demo-{i:08d}",
        "domain": domain,
        "timestamp": int(time.time() * 1000),
        "context": {
            "numeric": {"prompt_tokens": float(rng.randint(10, 4000)), "history_turns": float(rng.randint(0, 12))},
            "categorical": {"task": rng.choice(["code", "chat", "summarise"]), "tier": rng.choice(["free", "pro"])},
            "vector": [],
        },
        "actions": [{"id": a, "features": {"numeric": {}, "categorical": {}, "vector": []}} for a in actions],
        "chosen": rng.randrange(len(actions)),
        "probabilities": probabilities,
        "policy_version": "",
        "mode": "live",
        "deferred": False,
        "recommended": -1,
    }


def sample_reward(decision: dict, rng: random.Random) -> dict:
    return {
        "event_id": decision["event_id"],
        "reward_id": uuid.UUID(int=rng.getrandbits(128)).hex,
        "domain": decision["domain"],
        "timestamp": decision["timestamp"] + rng.randint(100, 5000),
        "signals": {"success": float(rng.random() < 0.7), "latency_ms": rng.uniform(80, 3000)},
        "value": None,
    }


def run(*, events: int = 2000, seed: int = 7, console: Console | None = None) -> list[RoundTrip]:
    """Bring the embedded stack up, round-trip ``events`` pairs, take it down."""
    console = console or Console()
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="banditstream-demo-") as state_dir:
        stack = LocalStack(state_dir, s3=False)
        try:
            with console.status("starting the embedded broker…"):
                info = stack.up()
            console.print(f"broker on [bold]{info.kafka_bootstrap}[/] (profile {info.kafka_profile})")
            kafka = KafkaSettings(bootstrap_servers=info.kafka_bootstrap, profile=info.kafka_profile)
            topics = TopicSettings(partitions=4, update_partitions=4)
            ensure_topics(kafka, topics)
            decisions = [sample_decision(i, rng, "llm_routing") for i in range(events)]
            rewards = [sample_reward(d, rng) for d in decisions]
            results = [
                _round_trip(kafka, topics.decisions, AvroSerde("decision", framing="single_object"), decisions, console),
                _round_trip(kafka, topics.rewards, AvroSerde("reward", framing="single_object"), rewards, console),
            ]
        finally:
            with console.status("stopping the embedded stack…"):
                stack.down()
    table = Table("topic", "sent", "received", "intact", "seconds", title="demo: events through the broker")
    for r in results:
        table.add_row(r.topic, str(r.sent), str(r.received), "yes" if r.intact else "[red]NO[/]", f"{r.seconds:.2f}")
    console.print(table)
    return results


def _round_trip(kafka: KafkaSettings, topic: str, serde: AvroSerde, records: list[dict], console: Console) -> RoundTrip:
    start = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        sending = progress.add_task(f"produce → {topic}", total=len(records))
        producer = EventProducer(kafka)
        for record in records:
            producer.send(topic, serde, record)
            progress.advance(sending)
        producer.flush()
        receiving = progress.add_task(f"consume ← {topic}", total=len(records))
        received: dict[str, dict] = {}
        with BatchConsumer(kafka, f"demo-{topic}", [topic]) as consumer:
            for batch in consumer.batches(serde, idle_timeout=10):
                for record in batch.records:
                    key = record.get("reward_id") or record["event_id"]
                    received[key] = record
                consumer.commit(batch)
                progress.update(receiving, completed=len(received))
                if len(received) >= len(records):
                    break
    expected = {r.get("reward_id") or r["event_id"]: r for r in records}
    intact = all(_same(received.get(k), v) for k, v in expected.items())
    return RoundTrip(topic, len(records), len(received), intact, time.perf_counter() - start)


def _same(got: dict | None, sent: dict) -> bool:
    return got is not None and all(got[k] == v for k, v in sent.items())
