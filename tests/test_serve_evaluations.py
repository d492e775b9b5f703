"""``banditstream serve``'s offline evaluations: created, read, listed and deleted through both
API versions, on a log of the served domain put on the updates topic (one arm pays best);
every body checked against the API definition, every estimate against
:mod:`banditstream.evaluate`'s own on the same rows.

The v1.0 Python client (azure-cognitiveservices-personalizer 0.1.1) has no evaluation
operations: v1.0 is called through that client's own pipeline (its msrest ServiceClient and
CognitiveServicesCredentials), with the bodies of the API definition.
"""

from __future__ import annotations

import random
import time
import uuid
from datetime import datetime, timezone

import numpy as np
import pytest
from azure.ai.personalizer import PersonalizerAdministrationClient
from azure.cognitiveservices.personalizer import PersonalizerClient as V1Client
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from msrest.authentication import CognitiveServicesCredentials

from banditstream import evaluate as ev
from banditstream.serve_api import iso_time_ms
from banditstream.serve_domains import Where
from banditstream.serve_evaluations import EvaluationStore
from streams.evaluation_log import read_updates
from streams.serde import AvroSerde
from tests import serve_helpers as S
from tests.learn_helpers import produce

pytestmark = pytest.mark.integration

V1, PREVIEW = "v1.0", "2022-09-01-preview"
QS = S.PREVIEW_QS
LOGGING = [0.5, 0.3, 0.2]  # the logging policy's distribution over S.ARMS (sports first: the baseline)
TRUTH = {"sports": 0.4, "news": 0.7, "entertainment": 0.2}  # P(reward 1): news pays best
ROWS = 600


@pytest.fixture(scope="module")
def served(kafka, tmp_path_factory, keys, root):
    with S.serving(kafka, S.fresh_topics("v"), tmp_path_factory.mktemp("serve-evaluations"), keys, root, seed=3) as served:
        yield served


@pytest.fixture(scope="module")
def schemas() -> S.Schemas:
    return S.Schemas()


@pytest.fixture(scope="module")
def window(served, kafka) -> tuple[int, int]:
    """[since, until) of decision time: 600 decisions of the served domain 6 s apart, drawn
    from LOGGING with rewards from TRUTH; around them decisions outside the window and of
    another domain, which no evaluation may count."""
    hour = 3_600_000
    since = (int(time.time() * 1000) - 2 * hour) // 1000 * 1000
    rng = random.Random(17)
    rows = []

    def row(event_id: str, decision_time: int, domain: str = S.DOMAIN) -> dict:
        k = rng.choices(range(3), LOGGING)[0]
        arm = S.ARMS[k]
        return {"event_id": event_id, "tenant": "default", "workspace": "main", "domain": domain, "arm": arm, "arm_index": k,
                "actions": list(S.ARMS), "probabilities": list(LOGGING), "probability": LOGGING[k],
                "features": [1.0] + [rng.gauss(0, 1) for _ in range(15)], "feature_hash": "",
                "reward": float(rng.random() < TRUTH[arm]), "signals": {}, "reward_count": 1, "join_status": "rewarded",
                "mode": "live", "policy_version": "1.0.0", "decision_time": decision_time,
                "reward_time": decision_time + 500, "weight": 1.0}  # fmt: skip

    rows += [row(f"eval-{i}", since + 6000 * i) for i in range(ROWS)]
    rows += [row(f"before-{i}", since - 600_000 + i) for i in range(60)]
    rows += [row(f"after-{i}", since + hour + i) for i in range(20)]
    rows += [row(f"other-{i}", since + 1000 * i, domain="other") for i in range(40)]
    serde = AvroSerde("update", framing="single_object")
    produce(kafka, served.settings.topics.updates, [(f"default/main/{u['domain']}/{u['arm']}", serde.encode(u)) for u in rows])
    return since, since + hour


def reference(served, window, candidates: str):
    """banditstream evaluate's own run on the window: the log and SNIPS per candidate."""
    s = served.settings
    topic = s.topics.updates

    def read_topic(name):
        return read_updates(s.kafka, name or topic, s.worker_config().serde("update", topic=topic), timeout_s=60)[0]

    logged = ev.load_log("topic", domain=S.DOMAIN, domain_settings=S.domain_settings(), read_topic=read_topic,
                         since_ms=window[0], until_ms=window[1])  # fmt: skip
    chosen = ev.parse_candidates(candidates, snapshots=None)
    run = ev.evaluate_candidates(logged, chosen, estimators=["snips"])
    return logged, chosen, {r.name: r.estimates["snips"] for r in run.results}


def row_sums(logged, candidate) -> dict:
    """v1.0's summary figures from the candidate's per-row importance weights."""
    w = candidate.action_dist(logged)[np.arange(len(logged)), logged.action] / logged.pscore
    c = w * logged.reward
    return {"ipsEstimatorNumerator": float(c.sum()), "ipsEstimatorDenominator": len(logged),
            "snipsEstimatorDenominator": float(w.sum()), "nonZeroProbability": int(np.count_nonzero(w)),
            "sumOfSquares": float((c * c).sum())}  # fmt: skip


def contract(window, policies, name="evaluation") -> dict:
    return {"name": name, "startTime": iso_time_ms(window[0]), "endTime": iso_time_ms(window[1]), "policies": policies}


def v1_call(client: V1Client, method: str, path: str, body=None):
    """One v1.0 call through the v1.0 client's own pipeline (its auth, its transport)."""
    url = client._client.format_url("{Endpoint}/personalizer/v1.0" + path, Endpoint=client.config.endpoint)
    headers = {"Accept": "application/json", **({"Content-Type": "application/json; charset=utf-8"} if body is not None else {})}
    request = getattr(client._client, method.lower())(url, {}, headers, body)
    response = client._client.send(request, stream=False)
    return response.status_code, response.headers, (response.json() if response.content else None)


def test_the_v1_client_creates_gets_lists_and_deletes_an_evaluation(served, window, schemas):
    client = V1Client(served.url, CognitiveServicesCredentials(S.KEY))
    custom = {"name": "lin_ucb", "arguments": "--alpha 0.5 --eps0 0.05"}
    status, headers, created = v1_call(client, "POST", "/evaluations", contract(window, [custom], "first"))
    assert status == 201, created
    schemas.validate(V1, "/evaluations", "POST", 201, created)
    assert headers["Location"] == f"{served.url}/personalizer/v1.0/evaluations/{created['id']}"
    assert created["status"] == "completed" and created["name"] == "first"
    assert created["startTime"] == iso_time_ms(window[0]) and created["endTime"] == iso_time_ms(window[1])
    results = {r["name"]: r for r in created["policyResults"]}
    assert list(results) == ["online", "baseline", "random", "lin_ucb"] and results["lin_ucb"]["arguments"] == custom["arguments"]

    logged, candidates, snips = reference(served, window, "logging,always:sports,uniform,lin_ucb(alpha=0.5,eps0=0.05)")
    assert len(logged) == ROWS  # the window's decisions of the domain, no other
    for (name, result), candidate in zip(results.items(), candidates):
        total = result["totalSummary"]
        estimate = snips[candidate.name]
        assert {k: total[k] for k in row_sums(logged, candidate)} == row_sums(logged, candidate), name
        assert total["confidenceInterval"] == (estimate.upper - estimate.lower) / 2
        assert total["ipsEstimatorNumerator"] / total["snipsEstimatorDenominator"] == pytest.approx(estimate.estimate, rel=1e-12)
        assert total["timeStamp"] == iso_time_ms(window[1]) and total["aggregateTimeWindow"] == "PT1H"
        buckets = result["summary"]  # 5-minute buckets: together the whole window
        assert [b["aggregateTimeWindow"] for b in buckets] == ["PT5M"] * len(buckets) and len(buckets) in (12, 13)
        assert sum(b["ipsEstimatorDenominator"] for b in buckets) == ROWS
        assert sum(b["ipsEstimatorNumerator"] for b in buckets) == pytest.approx(total["ipsEstimatorNumerator"], rel=1e-12)
    # the truth: news pays 0.7, the baseline (sports) 0.4, the logging mix 0.45, uniform 0.433
    value = {name: snips[c.name] for name, c in zip(results, candidates)}
    assert value["lin_ucb"].lower > value["online"].upper > value["baseline"].estimate
    assert value["baseline"].lower < 0.4 < value["baseline"].upper and value["random"].lower < 0.4333 < value["random"].upper

    status, _, got = v1_call(client, "GET", f"/evaluations/{created['id']}")
    assert status == 200 and got == created
    schemas.validate(V1, "/evaluations/{evaluationId}", "GET", 200, got)
    saved = served.app.loop(Where("default", "main", S.DOMAIN)).evaluations.directory
    assert EvaluationStore(saved).get(created["id"]).to_json() == served.app.loop(
        Where("default", "main", S.DOMAIN)).evaluations.get(created["id"]).to_json()  # persisted, read back whole
    status, _, listed = v1_call(client, "GET", "/evaluations")
    assert status == 200 and created["id"] in [e["id"] for e in listed]
    schemas.validate(V1, "/evaluations", "GET", 200, listed)

    status, _, deleted = v1_call(client, "DELETE", f"/evaluations/{created['id']}")
    assert (status, deleted) == (204, None)
    status, _, missing = v1_call(client, "GET", f"/evaluations/{created['id']}")
    assert status == 404 and missing["error"]["code"] == "ResourceNotFound" and missing["error"]["target"] == "evaluationId"
    schemas.validate(V1, "/evaluations/{evaluationId}", "GET", 404, missing)
    assert created["id"] not in [e["id"] for e in v1_call(client, "GET", "/evaluations")[2]]
    assert not list(saved.glob("*.json"))


def test_the_preview_admin_client_creates_gets_lists_applies_and_deletes(served, window, schemas):
    admin = PersonalizerAdministrationClient(served.url, AzureKeyCredential(S.KEY))
    policies = [{"name": "lin_ucb", "arguments": "--alpha 0.5 --eps0 0.05"}, {"name": "lin_ucb", "arguments": "--alpha 5 --eps0 0.5"}]
    assert admin.create_evaluation("pv-first", contract(window, policies, "preview")) is None
    with pytest.raises(ResourceExistsError) as taken:
        admin.create_evaluation("pv-first", contract(window, policies))
    assert taken.value.error.code == "EvaluationAlreadyExists"

    start, end = (datetime.fromtimestamp(t / 1000, timezone.utc) for t in window)
    got = admin.get_evaluation("pv-first", start_time=start, end_time=end)
    schemas.validate(PREVIEW, "/evaluations/{evaluationId}", "GET", 200, got)
    assert got["status"] == "Succeeded" and got["evaluationType"] == "Manual" and got["name"] == "preview"
    values = got["content"]["value"]
    assert [(v["name"], v["policySource"]) for v in values] == [
        ("online", "Online"), ("baseline", "Baseline"), ("random", "Random"), ("lin_ucb", "Custom"), ("lin_ucb", "Custom")]
    _, candidates, snips = reference(served, window, "logging,always:sports,uniform,lin_ucb(alpha=0.5,eps0=0.05),"
                                                     "lin_ucb(alpha=5,eps0=0.5)")
    for value, candidate in zip(values, candidates):
        estimate = snips[candidate.name]
        assert value["summary"] == {"expectedReward": estimate.estimate, "confidenceInterval": [estimate.lower, estimate.upper]}
        series = value["timeseries"]["data"]  # expanding 5-minute buckets: the last one covers the whole window
        assert len(series) in (12, 13) and series[-1]["expectedReward"] == pytest.approx(estimate.estimate, rel=1e-9)
        assert series[-1]["confidenceInterval"] == pytest.approx([estimate.lower, estimate.upper], rel=1e-9)
    hourly = admin.get_evaluation("pv-first", start_time=start, end_time=end, interval_in_minutes=60, window="Rolling")
    schemas.validate(PREVIEW, "/evaluations/{evaluationId}", "GET", 200, hourly)
    hours = {t // 3_600_000 for t in range(window[0], window[1], 6000)}
    assert [len(v["timeseries"]["data"]) for v in hourly["content"]["value"]] == [len(hours)] * 5

    assert admin.create_evaluation("pv-second", contract(window, [])) is None
    listed = list(admin.list_evaluations(params={"maxpagesize": 1}))  # one per page: the client follows nextLink
    assert [e["id"] for e in listed][:2] == ["pv-second", "pv-first"] and len({e["id"] for e in listed}) == len(listed)
    got_status, _, page = S.call("GET", f"{served.url}/personalizer/evaluations?{QS}&maxpagesize=1")
    assert got_status == 200 and len(page["value"]) == 1 and "skip=1" in page["nextLink"]
    schemas.validate(PREVIEW, "/evaluations", "GET", 200, page)

    best = max(values[3:], key=lambda v: v["summary"]["expectedReward"])
    assert best["arguments"] == "--alpha 0.5 --eps0 0.05"
    assert admin.apply_from_evaluation({"evaluationId": "pv-first", "policyName": "lin_ucb"}) is None
    policy = admin.get_policy()
    assert policy["name"] == "lin_ucb" and "--alpha 0.5" in policy["arguments"] and "--eps0 0.05" in policy["arguments"]
    admin.apply_from_evaluation({"evaluationId": "pv-first", "policyName": "online"})  # keeps the policy
    assert admin.get_policy() == policy
    admin.reset_policy()

    for evaluation_id in ("pv-first", "pv-second"):
        assert admin.delete_evaluation(evaluation_id) is None
    with pytest.raises(ResourceNotFoundError) as gone:
        admin.get_evaluation("pv-first", start_time=start, end_time=end)
    assert gone.value.error.code == "EvaluationNotFound"
    with pytest.raises(HttpResponseError) as gone:
        admin.delete_evaluation("pv-first")
    assert gone.value.status_code == 404


def _url(served, version: str, path: str, query: str = "") -> str:
    if version == V1:
        return f"{served.url}{S.V1}{path}" + (f"?{query}" if query else "")
    return f"{served.url}/personalizer{path}?{QS}" + (f"&{query}" if query else "")


@pytest.mark.parametrize("version", [V1, PREVIEW])
def test_bad_evaluation_requests_are_refused_naming_the_field(served, window, schemas, version):
    good = contract(window, [{"name": "lin_ucb", "arguments": "--alpha 0.5"}])
    reversed_ = {**good, "startTime": good["endTime"], "endTime": good["startTime"]}
    long_ago = {**good, "startTime": "2001-01-01T00:00:00Z", "endTime": "2001-01-02T00:00:00Z"}
    cases = [
        (b'{"name": "e", "startTime": ', 400, "body", "BadRequest"),  # malformed JSON, as for every operation
        (reversed_, 400, "endTime", "InvalidEvaluationContract"),
        ({**good, "startTime": "yesterday"}, 400, "startTime", "InvalidEvaluationContract"),
        ({**good, "policies": [{"name": "vw", "arguments": "--cb_explore_adf"}]}, 400, "policies[0].name", "InvalidEvaluationContract"),
        ({**good, "policies": [good["policies"][0], {"name": "shared_lin_ucb", "arguments": ""}]}, 400, "policies[1].name",
         "InvalidEvaluationContract"),
        ({**good, "policies": [{"name": "lin_ucb", "arguments": "--alpha -1"}]}, 400, "policies[0].arguments", "InvalidEvaluationContract"),
        ({**good, "policies": good["policies"] * 2}, 400, "policies[1]", "DuplicateCustomPolicyNames"),
        ({k: v for k, v in good.items() if k != "policies"}, 400, "policies", "InvalidEvaluationContract"),
        (long_ago, 400, "startTime", "NoLogsExistInDateRange"),
    ]
    spec_path, method = ("/evaluations", "POST") if version == V1 else ("/evaluations/{evaluationId}", "PUT")
    for body, status, field, code in cases:
        url = _url(served, version, "/evaluations" if version == V1 else f"/evaluations/bad-{uuid.uuid4().hex[:6]}")
        raw = body if isinstance(body, bytes) else None
        got, headers, payload = S.call(method, url, None if raw else body, raw=raw)
        assert got == status and payload["error"]["message"].startswith(field), (field, payload)
        assert payload["error"]["code"] == (code if version == PREVIEW else "BadRequest")
        schemas.validate(version, spec_path, method, got, payload)
    for method in ("GET", "DELETE"):
        got, _, payload = S.call(method, _url(served, version, "/evaluations/no-such-evaluation"))
        assert got == 404 and payload["error"]["message"].startswith("evaluationId"), payload
        assert payload["error"]["code"] == ("EvaluationNotFound" if version == PREVIEW else "ResourceNotFound")
        schemas.validate(version, "/evaluations/{evaluationId}", method, got, payload)
    assert S.call("PUT" if version == V1 else "POST", _url(served, version, "/evaluations/x" if version == V1 else "/evaluations"),
                  good)[0] == 405  # each version creates one way only
    got, _, spec = S.call("GET", f"{served.url}/openapi.json" + ("" if version == V1 else f"?{QS}"), key=None)
    assert {"/evaluations", "/evaluations/{evaluationId}"} <= set(spec["paths"])


def test_preview_query_and_apply_errors(served, window, schemas):
    assert S.call("PUT", _url(served, PREVIEW, "/evaluations/q-errors"), contract(window, []))[0] == 200
    for query, field in (("intervalInMinutes=7", "intervalInMinutes"), ("window=Sliding", "window"), ("startTime=soon", "startTime")):
        got, _, payload = S.call("GET", _url(served, PREVIEW, "/evaluations/q-errors", query))
        assert got == 400 and payload["error"]["message"].startswith(field), payload
        schemas.validate(PREVIEW, "/evaluations/{evaluationId}", "GET", got, payload)
    apply = _url(served, PREVIEW, "/configurations/applyFromEvaluation")
    for body, status, field, code in (
        ({"evaluationId": "q-errors", "policyName": "lin_ts"}, 404, "policyName", "LearningSettingsNotFound"),
        ({"evaluationId": "q-errors", "policyName": "baseline"}, 400, "policyName", "InvalidContract"),
        ({"evaluationId": "nope", "policyName": "online"}, 404, "evaluationId", "EvaluationNotFound"),
        ({"evaluationId": "q-errors"}, 400, "policyName", "InvalidContract"),
    ):
        got, _, payload = S.call("POST", apply, body)
        assert (got, payload["error"]["code"]) == (status, code) and payload["error"]["message"].startswith(field), payload
        schemas.validate(PREVIEW, "/configurations/applyFromEvaluation", "POST", got, payload)
    assert S.call("DELETE", _url(served, PREVIEW, "/evaluations/q-errors"))[0] == 204
