"""Serde benchmark: encode and decode of a typical DecisionEvent, in each framing, on one core.

The event is what a router logs: 20 named context features (16 numeric, 4 categorical), 5
candidate actions with 3 numeric features each, no dense vectors, a 5-way distribution;
about 600 bytes of Avro. Events are built from a seeded generator, all distinct.

Paths, each timed over the same N events in batches of ``--batch`` whose results are dropped
as a worker drops a processed batch (best of ``--repeat`` runs; one thread, so one core;
garbage collector on, with the benchmark's own inputs frozen out of its scans as a
long-running worker's configuration would be):

* ``encode``: ``AvroSerde.encode`` per event (what the SDK does per decision);
* ``encode_batch``: ``AvroSerde.encode_batch`` over the whole list;
* ``decode``: ``AvroSerde.decode`` per payload;
* ``decode_batch``: ``AvroSerde.decode_batch`` per batch (what a worker does with a consumed
  batch);
* ``decode_batch(k)``: the same at batch sizes 10 to 10,000. A decoded event is ~5 KB of
  Python objects, so large batches outgrow the CPU caches while they are built: decoding
  in chunks of ~100 and handling each chunk before the next is markedly faster.

AvroSerde runs the compiled C codec (``streams._avrofast``) when it is built, as it is by
``pip install``; ``native_codec`` in the JSON says whether it was. For scale, the bodies
alone through the same compiled C reader/writer and through the generated Python ones it
replaces (``streams._avrocodec``, ``native=False``: what AvroSerde runs without the
extension), the same events through fastavro's ``schemaless_writer``/``schemaless_reader``,
through confluent-kafka's ``AvroSerializer``/``AvroDeserializer`` (mock registry), and
``pickle.loads`` of the same dicts: C code building the same Python objects, the usual
yardstick for any decoder that returns dicts (the C reader beats it: its map keys and
repeated strings come from a cache, pickle builds every one).

Run from the repository root::

    .venv/bin/python benchmarks/serde.py                 # 20,000 events
    .venv/bin/python benchmarks/serde.py --events 5000 --repeat 1

The last line of stdout is one JSON object: ``encode_events_per_s`` (per-event encode, the
slower framing) and ``decode_events_per_s`` (batch decode, the slower framing, so the figure
holds whichever framing a deployment's workers read), then every path per framing.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import pickle
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastavro
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from rich.console import Console
from rich.table import Table

import schemas
from streams import _avrocodec
from streams.serde import AvroSerde

TARGET_DECODE_PER_S = 150_000
SWEEP = (10, 100, 1_000, 10_000)
TOPIC = "bandit.decisions"
MODELS = ("gpt-small", "gpt-large", "claude-haiku", "llama-70b", "mistral-7b")
TASKS = ("code", "chat", "summarise", "translate", "extract")


def typical_decision(i: int, rng: random.Random) -> dict[str, Any]:
    """20 context features (16 numeric, 4 categorical), 5 actions x 3 numeric features."""
    numeric = {f"f{j:02d}": rng.gauss(0.0, 1.0) for j in range(14)}
    numeric["prompt_tokens"] = float(rng.randint(5, 4000))
    numeric["history_len"] = float(rng.randint(0, 40))
    categorical = {
        "task": rng.choice(TASKS),
        "lang": rng.choice(("en", "sv", "de", "fr")),
        "tier": rng.choice(("free", "pro", "enterprise")),
        "region": rng.choice(("eu-north-1", "us-east-1", "ap-south-1")),
    }
    weights = [rng.random() + 0.05 for _ in MODELS]
    total = sum(weights)
    probabilities = [w / total for w in weights]
    return {
        "event_id": f"routing-{i:010d}",
        "tenant": "default",
        "workspace": "main",
        "domain": "llm_routing",
        "timestamp": 1_700_000_000_000 + i * 7,
        "context": {"numeric": numeric, "categorical": categorical, "vector": []},
        "actions": [
            {
                "id": model,
                "features": {
                    "numeric": {"cost": rng.random(), "latency": rng.random(), "quality": rng.random()},
                    "categorical": {},
                    "vector": [],
                },
            }
            for model in MODELS
        ],
        "chosen": rng.randrange(len(MODELS)),
        "probabilities": probabilities,
        "policy_version": "3.2.1",
        "mode": "live",
        "deferred": False,
        "recommended": -1,
    }


def rate(fn: Callable[[list[Any]], Any], items: list[Any], batch: int, repeat: int) -> float:
    """Items per second of the best of ``repeat`` runs of ``fn`` over ``items`` in batches."""
    chunks = [items[i : i + batch] for i in range(0, len(items), batch)]
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for chunk in chunks:
            fn(chunk)
        best = min(best, time.perf_counter() - start)
    return len(items) / best


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per timed run (default 20000)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per path; the best counts (default 3)")
    parser.add_argument("--batch", type=int, default=1_000, help="events per batch (default 1000)")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    n, repeat, batch = args.events, args.repeat, args.batch
    console = Console(stderr=True)

    rng = random.Random(args.seed)
    events = [typical_decision(i, rng) for i in range(n)]
    registry = SchemaRegistryClient.new_client({"url": "mock://benchmark"})
    serdes = {
        "confluent": AvroSerde("decision", framing="confluent", registry=registry, topic=TOPIC),
        "single_object": AvroSerde("decision", framing="single_object"),
    }

    results: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for framing, serde in serdes.items():
        console.log(f"{framing}: encode/decode of {n:,} events x {repeat}")
        payloads = serde.encode_batch(events)
        sizes[framing] = round(sum(map(len, payloads)) / n)
        if serde.decode_batch(payloads) != events:
            raise SystemExit(f"{framing}: decoded events differ from the encoded ones")
        gc.freeze()
        encode, decode = serde.encode, serde.decode
        results[f"{framing}_encode"] = rate(lambda c: [encode(e) for e in c], events, batch, repeat)
        results[f"{framing}_encode_batch"] = rate(serde.encode_batch, events, batch, repeat)
        results[f"{framing}_decode"] = rate(lambda c: [decode(p) for p in c], payloads, batch, repeat)
        results[f"{framing}_decode_batch"] = rate(serde.decode_batch, payloads, batch, repeat)

    # Batch size matters: a decoded DecisionEvent is ~5 KB of Python objects, so a batch of
    # thousands no longer fits in the CPU caches while it is built.
    sweep_serde = serdes["single_object"]
    sweep_payloads = sweep_serde.encode_batch(events)
    for size in SWEEP:
        results[f"single_object_decode_batch_{size}"] = rate(sweep_serde.decode_batch, sweep_payloads, size, repeat)

    console.log("references: compiled C and generated Python codecs, fastavro, confluent-kafka, pickle")
    parsed = schemas.parsed("decision")
    codecs = {
        native: (
            _avrocodec.build_writer(schemas.load("decision"), native=native),
            _avrocodec.build_reader(schemas.load("decision"), native=native),
        )
        for native in (True, False)
    }

    def fastavro_encode(chunk: list[dict[str, Any]]) -> list[bytes]:
        out = []
        for event in chunk:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, event)
            out.append(buf.getvalue())
        return out

    bodies = fastavro_encode(events)
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    serializer, deserializer = AvroSerializer(registry, schemas.schema_str("decision")), AvroDeserializer(registry)
    framed = [serializer(e, ctx) for e in events]
    pickled = [pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL) for e in events]
    gc.freeze()
    for native, label in ((True, "c_codec"), (False, "python_codec")):
        write, read = codecs[native]
        results[f"{label}_encode"] = rate(lambda c, write=write: [write(e) for e in c], events, batch, repeat)
        results[f"{label}_decode"] = rate(lambda c, read=read: [read(b, 0) for b in c], bodies, batch, repeat)
    results["fastavro_encode"] = rate(fastavro_encode, events, batch, repeat)
    results["fastavro_decode"] = rate(
        lambda c: [fastavro.schemaless_reader(io.BytesIO(b), parsed, None) for b in c], bodies, batch, repeat
    )
    results["confluent_kafka_encode"] = rate(lambda c: [serializer(e, ctx) for e in c], events, batch, repeat)
    results["confluent_kafka_decode"] = rate(lambda c: [deserializer(p, ctx) for p in c], framed, batch, repeat)
    results["pickle_loads"] = rate(lambda c: [pickle.loads(p) for p in c], pickled, batch, repeat)

    table = Table(title=f"DecisionEvent serde: {n:,} events in batches of {batch:,}, best of {repeat}, one thread")
    table.add_column("path")
    table.add_column("framing")
    table.add_column("events/s", justify="right")
    table.add_column("us/event", justify="right")
    for framing in serdes:
        for path in ("encode", "encode_batch", "decode", "decode_batch"):
            value = results[f"{framing}_{path}"]
            table.add_row(f"AvroSerde.{path}", framing, f"{value:,.0f}", f"{1e6 / value:.1f}")
    for size in SWEEP:
        value = results[f"single_object_decode_batch_{size}"]
        table.add_row(f"AvroSerde.decode_batch({size:,})", "single_object", f"{value:,.0f}", f"{1e6 / value:.1f}")
    for key, label, framing in (
        ("c_codec_encode", "compiled C writer", "(body only)"),
        ("c_codec_decode", "compiled C reader", "(body only)"),
        ("python_codec_encode", "generated Python writer", "(body only)"),
        ("python_codec_decode", "generated Python reader", "(body only)"),
        ("fastavro_encode", "fastavro schemaless_writer", "(body only)"),
        ("fastavro_decode", "fastavro schemaless_reader", "(body only)"),
        ("confluent_kafka_encode", "confluent AvroSerializer", "confluent"),
        ("confluent_kafka_decode", "confluent AvroDeserializer", "confluent"),
        ("pickle_loads", "pickle.loads (C yardstick)", "-"),
    ):
        table.add_row(label, framing, f"{results[key]:,.0f}", f"{1e6 / results[key]:.1f}")
    console = Console()
    console.print(table)
    decode = min(results[f"{f}_decode_batch"] for f in serdes)
    encode = min(results[f"{f}_encode"] for f in serdes)
    console.print(
        f"payload: {sizes['confluent']} bytes (confluent), {sizes['single_object']} bytes (single object); "
        f"decode target {TARGET_DECODE_PER_S:,}/s: {'met' if decode >= TARGET_DECODE_PER_S else 'NOT met'}"
    )

    summary: dict[str, Any] = {
        "encode_events_per_s": round(encode),
        "decode_events_per_s": round(decode),
        "decode_target_events_per_s": TARGET_DECODE_PER_S,
        "decode_target_met": decode >= TARGET_DECODE_PER_S,
        "native_codec": _avrocodec.batch_decoder(_avrocodec.build_reader(schemas.load("decision"))) is not None,
        **{f"{key}_events_per_s": round(value) for key, value in results.items()},
        "payload_bytes_confluent": sizes["confluent"],
        "payload_bytes_single_object": sizes["single_object"],
        "events": n,
        "repeat": repeat,
        "batch": batch,
        "seed": args.seed,
        "load_average_1m": _load(),
        "python": platform.python_version(),
        "fastavro": fastavro.__version__,
    }
    print(json.dumps(summary))
    return summary


def _load() -> float | None:
    """1-minute load average at the end, so a reader can tell a busy machine from a slow path."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


if __name__ == "__main__":
    main()
