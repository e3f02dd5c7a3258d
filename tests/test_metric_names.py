"""TRL's clip-ratio split (low / high / region) from one agent's loss, and the team-level names."""

import pytest
import torch

from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.config import LossConfig
from comlrl_lightning.core.loss import BatchTotals, agent_loss


def test_agent_loss_counts_tokens_clipped_below_and_above_separately():
    # ratio ρ = exp(logp - old): row 0 (A < 0) has ρ = e^-0.5 < 0.8 twice and 1 once; row 1 (A > 0)
    # has ρ = e^0.5 > 1.2 once, e^-0.5 once (below, but A > 0: not clipped) and a masked e^0.5
    old = torch.zeros(2, 3)
    logps = torch.tensor([[-0.5, -0.5, 0.0], [0.5, -0.5, 0.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    terms = agent_loss(
        logps,
        old,
        None,
        torch.tensor([-1.0, 1.0]),
        mask,
        LossConfig(epsilon=0.2),
        BatchTotals(num_rows=2, num_tokens=5),
    )
    assert (terms.low_clipped_tokens, terms.high_clipped_tokens, terms.clipped_tokens) == (2, 1, 3)


def test_team_metrics_are_means_and_extremes_over_agents():
    a = {
        "entropy": 1.0,
        "clip_ratio/low_mean": 0.1,
        "clip_ratio/high_mean": 0.3,
        "clip_ratio/region_mean": 0.4,
    }
    b = {
        "entropy": 3.0,
        "clip_ratio/low_mean": 0.3,
        "clip_ratio/high_mean": 0.1,
        "clip_ratio/region_mean": 0.4,
    }
    team = M.team_update_metrics([a, b])
    assert team["entropy"] == 2.0 and "kl" not in team
    assert team["clip_ratio/low_mean"] == pytest.approx(0.2) and team["clip_ratio/low_min"] == 0.1
    assert team["clip_ratio/high_mean"] == pytest.approx(0.2) and team["clip_ratio/high_max"] == 0.3
    assert M.team_update_metrics([]) == {}


def test_mean_terminated_length_leaves_out_clipped_completions():
    got = M.length_metrics(torch.tensor([2, 8, 8, 4]), torch.tensor([False, True, True, False]))
    assert got[M.MEAN_TERMINATED_LENGTH] == 3.0 and got[M.MEAN_LENGTH] == 5.5
    assert M.length_metrics(torch.tensor([8]), torch.tensor([True]))[M.MEAN_TERMINATED_LENGTH] == 0.0
