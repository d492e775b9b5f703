"""Boundary validation: every cause has its typed error, naming the field and the offending value."""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest

from streams import errors
from streams.errors import (
    ChosenOutOfRange,
    EmptyActions,
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
