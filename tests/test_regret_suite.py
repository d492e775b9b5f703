"""benchmarks/regret.py: the figures do not depend on how many processes run the cells."""

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
    assert len(one["envs"]["new_arms"]["B1"]["portfolio"]["acting"]) == 2  # one per seed, from the workers
    assert (tmp_path / "j1" / "regret-curves.png").read_bytes() == (tmp_path / "j2" / "regret-curves.png").read_bytes()


def test_jobs_must_not_be_negative(capsys):
    with pytest.raises(SystemExit) as exit_info:
        regret.parse_args(["--jobs", "-1"])
    assert exit_info.value.code == 2
    assert "--jobs needs 0 (one per CPU) or a positive number" in capsys.readouterr().err
