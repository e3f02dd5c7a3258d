"""TD targets, critic advantages, the clipped value loss and explained variance, on hand-built
two-turn trajectories with discount 0.5 (numbers worked out by hand in the comments)."""

import math

import pytest
import torch

from comlrl_lightning.core.td import (
    critic_baseline,
    explained_variance,
    normalize_advantages,
    td_advantages,
    td_targets,
    value_loss,
)

GAMMA = 0.5


def test_two_turn_k1_target_bootstraps_from_next_value_and_last_turn_is_its_reward():
    # turn 0: r=1, V(h0)=0.5, one child; turn 1: r=2, V(h1)=1.0, no child
    t1 = td_targets(torch.tensor([[2.0]]), torch.tensor([[-1]]), None, GAMMA)
    t0 = td_targets(torch.tensor([[1.0]]), torch.tensor([[0]]), torch.tensor([[1.0]]), GAMMA)
    assert t1.tolist() == [[2.0]]  # last turn: T = r
    assert t0.tolist() == [[1.5]]  # 1 + 0.5 * 1.0
    a0 = td_advantages(t0, torch.tensor([[0.5]]))
    a1 = td_advantages(t1, torch.tensor([[1.0]]))
    assert a0.tolist() == [[1.0]] and a1.tolist() == [[1.0]]


def test_two_turn_k2_target_uses_the_mean_of_the_children_values():
    # turn 0: one node, two joint actions with r = [1, 0], each with its own child node;
    # turn 1 Q-values per child sample: child 0 -> [1, 3] (mean 2), child 1 -> [0, 2] (mean 1)
    rewards, child = torch.tensor([[1.0, 0.0]]), torch.tensor([[0, 1]])
    q_next = torch.tensor([[1.0, 3.0], [0.0, 2.0]])
    assert td_targets(rewards, child, q_next, GAMMA).tolist() == [[2.0, 0.5]]  # [1 + .5*2, 0 + .5*1]
    # a V-critic's entries of one node are equal: V(h_child0)=4, V(h_child1)=2
    v_next = torch.tensor([[4.0, 4.0], [2.0, 2.0]])
    assert td_targets(rewards, child, v_next, GAMMA).tolist() == [[3.0, 1.0]]
    # a branch that ended (child −1) keeps its reward; the discount is applied, not ignored
    assert td_targets(rewards, torch.tensor([[0, -1]]), v_next, GAMMA).tolist() == [[3.0, 0.0]]
    assert td_targets(rewards, child, v_next, 1.0).tolist() == [[5.0, 2.0]]


def test_k2_advantages_v_baseline_and_q_sibling_mean_baseline():
    targets = torch.tensor([[2.0, 0.5]])
    v = torch.tensor([[0.5, 0.5]])  # V(h) read once per node
    assert td_advantages(targets, critic_baseline(v, "v")).tolist() == [[1.5, 0.0]]
    q = torch.tensor([[1.0, 0.0]])  # Q(h, a_k): the baseline is their mean 0.5, not each sample's own Q
    assert td_advantages(targets, critic_baseline(q, "q")).tolist() == [[1.5, 0.0]]
    assert (targets - q).tolist() == [[1.0, 0.5]]  # what T − Q(h, a) would have given
    # with K = 1 the Q baseline is the sample's own Q (CoMLRL's T − Q)
    assert td_advantages(torch.tensor([[2.0]]), critic_baseline(torch.tensor([[0.5]]), "q")).tolist() == [
        [1.5]
    ]
    with pytest.raises(ValueError, match=r"critic_type: got 'x', allowed: \['v', 'q'\]"):
        critic_baseline(q, "x")


def test_normalised_advantages_have_mean_zero_and_unit_population_std():
    adv = td_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 1.0]), normalize=True, eps=0.0)
    # raw [2, 0, 1]: mean 1, population std sqrt(2/3)
    expected = [(x - 1) / math.sqrt(2 / 3) for x in (2.0, 0.0, 1.0)]
    assert adv.tolist() == pytest.approx(expected)
    assert normalize_advantages(torch.tensor([0.7])).tolist() == pytest.approx([0.7])  # one entry: unscaled
    assert normalize_advantages(torch.tensor([2.0, 2.0])).tolist() == [0.0, 0.0]  # all equal: 0, never NaN


def test_td_targets_refuse_a_child_without_next_values():
    with pytest.raises(ValueError, match="next_values is None"):
        td_targets(torch.tensor([[1.0]]), torch.tensor([[0]]), None, GAMMA)
    with pytest.raises(ValueError, match="child index 3 but next_values has 2 rows"):
        td_targets(torch.tensor([[1.0]]), torch.tensor([[3]]), torch.zeros(2, 1), GAMMA)


def test_value_loss_unclipped_and_clipped():
    values = torch.tensor([1.0, 0.0], requires_grad=True)
    targets = torch.tensor([0.0, 2.0])
    assert float(value_loss(values, targets, coef=0.6).detach()) == pytest.approx(0.6 * (1 + 4) / 2)
    # the critic moved 1.0 from old values [0, 1] onto the targets [1, 0]; clipping at 0.2 keeps
    # the loss of V_clip = [0.2, 0.8]: ((0.2-1)^2 + 0.8^2)/2 = 0.64, and its gradient is 0 (clamped)
    values = torch.tensor([1.0, 0.0], requires_grad=True)
    loss = value_loss(values, torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), clip_range=0.2, coef=0.5)
    assert float(loss.detach()) == pytest.approx(0.5 * 0.64)
    loss.backward()
    assert values.grad.tolist() == [0.0, 0.0]
    assert (
        float(value_loss(values, torch.tensor([1.0, 0.0]), coef=0.5).detach()) == 0.0
    )  # unclipped: already on target
    with pytest.raises(ValueError, match="value_clip_range needs old_values"):
        value_loss(values, targets, clip_range=0.2)


def test_explained_variance_perfect_constant_and_undefined():
    t = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(t, t) == pytest.approx(1.0)
    assert explained_variance(torch.full((3,), 2.0), t) == pytest.approx(0.0)
    assert explained_variance(-t, t) < 0
    assert math.isnan(explained_variance(t, torch.ones(3)))
