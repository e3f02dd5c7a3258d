"""One build batch on a tiny team: current and comparator candidates scored by the task reward and
paired, failed comparator episodes unscored and unpaired."""

from __future__ import annotations

import pytest
import torch

from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.preference.comparator import ComparatorConfig, ComparatorSample, build_comparator
from comlrl_lightning.preference.comparator.candidates import build_candidates
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


def test_two_rounds_of_build_replay_and_history_fit_together(tmp_path):
    """The wiring docs/iterative.md plans, without the DPO step (one SGD step stands in for training)."""
    from comlrl_lightning.preference.comparator.history import HistoryComparator
    from comlrl_lightning.preference.replay import PreferenceReplay, ReplayConfig

    torch.manual_seed(0)
    team = Team(
        [AgentSpec("builtin:tiny-gpt2"), AgentSpec("builtin:tiny-gpt2")], SamplingConfig(max_new_tokens=5)
    )
    team.load(with_reference=False)
    env = DecPOMDP(["{prompt} A:", "{prompt} B:"], CountingReward())
    cfg = ComparatorConfig(comparator_policy="history", policy_checkpoint_dir=str(tmp_path / "policies"))
    cmp = build_comparator(cfg, team, seed=1, sampling={})
    assert isinstance(cmp, HistoryComparator)
    replay_cfg = ReplayConfig("all_history", preference_replay_sample_size=6)
    replay = PreferenceReplay(replay_cfg, str(tmp_path / "replay"), seed=2, num_agents=2)
    trained = []
    for r in range(2):
        cmp.begin_round(r)
        pairs = []
        for batch in (EPISODES[:1], EPISODES[1:]):
            pairs += build_candidates(team, env, cmp, batch, 3, 3, "reward_gap", 2).pairs
        replay.add_round(r, pairs)
        trained.append(replay.select(r, pairs))
        with torch.no_grad():  # stands in for the round's training
            for p in team.agents[0].parameters():
                p.add_(0.5)
        cmp.end_round(r)
    assert sorted(p.name for p in (tmp_path / "replay").iterdir()) == ["round_0.jsonl", "round_1.jsonl"]
    assert sorted(p.name for p in (tmp_path / "policies").iterdir()) == ["round_1"]  # k=1 keeps the last
    assert [len(t) for t in trained] == [6, 6] and replay.counts()[0] == 2
    assert all(len(p.chosen) == 2 for t in trained for p in t)
