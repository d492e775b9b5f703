"""The embedded stack: `banditstream dev up` / `dev down` and the Python API behind them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from confluent_kafka.admin import AdminClient

from banditstream import devstack
from banditstream.devstack import LocalStack, StackError, port_is_free

CLI = [sys.executable, "-m", "banditstream.cli"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" not in status.read_text()


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_dev_up_then_down_leaves_no_process_and_no_bound_port(tmp_path):
    up = subprocess.run([*CLI, "dev", "up", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert "BANDITSTREAM_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:" in up.stdout
    assert "BANDITSTREAM_S3__ENDPOINT_URL=http://127.0.0.1:" in up.stdout
    state = json.loads((tmp_path / "stack.json").read_text())
    processes = state["processes"]
    assert {p["name"] for p in processes} == {"tansu", "seaweedfs"}

    # both servers really answer
    AdminClient({"bootstrap.servers": state["kafka_bootstrap"]}).list_topics(timeout=10)
    s3 = boto3.client(
        "s3",
        endpoint_url=state["s3_endpoint"],
        aws_access_key_id=state["s3_access_key"],
        aws_secret_access_key=state["s3_secret_key"],
        region_name=state["s3_region"],
    )
    s3.create_bucket(Bucket="devstack-check")
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["devstack-check"]

    down = subprocess.run([*CLI, "dev", "down", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    for proc in processes:
        assert not _alive(proc["pid"]), f"{proc['name']} (pid {proc['pid']}) still running"
        assert _group_members(proc["pid"]) == [], f"children of {proc['name']} left behind"
        bound = [port for port in proc["ports"] if not port_is_free(port)]
        assert bound == [], f"{proc['name']} left ports bound: {bound}"
    assert not (tmp_path / "stack.json").exists()

    again = subprocess.run([*CLI, "dev", "down", "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "no local stack is running" in again.stdout


def test_a_start_that_fails_halfway_stops_what_it_started(tmp_path, monkeypatch):
    started: list[int] = []
    real_start_broker = LocalStack._start_broker

    def start_broker_and_remember(self, info):
        real_start_broker(self, info)
        started.extend(p.pid for p in info.processes)

    def s3_fails(self, info):
        raise StackError("simulated S3 start failure")

    monkeypatch.setattr(LocalStack, "_start_broker", start_broker_and_remember)
    monkeypatch.setattr(LocalStack, "_start_s3", s3_fails)
    with pytest.raises(StackError, match="simulated S3 start failure"):
        LocalStack(tmp_path).up()
    assert started, "the broker should have been started before the failure"
    assert not any(_alive(pid) for pid in started)
    assert not (tmp_path / "stack.json").exists()


def test_a_tampered_binary_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(devstack.PINNED_SHA256, "tansu", "0" * 64)
    with pytest.raises(StackError, match="refusing to run it"):
        LocalStack(tmp_path, s3=False).up()


def test_up_twice_is_refused_and_status_reports_the_running_stack(tmp_path):
    stack = LocalStack(tmp_path, s3=False)
    info = stack.up()
    try:
        with pytest.raises(StackError, match="already running"):
            LocalStack(tmp_path, s3=False).up()
        assert stack.status().kafka_bootstrap == info.kafka_bootstrap
    finally:
        stack.down()
    assert stack.status() is None


def test_dev_up_workers_without_a_declared_domain_is_refused_and_stops_the_broker(tmp_path):
    (tmp_path / "bs.toml").write_text('[publish]\nevery_seconds = 1\n')
    up = subprocess.run([*CLI, "--config", "bs.toml", "dev", "up", "--workers", "--no-s3"], capture_output=True, text=True,
                        timeout=120, cwd=tmp_path)  # fmt: skip
    assert up.returncode == 2, up.stderr
    assert "at least one declared domain" in up.stderr and "Traceback" not in up.stderr
    assert up.stdout == ""  # nothing for `eval` to pick up
    assert not (tmp_path / ".banditstream" / "dev" / "stack.json").exists()


def test_dev_up_workers_refuses_worker_state_left_from_an_earlier_broker(tmp_path):
    (tmp_path / "bs.toml").write_text('[domains.banner]\n')
    (tmp_path / ".banditstream" / "state" / "learn" / "shard-0000").mkdir(parents=True)
    up = subprocess.run([*CLI, "--config", "bs.toml", "dev", "up", "--workers", "--no-s3"], capture_output=True, text=True,
                        timeout=120, cwd=tmp_path)  # fmt: skip
    assert up.returncode == 2, up.stderr
    assert "worker state from an earlier broker" in up.stderr and "rm -rf .banditstream/state" in up.stderr
    assert not (tmp_path / ".banditstream" / "dev" / "stack.json").exists()
