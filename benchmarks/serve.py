"""``banditstream serve`` benchmark: rank and reward over HTTP on loopback, next to the in-process Decider.

Setup, all real: the embedded Tansu broker (``LocalStack``), Ed25519 keys and a signed
snapshot (lin_ucb, ``--arms`` arms, 16 features) in a directory store, and ``banditstream
serve`` started as its own process (one uvicorn worker: one core) with that config.

Phases, each ``--seconds`` long, ``--clients`` keep-alive connections (raw asyncio sockets,
HTTP/1.1, in this process):

* ``rank (closed loop)``: every client sends its next Personalizer v1.0 rank as soon as the
  last one is answered: the most rank requests/s the service answers (``rank_per_s``);
* ``reward (closed loop)``: the same with rewards for the ranked events (``reward_per_s``);
* ``rank at half rate``: ranks sent at half the closed-loop rate, spread evenly over the
  clients (open loop: each request's latency counts from its scheduled start, so a stalled
  server is not hidden): ``rank_p50_ms``, ``rank_p99_ms``;
* ``Decider.decide`` in this process on the same snapshot, emitting to the same broker:
  ``decider_decide_p99_us``.

The client shares the machine's cores with the server; on 2 cores it takes one of them.

    .venv/bin/python benchmarks/serve.py
    .venv/bin/python benchmarks/serve.py --seconds 3 --clients 32

The last line of stdout is one JSON object: ``rank_per_s``, ``rank_p50_ms``, ``rank_p99_ms``,
``reward_per_s``, ``decider_decide_p99_us`` (and the saturated latencies beside them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from banditstream.decider import Decider  # noqa: E402
from banditstream.devstack import LocalStack  # noqa: E402
from learner.domain import DomainSettings  # noqa: E402
from publisher.cli_ops import generate_keys, load_keys  # noqa: E402
from publisher.guards import GuardConfig  # noqa: E402
from publisher.publish import Publisher, PublisherConfig  # noqa: E402
from publisher.pull import SnapshotClient  # noqa: E402
from publisher.stores import DirectoryStore  # noqa: E402
from streams.settings import KafkaSettings, TopicSettings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402

KEY = "bench-key"
DOMAIN = "bench"


def domain_settings() -> DomainSettings:
    return DomainSettings.model_validate({"policy": "lin_ucb", "params": {"alpha": 0.1, "eps0": 0.1, "seed": 1},
                                          "features": {"dimension": 16, "normalize": False}})  # fmt: skip


def publish(work: Path, arms: list[str]) -> None:
    generate_keys(work / "keys")
    keys, root = load_keys(work / "keys")
    settings = domain_settings()
    policy, encoder = settings.make_policy(), settings.encoder()
    rng = np.random.default_rng(0)
    X = np.stack([encoder.context_vector({"numeric": {"user.age": float(a)}, "categorical": {"device": "mobile"}, "vector": []})
                  for a in rng.uniform(0, 1, 2000)])  # fmt: skip
    policy.update_batch(X, [arms[i] for i in rng.integers(0, len(arms), len(X))], rng.uniform(0, 1, len(X)).tolist())
    publisher = Publisher(DirectoryStore(work / "snapshots"), keys, root, domains={DOMAIN: settings},
                          config=PublisherConfig(guards=GuardConfig(min_samples=1)))  # fmt: skip
    publisher.publish(DOMAIN, policy)


def rank_body(arms: list[str], i: int) -> bytes:
    return json.dumps({
        "contextFeatures": [{"user": {"age": (i % 100) / 100, "device": "mobile"}}, {"timeOfDay": "morning"}],
        "actions": [{"id": a, "features": [{"kind": a}]} for a in arms],
    }).encode()  # fmt: skip


def request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bench\r\nOcp-Apim-Subscription-Key: {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> tuple[int, bytes]:
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return status, (await reader.readexactly(length) if length else b"")


async def closed_loop(port: int, clients: int, seconds: float, make) -> tuple[int, list[float], list[bytes]]:
    """Every client sends its next request when the last is answered; (answered, latencies, bodies)."""
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []
    bodies: list[bytes] = []
    errors = 0

    async def client(c: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        i = 0
        try:
            while time.perf_counter() < deadline:
                payload = make(c, i)
                started = time.perf_counter()
                status, body = await exchange(reader, writer, payload)
                latencies.append(time.perf_counter() - started)
                if status >= 300:
                    errors += 1
                elif body:
                    bodies.append(body)
                i += 1
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"{errors} requests failed")
    return int(len(latencies) / elapsed), latencies, bodies


async def open_loop(port: int, clients: int, seconds: float, rate: float, make) -> list[float]:
    """Requests scheduled every ``clients / rate`` seconds per client; latency from the schedule."""
    interval = clients / rate
    start = time.perf_counter() + 0.05
    latencies: list[float] = []

    async def client(c: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        due = start + c * interval / clients
        i = 0
        try:
            while due < start + seconds:
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                status, _ = await exchange(reader, writer, make(c, i))
                if status >= 300:
                    raise RuntimeError(f"status {status}")
                latencies.append(time.perf_counter() - due)
                due += interval
                i += 1
        finally:
            writer.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return latencies


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def run(args: argparse.Namespace, console: Console) -> dict:
    arms = [f"arm-{i}" for i in range(args.arms)]
    with tempfile.TemporaryDirectory(prefix="banditstream-bench-serve-") as tmp:
        work = Path(tmp)
        stack = LocalStack(work / "stack", s3=False)
        info = stack.up()
        server = None
        try:
            kafka = KafkaSettings(bootstrap_servers=info.kafka_bootstrap, profile=info.kafka_profile)
            topics = TopicSettings(partitions=4, update_partitions=4)
            ensure_topics(kafka, topics)
            publish(work, arms)
            port = args.port or _free_port()
            config = {
                "kafka": kafka.model_dump(), "topics": topics.model_dump(),
                "stores": {"state_dir": str(work / "state"), "snapshots": str(work / "snapshots")},
                "publish": {"keys_dir": str(work / "keys")}, "sdk": {"cache_dir": str(work / "cache")},
                "serve": {"keys": {"bench": KEY}, "domain": DOMAIN, "port": port, "check_event_ids": False},
                "domains": {DOMAIN: domain_settings().model_dump(mode="json")},
            }  # fmt: skip
            (work / "config.yaml").write_text(yaml.safe_dump(config))
            log = open(work / "serve.log", "wb")
            server = subprocess.Popen([sys.executable, "-m", "banditstream.cli", "serve", "--config", str(work / "config.yaml")],
                                      stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
            _wait_ready(port, server, work / "serve.log")
            bodies = [rank_body(arms, i) for i in range(100)]
            rank_path = "/personalizer/v1.0/rank"

            def make_rank(c: int, i: int) -> bytes:
                return request(rank_path, bodies[(c * 7 + i) % len(bodies)])

            asyncio.run(closed_loop(port, args.clients, 1.0, make_rank))  # warm-up
            rank_rate, rank_lat, answers = asyncio.run(closed_loop(port, args.clients, args.seconds, make_rank))
            event_ids = [json.loads(b)["eventId"] for b in answers]
            reward = b'{"value": 0.5}'

            def make_reward(c: int, i: int) -> bytes:
                return request(f"/personalizer/v1.0/events/{event_ids[(c * 997 + i) % len(event_ids)]}/reward", reward)

            reward_rate, reward_lat, _ = asyncio.run(closed_loop(port, args.clients, args.seconds, make_reward))
            half = asyncio.run(open_loop(port, args.clients, args.seconds, rank_rate / 2, make_rank))

            decide_us = _decider_p99(work, kafka, topics, arms, args.decisions)
        finally:
            if server is not None:
                server.terminate()
                server.wait(30)
            stack.down()
    figures = {
        "rank_per_s": rank_rate,
        "rank_p50_ms": round(pct(half, 50) * 1e3, 3),
        "rank_p99_ms": round(pct(half, 99) * 1e3, 3),
        "reward_per_s": reward_rate,
        "decider_decide_p99_us": round(decide_us, 1),
        "rank_saturated_p50_ms": round(pct(rank_lat, 50) * 1e3, 3),
        "rank_saturated_p99_ms": round(pct(rank_lat, 99) * 1e3, 3),
        "reward_saturated_p99_ms": round(pct(reward_lat, 99) * 1e3, 3),
        "half_rate_per_s": int(rank_rate / 2),
        "clients": args.clients,
        "arms": args.arms,
    }
    table = Table("phase", "requests/s", "p50 ms", "p99 ms", title=f"banditstream serve on loopback ({args.clients} clients, {args.arms} arms)")
    table.add_row("rank (closed loop)", f"{rank_rate:,}", f"{figures['rank_saturated_p50_ms']:.2f}", f"{figures['rank_saturated_p99_ms']:.2f}")
    table.add_row("reward (closed loop)", f"{reward_rate:,}", f"{pct(reward_lat, 50) * 1e3:.2f}", f"{figures['reward_saturated_p99_ms']:.2f}")
    table.add_row(f"rank at half rate ({rank_rate // 2:,}/s)", f"{len(half) / args.seconds:,.0f}", f"{figures['rank_p50_ms']:.2f}",
                  f"{figures['rank_p99_ms']:.2f}")  # fmt: skip
    table.add_row("Decider.decide in process", "", "", f"{decide_us / 1e3:.3f}")
    console.print(table)
    return figures


def _decider_p99(work: Path, kafka: KafkaSettings, topics: TopicSettings, arms: list[str], n: int) -> float:
    client = SnapshotClient(work / "snapshots", work / "cache-bench", work / "keys" / "root.json", domain=DOMAIN)
    decider = Decider(DOMAIN, client, kafka=kafka, topics=topics, settings=domain_settings(), spool_path=work / "bench.spool", seed=3)
    try:
        actions = [{"id": a, "features": {"numeric": {}, "categorical": {"kind": a}, "vector": []}} for a in arms]
        contexts = [{"numeric": {"user.age": (i % 100) / 100}, "categorical": {"user.device": "mobile", "timeOfDay": "morning"},
                     "vector": []} for i in range(100)]  # fmt: skip
        times = []
        for i in range(n):
            started = time.perf_counter()
            decider.decide(contexts[i % 100], actions)
            times.append(time.perf_counter() - started)
        decider.flush(30)
        return pct(times[n // 10 :], 99) * 1e6
    finally:
        decider.close()


def _wait_ready(port: int, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"banditstream serve exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("banditstream serve did not become ready in 60 s")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64, help="concurrent keep-alive connections")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    parser.add_argument("--arms", type=int, default=5, help="actions per rank")
    parser.add_argument("--decisions", type=int, default=20_000, help="in-process decide calls")
    parser.add_argument("--port", type=int, default=0, help="the service's port (default: a free one)")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    figures = run(args, console)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
