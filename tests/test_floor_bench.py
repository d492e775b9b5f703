"""benchmarks/floor.py: the floor it sets is the floor the log carries, its ratings are SNIPS's
by hand, and its figures do not depend on how many processes run the cells."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import floor
from benchmarks.regret import _stream, run
from learner.evaluation import SNIPS, evaluate


def test_the_logged_propensities_keep_the_floor_it_sets():
    stream = _stream("linear", 600, 0)
    for eps0 in (0.0, 0.2):
        learner = floor.LoggingLearner(stream, 0, eps0)
        run(learner, stream, stream.best(), 100, 600)
        pscore = np.concatenate([p for _, _, p in learner.logged])
        assert len(pscore) == 600
        if eps0:
            assert pscore.min() >= eps0 / 10 - 1e-12  # K = 10: no weight above K / eps0
        else:
            assert pscore.min() < 0.2 / 10  # without it, IGW's propensities fall below that floor
        dist = learner.distribution(stream.contexts[:5], stream.n_arms[:5], 10)
        assert np.allclose(dist.sum(axis=1), 1.0) and dist.min() >= eps0 / 10 - 1e-12


def test_a_rating_is_snips_effective_sample_size_width_and_coverage_by_hand():
    rng = np.random.default_rng(3)
    n, k = 400, 3
    action = rng.integers(0, k, n)
    pscore = rng.uniform(0.1, 0.9, n)
    reward = rng.normal(size=n)
    dist = rng.dirichlet(np.ones(k), n)
    w = dist[np.arange(n), action] / pscore
    rated = floor.rate(reward, action, pscore, dist, truth=0.0)
    assert rated["ess"] == pytest.approx(w.sum() ** 2 / (w**2).sum())
    estimate = evaluate(SNIPS(), reward, action, pscore, dist, level=0.95)
    assert rated["width"] == pytest.approx(estimate.upper - estimate.lower)
    assert rated["error"] == pytest.approx((w * reward).sum() / w.sum())
    assert rated["covered"] == float(estimate.lower <= 0.0 <= estimate.upper)
    assert floor.rate(reward, action, pscore, dist, truth=estimate.upper + 1.0)["covered"] == 0.0


def _figures(capsys: pytest.CaptureFixture[str], tmp_path, jobs: int) -> dict:
    argv = ["--steps", "1400", "--window", "200", "--seeds", "0,1", "--envs", "linear,new_arms", "--floors", "0,0.05",
            "--peers", "mabwiser", "--batch", "100", "--out", str(tmp_path / f"j{jobs}"), "--jobs", str(jobs)]  # fmt: skip
    assert floor.main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["jobs"] == jobs and (tmp_path / f"j{jobs}" / "floor-tradeoff.png").stat().st_size > 0
    for key in ("seconds_total", "jobs", "plot"):
        figures.pop(key)
    return figures


def test_two_processes_give_the_figures_of_one_and_every_floor_is_rated(capsys, tmp_path):
    one = _figures(capsys, tmp_path, 1)
    assert one == _figures(capsys, tmp_path, 2)
    for env in ("linear", "new_arms"):
        cell = one["envs"][env]
        assert cell["best_peer_name"].startswith("MABWiser") and set(cell["floors"]) == {"0.0", "0.05"}
        for row in cell["floors"].values():
            assert row["ratio"] == pytest.approx(row["regret"] / cell["best_peer"])
            assert row["regret"] > row["floor_bound"] > 0
            for stretch in ("late", "early"):
                for rated in row[stretch].values():
                    assert len(rated["ess_by_seed"]) == 2 and rated["ess"] == pytest.approx(sum(rated["ess_by_seed"]) / 2)
                    assert 0 < min(rated["ess_by_seed"]) and max(rated["ess_by_seed"]) <= 200 + 1e-9
                    assert rated["width"] > 0 and rated["abs_error"] >= 0 and 0 <= rated["covered"] <= 2
    # a larger floor costs at least its bound: eps0 of the uniform choice's regret after the first batch
    rows = one["envs"]["linear"]["floors"]
    assert rows["0.05"]["floor_bound"] > rows["0.0"]["floor_bound"]


def test_a_bad_floor_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        floor.main(["--floors", "0,1.5"])
    assert exit_.value.code == 2
    assert "floors must be in [0, 1]" in capsys.readouterr().err.strip().splitlines()[-1]
