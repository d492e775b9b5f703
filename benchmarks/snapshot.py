"""Snapshot benchmark: publish, pull + verify + load, and the SDK's decide on what was pulled.

Workload: a linear Thompson sampling policy with ``--arms`` arms (default 1,000) at
``--dim`` features (default 64), each arm having learned ``--rows`` rows (default 64), so
every arm's precision is full rank and its scoring view is a dense mean and factor.

Paths (median of ``--repeat`` runs, one process):

* ``publish``: :meth:`Publisher.publish` into a local directory store: scoring view and drift
  statistics of every arm, guards, version, Avro + zstd, SHA-256, Ed25519 signatures of
  targets, snapshot and timestamp, writes. ``snapshot_bytes`` is the blob's size.
* ``pull_verify_load``: a fresh :class:`SnapshotClient` (empty cache) refreshing: root,
  timestamp, snapshot and targets verified through python-tuf's ngclient, the blob fetched and
  checked (length, SHA-256), decompressed, decoded and its policy loaded.
* ``sdk decide`` (when ``banditstream.decider`` is importable): ``Decider.decide`` with event
  emission to a real broker (the embedded Tansu stack), over a snapshot of 10 arms at the same
  dimension pulled through the same client: p50 and p99 per call, over ``--decisions`` calls.

Run from the repository root::

    .venv/bin/python benchmarks/snapshot.py
    .venv/bin/python benchmarks/snapshot.py --arms 200 --repeat 1 --no-sdk

The last line of stdout is one JSON object: ``publish_s``, ``snapshot_bytes``,
``pull_verify_load_s``, ``sdk_decide_p50_us``, ``sdk_decide_p99_us`` (null without the SDK).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.domain import DomainSettings  # noqa: E402
from publisher.guards import GuardConfig  # noqa: E402
from publisher.publish import Publisher, PublisherConfig  # noqa: E402
from publisher.pull import SnapshotClient  # noqa: E402
from publisher.repository import create_root  # noqa: E402
from publisher.signing import KeyRing  # noqa: E402
from publisher.stores import DirectoryStore  # noqa: E402


def trained(settings: DomainSettings, arms: int, rows: int, seed: int):
    rng = np.random.default_rng(seed)
    policy = settings.make_policy(seed=seed)
    dim = settings.features.dimension
    n = arms * rows
    X = rng.standard_normal((n, dim))
    X[:, 0] = 1.0
    ids = [f"arm-{i % arms:04d}" for i in range(n)]
    policy.update_batch(X, ids, X[:, 1] * 0.2 + rng.normal(0, 0.5, n))
    return policy


def bench_publish_and_pull(args, console: Console, work: Path) -> dict:
    settings = DomainSettings(policy="lin_ts", features={"dimension": args.dim})
    keys = KeyRing.generate()
    root = create_root(keys)
    store = DirectoryStore(work / "repo")
    config = PublisherConfig(guards=GuardConfig(min_samples=1))
    publisher = Publisher(store, keys, root, domains={"bench": settings}, config=config)
    console.log(f"training {args.arms:,} arms x {args.rows} rows at d={args.dim}")
    policy = trained(settings, args.arms, args.rows, seed=0)
    publish_times, sizes = [], []
    for i in range(args.repeat):
        started = time.perf_counter()
        result = publisher.publish("bench", policy)
        publish_times.append(time.perf_counter() - started)
        sizes.append(result.size)
        console.log(f"published {result.version}: {result.size:,} bytes in {publish_times[-1]:.3f}s")
        rng = np.random.default_rng(100 + i)  # a little more data for the next version
        X = rng.standard_normal((args.arms, args.dim))
        X[:, 0] = 1.0
        policy.update_batch(X, [f"arm-{j:04d}" for j in range(args.arms)], rng.random(args.arms))
    pull_times = []
    for i in range(args.repeat):
        client = SnapshotClient(store, work / f"cache-{i}", root, domain="bench")
        started = time.perf_counter()
        loaded = client.refresh()
        pull_times.append(time.perf_counter() - started)
        console.log(f"pulled, verified and loaded {loaded.version} in {pull_times[-1]:.3f}s")
    return {
        "publish_s": statistics.median(publish_times),
        "snapshot_bytes": int(statistics.median(sizes)),
        "pull_verify_load_s": statistics.median(pull_times),
        "state_bytes": len(loaded.snapshot.policy_state),
    }


def bench_sdk(args, console: Console, work: Path) -> dict:
    try:
        from banditstream.decider import Decider, PulledSnapshots
        from banditstream.devstack import LocalStack
        from streams.settings import KafkaSettings, TopicSettings
        from streams.topics import ensure_topics
    except ImportError as exc:
        console.log(f"SDK not available ({exc}): sdk_decide figures left null")
        return {}
    arms = 10
    # normalize off: the snapshot carries no normaliser statistics, and a frozen normaliser
    # without them would score every numeric feature as 0 (rows of two nonzeros, not ten)
    settings = DomainSettings(policy="lin_ts", features={"dimension": args.dim, "normalize": False})
    keys = KeyRing.generate()
    root = create_root(keys)
    store = DirectoryStore(work / "sdk-repo")
    Publisher(store, keys, root, domains={"route": settings}, config=PublisherConfig(guards=GuardConfig(min_samples=1))).publish(
        "route", trained(settings, arms, 200, seed=1)
    )
    stack = LocalStack(work / "stack", s3=False)
    info = stack.up()
    try:
        kafka = KafkaSettings(bootstrap_servers=info.kafka_bootstrap, profile=info.kafka_profile)
        topics = TopicSettings()
        ensure_topics(kafka, topics)
        source = PulledSnapshots(SnapshotClient(store, work / "sdk-cache", root, domain="route"))
        decider = Decider(
            "route", repository=source, kafka=kafka, mode="live", settings=settings, topics=topics, seed=7,
            spool_path=work / "spool", refresh_interval_s=3600,
        )  # fmt: skip
        try:
            rng = np.random.default_rng(3)
            names = [f"f{i}" for i in range(8)]
            contexts = [{**dict(zip(names, rng.standard_normal(8).tolist())), "intent": f"i{k % 5}"} for k in range(1000)]
            actions = [f"arm-{i:04d}" for i in range(arms)]
            for ctx in contexts:  # warm-up: caches, allocator, producer connection
                decider.decide(ctx, actions)
            times = np.empty(args.decisions)
            for i in range(args.decisions):
                started = time.perf_counter_ns()
                decider.decide(contexts[i % len(contexts)], actions)
                times[i] = time.perf_counter_ns() - started
            delivered = decider.flush(60)
            console.log(f"{args.decisions:,} decisions of {arms} arms at d={args.dim}, events delivered: {delivered}")
        finally:
            decider.close()
            del decider, source
            gc.collect()  # the producer disconnects before the broker goes away
    finally:
        stack.down()
    return {
        "sdk_decide_p50_us": float(np.percentile(times, 50) / 1000),
        "sdk_decide_p99_us": float(np.percentile(times, 99) / 1000),
        "sdk_arms": arms,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rows", type=int, default=64, help="rows learned per arm")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--no-sdk", action="store_true", help="skip the SDK decide measurement")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="banditstream-bench-") as tmp:
        work = Path(tmp)
        summary = bench_publish_and_pull(args, console, work)
        sdk = {} if args.no_sdk else bench_sdk(args, console, work)
    summary.setdefault("sdk_decide_p50_us", None)
    summary.setdefault("sdk_decide_p99_us", None)
    summary.update(sdk)

    table = Table(title=f"Snapshots: {args.arms:,} arms at d={args.dim}, median of {args.repeat}")
    table.add_column("path")
    table.add_column("figure", justify="right")
    table.add_row("publish (build, guard, sign, upload)", f"{summary['publish_s']:.3f} s")
    table.add_row("snapshot size (Avro + zstd)", f"{summary['snapshot_bytes'] / 1e6:.2f} MB")
    table.add_row("policy state inside (uncompressed)", f"{summary['state_bytes'] / 1e6:.2f} MB")
    table.add_row("pull + verify + load (fresh client)", f"{summary['pull_verify_load_s']:.3f} s")
    if summary["sdk_decide_p50_us"] is not None:
        label = f"SDK decide, {summary['sdk_arms']} arms, with emission"
        table.add_row(f"{label}: p50", f"{summary['sdk_decide_p50_us']:.1f} us")
        table.add_row(f"{label}: p99", f"{summary['sdk_decide_p99_us']:.1f} us")
    Console().print(table)
    keys = ("publish_s", "snapshot_bytes", "pull_verify_load_s", "sdk_decide_p50_us", "sdk_decide_p99_us")
    print(json.dumps({k: (round(summary[k], 6) if isinstance(summary[k], float) else summary[k]) for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
