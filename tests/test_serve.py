"""``banditstream serve`` with the hosted service's official clients, unchanged, on loopback.

The service decides from a snapshot signed with real keys in a DirectoryStore and emits to
the session's broker; what the clients did is read back from the decisions and rewards
topics. Every response body is checked against the API definition's schema.
"""

from __future__ import annotations


import pytest
from azure.ai.personalizer import PersonalizerAdministrationClient
from azure.ai.personalizer import PersonalizerClient as PreviewClient
from azure.cognitiveservices.personalizer import PersonalizerClient as V1Client
from azure.cognitiveservices.personalizer.models import RankableAction, RankRequest
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import HttpResponseError
from msrest.authentication import CognitiveServicesCredentials

from banditstream.serve_domains import Where
from streams.settings import TopicSettings
from tests import join_helpers as H
from tests import serve_helpers as S

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def topics() -> TopicSettings:
    return S.fresh_topics("s")


@pytest.fixture(scope="module")
def served(kafka, topics, tmp_path_factory, keys, root):
    with S.serving(kafka, topics, tmp_path_factory.mktemp("serve"), keys, root, seed=5) as served:
        yield served


@pytest.fixture(scope="module")
def schemas() -> S.Schemas:
    return S.Schemas()


def context(age: float) -> list[dict]:
    return [{"user": {"age": age, "mobile": True}}, {"timeOfDay": "morning"}]


def test_the_v1_client_ranks_rewards_and_activates_a_deferred_rank(served, kafka, topics):
    client = V1Client(served.url, CognitiveServicesCredentials(S.KEY))
    actions = [RankableAction(id=arm, features=[{"kind": arm}]) for arm in S.ARMS]
    ranked = client.rank(RankRequest(context_features=context(0.9), actions=actions, excluded_actions=["entertainment"]))
    assert ranked.reward_action_id in ("sports", "news")
    assert [a.id for a in ranked.ranking][-1] == "entertainment" and ranked.ranking[-1].probability == 0.0
    assert ranked.ranking[0].id == ranked.reward_action_id
    assert sum(a.probability for a in ranked.ranking) == pytest.approx(1.0)
    client.events.reward(ranked.event_id, 0.8)

    deferred = client.rank(RankRequest(context_features=context(0.1), actions=actions, event_id="deferred-v1-1", defer_activation=True))
    assert deferred.event_id == "deferred-v1-1"
    client.events.activate(deferred.event_id)
    client.events.reward(deferred.event_id, 1.0)

    decisions = {e["event_id"]: e for _, e in H.read_topic(kafka, topics.decisions, "decision", until=H.every_event([
        ranked.event_id, deferred.event_id]), idle_s=0.5, timeout_s=60) if e["event_id"] in (ranked.event_id, deferred.event_id)}  # noqa: E501
    first = decisions[ranked.event_id]
    # the event logs the candidates (excluded left out) and the distribution the ranking reports
    assert [a["id"] for a in first["actions"]] == ["sports", "news"]
    by_id = {a.id: a.probability for a in ranked.ranking}
    assert first["probabilities"] == pytest.approx([by_id["sports"], by_id["news"]])
    assert first["actions"][first["chosen"]]["id"] == ranked.reward_action_id
    assert first["context"]["numeric"] == {"user.age": 0.9}
    assert first["context"]["categorical"] == {"user.mobile": "true", "timeOfDay": "morning"}
    assert first["actions"][0]["features"]["categorical"] == {"kind": "sports"}
    assert first["policy_version"] == served.version and first["tenant"] == "default" and first["domain"] == S.DOMAIN
    assert first["deferred"] is False and decisions[deferred.event_id]["deferred"] is True

    rewards = [e for _, e in H.read_topic(kafka, topics.rewards, "reward", until=lambda r: sum(
        e["event_id"] in (ranked.event_id, deferred.event_id) for _, e in r) >= 3, idle_s=0.5, timeout_s=60)]
    mine = sorted((e["event_id"], e["reward_id"] == "activate", e["value"]) for e in rewards
                  if e["event_id"] in (ranked.event_id, deferred.event_id))  # fmt: skip
    assert mine == sorted([(ranked.event_id, False, 0.8), (deferred.event_id, True, None), (deferred.event_id, False, 1.0)])


def test_the_preview_clients_rank_multislot_and_configure(served, kafka, topics):
    endpoint, credential = served.url, AzureKeyCredential(S.KEY)
    client = PreviewClient(endpoint, credential)
    admin = PersonalizerAdministrationClient(endpoint, credential)
    actions = [{"id": arm, "features": [{"kind": arm}]} for arm in S.ARMS]

    ranked = client.rank({"contextFeatures": context(0.95), "actions": actions})
    assert ranked["rewardActionId"] in S.ARMS and len(ranked["ranking"]) == 3
    client.reward(ranked["eventId"], {"value": 1.0})
    deferred = client.rank({"contextFeatures": context(0.5), "actions": actions, "deferActivation": True})
    client.activate(deferred["eventId"])
    client.reward(deferred["eventId"], {"value": 0.0})

    slots = [{"id": "main", "baselineAction": "news", "features": [{"size": "large"}]},
             {"id": "side", "baselineAction": "sports", "excludedActions": ["entertainment"]}]
    multi = client.rank_multi_slot({"contextFeatures": context(0.2), "actions": actions, "slots": slots, "deferActivation": True})
    chosen = {s["id"]: s["rewardActionId"] for s in multi["slots"]}
    assert set(chosen) == {"main", "side"} and chosen["main"] != chosen["side"] and chosen["side"] != "entertainment"
    client.reward_multi_slot(multi["eventId"], {"reward": [{"slotId": "main", "value": 1.0}, {"slotId": "side", "value": 0.5}]})
    client.activate_multi_slot(multi["eventId"])

    config = admin.get_service_configuration()
    assert config["rewardWaitTime"] == "PT0.5S" and config["learningMode"] == "Online"
    config.update({"explorationPercentage": 0.3, "defaultReward": -0.5, "rewardAggregation": "average", "logRetentionDays": 30})
    updated = admin.update_service_configuration(config)
    assert updated["explorationPercentage"] == 0.3 and updated["rewardAggregation"] == "average"
    assert updated["defaultReward"] == -0.5 and updated["logRetentionDays"] == 30
    assert admin.get_service_configuration()["explorationPercentage"] == 0.3
    loop = served.app.loop(Where("default", "main", S.DOMAIN))
    assert loop.domain_settings.params["eps0"] == 0.3 and loop.domain_settings.reward.aggregate == "mean"
    assert loop.path.exists()  # persisted in the state dir

    policy = admin.get_policy()
    assert policy["name"] == "lin_ucb" and "--alpha 0.05" in policy["arguments"]
    changed = admin.update_policy({"name": "lin_ucb", "arguments": "--alpha 0.5 --seed 1"})
    assert "--alpha 0.5" in changed["arguments"] and "--eps0 0.3" in changed["arguments"]  # the floor kept
    reset = admin.reset_policy()
    assert "--alpha 0.05" in reset["arguments"]

    properties = admin.get_model_properties()
    assert properties["creationTime"].endswith("Z")
    model = b"".join(admin.export_model())
    from publisher.snapshot import Snapshot

    assert Snapshot.from_bytes(model).version == served.version  # the signed snapshot's blob
    log_properties = admin.get_log_properties()
    assert log_properties["dateRange"]["from"] <= log_properties["dateRange"]["to"]
    with pytest.raises(HttpResponseError) as refused:
        admin.delete_logs()
    assert refused.value.status_code == 403

    # the modes map onto the Decider: Apprentice acts on the baseline (the first candidate)
    admin.update_service_configuration({"learningMode": "Apprentice"})
    baseline = client.rank({"contextFeatures": context(0.95), "actions": actions})
    assert baseline["rewardActionId"] == "sports" and baseline["ranking"][0] == {"id": "sports", "probability": 1.0}
    admin.update_service_configuration({"learningMode": "Online"})

    slot_ids = {f"{multi['eventId']}/main", f"{multi['eventId']}/side"}
    decisions = {e["event_id"]: e for _, e in H.read_topic(kafka, topics.decisions, "decision",
                 until=H.every_event(slot_ids | {deferred["eventId"], baseline["eventId"]}), idle_s=0.5, timeout_s=60)}  # fmt: skip
    main = decisions[f"{multi['eventId']}/main"]
    assert main["deferred"] is True and main["actions"][0]["id"] == "news"  # the slot's baseline first
    assert main["context"]["categorical"]["slot.size"] == "large"
    assert [a["id"] for a in decisions[f"{multi['eventId']}/side"]["actions"]][0] == "sports"
    assert decisions[baseline["eventId"]]["mode"] == "shadow" and decisions[deferred["eventId"]]["mode"] == "live"
    rewards = H.read_topic(kafka, topics.rewards, "reward", until=lambda r: sum(e["event_id"] in slot_ids for _, e in r) >= 4,
                           idle_s=0.5, timeout_s=60)  # fmt: skip
    per_slot = sorted((e["event_id"], e["reward_id"] == "activate", e["value"]) for _, e in rewards if e["event_id"] in slot_ids)
    assert per_slot == sorted([(f"{multi['eventId']}/main", False, 1.0), (f"{multi['eventId']}/side", False, 0.5),
                               (f"{multi['eventId']}/main", True, None), (f"{multi['eventId']}/side", True, None)])


def test_every_response_body_validates_against_the_api_definition(served, schemas):
    u, qs = served.url, S.PREVIEW_QS
    rank = {"contextFeatures": context(0.4), "actions": [{"id": a, "features": []} for a in S.ARMS], "excludedActions": ["news"]}
    service = {"rewardWaitTime": "PT10M", "defaultReward": 0.0, "rewardAggregation": "earliest", "explorationPercentage": 0.2,
               "modelExportFrequency": "PT5M", "logRetentionDays": -1}
    calls = [
        ("v1.0", "POST", "/rank", f"{u}{S.V1}/rank", rank, 201),
        ("v1.0", "GET", "/configurations/service", f"{u}{S.V1}/configurations/service", None, 200),
        ("v1.0", "PUT", "/configurations/service", f"{u}{S.V1}/configurations/service", service, 200),
        ("v1.0", "GET", "/configurations/policy", f"{u}{S.V1}/configurations/policy", None, 200),
        ("v1.0", "PUT", "/configurations/policy", f"{u}{S.V1}/configurations/policy", {"name": "lin_ucb", "arguments": "--alpha 0.1"}, 200),
        ("v1.0", "DELETE", "/configurations/policy", f"{u}{S.V1}/configurations/policy", None, 200),
        ("v1.0", "GET", "/model", f"{u}{S.V1}/model", None, 200),
        ("v1.0", "GET", "/model/properties", f"{u}{S.V1}/model/properties", None, 200),
        ("v1.0", "GET", "/logs/properties", f"{u}{S.V1}/logs/properties", None, 200),
        ("v1.0", "POST", "/rank", f"{u}{S.V1}/rank", {"actions": []}, 400),
        ("2022-09-01-preview", "POST", "/rank", f"{u}/personalizer/rank?{qs}", rank, 201),
        ("2022-09-01-preview", "POST", "/multislot/rank", f"{u}/personalizer/multislot/rank?{qs}",
         {**rank, "excludedActions": None, "slots": [{"id": "s1", "baselineAction": "news"}]}, 201),
        ("2022-09-01-preview", "GET", "/configurations/service", f"{u}/personalizer/configurations/service?{qs}", None, 200),
        ("2022-09-01-preview", "PUT", "/configurations/service", f"{u}/personalizer/configurations/service?{qs}",
         {**service, "modelRetrainDays": 0, "learningMode": "Online"}, 200),
        ("2022-09-01-preview", "GET", "/configurations/policy", f"{u}/personalizer/configurations/policy?{qs}", None, 200),
        ("2022-09-01-preview", "DELETE", "/configurations/policy", f"{u}/personalizer/configurations/policy?{qs}", None, 200),
        ("2022-09-01-preview", "GET", "/model/properties", f"{u}/personalizer/model/properties?{qs}", None, 200),
        ("2022-09-01-preview", "GET", "/logs/properties", f"{u}/personalizer/logs/properties?{qs}", None, 200),
        ("2022-09-01-preview", "DELETE", "/logs", f"{u}/personalizer/logs?{qs}", None, 403),
        ("2022-09-01-preview", "POST", "/rank", f"{u}/personalizer/rank?{qs}", {"actions": "x"}, 400),
        ("2022-09-01-preview", "PUT", "/configurations/service", f"{u}/personalizer/configurations/service?{qs}",
         {"rewardWaitTime": "soon"}, 400),
    ]
    event_ids = {}
    for version, method, path, url, body, status in calls:
        got, headers, payload = S.call(method, url, body)
        assert got == status, (method, url, payload)
        schemas.validate(version, path, method, got, payload)
        if path == "/rank" and got == 201:
            event_ids[version] = payload["eventId"]
    for version, prefix, suffix in (("v1.0", S.V1, ""), ("2022-09-01-preview", "/personalizer", f"?{qs}")):
        event_id = event_ids[version]
        got, _, payload = S.call("POST", f"{u}{prefix}/events/{event_id}/reward{suffix}", {"value": 0.5})
        assert (got, payload) == (204, None)
        got, _, payload = S.call("POST", f"{u}{prefix}/events/{event_id}/activate{suffix}")
        assert (got, payload) == (204, None)


def test_stats_rank_the_arms_from_the_updates_topic_as_the_cli_does(served, kafka, topics, tmp_path, root):
    """GET /v1/stats and `banditstream stats` read the same window of the updates topic and
    give the same leaderboard, its posterior means from the snapshot the service decides with."""
    import json
    import random
    import time

    from banditstream.cli import main
    from banditstream.stats import leaderboard
    from streams.serde import AvroSerde
    from tests.learn_helpers import make_updates, produce

    now = int(time.time() * 1000)
    rng = random.Random(12)
    rows = []
    for i, template in enumerate(make_updates(600, seed=12, modes=False)):
        arm = S.ARMS[i % 3]
        recent = i < 500  # the rest was decided two hours ago: outside the window
        rows.append({**template, "event_id": f"stats-{i}", "domain": S.DOMAIN, "arm": arm, "arm_index": i % 3,
                     "actions": list(S.ARMS), "probabilities": [1 / 3] * 3, "probability": 1 / 3,
                     "features": [1.0] + [rng.gauss(0, 1) for _ in range(15)], "feature_hash": "",
                     "reward": float(rng.random() < {"sports": 0.6, "news": 0.3, "entertainment": 0.1}[arm]),
                     "decision_time": now - (1000 * i if recent else 7_200_000 + i)})  # fmt: skip
    serde = AvroSerde("update", framing="single_object")
    produce(kafka, topics.updates, [(f"default/main/{S.DOMAIN}/{u['arm']}", serde.encode(u)) for u in rows])

    got, _, body = S.call("GET", f"{served.url}/v1/stats?window=1h")
    assert got == 200, body
    policy = served.app.loop(Where("default", "main", S.DOMAIN)).decider.active_policy.policy
    expected = leaderboard(rows, tenant="default", workspace="main", domain=S.DOMAIN, since_ms=body["since_ms"],
                           until_ms=body["until_ms"], policy=policy, snapshot_version=served.version).to_dict()
    assert body == expected
    assert body["decisions"] == 500 and [a["arm"] for a in body["arms"]] == ["sports", "news", "entertainment"]
    assert all(a["posterior_mean"] is not None for a in body["arms"])

    tree = S.serve_config(kafka, topics, tmp_path, root)
    tree["stores"]["snapshots"] = str(served.settings.stores.snapshots)  # the service's repository
    config = tmp_path / "banditstream.json"
    config.write_text(json.dumps(tree))
    out = tmp_path / "stats.json"
    assert main(["--config", str(config), "stats", "--domain", S.DOMAIN, "--window", "1h", "--json", str(out)]) == 0
    cli = json.loads(out.read_text())
    assert cli["arms"] == body["arms"] and cli["snapshot_version"] == served.version

    for query, field in (("window=soon", "window"), ("level=2", "level")):
        got, _, error = S.call("GET", f"{served.url}/v1/stats?{query}")
        assert got == 400 and error["error"]["message"].startswith(f"{field}:"), error
    assert S.call("GET", f"{served.url}/v1/stats", key=None)[0] == 401


def test_the_dashboard_draws_its_charts_in_chromium_with_the_numbers_of_v1_stats(served, kafka, topics, tmp_path):
    """The page at / in a real headless Chromium: no console errors, every chart drawn with
    its marks, and the leaderboard's numbers those of GET /v1/stats for the same window."""
    import random
    import time
    import urllib.parse

    from banditstream.serve import DASHBOARD_COOKIE
    from streams.serde import AvroSerde
    from tests.browser import Browser
    from tests.learn_helpers import make_updates, produce

    now = int(time.time() * 1000)
    rng = random.Random(13)
    cost = {"sports": 3.0, "news": 1.0, "entertainment": 0.5}
    rows = []
    for i, template in enumerate(make_updates(400, seed=13, modes=False)):
        k = i % 3
        arm = S.ARMS[k]
        quality = float(rng.random() < {"sports": 0.8, "news": 0.5, "entertainment": 0.45}[arm])
        rows.append({**template, "event_id": f"dash-{i}", "domain": S.DOMAIN, "arm": arm, "arm_index": k,
                     "actions": list(S.ARMS), "probabilities": [1 / 3] * 3, "probability": 1 / 3,
                     "features": [1.0] + [rng.gauss(0, 1) for _ in range(15)], "feature_hash": "",
                     "reward": quality - 0.1 * cost[arm], "signals": {"cost": cost[arm], "quality": quality},
                     "decision_time": now - 5_400_000 + 1000 * i})  # fmt: skip
    serde = AvroSerde("update", framing="single_object")
    produce(kafka, topics.updates, [(f"default/main/{S.DOMAIN}/{u['arm']}", serde.encode(u)) for u in rows])

    assert S.call("GET", f"{served.url}/", key=None)[0] == 401  # the login form
    form = urllib.parse.urlencode({"key": "wrong"}).encode()
    assert S.call("POST", f"{served.url}/dashboard/login", raw=form, key=None)[0] == 401

    browser = Browser()
    try:
        browser.get(f"{served.url}/healthz")
        browser.add_cookie(DASHBOARD_COOKIE, S.KEY)
        browser.get(f"{served.url}/?window=2h")
        _, _, stats = S.call("GET", f"{served.url}/v1/stats?window=2h")  # the same cached window
        errors = [entry for entry in browser.console() if entry["level"] == "SEVERE"]
        assert not errors, errors
        drawn = browser.run("""return [...document.querySelectorAll('svg.chart')].map(svg => ({
            kind: svg.dataset.chart, marks: svg.querySelectorAll('.mark').length,
            width: svg.getBoundingClientRect().width, front: svg.querySelectorAll('.front').length}));""")
        kinds = {chart["kind"]: chart for chart in drawn}
        assert set(kinds) == {"lines", "bars", "intervals", "scatter"}, drawn
        assert all(chart["width"] > 100 for chart in drawn)
        assert kinds["bars"]["marks"] == kinds["scatter"]["marks"] == len(stats["arms"]) == 3
        assert kinds["lines"]["marks"] >= 4 and kinds["intervals"]["marks"] == 2 + 3  # logging, uniform, always:*
        assert kinds["scatter"]["front"] == 1
        table = browser.run("""return [...document.querySelectorAll('#leaderboard tr[data-arm]')].map(tr =>
            [tr.dataset.arm, ...[...tr.cells].map(td => td.dataset.value === undefined ? null : Number(td.dataset.value))]);""")
        assert [(row[0], row[3], row[4], row[6], row[9]) for row in table] == [
            (a["arm"], a["decisions"], a["share"], a["mean_reward"], a["posterior_mean"]) for a in stats["arms"]]
        assert browser.run("return Number(document.getElementById('meta').dataset.decisions)") == stats["decisions"]
        shot = browser.screenshot(tmp_path / "dashboard.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    finally:
        browser.close()


def test_ranked_events_are_held_out_of_the_garbage_collectors_sight():
    """200,000 remembered events as tracked objects made every full collection stall the
    service for tens of milliseconds; held as plain tuples, the collector untracks them."""
    import gc

    from banditstream.serve_domains import EventMemory, Ranked

    memory = EventMemory(capacity=1000)
    for i in range(1500):
        memory.add(f"e{i}", Ranked(float(i), i % 2 == 0, ("a", "b") if i % 3 == 0 else None))
    gc.collect()

    assert not any(gc.is_tracked(held) for held in memory._events.values())  # noqa: SLF001
    assert memory.get("e1499") == Ranked(1499.0, False, None) and memory.get("e1497").slots == ("a", "b")
    assert memory.get("e499") is None and memory.oldest == 500.0


@pytest.mark.parametrize(("domain", "floor"), [
    ({}, 0.01),  # the default portfolio: its members are lin_igw, whose floor is 0.01
    ({"policy": "lin_igw"}, 0.01),
    ({"policy": "lin_ucb"}, 0.05),
    ({"policy": "lin_ucb", "params": {"eps0": 0.2}}, 0.2),
])  # fmt: skip
def test_exploration_percentage_is_the_floor_the_policy_decides_with(domain, floor):
    from banditstream.serve_api import PREVIEW, ServiceExtras, service_configuration
    from learner.domain import DomainSettings

    settings = DomainSettings.model_validate(domain)
    body = service_configuration(settings, ServiceExtras(model_export_frequency_s=60.0), PREVIEW)
    assert body["explorationPercentage"] == floor == settings.make_policy().eps0
