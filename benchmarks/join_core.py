"""Join core benchmark: the join's per-pair work in one process, without Kafka.

The pipeline benchmark (``benchmarks/pipeline.py``) times the join as it runs, beside the broker,
the learner, a standby replica and the load generator on two cores. Its figures move by a
quarter between runs with the VM's state, which hides a change of a few microseconds. This one
times only what the join does with a batch of records, on the same traffic, so a change to
that code shows.

The traffic is the pipeline benchmark's (``make_pairs``: three domains, a per-arm Thompson
router at d=16, a shared ranker with 5 candidates at d=32, a per-arm LinUCB picker at d=24),
for one partition at ``--rate`` decisions per second of event time (default 5,000, what each of
the pipeline benchmark's 4 partitions gets at 20,000 pairs/s). Rewards come 5-60 % of the 1 s
window after their decision. Records are read in time order, in batches of
``JoinOptions.batch_max``. Each batch goes through the stages the worker runs, timed apart:

* ``decode``: Avro single-object payloads to dicts (``AvroSerde.decode_batch``, per topic);
* ``validate``: per record, the partition's offset bookkeeping (``handled``),
  ``Validator.validate_decision`` / ``validate_reward`` with the encoded size, and the
  record's ``DeadLetter`` source, as the worker builds it;
* ``join``: the acted rows' encoding (``JoinCore.encode``), then per record the clocks
  (``observe``) and ``JoinCore.decision`` / ``reward``; then ``batch_read``;
* ``fire``: ``JoinCore.fire``: the decisions due, finalised with their rewards;
* ``persist``: ``PartitionState.changes`` (the pickled entries) written as the worker writes
  them (``PartitionState.write``, one RocksDB write batch);
* ``emit``: the UpdateEvents' Avro encoding.

The garbage collector is off, with a collection before the run, as in the join worker (which
collects once per purge interval). After the last batch both topics count as read to their
end, so every decision is finalised. Not here: Kafka (reading, producing, the changelog, the
standby replica), the worker's loop around the batch, and metrics.

Run from the repository root::

    .venv/bin/python benchmarks/join_core.py                 # 40,000 pairs, best of 3, ~30 s
    .venv/bin/python benchmarks/join_core.py --profile       # and cProfile's top functions

The last line of stdout is one JSON object: ``us_per_pair`` (CPU of every stage, best run),
``stages_us_per_pair``, ``pairs``, ``updates``, ``rate``, ``runs_us_per_pair``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402
from rocksdict import Options, Rdict  # noqa: E402

from banditstream.config import Settings  # noqa: E402
from benchmarks.pipeline import domain_config, make_pairs  # noqa: E402
from streams._join_state import DeadLetter, JoinCore, JoinOptions, Outputs, PartitionState  # noqa: E402
from streams.serde import AvroSerde  # noqa: E402
from streams.validation import Validator  # noqa: E402

STAGES = ("decode", "validate", "join", "fire", "persist", "emit")
T0_MS = 1_800_000_000_000
TOPICS = ("decisions", "rewards")


def traffic(pairs: int, rate: float, seed: int) -> list[tuple[int, bytes, bytes]]:
    """(topic index, payload, key) in read order: both topics merged by event time."""
    decisions, rewards, delays = make_pairs("c", pairs, random.Random(seed), 1.0)
    for i, (decision, reward) in enumerate(zip(decisions, rewards)):
        decision["timestamp"] = T0_MS + int(i * 1000.0 / rate)
        reward["timestamp"] = decision["timestamp"] + int(delays[i])
    serdes = (AvroSerde("decision", framing="single_object"), AvroSerde("reward", framing="single_object"))
    events = [(d["timestamp"], 0, d) for d in decisions] + [(r["timestamp"], 1, r) for r in rewards]
    events.sort(key=lambda e: (e[0], e[1]))
    return [(topic, serdes[topic].encode(event), event["event_id"].encode()) for _, topic, event in events]


class Run:
    """One pass over the traffic with a fresh join state in its own RocksDB directory."""

    def __init__(self, records: list[tuple[int, bytes, bytes]], workdir: Path) -> None:
        config = Settings.model_validate({"domains": domain_config(1.0)}).worker_config()
        self.options = JoinOptions()
        self.core = JoinCore(config.domains, self.options)
        self.validator = Validator(config.limits)
        self.serdes = (AvroSerde("decision", framing="single_object"), AvroSerde("reward", framing="single_object"))
        self.update_serde = AvroSerde("update", framing="single_object")
        shutil.rmtree(workdir, ignore_errors=True)
        self.db = Rdict(str(workdir), options=Options(raw_mode=True))
        self.part = PartitionState(0, self.db, self.core.domains, self.options.entry_cache)
        self.part.caught_up = {True: True, False: True}  # read to both ends once since loaded
        self.records = records
        self.offsets = [0, 0]
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.updates = 0

    def batch(self, batch: list[tuple[int, bytes, bytes]], *, last: bool) -> None:
        clock, seconds, part, core = time.process_time, self.seconds, self.part, self.core
        t = clock()
        decoded = [iter(self.serdes[topic].decode_batch([v for k, v, _ in batch if k == topic])) for topic in (0, 1)]
        t, seconds["decode"] = clock(), seconds["decode"] + clock() - t
        validate = (self.validator.validate_decision, self.validator.validate_reward)
        handled = []
        for topic, value, key in batch:
            offset = self.offsets[topic]
            self.offsets[topic] += 1
            part.handled(TOPICS[topic], offset)
            record = validate[topic](next(decoded[topic]), encoded_size=len(value))
            handled.append((topic, record, DeadLetter(TOPICS[topic], 0, offset, key, value)))
        t, seconds["validate"] = clock(), seconds["validate"] + clock() - t
        encoded = iter(core.encode([record for topic, record, _ in handled if topic == 0]))
        out = Outputs()
        for topic, record, source in handled:
            part.observe(topic == 0, record["timestamp"])
            if topic == 0:
                core.decision(part, record, source, out, next(encoded))
            else:
                core.reward(part, record, source, out)
        now_ms = time.time() * 1000.0
        part.batch_read(now_ms)
        t, seconds["join"] = clock(), seconds["join"] + clock() - t
        if last:  # both topics read to their end long after: every window closes
            core.fire(part, now_ms, out, now_ms + 1e7, now_ms + 1e7)
        else:
            core.fire(part, now_ms, out)
        t, seconds["fire"] = clock(), seconds["fire"] + clock() - t
        part.write(part.changes())
        t, seconds["persist"] = clock(), seconds["persist"] + clock() - t
        encode = self.update_serde.encode
        self.updates += len([encode(record) for _, record in out.updates])
        seconds["emit"] += clock() - t

    def run(self, advance=None) -> None:
        size = self.options.batch_max
        for start in range(0, len(self.records), size):
            self.batch(self.records[start:start + size], last=start + size >= len(self.records))
            if advance is not None:
                advance(min(size, len(self.records) - start))

    def close(self) -> None:
        self.db.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=40_000)
    parser.add_argument("--rate", type=float, default=5_000.0, help="decisions per second of event time, one partition")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the figures are the best one's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="run once more under cProfile and print the top functions")
    args = parser.parse_args()
    for name in ("pairs", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.rate <= 0:
        parser.error("--rate must be positive")
    console = Console(stderr=True)
    with console.status(f"encoding {args.pairs:,} pairs…"):
        records = traffic(args.pairs, args.rate, args.seed)
    runs: list[dict[str, float]] = []
    updates = 0
    with tempfile.TemporaryDirectory(prefix="join-core-") as tmp, Progress(console=console, transient=True) as progress:
        for i in range(args.repeat):
            task = progress.add_task(f"run {i + 1} of {args.repeat}", total=len(records))
            run = Run(records, Path(tmp) / f"run-{i}")
            gc.collect()
            gc.disable()
            try:
                run.run(lambda n, task=task: progress.advance(task, n))
            finally:
                gc.enable()
                run.close()
            if run.updates != args.pairs:
                console.print(f"[red]{run.updates:,} updates of {args.pairs:,} pairs: the run did not finalise them all")
                return 1
            updates = run.updates
            runs.append(dict(run.seconds))
        if args.profile:
            run = Run(records, Path(tmp) / "profiled")
            profiler = cProfile.Profile()
            gc.collect()
            gc.disable()
            try:
                profiler.runcall(run.run)
            finally:
                gc.enable()
                run.close()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
            console.print(text.getvalue())
    best = min(runs, key=lambda seconds: sum(seconds.values()))
    per_pair = {stage: round(best[stage] / args.pairs * 1e6, 2) for stage in STAGES}
    total = round(sum(best.values()) / args.pairs * 1e6, 1)
    table = Table(title=f"join core, CPU per pair ({args.pairs:,} pairs at {args.rate:,.0f}/s of event time, best of {args.repeat})")
    table.add_column("stage")
    table.add_column("us per pair", justify="right")
    table.add_column("share", justify="right")
    for stage in STAGES:
        table.add_row(stage, f"{per_pair[stage]:.2f}", f"{per_pair[stage] / total:.0%}")
    table.add_row("[bold]all[/]", f"[bold]{total:.1f}[/]", "")
    Console().print(table)
    print(json.dumps({
        "us_per_pair": total, "stages_us_per_pair": per_pair, "pairs": args.pairs, "updates": updates,
        "rate": args.rate, "runs_us_per_pair": [round(sum(r.values()) / args.pairs * 1e6, 1) for r in runs],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
