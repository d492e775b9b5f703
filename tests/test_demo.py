"""`banditstream demo` (the README's first command) end to end, as a user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-m", "banditstream.cli", "demo"]


def _processes_under(path: Path) -> list[str]:
    """Processes whose command line or working directory lies under ``path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = str((entry / "cwd").readlink())
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (str(path) in cmdline or cwd.startswith(str(path))):
            found.append(f"{entry.name}: {cmdline[:120]}")
    return found


def test_demo_learns_a_clear_margin_over_random_and_leaves_nothing_running(tmp_path):
    work = tmp_path / "work"
    out = tmp_path / "out.json"
    plot = tmp_path / "demo.png"
    run = subprocess.run(
        [*CLI, "--events", "4000", "--seed", "3", "--round-size", "500", "--json", str(out), "--plot", str(plot), "--keep", str(work)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["events"] == 4000
    assert set(summary["domains"]) == {"llm_routing", "support_templates"}
    learned, random, oracle = summary["learned_reward"], summary["random_reward"], summary["oracle_reward"]
    assert oracle > random
    assert (learned - random) / (oracle - random) >= 0.5, summary  # a clear margin over random
    for figures in summary["domains"].values():
        assert figures["learned_reward"] > figures["random_reward"] + 0.1
        assert figures["snapshots_used"] >= 3  # it really learned through published snapshots
    pipeline = summary["pipeline"]
    assert pipeline["joins_rewarded"] + pipeline["joins_default"] == 4000  # one update per decision
    assert pipeline["joins_rewarded"] == pipeline["rewards_sent_in_window"]
    assert pipeline["late_rewards"] == pipeline["rewards_sent_late"] > 0
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
    assert "reward over the last quarter" in run.stdout
    # off-policy, from the log read back from the updates topic: the learned snapshot is rated
    # above uniform random with an interval that excludes uniform's value
    for name, figures in summary["evaluation"].items():
        assert figures["rows"] > 1000 and figures["snapshot"] is not None
        for estimator in ("snips", "dr"):
            assert figures["learned"][estimator]["lower"] > figures["uniform"][estimator]["estimate"], (name, figures)
    assert "off-policy, from the updates topic" in run.stdout
    assert _processes_under(work) == []


def test_demo_ctrl_c_stops_every_process_it_started(tmp_path):
    work = tmp_path / "work"
    demo = subprocess.Popen(
        [*CLI, "--events", "200000", "--keep", str(work), "--plot", str(tmp_path / "x.png")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
        # Ctrl-C as at a terminal: a suite started as a background job inherits SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (work / "publish.log").exists():
            assert demo.poll() is None, demo.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        time.sleep(3)  # the workers are up and the SDK is deciding
        assert len(_processes_under(work)) >= 4  # broker + join + learn + publish
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(120)
        except subprocess.TimeoutExpired:
            demo.send_signal(signal.SIGUSR1)  # where it is stuck: every thread's stack (cli.main)
            time.sleep(2)
            demo.kill()
            raise AssertionError("the demo did not stop within 120 s of Ctrl-C; its stacks:\n" + demo.communicate()[1].decode()[-8000:])
        deadline = time.monotonic() + 10
        while _processes_under(work) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_under(work) == []
    finally:
        if demo.poll() is None:
            demo.kill()
        for line in _processes_under(work):  # whatever a failure left running stops here
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
