"""``banditstream serve``'s feature importances (2022-09-01-preview): created, polled from
Running to Succeeded, listed and deleted through the official ``azure-ai-personalizer``
client, on a log of the served domain put on the updates and decisions topics where one
context feature drives the reward and others are noise; every body checked against the API
definition; the errors over raw HTTP."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest
from azure.ai.personalizer import PersonalizerAdministrationClient
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError

from banditstream import serve_feature_importances as fi
from banditstream.serve_api import FeatureImportanceContract, iso_time_ms
from banditstream.serve_domains import Where
from banditstream.serve_feature_importances import FeatureImportanceStore
from streams.serde import AvroSerde
from tests import serve_helpers as S
from tests.learn_helpers import produce

pytestmark = pytest.mark.integration

PREVIEW = "2022-09-01-preview"
QS = S.PREVIEW_QS
ROWS = 600
#: logged decisions of the window whose DecisionEvent is not on the decisions topic
WITHOUT_DECISION = 15
ITEM = "/featureImportances/{featureImportanceId}"


@pytest.fixture(scope="module")
def served(kafka, tmp_path_factory, keys, root):
    with S.serving(kafka, S.fresh_topics("fi"), tmp_path_factory.mktemp("serve-importances"), keys, root, seed=5) as served:
        yield served


@pytest.fixture(scope="module")
def schemas() -> S.Schemas:
    return S.Schemas()


def reward_probability(arm: str, context: dict) -> float:
    """The truth: sports pays with the user's age, news against it, entertainment in the
    evening; user.device and weather.temperature change nothing."""
    age = context["numeric"]["user.age"]
    return {"sports": age, "news": 1.0 - age, "entertainment": 0.6 if context["categorical"]["timeOfDay"] == "evening" else 0.2}[arm]


@pytest.fixture(scope="module")
def window(served, kafka) -> tuple[int, int]:
    """[since, until) of decision time: 600 decisions of the served domain 6 s apart, actions
    drawn uniformly, with their DecisionEvents (the contexts, as a rank flattens them) on the
    decisions topic and their UpdateEvents on the updates topic; around them decisions outside
    the window and of another domain, which no importance may count."""
    hour = 3_600_000
    since = (int(time.time() * 1000) - 2 * hour) // 1000 * 1000
    rng = random.Random(23)
    decisions, updates = [], []

    def log(event_id: str, at: int, domain: str = S.DOMAIN, with_decision: bool = True) -> None:
        context = {"numeric": {"user.age": rng.random(), "weather.temperature": rng.gauss(15, 8)},
                   "categorical": {"user.device": rng.choice(["mobile", "desktop", "tv"]),
                                   "timeOfDay": rng.choice(["morning", "evening"])}, "vector": []}  # fmt: skip
        k = rng.randrange(3)
        arm = S.ARMS[k]
        reward = float(rng.random() < reward_probability(arm, context))
        if with_decision:
            decisions.append({
                "event_id": event_id, "tenant": "default", "workspace": "main", "domain": domain, "timestamp": at,
                "context": context, "actions": [{"id": a, "features": {"numeric": {}, "categorical": {}, "vector": []}} for a in S.ARMS],
                "chosen": k, "probabilities": [1 / 3] * 3, "policy_version": "1.0.0", "mode": "live", "deferred": False,
                "recommended": -1, "channel": "stable", "recommended_probabilities": [], "recommended_version": "",
            })  # fmt: skip
        updates.append({"event_id": event_id, "tenant": "default", "workspace": "main", "domain": domain, "arm": arm, "arm_index": k,
                        "actions": list(S.ARMS), "probabilities": [1 / 3] * 3, "probability": 1 / 3,
                        "features": [1.0] + [rng.gauss(0, 1) for _ in range(15)], "feature_hash": "", "reward": reward,
                        "signals": {}, "reward_count": 1, "join_status": "rewarded", "mode": "live", "policy_version": "1.0.0",
                        "decision_time": at, "reward_time": at + 500, "weight": 1.0})  # fmt: skip

    for i in range(ROWS):
        log(f"fi-{i}", since + 6000 * i)
    for i in range(WITHOUT_DECISION):
        log(f"lost-{i}", since + 6000 * i + 3000, with_decision=False)
    for i in range(60):
        log(f"before-{i}", since - 600_000 + i)
    for i in range(40):
        log(f"other-{i}", since + 1000 * i, domain="other")
    topics = served.settings.topics
    produce(kafka, topics.decisions, [(d["event_id"], AvroSerde("decision", framing="single_object").encode(d)) for d in decisions])
    serde = AvroSerde("update", framing="single_object")
    produce(kafka, topics.updates, [(f"default/main/{u['domain']}/{u['arm']}", serde.encode(u)) for u in updates])
    return since, since + hour


def contract(window, name="importance") -> dict:
    return {"name": name, "startTime": iso_time_ms(window[0]), "endTime": iso_time_ms(window[1])}


def finished(admin: PersonalizerAdministrationClient, feature_importance_id: str, timeout_s: float = 120) -> dict:
    """Poll the get until the job is no longer Running, as a client of the hosted service does."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = admin.get_feature_importance(feature_importance_id)
        if got["status"] != "Running":
            return got
        assert time.monotonic() < deadline, f"{feature_importance_id} still Running after {timeout_s} s"
        time.sleep(0.2)


class HeldJobs:
    """Keeps the service's job thread busy until released, so a job just created is seen Running."""

    def __init__(self, served):
        self.release = threading.Event()
        served.app.jobs.submit(self.release.wait, 60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release.set()


def test_the_official_client_creates_polls_lists_and_deletes_a_feature_importance(served, window, schemas):
    admin = PersonalizerAdministrationClient(served.url, AzureKeyCredential(S.KEY))
    with HeldJobs(served):
        assert admin.create_feature_importance("fi-first", contract(window, "first")) is None
        running = admin.get_feature_importance("fi-first")
        schemas.validate(PREVIEW, ITEM, "GET", 200, running)
        assert running["status"] == "Running" and running["name"] == "first" and "featureScores" not in running
        assert running["startTime"] == iso_time_ms(window[0]) and running["endTime"] == iso_time_ms(window[1])
        with pytest.raises(ResourceExistsError) as taken:
            admin.create_feature_importance("fi-first", contract(window))
        assert taken.value.error.code == "FeatureImportanceAlreadyExists"
        assert [(e["id"], e["status"]) for e in admin.list_feature_importances()] == [("fi-first", "Running")]

    got = finished(admin, "fi-first")
    schemas.validate(PREVIEW, ITEM, "GET", 200, got)
    assert got["status"] == "Succeeded", got.get("description")
    scores = got["featureScores"]
    named = {(s["namespace"], s["featureName"]): s["score"] for s in scores}
    assert set(named) == {("user", "age"), ("", "timeOfDay"), ("user", "device"), ("weather", "temperature")}
    assert [s["score"] for s in scores] == sorted(named.values(), reverse=True)  # the API's order: descending
    # the truth: age moves two arms' rewards by up to 1, the evening one arm's by 0.4, the rest nothing
    assert scores[0] == {"namespace": "user", "featureName": "age", "score": 1.0}
    assert named[("", "timeOfDay")] > max(named[("user", "device")], named[("weather", "temperature")])
    assert named[("user", "device")] < 0.1 and named[("weather", "temperature")] < 0.1
    assert f"on {ROWS} logged decisions" in got["description"] and f"{WITHOUT_DECISION} logged decisions without" in got["description"]

    store = served.app.loop(Where("default", "main", S.DOMAIN)).feature_importances
    assert FeatureImportanceStore(store.directory).get("fi-first") == store.get("fi-first")  # persisted, read back whole
    assert admin.create_feature_importance("fi-second", contract(window, "second")) is None
    assert finished(admin, "fi-second")["featureScores"] == scores  # the same log: the same scores
    listed = list(admin.list_feature_importances(params={"maxpagesize": 1}))  # one per page: the client follows nextLink
    assert [(e["id"], e["status"]) for e in listed] == [("fi-second", "Succeeded"), ("fi-first", "Succeeded")]
    status, _, page = S.call("GET", f"{served.url}/personalizer/featureImportances?{QS}&maxpagesize=1")
    assert status == 200 and [e["id"] for e in page["value"]] == ["fi-second"] and "skip=1" in page["nextLink"]
    schemas.validate(PREVIEW, "/featureImportances", "GET", 200, page)

    for feature_importance_id in ("fi-first", "fi-second"):
        assert admin.delete_feature_importance(feature_importance_id) is None
    with pytest.raises(ResourceNotFoundError) as gone:
        admin.get_feature_importance("fi-first")
    assert gone.value.error.code == "FeatureImportanceNotFound"
    assert list(admin.list_feature_importances()) == [] and not list(store.directory.glob("*.json"))


def test_a_range_without_decisions_fails_saying_why(served, window, schemas):
    admin = PersonalizerAdministrationClient(served.url, AzureKeyCredential(S.KEY))
    admin.create_feature_importance("fi-empty", {"name": "empty", "startTime": "2001-01-01T00:00:00Z",
                                                 "endTime": "2001-01-02T00:00:00Z"})  # fmt: skip
    got = finished(admin, "fi-empty")
    schemas.validate(PREVIEW, ITEM, "GET", 200, got)
    assert got["status"] == "Failed" and "no live decision" in got["description"] and "featureScores" not in got
    admin.delete_feature_importance("fi-empty")


def test_one_deleted_while_running_stays_deleted_and_its_id_is_free_again(served, window):
    admin = PersonalizerAdministrationClient(served.url, AzureKeyCredential(S.KEY))
    with HeldJobs(served):
        admin.create_feature_importance("fi-gone", contract(window, "old"))
        admin.delete_feature_importance("fi-gone")
        admin.create_feature_importance("fi-gone", contract(window, "new"))
    got = finished(admin, "fi-gone")  # the first job ends first: the newer record is not overwritten by it
    assert (got["name"], got["status"]) == ("new", "Succeeded")
    admin.delete_feature_importance("fi-gone")


def test_a_job_cut_short_by_a_stop_reads_back_failed(tmp_path):
    running = fi.started("cut", FeatureImportanceContract("cut", 0, 60_000), now=1.0)
    FeatureImportanceStore(tmp_path).start(running)
    again = FeatureImportanceStore(tmp_path).get("cut")
    assert again.status == "failed" and "stopped before the job finished" in again.description
    assert fi.body(again)["status"] == "Failed"


def _url(served, path: str) -> str:
    return f"{served.url}/personalizer{path}?{QS}"


def test_bad_feature_importance_requests_are_refused_naming_the_field(served, window, schemas):
    good = contract(window)
    cases = [
        (b'{"name": "f", "startTime": ', 400, "body", "BadRequest"),  # malformed JSON, as for every operation
        (["not", "an", "object"], 400, "body", "InvalidContract"),
        ({k: v for k, v in good.items() if k != "name"}, 400, "name", "InvalidContract"),
        ({**good, "startTime": good["endTime"], "endTime": good["startTime"]}, 400, "endTime", "InvalidContract"),
        ({**good, "startTime": "yesterday"}, 400, "startTime", "InvalidContract"),
        ({k: v for k, v in good.items() if k != "endTime"}, 400, "endTime", "InvalidContract"),
    ]
    for body, status, field, code in cases:
        raw = body if isinstance(body, bytes) else None
        got, headers, payload = S.call("PUT", _url(served, f"/featureImportances/bad-{uuid.uuid4().hex[:6]}"), None if raw else body,
                                       raw=raw)  # fmt: skip
        assert (got, payload["error"]["code"]) == (status, code) and payload["error"]["message"].startswith(field), payload
        assert headers.get("x-ms-error-code") == code
        schemas.validate(PREVIEW, ITEM, "PUT", got, payload)

    assert S.call("PUT", _url(served, "/featureImportances/fi-twice"), good)[0] == 200
    got, headers, payload = S.call("PUT", _url(served, "/featureImportances/fi-twice"), good)
    assert (got, payload["error"]["code"], payload["error"]["target"]) == (409, "FeatureImportanceAlreadyExists", "featureImportanceId")
    assert payload["error"]["message"].startswith("featureImportanceId")
    schemas.validate(PREVIEW, ITEM, "PUT", got, payload)
    assert finished(PersonalizerAdministrationClient(served.url, AzureKeyCredential(S.KEY)), "fi-twice")["status"] == "Succeeded"
    assert S.call("DELETE", _url(served, "/featureImportances/fi-twice"))[0] == 204

    for method in ("GET", "DELETE"):
        got, headers, payload = S.call(method, _url(served, "/featureImportances/no-such-importance"))
        assert (got, payload["error"]["code"]) == (404, "FeatureImportanceNotFound"), payload
        assert payload["error"]["message"].startswith("featureImportanceId") and headers.get("x-ms-error-code") == "FeatureImportanceNotFound"
        schemas.validate(PREVIEW, ITEM, method, got, payload)
    got, _, payload = S.call("GET", f"{served.url}/personalizer/featureImportances?{QS}&top=-1")
    assert got == 400 and payload["error"]["message"].startswith("top")
    schemas.validate(PREVIEW, "/featureImportances", "GET", got, payload)
    assert S.call("POST", _url(served, "/featureImportances"), good)[0] == 405
    assert S.call("GET", f"{served.url}/personalizer/featureImportances")[0] == 400  # the preview's paths need the api-version
    with pytest.raises(HttpResponseError) as unknown:
        PersonalizerAdministrationClient(served.url, AzureKeyCredential(S.KEY)).delete_feature_importance("no-such-importance")
    assert unknown.value.status_code == 404
    got, _, spec = S.call("GET", f"{served.url}/openapi.json?{QS}", key=None)
    assert {"/featureImportances", ITEM} <= set(spec["paths"])
