"""``banditstream serve`` refuses every bad request with the API's error body naming the field,
and keeps serving: raw HTTP, one request per error, then a good rank."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests import serve_helpers as S

pytestmark = pytest.mark.integration

QS = S.PREVIEW_QS
ACTIONS = [{"id": a, "features": [{"kind": a}]} for a in S.ARMS]
GOOD_RANK = {"contextFeatures": [{"user": {"age": 0.3}}], "actions": ACTIONS}


@pytest.fixture(scope="module")
def served(kafka, tmp_path_factory, keys, root):
    with S.serving(kafka, S.fresh_topics("e"), tmp_path_factory.mktemp("serve-errors"), keys, root, seed=1) as served:
        time.sleep(0.6)  # longer than the domain's reward wait time: ids it never ranked are surely unknown
        yield served


@pytest.fixture(scope="module")
def schemas() -> S.Schemas:
    return S.Schemas()


def rank_with(**changes) -> dict:
    return {**GOOD_RANK, **changes}


def action(i: int, **changes) -> list[dict]:
    return [{**a, **changes} if j == i else a for j, a in enumerate(ACTIONS)]


# (name, method, path (v1.0 form; preview adds ?api-version), body, status, field named in the message)
CASES = [
    ("malformed JSON", "POST", "/rank", b'{"actions": [', 400, "body"),
    ("NaN literal", "POST", "/rank", b'{"actions": [{"id": "a", "features": [{"x": NaN}]}]}', 400, "body"),
    ("empty body", "POST", "/rank", b"", 400, "body"),
    ("body not an object", "POST", "/rank", [1, 2], 400, "body"),
    ("missing actions", "POST", "/rank", {"contextFeatures": []}, 400, "actions"),
    ("empty action list", "POST", "/rank", rank_with(actions=[]), 400, "actions"),
    ("duplicate action ids", "POST", "/rank", rank_with(actions=ACTIONS + [{"id": "news", "features": []}]), 400, "actions[3].id"),
    ("actions not an array", "POST", "/rank", rank_with(actions={"id": "a"}), 400, "actions"),
    ("action not an object", "POST", "/rank", rank_with(actions=["a", "b"]), 400, "actions[0]"),
    ("action id a number", "POST", "/rank", rank_with(actions=action(1, id=7)), 400, "actions[1].id"),
    ("action id empty", "POST", "/rank", rank_with(actions=action(2, id="")), 400, "actions[2].id"),
    ("action id too long", "POST", "/rank", rank_with(actions=action(0, id="x" * 257)), 400, "actions[0].id"),
    ("action features a string", "POST", "/rank", rank_with(actions=action(1, features="big")), 400, "actions[1].features"),
    ("action feature item a number", "POST", "/rank", rank_with(actions=action(1, features=[3])), 400, "actions[1].features[0]"),
    ("contextFeatures an object", "POST", "/rank", rank_with(contextFeatures={"a": 1}), 400, "contextFeatures"),
    ("contextFeatures item a string", "POST", "/rank", rank_with(contextFeatures=["x"]), 400, "contextFeatures[0]"),
    ("excludedActions a string", "POST", "/rank", rank_with(excludedActions="news"), 400, "excludedActions"),
    ("excludedActions item a number", "POST", "/rank", rank_with(excludedActions=[1]), 400, "excludedActions[0]"),
    ("every action excluded", "POST", "/rank", rank_with(excludedActions=S.ARMS), 400, "excludedActions"),
    ("eventId a number", "POST", "/rank", rank_with(eventId=12), 400, "eventId"),
    ("eventId too long", "POST", "/rank", rank_with(eventId="e" * 257), 400, "eventId"),
    ("deferActivation a string", "POST", "/rank", rank_with(deferActivation="yes"), 400, "deferActivation"),
    ("reward value a string", "POST", "/events/{known}/reward", {"value": "high"}, 400, "value"),
    ("reward value missing", "POST", "/events/{known}/reward", {"reward": 1}, 400, "value"),
    ("reward value out of range", "POST", "/events/{known}/reward", {"value": 2.5}, 400, "value"),
    ("reward value a boolean", "POST", "/events/{known}/reward", {"value": True}, 400, "value"),
    ("reward for an unknown event", "POST", "/events/never-ranked-here/reward", {"value": 1.0}, 404, "eventId"),
    ("activation of an unknown event", "POST", "/events/never-ranked-here/activate", None, 404, "eventId"),
    ("event id in the path too long", "POST", "/events/" + "e" * 257 + "/reward", {"value": 1.0}, 400, "eventId"),
    ("rewardWaitTime not a duration", "PUT", "/configurations/service", {"rewardWaitTime": "ten minutes"}, 400, "rewardWaitTime"),
    ("rewardWaitTime too long", "PUT", "/configurations/service", {"rewardWaitTime": "P3D"}, 400, "rewardWaitTime"),
    ("defaultReward a string", "PUT", "/configurations/service", {"defaultReward": "0"}, 400, "defaultReward"),
    ("defaultReward out of range", "PUT", "/configurations/service", {"defaultReward": 4}, 400, "defaultReward"),
    ("explorationPercentage above 1", "PUT", "/configurations/service", {"explorationPercentage": 2}, 400, "explorationPercentage"),
    ("rewardAggregation unknown", "PUT", "/configurations/service", {"rewardAggregation": "median"}, 400, "rewardAggregation"),
    ("logRetentionDays a fraction", "PUT", "/configurations/service", {"logRetentionDays": 1.5}, 400, "logRetentionDays"),
    ("logRetentionDays too short", "PUT", "/configurations/service", {"logRetentionDays": 0}, 400, "logRetentionDays"),
    ("modelExportFrequency a number", "PUT", "/configurations/service", {"modelExportFrequency": 5}, 400, "modelExportFrequency"),
    ("policy name unknown", "PUT", "/configurations/policy", {"name": "vw", "arguments": "--cb_explore_adf"}, 400, "name"),
    ("policy arguments a number", "PUT", "/configurations/policy", {"name": "lin_ucb", "arguments": 3}, 400, "arguments"),
    ("policy arguments not flags", "PUT", "/configurations/policy", {"name": "lin_ucb", "arguments": "alpha=1"}, 400, "arguments"),
    ("policy parameter refused", "PUT", "/configurations/policy", {"name": "lin_ucb", "arguments": "--alpha -1"}, 400, "arguments"),
    ("unknown path", "GET", "/nothing/here", None, 404, "path"),
    ("wrong method", "GET", "/rank", None, 405, "method"),
]


def _url(served, version: str, path: str, known: str) -> str:
    path = path.replace("{known}", known)
    if version == "v1.0":
        return f"{served.url}{S.V1}{path}"
    return f"{served.url}/personalizer{path}?{QS}"


def _assert_error(status: int, headers: dict, payload, expected_status: int, field: str, version: str) -> None:
    assert status == expected_status, payload
    assert set(payload) == {"error"} and {"code", "message"} <= set(payload["error"]), payload
    assert isinstance(payload["error"]["code"], str) and payload["error"]["code"]
    assert payload["error"]["message"].startswith(field), payload["error"]["message"]
    if version != "v1.0":
        assert headers.get("x-ms-error-code") == payload["error"]["code"]


@pytest.mark.parametrize("version", ["v1.0", "2022-09-01-preview"])
@pytest.mark.parametrize(("name", "method", "path", "body", "status", "field"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_request_is_refused_with_an_error_naming_the_field(served, schemas, version, name, method, path, body, status, field):
    _, _, ranked = S.call("POST", _url(served, version, "/rank", ""), GOOD_RANK)
    raw = body if isinstance(body, bytes) else None
    got, headers, payload = S.call(method, _url(served, version, path, ranked["eventId"]), None if raw is not None else body, raw=raw)
    _assert_error(got, headers, payload, status, field, version)
    spec_path = path.replace("{known}", "{eventId}").replace("never-ranked-here", "{eventId}")
    if spec_path in schemas.specs[version]["paths"] and method.lower() in schemas.specs[version]["paths"][spec_path]:
        schemas.validate(version, spec_path, method, got, payload)
    got, _, again = S.call("POST", _url(served, version, "/rank", ""), GOOD_RANK)
    assert got == 201 and again["rewardActionId"] in S.ARMS  # still serving


@pytest.mark.parametrize("version", ["v1.0", "2022-09-01-preview"])
@pytest.mark.parametrize("key", [None, "wrong-key", S.KEY + "x", ""], ids=["missing", "wrong", "longer", "empty"])
def test_a_missing_or_wrong_key_is_refused_with_401(served, version, key):
    got, headers, payload = S.call("POST", _url(served, version, "/rank", ""), GOOD_RANK, key=key)
    _assert_error(got, headers, payload, 401, "Ocp-Apim-Subscription-Key", version)
    assert "Ocp-Apim-Subscription-Key" in headers.get("www-authenticate", "")
    got, _, _ = S.call("POST", _url(served, version, "/rank", ""), GOOD_RANK)
    assert got == 201


def test_oversize_bodies_are_refused_with_413_with_or_without_a_length(served, schemas):
    big = {"actions": ACTIONS, "contextFeatures": [{"blob": "x" * (70 * 1024)}]}
    got, headers, payload = S.call("POST", f"{served.url}{S.V1}/rank", big)
    _assert_error(got, headers, payload, 413, "body", "v1.0")
    schemas.validate("v1.0", "/rank", "POST", got, payload)

    # chunked: no Content-Length, the limit is counted while reading
    body = json.dumps(big).encode()
    head = (f"POST /personalizer/rank?{QS} HTTP/1.1\r\nHost: x\r\nOcp-Apim-Subscription-Key: {S.KEY}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    chunks = b"".join(f"{len(body[i:i + 8192]):x}\r\n".encode() + body[i:i + 8192] + b"\r\n" for i in range(0, len(body), 8192))
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(head + chunks + b"0\r\n\r\n")
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    status_line, _, rest = response.partition(b"\r\n")
    assert b" 413 " in status_line
    payload = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert payload["error"]["code"] == "PayloadSizeExceeded" and payload["error"]["message"].startswith("body")
    assert S.call("POST", f"{served.url}{S.V1}/rank", GOOD_RANK)[0] == 201


def test_preview_paths_need_the_api_version_and_multislot_errors_name_the_slot(served):
    got, headers, payload = S.call("POST", f"{served.url}/personalizer/rank", GOOD_RANK)
    _assert_error(got, headers, payload, 400, "api-version", "2022-09-01-preview")
    got, headers, payload = S.call("POST", f"{served.url}/personalizer/rank?api-version=2019-01-01", GOOD_RANK)
    _assert_error(got, headers, payload, 400, "api-version", "2022-09-01-preview")

    multi = f"{served.url}/personalizer/multislot/rank?{QS}"
    slots = [{"id": "a", "baselineAction": "news"}, {"id": "b", "baselineAction": "sports"}]
    for body, field in [
        ({"actions": ACTIONS}, "slots"),
        ({"actions": ACTIONS, "slots": []}, "slots"),
        ({"actions": ACTIONS, "slots": [{"id": "a"}]}, "slots[0].baselineAction"),
        ({"actions": ACTIONS, "slots": [{"id": "a", "baselineAction": "weather"}]}, "slots[0].baselineAction"),
        ({"actions": ACTIONS, "slots": [slots[0], {"id": "a", "baselineAction": "sports"}]}, "slots[1].id"),
        ({"actions": ACTIONS, "slots": [slots[0], {"id": "b", "baselineAction": "news"}]}, "slots[1].baselineAction"),
        ({"actions": ACTIONS, "slots": [{"id": "a", "baselineAction": "news", "excludedActions": ["news"]}]}, "slots[0].excludedActions"),
        ({"actions": ACTIONS, "slots": [{**slots[0], "features": "x"}]}, "slots[0].features"),
    ]:
        got, headers, payload = S.call("POST", multi, body)
        _assert_error(got, headers, payload, 400, field, "2022-09-01-preview")
    got, _, ranked = S.call("POST", multi, {"actions": ACTIONS, "slots": slots})
    assert got == 201
    reward = f"{served.url}/personalizer/multislot/events/{ranked['eventId']}/reward?{QS}"
    for body, field in [({"reward": [{"slotId": "c", "value": 1}]}, "reward[0].slotId"),
                        ({"reward": [{"slotId": "a", "value": "1"}]}, "reward[0].value"),
                        ({"reward": {"slotId": "a"}}, "reward")]:  # fmt: skip
        got, headers, payload = S.call("POST", reward, body)
        _assert_error(got, headers, payload, 400, field, "2022-09-01-preview")
    got, headers, payload = S.call("POST", f"{served.url}/personalizer/multislot/events/nope/activate?{QS}")
    _assert_error(got, headers, payload, 404, "eventId", "2022-09-01-preview")
    # a multi-slot event is not rewarded through the single-slot path
    got, headers, payload = S.call("POST", f"{served.url}/personalizer/events/{ranked['eventId']}/reward?{QS}", {"value": 1})
    _assert_error(got, headers, payload, 400, "eventId", "2022-09-01-preview")


def test_a_key_picks_its_tenant_and_domain_and_no_other(served):
    got, _, ranked = S.call("POST", f"{served.url}{S.V1}/rank", GOOD_RANK, key=S.OTHER_KEY)
    assert got == 201 and ranked["rewardActionId"] == "sports"  # acme/main/other has no snapshot: the baseline
    got, headers, payload = S.call("POST", f"{served.url}{S.V1}/rank?domain={S.DOMAIN}", GOOD_RANK, key=S.OTHER_KEY)
    _assert_error(got, headers, payload, 403, "domain", "v1.0")


def test_health_readiness_metrics_and_openapi(served):
    assert S.call("GET", f"{served.url}/healthz", key=None)[:1] == (200,)
    got, _, ready = S.call("GET", f"{served.url}/readyz", key=None)
    assert got == 200 and ready["status"] == "ready" and ready["domains"][f"default/main/{S.DOMAIN}"] != "baseline"
    got, _, text = S.call("GET", f"{served.url}/metrics", key=None)
    text = text.decode()
    assert 'banditstream_serve_requests_total{method="POST",route="/personalizer/v1.0/rank",status="201"}' in text
    assert "banditstream_sdk_decisions_total" in text and "banditstream_serve_request_seconds_bucket" in text
    assert text.count("# TYPE banditstream_sdk_decisions_total counter") <= 1  # merged across the Deciders
    got, _, spec = S.call("GET", f"{served.url}/openapi.json", key=None)
    assert got == 200 and spec["basePath"] == "/personalizer/v1.0" and "/rank" in spec["paths"]
    got, _, spec = S.call("GET", f"{served.url}/openapi.json?{QS}", key=None)
    assert spec["basePath"] == "/personalizer" and "/multislot/rank" in spec["paths"]
