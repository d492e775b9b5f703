"""banditstream.playground: what it refuses before starting anything (the loop itself, gated
domains included, runs in tests/test_examples.py, through the examples that use it)."""

from __future__ import annotations

import pytest

from banditstream.playground import EventClock, Playground, PlaygroundError


def test_a_playground_without_domains_is_refused_by_name():
    with pytest.raises(PlaygroundError, match="at least one domain"):
        Playground({})


def test_an_unknown_domain_is_named_with_the_ones_there_are(tmp_path):
    loop = Playground({"router": {}}, workdir=tmp_path)
    loop.deciders["router"] = object()  # as after start-up, without a broker
    with pytest.raises(PlaygroundError, match=r"no domain 'ranker' here \(domains: router\)"):
        loop.decider("ranker")


def test_the_event_clock_stamps_exactly_the_set_milliseconds():
    clock = EventClock()
    for ms in (1_800_000_000_123, 1_764_000_000_001, 999):  # decide() stamps int(clock() * 1000)
        clock.ms = ms
        assert int(clock() * 1000) == ms


def test_a_gated_domain_is_known_by_its_canary_share_and_the_gate_refuses_an_ungated_one(tmp_path):
    loop = Playground({"router": {}, "tuner": {"promotion": {"canary_share": 0.1}}}, workdir=tmp_path)
    assert loop.gated == {"tuner"} and loop.verdicts == {"tuner": []}
    loop.deciders.update(router=object(), tuner=object())  # as after start-up, without a broker
    for step in (loop.gate, loop.release, loop.reset):
        with pytest.raises(PlaygroundError, match=r"router is not gated \(give it a promotion.canary_share above 0\)"):
            step("router")
