"""``banditstream doctor`` against the real broker, S3 server and keys: a sound setup passes
every check; each broken piece fails its own check, with the fix named."""

from __future__ import annotations

import json
import uuid

import boto3
import pytest

from banditstream.cli import main
from banditstream.config import Settings
from banditstream.devstack import free_port
from banditstream.doctor import run_checks
from publisher.repository import create_root
from publisher.signing import KeyRing
from streams.topics import ensure_topics
from tests.registry_server import RegistryServer

pytestmark = pytest.mark.integration

NAMES = ["broker", "topics", "registry", "snapshot store", "trusted root", "publish keys", "clock", "domains"]


@pytest.fixture
def setup(kafka, topics, s3, tmp_path, keys, root) -> dict:
    """A config tree whose every piece exists: topics, bucket, keys and their root."""
    ensure_topics(kafka, topics)
    bucket = f"doctor-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", **s3).create_bucket(Bucket=bucket)
    keys.save(tmp_path / "keys")
    (tmp_path / "keys" / "root.json").write_bytes(root)
    return {
        "kafka": kafka.model_dump(), "topics": topics.model_dump(),
        "stores": {"state_dir": str(tmp_path / "state"), "snapshots": f"s3://{bucket}/prod"},
        "s3": {"endpoint_url": s3["endpoint_url"], "access_key_id": s3["aws_access_key_id"],
               "secret_access_key": s3["aws_secret_access_key"], "region": s3["region_name"]},
        "publish": {"keys_dir": str(tmp_path / "keys")},
    }  # fmt: skip


def statuses(tree: dict) -> dict[str, tuple[str, str, str]]:
    return {c.name: (c.status, c.detail, c.fix) for c in run_checks(Settings.model_validate(tree), timeout_s=3)}


def test_a_sound_setup_passes_every_check_and_the_command_exits_0(setup, tmp_path, capsys):
    checks = statuses(setup)
    assert list(checks) == NAMES
    assert {name: status for name, (status, _, _) in checks.items()} == dict.fromkeys(NAMES, "ok"), checks
    assert "within" in checks["clock"][1] and "keys of the trusted root" in checks["publish keys"][1]
    config = tmp_path / "banditstream.json"
    config.write_text(json.dumps(setup))
    assert main(["--config", str(config), "doctor"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok") >= len(NAMES) and "FAILED" not in out


def test_each_broken_piece_fails_its_check_with_the_fix_named(setup, tmp_path, capsys):
    other_root = create_root(KeyRing.generate())
    (tmp_path / "other-root.json").write_bytes(other_root)
    cases = [
        ({"kafka": {**setup["kafka"], "bootstrap_servers": f"127.0.0.1:{free_port()}"}},
         {"broker": "failed", "topics": "skipped"}, "kafka.bootstrap_servers"),
        ({"topics": {**setup["topics"], "updates": f"absent-{uuid.uuid4().hex[:6]}"}},
         {"topics": "failed"}, "banditstream topics create"),
        ({"registry": {"url": "mock://team"}}, {"registry": "failed"}, "registry.url"),
        ({"stores": {**setup["stores"], "snapshots": f"s3://absent-{uuid.uuid4().hex[:6]}/prod"}},
         {"snapshot store": "failed", "clock": "skipped"}, "stores.snapshots"),
        ({"sdk": {"trusted_root": str(tmp_path / "nowhere.json")}},
         {"trusted root": "failed", "publish keys": "skipped"}, "banditstream keys generate"),
        ({"sdk": {"trusted_root": str(tmp_path / "other-root.json")}}, {"publish keys": "failed"}, "keys of that root"),
    ]  # fmt: skip
    for change, expected, fix in cases:
        checks = statuses({**setup, **change})
        got = {name: checks[name][0] for name in expected}
        assert got == expected, (change, checks)
        failed = [c for c in checks.values() if c[0] == "failed"]
        assert len(failed) == 1 and fix in failed[0][2], (change, failed)
        assert all(status == "ok" for name, (status, _, _) in checks.items() if name not in expected), (change, checks)
    config = tmp_path / "broken.json"
    config.write_text(json.dumps({**setup, "registry": {"url": "mock://team"}}))
    assert main(["--config", str(config), "doctor"]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_the_registry_check_uses_the_configured_credentials(setup):
    with RegistryServer(basic_auth=("team", "right-password")) as server:
        right = statuses({**setup, "registry": {"url": server.url, "basic_auth_user_info": "team:right-password"}})
        wrong = statuses({**setup, "registry": {"url": server.url, "basic_auth_user_info": "team:wrong-password"}})
    assert right["registry"][0] == "ok" and "0 subjects" in right["registry"][1], right["registry"]
    status, detail, fix = wrong["registry"]
    assert status == "failed" and "401" in detail and "registry.basic_auth_user_info" in fix, wrong["registry"]
    assert "wrong-password" not in detail + fix


def test_a_portfolio_member_that_never_acts_is_a_warning_naming_it_and_the_command_still_exits_0(setup, tmp_path, capsys):
    optimistic = {"policy": "lin_igw", "alpha": 1.0, "label": "optimistic"}
    sound = {"routing": {}, "tuning": {"policy": "portfolio", "params": {"members": [optimistic, {**optimistic, "gamma": 0.995, "label": "o2"}]}}}
    checks = statuses({**setup, "domains": sound})
    assert checks["domains"] == ("ok", "routing (portfolio), tuning (portfolio)", ""), checks["domains"]
    misordered = {**sound, "tuning": {"policy": "portfolio", "params": {"members": [{"policy": "lin_igw"}, optimistic]}}}
    tree = {**setup, "domains": misordered}
    status, detail, fix = statuses(tree)["domains"]
    assert status == "warning" and detail.startswith("tuning: portfolio member 'optimistic' learns as the earlier 'lin_igw'")
    assert "(alpha 1.0 against unset)" in detail and "never acts" in detail and "reorder or drop" in fix
    config = tmp_path / "misordered.json"
    config.write_text(json.dumps(tree))
    assert main(["--config", str(config), "doctor"]) == 0
    out = capsys.readouterr().out
    assert "warning" in out and "optimistic" in out and "FAILED" not in out
