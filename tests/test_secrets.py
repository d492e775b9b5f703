"""The whole loop on a secured broker, and secrets that never leak.

The broker is Tansu behind ``tests.secure_broker``'s proxy (Tansu itself cannot run SASL or TLS
here): SASL_SSL with SCRAM-SHA-512, the CA given, the password read from a file as a mounted
Secret would be. The registry (``tests.registry_server``) wants basic auth, its credentials
from the environment. The join (its faust app included), the learner and the publisher run as
``banditstream`` processes with ``--verbose``, the SDK decides and emits beside them, a bad
record is dead-lettered, a snapshot is published; then every place a secret could end up is
searched for each one: ``config show``, the workers' output, their ``/metrics``, every record
of every topic (dead letters included), the snapshot repository and the workers' state files.
Wrong credentials stop a worker at once with the broker's answer.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from banditstream.decider import Decider
from learner.domain import DomainSettings
from publisher.cli_ops import generate_keys
from streams.settings import KafkaSettings, RegistrySettings
from streams.topics import ensure_topics
from tests import join_helpers as H
from tests.registry_server import RegistryServer
from tests.secure_broker import SecureBroker

ROOT = Path(__file__).resolve().parents[1]
KAFKA_PASSWORD = "kafka-Pa55word-0c1d"
REGISTRY_PASSWORD = "registry-Pa55word-9e8f"
S3_SECRET = "s3-Secret-Key-5a6b7c"
SECRETS = (KAFKA_PASSWORD, REGISTRY_PASSWORD, S3_SECRET)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with SecureBroker(tmp_path_factory.mktemp("secure-broker"), tls=True, users={"banditstream": KAFKA_PASSWORD}) as b:
        yield b


def _kafka(broker: SecureBroker, password: str = KAFKA_PASSWORD) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=broker.bootstrap, profile="tansu", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
        sasl_username="banditstream", sasl_password=password, ssl_ca_location=str(broker.ca_path),
    )  # fmt: skip


def _cli(args: list[str], env: dict[str, str], log: Path | None = None, **kwargs):
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("BANDITSTREAM_")}, **env, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "banditstream.cli", *args]
    if log is None:
        return subprocess.run(command, cwd=ROOT, env=full, capture_output=True, text=True, timeout=60, **kwargs)
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT, **kwargs)


def test_the_loop_runs_on_sasl_ssl_and_no_secret_reaches_any_output(broker, topics, tmp_path):
    kafka = _kafka(broker)
    ensure_topics(kafka, topics)
    generate_keys(tmp_path / "keys")
    (tmp_path / "kafka-password").write_text(KAFKA_PASSWORD + "\n")
    snapshots, state = tmp_path / "snapshots", tmp_path / "state"
    ports = {worker: H.free_port() for worker in ("join", "learn", "publish")}
    tree = {
        "kafka": {"bootstrap_servers": broker.bootstrap, "profile": "tansu", "security_protocol": "SASL_SSL",
                  "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "banditstream",
                  "sasl_password_file": str(tmp_path / "kafka-password"), "ssl_ca_location": str(broker.ca_path)},
        "topics": topics.model_dump(),
        "stores": {"state_dir": str(state), "snapshots": str(snapshots)},
        "s3": {"access_key_id": "AKIATESTKEY"},
        "publish": {"keys_dir": str(tmp_path / "keys"), "every_seconds": 1.0, "every_updates": 50},
        "learn": {"block_size": 16, "emit_every_s": 0.3}, "join": {"grace_s": 0.5, "sweep_interval_s": 0.2},
        "domains": {"routing": {**H.DOMAINS["routing"], "reward": {**H.DOMAINS["routing"]["reward"], "window_s": 0.5}}},
    }  # fmt: skip
    config = tmp_path / "banditstream.json"
    config.write_text(json.dumps(tree))
    with RegistryServer(basic_auth=("banditstream", REGISTRY_PASSWORD)) as registry:
        env = {"BANDITSTREAM_REGISTRY__URL": registry.url,
               "BANDITSTREAM_REGISTRY__BASIC_AUTH_USER_INFO": f"banditstream:{REGISTRY_PASSWORD}",
               "BANDITSTREAM_S3__SECRET_ACCESS_KEY": S3_SECRET}  # fmt: skip
        shown = _cli(["--config", str(config), "config", "show"], env)
        assert shown.returncode == 0, shown.stderr
        assert "**********" in shown.stdout and "sasl_password" in shown.stdout
        outputs = {"config show": shown.stdout + shown.stderr}

        logs = {worker: tmp_path / f"{worker}.log" for worker in ports}
        workers = {
            worker: _cli(["--verbose", "--config", str(config), worker], {**env, "BANDITSTREAM_METRICS__PORT": str(port)},
                         logs[worker], start_new_session=True)
            for worker, port in ports.items()
        }  # fmt: skip
        try:
            events = RegistrySettings(url=registry.url, basic_auth_user_info=f"banditstream:{REGISTRY_PASSWORD}")
            decider = Decider("routing", kafka=kafka, settings=DomainSettings.model_validate(H.DOMAINS["routing"]),
                              topics=topics, schema_registry=events, spool_path=tmp_path / "spool", seed=3)
            rng = random.Random(3)
            for i in range(120):
                decider.decide({"tokens": rng.uniform(0, 500), "tier": rng.choice(["free", "pro"])}, list(H.ARMS), f"e-{i}")
                decider.reward(f"e-{i}", {"success": rng.random(), "latency_ms": rng.uniform(50, 900)})
            decider.close()
            raw = Producer(kafka.producer_config())
            raw.produce(topics.decisions, key=b"bad-0", value=b"\x07not an event")
            raw.flush(10)

            deadline = time.monotonic() + 120
            while not list(snapshots.rglob("*.json")) or not H.raw_records(kafka, topics.deadletter, 1, idle_s=3.0):
                for worker, process in workers.items():
                    assert process.poll() is None, f"{worker} exited {process.returncode}: {logs[worker].read_text()[-3000:]}"
                assert time.monotonic() < deadline, {w: log.read_text()[-1500:] for w, log in logs.items()}
                time.sleep(1.0)
            for worker, port in ports.items():
                outputs[f"{worker} /metrics"] = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        finally:
            for process in workers.values():
                process.send_signal(signal.SIGTERM)
            codes = {worker: process.wait(60) for worker, process in workers.items()}
        assert codes == dict.fromkeys(workers, 0), {w: logs[w].read_text()[-2000:] for w in workers}

    scram = {(a.mechanism, a.principal, a.ok) for a in broker.authentications}
    assert ("SCRAM-SHA-512", "banditstream", True) in scram  # the workers and the SDK authenticated for real
    for worker, log in logs.items():
        outputs[f"{worker} output"] = log.read_text(errors="replace")
    for role, topic in topics.names().items():
        partitions = 1 if role == "deadletter" else topics.update_partitions if role in ("updates", "posterior") else topics.partitions
        outputs[f"topic {role}"] = b"\n".join((m.key() or b"") + (m.value() or b"") for m in H.raw_records(kafka, topic, partitions, idle_s=3.0)).decode("latin-1")
    assert "bad-0" in outputs["topic deadletter"]
    files = [path for path in [*snapshots.rglob("*"), *state.rglob("*")] if path.is_file()]
    assert any(path.suffix == ".json" for path in files) and any("join" in path.parts for path in files)
    for path in files:
        outputs[str(path)] = path.read_bytes().decode("latin-1")
    leaks = [(secret, where) for where, text in outputs.items() for secret in SECRETS if secret in text]
    assert not leaks, leaks


def test_wrong_credentials_stop_a_worker_at_once_with_the_brokers_answer(broker, topics, tmp_path):
    ensure_topics(_kafka(broker), topics)
    config = tmp_path / "banditstream.json"
    config.write_text(json.dumps({
        "kafka": {"bootstrap_servers": broker.bootstrap, "profile": "tansu", "security_protocol": "SASL_SSL",
                  "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "banditstream", "ssl_ca_location": str(broker.ca_path)},
        "topics": topics.model_dump(), "stores": {"state_dir": str(tmp_path / "state")},
        "domains": {"routing": H.DOMAINS["routing"]},
    }))  # fmt: skip
    started = time.monotonic()
    done = _cli(["--config", str(config), "learn"], {"BANDITSTREAM_KAFKA__SASL_PASSWORD": "not-the-password"})
    assert time.monotonic() - started < 30
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the broker refused this client" in done.stderr and "Authentication" in done.stderr, done.stderr
    assert "not-the-password" not in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_the_join_s_faust_app_gets_oidc_tokens_for_oauthbearer(broker, topics):
    """aiokafka has no OIDC of its own: ``faust_credentials`` gives it a token provider doing the
    client-credentials grant, as ``sasl.oauthbearer.method=oidc`` does for librdkafka."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    from streams.security import faust_credentials

    kafka = KafkaSettings(
        bootstrap_servers=broker.bootstrap, security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
        sasl_oauthbearer_token_endpoint_url=broker.token_endpoint_url, sasl_oauthbearer_client_id=broker.oauth_client_id,
        sasl_oauthbearer_client_secret=broker.oauth_client_secret, ssl_ca_location=str(broker.ca_path),
    )  # fmt: skip
    ensure_topics(kafka, topics)  # librdkafka's own OIDC, the same settings
    credentials = faust_credentials(kafka)

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, security_protocol="SASL_SSL",
                                    sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=credentials.oauth_cb,
                                    ssl_context=credentials.ssl_context)  # fmt: skip
        await producer.start()
        try:
            await producer.send_and_wait(topics.decisions, b"hello", key=b"k", partition=0)
        finally:
            await producer.stop()

    asyncio.run(send())
    oauth = [a for a in broker.authentications if a.mechanism == "OAUTHBEARER"]
    assert oauth and all(a.ok and a.principal == broker.oauth_client_id for a in oauth), oauth


def test_s3_credentials_come_from_the_config_a_profile_or_boto3_s_standard_chain(s3, tmp_path, monkeypatch):
    import boto3

    from banditstream.config import Settings
    from publisher.stores import open_store

    bucket = f"creds-{random.randrange(1 << 30):x}"
    boto3.client("s3", **s3).create_bucket(Bucket=bucket)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    base = {"endpoint_url": s3["endpoint_url"], "region": s3["region_name"]}

    def round_trip(s3_section: dict, key: str) -> str:
        """Writes and reads through a store built from the settings; which credentials boto3 used."""
        settings = Settings.model_validate({"s3": {**base, **s3_section}, "stores": {"snapshots": f"s3://{bucket}/p"}})
        store = open_store(settings.stores.snapshots, s3=settings.s3_client_kwargs())
        store.put(key, key.encode())
        assert store.get(key) == key.encode()
        credentials = store.client._request_signer._credentials  # (the server here checks no signature)
        assert credentials.access_key == s3["aws_access_key_id"]
        return credentials.method

    keys = {"access_key_id": s3["aws_access_key_id"], "secret_access_key": s3["aws_secret_access_key"]}
    assert round_trip(keys, "from-config") == "explicit"
    (tmp_path / "credentials").write_text(f"[team]\naws_access_key_id = {s3['aws_access_key_id']}\n"
                                          f"aws_secret_access_key = {s3['aws_secret_access_key']}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    assert round_trip({"profile": "team"}, "from-profile") == "shared-credentials-file"
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["aws_secret_access_key"])
    assert round_trip({}, "from-environment") == "env"
