"""The reward engine: formulas from the issue checked against hand-computed numbers, every
aggregation mode, clipping, defaults, missing signals, invalid config and the expression
parser."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from learner.errors import InvalidReward, RewardExpressionError
from learner.reward import RewardConfig, RewardEngine, parse_expression

AGENT = (
    "2.0*success + 1.0*tool_ok - 0.001*latency_ms - 0.5*cost_usd + 0.4*cache_hit"
    " - 0.7*guardian_flag"
)

# alpha*F + beta*R - gamma*L - delta*C - lambda*P with alpha=1.0, beta=0.5, gamma=0.3,
# delta=0.2, lambda=1.0, L = min(latency_ms/2000, 2), C = min(cost_usd/0.01, 2),
# P = 1 when F or R is below 0.75.
QUALITY = (
    "1.0*F + 0.5*R - 0.3*min(latency_ms/2000, 2) - 0.2*min(cost_usd/0.01, 2)"
    " - 1.0*[F < 0.75 or R < 0.75]"
)
QUALITY_YAML = """
terms:
  - {signal: F, weight: 1.0}
  - {signal: R, weight: 0.5}
  - {signal: latency_ms, weight: -0.3, scale: 2000, cap: 2}
  - {signal: cost_usd, weight: -0.2, scale: 0.01, cap: 2}
gates:
  - {when_below: {F: 0.75, R: 0.75}, penalty: 1.0}
"""


# -- the two formulas of the issue ---------------------------------------------------------


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        # 2 + 1 - 1.2 - 0.01 + 0.4 - 0
        (
            {"success": 1, "tool_ok": 1, "latency_ms": 1200, "cost_usd": 0.02, "cache_hit": 1,
             "guardian_flag": 0},
            2.19,
        ),
        # 0 + 1 - 0.3 - 0.25 + 0 - 0.7
        (
            {"success": 0, "tool_ok": 1, "latency_ms": 300, "cost_usd": 0.5, "cache_hit": 0,
             "guardian_flag": 1},
            -0.25,
        ),
    ],
)
def test_agent_formula_matches_hand_computation(signals, expected):
    engine = RewardEngine(RewardConfig.from_expression(AGENT))
    assert engine.score(signals) == pytest.approx(expected, abs=1e-12)


def test_agent_formula_in_expression_and_dict_form_is_one_config():
    as_dict = RewardConfig.model_validate(
        {
            "terms": [
                {"signal": "success", "weight": 2.0},
                {"signal": "tool_ok", "weight": 1.0},
                {"signal": "latency_ms", "weight": -0.001},
                {"signal": "cost_usd", "weight": -0.5},
                {"signal": "cache_hit", "weight": 0.4},
                {"signal": "guardian_flag", "weight": -0.7},
            ]
        }
    )
    as_expression = RewardConfig.from_expression(AGENT)
    assert as_dict == as_expression
    assert RewardEngine(as_dict).config_hash() == RewardEngine(as_expression).config_hash()


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        # 0.9 + 0.4 - 0.3*0.5 - 0.2*0.5 - 0: all gates pass, nothing capped
        ({"F": 0.9, "R": 0.8, "latency_ms": 1000, "cost_usd": 0.005}, 1.05),
        # 0.9 + 0.3 - 0.3*1.5 - 0.2*0.4 - 1: R below 0.75 fires the gate
        ({"F": 0.9, "R": 0.6, "latency_ms": 3000, "cost_usd": 0.004}, -0.33),
        # 0.8 + 0.45 - 0.3*2 - 0.2*2: latency 5x and cost 10x the budget are capped at 2
        ({"F": 0.8, "R": 0.9, "latency_ms": 10000, "cost_usd": 0.1}, 0.25),
        # 0.7 + 0.35 - 0.3*0.25 - 0.2*0.2 - 1: both below, the penalty still counts once
        ({"F": 0.7, "R": 0.7, "latency_ms": 500, "cost_usd": 0.002}, -0.065),
        # 0.75 + 0.375: a threshold is strict, exactly 0.75 is not below it
        ({"F": 0.75, "R": 0.75, "latency_ms": 0, "cost_usd": 0}, 1.125),
    ],
)
def test_quality_formula_with_caps_and_gate_matches_hand_computation(signals, expected):
    from_expression = RewardEngine(RewardConfig.from_expression(QUALITY))
    from_yaml = RewardEngine(yaml.safe_load(QUALITY_YAML))
    assert from_expression.config == from_yaml.config
    assert from_expression.score(signals) == pytest.approx(expected, abs=1e-12)
    assert from_yaml.score(signals) == pytest.approx(expected, abs=1e-12)


# -- plain values, clipping, defaults, missing signals --------------------------------------


def test_plain_value_is_used_as_is_and_signals_are_ignored():
    engine = RewardEngine(RewardConfig.from_expression(AGENT))
    assert engine.score({"success": 1, "latency_ms": 99999}, value=0.3) == 0.3
    assert engine.score(None, value=-4.5) == -4.5


def test_final_reward_is_clipped_whatever_its_source():
    engine = RewardEngine(RewardConfig.from_expression("1.0*q", clip=(-1, 1)))
    assert engine.score({"q": 5.0}) == 1.0
    assert engine.score({"q": -5.0}) == -1.0
    assert engine.score({"q": 0.25}) == 0.25
    assert engine.score(value=7.0) == 1.0


def test_clipping_applies_after_aggregation_not_per_event():
    engine = RewardEngine(RewardConfig.from_expression("q", clip=(-1, 1), aggregate="mean"))
    events = [
        {"reward_id": "a", "timestamp": 1, "signals": {"q": 3.0}},
        {"reward_id": "b", "timestamp": 2, "signals": {"q": -1.0}},
    ]
    # mean(3, -1) = 1 stays 1; clipping each event first would give mean(1, -1) = 0
    assert engine.aggregate(events).reward == 1.0
    summed = RewardEngine(RewardConfig.from_expression("q", clip=(-1, 1)))
    assert summed.aggregate(events[:1] + [{"reward_id": "c", "timestamp": 3,
                                           "signals": {"q": 0.7}}]).reward == 1.0


def test_no_reward_gives_the_domain_default():
    engine = RewardEngine({"expression": "q", "default_reward": -0.25, "window_s": 120})
    assert engine.default_reward == -0.25
    assert engine.window_s == 120
    assert tuple(engine.aggregate([])) == (-0.25, {}, 0)


def test_default_reward_and_window_have_documented_defaults():
    engine = RewardEngine(RewardConfig())
    assert engine.default_reward == 0.0
    assert engine.window_s == 600.0
    assert engine.config.aggregate == "sum"
    assert engine.score({"anything": 3.0}) == 0.0


def test_missing_signal_takes_the_term_default_before_scaling_and_cap():
    engine = RewardEngine(
        {
            "terms": [
                {"signal": "success", "weight": 2.0},
                {"signal": "latency_ms", "weight": -0.5, "scale": 2000, "cap": 2,
                 "default": 5000},
            ],
            "constant": 0.1,
        }
    )
    # success missing -> 0; latency missing -> 5000/2000 = 2.5, capped to 2: 0.1 + 0 - 1.0
    assert engine.score({}) == pytest.approx(-0.9, abs=1e-12)
    assert engine.score(None) == pytest.approx(-0.9, abs=1e-12)
    # reported signals replace the defaults: 0.1 + 2 - 0.5*0.25
    assert engine.score({"success": 1, "latency_ms": 500}) == pytest.approx(1.975, abs=1e-12)


def test_floor_bounds_a_scaled_signal_from_below():
    engine = RewardEngine(RewardConfig.from_expression("1.0*max(min(delta/10, 1), -1)"))
    assert engine.score({"delta": -50}) == -1.0
    assert engine.score({"delta": 50}) == 1.0
    assert engine.score({"delta": 5}) == 0.5


def test_gate_on_a_missing_signal_passes_by_default_and_fires_when_configured():
    passing = RewardEngine({"gates": [{"when_below": {"quality": 0.5}, "penalty": 2.0}]})
    firing = RewardEngine(
        {"gates": [{"when_below": {"quality": 0.5}, "penalty": 2.0, "when_missing": "fire"}]}
    )
    assert passing.score({}) == 0.0
    assert firing.score({}) == -2.0
    assert passing.score({"quality": 0.4}) == firing.score({"quality": 0.4}) == -2.0
    assert passing.score({"quality": 0.6}) == firing.score({"quality": 0.6}) == 0.0


def test_when_above_gate_penalises_a_raised_safety_flag():
    engine = RewardEngine(
        {"constant": 1.0, "gates": [{"when_above": {"safety_flag": 0.5}, "penalty": 3.0}]}
    )
    assert engine.score({"safety_flag": 1.0}) == -2.0
    assert engine.score({"safety_flag": 0.0}) == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_signal_or_value_is_refused(bad):
    engine = RewardEngine(RewardConfig.from_expression(AGENT))
    with pytest.raises(InvalidReward, match="latency_ms"):
        engine.score({"success": 1, "latency_ms": bad})
    with pytest.raises(InvalidReward, match="value"):
        engine.score(value=bad)
    # a signal no term reads is audit-only and not inspected
    assert engine.score({"success": 1, "unused": bad}) == 2.0
    with pytest.raises(InvalidReward, match="reward 'r2': signal 'cost_usd'"):
        engine.aggregate([{"reward_id": "r1", "timestamp": 1, "signals": {"success": 1}},
                          {"reward_id": "r2", "timestamp": 2, "signals": {"cost_usd": bad}}])


# -- aggregation ---------------------------------------------------------------------------

# Out of order, a timestamp tie (broken by reward_id) and a duplicate reward_id. In order:
# r1 (q=0.5), r2 (q=0.9, lat=100), r3 (q=0.2, lat=300).
EVENTS = [
    {"reward_id": "r3", "timestamp": 30, "signals": {"q": 0.2, "lat": 300.0}},
    {"reward_id": "r1", "timestamp": 10, "signals": {"q": 0.5}},
    {"reward_id": "r2", "timestamp": 30, "signals": {"q": 0.9, "lat": 100.0}},
    {"reward_id": "r1", "timestamp": 10, "signals": {"q": 0.5}},
]


@pytest.mark.parametrize(
    ("mode", "reward", "lat"),
    [
        ("sum", 1.6, 400.0),
        ("first", 0.5, 100.0),
        ("last", 0.2, 300.0),
        ("max", 0.9, 300.0),
        ("min", 0.2, 100.0),
        ("mean", 1.6 / 3, 200.0),
    ],
)
def test_every_aggregation_mode_combines_scalar_rewards_in_time_order(mode, reward, lat):
    engine = RewardEngine(RewardConfig.from_expression("1.0*q", aggregate=mode))
    result = engine.aggregate(EVENTS)
    assert result.count == 3
    assert result.reward == pytest.approx(reward, abs=1e-12)
    # audit signals use the same mode, each over the events that carry it
    assert result.signals["q"] == pytest.approx(reward, abs=1e-12)
    assert result.signals["lat"] == pytest.approx(lat, abs=1e-12)
    assert engine.aggregate(list(reversed(EVENTS))) == result


@pytest.mark.parametrize("mode", ["sum", "first", "last", "max", "min", "mean"])
@pytest.mark.parametrize("value", [None, 0.75, math.inf])
def test_one_reward_aggregates_as_the_general_path_does(mode, value):
    # One event takes a shortcut; the same event twice (one id) takes the general path.
    engine = RewardEngine(RewardConfig.from_expression("2.0*q - 0.001*lat", aggregate=mode, clip=(-1.0, 1.0)))
    event = {"reward_id": "r1", "timestamp": 7, "signals": {"q": 0.8, "lat": 120}, "value": value}
    if value == math.inf:
        for events in ([event], [event, dict(event)]):
            with pytest.raises(InvalidReward, match="r1"):
                engine.aggregate(events)
        return
    one = engine.aggregate([event])
    assert one == engine.aggregate([event, dict(event)])
    assert one.count == 1 and one.signals == {"q": 0.8, "lat": 120.0}
    assert type(one.signals["lat"]) is float


def test_split_reports_sum_to_the_reward_of_all_signals_together():
    engine = RewardEngine(RewardConfig.from_expression(AGENT))
    together = {"success": 1, "tool_ok": 1, "latency_ms": 1200, "cost_usd": 0.02}
    split = [
        {"reward_id": "a", "timestamp": 5, "signals": {"success": 1, "tool_ok": 1}},
        {"reward_id": "b", "timestamp": 9, "signals": {"latency_ms": 1200, "cost_usd": 0.02}},
    ]
    reward, signals, count = engine.aggregate(split)
    assert reward == pytest.approx(engine.score(together), abs=1e-12)
    assert signals == {k: float(v) for k, v in together.items()}
    assert count == 2


def test_aggregation_uses_a_plain_value_as_that_events_reward():
    engine = RewardEngine(RewardConfig.from_expression("1.0*q"))
    events = [
        {"reward_id": "a", "timestamp": 1, "signals": {"q": 0.1}, "value": 1.0},
        {"reward_id": "b", "timestamp": 2, "signals": {"q": 0.3}, "value": None},
    ]
    reward, signals, count = engine.aggregate(events)
    assert reward == pytest.approx(1.3, abs=1e-12)
    assert signals == {"q": pytest.approx(0.4, abs=1e-12)}
    assert count == 2


def test_aggregation_orders_avro_datetimes_like_millis():
    utc = dt.timezone.utc
    engine = RewardEngine(RewardConfig.from_expression("q", aggregate="last"))
    events = [
        {"reward_id": "z", "timestamp": dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=utc),
         "signals": {"q": 1.0}},
        {"reward_id": "a", "timestamp": dt.datetime(2026, 1, 1, 12, 0, 1, tzinfo=utc),
         "signals": {"q": 2.0}},
    ]
    assert engine.aggregate(events).reward == 2.0


# -- batches -------------------------------------------------------------------------------


@pytest.mark.parametrize("expression", [AGENT, QUALITY])
def test_score_batch_equals_score_event_by_event(expression):
    engine = RewardEngine(RewardConfig.from_expression(expression, clip=(-1.5, 1.5)))
    rng = np.random.default_rng(7)
    names = ["success", "tool_ok", "latency_ms", "cost_usd", "cache_hit", "guardian_flag",
             "F", "R"]
    n = 500
    rows, values = [], []
    for _ in range(n):
        row = {name: float(rng.uniform(0, 1) * (5000 if name == "latency_ms" else 1))
               for name in names if rng.random() < 0.8}
        rows.append(row)
        values.append(float(rng.normal()) if rng.random() < 0.1 else None)
    expected = np.array([engine.score(row, value) for row, value in zip(rows, values)])
    np.testing.assert_array_equal(engine.score_batch(rows, values), expected)
    columns = {name: np.array([row.get(name, np.nan) for row in rows]) for name in names}
    value_column = np.array([np.nan if v is None else v for v in values])
    np.testing.assert_array_equal(engine.score_batch(columns, value_column), expected)


def test_score_batch_refuses_infinity_naming_the_row():
    engine = RewardEngine(RewardConfig.from_expression(AGENT))
    with pytest.raises(InvalidReward, match=r"row 2: signal 'latency_ms' is inf"):
        engine.score_batch({"latency_ms": [1.0, np.nan, np.inf]})
    with pytest.raises(InvalidReward, match="row 1"):
        engine.score_batch([{"success": 1}, {"success": math.nan}])
    with pytest.raises(ValueError, match="one length"):
        engine.score_batch({"success": [1.0, 0.0]}, values=[1.0])


# -- invalid config ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "location", "message"),
    [
        ({"terms": [{"signal": "x", "weight": math.nan}]}, ("terms", 0, "weight"), "finite"),
        ({"terms": [{"signal": "x", "weight": 1, "scale": 0}]}, ("terms", 0, "scale"),
         "greater than 0"),
        ({"terms": [{"signal": "x", "weight": 1, "floor": 3, "cap": 2}]}, ("terms", 0),
         "floor 3.0 is above cap 2.0"),
        ({"terms": [{"weight": 1}]}, ("terms", 0, "signal"), "required"),
        ({"gates": [{"penalty": 1}]}, ("gates", 0), "at least one condition"),
        ({"clip": [1, 0]}, ("clip",), "clip min 1.0 is above clip max 0.0"),
        ({"clip": [0, 1], "default_reward": 2}, (), "default_reward 2.0 is outside clip"),
        ({"aggregate": "median"}, ("aggregate",), "'sum', 'first', 'last', 'max', 'min' or 'mean'"),
        ({"window_s": 0}, ("window_s",), "greater than 0"),
        ({"wieghts": {}}, ("wieghts",), "Extra inputs are not permitted"),
        ({"expression": "2*success ** 3"}, ("expression",), "column 12"),
        ({"expression": "q", "terms": []}, (), "either expression or terms"),
    ],
)
def test_invalid_config_names_the_field(config, location, message):
    with pytest.raises(ValidationError) as caught:
        RewardConfig.model_validate(config)
    errors = caught.value.errors()
    assert len(errors) == 1
    assert errors[0]["loc"] == location
    assert message in errors[0]["msg"]


# -- the expression parser -----------------------------------------------------------------


def test_parser_reads_signs_constants_scales_bounds_and_gates():
    parsed = parse_expression(
        "-success + 0.5 + latency_ms/1000*0.25 - 3*min(2, cost/4) + max(x, -1)"
        " - 2*[a < 0.5 | b > 1e2] + 1.5e-1"
    )
    assert parsed["constant"] == pytest.approx(0.65)
    assert parsed["terms"] == [
        {"signal": "success", "weight": -1.0},
        {"signal": "latency_ms", "scale": 1000.0, "weight": 0.25},
        {"signal": "cost", "scale": 4.0, "cap": 2.0, "weight": -3.0},
        {"signal": "x", "floor": -1.0, "weight": 1.0},
    ]
    assert parsed["gates"] == [
        {"when_below": {"a": 0.5}, "when_above": {"b": 100.0}, "penalty": 2.0}
    ]


@pytest.mark.parametrize(
    ("garbage", "column", "reason"),
    [
        ("", 1, "empty"),
        ("2*success ** 3", 12, "expected a number, a signal name"),
        ("success*tool_ok", 9, "products of signals are not linear"),
        ("2*3*success", 3, "one weight"),
        ("exp(latency_ms)", 1, "unknown function 'exp'"),
        ("__import__('os').system('x')", 12, "unexpected character \"'\""),
        ("__import__(os)", 1, "unknown function '__import__'"),
        ("2*success; rm -rf /", 10, "unexpected character ';'"),
        ("2*success +", 12, "found the end"),
        ("latency_ms/0", 12, "positive number"),
        ("min(latency_ms/2000)", 20, "expected ','"),
        ("min(max(x, 3), 2)", 1, "floor 3.0 is above cap 2.0"),
        ("[F < ]", 6, "expected a number"),
        ("[F = 0.75]", 4, "unexpected character '='"),
        ("[F 0.75]", 4, "expected '<' or '>' after 'F'"),
        ("2 success", 3, "expected '+', '-' or the end"),
        ("or*2", 1, "reserved"),
    ],
)
def test_parser_rejects_garbage_pointing_at_the_column(garbage, column, reason):
    with pytest.raises(RewardExpressionError) as caught:
        RewardConfig.from_expression(garbage)
    assert caught.value.column + 1 == column
    assert reason in caught.value.reason
    message = str(caught.value)
    assert f"column {column}:" in message
    assert garbage in message and message.rstrip().endswith("^")


def test_config_hash_is_stable_and_tracks_every_setting():
    first = RewardEngine(RewardConfig.from_expression(QUALITY)).config_hash()
    assert first == RewardEngine(yaml.safe_load(QUALITY_YAML)).config_hash()
    assert len(first) == 16 and int(first, 16) >= 0
    for changed in (
        RewardConfig.from_expression(QUALITY.replace("0.5*R", "0.6*R")),
        RewardConfig.from_expression(QUALITY, clip=(-2, 2)),
        RewardConfig.from_expression(QUALITY, aggregate="last"),
        RewardConfig.from_expression(QUALITY, default_reward=0.1),
    ):
        assert RewardEngine(changed).config_hash() != first
