"""The configuration tree: file, then environment, one-line errors naming the field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from banditstream.config import ConfigError, load_settings
from learner.policies import portfolio


def test_defaults_load_without_any_source():
    settings = load_settings(env={})
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.registry.effective_framing == "single_object"
    assert settings.topics.decisions == "bandit.decisions"


def test_file_then_environment_overrides(tmp_path):
    path = tmp_path / "bandit.toml"
    path.write_text(
        '[kafka]\nbootstrap_servers = "broker-a:9092"\nprofile = "tansu"\n'
        '[topics]\npartitions = 12\n'
        '[domains.routing]\npolicy = "lin_ucb"\n[domains.routing.features]\nvector_dim = 16\n'
    )
    env = {
        "BANDITSTREAM_KAFKA__BOOTSTRAP_SERVERS": "broker-b:9093",
        "BANDITSTREAM_DOMAINS__ROUTING__PARAMS": '{"alpha": 0.5}',
        "BANDITSTREAM_DOMAINS__CACHE__MODE": "shadow",
        "UNRELATED": "x",
    }
    settings = load_settings(path, env=env)
    assert settings.kafka.bootstrap_servers == "broker-b:9093"  # env wins over file
    assert settings.kafka.profile == "tansu"  # file wins over default
    assert settings.topics.partitions == 12
    assert settings.domains["routing"].policy == "lin_ucb"
    assert settings.domains["routing"].params == {"alpha": 0.5}
    assert settings.domains["cache"].mode == "shadow"
    assert settings.domains["routing"].features.vector_dim == 16
    assert load_settings(env={"BANDITSTREAM_LEARN__EMIT_EVERY_S": "0.5"}).worker_config().extra["learn"] == {"emit_every_s": 0.5}
    assert load_settings(env={"BANDITSTREAM_LEARN__WAL": "true"}).worker_config().extra["learn"] == {"wal": True}
    limits = settings.validation_limits()
    assert set(limits.domains) == {"routing", "cache"} and limits.domains["routing"].vector_dim == 16


def test_metrics_bind_to_loopback_unless_told_otherwise():
    from urllib.request import urlopen

    from streams.metrics import WorkerMetrics

    assert load_settings(env={}).worker_config().metrics_host == "127.0.0.1"
    config = load_settings(env={"BANDITSTREAM_METRICS__HOST": "0.0.0.0"}).worker_config()
    assert config.metrics_host == "0.0.0.0"  # in a container or pod, for a scraper elsewhere
    metrics = WorkerMetrics("join")
    port = metrics.serve(0, config.metrics_host)
    try:
        assert metrics._server.server_address[0] == "0.0.0.0"
        with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"banditstream_" in response.read()
    finally:
        metrics.close()


def test_yaml_and_json_files_and_the_config_env_var(tmp_path):
    yml = tmp_path / "c.yaml"
    yml.write_text("topics:\n  partitions: 3\n")
    assert load_settings(env={"BANDITSTREAM_CONFIG": str(yml)}).topics.partitions == 3
    js = tmp_path / "c.json"
    js.write_text('{"topics": {"partitions": 5}}')
    assert load_settings(js, env={}).topics.partitions == 5


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"BANDITSTREAM_TOPICS__PARTITIONS": "abc"}, "topics.partitions"),
        ({"BANDITSTREAM_KAFKA__BOOTSTRAP_SERVERS": "nohost"}, "kafka.bootstrap_servers: 'nohost' is not host:port"),
        ({"BANDITSTREAM_KAFKA__PROFILE": "redpanda"}, "unknown broker profile 'redpanda'"),
        ({"BANDITSTREAM_KAFKA__BOGUS": "1"}, "kafka.bogus: unknown field"),
        ({"BANDITSTREAM_DOMAINS__R__FEATURES__DIMENSION": "x"}, "domains.r.features.dimension"),
        ({"BANDITSTREAM_DOMAINS__R__POLICY": "nope"}, "unknown policy 'nope'"),
        ({"BANDITSTREAM_DOMAINS__R__REWARD__WINDOW_S": "-1"}, "domains.r.reward.window_s"),
        ({"BANDITSTREAM_REGISTRY__FRAMING": "confluent"}, "framing 'confluent' needs registry.url"),
        ({"BANDITSTREAM_DOMAINS__R__MODE": "sometimes"}, "domains.r.mode"),
        ({"BANDITSTREAM_KAFKA__EXTRA": "{not json"}, "BANDITSTREAM_KAFKA__EXTRA: not valid JSON"),
        ({"BANDITSTREAM_JOIN__BOGUS": "1"}, "join: got an unexpected keyword argument 'bogus'"),
        ({"BANDITSTREAM_JOIN__ENTRY_CACHE": "lots"}, "join: entry_cache must be an integer, got 'lots'"),
        ({"BANDITSTREAM_JOIN__BATCH_MAX": "0"}, "join: batch_max must be > 0, got 0"),
        ({"BANDITSTREAM_JOIN__BATCH_WITHIN_S": "-0.1"}, "join: batch_within_s must be > 0, got -0.1"),
        ({"BANDITSTREAM_LEARN__BLOCK_SIZE": "-1"}, "learn: block_size must be >= 1, got -1"),
        ({"BANDITSTREAM_LEARN__WAL": "sometimes"}, "learn: wal must be true or false, got 'sometimes'"),
        ({"BANDITSTREAM_PUBLISH__ON_DRIFT": "ignore"}, "publish.on_drift"),
    ],
)
def test_invalid_values_give_one_line_naming_the_field(env, expected):
    with pytest.raises(ConfigError) as info:
        load_settings(env=env)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message
    if "BANDITSTREAM_KAFKA__EXTRA" not in env:
        assert f"from {next(iter(env))}" in message  # says where the bad value came from


def test_invalid_file_names_the_file_and_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[topics]\nreplication = 0\n")
    with pytest.raises(ConfigError, match=r"in .*bad.toml: topics.replication: .*\(got 0\)"):
        load_settings(path, env={})
    broken = tmp_path / "broken.yaml"
    broken.write_text("topics: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid yaml"):
        load_settings(broken, env={})
    ini = tmp_path / "x.ini"
    ini.write_text("")
    with pytest.raises(ConfigError, match="unknown format '.ini'"):
        load_settings(ini, env={})


def test_cli_prints_one_line_and_exits_2_on_bad_config(tmp_path):
    env = {"BANDITSTREAM_TOPICS__PARTITIONS": "-3", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "banditstream.cli", "config", "show"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "topics.partitions" in lines[0] and "Traceback" not in result.stderr


def test_a_secret_comes_from_a_file_and_is_never_shown(tmp_path):
    (tmp_path / "password").write_text("s3cret-from-file\n")
    settings = load_settings(env={
        "BANDITSTREAM_KAFKA__SECURITY_PROTOCOL": "SASL_SSL", "BANDITSTREAM_KAFKA__SASL_MECHANISM": "SCRAM-SHA-256",
        "BANDITSTREAM_KAFKA__SASL_USERNAME": "svc", "BANDITSTREAM_KAFKA__SASL_PASSWORD_FILE": str(tmp_path / "password"),
    })  # fmt: skip
    assert settings.kafka.client_config()["sasl.password"] == "s3cret-from-file"  # the trailing newline dropped
    assert "s3cret" not in repr(settings) and "s3cret" not in settings.model_dump_json()


@pytest.mark.parametrize(
    ("env", "expected", "secret"),
    [
        ({"BANDITSTREAM_REGISTRY__URL": "https://user:hunter2@registry:8081"},
         "registry.url: credentials in the URL would be shown and logged", "hunter2"),
        ({"BANDITSTREAM_KAFKA__EXTRA": '{"sasl.password": "hunter2"}'}, "kafka.extra: 'sasl.password' holds a secret", "hunter2"),
        ({"BANDITSTREAM_REGISTRY__URL": "https://registry", "BANDITSTREAM_REGISTRY__BASIC_AUTH_USER_INFO": "hunter2"},
         "basic_auth_user_info must be USER:PASSWORD", "hunter2"),
        ({"BANDITSTREAM_KAFKA__SASL_PASSWORD": "hunter2", "BANDITSTREAM_KAFKA__SASL_PASSWORD_FILE": "/x"},
         "sasl_password and sasl_password_file are both set", "hunter2"),
        ({"BANDITSTREAM_S3__SECRET_ACCESS_KEY_FILE": "/nowhere/key"}, "secret_access_key_file /nowhere/key: No such file", None),
        ({"BANDITSTREAM_S3__SECRET_ACCESS_KEY": "hunter2"}, "access_key_id and secret_access_key go together", "hunter2"),
    ],
)  # fmt: skip
def test_a_bad_secret_setting_names_the_field_and_never_echoes_the_secret(env, expected, secret):
    with pytest.raises(ConfigError) as refused:
        load_settings(env=env)
    message = str(refused.value)
    assert expected in message and "\n" not in message, message
    assert secret is None or secret not in message, message


def test_every_toml_sample_in_the_readme_loads_and_its_domains_build_without_a_warning(tmp_path, caplog, monkeypatch):
    """A reader copies these: each loads as a whole file, and every domain it declares builds
    its policy without the portfolio's warnings (a member the log would never rate better)."""
    monkeypatch.setattr(portfolio, "_WARNED_ORDER", set())  # warned once per process: start afresh

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    samples = re.findall(r"```toml\n(.*?)```", readme, re.S)
    assert any("rag_tuning" in sample for sample in samples)  # the portfolio with an optimistic member
    with caplog.at_level("WARNING"):
        for i, sample in enumerate(samples):
            path = tmp_path / f"sample{i}.toml"
            path.write_text(sample)
            settings = load_settings(path, env={})
            assert settings.domains, f"README toml sample {i} declares no domain"
            for name, domain in settings.domains.items():
                assert domain.make_policy(seed=0) is not None, name
    assert caplog.text == ""
