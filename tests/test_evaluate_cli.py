"""`banditstream evaluate` on a JSONL interaction log with a known truth: the table, the JSON
figures, the forest plot, and one-line errors for what cannot be used."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from banditstream.cli import main
from banditstream.evaluate import EvaluationInputError, parse_candidates

ROOT = Path(__file__).resolve().parents[1]
BEST = {"x": "a", "y": "c"}  # the agent that answers each category right


def interaction_log(path: Path, n: int = 3000, seed: int = 5) -> Path:
    """Uniform logging over agents a, b, c; reward 1 when the agent is the category's best."""
    rng = random.Random(seed)
    with open(path, "w") as handle:
        for i in range(n):
            category = rng.choice("xy")
            agent = rng.choice("abc")
            handle.write(json.dumps({"interaction_id": f"i{i}", "agent": agent, "category": category,
                                     "timestamp": 1_700_000_000_000 + i}) + "\n")
            handle.write(json.dumps({"interaction_id": f"i{i}", "reward": float(agent == BEST[category])}) + "\n")
    return path


def test_candidates_are_rated_against_the_truth_with_intervals_a_table_json_and_a_plot(tmp_path, capsys):
    log = interaction_log(tmp_path / "log.jsonl")
    out, png = tmp_path / "eval.json", tmp_path / "eval.png"
    code = main(["evaluate", "--domain", "rag", "--log", str(log), "--candidates",
                 "uniform,logging,always:a,lin_ucb(alpha=0.1|1.0,eps0=0)", "--estimators", "ips,snips,dr",
                 "--json", str(out), "--png", str(png), "--seed", "3"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "uniform" in printed and "always:a" in printed and "3,000 logged decisions" in printed
    figures = json.loads(out.read_text())
    assert figures["rows"] == 3000 and png.stat().st_size > 10_000
    by_name = {c["name"]: c["estimates"] for c in figures["candidates"]}
    truth = {"uniform": 1 / 3, "logging": 1 / 3, "always:a": 0.5}
    for name, value in truth.items():
        for estimator in ("ips", "snips", "dr"):
            e = by_name[name][estimator]
            assert e["lower"] <= value <= e["upper"], (name, estimator, e)
    learned = by_name["lin_ucb(alpha=0.1,eps0=0)"]["dr"]
    assert learned["lower"] > by_name["uniform"]["dr"]["upper"]  # it learned the categories' best agents
    assert [c["name"] for c in figures["candidates"]][0].startswith("lin_ucb")  # ranked first


def test_the_same_seed_gives_the_same_figures(tmp_path):
    log = interaction_log(tmp_path / "log.jsonl", n=800)
    runs = []
    for i in range(2):
        out = tmp_path / f"run{i}.json"
        assert main(["evaluate", "--domain", "rag", "--log", str(log), "--candidates", "lin_ts(v=0.3)",
                     "--bootstrap", "200", "--seed", "9", "--json", str(out)]) == 0
        figures = json.loads(out.read_text())
        runs.append([c["estimates"] for c in figures["candidates"]])
    assert runs[0] == runs[1]


@pytest.mark.parametrize("argv, message", [
    (["--candidates", "lin_nonsense(alpha=1)"], "unknown policy"),
    (["--candidates", "lin_ucb(alpha=abc)"], "is not a number"),
    (["--candidates", "lin_ucb(alpha)"], "is not param=value"),
    (["--candidates", "lin_ucb(zeta=1)"], "zeta"),
    (["--estimators", "ips,magic"], "unknown estimator 'magic'"),
    (["--estimators", "dros"], "needs its shrinkage"),
    (["--log", "nowhere.jsonl"], "no such file"),
    (["--candidates", "shared_lin_ucb"], "shared model"),
])
def test_what_cannot_be_used_is_one_line_naming_it(tmp_path, argv, message):
    log = interaction_log(tmp_path / "log.jsonl", n=50)
    args = ["evaluate", "--domain", "rag", "--log", str(log), *argv]
    done = subprocess.run([sys.executable, "-m", "banditstream.cli", *args], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_a_grid_expands_to_every_combination():
    names = [c.name for c in parse_candidates("lin_ts(v=0.1|0.3,eps0=0|0.05)", snapshots=None)]
    assert names == ["lin_ts(eps0=0,v=0.1)", "lin_ts(eps0=0.05,v=0.1)", "lin_ts(eps0=0,v=0.3)", "lin_ts(eps0=0.05,v=0.3)"]
    with pytest.raises(EvaluationInputError, match="twice"):
        parse_candidates("uniform,uniform", snapshots=None)


def test_a_normalising_domain_s_log_is_z_scored_as_the_join_z_scores_it(tmp_path):
    """From a file, each decision's numeric features are z-scored with the statistics of the
    decisions before it, in time order, as the join does (not left at zero)."""
    import numpy as np

    from banditstream.evaluate import load_log
    from learner.domain import DomainSettings
    from learner.features import FeatureEncoder

    rng = random.Random(3)
    rows = [{"interaction_id": f"i{i}", "agent": rng.choice("ab"), "context": {"tokens": rng.uniform(10, 500)},
             "timestamp": 1_700_000_000_000 + 1000 * i} for i in range(200)]  # fmt: skip
    with open(tmp_path / "log.jsonl", "w") as handle:
        for row in reversed(rows):  # written out of order: time order is the log's order
            handle.write(json.dumps(row) + "\n" + json.dumps({"interaction_id": row["interaction_id"], "reward": 1.0}) + "\n")
    settings = DomainSettings.model_validate({"features": {"dimension": 16, "normalize": True}})
    log = load_log(str(tmp_path / "log.jsonl"), domain="d", domain_settings=settings)
    encoder, expected = FeatureEncoder(settings.features), []
    for row in rows:
        context = {"numeric": row["context"], "categorical": {}, "vector": []}
        expected.append(encoder.context_vector(context))
        encoder.observe(context)
    order = np.argsort(log.decision_time)
    np.testing.assert_allclose(log.context[order], np.array(expected), rtol=1e-12, atol=1e-12)
    assert np.abs(log.context[order][50:]).sum() > 0  # the numeric feature is there once statistics exist
