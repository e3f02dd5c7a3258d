"""Pairing current candidate i with comparator candidate i, by hand-built rewards."""

from __future__ import annotations

import math
import random

import pytest

from comlrl_lightning.preference.comparator import comparison_order, pair_with_comparator, pairs_for_batch

CUR = [0.9, 0.2, 0.5, 0.5, 0.1]
CMP = [0.1, 0.8, 0.5, 0.3, 0.4]
# i:  gap   winner      comparator reward
# 0:  0.8   current     0.1
# 1:  0.6   comparator  0.8
# 2:  tie   -           -
# 3:  0.2   current     0.3
# 4:  0.3   comparator  0.4


def idx(order):
    return [(w[1], w[0][:3]) for w, _ in order]


def test_ties_form_no_pair_and_the_higher_reward_is_chosen():
    order = comparison_order(CUR, CMP, "all", None)
    assert idx(order) == [(0, "cur"), (1, "com"), (3, "cur"), (4, "com")]
    assert all(w[1] == r[1] and {w[0], r[0]} == {"current", "comparator"} for w, r in order)


@pytest.mark.parametrize(
    "mode, limit, expected",
    [
        ("reward_gap", None, [0, 1, 4, 3]),
        ("reward_gap", 2, [0, 1]),
        ("comparator_reward", None, [1, 4, 3, 0]),
        ("comparator_reward", 3, [1, 4, 3]),
        ("all", 1, [0, 1, 3, 4]),  # `all` ignores the limit
    ],
)
def test_selection_orders(mode, limit, expected):
    assert [w[1] for w, _ in comparison_order(CUR, CMP, mode, limit)] == expected


def test_comparator_reward_breaks_ties_by_the_larger_gap():
    cur, cmp = [0.9, 0.1, 0.6], [0.5, 0.5, 0.5]  # equal comparator rewards, gaps 0.4, 0.4, 0.1
    assert [w[1] for w, _ in comparison_order(cur, cmp, "comparator_reward", None)] == [0, 1, 2]
    cur = [0.6, 0.9]
    assert [w[1] for w, _ in comparison_order(cur, [0.5, 0.5], "comparator_reward", None)] == [1, 0]


def test_random_is_the_seeded_generators_shuffle():
    got = [w[1] for w, _ in comparison_order(CUR, CMP, "random", 3, random.Random(5))]
    expected = [0, 1, 3, 4]
    random.Random(5).shuffle(expected)
    assert got == expected[:3]
    with pytest.raises(ValueError, match="needs the caller's seeded random.Random"):
        comparison_order(CUR, CMP, "random", 3)


def test_non_finite_rewards_and_unequal_counts():
    assert [w[1] for w, _ in comparison_order([math.nan, 1.0, 2.0], [0.0, math.inf, 1.0], "all", None)] == [2]
    assert len(comparison_order([1.0] * 5, [0.0] * 3, "all", None)) == 3  # min(K, K') candidates


def test_bad_selection_is_refused_with_the_allowed_values():
    with pytest.raises(
        ValueError, match=r"pair_selection: got 'best', allowed: \['reward_gap', 'all', 'random'"
    ):
        comparison_order(CUR, CMP, "best", None)


def test_pairs_carry_each_agents_texts_of_the_same_joint_response():
    cur = [["c0a", "c1a"], ["c0b", "c1b"]]  # [N=2][K=2]
    cmp = [["m0a", "m1a"], ["m0b", "m1b"]]
    pairs = pair_with_comparator(
        ["pa", "pb"], cur, [1.0, 0.0], cmp, [0.5, 0.7], "reward_gap", None, episode={"id": 3}
    )
    assert [(p.chosen, p.rejected, p.chosen_reward, p.rejected_reward) for p in pairs] == [
        (["m1a", "m1b"], ["c1a", "c1b"], 0.7, 0.0),
        (["c0a", "c0b"], ["m0a", "m0b"], 1.0, 0.5),
    ]
    assert pairs[0].prompts == ["pa", "pb"] and pairs[0].episode == {"id": 3}


def test_batch_pairs_skip_episodes_whose_comparator_failed():
    prompts = [["e0", "e1"], ["f0", "f1"]]  # [N][B=2]
    cur = [["a", "b", "c", "d"], ["A", "B", "C", "D"]]  # K=2
    cmp = [["w", "x", "y", "z"], ["W", "X", "Y", "Z"]]
    rewards_cur, rewards_cmp = [1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]
    both = pairs_for_batch(prompts, cur, rewards_cur, cmp, rewards_cmp, 2, 2, "all", None)
    assert [(p.prompts[0], p.chosen[0], p.rejected[0]) for p in both] == [
        ("e0", "a", "w"),
        ("e0", "x", "b"),
        ("e1", "c", "y"),
        ("e1", "z", "d"),
    ]
    one = pairs_for_batch(prompts, cur, rewards_cur, cmp, rewards_cmp, 2, 2, "all", None, ok=[False, True])
    assert [p.prompts[0] for p in one] == ["e1", "e1"]
