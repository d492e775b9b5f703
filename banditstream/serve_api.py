"""The Personalizer API's bodies, read and written: validation at the boundary, and the mapping
onto banditstream's decisions and domain settings (used by :mod:`banditstream.serve`).

Everything here is pure: a request body (already parsed JSON) goes in, a typed request or an
:class:`ApiError` naming the offending field comes out.

**Features.** Personalizer sends ``contextFeatures`` (a list of JSON objects) and each action's
``features`` (the same). They are flattened into banditstream's feature record: nested objects
give dotted names, list items their index (``{"user": {"tags": ["a", "b"]}}`` gives
``user.tags.0`` and ``user.tags.1``); numbers become numeric features, strings and booleans
categorical ones (``"true"``/``"false"``), nulls are left out::

    >>> flatten_features([{"user": {"age": 31, "mobile": True}}, {"timeOfDay": "morning"}], "contextFeatures")
    {'numeric': {'user.age': 31.0}, 'categorical': {'user.mobile': 'true', 'timeOfDay': 'morning'}, 'vector': []}

**Service configuration** maps onto the domain's :class:`~learner.domain.DomainSettings`:

=====================  =============================================
Personalizer           banditstream
=====================  =============================================
rewardWaitTime         ``reward.window_s`` (ISO 8601 duration)
defaultReward          ``reward.default_reward``
rewardAggregation      ``reward.aggregate`` (earliest: first, average: mean; or a banditstream name)
explorationPercentage  ``params.eps0`` (the policy's exploration floor)
learningMode           ``mode`` (Online: live, Apprentice: shadow, LoggingOnly: off)
modelExportFrequency   how often the service looks for a newer snapshot (applied at its next start)
logRetentionDays       kept and reported (the topics' retention governs the logs)
=====================  =============================================

**Policy configuration** (``name``, ``arguments``) is the domain's policy and its
hyper-parameters, the arguments written as flags: ``{"name": "lin_ucb", "arguments":
"--alpha 0.5 --eps0 0.05"}``. An evaluation's ``policies`` are read the same way
(:func:`parse_evaluation`; the evaluation itself: :mod:`banditstream.serve_evaluations`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from learner.domain import DomainSettings
from streams._join_state import ACTIVATION_REWARD_ID as _JOIN_ACTIVATION_ID

V1 = "v1.0"
PREVIEW = "2022-09-01-preview"
API_VERSIONS = (V1, PREVIEW)
#: the reward id an activation is sent with (a RewardEvent without signals or value)
ACTIVATION_REWARD_ID = _JOIN_ACTIVATION_ID
#: joins a multi-slot event id and a slot id into the slot decision's event id
SLOT_SEPARATOR = "/"
MAX_ID_CHARS = 256
_MAX_DEPTH = 16

MODES = {"Online": "live", "Apprentice": "shadow", "LoggingOnly": "off"}
_MODE_NAMES = {v: k for k, v in MODES.items()}
AGGREGATIONS = {"earliest": "first", "average": "mean"}
_AGGREGATION_NAMES = {v: k for k, v in AGGREGATIONS.items()}
_BANDITSTREAM_AGGREGATIONS = ("sum", "first", "last", "max", "min", "mean")


class ApiError(Exception):
    """An error answered as ``{"error": {"code", "message"}}``.

    ``kind`` is a key of :attr:`STATUS`; the HTTP status and the code (which differs between API
    versions) are chosen by :func:`error_body`. ``code`` forces a 2022-09-01-preview code.
    """

    STATUS = {"bad_request": 400, "unauthorized": 401, "forbidden": 403, "not_found": 404, "method": 405,
              "conflict": 409, "too_large": 413, "internal": 500, "not_implemented": 501, "unavailable": 503}  # fmt: skip

    def __init__(self, message: str, kind: str = "bad_request", *, code: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.code = code
        self.field = field

    @property
    def status(self) -> int:
        return self.STATUS[self.kind]


def bad(field: str, message: str, code: str | None = None) -> ApiError:
    """A 400 whose message starts with the field's path."""
    return ApiError(f"{field}: {message}", code=code, field=field)


_V1_CODES = {"bad_request": "BadRequest", "too_large": "BadRequest", "not_found": "ResourceNotFound",
             "internal": "InternalServerError", "unavailable": "InternalServerError", "unauthorized": "Unauthorized",
             "forbidden": "BadRequest", "method": "BadRequest", "not_implemented": "BadRequest",
             "conflict": "BadRequest"}  # fmt: skip
_PREVIEW_CODES = {"bad_request": "BadRequest", "too_large": "PayloadSizeExceeded", "not_found": "ResourceNotFound",
                  "internal": "InternalServerError", "unavailable": "InternalServerError", "unauthorized": "Unauthorized",
                  "forbidden": "OperationNotAllowed", "method": "BadRequest", "not_implemented": "InvalidApiAccess",
                  "conflict": "InvalidRequest"}  # fmt: skip
#: codes of the preview's that name a missing or existing resource more precisely than the kind's
_PREVIEW_RESOURCE_CODES = {"not_found": ("EvaluationNotFound", "LearningSettingsNotFound", "FeatureImportanceNotFound"),
                           "conflict": ("EvaluationAlreadyExists", "FeatureImportanceAlreadyExists")}  # fmt: skip


def error_body(error: ApiError, api_version: str | None) -> tuple[int, dict[str, Any]]:
    """Status and body. v1.0 knows three codes (BadRequest, ResourceNotFound,
    InternalServerError); 2022-09-01-preview many more (InvalidRankRequest, ...). Neither
    lists one for a refused key: ``Unauthorized`` is used (the hosted gateway said ``401``)."""
    if api_version == PREVIEW:
        own = error.code and (error.kind == "bad_request" or error.code in _PREVIEW_RESOURCE_CODES.get(error.kind, ()))
        code = error.code if own else _PREVIEW_CODES[error.kind]
    else:
        code = _V1_CODES[error.kind]
    body: dict[str, Any] = {"code": code, "message": error.message}
    if error.field:
        body["target"] = error.field
    return error.status, {"error": body}


# -- JSON -----------------------------------------------------------------------------------


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> Any:
    """The body as JSON; NaN/Infinity literals, bad UTF-8 and deep nesting are refused."""
    if not raw.strip():
        raise ApiError("body: empty; a JSON object was expected", field="body")
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise ApiError("body: not UTF-8", field="body") from None
    except json.JSONDecodeError as exc:
        raise ApiError(f"body: malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", field="body") from None
    except ValueError as exc:
        raise ApiError(f"body: {exc}", field="body") from None
    except RecursionError:
        raise ApiError("body: nested too deeply", field="body") from None


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad(field, f"expected an object, got {_type_name(value)}")
    return value


def _array(value: Any, field: str, *, optional: bool = True) -> list[Any]:
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise bad(field, f"expected an array, got {_type_name(value)}")
    return value


def _string(value: Any, field: str, *, optional: bool = False, max_chars: int = MAX_ID_CHARS) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise bad(field, f"expected a string, got {_type_name(value)}")
    if not value.strip():
        raise bad(field, "must not be empty")
    if len(value) > max_chars:
        raise bad(field, f"is {len(value)} characters; at most {max_chars} are allowed")
    return value


def _boolean(value: Any, field: str, default: bool = False) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(field, f"expected a boolean, got {_type_name(value)}")
    return value


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(field, f"expected a number, got {_type_name(value)}")
    if not math.isfinite(value):
        raise bad(field, "must be finite")
    return float(value)


def _integer(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise bad(field, f"expected an integer, got {_type_name(value) if not isinstance(value, float) else repr(value)}")
    return int(value)


# -- features -------------------------------------------------------------------------------


def flatten_features(items: Any, field: str, prefix: str = "") -> dict[str, Any]:
    """A Personalizer feature list (objects) as a banditstream feature record; see the module doc."""
    numeric: dict[str, float] = {}
    categorical: dict[str, str] = {}
    for i, item in enumerate(_array(items, field)):
        _flatten(_object(item, f"{field}[{i}]"), prefix, numeric, categorical, f"{field}[{i}]", 0)
    return {"numeric": numeric, "categorical": categorical, "vector": []}


def _flatten(value: Any, name: str, numeric: dict, categorical: dict, field: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise bad(field, f"features nest deeper than {_MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{name}.{key}" if name else str(key), numeric, categorical, f"{field}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _flatten(item, f"{name}.{i}" if name else str(i), numeric, categorical, f"{field}[{i}]", depth + 1)
    elif isinstance(value, bool):
        categorical[name] = "true" if value else "false"
    elif isinstance(value, (int, float)):
        numeric[name] = float(value)
    elif isinstance(value, str):
        categorical[name] = value
    # null: no feature


# -- rank -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankRequest:
    context: dict[str, Any]
    #: every action in request order: {"id", "features"} records
    actions: list[dict[str, Any]]
    excluded: frozenset[str]
    event_id: str | None
    defer: bool

    def candidates(self) -> list[dict[str, Any]]:
        """The actions that may be chosen, in request order (the first is the baseline)."""
        return [a for a in self.actions if a["id"] not in self.excluded]


def _actions(body: dict[str, Any], code: str) -> list[dict[str, Any]]:
    if "actions" not in body or body["actions"] is None:
        raise bad("actions", "required: the actions to rank", code)
    raw = _array(body["actions"], "actions", optional=False)
    if not raw:
        raise bad("actions", "must hold at least one action", code)
    actions, seen = [], {}
    for i, item in enumerate(raw):
        item = _object(item, f"actions[{i}]")
        action_id = _string(item.get("id"), f"actions[{i}].id")
        if action_id in seen:
            raise bad(f"actions[{i}].id", f"duplicate action id {action_id!r} (also actions[{seen[action_id]}].id)", code)
        seen[action_id] = i
        actions.append({"id": action_id, "features": flatten_features(item.get("features"), f"actions[{i}].features")})
    return actions


def _excluded(value: Any, field: str) -> frozenset[str]:
    return frozenset(_string(x, f"{field}[{i}]") for i, x in enumerate(_array(value, field)))


def parse_rank(body: Any) -> RankRequest:
    """A RankRequest body; raises :class:`ApiError` naming the first bad field."""
    code = "InvalidRankRequest"
    try:
        body = _object(body, "body")
        context = flatten_features(body.get("contextFeatures"), "contextFeatures")
        actions = _actions(body, code)
        excluded = _excluded(body.get("excludedActions"), "excludedActions")
        request = RankRequest(
            context=context, actions=actions, excluded=excluded,
            event_id=_string(body.get("eventId"), "eventId", optional=True),
            defer=_boolean(body.get("deferActivation"), "deferActivation"),
        )  # fmt: skip
    except ApiError as exc:
        exc.code = exc.code or code
        raise
    if not request.candidates():
        raise bad("excludedActions", "every action is excluded; at least one must remain", code)
    return request


def ranking(actions: list[dict[str, Any]], candidates: list[dict[str, Any]], chosen: int, probabilities) -> list[dict[str, Any]]:
    """Personalizer's ranking: the chosen action first, the other candidates by probability
    (request order among equals), then the excluded ones with probability 0."""
    order = sorted(range(len(candidates)), key=lambda i: (i != chosen, -probabilities[i], i))
    ranked = [{"id": candidates[i]["id"], "probability": float(probabilities[i])} for i in order]
    offered = {c["id"] for c in candidates}
    ranked.extend({"id": a["id"], "probability": 0.0} for a in actions if a["id"] not in offered)
    return ranked


@dataclass(frozen=True)
class Slot:
    id: str
    baseline: str
    features: dict[str, Any]
    excluded: frozenset[str]


@dataclass(frozen=True)
class MultiSlotRankRequest:
    context: dict[str, Any]
    actions: list[dict[str, Any]]
    slots: list[Slot]
    event_id: str | None
    defer: bool


def parse_multislot_rank(body: Any) -> MultiSlotRankRequest:
    """A MultiSlotRankRequest body: every slot names a distinct baseline action among the
    actions, never one it excludes; slot ids are unique."""
    code = "InvalidRankRequest"
    try:
        body = _object(body, "body")
        context = flatten_features(body.get("contextFeatures"), "contextFeatures")
        actions = _actions(body, code)
        ids = {a["id"] for a in actions}
        if body.get("slots") is None:
            raise bad("slots", "required: the slots to fill")
        raw = _array(body["slots"], "slots", optional=False)
        if not raw:
            raise bad("slots", "must hold at least one slot")
        slots: list[Slot] = []
        seen_slots: dict[str, int] = {}
        baselines: dict[str, int] = {}
        for i, item in enumerate(raw):
            item = _object(item, f"slots[{i}]")
            slot_id = _string(item.get("id"), f"slots[{i}].id")
            if slot_id in seen_slots:
                raise bad(f"slots[{i}].id", f"duplicate slot id {slot_id!r} (also slots[{seen_slots[slot_id]}].id)")
            seen_slots[slot_id] = i
            baseline = _string(item.get("baselineAction"), f"slots[{i}].baselineAction")
            if baseline not in ids:
                raise bad(f"slots[{i}].baselineAction", f"{baseline!r} is not among the actions")
            if baseline in baselines:
                raise bad(f"slots[{i}].baselineAction", f"{baseline!r} is already slots[{baselines[baseline]}]'s baseline")
            baselines[baseline] = i
            excluded = _excluded(item.get("excludedActions"), f"slots[{i}].excludedActions")
            if baseline in excluded:
                raise bad(f"slots[{i}].excludedActions", f"excludes its own baseline action {baseline!r}")
            features = flatten_features(item.get("features"), f"slots[{i}].features", prefix="slot")
            slots.append(Slot(slot_id, baseline, features, excluded))
        return MultiSlotRankRequest(
            context=context, actions=actions, slots=slots,
            event_id=_string(body.get("eventId"), "eventId", optional=True),
            defer=_boolean(body.get("deferActivation"), "deferActivation"),
        )  # fmt: skip
    except ApiError as exc:
        exc.code = exc.code or code
        raise


def slot_event_id(event_id: str, slot_id: str) -> str:
    return f"{event_id}{SLOT_SEPARATOR}{slot_id}"


def merge_features(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"numeric": {**a["numeric"], **b["numeric"]}, "categorical": {**a["categorical"], **b["categorical"]}, "vector": []}


# -- rewards --------------------------------------------------------------------------------


def _reward_value(value: Any, field: str) -> float:
    number = _number(value, field)
    if not -1.0 <= number <= 1.0:
        raise bad(field, f"is {number!r}; a reward must be between -1 and 1")
    return number


def parse_reward(body: Any) -> float:
    """A RewardRequest body: ``{"value": number in [-1, 1]}``."""
    try:
        body = _object(body, "body")
        if "value" not in body:
            raise bad("value", "required: the reward, a number between -1 and 1")
        return _reward_value(body["value"], "value")
    except ApiError as exc:
        exc.code = exc.code or "InvalidRewardRequest"
        raise


def parse_multislot_reward(body: Any) -> list[tuple[str, float]]:
    """A MultiSlotRewardRequest body: ``{"reward": [{"slotId", "value"}, ...]}``."""
    try:
        body = _object(body, "body")
        if body.get("reward") is None:
            raise bad("reward", "required: a list of {slotId, value}")
        rewards = []
        for i, item in enumerate(_array(body["reward"], "reward", optional=False)):
            item = _object(item, f"reward[{i}]")
            slot = _string(item.get("slotId"), f"reward[{i}].slotId")
            if "value" not in item:
                raise bad(f"reward[{i}].value", "required: the reward, a number between -1 and 1")
            rewards.append((slot, _reward_value(item["value"], f"reward[{i}].value")))
        return rewards
    except ApiError as exc:
        exc.code = exc.code or "InvalidRewardRequest"
        raise


def check_event_id(event_id: str, code: str, field: str = "eventId") -> str:
    """A path's event id (or another id, ``field``): non-empty, at most 256 characters (the API's maxLength)."""
    try:
        return _string(event_id, field)
    except ApiError as exc:
        exc.code = code
        raise


# -- durations ------------------------------------------------------------------------------

_DURATION = re.compile(
    r"^P(?:(?P<days>\d+(?:\.\d+)?)D)?(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(text: Any, field: str, code: str | None = None) -> float:
    """An ISO 8601 duration (``PT5M``, ``P1DT2H``, ``PT0.5S``) in seconds; also .NET's
    ``[d.]hh:mm:ss`` form, which older Personalizer examples use."""
    if not isinstance(text, str):
        raise bad(field, f"expected an ISO 8601 duration string such as 'PT10M', got {_type_name(text)}", code)
    match = _DURATION.match(text.strip().upper())
    if match and text.strip().upper() not in ("P", "PT") and not text.strip().upper().endswith("T"):
        parts = {k: float(v) for k, v in match.groupdict().items() if v}
        return parts.get("days", 0) * 86400 + parts.get("hours", 0) * 3600 + parts.get("minutes", 0) * 60 + parts.get("seconds", 0)
    dotnet = re.match(r"^(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)$", text.strip())
    if dotnet:
        days, hours, minutes, seconds = dotnet.groups()
        return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    raise bad(field, f"{text!r} is not an ISO 8601 duration such as 'PT10M' or 'P1D'", code)


def format_duration(seconds: float) -> str:
    """Seconds as an ISO 8601 duration: 600 -> ``PT10M``, 90061 -> ``P1DT1H1M1S``."""
    days, rest = divmod(float(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    out = "P" + (f"{int(days)}D" if days else "")
    time_part = (f"{int(hours)}H" if hours else "") + (f"{int(minutes)}M" if minutes else "")
    if secs or not (days or hours or minutes):
        time_part += f"{int(secs)}S" if secs == int(secs) else f"{round(secs, 3)}S"
    return out + ("T" + time_part if time_part else "")


def iso_time(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat().replace("+00:00", "Z")


# -- service configuration ------------------------------------------------------------------


@dataclass
class ServiceExtras:
    """Service configuration fields that are no domain setting: kept and reported."""

    model_export_frequency_s: float
    log_retention_days: int = -1
    model_retrain_days: int = 0
    last_edit: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"modelExportFrequency": self.model_export_frequency_s, "logRetentionDays": self.log_retention_days,
                "modelRetrainDays": self.model_retrain_days, "lastEdit": self.last_edit}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any], default_export_s: float) -> "ServiceExtras":
        return cls(
            model_export_frequency_s=float(data.get("modelExportFrequency", default_export_s)),
            log_retention_days=int(data.get("logRetentionDays", -1)),
            model_retrain_days=int(data.get("modelRetrainDays", 0)),
            last_edit=data.get("lastEdit"),
        )


def exploration_floor(settings: DomainSettings) -> float:
    """The floor the domain's policy decides with: ``params.eps0``, else its policy's default
    (0.01 for ``lin_igw`` and the default portfolio's members, 0.05 for most others)."""
    if "eps0" in settings.params:
        return float(settings.params["eps0"])
    return float(settings.make_policy().eps0)


def service_configuration(settings: DomainSettings, extras: ServiceExtras, api_version: str) -> dict[str, Any]:
    """The domain's settings as a ServiceConfiguration body."""
    reward = settings.reward
    body: dict[str, Any] = {
        "rewardWaitTime": format_duration(reward.window_s),
        "defaultReward": float(reward.default_reward),
        "rewardAggregation": _AGGREGATION_NAMES.get(reward.aggregate, reward.aggregate),
        "explorationPercentage": exploration_floor(settings),
        "modelExportFrequency": format_duration(extras.model_export_frequency_s),
        "logRetentionDays": extras.log_retention_days,
    }
    if api_version == PREVIEW:
        body["modelRetrainDays"] = extras.model_retrain_days
        body["learningMode"] = _MODE_NAMES[settings.mode]
        if extras.last_edit is not None:
            body["lastConfigurationEditDate"] = iso_time(extras.last_edit)
    return body


_SERVICE_FIELD_OF = {("reward", "window_s"): "rewardWaitTime", ("reward", "default_reward"): "defaultReward",
                     ("reward", "aggregate"): "rewardAggregation", ("params",): "explorationPercentage",
                     ("mode",): "learningMode", (): "explorationPercentage"}  # fmt: skip


def update_service_configuration(
    settings: DomainSettings, extras: ServiceExtras, body: Any, now: float
) -> tuple[DomainSettings, ServiceExtras]:
    """Apply a ServiceConfiguration body (fields left out stay as they are), validated as the
    domain's settings are; raises :class:`ApiError` naming the first bad field."""
    code = "InvalidServiceConfiguration"
    body = _object(body, "body")
    tree = settings.model_dump(mode="json")
    reward, params = tree["reward"], tree["params"]
    new_extras = ServiceExtras(extras.model_export_frequency_s, extras.log_retention_days, extras.model_retrain_days, now)
    if body.get("rewardWaitTime") is not None:
        seconds = parse_duration(body["rewardWaitTime"], "rewardWaitTime", "InvalidRewardWaitTime")
        # the API's bounds; a value the config tree set outside them survives a GET -> PUT round trip
        if not 5.0 <= seconds <= 2 * 86400 and seconds != settings.reward.window_s:
            raise bad("rewardWaitTime", f"is {format_duration(seconds)}; it must be between 5 seconds and 2 days",
                      "InvalidRewardWaitTime")  # fmt: skip
        reward["window_s"] = seconds
    if body.get("defaultReward") is not None:
        value = _number(body["defaultReward"], "defaultReward")
        if not -1.0 <= value <= 1.0:
            raise bad("defaultReward", f"is {value!r}; it must be between -1 and 1", code)
        reward["default_reward"] = value
    if body.get("rewardAggregation") is not None:
        name = _string(body["rewardAggregation"], "rewardAggregation")
        aggregate = AGGREGATIONS.get(name.lower(), name.lower())
        if aggregate not in _BANDITSTREAM_AGGREGATIONS:
            known = ", ".join([*AGGREGATIONS, *(a for a in _BANDITSTREAM_AGGREGATIONS if a not in _AGGREGATION_NAMES)])
            raise bad("rewardAggregation", f"{name!r} is unknown; use one of {known}", code)
        reward["aggregate"] = aggregate
    if body.get("explorationPercentage") is not None:
        value = _number(body["explorationPercentage"], "explorationPercentage")
        if not 0.0 <= value <= 1.0:
            raise bad("explorationPercentage", f"is {value!r}; it must be between 0 and 1", code)
        params["eps0"] = value
    if body.get("modelExportFrequency") is not None:
        seconds = parse_duration(body["modelExportFrequency"], "modelExportFrequency", code)
        if seconds <= 0:
            raise bad("modelExportFrequency", "must be longer than zero", code)
        new_extras.model_export_frequency_s = seconds
    if body.get("logRetentionDays") is not None:
        days = _integer(body["logRetentionDays"], "logRetentionDays")
        minimum = 1 + math.ceil(reward["window_s"] / 86400)
        if days != -1 and days < minimum:
            raise bad("logRetentionDays", f"is {days}; use -1 (keep forever) or at least {minimum} "
                      "(the reward wait time plus one day, rounded up)", "InvalidLogRetentionDays")  # fmt: skip
        new_extras.log_retention_days = days
    if body.get("modelRetrainDays") is not None:
        days = _integer(body["modelRetrainDays"], "modelRetrainDays")
        if days < 0:
            raise bad("modelRetrainDays", f"is {days}; it must be 0 or more", "InvalidModelRetrainDays")
        new_extras.model_retrain_days = days
    if body.get("learningMode") is not None:
        mode_name = _string(body["learningMode"], "learningMode")
        if mode_name not in MODES:
            raise bad("learningMode", f"{mode_name!r} is unknown; use one of {', '.join(MODES)}", code)
        if MODES[mode_name] != settings.mode:
            changed = [name for name, new, old in (
                ("rewardWaitTime", reward["window_s"], settings.reward.window_s),
                ("defaultReward", reward["default_reward"], settings.reward.default_reward),
                ("rewardAggregation", reward["aggregate"], settings.reward.aggregate),
            ) if new != old]  # fmt: skip
            if changed:
                raise bad("learningMode", f"changes together with {', '.join(changed)}: change the learning mode first, "
                          "then the other settings in another call", "InvalidLearningModeServiceConfiguration")  # fmt: skip
        tree["mode"] = MODES[mode_name]
    return _validated(tree, _SERVICE_FIELD_OF, code), new_extras


def _validated(tree: dict[str, Any], field_of: Mapping[tuple, str], code: str) -> DomainSettings:
    try:
        return DomainSettings.model_validate(tree)
    except PydanticValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(str(p) for p in error["loc"])
        field = next((name for prefix, name in field_of.items() if loc[: len(prefix)] == prefix), ".".join(loc) or "body")
        raise bad(field, error["msg"].removeprefix("Value error, "), code) from None


# -- policy configuration -------------------------------------------------------------------


def policy_contract(settings: DomainSettings) -> dict[str, str]:
    """The domain's policy as a PolicyContract: its name and its hyper-parameters as flags."""
    return {"name": settings.policy, "arguments": format_arguments(settings.params)}


def format_arguments(params: Mapping[str, Any]) -> str:
    return " ".join(f"--{key} {json.dumps(value) if not isinstance(value, str) else value}" for key, value in sorted(params.items()))


def parse_arguments(text: str) -> dict[str, Any]:
    """``--alpha 0.5 --seed=3 --name text`` as ``{"alpha": 0.5, "seed": 3, "name": "text"}``."""
    params: dict[str, Any] = {}
    tokens = text.split()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or len(token) == 2:
            raise bad("arguments", f"expected --name value pairs, got {token!r}", "InvalidPolicyConfiguration")
        name, _, value = token[2:].partition("=")
        if not value:
            if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                raise bad("arguments", f"--{name} has no value", "InvalidPolicyConfiguration")
            value = tokens[i + 1]
            i += 1
        try:
            params[name] = json.loads(value, parse_constant=_refuse_constant)
        except ValueError:
            params[name] = value
        i += 1
    return params


def update_policy(settings: DomainSettings, body: Any) -> DomainSettings:
    """Apply a PolicyContract body: the domain's policy and its hyper-parameters (the
    exploration floor ``eps0`` is kept unless the arguments set it)."""
    code = "InvalidPolicyConfiguration"
    try:
        body = _object(body, "body")
        name = _string(body.get("name"), "name")
        arguments = body.get("arguments")
        arguments = "" if arguments is None else arguments
        if not isinstance(arguments, str):
            raise bad("arguments", f"expected a string of --name value flags, got {_type_name(arguments)}")
        if len(arguments) > 1024:
            raise bad("arguments", f"is {len(arguments)} characters; at most 1024 are allowed")
    except ApiError as exc:
        exc.code = exc.code or code
        raise
    from learner.policies import POLICIES

    if name not in POLICIES:
        raise bad("name", f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}", code)
    params = parse_arguments(arguments)
    if "eps0" not in params and "eps0" in settings.params:
        params["eps0"] = settings.params["eps0"]
    tree = settings.model_dump(mode="json")
    tree["policy"], tree["params"] = name, params
    field = "name" if POLICIES[name].shared != settings.features.shared else "arguments"
    return _validated(tree, {("policy",): "name", ("params",): "arguments", (): field}, code)


# -- evaluations ----------------------------------------------------------------------------

#: at most this many policies in one evaluation (each is trained progressively on the window)
MAX_EVALUATION_POLICIES = 20


def parse_time(value: Any, field: str, code: str | None = None) -> int:
    """An ISO 8601 date-time (``2024-05-01T00:00:00Z``, an offset, or none: UTC) as epoch ms."""
    if not isinstance(value, str):
        raise bad(field, f"expected an ISO 8601 date-time such as '2024-05-01T00:00:00Z', got {_type_name(value)}", code)
    text = value.strip()
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    except ValueError:
        raise bad(field, f"{value!r} is not an ISO 8601 date-time such as '2024-05-01T00:00:00Z'", code) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


def iso_time_ms(epoch_ms: int) -> str:
    return iso_time(epoch_ms / 1000)


@dataclass(frozen=True)
class EvaluatedPolicy:
    """One of an evaluation's ``policies``: a banditstream policy and its hyper-parameters, as
    the policy configuration takes them."""

    name: str
    arguments: str
    #: the hyper-parameters (the domain's exploration floor ``eps0`` unless the arguments set it), ``seed`` apart
    params: dict[str, Any]
    seed: int


@dataclass(frozen=True)
class EvaluationContract:
    name: str
    since_ms: int
    until_ms: int
    policies: tuple[EvaluatedPolicy, ...]
    #: enableOfflineExperimentation (v1.0) / enablePolicyOptimization (preview): asked for, not done here
    optimize: bool


def parse_evaluation(body: Any, settings: DomainSettings) -> EvaluationContract:
    """An EvaluationContract body: ``name``, ``startTime`` < ``endTime`` and ``policies``, each a
    PolicyContract whose ``name`` is a banditstream policy that scores per arm (the joined log
    keeps only the acted row's features) and whose ``arguments`` are its hyper-parameters as
    flags. Raises :class:`ApiError` naming the first bad field."""
    code = "InvalidEvaluationContract"
    try:
        body = _object(body, "body")
        name, since_ms, until_ms = _named_range(body)
        optimize = _boolean(body.get("enableOfflineExperimentation"), "enableOfflineExperimentation")
        optimize = _boolean(body.get("enablePolicyOptimization"), "enablePolicyOptimization", optimize)
        if body.get("policies") is None:
            raise bad("policies", "required: the policies to evaluate, [] for none beyond the online one")
        raw = _array(body["policies"], "policies", optional=False)
        if len(raw) > MAX_EVALUATION_POLICIES:
            raise bad("policies", f"holds {len(raw)} policies; at most {MAX_EVALUATION_POLICIES} are evaluated at once")
        policies: list[EvaluatedPolicy] = []
        seen: dict[str, int] = {}
        for i, item in enumerate(raw):
            policy = _evaluated_policy(_object(item, f"policies[{i}]"), f"policies[{i}]", settings)
            key = json.dumps([policy.name, policy.params, policy.seed], sort_keys=True, default=str)
            if key in seen:
                raise bad(f"policies[{i}]", f"evaluates the same policy and arguments as policies[{seen[key]}]",
                          "DuplicateCustomPolicyNames")  # fmt: skip
            seen[key] = i
            policies.append(policy)
    except ApiError as exc:
        exc.code = exc.code or code
        raise
    return EvaluationContract(name, since_ms, until_ms, tuple(policies), optimize)


def _named_range(body: dict[str, Any]) -> tuple[str, int, int]:
    """A job contract's ``name`` and its ``[startTime, endTime)`` in epoch ms."""
    name = _string(body.get("name"), "name")
    for field in ("startTime", "endTime"):
        if body.get(field) is None:
            raise bad(field, "required: an ISO 8601 date-time such as '2024-05-01T00:00:00Z'")
    since_ms, until_ms = parse_time(body["startTime"], "startTime"), parse_time(body["endTime"], "endTime")
    if until_ms <= since_ms:
        raise bad("endTime", f"{body['endTime']!r} is not after startTime {body['startTime']!r}")
    return name, since_ms, until_ms


def _evaluated_policy(item: dict[str, Any], field: str, settings: DomainSettings) -> EvaluatedPolicy:
    from learner.policies import POLICIES, make_policy

    name = _string(item.get("name"), f"{field}.name")
    if name not in POLICIES:
        raise bad(f"{field}.name", f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    shared = POLICIES[settings.policy].shared
    if POLICIES[name].shared != shared:
        alike = ", ".join(sorted(k for k, v in POLICIES.items() if v.shared == shared))
        raise bad(f"{field}.name", f"{name!r} is a {'shared' if POLICIES[name].shared else 'per-arm'} model and this domain's log "
                  f"is a {'shared' if shared else 'per-arm'} model's; evaluate one of {alike}")  # fmt: skip
    arguments = item.get("arguments")
    arguments = "" if arguments is None else arguments
    if not isinstance(arguments, str):
        raise bad(f"{field}.arguments", f"expected a string of --name value flags, got {_type_name(arguments)}")
    if len(arguments) > 1024:
        raise bad(f"{field}.arguments", f"is {len(arguments)} characters; at most 1024 are allowed")
    try:
        params = parse_arguments(arguments)
    except ApiError as exc:
        raise bad(f"{field}.arguments", exc.message.removeprefix("arguments: ")) from None
    if "eps0" not in params and "eps0" in settings.params:
        params["eps0"] = settings.params["eps0"]
    seed = params.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise bad(f"{field}.arguments", f"--seed {seed!r} is not an integer")
    try:
        make_policy(name, dim=1, seed=seed, **params)  # a bad hyper-parameter fails here, by name
    except (TypeError, ValueError) as exc:
        raise bad(f"{field}.arguments", str(exc)) from None
    return EvaluatedPolicy(name, arguments, params, seed)


@dataclass(frozen=True)
class PolicyReference:
    evaluation_id: str
    policy_name: str


def parse_policy_reference(body: Any) -> PolicyReference:
    """A PolicyReferenceContract body (configurations/applyFromEvaluation)."""
    try:
        body = _object(body, "body")
        return PolicyReference(_string(body.get("evaluationId"), "evaluationId"), _string(body.get("policyName"), "policyName"))
    except ApiError as exc:
        exc.code = exc.code or "InvalidContract"
        raise


# -- feature importances --------------------------------------------------------------------


@dataclass(frozen=True)
class FeatureImportanceContract:
    name: str
    since_ms: int
    until_ms: int


def parse_feature_importance(body: Any) -> FeatureImportanceContract:
    """A FeatureImportanceContract body: ``name`` and ``startTime`` < ``endTime``. Raises
    :class:`ApiError` (InvalidContract, the preview's code for a bad job definition) naming the
    first bad field."""
    try:
        return FeatureImportanceContract(*_named_range(_object(body, "body")))
    except ApiError as exc:
        exc.code = exc.code or "InvalidContract"
        raise
