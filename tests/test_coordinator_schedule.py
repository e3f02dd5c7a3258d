"""Coordinator schedule policies: which learner trains at which round (pure functions)."""

import pytest

from comlrl_lightning.coordinator.schedule import (
    Alternate,
    EveryN,
    EveryRound,
    RoundRobin,
    WarmupFreeze,
    schedule_table,
    scheduled,
)  # fmt: skip

ABC = ["a", "b", "c"]


def test_alternate_trains_one_learner_per_block_of_period_rounds_in_order():
    table = schedule_table(Alternate(period=2), ABC, 7)
    assert table == [["a"], ["a"], ["b"], ["b"], ["c"], ["c"], ["a"]]


def test_round_robin_cycles_through_every_learner_one_round_each():
    assert schedule_table(RoundRobin(), ABC, 4) == [["a"], ["b"], ["c"], ["a"]]


def test_every_round_trains_all_learners():
    assert schedule_table(EveryRound(), ABC, 2) == [ABC, ABC]


def test_every_n_trains_each_learner_on_its_own_period_from_its_offset():
    table = schedule_table(EveryN(every={"b": 3, "c": 2}, offset={"b": 1, "c": 2}), ABC, 6)
    assert table == [["a"], ["a", "b"], ["a", "c"], ["a"], ["a", "b", "c"], ["a"]]


def test_warmup_freeze_keeps_a_learner_to_its_window_of_the_inner_schedule():
    policy = WarmupFreeze(inner=EveryRound(), start={"b": 2}, stop={"a": 3})
    table = schedule_table(policy, ["a", "b"], 5)
    assert table == [["a"], ["a"], ["a", "b"], ["b"], ["b"]]


def test_warmup_freeze_composes_with_alternate():
    policy = WarmupFreeze(inner=Alternate(), start={"a": 2})
    assert schedule_table(policy, ["a", "b"], 5) == [[], ["b"], ["a"], ["b"], ["a"]]


def test_a_user_callable_schedule_is_accepted_and_checked():
    assert scheduled(lambda r, names: names[: r % 3], 2, ABC) == {"a", "b"}
    with pytest.raises(ValueError, match=r"unknown learner\(s\) \['z'\]"):
        scheduled(lambda r, names: ["z"], 0, ABC)
    with pytest.raises(TypeError, match="string 'ab'"):
        scheduled(lambda r, names: "ab", 0, ABC)


@pytest.mark.parametrize("make, message", [
    (lambda: Alternate(period=0), "Alternate.period: got 0"),
    (lambda: EveryN(every={"a": 0}), r"EveryN.every\['a'\]: got 0"),
    (lambda: EveryN(offset={"a": -1}), r"EveryN.offset\['a'\]: got -1"),
    (lambda: WarmupFreeze(start={"a": 3}, stop={"a": 3}), r"WarmupFreeze.stop\['a'\]: got 3"),
])  # fmt: skip
def test_bad_policy_values_are_refused_with_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_policy_naming_an_unknown_learner_is_refused():
    with pytest.raises(ValueError, match=r"EveryN.every: unknown learner\(s\) \['x'\]"):
        scheduled(EveryN(every={"x": 2}), 0, ABC)
