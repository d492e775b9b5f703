"""`banditstream replay`: logs in, bad lines reported by number, valid events out to the topics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fastavro
import pytest

import schemas
from banditstream.replay import ReplayError, read_log
from streams.client import BatchConsumer
from streams.serde import AvroSerde
from streams.topics import ensure_topics
from tests import factories, learn_helpers

LOG = Path(__file__).parent / "data" / "interactions.jsonl"


def test_jsonl_log_becomes_decisions_and_rewards_with_bad_lines_reported():
    result = read_log(LOG, domain="rag")
    assert [d["event_id"] for d in result.decisions] == ["q1", "q2", "q3", "q6"]
    candidates = ["agentic_rag", "hybrid_rag", "naive_rag"]
    q1 = result.decisions[0]
    assert [a["id"] for a in q1["actions"]] == candidates
    assert q1["chosen"] == candidates.index("naive_rag")
    assert q1["probabilities"] == [1 / 3] * 3 and result.assumed_uniform == 3
    assert q1["context"]["numeric"] == {"question_words": 6.0, "top_k": 4.0, "num_sources": 3.0}
    assert q1["context"]["categorical"] == {"category": "account"}
    assert q1["timestamp"] == 1_760_000_000_000
    q6 = result.decisions[3]
    assert q6["probabilities"][q6["chosen"]] == 0.5 and abs(sum(q6["probabilities"]) - 1) < 1e-12
    rewards = {(r["event_id"], r["reward_id"]): r["value"] for r in result.rewards}
    assert rewards == {
        ("q1", "q1/feedback-0"): 1.0,
        ("q2", "q2/feedback-0"): 0.8,
        ("q3", "q3/feedback-0"): 0.4,
        ("q6", "fb-q6-a"): 0.0,
        ("q6", "fb-q6-b"): 1.0,
    }
    assert [(p.line, p.message.split(";")[0].split(":")[0]) for p in result.problems] == [
        (6, "not JSON"),
        (7, "top_k is 'many'"),
        (8, "feedback for interaction 'q5' comes before (or without) it"),
        (9, "reward is 'great'"),
        (10, "interaction_id is None"),
    ]


def test_avro_files_of_older_schema_versions_replay_as_current(tmp_path):
    import random

    rng = random.Random(1)
    v1 = schemas.parsed("decision", 1)
    records = []
    for i in range(5):
        record = factories.decision(i, rng)
        del record["recommended"]
        records.append(record)
    path = tmp_path / "decisions.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, v1, records)
    result = read_log(path, domain="ignored")
    assert len(result.decisions) == 5 and result.problems == []
    assert all(d["recommended"] == -1 for d in result.decisions)


def test_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(ReplayError, match="no such file"):
        read_log(tmp_path / "nope.jsonl", domain="rag")


def test_replay_cli_produces_valid_events_to_the_topics(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    env = {
        "PATH": "/usr/bin:/bin",
        "BANDITSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "BANDITSTREAM_KAFKA__PROFILE": kafka.profile,
        "BANDITSTREAM_TOPICS__DECISIONS": topics.decisions,
        "BANDITSTREAM_TOPICS__REWARDS": topics.rewards,
    }
    run = subprocess.run(
        [sys.executable, "-m", "banditstream.cli", "replay", str(LOG), "--domain", "rag"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "interactions.jsonl:6: not JSON" in run.stderr
    assert "produced 9 events" in run.stdout
    # Read to the end of every partition (the replay has flushed and exited, so everything it
    # produced is there): exact, without a group join and an idle wait for stragglers.
    got = {name: [record for record, *_ in learn_helpers.read_topic(kafka, topic, topics.partitions,
                                                                    AvroSerde(name, framing="single_object"))]
           for topic, name in ((topics.decisions, "decision"), (topics.rewards, "reward"))}  # fmt: skip
    assert sorted(d["event_id"] for d in got["decision"]) == ["q1", "q2", "q3", "q6"]
    assert len(got["reward"]) == 5


def test_replay_round_trips_a_sample_log_into_the_learner(kafka, topics, tmp_path):
    """replay -> decisions/rewards topics -> join worker -> updates -> learner -> posterior."""
    import json as _json
    import os
    import signal
    import time

    import numpy as np

    from learner.domain import DomainSettings

    ensure_topics(kafka, topics)
    config = {
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "profile": kafka.profile},
        "topics": topics.model_dump(),
        "stores": {"state_dir": str(tmp_path / "state")},
        "learn": {"emit_every_s": 0.2},
        "join": {"sweep_interval_s": 0.2},
        "domains": {"rag": {"policy": "lin_ucb", "features": {"dimension": 16, "normalize": False},
                            "reward": {"expression": "1.0*success", "window_s": 1.0, "aggregate": "mean"}}},
    }  # fmt: skip
    (tmp_path / "bs.json").write_text(_json.dumps(config))
    env = {"PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "banditstream.cli", "--config", str(tmp_path / "bs.json")]
    workers = [
        subprocess.Popen([*cli, name], env={**env, "BANDITSTREAM_STORES__STATE_DIR": str(tmp_path / name)},
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{name}.log", "wb"), start_new_session=True)
        for name in ("join", "learn")
    ]  # fmt: skip
    try:
        run = subprocess.run([*cli, "replay", str(LOG), "--domain", "rag"], capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode == 0, run.stderr
        latest: dict[str, dict] = {}
        deadline = time.monotonic() + 60
        serde = AvroSerde("posterior", framing="single_object")
        with BatchConsumer(kafka, "replay-posterior", [topics.posterior]) as consumer:
            while time.monotonic() < deadline and sum(s["update_count"] for s in latest.values()) < 4:
                for record in consumer.poll_batch(serde, timeout=0.5).records:
                    latest[record["arm"]] = record
        assert {arm: s["update_count"] for arm, s in latest.items()} == {"naive_rag": 1, "agentic_rag": 2, "hybrid_rag": 1}
        # the learned state is exactly what the logged rewards say: q6's two feedbacks average to 0.5
        settings = DomainSettings(**config["domains"]["rag"])
        expected = settings.make_policy()
        decisions = read_log(LOG, domain="rag").decisions
        rewards = {"q1": 1.0, "q2": 0.8, "q3": 0.4, "q6": 0.5}
        encoder = settings.encoder()
        rows = encoder.acted_matrix(decisions)
        expected.update_batch(rows, [d["actions"][d["chosen"]]["id"] for d in decisions], [rewards[d["event_id"]] for d in decisions])
        for arm, shard in latest.items():
            got = settings.make_policy()
            got.load_arm_state(arm, shard["state"])
            assert np.allclose(got.posterior_mean(arm), expected.posterior_mean(arm), atol=1e-9)
    finally:
        for worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
        for worker in workers:
            worker.wait(30)
    assert [w.returncode for w in workers] == [0, 0]


def test_a_logged_boolean_becomes_the_category_the_sdk_gives_it(tmp_path):
    (tmp_path / "log.jsonl").write_text(json.dumps({"interaction_id": "i1", "agent": "a", "context": {"vip": True, "new": False},
                                                    "timestamp": 1_700_000_000_000}) + "\n")  # fmt: skip
    decision = read_log(tmp_path / "log.jsonl", domain="d").decisions[0]
    assert decision["context"]["categorical"] == {"vip": "true", "new": "false"}  # as Decider.decide and serve encode them


def test_a_logged_dense_vector_is_the_context_s_vector_and_a_bad_one_is_reported(tmp_path):
    from banditstream.replay import joined_events
    from learner.domain import DomainSettings

    lines = [
        {"interaction_id": "i1", "agent": "a", "context": {"x": 1.5, "embedding": [0.25, -1.0, 2.0]}, "timestamp": 1},
        {"interaction_id": "i2", "agent": "b", "context": {"e1": [1.0], "e2": [2.0]}, "timestamp": 2},
        {"interaction_id": "i3", "agent": "a", "context": {"embedding": [1.0, "x", 3.0]}, "timestamp": 3},
        {"interaction_id": "i4", "agent": "a", "context": {"nested": {"a": 1}}, "timestamp": 4},
        {"interaction_id": "i1", "reward": 1.0},
    ]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = read_log(tmp_path / "log.jsonl", domain="d", actions=["a", "b"])
    assert [d["context"]["vector"] for d in result.decisions] == [[0.25, -1.0, 2.0]]
    assert [(p.line, p.message.split(";")[0].split(" is ")[0].split(" must")[0]) for p in result.problems] == [
        (2, "context.e2"), (3, "context.embedding"), (4, "context.nested")]
    settings = DomainSettings.model_validate({"features": {"dimension": 8, "vector_dim": 3, "vector_layout": "direct",
                                                           "normalize": False}})  # fmt: skip
    row = joined_events(tmp_path / "log.jsonl", "d", settings, actions=["a", "b"])[0]
    assert row["features"][1:4] == [0.25, -1.0, 2.0] and row["reward"] == 1.0  # in slots 1..3, as the join places it


def test_an_interaction_may_carry_its_own_candidates_with_features_and_the_whole_logged_distribution(tmp_path):
    configs = [{"id": "bm25-k8", "features": {"k": 8, "variant": "bm25", "rerank": False}},
               {"id": "dense-k16", "features": {"k": 16, "variant": "dense", "rerank": True}}]
    lines = [
        {"interaction_id": "i1", "agent": "dense-k16", "actions": configs, "probabilities": [0.25, 0.75], "timestamp": 1},
        {"interaction_id": "i2", "agent": "bm25-k8", "actions": configs, "probabilities": [0.5, 0.6], "timestamp": 2},
        {"interaction_id": "i3", "agent": "bm25-k8", "actions": [{"id": "bm25-k8", "features": {"k": [8]}}], "timestamp": 3},
        {"interaction_id": "i4", "agent": "hybrid", "actions": configs, "timestamp": 4},
        {"interaction_id": "i5", "agent": "bm25-k8", "actions": configs + configs[:1], "timestamp": 5},
    ]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = read_log(tmp_path / "log.jsonl", domain="rag")
    [decision] = result.decisions
    assert decision["chosen"] == 1 and decision["probabilities"] == [0.25, 0.75] and result.assumed_uniform == 0
    assert decision["actions"][1]["features"] == {"numeric": {"k": 16.0}, "categorical": {"variant": "dense", "rerank": "true"},
                                                  "vector": []}  # fmt: skip
    assert [(p.line, p.message.split(" ")[0]) for p in result.problems] == [
        (2, "probabilities"), (3, "actions[0].features.k"), (4, "agent"), (5, "actions")]
