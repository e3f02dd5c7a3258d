"""Preference pairs from a rollout (preference/selection.py): selection rules and the builder."""

from __future__ import annotations

import random

import pytest
import torch

from comlrl_lightning.preference.selection import (
    PAIR_SELECTION,
    build_preference_pairs,
    select_pair_indices,
)


def test_reward_gap_takes_the_largest_gaps_and_never_pairs_ties():
    rewards = [0.0, 1.0, 1.0, 0.5]
    got = select_pair_indices(rewards, "reward_gap", 3)
    # gaps: (1,0)=1, (2,0)=1, (1,3)=.5, (2,3)=.5, (3,0)=.5; (1,2) is a tie
    assert got == [(1, 0), (2, 0), (1, 3)]
    assert (1, 2) not in select_pair_indices(rewards, "reward_gap", None)
    assert len(select_pair_indices(rewards, "reward_gap", None)) == 5


def test_all_lists_every_non_tied_pair_in_index_order_and_refuses_a_limit():
    assert select_pair_indices([0.2, 0.1, 0.2], "all", None) == [(0, 1), (2, 1)]
    with pytest.raises(ValueError, match="preference_pairs_per_sample: got 2 with pair_selection='all'"):
        select_pair_indices([0.0, 1.0], "all", 2)


def test_random_draws_from_the_given_rng_and_equal_rewards_give_nothing():
    rewards = [3.0, 0.0, 1.0, 2.0]
    a = select_pair_indices(rewards, "random", 4, random.Random(5))
    b = select_pair_indices(rewards, "random", 4, random.Random(5))
    assert a == b and len(a) == 4 and all(rewards[w] > rewards[r] for w, r in a)
    assert a != select_pair_indices(rewards, "reward_gap", 4) or a != select_pair_indices(
        rewards, "random", 4, random.Random(6)
    )
    assert select_pair_indices([1.0] * 5, "random", 3, random.Random(0)) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(pair_selection="best"),
            "pair_selection: got 'best', allowed: ['reward_gap', 'all', 'random', 'comparator_reward']",
        ),
        (dict(pair_selection="comparator_reward"), "pair_selection: got 'comparator_reward', which ranks"),
        (dict(limit=0), "preference_pairs_per_sample: got 0, must be an integer >= 1 or null"),
    ],
)
def test_bad_selection_is_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError) as e:
        select_pair_indices([0.0, 1.0], **kwargs)
    assert message in str(e.value)


def test_builder_pairs_rows_of_the_rollout_with_their_rewards():
    from comlrl_lightning import MAGRPO
    from comlrl_lightning.datamodules import LengthRatioDataModule

    torch.manual_seed(0)
    module = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2)
    module.team.sampling = [type(s)(**{**vars(s), "max_new_tokens": 6}) for s in module.team.sampling]
    module.configure_model()
    dm = LengthRatioDataModule(batch_size=2, num_train=4)
    dm.setup("fit")
    episodes = next(iter(dm.train_dataloader()))
    out = build_preference_pairs(dm.env, episodes, module.team, 5, "reward_gap", 3)
    k = out.num_candidates
    assert k == 5 and out.rewards.shape == (len(episodes), 5)
    per_node = [select_pair_indices(out.rewards[g].tolist(), "reward_gap", 3) for g in range(len(episodes))]
    assert [(i.node, i.chosen, i.rejected) for i in out.index] == [
        (g, w, r) for g, sel in enumerate(per_node) for w, r in sel
    ]
    assert len(out.pairs) == sum(map(len, per_node)) > 0
    assert torch.equal(out.turn.returns, out.turn.rewards)  # one turn: filled for StepOutput.turn_returns
    for pair, ix in zip(out.pairs, out.index):
        for i in range(2):
            texts = out.turn.generations[i].texts
            assert pair.chosen[i] == texts[ix.node * k + ix.chosen]
            assert pair.rejected[i] == texts[ix.node * k + ix.rejected]
            assert pair.prompts[i] == dm.env.observe(episodes[ix.node], i)
        assert pair.chosen_reward == pytest.approx(float(out.rewards[ix.node, ix.chosen]))
        assert pair.reward_gap > 0
        assert pair.episode == episodes[ix.node].data


def test_builder_refuses_one_candidate_before_generating():
    with pytest.raises(ValueError, match="preference_num_candidates: got 1, must be an integer >= 2"):
        build_preference_pairs(None, [], None, 1)  # type: ignore[arg-type]
    # one declaration for one-shot and iterative: the comparator's value is listed but refused here
    assert PAIR_SELECTION.names == ("reward_gap", "all", "random", "comparator_reward")
    with pytest.raises(ValueError, match="pair_selection: got 'comparator_reward'"):
        build_preference_pairs(None, [], None, 2, "comparator_reward")  # type: ignore[arg-type]
