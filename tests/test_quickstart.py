"""docs/quickstart.md, run as a reader runs it: its files saved, its shell blocks in order."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from banditstream.devstack import LocalStack

QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"
FENCE = re.compile(r"^```(\w+)(?: +(\S+))?\n(.*?)^```$", re.M | re.S)


def _blocks() -> list[tuple[str, str | None, str]]:
    """(language, file name or None, body) of every fenced block, in order."""
    return [(m.group(1), m.group(2), m.group(3)) for m in FENCE.finditer(QUICKSTART.read_text())]


def _processes_in(path: Path) -> list[int]:
    """Live processes whose working directory lies under ``path``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = str((entry / "cwd").readlink())
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and cwd.startswith(str(path)):
                found.append(int(entry.name))
    return found


def test_the_quickstart_page_has_files_and_commands_to_run():
    blocks = _blocks()
    files = {name for _, name, _ in blocks if name}
    assert {"banditstream.toml", "service.py"} <= files
    commands = "\n".join(body for language, name, body in blocks if language == "sh" and not name)
    assert "dev up --workers" in commands and "python service.py" in commands and "dev down" in commands
    assert {language for language, name, _ in blocks if not name} <= {"sh", "console"}


def test_the_quickstart_runs_as_written_and_leaves_nothing_running(tmp_path):
    script = ["set -euo pipefail"]
    for language, name, body in _blocks():
        if name:
            (tmp_path / name).write_text(body)
        elif language == "sh":
            script.append(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BANDITSTREAM_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        run = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        LocalStack(tmp_path / ".banditstream" / "dev").down()  # whatever a failure left running
        for pid in _processes_in(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    chosen = re.search(r"snapshot (\d+\.\d+\.\d+) chose (blue|green|red)", run.stdout)
    assert chosen, run.stdout
    assert f"│ banner │ {chosen.group(1)}" in run.stdout  # snapshot list shows what the SDK decided with
    assert "Traceback" not in run.stderr
    assert not (tmp_path / ".banditstream" / "dev" / "stack.json").exists()
    assert _processes_in(tmp_path) == []
