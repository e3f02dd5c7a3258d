"""Hand-built two-turn trees: returns, generate/reward call counts, transition order."""

import pytest
import torch

from comlrl_lightning.core.config import AdvantageConfig, RolloutConfig
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.core.rollout import (
    RolloutPlan,
    compute_advantages,
    compute_returns,
    independent_action,
    rollout_tree,
)
from comlrl_lightning.envs.base import DecPOMDP, Episode

K = 2

MEAN_UNSCALED = AdvantageConfig(advantage_mode="mean", scale_rewards="none", advantage_eps=1e-4)


def path(text):
    """'E>01>11' -> [1, 1]: the sample index the agent drew at each turn."""
    return [int(seg[1]) for seg in text.split(">")[1:]]


class Recorder:
    def __init__(self):
        self.generate_calls, self.reward_calls, self.transitions = [], [], []

    act = independent_action

    def render(self, agent, node):
        return node.prompts[agent][-1]

    def generate(self, prompts, num_generations, greedy=False):
        assert num_generations == K and not greedy
        self.generate_calls.append([len(p) for p in prompts])
        gens = []
        for i, agent_prompts in enumerate(prompts):
            texts = [f"{p}>{i}{k}" for p in agent_prompts for k in range(K)]
            rows = len(texts)
            gens.append(Generation(torch.zeros(rows, 1, dtype=torch.long), torch.ones(rows, 1, dtype=torch.long),
                                   torch.zeros(rows, 1, dtype=torch.long), torch.ones(rows, 1, dtype=torch.long),
                                   texts, torch.zeros(rows, dtype=torch.bool)))  # fmt: skip
        return gens

    def reward(self, joint_actions, episodes, turn):
        self.reward_calls.append((turn, len(joint_actions)))
        out = []
        for a_text, b_text in joint_actions:
            a, b = path(a_text), path(b_text)
            if turn == 0:
                out.append(a[0] + 2 * b[0] + 1.0)
            else:
                parent = a[0] * K + b[0]
                out.append(10.0 * (parent + 1) + a[1] + b[1])
        return out

    def transition(self, episode, turn, prompts, completions):
        self.transitions.append(
            (episode.index, turn, [list(p) for p in prompts], [list(c) for c in completions])
        )
        return [c[-1] for c in completions]  # next prompt = own last completion (keeps the path)


def make(rec):
    return DecPOMDP(["E", "E"], rec.reward, rec.transition)


def run(mode, discount=0.5, threshold=None, episodes=1, comlrl_threshold=None):
    rec = Recorder()
    plan = RolloutPlan(K, 2, mode, stop_reward=threshold, termination_threshold=comlrl_threshold)
    levels = rollout_tree(make(rec), [Episode(i) for i in range(episodes)], rec, plan)
    compute_returns(levels, discount)
    compute_advantages(levels, plan, MEAN_UNSCALED, num_agents=2)
    return rec, levels


def test_aligned_two_turn_returns_are_discounted_means_of_children():
    rec, levels = run("aligned")
    # turn 0: joint (k,k) reward 3k+1 -> [1, 4]; children of parent p=(k,k): 10*(3k+1) + 2k'
    assert levels[0].rewards.tolist() == [[1.0, 4.0]]
    assert levels[1].rewards.tolist() == [[10.0, 12.0], [40.0, 42.0]]
    assert levels[1].returns.tolist() == levels[1].rewards.tolist()
    assert levels[0].returns.tolist() == [[1 + 0.5 * 11, 4 + 0.5 * 41]]
    assert rec.generate_calls == [[1, 1], [2, 2]]  # one generate per agent per turn, batched over nodes
    assert rec.reward_calls == [(0, 2), (1, 4)]


def test_cross_two_turn_returns_and_per_agent_sample_returns():
    rec, levels = run("cross")
    # turn 0 joint (a,b): a + 2b + 1 in order (0,0),(0,1),(1,0),(1,1)
    assert levels[0].rewards.tolist() == [[1.0, 3.0, 2.0, 4.0]]
    child_means = [10.0 * (j + 1) + 1 for j in range(4)]
    expected = [r + 0.5 * m for r, m in zip([1.0, 3.0, 2.0, 4.0], child_means)]
    assert levels[0].returns.tolist() == [expected]  # [6.5, 13.5, 17.5, 24.5]
    # agent 0 sample a averages joint actions (a, 0) and (a, 1); agent 1 sample b averages (0, b), (1, b)
    assert levels[0].agent_returns[0].tolist() == [(6.5 + 13.5) / 2, (17.5 + 24.5) / 2]
    assert levels[0].agent_returns[1].tolist() == [(6.5 + 17.5) / 2, (13.5 + 24.5) / 2]
    assert levels[0].advantages[0].tolist() == [-5.5, 5.5]
    assert rec.generate_calls == [[1, 1], [4, 4]]
    assert rec.reward_calls == [(0, 4), (1, 16)]


def test_transition_sees_each_agents_own_history_in_order():
    rec, _ = run("aligned", episodes=2)
    assert [(e, t) for e, t, _, _ in rec.transitions] == [(0, 0), (0, 0), (1, 0), (1, 0)]
    ep, turn, prompts, completions = rec.transitions[1]
    assert prompts == [["E"], ["E"]]
    assert completions == [["E>01"], ["E>11"]]  # joint action k=1: each agent's own completion


def test_stop_reward_ends_a_branch():
    rec, levels = run("aligned", threshold=4.0)
    assert levels[1].rewards.shape == (1, 2)  # only joint action k=0 (reward 1) continues
    assert levels[0].child.tolist() == [[0, -1]]
    # the solved branch (reward 4 >= 4) is absorbing: 4 this turn and 0.5·4 for the one left
    assert levels[0].returns.tolist() == [[1 + 0.5 * 11, 4.0 * 1.5]]
    assert levels[0].solved.tolist() == [[False, True]]


def test_comlrl_termination_threshold_stops_a_node_whose_mean_reward_exceeds_it():
    # turn-0 rewards of the aligned joint actions are 1 and 4: node mean 2.5
    _, levels = run("aligned", comlrl_threshold=2.0)
    assert len(levels) == 1 and levels[0].child.tolist() == [[-1, -1]]
    _, levels = run("aligned", comlrl_threshold=2.5)  # strict >, as in CoMLRL
    assert len(levels) == 2 and levels[0].child.tolist() == [[0, 1]]


def test_budget_counts_the_full_tree():
    assert RolloutConfig(num_generations=4, num_turns=1).generations_per_episode(2) == 8
    assert RolloutConfig(num_generations=2, num_turns=2).generations_per_episode(2) == 2 * 2 * (1 + 2)
    assert RolloutConfig(num_generations=2, num_turns=2, joint_mode="cross").generations_per_episode(
        2
    ) == 2 * 2 * (1 + 4)


def test_wrong_prompt_count_from_transition_is_an_error():
    env = DecPOMDP(["E", "E"], Recorder().reward, lambda *a: ["only one"])
    with pytest.raises(ValueError, match="returned 1 prompts for 2 agents"):
        env.transition(Episode(0), 0, [["E"], ["E"]], [["x"], ["y"]])
