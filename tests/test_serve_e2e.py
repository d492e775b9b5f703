"""``banditstream serve`` end to end on the real broker: its ranks reach the decisions topic,
the rewards it is sent join them, the learner learns, the publisher signs a snapshot, and the
same running service ranks with that snapshot, without a restart. A model reset then starts
the learning over: in the learner too, not only in the snapshot it publishes at once."""

from __future__ import annotations

import json
import random
import time

from banditstream.config import Settings
from banditstream.serve import ServeApp
from banditstream.workers import WorkerProcesses
from publisher.cli_ops import generate_keys, load_keys
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig
from publisher.stores import DirectoryStore
from streams.topics import ensure_topics
from tests import join_helpers as H
from tests.serve_helpers import ARMS, DOMAIN, V1, ServerThread, call, domain_settings, serve_settings


def best(age: float) -> str:
    return "sports" if age > 0.5 else "news"


def rank(url: str, event_id: str, age: float) -> str:
    status, _, body = call("POST", f"{url}{V1}/rank", {
        "contextFeatures": [{"user": {"age": age}}], "actions": [{"id": arm, "features": [{"kind": arm}]} for arm in ARMS],
        "eventId": event_id,
    })  # fmt: skip
    assert status == 201, body
    return body["rewardActionId"]


def test_ranks_join_are_learned_the_running_service_ranks_with_the_new_snapshot_and_a_reset_starts_over(kafka, topics, tmp_path):
    ensure_topics(kafka, topics)
    keys = generate_keys(tmp_path / "keys")
    settings = serve_settings(kafka, topics, tmp_path, keys.root_file.read_bytes(), allow_model_reset=True)
    tree = json.loads(settings.model_dump_json())
    for secret in ("team-a", "team-b"):
        tree["serve"]["keys"][secret] = settings.serve.keys[secret].get_secret_value()
    tree["publish"] = {"keys_dir": str(tmp_path / "keys"), "every_seconds": 1.0, "min_samples": 1}
    tree["join"] = {"grace_s": 0.5, "sweep_interval_s": 0.2}
    tree["learn"] = {"emit_every_s": 0.3}
    config = tmp_path / "banditstream.json"
    config.write_text(json.dumps(tree))

    (tmp_path / "logs").mkdir()
    untrained = Publisher(DirectoryStore(tmp_path / "snapshots"), *load_keys(tmp_path / "keys"), domains={DOMAIN: domain_settings()},
                          config=PublisherConfig(guards=GuardConfig(min_samples=0)))  # fmt: skip
    first = untrained.publish(DOMAIN, domain_settings().make_policy()).version  # it explores (eps0 0.2)
    workers = WorkerProcesses(tmp_path / "logs")
    server = None
    try:
        for name in ("join", "learn", "publish"):
            workers.start(name, config)
        server = ServerThread(ServeApp(Settings.model_validate(tree), seed=7)).start()  # with the publish keys (reset)
        rng = random.Random(7)
        for i in range(400):  # with the untrained snapshot, logged
            age = rng.random()
            chosen = rank(server.url, f"cold-{i}", age)
            status, _, _ = call("POST", f"{server.url}{V1}/events/cold-{i}/reward", {"value": float(chosen == best(age))})
            assert status == 204
        logged = H.read_topic(kafka, topics.decisions, "decision", expect=400, idle_s=2.0, timeout_s=60)
        assert {d["event_id"] for _, d in logged} == {f"cold-{i}" for i in range(400)}

        deadline = time.monotonic() + 120  # the snapshot learned from them reaches the running service
        decider = server.app.loop(server.app.where("team-a")).decider
        while decider.active_policy is None or decider.active_policy.samples < 400:  # every logged rank learned
            workers.check()
            assert time.monotonic() < deadline, {name: workers.tail(name) for name in ("join", "learn", "publish")}
            time.sleep(0.5)

        hits, trained = 0, decider.policy_version
        for i in range(200):
            age = rng.random()
            hits += rank(server.url, f"warm-{i}", age) == best(age)
        assert hits / 200 > 0.75, hits  # the learned choice, exploration aside (the baseline got about a third)
        warm = [d for _, d in H.read_topic(kafka, topics.decisions, "decision", expect=600, idle_s=2.0, timeout_s=60)
                if d["event_id"].startswith("warm-")]
        # every one decided by the trained snapshot or a later one: on a slow machine the warm
        # decisions' own default rewards (their window closes) may be learned and published
        # before the last of them is ranked
        versions = {d["policy_version"] for d in warm}
        later = [tuple(map(int, v.split("."))) >= tuple(map(int, trained.split("."))) for v in versions]
        assert len(warm) == 200 and first not in versions and all(later), (trained, versions)

        # A model reset: the priors are published at once (a new minor version) ...
        learned = decider.policy_version
        status, _, body = call("DELETE", f"{server.url}{V1}/model")
        assert status == 204, body
        reset = decider.policy_version
        assert decider.active_policy.samples == 0 and reset.split(".")[:2] == [learned.split(".")[0], str(int(learned.split(".")[1]) + 1)]
        # ... and the learners start over at their markers: what is published next has learned
        # the events after the reset only, not the 600 before it.
        for i in range(100):
            age = rng.random()
            chosen = rank(server.url, f"after-{i}", age)
            assert call("POST", f"{server.url}{V1}/events/after-{i}/reward", {"value": float(chosen == best(age))})[0] == 204
        deadline = time.monotonic() + 120
        while decider.policy_version == reset or decider.active_policy.samples != 100:
            workers.check()
            assert time.monotonic() < deadline, (decider.policy_version, decider.active_policy.samples, workers.tail("learn"))
            time.sleep(0.5)
        assert f"default/main/{DOMAIN} reset to its priors" in workers.log_path("learn").read_text()
    finally:
        if server is not None:
            server.stop()
        workers.stop()
