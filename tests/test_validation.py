"""Boundary validation: every cause has its typed error, naming the field and the offending value."""

from __future__ import annotations

import copy
import math
import pickle
import re

import numpy as np
import pytest

from streams import errors
from streams.errors import (
    ChosenOutOfRange,
    EmptyActions,
    FieldTooLarge,
    MissingEventId,
    MissingRewardId,
    NegativeProbability,
    NonFiniteFeature,
    NonFiniteValue,
    OversizePayload,
    ProbabilitiesDoNotSumToOne,
    ProbabilityCountMismatch,
    TooManyActions,
    UnknownDomain,
    ValidationError,
    WrongDimension,
)
from banditstream.config import ConfigError, load_settings
from streams.deadletter import reason_of
from streams.serde import AvroSerde
from streams.validation import DomainLimits, ValidationLimits, Validator

LIMITS = ValidationLimits(
    domains={"llm_routing": DomainLimits(vector_dim=3, max_actions=4), "cache_tier": DomainLimits()},
    probability_tolerance=1e-6,
    max_payload_bytes=10_000,
)


@pytest.fixture
def validator() -> Validator:
    return Validator(LIMITS)


def decision() -> dict:
    return {
        "event_id": "evt-1",
        "domain": "llm_routing",
        "timestamp": 1_700_000_000_000,
        "context": {
            "numeric": {"prompt_len": 412.0, "latency": 0.25},
            "categorical": {"task": "code"},
            "vector": [0.1, 0.2, 0.3],
        },
        "actions": [
            {"id": "small", "features": {"numeric": {"cost": 0.1}, "categorical": {}, "vector": [1.0, 0.0, 0.0]}},
            {"id": "medium", "features": {"numeric": {"cost": 0.5}, "categorical": {}, "vector": []}},
            {"id": "large", "features": {"numeric": {"cost": 1.5}, "categorical": {}, "vector": [0.0, 0.0, 1.0]}},
        ],
        "chosen": 2,
        "probabilities": [0.2, 0.3, 0.5],
        "recommended": -1,
    }


def reward() -> dict:
    return {
        "event_id": "evt-1",
        "reward_id": "r-1",
        "domain": "llm_routing",
        "timestamp": 1_700_000_000_500,
        "signals": {"success": 1.0, "latency_ms": 812.0},
        "value": None,
    }


def update() -> dict:
    return {
        "event_id": "evt-1",
        "domain": "llm_routing",
        "arm": "large",
        "arm_index": 2,
        "actions": ["small", "medium", "large"],
        "probabilities": [0.2, 0.3, 0.5],
        "probability": 0.5,
        "features": [0.1, 0.2, 0.3, 1.0],
        "reward": 0.8,
        "signals": {"success": 1.0},
        "join_status": "rewarded",
        "decision_time": 1_700_000_000_000,
        "weight": 1.0,
    }


def with_(event: dict, path: str, value) -> dict:
    """A deep copy of ``event`` with the item at a dotted path (ints index lists) replaced."""
    out = copy.deepcopy(event)
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    target = out
    for key in keys[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return out


_DELETE = object()


# --- valid events pass ------------------------------------------------------------------------


def test_a_valid_decision_passes_and_is_returned_unchanged(validator):
    event = decision()
    assert validator.validate_decision(event, encoded_size=900) is event
    assert event == decision()


def test_a_valid_reward_and_update_pass(validator):
    assert validator.validate_reward(reward()) == reward()
    assert validator.validate_reward(with_(reward(), "value", 0.5)) is not None
    assert validator.validate_update(update()) == update()


def test_without_configured_domains_any_domain_and_dimension_is_accepted():
    event = with_(decision(), "domain", "anything")
    event = with_(event, "context.vector", [1.0] * 7)
    assert Validator().validate_decision(event) is event


def test_probabilities_within_the_tolerance_pass(validator):
    assert validator.validate_decision(with_(decision(), "probabilities", [0.2, 0.3, 0.5 + 5e-7]))


def test_a_recommendation_is_empty_or_a_distribution_over_the_actions(validator):
    shadow = [0.0, 0.25, 0.75]  # 0 for a candidate the shields dropped
    for recommended in ([], shadow):
        assert validator.validate_decision(with_(decision(), "recommended_probabilities", recommended))
        assert validator.validate_update(with_(update(), "recommended_probabilities", recommended))


# --- every cause, its error, and a message naming field and value ---------------------------------


CASES = [
    # (id, validate method, event, error type, field, text that must appear in the message)
    ("missing event_id", "decision", with_(decision(), "event_id", _DELETE), MissingEventId, "event_id",
     "event_id is None; every event needs a non-empty string id"),
    ("empty event_id", "decision", with_(decision(), "event_id", ""), MissingEventId, "event_id", "event_id is ''"),
    ("blank event_id", "decision", with_(decision(), "event_id", "  "), MissingEventId, "event_id", "event_id is '  '"),
    ("non-string event_id", "decision", with_(decision(), "event_id", 17), MissingEventId, "event_id", "event_id is 17"),
    ("unknown domain", "decision", with_(decision(), "domain", "llm_routnig"), UnknownDomain, "domain",
     "domain is 'llm_routnig'; not a configured domain (known: cache_tier, llm_routing)"),
    ("empty actions", "decision", with_(decision(), "actions", []), EmptyActions, "actions",
     "actions is []; a decision needs at least one candidate"),
    ("too many actions", "decision",
     with_(with_(decision(), "actions", [{"id": str(i)} for i in range(5)]), "probabilities", [0.2] * 5),
     TooManyActions, "len(actions)", "len(actions) is 5; the domain allows at most 4 candidates"),
    ("probability count", "decision", with_(decision(), "probabilities", [0.5, 0.5]), ProbabilityCountMismatch,
     "len(probabilities)", "len(probabilities) is 2; one probability per action expected (3 actions)"),
    ("chosen too large", "decision", with_(decision(), "chosen", 3), ChosenOutOfRange, "chosen",
     "chosen is 3; must index one of the actions (0..2)"),
    ("chosen negative", "decision", with_(decision(), "chosen", -1), ChosenOutOfRange, "chosen", "chosen is -1"),
    ("chosen not an int", "decision", with_(decision(), "chosen", 1.0), ChosenOutOfRange, "chosen", "chosen is 1.0"),
    ("recommended out of range", "decision", with_(decision(), "recommended", 7), ChosenOutOfRange, "recommended",
     "recommended is 7; must index one of the actions, or be -1 (0..2)"),
    ("negative probability", "decision", with_(decision(), "probabilities", [0.6, -0.1, 0.5]), NegativeProbability,
     "probabilities[1]", "probabilities[1] is -0.1; probabilities must not be negative"),
    ("nan probability", "decision", with_(decision(), "probabilities", [0.5, math.nan, 0.5]), NonFiniteValue,
     "probabilities[1]", "probabilities[1] is nan; probabilities must be finite numbers"),
    ("probabilities sum", "decision", with_(decision(), "probabilities", [0.2, 0.3, 0.4]), ProbabilitiesDoNotSumToOne,
     "sum(probabilities)", "sum(probabilities) is 0.9; must be 1 within 1e-06 (probabilities: [0.2, 0.3, 0.4])"),
    ("nan context feature", "decision", with_(decision(), "context.numeric.prompt_len", math.nan), NonFiniteFeature,
     "context.numeric['prompt_len']", "context.numeric['prompt_len'] is nan; features must be finite"),
    ("inf context feature", "decision", with_(decision(), "context.numeric.latency", -math.inf), NonFiniteFeature,
     "context.numeric['latency']", "context.numeric['latency'] is -inf; features must be finite"),
    ("string as a numeric feature", "decision", with_(decision(), "context.numeric.latency", "fast"), NonFiniteFeature,
     "context.numeric['latency']", "context.numeric['latency'] is 'fast'"),
    ("inf action feature", "decision", with_(decision(), "actions.1.features.numeric.cost", math.inf), NonFiniteFeature,
     "actions[1].features.numeric['cost']", "actions[1].features.numeric['cost'] is inf; features must be finite"),
    ("nan in the context vector", "decision", with_(decision(), "context.vector.1", math.nan), NonFiniteFeature,
     "context.vector[1]", "context.vector[1] is nan; features must be finite"),
    ("inf in an action vector", "decision", with_(decision(), "actions.2.features.vector.2", math.inf),
     NonFiniteFeature, "actions[2].features.vector[2]", "actions[2].features.vector[2] is inf"),
    ("context vector dimension", "decision", with_(decision(), "context.vector", [0.1, 0.2]), WrongDimension,
     "len(context.vector)", "len(context.vector) is 2; the domain's vector dimension is 3"),
    ("action vector dimension", "decision", with_(decision(), "actions.0.features.vector", [1.0] * 4), WrongDimension,
     "len(actions[0].features.vector)", "len(actions[0].features.vector) is 4; the domain's vector dimension is 3"),
    ("missing reward_id", "reward", with_(reward(), "reward_id", ""), MissingRewardId, "reward_id",
     "reward_id is ''; every reward needs a non-empty string id"),
    ("reward of an unknown domain", "reward", with_(reward(), "domain", "nope"), UnknownDomain, "domain",
     "domain is 'nope'"),
    ("nan reward signal", "reward", with_(reward(), "signals.latency_ms", math.nan), NonFiniteValue,
     "signals['latency_ms']", "signals['latency_ms'] is nan; signals must be finite"),
    ("inf reward value", "reward", with_(reward(), "value", math.inf), NonFiniteValue, "value",
     "value is inf; a reward value must be a finite number"),
    ("update without event_id", "update", with_(update(), "event_id", None), MissingEventId, "event_id",
     "event_id is None"),
    ("update arm_index", "update", with_(update(), "arm_index", 3), ChosenOutOfRange, "arm_index",
     "arm_index is 3; must index one of the actions (0..2)"),
    ("update probability", "update", with_(update(), "probability", -0.5), NegativeProbability, "probability",
     "probability is -0.5"),
    ("update nan feature", "update", with_(update(), "features.3", math.nan), NonFiniteFeature, "features[3]",
     "features[3] is nan; features must be finite"),
    ("update nan reward", "update", with_(update(), "reward", math.nan), NonFiniteValue, "reward",
     "reward is nan; reward must be a finite number"),
    ("update distribution", "update", with_(update(), "probabilities", [0.5, 0.5, 0.5]), ProbabilitiesDoNotSumToOne,
     "sum(probabilities)", "sum(probabilities) is 1.5"),
    ("update probability count", "update", with_(update(), "probabilities", [1.0]), ProbabilityCountMismatch,
     "len(probabilities)", "len(probabilities) is 1"),
    ("recommendation count", "decision", with_(decision(), "recommended_probabilities", [0.5, 0.5]),
     ProbabilityCountMismatch, "len(recommended_probabilities)",
     "len(recommended_probabilities) is 2; empty or one probability per action expected (3 actions)"),
    ("recommendation sum", "decision", with_(decision(), "recommended_probabilities", [0.5, 0.5, 0.5]),
     ProbabilitiesDoNotSumToOne, "sum(recommended_probabilities)", "sum(recommended_probabilities) is 1.5"),
    ("update recommendation", "update", with_(update(), "recommended_probabilities", [0.5, -0.5, 1.0]),
     NegativeProbability, "recommended_probabilities[1]", "recommended_probabilities[1] is -0.5"),
    ("megabyte action id", "decision", with_(decision(), "actions.1.id", "x" * (1 << 20)), FieldTooLarge,
     "actions[1].id", "actions[1].id is 1048576 bytes, the limit is 256 (limits.max_id_bytes)"),
]


@pytest.mark.parametrize(
    ("method", "event", "error", "field", "message"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_each_cause_raises_its_typed_error_naming_field_and_value(validator, method, event, error, field, message):
    with pytest.raises(error) as caught:
        getattr(validator, f"validate_{method}")(event)

    err = caught.value
    assert type(err) is error
    assert isinstance(err, ValidationError)
    assert err.field == field
    assert message in str(err)
    assert str(err).startswith(f"{field} is ")
    assert "\n" not in str(err)


def test_every_validation_error_class_is_exercised():
    raised = {case[3] for case in CASES} | {OversizePayload}
    declared = {
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, ValidationError) and cls is not ValidationError
    }
    assert declared - raised == set()


def test_oversize_encoded_event_is_refused(validator):
    with pytest.raises(OversizePayload) as caught:
        validator.validate_decision(decision(), encoded_size=10_001)
    assert str(caught.value) == "payload is 10001; encoded bytes exceed the limit of 10000"
    assert caught.value.reason == "oversize"
    validator.validate_size(10_000)  # at the limit is fine


def test_errors_carry_the_offending_value_and_a_metric_safe_reason(validator):
    with pytest.raises(NonFiniteFeature) as caught:
        validator.validate_decision(with_(decision(), "context.numeric.prompt_len", math.nan))
    assert math.isnan(caught.value.value)
    slugs = {case[3].reason for case in CASES}
    assert len(slugs) == len({case[3] for case in CASES}), "one reason per error class"
    assert all(re.fullmatch(r"[a-z][a-z_]*", slug) for slug in slugs)


def test_the_first_problem_in_the_documented_order_is_reported(validator):
    broken = with_(decision(), "context.numeric.prompt_len", math.nan)
    broken = with_(broken, "chosen", 9)
    broken = with_(broken, "probabilities", [0.1, 0.1, 0.1])
    with pytest.raises(ChosenOutOfRange):  # indices before the distribution before features
        validator.validate_decision(broken)
    with pytest.raises(ProbabilitiesDoNotSumToOne):
        validator.validate_decision(with_(broken, "chosen", 0))
    with pytest.raises(NonFiniteFeature):
        validator.validate_decision(with_(with_(broken, "chosen", 0), "probabilities", [0.2, 0.3, 0.5]))


def test_numpy_vectors_are_checked_too(validator):
    event = with_(decision(), "context.vector", np.array([0.1, 0.2, 0.3]))
    assert validator.validate_decision(event) is event
    with pytest.raises(NonFiniteFeature, match=r"context\.vector\[2\] is inf"):
        validator.validate_decision(with_(decision(), "context.vector", np.array([0.1, 0.2, np.inf])))


def test_finite_values_whose_sum_overflows_are_still_valid():
    event = with_(decision(), "context.numeric", {"a": 1e308, "b": 1e308})
    assert Validator(LIMITS).validate_decision(event) is event


def test_limits_are_frozen_and_checked():
    with pytest.raises(ValueError, match="probability_tolerance"):
        ValidationLimits(probability_tolerance=-1.0)
    with pytest.raises(AttributeError):
        LIMITS.max_payload_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        LIMITS.domains["new"] = DomainLimits()  # type: ignore[index]


# --- size limits: every string, list and map of an event is bounded ------------------------------

SMALL = ValidationLimits(
    max_id_bytes=40, max_string_bytes=50, max_actions=4, max_features=5, max_vector_dim=6, max_signals=3
)  # no domains: the domain is an id like any other, and vectors have no configured dimension


def _many_actions(n: int) -> dict:
    return with_(with_(decision(), "actions", [{"id": f"a{i}"} for i in range(n)]), "probabilities", [1 / n] * n)


def _context_features(n: int) -> dict:  # one categorical feature and n - 1 numeric ones
    return with_(decision(), "context.numeric", {f"f{i}": 1.0 for i in range(n - 1)})


def _action_features(n: int) -> dict:  # action 1 has one numeric feature; n - 1 categorical ones
    return with_(decision(), "actions.1.features.categorical", {f"c{i}": "x" for i in range(n - 1)})


#: (id, method, event of size n, field, knob; the unit is bytes for strings, none for counts)
SIZE_CASES = [
    ("event_id", "decision", lambda n: with_(decision(), "event_id", "e" * n), "event_id", "max_id_bytes"),
    ("tenant", "decision", lambda n: with_(decision(), "tenant", "t" * n), "tenant", "max_id_bytes"),
    ("workspace", "decision", lambda n: with_(decision(), "workspace", "w" * n), "workspace", "max_id_bytes"),
    ("domain", "decision", lambda n: with_(decision(), "domain", "d" * n), "domain", "max_id_bytes"),
    ("policy_version", "decision", lambda n: with_(decision(), "policy_version", "1" * n), "policy_version",
     "max_id_bytes"),
    ("action id", "decision", lambda n: with_(decision(), "actions.1.id", "a" * n), "actions[1].id", "max_id_bytes"),
    ("context feature name", "decision",
     lambda n: with_(decision(), "context.numeric", {"prompt_len": 1.0, "n" * n: 2.0}),
     lambda n: f"context.numeric key {errors.show('n' * n)}", "max_string_bytes"),
    ("context categorical name", "decision", lambda n: with_(decision(), "context.categorical", {"c" * n: "code"}),
     lambda n: f"context.categorical key {errors.show('c' * n)}", "max_string_bytes"),
    ("context categorical value", "decision", lambda n: with_(decision(), "context.categorical.task", "v" * n),
     "context.categorical['task']", "max_string_bytes"),
    ("action feature name", "decision", lambda n: with_(decision(), "actions.2.features.numeric", {"k" * n: 1.0}),
     lambda n: f"actions[2].features.numeric key {errors.show('k' * n)}", "max_string_bytes"),
    ("action categorical value", "decision",
     lambda n: with_(decision(), "actions.0.features.categorical", {"tier": "v" * n}),
     "actions[0].features.categorical['tier']", "max_string_bytes"),
    ("context features", "decision", _context_features, "len(context.numeric) + len(context.categorical)",
     "max_features"),
    ("action features", "decision", _action_features,
     "len(actions[1].features.numeric) + len(actions[1].features.categorical)", "max_features"),
    ("context vector", "decision", lambda n: with_(decision(), "context.vector", [0.5] * n), "len(context.vector)",
     "max_vector_dim"),
    ("action vector", "decision", lambda n: with_(decision(), "actions.1.features.vector", [1.0] * n),
     "len(actions[1].features.vector)", "max_vector_dim"),
    ("reward event_id", "reward", lambda n: with_(reward(), "event_id", "e" * n), "event_id", "max_id_bytes"),
    ("reward_id", "reward", lambda n: with_(reward(), "reward_id", "r" * n), "reward_id", "max_id_bytes"),
    ("reward tenant", "reward", lambda n: with_(reward(), "tenant", "t" * n), "tenant", "max_id_bytes"),
    ("reward domain", "reward", lambda n: with_(reward(), "domain", "d" * n), "domain", "max_id_bytes"),
    ("signals", "reward", lambda n: with_(reward(), "signals", {f"s{i}": 1.0 for i in range(n)}), "len(signals)",
     "max_signals"),
    ("signal name", "reward", lambda n: with_(reward(), "signals", {"s" * n: 1.0}),
     lambda n: f"signals key {errors.show('s' * n)}", "max_string_bytes"),
    ("update arm", "update", lambda n: with_(update(), "arm", "a" * n), "arm", "max_id_bytes"),
    ("update feature_hash", "update", lambda n: with_(update(), "feature_hash", "h" * n), "feature_hash",
     "max_id_bytes"),
    ("update action id", "update", lambda n: with_(update(), "actions.1", "m" * n), "actions[1]", "max_id_bytes"),
    ("update features", "update", lambda n: with_(update(), "features", [0.5] * n), "len(features)",
     "max_vector_dim"),
    ("update signals", "update", lambda n: with_(update(), "signals", {f"s{i}": 1.0 for i in range(n)}),
     "len(signals)", "max_signals"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "build", "field", "knob"), [c[1:] for c in SIZE_CASES], ids=[c[0] for c in SIZE_CASES])
def test_each_bounded_field_is_accepted_at_its_limit_and_refused_past_it(method, build, field, knob):
    validator = Validator(SMALL)
    validate = getattr(validator, f"validate_{method}")
    limit = getattr(SMALL, knob)
    at_limit = build(limit)
    assert validate(at_limit) is at_limit

    with pytest.raises(FieldTooLarge) as caught:
        validate(build(limit + 1))
    err = caught.value
    field = field(limit + 1) if callable(field) else field
    unit = " bytes" if knob.endswith("_bytes") else ""
    assert str(err) == f"{field} is {limit + 1}{unit}, the limit is {limit} (limits.{knob})"
    assert (err.field, err.value, err.limit, err.reason) == (field, limit + 1, limit, "field_too_large")
    assert reason_of(err) == "field_too_large"


@pytest.mark.parametrize(("method", "build"), [c[1:3] for c in SIZE_CASES], ids=[c[0] for c in SIZE_CASES])
def test_the_encoded_size_never_changes_the_verdict(method, build):
    """The join passes the encoded size, which proves some limits without looking: the
    verdict must be the one a full check gives, at the limit and past it."""
    validate = getattr(Validator(SMALL), f"validate_{method}")
    serde = AvroSerde(method, framing="single_object")
    for extra in (0, 1):
        event = build(getattr(SMALL, next(c[4] for c in SIZE_CASES if c[2] is build)) + extra)
        verdicts = []
        for size in (None, len(serde.encode(event))):
            try:
                validate(event, encoded_size=size)
                verdicts.append(None)
            except FieldTooLarge as err:
                verdicts.append(str(err))
        assert verdicts[0] == verdicts[1]
        assert (verdicts[0] is None) == (extra == 0)


def test_string_limits_count_utf8_bytes_not_characters():
    validator = Validator(SMALL)
    assert validator.validate_decision(with_(decision(), "context.categorical.task", "é" * 25))  # 50 bytes
    with pytest.raises(FieldTooLarge, match=r"^context.categorical\['task'\] is 52 bytes, the limit is 50"):
        validator.validate_decision(with_(decision(), "context.categorical.task", "é" * 26))
    with pytest.raises(FieldTooLarge, match=r"^event_id is 44 bytes, the limit is 40"):
        validator.validate_decision(with_(decision(), "event_id", "😀" * 11))


def test_a_string_of_nearly_a_megabyte_anywhere_is_refused_by_default():
    """What issue 12 found accepted: ids, names and values as large as the payload limit allows."""
    validator = Validator()
    serde = AvroSerde("decision", framing="single_object")
    big = "x" * 900_000  # with the rest of the event, just under max_payload_bytes
    for path, expected in [
        ("event_id", "event_id is 900000 bytes, the limit is 256 (limits.max_id_bytes)"),
        ("domain", "domain is 900000 bytes, the limit is 256"),
        ("policy_version", "policy_version is 900000 bytes, the limit is 256"),
        ("actions.2.id", "actions[2].id is 900000 bytes, the limit is 256"),
        ("context.categorical.task", "context.categorical['task'] is 900000 bytes, the limit is 1024 (limits.max_string_bytes)"),
        ("context.categorical", "context.categorical key 'xxx"),
        ("actions.0.features.numeric", "actions[0].features.numeric key 'xxx"),
    ]:
        value = {big: "x"} if path.endswith("categorical") else {big: 1.0} if path.endswith("numeric") else big
        event = with_(decision(), path, value)
        with pytest.raises(FieldTooLarge) as caught:
            validator.validate_decision(event, encoded_size=len(serde.encode(event)))
        assert str(caught.value).startswith(expected)
        assert len(str(caught.value)) < 200  # the message names the field, it does not repeat it
    with pytest.raises(FieldTooLarge, match=r"^signals key 'x+\.\.\. is 900000 bytes, the limit is 1024"):
        validator.validate_reward(with_(reward(), "signals", {big: 1.0}))


def test_too_many_actions_use_the_domain_limit_else_the_global_one():
    with pytest.raises(TooManyActions) as caught:
        Validator(SMALL).validate_decision(_many_actions(5))
    assert str(caught.value) == "len(actions) is 5; the limit is 4 (limits.max_actions)"
    assert caught.value.reason == "too_many_actions"
    assert Validator(SMALL).validate_decision(_many_actions(4))
    roomy = ValidationLimits(domains={"llm_routing": DomainLimits(max_actions=6)}, max_actions=4)
    assert Validator(roomy).validate_decision(_many_actions(6))  # the domain's own limit wins
    with pytest.raises(TooManyActions, match="the domain allows at most 6 candidates"):
        Validator(roomy).validate_decision(_many_actions(7))


def test_field_too_large_pickles_and_reads_as_one_line():
    err = FieldTooLarge("actions[3].id", 1 << 20, 256, "max_id_bytes")
    copy_ = pickle.loads(pickle.dumps(err))
    assert type(copy_) is FieldTooLarge and str(copy_) == str(err) and copy_.limit == 256
    assert str(FieldTooLarge("len(signals)", 70, 64, "max_signals", "")) == "len(signals) is 70, the limit is 64 (limits.max_signals)"


# --- configuration of the limits ----------------------------------------------------------------


def test_limits_have_defaults_and_come_from_the_configuration(tmp_path):
    defaults = load_settings(env={}).validation_limits()
    assert (defaults.max_id_bytes, defaults.max_string_bytes, defaults.max_actions, defaults.max_features,
            defaults.max_vector_dim, defaults.max_signals) == (256, 1024, 256, 512, 4096, 64)  # fmt: skip
    assert defaults == ValidationLimits()  # the validator's own defaults are the configuration's
    path = tmp_path / "limits.toml"
    path.write_text("[limits]\nmax_id_bytes = 64\nmax_string_bytes = 128\nmax_features = 32\n")
    env = {"BANDITSTREAM_LIMITS__MAX_SIGNALS": "8", "BANDITSTREAM_LIMITS__MAX_ACTIONS": "10",
           "BANDITSTREAM_LIMITS__MAX_VECTOR_DIM": "384"}  # fmt: skip
    settings = load_settings(path, env=env)
    limits = settings.validation_limits()
    assert (limits.max_id_bytes, limits.max_string_bytes, limits.max_actions, limits.max_features,
            limits.max_vector_dim, limits.max_signals) == (64, 128, 10, 32, 384, 8)  # fmt: skip
    assert settings.worker_config().limits == limits  # what the join and the learner validate with
    with pytest.raises(FieldTooLarge, match="the limit is 64"):
        Validator(limits).validate_decision(with_(decision(), "event_id", "e" * 65))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"BANDITSTREAM_LIMITS__MAX_ID_BYTES": "-1"}, "limits.max_id_bytes: Input should be greater than or equal to 32"),
        ({"BANDITSTREAM_LIMITS__MAX_ID_BYTES": "16"}, "limits.max_id_bytes"),
        ({"BANDITSTREAM_LIMITS__MAX_STRING_BYTES": "0"}, "limits.max_string_bytes: Input should be greater than or equal to 1"),
        ({"BANDITSTREAM_LIMITS__MAX_ACTIONS": "-3"}, "limits.max_actions"),
        ({"BANDITSTREAM_LIMITS__MAX_FEATURES": "2.5"}, "limits.max_features: Input should be a valid integer"),
        ({"BANDITSTREAM_LIMITS__MAX_VECTOR_DIM": "lots"}, "limits.max_vector_dim: Input should be a valid integer"),
        ({"BANDITSTREAM_LIMITS__MAX_SIGNALS": "true"}, "limits.max_signals"),
        ({"BANDITSTREAM_LIMITS__MAX_STRINGS": "10"}, "limits.max_strings: unknown field"),
    ],
)
def test_invalid_limits_give_one_line_naming_the_field(env, expected):
    with pytest.raises(ConfigError) as info:
        load_settings(env=env)
    message = str(info.value)
    assert expected in message and f"from {next(iter(env))}" in message
    assert "\n" not in message


def test_a_boolean_limit_in_a_file_is_refused(tmp_path):
    path = tmp_path / "limits.json"
    path.write_text('{"limits": {"max_features": true}}')
    with pytest.raises(ConfigError, match=r"limits.json: limits.max_features: must be an integer, not a boolean"):
        load_settings(path, env={})


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "256", None])
@pytest.mark.parametrize("name", ["max_id_bytes", "max_string_bytes", "max_actions", "max_features", "max_vector_dim",
                                  "max_signals", "max_payload_bytes"])  # fmt: skip
def test_validation_limits_refuse_what_is_not_a_positive_integer(name, value):
    with pytest.raises(ValueError, match=f"^{name} must be a positive integer, not {re.escape(repr(value))}$"):
        ValidationLimits(**{name: value})
