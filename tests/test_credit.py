"""Counterfactual and cross-rewards credit (core/credit.py) on hand-built reward tables and trees."""

import math

import pytest
import torch

from comlrl_lightning.core.advantages import group_advantages, scale_by_std
from comlrl_lightning.core.credit import (
    check_reward_call_budget,
    counterfactual_advantages,
    credit_index,
    cross_rewards_advantages,
    reward_calls_per_episode,
    step_advantages,
    tree_credit_returns,
)
from comlrl_lightning.envs.toy import TeamTargetsReward


def _rewards(index, fn):
    """One node's rewards ``[1, M]`` in the index's row order, from a table ``fn(*samples)``."""
    return torch.tensor([[float(fn(*row.tolist())) for row in index.joint_index]])


# agent 0 plays the row, agent 1 the column
TABLE_N2 = [[1.0, 0.0, 2.0], [3.0, 5.0, 1.0], [0.0, 4.0, 6.0]]


def test_counterfactual_two_agents_three_samples_by_hand():
    idx = credit_index(2, 3, "counterfactual")
    adv, _ = counterfactual_advantages(_rewards(idx, lambda a, b: TABLE_N2[a][b]), idx, "mean")
    # aligned returns R(k,k) = 1, 5, 6; agent 0 swaps its own sample: column means 4/3, 3, 3
    assert torch.allclose(adv[0], torch.tensor([[1 - 4 / 3, 5 - 3.0, 6 - 3.0]]))
    # agent 1 swaps its own sample: row means 1, 3, 10/3
    assert torch.allclose(adv[1], torch.tensor([[1 - 1.0, 5 - 3.0, 6 - 10 / 3]]))


def test_counterfactual_three_agents_three_samples_by_hand():
    idx = credit_index(3, 3, "counterfactual")
    adv, _ = counterfactual_advantages(_rewards(idx, lambda a, b, c: a * a + b * c), idx, "mean")
    # aligned R(k,k,k) = 2k^2 = 0, 2, 8
    # agent 0: mean_a' (a'^2 + k^2) = 5/3 + k^2 ; agents 1 and 2: mean_b' (k^2 + b' k) = k^2 + k
    assert torch.allclose(adv[0], torch.tensor([[-5 / 3, 2 - 8 / 3, 8 - 17 / 3]]))
    assert torch.allclose(adv[1], torch.tensor([[0.0, 0.0, 2.0]]))
    assert torch.allclose(adv[2], torch.tensor([[0.0, 0.0, 2.0]]))


def test_counterfactual_removes_the_teammates_luck():
    # additive team: agent 1's term must not leak into agent 0's advantage (the shared mean baseline leaks it)
    own, mate = [0.0, 1.0, 0.0, 3.0], [10.0, -4.0, 7.0, 0.0]
    idx = credit_index(2, 4, "counterfactual")
    adv, _ = counterfactual_advantages(_rewards(idx, lambda a, b: own[a] + mate[b]), idx, "mean")
    assert torch.allclose(adv[0], torch.tensor([own]) - 1.0)
    shared = group_advantages(torch.tensor([[own[k] + mate[k] for k in range(4)]]), "mean", "none")
    assert not torch.allclose(shared, adv[0])


def test_counterfactual_rloo_baseline_leaves_the_own_sample_out():
    idx = credit_index(2, 3, "counterfactual")
    adv, _ = counterfactual_advantages(_rewards(idx, lambda a, b: TABLE_N2[a][b]), idx, "rloo")
    # agent 0, k=0: R(0,0)=1 against the other swaps R(1,0)=3, R(2,0)=0 -> 1 - 1.5
    assert torch.allclose(adv[0][0, 0], torch.tensor(-0.5))
    # agent 1, k=2: R(2,2)=6 against R(2,0)=0, R(2,1)=4 -> 6 - 2
    assert torch.allclose(adv[1][0, 2], torch.tensor(4.0))


def test_counterfactual_scores_are_each_agents_swap_table():
    idx = credit_index(2, 3, "counterfactual")
    _, scores = counterfactual_advantages(_rewards(idx, lambda a, b: TABLE_N2[a][b]), idx, "mean")
    # agent 0, teammates at k: row k of its table is column k of TABLE_N2
    assert scores[0].view(3, 3).tolist() == [[TABLE_N2[a][k] for a in range(3)] for k in range(3)]
    assert scores[1].view(3, 3).tolist() == TABLE_N2


def test_counterfactual_with_one_agent_is_the_mean_baseline():
    idx = credit_index(1, 4, "counterfactual")
    r = torch.tensor([[1.0, 2.0, 3.0, 6.0]])
    adv, _ = counterfactual_advantages(r, idx, "mean")
    assert torch.allclose(adv[0], group_advantages(r, "mean", "none"))


@pytest.mark.parametrize(
    "num_agents,k,credit,calls",
    [
        (2, 3, "shared", 3),
        (1, 4, "counterfactual", 4),  # nothing to swap
        (2, 3, "counterfactual", 9),  # agent 0's and agent 1's swaps are the same off-diagonal cells
        (3, 3, "counterfactual", 21),  # 3 aligned + 3 agents x 3 x 2 swaps
        (4, 2, "counterfactual", 10),  # 2 + 4 x 2 x 1
        (3, 3, "cross_rewards", 27),
    ],
)
def test_reward_calls_per_node(num_agents, k, credit, calls):
    idx = credit_index(num_agents, k, credit)
    assert idx.num_reward_calls == calls
    assert len({tuple(r) for r in idx.joint_index.tolist()}) == calls  # each joint action scored once
    assert idx.joint_index[:k].tolist() == [[j] * num_agents for j in range(k)]  # aligned rows first


def test_reward_calls_per_episode_count_only_the_aligned_expansion():
    # two turns, K=3: 1 + 3 nodes; counterfactual N=2 costs 9 calls per node
    assert reward_calls_per_episode(2, 3, 2, "counterfactual") == 36
    assert reward_calls_per_episode(2, 3, 2, "cross_rewards") == 36
    assert reward_calls_per_episode(3, 2, 3, "shared") == 2 * (1 + 2 + 4)


def test_reward_call_budget_is_refused_with_the_field_named():
    check_reward_call_budget(3, 3, 1, "counterfactual", 21)
    with pytest.raises(ValueError, match=r"21 reward calls.*max_reward_calls_per_episode=20"):
        check_reward_call_budget(3, 3, 1, "counterfactual", 20)
    with pytest.raises(ValueError, match="credit: got 'difference'"):
        credit_index(2, 2, "difference")


def _two_turn_tree():
    # N=2, K=2; rows: (0,0), (1,1), (0,1), (1,0). Turn 0 has one node, both aligned joint actions expand.
    turn0 = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    turn1 = torch.tensor([[2.0, 4.0, 1.0, 1.0], [0.0, 2.0, 5.0, 5.0]])
    child = [torch.tensor([[0, 1]]), torch.full((2, 2), -1)]
    return [turn0, turn1], child


def test_cross_rewards_returns_on_a_two_turn_tree():
    rewards, child = _two_turn_tree()
    ret = tree_credit_returns(rewards, child, 0.5, "cross_rewards")
    assert torch.equal(ret[1], rewards[1])  # leaves: the reward
    # child values: mean of their aligned returns (2+4)/2 = 3 and (0+2)/2 = 1 -> C = 2; every row + 0.5*2
    assert torch.allclose(ret[0], torch.tensor([[2.0, 3.0, 4.0, 1.0]]))
    idx = credit_index(2, 2, "cross_rewards")
    adv, scores = cross_rewards_advantages(ret[0], idx, 2, "mean")
    # agent 0: sample 0 in (0,0),(0,1) -> (2+4)/2 = 3; sample 1 in (1,1),(1,0) -> 2
    assert torch.allclose(scores[0], torch.tensor([[3.0, 2.0]]))
    assert torch.allclose(adv[0], torch.tensor([[0.5, -0.5]]))
    # agent 1: sample 0 in (0,0),(1,0) -> 1.5; sample 1 in (1,1),(0,1) -> 3.5
    assert torch.allclose(adv[1], torch.tensor([[-1.0, 1.0]]))


def test_counterfactual_returns_keep_the_actual_future_on_a_two_turn_tree():
    rewards, child = _two_turn_tree()
    ret = tree_credit_returns(rewards, child, 0.5, "counterfactual")
    # aligned rows: own child 1 + 0.5*3, 2 + 0.5*1; swapped rows: r + 0.5 * mean child value 2
    assert torch.allclose(ret[0], torch.tensor([[2.5, 2.5, 4.0, 1.0]]))


def test_shared_credit_tree_returns_are_magrpo_returns():
    rewards, child = _two_turn_tree()
    ret = tree_credit_returns([rewards[0][:, :2], rewards[1][:, :2]], child, 0.5, "shared")
    assert torch.allclose(ret[0], torch.tensor([[1 + 0.5 * 3, 2 + 0.5 * 1]]))


def test_ended_branches_add_no_future():
    # joint action 1 ended (solved): its return is its reward; swapped rows average only the live child
    rewards = [torch.tensor([[1.0, 2.0, 3.0, 0.0]]), torch.tensor([[2.0, 4.0, 1.0, 1.0]])]
    child = [torch.tensor([[0, -1]]), torch.full((1, 2), -1)]
    ret = tree_credit_returns(rewards, child, 1.0, "counterfactual")
    assert torch.allclose(ret[0], torch.tensor([[1 + 3.0, 2.0, 3 + 3.0, 0 + 3.0]]))


# ----------------------------------------------------------------- agent-wise normalisation (advantages.py)
SCORES = [torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[0.0, 0.2], [0.0, 0.0]])]


def _mean_adv(scores):
    return [group_advantages(s, "mean", "none") for s in scores]


def test_group_scale_per_node_and_agent_is_group_advantages():
    out = scale_by_std(_mean_adv(SCORES), SCORES, "group")
    for s, o in zip(SCORES, out):
        assert torch.allclose(o, group_advantages(s, "mean", "group"))
    assert out[1][1].tolist() == [0.0, 0.0]  # all-equal group: exactly 0


def test_batch_scale_per_agent_uses_each_agents_batch_std():
    out = scale_by_std(_mean_adv(SCORES), SCORES, "batch", agent_wise=True)
    std0 = math.sqrt(
        ((1 - 4) ** 2 + (3 - 4) ** 2 + (5 - 4) ** 2 + (7 - 4) ** 2) / 3
    )  # unbiased, [1, 3, 5, 7]
    assert torch.allclose(out[0], torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]) / (std0 + 1e-4))
    std1 = torch.tensor([0.0, 0.2, 0.0, 0.0]).std().item()
    assert torch.allclose(out[1], torch.tensor([[-0.1, 0.1], [0.0, 0.0]]) / (std1 + 1e-4))


def test_batch_scale_for_the_team_pools_every_agents_scores():
    out = scale_by_std(_mean_adv(SCORES), SCORES, "batch", agent_wise=False)
    pooled = torch.tensor([1.0, 3.0, 5.0, 7.0, 0.0, 0.2, 0.0, 0.0]).std().item()
    assert torch.allclose(out[0], torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]) / (pooled + 1e-4))
    # the quiet agent's advantages stay tiny next to its teammate's: what agent-wise statistics fix
    assert out[1].abs().max() < 0.05 < scale_by_std(_mean_adv(SCORES), SCORES, "batch")[1].abs().max()


def test_group_scale_for_the_team_pools_the_node():
    out = scale_by_std(_mean_adv(SCORES), SCORES, "group", agent_wise=False)
    node0 = torch.tensor([1.0, 3.0, 0.0, 0.2]).std().item()
    assert torch.allclose(out[0][0], torch.tensor([-1.0, 1.0]) / (node0 + 1e-4))


def test_no_scale_keeps_the_advantages_and_unknown_scale_is_refused():
    adv = _mean_adv(SCORES)
    assert all(torch.equal(a, b) for a, b in zip(scale_by_std(adv, SCORES, "none"), adv))
    with pytest.raises(ValueError, match=r"scale_rewards: got 'global'.*'batch'"):
        scale_by_std(adv, SCORES, "global")


def test_counterfactual_group_scale_uses_the_agents_swap_table():
    idx = credit_index(2, 3, "counterfactual")
    adv, scores = counterfactual_advantages(_rewards(idx, lambda a, b: TABLE_N2[a][b]), idx, "mean")
    out = scale_by_std(adv, scores, "group")
    std = torch.tensor(TABLE_N2).flatten().std()  # agent 0's table holds every cell of the 3x3 grid
    assert torch.allclose(out[0], adv[0] / (std + 1e-4))


def test_team_targets_reward_weighs_its_agents_unequally():
    reward = TeamTargetsReward(targets=(4, 8, 2))
    perfect = ["x" * 4, "x" * 8, "x" * 2]
    assert reward([perfect], [], 0) == [pytest.approx(1.0)]
    # agent 1 earns nothing while agent 0 is far off (c0 = exp(-4/4)), agent 2 costs at most 0.05
    far0 = ["x" * 8, "x" * 8, "x" * 2]
    assert reward([far0], [], 0)[0] == pytest.approx(0.6 * math.exp(-1) + 0.35 * math.exp(-1) + 0.05)
    assert reward([["x" * 4, "x" * 8, "x" * 200]], [], 0)[0] == pytest.approx(0.95 + 0.05 * math.exp(-99))
    with pytest.raises(ValueError, match="TeamTargetsReward.targets"):
        TeamTargetsReward(targets=(4, 0, 2))


def test_step_advantages_shared_credit_is_magrpos_group_advantages():
    idx = credit_index(2, 3, "shared")
    r = torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]])
    out = step_advantages([r], idx, 2, "shared", "mean", "group")
    for i in range(2):
        assert torch.allclose(out[0][i], group_advantages(r, "mean", "group"))


def test_step_advantages_batch_scale_spans_every_turn():
    idx = credit_index(1, 2, "shared")
    turns = [torch.tensor([[1.0, 3.0]]), torch.tensor([[5.0, 7.0], [0.0, 0.0]])]
    out = step_advantages(turns, idx, 1, "shared", "mean", "batch")
    std = torch.tensor([1.0, 3.0, 5.0, 7.0, 0.0, 0.0]).std()  # one std over both turns' returns
    assert torch.allclose(out[0][0], torch.tensor([[-1.0, 1.0]]) / (std + 1e-4))
    assert torch.allclose(out[1][0], torch.tensor([[-1.0, 1.0], [0.0, 0.0]]) / (std + 1e-4))


def test_step_advantages_counterfactual_matches_the_hand_table():
    idx = credit_index(2, 3, "counterfactual")
    out = step_advantages(
        [_rewards(idx, lambda a, b: TABLE_N2[a][b])], idx, 2, "counterfactual", "mean", "none"
    )
    assert torch.allclose(out[0][0], torch.tensor([[1 - 4 / 3, 2.0, 3.0]]))


def test_kl_as_reward_is_a_cost_on_each_return_before_the_baseline():
    idx = credit_index(1, 2, "shared")
    kl = [[torch.tensor([[0.5, 4.0]])]]
    out = step_advantages(
        [torch.tensor([[1.0, 2.0]])], idx, 1, "shared", "mean", "none", sample_costs=[[0.1 * kl[0][0]]]
    )
    # shaped returns 1 - 0.05 = 0.95 and 2 - 0.4 = 1.6 -> mean baseline 1.275
    assert torch.allclose(out[0][0], torch.tensor([[-0.325, 0.325]]))


def test_kl_cost_in_a_counterfactual_table_follows_the_swapped_sample():
    idx = credit_index(2, 3, "counterfactual")
    costs = [torch.tensor([[0.3, 0.0, 0.6]]), torch.zeros(1, 3)]  # agent 0's samples' costs
    out = step_advantages(
        [_rewards(idx, lambda a, b: TABLE_N2[a][b])],
        idx,
        2,
        "counterfactual",
        "mean",
        "none",
        sample_costs=[costs],
    )
    # (R(k,k) - c_k) - mean_a (R(a,k) - c_a): the unshaped advantage - c_k + mean(c) (= 0.3)
    assert torch.allclose(out[0][0], torch.tensor([[1 - 4 / 3, 2.3, 2.7]]))
    assert torch.allclose(out[0][1], torch.tensor([[0.0, 2.0, 8 / 3]]))


@pytest.mark.parametrize("k", [2, 3, 5])
def test_counterfactual_with_one_agent_is_the_shared_baseline_exactly(k):
    # one agent has no teammates: every swap is its own sample, so the difference reward is GRPO's
    returns = torch.tensor([[0.0, 1.0, 3.0, 7.0, 2.0][:k], [5.0, 5.0, 1.0, 0.0, 4.0][:k]])
    shared = step_advantages([returns], credit_index(1, k, "shared"), 1, "shared", "mean", "group")
    cf = step_advantages(
        [returns], credit_index(1, k, "counterfactual"), 1, "counterfactual", "mean", "group"
    )
    # before the fix the std was taken over the K·K table of repeats: every value × √((K+1)/K)
    assert torch.allclose(cf[0][0], shared[0][0], atol=1e-6)
    assert torch.allclose(cf[0][0], group_advantages(returns, "mean", "group"), atol=1e-6)


def test_counterfactual_two_agents_group_std_is_over_the_k_squared_distinct_joint_actions():
    # N >= 2: each of the K·K table entries is its own joint action (no repeats), so the std is the
    # unbiased std of the whole grid, unchanged by the N = 1 fix
    idx = credit_index(2, 3, "counterfactual")
    out = step_advantages(
        [_rewards(idx, lambda a, b: TABLE_N2[a][b])], idx, 2, "counterfactual", "mean", "group"
    )
    std = torch.tensor(TABLE_N2).flatten().std()
    assert torch.allclose(out[0][0], torch.tensor([[1 - 4 / 3, 2.0, 3.0]]) / (std + 1e-4))
    assert torch.allclose(out[0][1], torch.tensor([[0.0, 2.0, 6 - 10 / 3]]) / (std + 1e-4))
