"""banditstream.playground: what it refuses before starting anything (the loop itself runs in
tests/test_examples.py, through the examples that use it)."""

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
