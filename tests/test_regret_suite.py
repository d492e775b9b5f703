"""benchmarks/regret.py: the figures do not depend on how many processes run the cells; the
floor bound, the per-seed ratios and the portfolio's verdict are what they say, by hand."""

import json

import pytest

from benchmarks import regret


def _figures(capsys: pytest.CaptureFixture[str], tmp_path, jobs: int) -> dict:
    argv = ["--steps", "300", "--seeds", "0,1", "--envs", "linear,new_arms", "--batch-sizes", "100,1",
            "--peers", "vw", "--b1-cap", "100", "--portfolio", "--out", str(tmp_path / f"j{jobs}"), "--jobs", str(jobs)]  # fmt: skip
    assert regret.main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["jobs"] == jobs
    for key in ("seconds", "seconds_total", "jobs", "load_avg_1m", "plot"):
        figures.pop(key)
    return figures


def test_two_processes_give_the_figures_and_plot_of_one(capsys, tmp_path):
    one = _figures(capsys, tmp_path, 1)
    two = _figures(capsys, tmp_path, 2)
    assert one == two
    assert set(one["envs"]) == {"linear", "new_arms"} and set(one["envs"]["linear"]) == {"B100", "B1"}
    assert one["envs"]["linear"]["B100"]["ours"] > 0 and one["envs"]["linear"]["B100"]["best_peer_name"].startswith("VW")
    portfolio = one["envs"]["new_arms"]["B1"]["portfolio"]
    assert len(portfolio["acting"]) == 2  # one per seed, from the workers
    verdict = portfolio["picked_vs_best"]
    assert verdict["best"] in portfolio["members"] and verdict["interval"][0] <= verdict["picked_minus_best"] <= verdict["interval"][1]
    assert verdict["within"] == (verdict["interval"][0] <= 0.0)
    assert (tmp_path / "j1" / "regret-curves.png").read_bytes() == (tmp_path / "j2" / "regret-curves.png").read_bytes()


def test_floor_bound_is_the_first_batch_uniform_and_the_floor_after(capsys, tmp_path):
    argv = ["--steps", "400", "--seeds", "0,1", "--envs", "wine", "--batch-sizes", "100,1", "--peers", "vw",
            "--out", str(tmp_path)]  # fmt: skip
    assert regret.main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["envs"]["wine"]
    for batch in (100, 1):
        gaps = [s.best() - s.uniform() for s in (regret.generate("wine", 400, seed) for seed in (0, 1))]
        by_hand = sum(g[:batch].sum() + 0.01 * g[batch:].sum() for g in gaps) / 2  # the default's floor: 0.01
        cell = figures[f"B{batch}"]
        assert cell["floor_bound"] == pytest.approx(by_hand, abs=0.06)  # the JSON rounds
        assert cell["floor_bound_ratio"] == pytest.approx(cell["floor_bound"] / cell["best_peer"], rel=1e-2)
        assert len(cell["ratio_by_seed"]) == 2 and all(x > 0 for x in cell["ratio_by_seed"])


def test_ratio_by_seed_is_against_each_seeds_best_peer():
    cfg = regret.SuiteConfig(steps=100, seeds=(0, 1), batch_sizes=(100,), envs=("linear",))
    specs, _ = regret.learner_specs(("vw",))
    suite = regret.Suite(cfg, specs, progress=None)  # type: ignore[arg-type]
    totals = {"ours": [60.0, 90.0], "VW SquareCB": [100.0, 50.0], "VW bag 5": [80.0, 120.0]}
    for spec in specs:
        runs = totals.get(spec.name, [500.0, 500.0])
        suite.outcomes["linear", 100, spec.name] = [regret.Outcome(x, x, x / 4, 100, 0.0) for x in runs]
    suite.floor_bounds["linear", 100] = [10.0, 10.0]
    figures = suite.headline("linear", 100)
    assert figures["best_peer_name"] == "VW SquareCB" and figures["ratio"] == pytest.approx(75.0 / 75.0)
    assert figures["ratio_by_seed"] == pytest.approx([60.0 / 80.0, 90.0 / 50.0])  # bag 5 best on seed 0


def test_jobs_must_not_be_negative(capsys):
    with pytest.raises(SystemExit) as exit_info:
        regret.parse_args(["--jobs", "-1"])
    assert exit_info.value.code == 2
    assert "--jobs needs 0 (one per CPU) or a positive number" in capsys.readouterr().err


def test_picked_vs_best_is_the_paired_t_interval_by_hand():
    """Three seeds; the portfolio ended with m1, m0, m1; m0 has the least mean regret alone."""
    members = tuple(regret.PORTFOLIO)
    cfg = regret.SuiteConfig(steps=100, seeds=(0, 1, 2), batch_sizes=(100,), envs=("linear",), members=members)
    specs, _ = regret.learner_specs((), (), members)
    suite = regret.Suite(cfg, specs, progress=None)  # type: ignore[arg-type]
    labels = [label for _, label, _ in regret.member_columns(members)]
    alone = {"m0": [100.0, 110.0, 90.0], "m1": [130.0, 120.0, 96.0], "m2": [400.0, 500.0, 450.0]}
    for column, totals in alone.items():
        suite.outcomes["linear", 100, column] = [regret.Outcome(x, x, x / 4, 100, 0.0) for x in totals]
    suite.acting["linear", 100] = [(labels[1], 1), (labels[0], 0), (labels[1], 1)]
    verdict = suite.portfolio_figures("linear", 100)["picked_vs_best"]
    diffs = [130 - 100, 110 - 110, 96 - 90]  # 30, 0, 6: mean 12, sd sqrt(252), t(0.975, 2) = 4.302653
    half = 4.302653 * 252**0.5 / 3**0.5
    assert verdict["best"] == labels[0]
    assert verdict["picked_minus_best"] == pytest.approx(12.0)
    assert verdict["interval"] == pytest.approx([12.0 - half, 12.0 + half], rel=1e-6)
    assert verdict["within"] is True  # 12 - 39.1 < 0: not shown worse with three seeds
    suite.acting["linear", 100] = [(labels[1], 1)] * 3  # m1 on every seed: 30, 10, 6, mean 15.3, sd 12.9
    assert suite.portfolio_figures("linear", 100)["picked_vs_best"]["within"] is True
    alone["m1"] = [130.0, 140.0, 120.0]  # 30 worse on every seed: sd 0, shown worse
    suite.outcomes["linear", 100, "m1"] = [regret.Outcome(x, x, x / 4, 100, 0.0) for x in alone["m1"]]
    verdict = suite.portfolio_figures("linear", 100)["picked_vs_best"]
    assert verdict["interval"] == pytest.approx([30.0, 30.0]) and verdict["within"] is False
