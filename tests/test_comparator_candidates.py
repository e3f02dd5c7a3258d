"""One build batch on a tiny team: current and comparator candidates scored by the task reward and
paired, failed comparator episodes unscored and unpaired."""

from __future__ import annotations

import pytest
import torch

from comlrl_lightning.comparator import ComparatorConfig, ComparatorSample, build_comparator
from comlrl_lightning.comparator.candidates import build_candidates
from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.team.agents import AgentSpec
from comlrl_lightning.team.team import Team

EPISODES = [Episode(0, {"prompt": "12+7="}), Episode(1, {"prompt": "3*4="})]


class CountingReward:
    """Reward = len(agent 0's text) mod 3 (coarse: ties happen); records every joint action scored."""

    name = "mod3"

    def __init__(self):
        self.seen = []

    def __call__(self, joint_actions, episodes, turn):
        self.seen += [(ep.index, tuple(ja)) for ja, ep in zip(joint_actions, episodes)]
        return [float(len(ja[0]) % 3) for ja in joint_actions]


class FixedComparator:
    """A comparator whose texts and failures are given (the protocol, nothing else)."""

    def __init__(self, texts, ok):
        self.texts, self.ok = texts, ok

    def sample(self, prompts, num_candidates, episodes=None):
        return ComparatorSample(self.texts, self.ok, num_candidates)


@pytest.fixture(scope="module")
def team():
    torch.manual_seed(0)
    t = Team(
        [AgentSpec("builtin:tiny-gpt2"), AgentSpec("builtin:tiny-gpt2")], SamplingConfig(max_new_tokens=5)
    )
    t.load(with_reference=False)
    return t


def test_pairs_are_ordered_by_the_task_reward_of_each_side(team):
    reward = CountingReward()
    env = DecPOMDP(["{prompt} A:", "{prompt} B:"], reward)
    cmp = build_comparator(ComparatorConfig(), team, seed=1, sampling={})
    torch.manual_seed(3)
    batch = build_candidates(team, env, cmp, EPISODES, 4, 4, "all", None)
    assert batch.current_rewards.shape == (8,) and batch.comparator_rewards.shape == (8,)
    assert batch.samples == 16 and len(reward.seen) == 16
    expected = sum(
        int(batch.current_rewards[r] != batch.comparator_rewards[r]) for r in range(8)
    )  # one pair per non-tied index
    assert len(batch.pairs) == expected > 0
    for p in batch.pairs:
        assert p.chosen_reward > p.rejected_reward
        assert p.chosen_reward == len(p.chosen[0]) % 3 and p.rejected_reward == len(p.rejected[0]) % 3
        assert p.prompts[0].endswith(" A:") and p.prompts[1].endswith(" B:")
    assert {p.episode["prompt"] for p in batch.pairs} <= {"12+7=", "3*4="}


def test_a_failed_comparator_episode_is_neither_scored_nor_paired(team):
    reward = CountingReward()
    env = DecPOMDP(["{prompt}", "{prompt}"], reward)
    texts = [["a", "abcd", "", ""], ["x", "y", "", ""]]  # K'=2; episode 1 failed
    batch = build_candidates(team, env, FixedComparator(texts, [True, False]), EPISODES, 2, 2, "all", None)
    assert [ep for ep, _ in reward.seen[4:]] == [0, 0]  # the comparator side of episode 0 only
    assert torch.isnan(batch.comparator_rewards[2:]).all()
    assert all(p.episode["prompt"] == "12+7=" for p in batch.pairs)


def test_per_agent_rewards_are_refused_naming_why():
    class PerAgent:
        name = "per_agent"

        def __call__(self, joint_actions, episodes, turn):
            return [[1.0, 0.0] for _ in joint_actions]

    env = DecPOMDP(["{prompt}", "{prompt}"], PerAgent())
    team = type("T", (), {"tokenizers": [None, None], "specs": [AgentSpec("x")] * 2})()
    team.generate = lambda prompts, k: [type("G", (), {"texts": ["t"] * len(prompts[0]) * k})()] * 2
    with pytest.raises(ValueError, match="need one shared reward per joint action"):
        build_candidates(
            team, env, FixedComparator([["a"] * 2] * 2, [True, True]), EPISODES, 1, 1, "all", None
        )
