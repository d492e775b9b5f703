"""benchmarks/join_core.py runs on the join's current code and finalises every pair it feeds
(its figures are read by people; here only that it still measures what it says)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_join_core_benchmark_finalises_every_pair_and_reports_each_stage():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "join_core.py"), "--pairs", "3000", "--repeat", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["pairs"] == figures["updates"] == 3000
    stages = figures["stages_us_per_pair"]
    assert set(stages) == {"decode", "validate", "join", "fire", "persist", "emit"}
    assert all(value > 0 for value in stages.values())
    assert abs(sum(stages.values()) - figures["us_per_pair"]) < 0.5


def test_the_join_core_benchmark_refuses_a_bad_argument_in_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "join_core.py"), "--pairs", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("--pairs must be at least 1")
