import pytest
import torch

from comlrl_lightning.core.advantages import agent_sample_returns, group_advantages, joint_action_indices

R = torch.tensor([[1.0, 2.0, 3.0, 6.0]])


def test_mean_baseline_without_scaling():
    assert torch.allclose(group_advantages(R, "mean", "none"), torch.tensor([[-2.0, -1.0, 0.0, 3.0]]))


def test_max_baseline_without_scaling():
    assert torch.allclose(group_advantages(R, "max", "none"), torch.tensor([[-5.0, -4.0, -3.0, 0.0]]))


def test_rloo_is_reward_minus_mean_of_the_others():
    # others of 1: (2+3+6)/3 = 11/3 -> 1 - 11/3 = -8/3 ; of 6: (1+2+3)/3 = 2 -> 4
    expected = torch.tensor([[1 - 11 / 3, 2 - 10 / 3, 3 - 3.0, 6 - 2.0]])
    assert torch.allclose(group_advantages(R, "rloo", "none"), expected)


def test_raw_is_the_return():
    assert torch.equal(group_advantages(R, "raw", "none"), R)


def test_group_scaling_divides_by_unbiased_std_plus_eps():
    std = R.std()  # unbiased: sqrt(14/3)
    out = group_advantages(R, "mean", "group", eps=1e-4)
    assert torch.allclose(out, (R - 3.0) / (std + 1e-4))


@pytest.mark.parametrize("mode", ["mean", "max", "rloo", "raw"])
def test_all_equal_rewards_give_zero_advantage(mode):
    out = group_advantages(torch.full((3, 4), 0.7), mode, "group")
    assert torch.equal(out, torch.zeros(3, 4))
    assert not torch.isnan(out).any()


def test_k2_group():
    out = group_advantages(torch.tensor([[0.0, 1.0]]), "mean", "group", eps=1e-4)
    # unbiased std of (0, 1) is 1/sqrt(2)
    s = 2**-0.5 + 1e-4
    assert torch.allclose(out, torch.tensor([[-0.5 / s, 0.5 / s]]))
    assert torch.allclose(
        group_advantages(torch.tensor([[0.0, 1.0]]), "rloo", "none"), torch.tensor([[-1.0, 1.0]])
    )


def test_unknown_mode_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match="advantage_mode"):
        group_advantages(R, "median")


def test_aligned_joint_actions_pair_the_jth_samples():
    assert joint_action_indices(3, 2, "aligned").tolist() == [[0, 0, 0], [1, 1, 1]]


def test_cross_joint_actions_are_the_cartesian_product():
    idx = joint_action_indices(2, 2, "cross")
    assert idx.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]


def test_cross_mode_sample_return_is_the_mean_over_its_joint_actions():
    idx = joint_action_indices(2, 2, "cross")
    joint = torch.tensor([[1.0, 2.0, 3.0, 5.0]])  # (0,0)=1 (0,1)=2 (1,0)=3 (1,1)=5
    assert agent_sample_returns(joint, idx, 0, 2).tolist() == [[1.5, 4.0]]
    assert agent_sample_returns(joint, idx, 1, 2).tolist() == [[2.0, 3.5]]
    adv = group_advantages(agent_sample_returns(joint, idx, 0, 2), "mean", "none")
    assert adv.tolist() == [[-1.25, 1.25]]


def test_raw_is_not_std_scaled_by_default():
    # a near-equal group: scaled by std + eps it would be ~1 / 1e-4 = 1e4
    r = torch.tensor([[1.0, 1.0 + 1e-7, 1.0, 1.0]])
    assert torch.equal(group_advantages(r, "raw"), r)
    # the other modes keep group scaling by default
    assert torch.equal(group_advantages(R, "mean"), group_advantages(R, "mean", "group"))
    assert not torch.equal(group_advantages(R, "mean"), group_advantages(R, "mean", "none"))


def test_raw_config_defaults_to_no_scaling_and_mareinforce_gets_it():
    from comlrl_lightning import MAREINFORCE
    from comlrl_lightning.core.config import AdvantageConfig

    assert AdvantageConfig(advantage_mode="raw").scale == "none"
    assert AdvantageConfig().scale == "group"
    with pytest.warns(UserWarning, match="advantage_mode='raw' with scale_rewards='group'"):
        assert AdvantageConfig(advantage_mode="raw", scale_rewards="group").scale == "group"
    assert MAREINFORCE(agents="builtin:tiny-gpt2").advantage.scale == "none"
