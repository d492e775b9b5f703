"""What the exploration floor costs in regret and buys in off-policy evaluation, floor by floor.

Every policy mixes a share ``eps0`` of a uniform choice into its distribution,
``p = (1 - eps0) p_policy + eps0 / K``, so that no logged propensity is below ``eps0 / K`` and no
importance weight above ``K / eps0``: a log of its decisions can then rate a policy other than
the one that decided (the gate's canary, another portfolio member, a candidate in
``banditstream evaluate``). The floor also costs regret: at least ``eps0`` times the uniform
choice's over every decision. This benchmark measures both sides on the regret suite's streams
(``benchmarks/_regret_envs.py``), for the default domain (``DomainSettings()``, the regret suite's
"ours") with each floor in turn. Per environment, seed and floor:

1. **Regret.** The default domain with ``eps0`` set decides and learns as in
   ``benchmarks/regret.py`` (batches of ``--batch`` decided with the model frozen, ``--steps``
   steps), against the peers of the same run (MABWiser LinUCB and LinTS, VW's four explorers):
   ``ratio`` is its mean regret over the best peer's, ``ratio_by_seed`` each seed's over the least
   any peer had on it.
2. **Evaluation.** What a gate sees when it rates a policy on ``--window`` rows of the log with
   SNIPS, the gate's default estimator, at 95 %: the effective sample size ``(sum w)^2 / sum w^2``
   of the importance weights (the worst seed's: one row weighted 1,000 takes a log of 2,000 rows
   down to a handful), the interval's width, and whether it covers the policy's true value on
   those rows (known here: the stream's expected rewards). Two policies, on two stretches of the
   log:

   - **next**: the domain's policy as it stands after the last step (its next snapshot, with its
     own floor), the gate's canary;
   - **best**: the stream's best arm on every row (the oracle), a policy that differs from the
     logging one exactly where the logging one is wrong: what a log must show to find a better
     policy;
   - **late**: the last rows, decided by snapshots close to the next one;
   - **early**: the rows from step 1,000 on, decided by the early snapshots, which the next one
     has moved far from (the demo's case: the learned snapshot rated on the whole run's log).

Run from the repository root (14 minutes in one process, beside another benchmark using both CPUs;
``--jobs 0`` runs a process per CPU)::

    .venv/bin/python benchmarks/floor.py --jobs 2
    .venv/bin/python benchmarks/floor.py --envs linear,wine --floors 0,0.01 --seeds 0

Progress goes to stderr; a table per environment to stdout, a PNG of regret ratio against the
effective sample size (one line per environment, a point per floor) to ``OUT/floor-tradeoff.png``,
and the last line of stdout is one JSON object: ``{"envs": {env: {"best_peer", "best_peer_name",
"floors": {eps0: {"regret", "ratio", "ratio_by_seed", "floor_bound", "late": {"next": {"ess",
"ess_by_seed", "width", "abs_error", "covered"}, "best": {...}}, "early": {...}}}}}, "T", "seeds",
"batch", "window", ...}`` (``ess``, ``width`` and ``abs_error``, the estimate's distance from the
true value, are means over seeds; ``covered`` is how many seeds' intervals held the true value).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:  # benchmarks/learner.py would shadow `learner`
    sys.path[0] = str(_HERE.parent)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: E402
from rich.table import Table  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from benchmarks._regret_envs import Stream, available  # noqa: E402
from benchmarks.regret import (  # noqa: E402
    DomainLearner, LearnerSpec, _init_worker, _ints, _names, _stream, floor_bound, learner_specs, run,
)
from learner.evaluation import SNIPS, EvaluationWarning, evaluate  # noqa: E402

#: Floors measured by default: none, the default (0.01) and around it.
FLOORS = (0.0, 0.002, 0.005, 0.01, 0.02)
#: Streams measured by default: the stationary ones where the floor decides #18's ratio, and
#: the two that need evaluation most (the portfolio's switches).
ENVS = ("linear", "wine", "breast_cancer", "heavy_tail", "fifty_arms", "new_arms", "nonlinear", "drift_gradual")
LEVEL = 0.95
#: Where the early stretch of the log starts: past the first batches, still far from the end.
EARLY = 1_000


@dataclass(frozen=True)
class Config:
    steps: int = 20_000
    seeds: tuple[int, ...] = (0, 1, 2)
    batch: int = 200
    window: int = 2_000
    floors: tuple[float, ...] = FLOORS
    envs: tuple[str, ...] = ENVS
    peers: tuple[str, ...] = ("mabwiser", "vw")
    out: Path = _HERE / "out"
    jobs: int = 1


class LoggingLearner(DomainLearner):
    """The default domain with its floor set, keeping every row's arm, reward and propensity."""

    def __init__(self, stream: Stream, seed: int, eps0: float) -> None:
        super().__init__(stream, seed, params={"eps0": eps0})
        self.logged: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def learn(self, Z: np.ndarray, n_arms: np.ndarray, arms: np.ndarray, rewards: np.ndarray, probabilities: np.ndarray) -> None:
        self.logged.append((arms.copy(), rewards.copy(), probabilities.copy()))
        super().learn(Z, n_arms, arms, rewards, probabilities)

    def distribution(self, Z: np.ndarray, n_arms: np.ndarray, width: int) -> np.ndarray:
        """The policy's probabilities over the arms of each row as it stands now, (n, width)."""
        dist = np.zeros((len(Z), width))
        for i, (z, n) in enumerate(zip(Z.tolist(), n_arms.tolist())):
            dist[i, :n] = self.choice(z, n).probabilities
        return dist


def rate(reward: np.ndarray, action: np.ndarray, pscore: np.ndarray, dist: np.ndarray, truth: float) -> dict[str, float]:
    """SNIPS's effective sample size, interval width and coverage of ``truth`` for ``dist``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EvaluationWarning)  # a low ESS is what is measured here
        estimate = evaluate(SNIPS(), reward, action, pscore, dist, level=LEVEL)
    return {
        "ess": float(estimate.ess),
        "width": float(estimate.upper - estimate.lower),
        "covered": float(estimate.lower <= truth <= estimate.upper),
        "error": float(estimate.estimate - truth),
    }


def floor_cell(cfg: Config, env: str, seed: int, eps0: float) -> dict[str, Any]:
    """The default domain with floor ``eps0`` on one stream: its regret, and how its log rates
    its next snapshot and the best policy on an early and a late stretch of ``window`` rows."""
    stream = _stream(env, cfg.steps, seed)
    learner = LoggingLearner(stream, seed, eps0)
    regret = run(learner, stream, stream.best(), cfg.batch, cfg.steps)
    action, reward, pscore = (np.concatenate(parts) for parts in zip(*learner.logged))
    result: dict[str, Any] = {"regret": float(regret.sum()), "floor_bound": floor_bound(stream, cfg.batch, eps0)}
    for stretch, start in (("early", min(EARLY, cfg.steps - cfg.window)), ("late", cfg.steps - cfg.window)):
        rows = np.arange(start, start + cfg.window)
        width = int(stream.n_arms[rows].max())
        n_arms = stream.n_arms[rows]
        offered = np.arange(width) < n_arms[:, None]  # new_arms: the arms of each row
        means = np.where(offered, stream.means[rows][:, :width], 0.0)
        logged = (reward[rows], action[rows], pscore[rows])
        nxt = learner.distribution(stream.contexts[rows], n_arms, width)
        best = np.zeros_like(nxt)
        best[np.arange(len(rows)), np.where(offered, means, -np.inf).argmax(axis=1)] = 1.0
        result[stretch] = {
            "next": rate(*logged, nxt, float((nxt * means).sum(axis=1).mean())),
            "best": rate(*logged, best, float((best * means).sum(axis=1).mean())),
        }
    return result


def peer_cell(cfg: Config, env: str, seed: int, spec: LearnerSpec) -> dict[str, Any]:
    stream = _stream(env, cfg.steps, seed)
    return {"regret": float(run(spec.build(stream, seed), stream, stream.best(), cfg.batch, cfg.steps).sum())}


_WORKER: tuple[Config, list[LearnerSpec]] | None = None


def _cell(cell: tuple[str, int, str, Any]) -> tuple[tuple[str, int, str, Any], dict[str, Any]]:
    assert _WORKER is not None
    cfg, specs = _WORKER
    env, seed, kind, which = cell
    return cell, floor_cell(cfg, env, seed, which) if kind == "floor" else peer_cell(cfg, env, seed, specs[which])


def run_all(cfg: Config, progress: Progress) -> tuple[dict[tuple[str, int, str, Any], dict[str, Any]], list[LearnerSpec]]:
    """Every (environment, seed, floor) and (environment, seed, peer), in ``cfg.jobs`` processes."""
    specs = [spec for spec in learner_specs(cfg.peers)[0] if spec.is_peer]
    cells = [(env, seed, "floor", eps0) for env in cfg.envs for seed in cfg.seeds for eps0 in cfg.floors]
    cells += [(env, seed, "peer", i) for env in cfg.envs for seed in cfg.seeds for i in range(len(specs))]
    task = progress.add_task("floors", total=len(cells))
    global _WORKER
    _WORKER = (cfg, specs)
    done: dict[tuple[str, int, str, Any], dict[str, Any]] = {}
    try:
        if cfg.jobs == 1:
            for cell in cells:
                progress.update(task, description=_describe(cell, specs))
                done[cell] = _cell(cell)[1]
                progress.advance(task)
        else:
            context = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(cfg.jobs, mp_context=context, initializer=_init_worker) as pool:
                for future in concurrent.futures.as_completed([pool.submit(_cell, cell) for cell in cells]):
                    cell, result = future.result()
                    done[cell] = result
                    progress.update(task, description=_describe(cell, specs))
                    progress.advance(task)
    finally:
        _WORKER = None
    return done, specs


def _describe(cell: tuple[str, int, str, Any], specs: Sequence[LearnerSpec]) -> str:
    env, seed, kind, which = cell
    return f"{env} seed {seed} " + (f"eps0 {which}" if kind == "floor" else specs[which].name)


def summarise(cfg: Config, done: dict[tuple[str, int, str, Any], dict[str, Any]], specs: Sequence[LearnerSpec]) -> dict[str, Any]:
    envs: dict[str, Any] = {}
    for env in cfg.envs:
        peer_regret = {spec.name: [done[env, seed, "peer", i]["regret"] for seed in cfg.seeds] for i, spec in enumerate(specs)}
        figures: dict[str, Any] = {}
        if peer_regret:
            best = min(peer_regret, key=lambda name: np.mean(peer_regret[name]))
            best_by_seed = [min(regrets[k] for regrets in peer_regret.values()) for k in range(len(cfg.seeds))]
            figures |= {"best_peer": float(np.mean(peer_regret[best])), "best_peer_name": best}
        floors = {}
        for eps0 in cfg.floors:
            runs = [done[env, seed, "floor", eps0] for seed in cfg.seeds]
            regret = float(np.mean([r["regret"] for r in runs]))
            row: dict[str, Any] = {"regret": regret, "floor_bound": float(np.mean([r["floor_bound"] for r in runs]))}
            if peer_regret:
                row["ratio"] = regret / figures["best_peer"]
                row["ratio_by_seed"] = [r["regret"] / max(b, 1e-9) for r, b in zip(runs, best_by_seed)]
            for stretch in ("late", "early"):
                row[stretch] = {
                    target: {
                        "ess": float(np.mean([r[stretch][target]["ess"] for r in runs])),
                        "ess_by_seed": [r[stretch][target]["ess"] for r in runs],
                        "width": float(np.mean([r[stretch][target]["width"] for r in runs])),
                        "abs_error": float(np.mean([abs(r[stretch][target]["error"]) for r in runs])),
                        "covered": int(sum(r[stretch][target]["covered"] for r in runs)),
                    }
                    for target in ("next", "best")
                }
            floors[str(eps0)] = row
        envs[env] = figures | {"floors": floors}
    return {"envs": envs, "T": cfg.steps, "seeds": list(cfg.seeds), "batch": cfg.batch, "window": cfg.window}


def tables(cfg: Config, results: dict[str, Any]) -> list[Table]:
    out = []
    n = len(cfg.seeds)
    for env, figures in results["envs"].items():
        peer = f"{figures['best_peer_name']} {figures['best_peer']:,.0f}" if "best_peer" in figures else "no peers run"
        table = Table(title=f"{env}: B={cfg.batch}, T={cfg.steps:,}, {n} seed(s); best peer {peer}; "
                            f"SNIPS on {cfg.window:,} rows: the worst seed's ESS, and the seeds whose interval held the truth")  # fmt: skip
        for column in ("eps0", "regret", "ratio", "worst seed", "floor bound"):
            table.add_column(column, justify="right")
        for stretch in ("late", "early"):
            for target in ("next", "best"):
                table.add_column(f"{stretch}: {target}", justify="right")
        for eps0, row in figures["floors"].items():
            ratio = f"{row['ratio']:.2f}" if "ratio" in row else "-"
            worst = f"{max(row['ratio_by_seed']):.2f}" if "ratio_by_seed" in row else "-"
            ratings = [
                f"{min(rated['ess_by_seed']):,.0f} ({rated['covered']}/{n})"
                for stretch in ("late", "early") for rated in (row[stretch]["next"], row[stretch]["best"])
            ]  # fmt: skip
            table.add_row(eps0, f"{row['regret']:,.0f}", ratio, worst, f"{row['floor_bound']:,.0f}", *ratings)
        out.append(table)
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    panels = [(stretch, target) for stretch in ("late", "early") for target in ("next", "best")]
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 4.5), sharey=True)
    for ax, (stretch, target) in zip(axes, panels):
        for env, figures in results["envs"].items():
            rows = figures["floors"]
            if not all("ratio" in row for row in rows.values()):
                continue
            ess = [max(min(row[stretch][target]["ess_by_seed"]), 1.0) for row in rows.values()]
            ratio = [row["ratio"] for row in rows.values()]
            ax.plot(ess, ratio, marker="o", label=env)
            for eps0, x, y in zip(rows, ess, ratio):
                ax.annotate(eps0, (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
        ax.axhline(0.8, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel(f"worst seed's ESS of {results['window']:,} rows (SNIPS)")
        ax.set_title(f"{stretch} rows, rating the {'next snapshot' if target == 'next' else 'best policy'}", fontsize=10)
    axes[0].set_ylabel("regret / best peer's")
    axes[-1].legend(fontsize=8)
    fig.suptitle(f"The exploration floor: regret against evaluation (B={results['batch']}, T={results['T']:,}, "
                 f"mean of {len(results['seeds'])} seeds; a point per eps0)")  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _floors(text: str) -> tuple[float, ...]:
    values = tuple(float(part) for part in _names(text))
    if not values or not all(0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"floors must be in [0, 1], got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> Config:
    runnable, unavailable = available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=Config.steps, help="steps per run (default 20,000)")
    parser.add_argument("--seeds", type=_ints, default=Config.seeds, help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--batch", type=int, default=Config.batch, help="rows decided per frozen model (default 200)")
    parser.add_argument("--window", type=int, default=Config.window, help="rows of each stretch rated (default 2,000)")
    parser.add_argument("--floors", type=_floors, default=Config.floors, help=f"default {','.join(map(str, FLOORS))}")
    parser.add_argument("--envs", type=_names, default=Config.envs, help=f"default {','.join(ENVS)}")
    parser.add_argument("--peers", type=_names, default=Config.peers, help="mabwiser,vw (default), or none")
    parser.add_argument("--out", type=Path, default=Config.out, help="folder for floor-tradeoff.png")
    parser.add_argument("--jobs", type=int, default=1, help="processes (0: one per CPU)")
    args = parser.parse_args(argv)
    for name in args.envs:
        if name not in runnable:
            parser.error(f"environment {name!r} cannot run: {unavailable.get(name, 'unknown')}; known: {', '.join(runnable)}")
    peers = tuple(p for p in args.peers if p != "none")
    for name in peers:
        if name not in ("mabwiser", "vw"):
            parser.error(f"unknown peer {name!r}; known: mabwiser, vw")
    if args.batch < 1 or not 0 < args.window <= args.steps:
        parser.error(f"--batch must be >= 1 and --window in 1..--steps, got {args.batch} and {args.window}")
    if args.jobs < 0:
        parser.error(f"--jobs needs 0 (one per CPU) or a positive number, got {args.jobs}")
    return Config(args.steps, args.seeds, args.batch, args.window, args.floors, args.envs, peers, args.out,
                  args.jobs or os.cpu_count() or 1)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    out, err = Console(width=200), Console(stderr=True)
    t0 = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"), Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err,
    ) as progress:  # fmt: skip
        done, specs = run_all(cfg, progress)
    results = summarise(cfg, done, specs)
    for table in tables(cfg, results):
        out.print(table)
    path = cfg.out / "floor-tradeoff.png"
    plot(results, path)
    out.print(f"plot: {path}")
    results |= {"plot": str(path), "seconds_total": round(time.perf_counter() - t0, 1), "jobs": cfg.jobs}
    sys.stdout.flush()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
