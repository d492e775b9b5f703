"""The worker processes of a local run (the demo, benchmarks): each ``banditstream <worker>``
in its own process group, with its Prometheus port, stopped together.

    workers = WorkerProcesses(workdir)
    workers.start("join", config_path)
    workers.scrape("join")["banditstream_joins_total"]   # {'status="rewarded"': 1234.0, ...}
    workers.stop()                                        # SIGTERM, then SIGKILL what is left
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from banditstream.devstack import free_port

_SAMPLE = re.compile(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$")


class WorkerExited(RuntimeError):
    """A worker process ended while it was supposed to run (``name``, its exit ``code``)."""

    def __init__(self, name: str, code: int, tail: list[str]):
        how = f"exited with code {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                how = f"was killed by {signal.Signals(-code).name}"
        self.name, self.code, self.how = name, code, how
        super().__init__(f"the {name} worker {how}: " + " | ".join(tail))


class WorkerProcesses:
    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.processes: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}

    def start(self, name: str, config: Path, *, profile: Path | None = None, cwd: Path | None = None,
              command: str | None = None) -> None:
        """Start ``banditstream --config CONFIG <command>`` (``command`` defaults to ``name``;
        under cProfile writing to ``profile`` when SIGTERM ends it, if given); its output goes
        to ``WORKDIR/<name>.log``."""
        port = free_port()
        self.ports[name] = port
        prefix = ["-m", "cProfile", "-o", str(profile)] if profile else []
        with open(self.log_path(name), "wb") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, *prefix, "-m", "banditstream.cli", "--config", str(config), command or name],
                # the join's clocks in its log every purge interval (INFO): what a stall needs told
                env={"BANDITSTREAM_JOIN_LOGLEVEL": "INFO", **os.environ, "BANDITSTREAM_METRICS__PORT": str(port),
                     "OPENBLAS_NUM_THREADS": "1"},
                cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def check(self) -> None:
        """Raise :class:`WorkerExited` (with the tail of its log) if a worker has ended."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise WorkerExited(name, process.returncode, self.tail(name, 5))

    def log_path(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def tail(self, name: str, lines: int = 20) -> list[str]:
        """The last ``lines`` lines of a worker's output."""
        try:
            return self.log_path(name).read_text(errors="replace").strip().splitlines()[-lines:]
        except FileNotFoundError:
            return []

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.processes.items()}

    def scrape(self, name: str) -> dict[str, dict[str, float]]:
        """Every sample of a worker's /metrics as ``family -> labels -> value`` ({} if it
        does not answer)."""
        port = self.ports.get(name)
        if port is None:
            return {}
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1.0).read().decode()
        except OSError:
            return {}
        samples: dict[str, dict[str, float]] = {}
        for line in text.splitlines():
            match = _SAMPLE.match(line)
            if match:
                samples.setdefault(match.group(1), {})[match.group(2) or ""] = float(match.group(3))
        return samples

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every process group, wait, then SIGKILL whatever is left of each."""
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        self.processes.clear()
