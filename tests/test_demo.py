"""`banditstream demo` (the README's first command) end to end, as a user runs it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from banditstream.cli import _snapshot_tables
from banditstream.demo import live_panel, summary_tables
from learner.domain import DomainSettings

CLI = [sys.executable, "-m", "banditstream.cli", "demo"]

# the demo's claims count rewards inside their window (late ones are sent on purpose): nothing
# else beside it
pytestmark = pytest.mark.alone


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
    # every domain runs the default policy, a portfolio: the summary says which member acts
    assert summary["policy"] == "portfolio" and "acting at the end" in run.stdout
    labels = DomainSettings().make_policy().labels
    assert all(figures["acting"] in labels and isinstance(figures["switches"], int) for figures in summary["domains"].values())
    # off-policy, from the log read back from the updates topic: the learned snapshot is rated
    # above uniform random with an interval that excludes uniform's value
    for name, figures in summary["evaluation"].items():
        assert figures["rows"] > 1000 and figures["snapshot"] is not None
        for estimator in ("snips", "dr"):
            assert figures["learned"][estimator]["lower"] > figures["uniform"][estimator]["estimate"], (name, figures)
    assert "off-policy, from the updates topic" in run.stdout
    assert summary["reproducible"] is True and summary["not_reproducible_because"] == []
    assert summary["rounds"] == 9  # 100, then 500 at a time
    assert "pipeline.snapshots_published" in summary["timing_dependent"]
    # not a terminal: plain progress lines while it waits, not silence
    progress = [line for line in run.stdout.splitlines() if re.match(r"\s*\d+s  [\d,]+/4,000 decided, [\d,]+ joined", line)]
    assert len(progress) >= 2, run.stdout[:3000]
    assert _processes_under(work) == []


def test_the_same_seed_gives_the_same_figures(tmp_path):
    """Two runs at once, each with its own stack: the seed fixes the figures, not the timing."""
    runs = []
    for run_name in ("first", "second"):
        out = tmp_path / f"{run_name}.json"
        runs.append((out, subprocess.Popen(
            [*CLI, "--events", "600", "--seed", "11", "--round-size", "300", "--json", str(out), "--plot", str(tmp_path / f"{run_name}.png")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        )))  # fmt: skip
    summaries = []
    try:
        for out, process in runs:
            output, _ = process.communicate(timeout=600)
            assert process.returncode == 0, output[-6000:]
            summaries.append(json.loads(out.read_text()))
    finally:
        for _, process in runs:
            if process.poll() is None:
                process.kill()
                process.wait()
    first, second = summaries
    assert first["reproducible"] and second["reproducible"]
    for summary in summaries:  # what varies with the machine's timing, and only that
        summary["pipeline"].pop("snapshots_published")
        for key in ("sdk_decide_p50_us", "sdk_decide_p99_us", "seconds"):
            summary.pop(key)
        for figures in summary["evaluation"].values():
            figures.pop("snapshot")
    assert first == second


def test_a_killed_worker_leaves_its_logs_where_the_message_says(tmp_path):
    demo = subprocess.Popen(
        [*CLI, "--events", "200000", "--plot", str(tmp_path / "x.png")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    kept = None
    try:
        learner = None
        deadline = time.monotonic() + 120
        while learner is None and time.monotonic() < deadline:
            assert demo.poll() is None, demo.stderr.read()[-2000:]
            learner = next((pid for pid, cmdline in _children(demo.pid) if cmdline.endswith(" learn")), None)
            time.sleep(0.2)
        assert learner is not None, "the learner never started"
        time.sleep(5)  # the learner is at work
        os.kill(learner, signal.SIGKILL)
        _, stderr = demo.communicate(timeout=120)
        assert demo.returncode == 2, stderr
        assert "the learn worker was killed by SIGKILL" in stderr
        assert "Traceback" not in stderr
        match = re.search(r"worker logs kept in (\S+); the last lines of learn\.log:", stderr)
        assert match, stderr
        kept = Path(match.group(1))
        assert {"join.log", "learn.log", "publish.log"} <= {p.name for p in kept.iterdir()}
        last = kept.joinpath("learn.log").read_text().strip().splitlines()[-1]
        assert f"  {last}" in stderr  # its last lines are in the message
        assert _processes_under(kept) == []
    finally:
        if demo.poll() is None:
            demo.kill()
        if kept is not None:
            for line in _processes_under(kept):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split(":")[0]), signal.SIGKILL)
            subprocess.run(["rm", "-rf", str(kept)], check=False)


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live children of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append((int(entry.name), cmdline))
    return found


def _rendered(*renderables) -> str:
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    for renderable in renderables:
        console.print(renderable)
    return console.export_text()


def _assert_headers_whole(text: str, headers: list[str]) -> None:
    assert "…" not in text, text
    assert max(map(len, text.splitlines())) <= 80, text
    flat = " ".join(text.split())
    for header in headers:  # a header wrapped onto two lines still reads whole once the cells are joined
        assert all(word in flat for word in header.split()), (header, text)


def test_the_demo_tables_read_whole_at_80_columns():
    rows = [("llm_routing", "1.0.137", 20, 0.581, 0.592, 0.249), ("support_templates", "", 0, None, None, None)]
    panel = live_panel("events [bold]12,000[/]/20,000  143 decisions/s  learning round 13",
                       "joined 117,424 rewarded + 12,576 default  late rewards 3,623  snapshots 1,113", rows)  # fmt: skip
    text = _rendered(panel)
    assert "joined 117,424 rewarded + 12,576 default  late rewards 3,623  snapshots 1,113" in text  # on one line
    _assert_headers_whole(text, ["domain", "snapshot", "swaps", "reward", "oracle", "random"])
    assert "support_templates" in text and "1.0.137" in text and "baseline" in text

    estimate = {"estimate": 0.5, "lower": 0.45, "upper": 0.55}
    figures = {"learned_reward": 0.581, "random_reward": 0.249, "oracle_reward": 0.592, "gain_ratio": 0.968,
               "cumulative_regret": 1234.5, "decisions": 10_000, "snapshots_used": 20}  # fmt: skip
    summary = {
        "events": 20_000, "rounds": 21, "learned_reward": 0.73, "random_reward": 0.42, "oracle_reward": 0.74, "gain_ratio": 0.97,
        "domains": {"llm_routing": figures, "support_templates": figures},
        "pipeline": {"joins_rewarded": 17_400, "joins_default": 2_000, "late_rewards": 600, "dead_letters": 600,
                     "snapshots_published": 72, "rewards_sent_in_window": 17_400, "rewards_never_sent": 2_000,
                     "rewards_sent_late": 600},
        "timing_dependent": ["pipeline.snapshots_published"], "sdk_decide_p50_us": 31.0, "sdk_decide_p99_us": 91.0, "seconds": 140.0,
        "evaluation": {
            name: {"snapshot": "1.0.137", **{c: {"snips": estimate, "dr": estimate} for c in ("learned", "logging", "uniform")}}
            for name in ("llm_routing", "support_templates")
        },
    }  # fmt: skip
    pipeline, rewards, evaluation = summary_tables(summary)
    _assert_headers_whole(_rendered(pipeline), ["figure", "value"])
    _assert_headers_whole(_rendered(rewards), ["domain", "learned", "random", "oracle", "gain over random", "regret"])
    _assert_headers_whole(_rendered(evaluation), ["domain", "policy", "SNIPS", "95% interval", "DR"])
    assert "learned 1.0.137" in " ".join(_rendered(evaluation).split())


def test_snapshot_list_reads_whole_at_80_columns():
    row = {"tenant": "default", "workspace": "main", "domain": "support_templates", "version": "1.12.137",
           "channels": ["canary", "stable"], "samples": 123_456, "arms": 12, "dimension": 64, "policy": "shared_lin_ucb",
           "created_at": "2026-11-24T19:25:05.759Z", "git_commit": "82e1c795f4da5d946763248f9a76b9b60e547c4a",
           "derived_from": None, "length": 180_734}  # fmt: skip
    (table,) = _snapshot_tables([row, {**row, "domain": "llm_routing"}], verbose=False)
    text = _rendered(table)
    _assert_headers_whole(text, ["domain", "version", "channels", "samples", "arms", "created (UTC)"])
    assert "support_templates" in text and "1.12.137" in text and "123456" in text
    sha256 = "f6170d0d2573d29e2d3ede5a57cfeec2903768691fe7b191bbea78a0bc148228"
    (table,) = _snapshot_tables([{**row, "sha256": sha256, "target": "snapshot-1.12.137.avro.zst"}], verbose=True)
    text = _rendered(table)
    _assert_headers_whole(text, ["field", "value"])
    assert sha256 in "".join(text.replace("│", " ").split())  # folded over lines, not cut


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
