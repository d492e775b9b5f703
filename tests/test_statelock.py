"""One worker per state directory: a second one is refused at once, a killed one leaves no lock."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from banditstream.devstack import free_port
from learner.errors import StateDirLocked, StoreError
from learner.statelock import LOCK_FILE, StateLock
from streams.topics import ensure_topics
from tests import learn_helpers as h

REPO = Path(__file__).resolve().parents[1]

_HOLDER = """
import sys
from learner.statelock import StateLock
lock = StateLock(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()  # hold until the test closes stdin (or kills us)
lock.close()
"""


def hold_in_subprocess(directory: Path) -> subprocess.Popen:
    """Another process holding the lock of ``directory`` until its stdin closes."""
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(directory)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline().strip() == "locked"
    return process


def message(directory: Path, pid: int) -> str:
    return f"state directory {directory} is in use by another worker (pid {pid}); stop it or choose another state_dir"


def test_the_lock_is_exclusive_across_processes(tmp_path):
    directory = tmp_path / "state" / "learn"
    holder = hold_in_subprocess(directory)
    try:
        with pytest.raises(StateDirLocked) as caught:
            StateLock(directory)
        assert str(caught.value) == message(directory, holder.pid)
        assert caught.value.pid == holder.pid and isinstance(caught.value, StoreError)
    finally:
        holder.communicate("", timeout=10)  # closes stdin: the holder releases and exits
    assert holder.returncode == 0
    with StateLock(directory) as lock:  # released: ours now
        assert lock.held
        assert (directory / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_the_lock_is_released_when_its_holder_is_killed_with_sigkill(tmp_path):
    directory = tmp_path / "learn"
    holder = hold_in_subprocess(directory)
    with pytest.raises(StateDirLocked):
        StateLock(directory)
    holder.kill()  # no cleanup runs: the kernel drops the flock with the process
    assert holder.wait(10) == -signal.SIGKILL
    assert (directory / LOCK_FILE).read_text().strip() == str(holder.pid)  # a stale pid, but no lock
    with StateLock(directory):
        assert (directory / LOCK_FILE).read_text().strip() == str(os.getpid())


def test_a_second_lock_in_the_same_process_is_refused_and_close_releases(tmp_path):
    first = StateLock(tmp_path)
    with pytest.raises(StateDirLocked, match=f"pid {os.getpid()}"):
        StateLock(tmp_path)
    first.close()
    first.close()  # idempotent
    assert not first.held and (tmp_path / LOCK_FILE).read_text() == ""  # a released lock names no holder
    StateLock(tmp_path).close()


def test_the_error_is_one_line_and_pickles():
    err = StateDirLocked("/x/y", 1234)
    assert str(err) == message(Path("/x/y"), 1234)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)
    assert str(StateDirLocked("/x/y", None)) == (
        "state directory /x/y is in use by another worker; stop it or choose another state_dir"
    )  # the holder had locked but not yet written its pid


@pytest.mark.integration
def test_a_second_learner_on_one_state_dir_exits_at_once_with_one_line(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    port = free_port()
    state_dir = tmp_path / "state"
    config = h.write_config(tmp_path / "learn.json", kafka, topics, state_dir, port)

    def serving(process) -> bool:
        assert process.poll() is None, f"learner exited with {process.returncode}: {(tmp_path / 'learn.log').read_text()[-2000:]}"
        try:
            h.metric(port, "banditstream_partitions_assigned")
            return True
        except OSError:
            return False

    first = h.start_learner(config, tmp_path / "learn.log")
    try:
        h.wait_until(lambda: serving(first), 60, "the first learner to start")

        env = {k: v for k, v in os.environ.items() if not k.startswith("BANDITSTREAM_")}
        started = time.monotonic()
        second = subprocess.run(
            [sys.executable, "-m", "banditstream.cli", "--config", str(config), "learn"],
            cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        elapsed = time.monotonic() - started

        assert second.returncode == 2, second.stderr
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert lines == [f"error: {message(state_dir / 'learn', first.pid)}"], second.stderr
        assert "Traceback" not in second.stderr + second.stdout
        assert elapsed < 20, f"took {elapsed:.1f} s to refuse"  # at once: no broker round trip, no retries
        assert first.poll() is None  # the first one runs on, untouched

        first.kill()  # SIGKILL leaves no lock behind: a new learner starts on the same directory
        assert first.wait(10) == -signal.SIGKILL
        first = h.start_learner(config, tmp_path / "learn.log")
        h.wait_until(lambda: serving(first), 60, "a learner to start after the holder was killed")
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)
            assert first.wait(30) == 0
