"""`banditstream demo` (the README's first command) end to end, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _our_servers() -> set[int]:
    """Pids of processes running in a demo's state directory (the servers' working dir)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = str((entry / "cwd").readlink())
            except OSError:
                continue
            if "banditstream-demo-" in cwd:
                found.add(int(entry.name))
    return found


def test_demo_round_trips_events_and_leaves_no_process(tmp_path):
    before = _our_servers()
    result = subprocess.run(
        [sys.executable, "-m", "banditstream.cli", "demo", "--events", "500", "--seed", "3"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bandit.decisions" in result.stdout and "bandit.rewards" in result.stdout
    assert result.stdout.count(" 500 ") >= 4  # sent and received, for both topics
    assert "NO" not in result.stdout
    assert _our_servers() - before == set()
