"""A branch that ends solved before the last turn returns an absorbing solved state's value (issue 12 §1).

Every case here is a scripted two-turn tree (K = 2) where joint action 0 is unsolved and continues
and joint action 1 solves the task at turn 0. Before the absorbing return, the solved branch got only
its own reward and ranked below the unsolved one that continued (1.0 vs 1.2, the issue's repro).
"""

import pytest
import torch

from comlrl_lightning import IAC, MAAC, ActorCriticRolloutConfig, CriticConfig
from comlrl_lightning.core.config import AdvantageConfig, RolloutConfig
from comlrl_lightning.core.credit import tree_credit_returns
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.core.rollout import (
    RolloutPlan,
    compute_advantages,
    compute_returns,
    independent_action,
    rollout_tree,
)
from comlrl_lightning.core.td import absorbing_factor, absorbing_rewards
from comlrl_lightning.envs.base import SOLVED, DecPOMDP, Episode

K = 2

MEAN_UNSCALED = AdvantageConfig(advantage_mode="mean", scale_rewards="none", advantage_eps=1e-4)


def close(t, expected):
    torch.testing.assert_close(t.float(), torch.tensor(expected, dtype=torch.float))


class Scripted:
    """Two agents; turn 0: joint action k pays ``turn0[k]``; every later turn pays ``later``."""

    def __init__(self, turn0=(0.2, 1.0), later=1.0, solved_by_transition=False, per_agent=False):
        self.turn0, self.later, self.by_transition, self.per_agent = (
            turn0,
            later,
            solved_by_transition,
            per_agent,
        )

    act = independent_action

    def render(self, agent, node):
        return node.prompts[agent][-1]

    def generate(self, prompts, num_generations, greedy=False):
        gens = []
        for agent_prompts in prompts:
            texts = [f"{p}>{k}" for p in agent_prompts for k in range(num_generations)]
            z, o = torch.zeros(len(texts), 1, dtype=torch.long), torch.ones(len(texts), 1, dtype=torch.long)
            gens.append(Generation(z, o, z, o, texts, torch.zeros(len(texts), dtype=torch.bool)))
        return gens

    def reward(self, joint_actions, episodes, turn):
        out = []
        for texts in joint_actions:
            k = int(texts[0].split(">")[1])
            r = self.turn0[k] if turn == 0 else self.later
            out.append([r, 2 * r] if self.per_agent else r)
        return out

    def transition(self, episode, turn, prompts, completions):
        if self.by_transition and completions[0][-1].endswith(">1"):
            return SOLVED
        return [c[-1] for c in completions]


def tree(script, num_turns=2, discount=1.0, solved_return="absorbing", **stops):
    env = DecPOMDP(["E", "E"], script.reward, script.transition)
    plan = RolloutPlan(K, num_turns, "aligned", **stops)
    turns = rollout_tree(env, [Episode(0)], script, plan)
    compute_returns(turns, discount, solved_return=solved_return)
    compute_advantages(turns, plan, MEAN_UNSCALED, num_agents=2)
    return turns


def test_a_branch_solved_early_ranks_above_one_that_solves_later():
    turns = tree(Scripted(), stop_reward=1.0)
    assert turns[0].child.tolist() == [[0, -1]] and turns[0].solved.tolist() == [[False, True]]
    # unsolved: 0.2 + 1.0; solved at turn 0: 1.0 for this turn and the one left
    close(turns[0].returns, [[1.2, 2.0]])
    assert turns[0].advantages[0][1] > 0 and turns[0].advantages[1][1] > 0


def test_solved_return_reward_keeps_comlrls_own_reward_only():
    turns = tree(Scripted(), stop_reward=1.0, solved_return="reward")
    close(turns[0].returns, [[1.2, 1.0]])  # the ranking the issue reported


def test_the_absorbing_value_is_discounted_over_every_remaining_turn():
    assert (
        absorbing_factor(0, 0.5) == 1.0
        and absorbing_factor(2, 0.5) == 1.75
        and absorbing_factor(2, 1.0) == 3.0
    )
    turns = tree(Scripted(later=1.0), num_turns=3, discount=0.5, stop_reward=1.0)
    assert turns[0].turns_left == 2 and turns[1].turns_left == 1
    solved_at_0 = 1.0 * (1 + 0.5 + 0.25)
    # the unsolved branch solves at turn 1 (reward 1.0 = stop_reward): absorbing over its last turn
    continued = 0.2 + 0.5 * (1.0 * (1 + 0.5))
    close(turns[0].returns, [[continued, solved_at_0]])
    close(turns[1].returns, [[1.5, 1.5]])


def test_termination_threshold_ends_the_node_in_a_solved_state():
    turns = tree(Scripted(turn0=(0.6, 1.0)), termination_threshold=0.5)  # node mean 0.8 > 0.5
    assert len(turns) == 1 and turns[0].solved.tolist() == [[True, True]]
    close(turns[0].returns, [[1.2, 2.0]])


def test_a_transition_that_returns_solved_ends_the_branch_solved():
    turns = tree(Scripted(turn0=(0.2, 0.9), solved_by_transition=True))  # no stop_reward set
    assert turns[0].child.tolist() == [[0, -1]] and turns[0].solved.tolist() == [[False, True]]
    close(turns[0].returns, [[1.2, 1.8]])


def test_an_ordinary_episode_end_pays_nothing_after_it():
    class Ends(Scripted):
        def transition(self, episode, turn, prompts, completions):
            return None if completions[0][-1].endswith(">1") else [c[-1] for c in completions]

    turns = tree(Ends(turn0=(0.2, 0.9)))
    assert turns[0].solved.tolist() == [[False, False]]
    close(turns[0].returns, [[1.2, 0.9]])


def test_per_agent_rewards_are_absorbed_per_agent():
    turns = tree(Scripted(per_agent=True), stop_reward=1.0)  # agent 1's column is twice agent 0's
    close(turns[0].returns, [[[0.2 + 1.0, 0.4 + 2.0], [2.0, 4.0]]])


def test_credit_modes_absorb_every_solved_row_and_keep_the_rest():
    rewards = [torch.tensor([[0.2, 1.0, 1.0, 0.0]]), torch.tensor([[1.0, 1.0]])]  # M = K² rows at turn 0
    child = [torch.tensor([[0, -1]]), torch.full((1, 2), -1)]
    solved = [torch.tensor([[False, True, True, False]]), None]
    out = tree_credit_returns(rewards, child, 1.0, "counterfactual", solved=solved, turns_left=[1, 0])
    # aligned 0 keeps its own future (1.0); swaps without a child get r + mean future (1.0); solved rows 2r
    close(out[0], [[1.2, 2.0, 2.0, 1.0]])
    plain = tree_credit_returns(rewards, child, 1.0, "counterfactual")
    close(plain[0], [[1.2, 1.0, 2.0, 1.0]])


def test_absorbing_rewards_leaves_unsolved_rows_and_the_last_turn_alone():
    r = torch.tensor([[1.0, 2.0]])
    assert absorbing_rewards(r, torch.tensor([[True, False]]), 0, 1.0).tolist() == [[1.0, 2.0]]
    assert absorbing_rewards(r, None, 3, 1.0).tolist() == [[1.0, 2.0]]
    assert absorbing_rewards(r, torch.tensor([[True, False]]), 3, 1.0).tolist() == [[4.0, 2.0]]


def test_the_config_refuses_an_unknown_solved_return():
    with pytest.raises(ValueError, match=r"solved_return: got 'zero', allowed: \['absorbing', 'reward'\]"):
        RolloutConfig(solved_return="zero")


@pytest.mark.parametrize("cls", [IAC, MAAC])
def test_actor_critic_td_target_of_a_solved_joint_action_is_its_absorbing_return(cls, monkeypatch):
    from comlrl_lightning.core.records import Turn

    m = cls(agents="builtin:tiny-gpt2", num_agents=2, critic=CriticConfig(advantage_normalization=False),
            rollout=ActorCriticRolloutConfig(num_generations=2, num_turns=2, discount=0.5))  # fmt: skip
    monkeypatch.setattr(cls, "critic_values", lambda self, c, turn: torch.zeros(2))  # V = 0 everywhere
    t0 = Turn(0, [None], [], [], torch.tensor([[0.2, 1.0]]), {}, torch.tensor([[0, -1]]),
              solved=torch.tensor([[False, True]]), turns_left=1)  # fmt: skip
    t1 = Turn(1, [None], [], [], torch.tensor([[1.0, 1.0]]), {}, torch.full((1, 2), -1))
    m.estimate([t0, t1])
    # unsolved: 0.2 + 0.5·mean V(child) = 0.2; solved: 1.0·(1 + 0.5) (CoMLRL's T = r would give 1.0)
    assert t0.agent_returns[0].tolist() == pytest.approx([0.2, 1.5])
    assert t0.agent_returns[1].tolist() == pytest.approx([0.2, 1.5])
    m.rollout_config.solved_return = "reward"
    m.estimate([t0, t1])
    assert t0.agent_returns[0].tolist() == pytest.approx([0.2, 1.0])
