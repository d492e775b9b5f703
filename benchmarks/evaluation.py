"""Off-policy evaluation benchmark: estimator throughput and bootstrap time, against OBP.

One function per figure, each on the same seeded log (``make_log``: ``--rows`` rows, ``--actions``
candidates, a Dirichlet logging policy per row, a Dirichlet target per row, uniform rewards and a
random reward model, so every weight is non-zero and every code path runs):

1. ``estimate_rates``: rows per second of one public ``estimate(...)`` call (input validation
   included) for every estimator, the best of ``--repeats`` calls. The headline
   ``estimate_rows_per_s`` is the slowest of IPS, SNIPS and DR (target: >= 1M rows/s).
2. ``bootstrap_seconds``: wall time of ``evaluate(..., method="bootstrap")`` with ``--resamples``
   resamples for IPS, SNIPS and DR (the validation, the terms, the resamples, the percentile
   and the diagnostics). The headline ``bootstrap_1m_s`` is the slowest of the three, reported
   only at the issue's size (1M rows, 1,000 resamples; target: < 10 s).
4. ``sweep_seconds``: ``banditstream evaluate``'s core on 20 progressive candidates (LinUCB and
   LinTS over alpha/v x eps0, LinUCB with forgetting) over ``--sweep-rows`` rows (d=16, K=5),
   IPS, SNIPS and DR with one cross-fitted reward model: ``sweep_20x100k_s`` at 100k rows.
5. ``read_rate``: updates read back from the embedded broker's topic and decoded
   (``read_rows_per_s``; target >= 100k rows/s).
3. ``obp_comparison``: the same estimators from Open Bandit Pipeline on the same arrays (its
   action_dist with a length-1 position axis): each pair's absolute difference (the strongest
   correctness check there is: two independent implementations of the published formulas), OBP's
   rows per second, and OBP's own bootstrap (a Python loop over ``random_state.choice``) timed at
   ``--obp-resamples`` resamples. It runs when ``import obp`` works. The project's venv has no
   OBP: its releases for this Python (0.4.x) need torch, and 0.5.x needs Python < 3.11; to
   include it, run this file with an interpreter where OBP is installed and the repository on
   ``PYTHONPATH`` (below). Without OBP the comparison is skipped, said so in the output, and its
   keys are left out of the JSON.

Run from the repository root::

    .venv/bin/python benchmarks/evaluation.py              # 1M rows, K=10, 1,000 resamples
    .venv/bin/python benchmarks/evaluation.py --quick      # smoke run, seconds
    # with OBP, from a separate venv (obp==0.4.1 pulls torch): numpy, rich and obp are all it needs
    python3 -m venv /tmp/obp && /tmp/obp/bin/pip install obp==0.4.1 rich
    PYTHONPATH=. /tmp/obp/bin/python benchmarks/evaluation.py

Progress goes to stderr, the tables to stdout, and the last line of stdout is one JSON object
(``estimate_rows_per_s``, ``bootstrap_1m_s``, per-estimator figures, ``obp_*`` when compared, and
the 1-minute load average at the start and end, since timings on a shared machine are only as
good as the machine was quiet).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

# Run as a script, this file's folder is sys.path[0], and benchmarks/learner.py would shadow the
# `learner` package benchmarked here; put the repository root there instead.
_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from learner.evaluation import DM, DR, IPS, SNDR, SNIPS, DRos, Estimator, SwitchDR, evaluate  # noqa: E402

#: The estimators of the headline figures (the issue's "IPS/SNIPS/DR").
HEADLINE = ("ips", "snips", "dr")
#: Every estimator timed and compared, with the parameters used for both libraries.
SWITCH_TAU = 5.0
DROS_SHRINKAGE = 10.0


def our_estimators() -> list[Estimator]:
    return [IPS(), IPS(clip=20.0), SNIPS(), DM(), DR(), SNDR(), SwitchDR(tau=SWITCH_TAU), DRos(shrinkage=DROS_SHRINKAGE)]


def label(estimator: Estimator) -> str:
    return "ips_clip" if isinstance(estimator, IPS) and estimator.clip != float("inf") else estimator.name


class Log(NamedTuple):
    reward: np.ndarray
    action: np.ndarray
    pscore: np.ndarray
    action_dist: np.ndarray
    estimated_rewards: np.ndarray


@dataclass
class BenchConfig:
    rows: int = 1_000_000
    actions: int = 10
    resamples: int = 1000
    repeats: int = 3
    seed: int = 0
    obp: bool = True
    obp_resamples: int = 100
    sweep_rows: int = 100_000
    read_rows: int = 200_000


def make_log(rows: int, actions: int, seed: int) -> Log:
    """A seeded synthetic log (see the module docstring); built outside every timing."""
    rng = np.random.default_rng(seed)
    logging = rng.dirichlet(np.ones(actions), rows)
    action = (rng.random(rows)[:, None] > logging.cumsum(axis=1)).sum(axis=1).clip(max=actions - 1)
    pscore = logging[np.arange(rows), action]
    del logging
    action_dist = rng.dirichlet(np.ones(actions), rows)
    reward = rng.random(rows)
    estimated_rewards = rng.random((rows, actions))
    return Log(reward, action, pscore, action_dist, estimated_rewards)


def best_seconds(run: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


# --- figure 1: estimate throughput -------------------------------------------------------------------


def estimate_rates(log: Log, repeats: int) -> dict[str, float]:
    """Rows per second of one validated ``estimate`` call, per estimator (best of ``repeats``)."""
    rates = {}
    for estimator in our_estimators():
        seconds = best_seconds(lambda: estimator.estimate(*log), repeats)
        rates[label(estimator)] = len(log.reward) / seconds
    return rates


# --- figure 2: bootstrap -----------------------------------------------------------------------------


def bootstrap_seconds(log: Log, resamples: int, seed: int) -> dict[str, float]:
    """Seconds of one ``evaluate(method="bootstrap")`` per headline estimator (run once: at
    1M rows and 1,000 resamples each takes seconds, enough to time by itself)."""
    seconds = {}
    for estimator in (IPS(), SNIPS(), DR()):
        start = time.perf_counter()
        evaluate(estimator, *log, method="bootstrap", n_resamples=resamples, random_state=seed, min_ess=0, min_ess_share=0)
        seconds[estimator.name] = time.perf_counter() - start
    return seconds


# --- figure 3: Open Bandit Pipeline --------------------------------------------------------------------


@dataclass
class ObpComparison:
    version: str
    rates: dict[str, float] = field(default_factory=dict)
    ours: dict[str, float] = field(default_factory=dict)
    theirs: dict[str, float] = field(default_factory=dict)
    bootstrap_s: float | None = None
    skipped: list[str] = field(default_factory=list)

    def max_abs_diff(self) -> float:
        return max(abs(self.ours[k] - self.theirs[k]) for k in self.theirs)


def _obp_estimators(ope: Any) -> dict[str, Any]:
    """OBP's estimator for each of ours that its installed version has (parameter names moved
    between releases: Switch-DR's threshold was ``tau`` before 0.5, ``lambda_`` after; IPS got
    clipping in 0.5)."""
    import inspect

    def build(cls: Any, **params: Any) -> Any:
        accepted = inspect.signature(cls).parameters
        if not all(name in accepted for name in params):
            return None
        return cls(**params)

    switch = build(ope.SwitchDoublyRobust, tau=SWITCH_TAU) or build(ope.SwitchDoublyRobust, lambda_=SWITCH_TAU)
    found = {
        "ips": ope.InverseProbabilityWeighting(),
        "ips_clip": build(ope.InverseProbabilityWeighting, lambda_=20.0),
        "snips": ope.SelfNormalizedInverseProbabilityWeighting(),
        "dm": ope.DirectMethod(),
        "dr": ope.DoublyRobust(),
        "sndr": ope.SelfNormalizedDoublyRobust(),
        "switch_dr": switch,
        "dros": ope.DoublyRobustWithShrinkage(lambda_=DROS_SHRINKAGE),
    }
    return found


def obp_comparison(log: Log, repeats: int, resamples: int, seed: int, progress: Console) -> ObpComparison | str:
    """OBP's estimates and speed on the same arrays, or the reason it could not run."""
    try:
        import obp
        from obp import ope
    except Exception as exc:  # not installed, or its torch import failed
        return f"obp is not importable here ({type(exc).__name__}: {exc})"
    result = ObpComparison(version=getattr(obp, "__version__", "?"))
    arrays = {
        "reward": log.reward,
        "action": log.action,
        "pscore": log.pscore,
        "action_dist": log.action_dist[:, :, None],
        "estimated_rewards_by_reg_model": log.estimated_rewards[:, :, None],
    }
    theirs = _obp_estimators(ope)
    for estimator in our_estimators():
        key = label(estimator)
        peer = theirs.get(key)
        if peer is None:
            result.skipped.append(key)
            continue
        progress.print(f"  obp {key}", highlight=False)
        result.theirs[key] = float(peer.estimate_policy_value(**arrays))
        result.ours[key] = estimator.estimate(*log)
        result.rates[key] = len(log.reward) / best_seconds(lambda: peer.estimate_policy_value(**arrays), repeats)
    progress.print(f"  obp bootstrap ({resamples} resamples)", highlight=False)
    snipw = ope.SelfNormalizedInverseProbabilityWeighting()
    start = time.perf_counter()
    snipw.estimate_interval(**arrays, n_bootstrap_samples=resamples, random_state=seed)
    result.bootstrap_s = time.perf_counter() - start
    return result


# --- report ----------------------------------------------------------------------------------------


def sweep_log(rows: int, seed: int, *, actions: int = 5, dim: int = 16):
    """A logged domain for the sweep: uniform logging over ``actions`` arms, rewards linear in
    a ``dim``-wide context (a different weight vector per arm) plus noise."""
    from learner.evaluation import LoggedBandit

    rng = np.random.default_rng(seed)
    X = np.concatenate([np.ones((rows, 1)), rng.normal(size=(rows, dim - 1))], axis=1)
    theta = rng.normal(scale=0.3, size=(actions, dim))
    action = rng.integers(0, actions, rows)
    reward = (X * theta[action]).sum(axis=1) + rng.normal(scale=0.5, size=rows)
    arms = [f"arm-{k}" for k in range(actions)]
    updates = [{"event_id": f"e{i}", "tenant": "default", "workspace": "main", "domain": "bench", "actions": arms,
                "probabilities": [1 / actions] * actions, "arm_index": int(action[i]), "reward": float(reward[i]),
                "features": X[i].tolist(), "decision_time": i} for i in range(rows)]
    return LoggedBandit.from_updates(updates)


SWEEP = ("lin_ucb(alpha=0.1|0.3|1|3,eps0=0|0.05),lin_ts(v=0.1|0.3|1|3,eps0=0|0.05),"
         "lin_ucb(alpha=1,gamma=0.999|0.99,eps0=0.05),lin_ts(v=0.3,gamma=0.999|0.99,eps0=0.05)")


def sweep_seconds(rows: int, seed: int, progress: Console) -> tuple[float, int, Any]:
    """Wall time of ``banditstream evaluate``'s core on a 20-candidate sweep (progressive specs,
    IPS, SNIPS and DR with one cross-fitted reward model)."""
    from banditstream.evaluate import evaluate_candidates, parse_candidates

    log = sweep_log(rows, seed)
    candidates = parse_candidates(SWEEP, snapshots=None, seed=seed)
    started = time.perf_counter()
    run = evaluate_candidates(log, candidates, estimators=("ips", "snips", "dr"), seed=seed,
                              progress=lambda name, done, total: progress.print(f"  {name}", highlight=False)
                              if done == total else None)
    return time.perf_counter() - started, len(candidates), run


def read_rate(rows: int, seed: int, progress: Console) -> float:
    """Rows per second of reading the updates topic back (``streams.evaluation_log.read_updates``)
    from the embedded broker, decoding included."""
    import tempfile
    import uuid

    from banditstream.devstack import LocalStack
    from confluent_kafka import Producer
    from streams.evaluation_log import read_updates
    from streams.serde import AvroSerde
    from streams.settings import KafkaSettings, TopicSettings
    from streams.topics import ensure_topics

    log = sweep_log(min(rows, 20_000), seed)
    serde = AvroSerde("update", framing="single_object")
    base = {"arm": "", "probability": 0.2, "feature_hash": "", "signals": {}, "reward_count": 1, "join_status": "rewarded",
            "mode": "live", "policy_version": "1.0.0", "reward_time": None, "weight": 1.0}
    with tempfile.TemporaryDirectory() as tmp, LocalStack(tmp, s3=False) as info:
        kafka = KafkaSettings(bootstrap_servers=info.kafka_bootstrap, profile=info.kafka_profile)
        topic = f"bench-{uuid.uuid4().hex[:6]}"
        ensure_topics(kafka, TopicSettings(decisions=topic + ".d", rewards=topic + ".r", updates=topic + ".u",
                                           posterior=topic + ".p", deadletter=topic + ".x", partitions=4, update_partitions=4))
        producer = Producer(kafka.producer_config(**{"linger.ms": 50, "batch.num.messages": 10_000,
                                                     "queue.buffering.max.messages": 1_000_000}))
        progress.print(f"producing {rows:,} updates to the embedded broker", highlight=False)
        for i in range(rows):
            j = i % len(log)
            record = {**base, "event_id": f"e{i}", "tenant": "default", "workspace": "main", "domain": "bench",
                      "actions": log.actions, "probabilities": log.logged_dist[j].tolist(), "arm_index": int(log.action[j]),
                      "features": log.context[j].tolist(), "reward": float(log.reward[j]), "decision_time": i}
            while True:
                try:
                    producer.produce(topic + ".u", serde.encode(record), key=f"e{i}")
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(120)
        started = time.perf_counter()
        updates, report = read_updates(kafka, topic + ".u", serde)
        seconds = time.perf_counter() - started
    if len(updates) != rows:
        raise RuntimeError(f"read {len(updates)} updates of {rows}")
    return rows / seconds


def tables(
    cfg: BenchConfig, rates: dict[str, float], boot: dict[str, float], peer: ObpComparison | str | None
) -> list[Table]:
    compared = isinstance(peer, ObpComparison)
    speed = Table(title=f"estimate rows/s, {cfg.rows:,} rows, K={cfg.actions}")
    speed.add_column("estimator")
    speed.add_column("ours", justify="right")
    if compared:
        speed.add_column(f"obp {peer.version}", justify="right")
        speed.add_column("ours / obp", justify="right")
        speed.add_column("|ours - obp|", justify="right")
    for key, rate in rates.items():
        row = [key, f"{rate:,.0f}"]
        if compared:
            if key in peer.rates:
                diff = abs(peer.ours[key] - peer.theirs[key])
                row += [f"{peer.rates[key]:,.0f}", f"{rate / peer.rates[key]:.1f}x", f"{diff:.2e}"]
            else:
                row += ["-", "-", "not in this obp"]
        speed.add_row(*row)
    bootstrap = Table(title=f"bootstrap s, {cfg.resamples:,} resamples, {cfg.rows:,} rows")
    bootstrap.add_column("estimator")
    bootstrap.add_column("ours", justify="right")
    bootstrap.add_column("per resample", justify="right")
    for key, seconds in boot.items():
        bootstrap.add_row(key, f"{seconds:.2f}", f"{1000 * seconds / cfg.resamples:.2f} ms")
    if compared and peer.bootstrap_s is not None:
        bootstrap.add_row(
            f"obp snipw ({cfg.obp_resamples} resamples)", f"{peer.bootstrap_s:.2f}",
            f"{1000 * peer.bootstrap_s / cfg.obp_resamples:.2f} ms",
        )  # fmt: skip
    return [speed, bootstrap]


def figures(
    cfg: BenchConfig, rates: dict[str, float], boot: dict[str, float], peer: ObpComparison | str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": cfg.rows, "actions": cfg.actions, "resamples": cfg.resamples}
    out["estimate_rows_per_s"] = min(rates[k] for k in HEADLINE)
    out.update({f"estimate_rows_per_s_{k}": v for k, v in rates.items()})
    if cfg.rows == 1_000_000 and cfg.resamples == 1000:
        out["bootstrap_1m_s"] = max(boot.values())
    out.update({f"bootstrap_s_{k}": v for k, v in boot.items()})
    if isinstance(peer, ObpComparison):
        out["obp_version"] = peer.version
        out["obp_estimate_rows_per_s"] = min(peer.rates[k] for k in HEADLINE if k in peer.rates)
        out["obp_max_abs_diff"] = peer.max_abs_diff()
        out.update({f"obp_abs_diff_{k}": abs(peer.ours[k] - peer.theirs[k]) for k in peer.theirs})
        out.update({f"obp_estimate_rows_per_s_{k}": v for k, v in peer.rates.items()})
        out["obp_bootstrap_s"] = peer.bootstrap_s
        out["obp_bootstrap_resamples"] = cfg.obp_resamples
    return out


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--actions", type=int, default=10)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--obp-resamples", type=int, default=100, help="resamples of OBP's (slow) bootstrap")
    parser.add_argument("--no-obp", action="store_true", help="skip the OBP comparison even if obp imports")
    parser.add_argument("--sweep-rows", type=int, default=100_000, help="rows of the 20-candidate sweep (0: skip)")
    parser.add_argument("--read-rows", type=int, default=200_000, help="updates read back from the embedded broker (0: skip)")
    parser.add_argument("--quick", action="store_true", help="100k rows, 100 resamples, 1 repeat, small sweep and read")
    args = parser.parse_args(argv)
    cfg = BenchConfig(args.rows, args.actions, args.resamples, args.repeats, args.seed, not args.no_obp, args.obp_resamples,
                      args.sweep_rows, args.read_rows)
    if args.quick:
        cfg.rows, cfg.resamples, cfg.repeats, cfg.obp_resamples = 100_000, 100, 1, 10
        cfg.sweep_rows, cfg.read_rows = 5_000, 20_000
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    out = Console()
    progress = Console(stderr=True)
    load_start = os.getloadavg()[0]
    progress.print(f"log: {cfg.rows:,} rows, K={cfg.actions}, seed {cfg.seed}", highlight=False)
    log = make_log(cfg.rows, cfg.actions, cfg.seed)
    progress.print("estimate throughput", highlight=False)
    rates = estimate_rates(log, cfg.repeats)
    progress.print(f"bootstrap ({cfg.resamples} resamples)", highlight=False)
    boot = bootstrap_seconds(log, cfg.resamples, cfg.seed)
    peer: ObpComparison | str | None = None
    if cfg.obp:
        progress.print("obp comparison", highlight=False)
        peer = obp_comparison(log, cfg.repeats, cfg.obp_resamples, cfg.seed, progress)
    sweep = read = None
    if cfg.sweep_rows:
        progress.print(f"sweep: 20 candidates over {cfg.sweep_rows:,} rows", highlight=False)
        sweep = sweep_seconds(cfg.sweep_rows, cfg.seed, progress)
    if cfg.read_rows:
        read = read_rate(cfg.read_rows, cfg.seed, progress)
    for table in tables(cfg, rates, boot, peer):
        out.print(table)
    if sweep is not None:
        from banditstream.evaluate import results_table

        out.print(results_table(sweep[2]))
        out.print(f"sweep: {sweep[1]} candidates x {cfg.sweep_rows:,} rows in {sweep[0]:.1f} s")
    if read is not None:
        out.print(f"reading the updates topic: {read:,.0f} rows/s ({cfg.read_rows:,} rows)")
    if isinstance(peer, str):
        out.print(f"[yellow]obp comparison skipped:[/] {peer}")
    elif isinstance(peer, ObpComparison) and peer.skipped:
        out.print(f"obp {peer.version} has no counterpart of: {', '.join(peer.skipped)}")
    misses: list[str] = []
    result = figures(cfg, rates, boot, peer)
    if sweep is not None:
        result["sweep_candidates"], result["sweep_rows"] = sweep[1], cfg.sweep_rows
        if cfg.sweep_rows == 100_000 and sweep[1] == 20:
            result["sweep_20x100k_s"] = sweep[0]
        result["sweep_s"] = sweep[0]
    if read is not None:
        result["read_rows_per_s"] = read
        if read < 100_000:
            misses.append(f"reading {read:,.0f} rows/s < 100,000")
    if result["estimate_rows_per_s"] < 1_000_000:
        misses.append(f"estimate {result['estimate_rows_per_s']:,.0f} rows/s < 1,000,000")
    if result.get("bootstrap_1m_s", 0.0) >= 10.0:
        misses.append(f"bootstrap {result['bootstrap_1m_s']:.1f} s >= 10 s")
    for line in misses:
        out.print(f"[bold red]target missed:[/] {line}")
    if not misses:
        out.print("[bold green]all targets met[/]")
    result["load_1m_start"] = load_start
    result["load_1m_end"] = os.getloadavg()[0]
    print(json.dumps({k: _rounded(v) for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
