"""Differential against CoMLRL 1.4.3's MADPO (``comlrl/trainers/preference/madpo.py``).

CoMLRL's own methods are called on an ``object.__new__`` trainer with the attributes they read
(its ``__init__`` loads models): ``_select_preference_pair_indices`` (pair selection) and
``_agent_preference_loss`` / ``_detached_agent_deltas`` (the joint DPO loss, with
``_agent_logprob_delta`` replaced by fixed per-agent log-probs: the only part that runs a model).

Differences, each with its cause (asserted below where they show in numbers):

1. Non-finite loss: CoMLRL returns a constant ``0.1`` (a leaf with no gradient into the agent, so
   its ``optimizer.step()`` runs on zero gradients, moving Adam's moments); here the loss is kept and
   ``on_nonfinite`` skips (or stops) the step (``core/nonfinite.py``).
2. Temperature: CoMLRL's sequence log-probs are at temperature 1 whatever it sampled at; ours are
   from ``logits / temperature`` (``preference/dpo.py``). Same numbers at temperature 1.
3. The last completion token: CoMLRL drops it (and cuts at the first pad id, which drops the EOS when
   pad = EOS); ours counts every completion token, EOS included (``core/loss.py``).
4. Reference: CoMLRL is reference-free; ours subtracts the reference model's log-ratio by default
   (DPO proper); ``reference_free=True`` is CoMLRL's form (compared here).
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("comlrl")

import torch  # noqa: E402
from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer  # noqa: E402

from comlrl_lightning.preference.dpo import PairLogps, joint_dpo_losses  # noqa: E402
from comlrl_lightning.preference.selection import select_pair_indices  # noqa: E402

REWARD_LISTS = [
    [0.0, 1.0, 1.0, 0.5],
    [0.3, 0.3, 0.3],
    [2.0, -1.0, 0.5, 0.5, 2.0, 0.0],
    [0.1, 0.9],
    [1.0, 0.0, 0.25, 0.75, 0.5, 1.0, 0.0, 0.5],
]


def _comlrl_selector(mode: str, limit: int | None):
    trainer = object.__new__(MADPOTrainer)
    trainer.args = MADPOConfig(pair_selection=mode, preference_pairs_per_sample=limit)
    return trainer._select_preference_pair_indices


@pytest.mark.parametrize(("mode", "limit"), [("reward_gap", 3), ("reward_gap", None), ("all", None)])
def test_deterministic_selection_equals_comlrl(mode, limit):
    theirs = _comlrl_selector(mode, limit)
    for rewards in REWARD_LISTS:
        assert select_pair_indices(rewards, mode, limit) == theirs(rewards), rewards


@pytest.mark.parametrize("limit", [2, 5, None])
def test_random_selection_equals_comlrl_under_the_same_seed_and_call_order(limit):
    theirs = _comlrl_selector("random", limit)
    random.seed(1234)
    expected = [theirs(r) for r in REWARD_LISTS]
    random.seed(1234)
    got = [select_pair_indices(r, "random", limit) for r in REWARD_LISTS]
    assert got == expected
    assert got[1] == []  # all tied: no pair, and no draw either side


class _Delta(torch.nn.Module):
    """Agent i's Δ_i of pair p is ``theta[p]``: fixed winner-minus-loser log-probs with a gradient."""

    def __init__(self, values):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor(values))


def _comlrl_loss_trainer(deltas, beta):
    trainer = object.__new__(MADPOTrainer)
    trainer.args = MADPOConfig(dpo_beta=beta)
    trainer.num_agents = len(deltas)
    trainer.agents = [_Delta(d) for d in deltas]
    trainer._agent_logprob_delta = lambda i, pair: trainer.agents[i].theta[pair]  # pair: its index
    return trainer


DELTAS = [[0.5, -1.0, 2.0, 0.0], [0.25, 0.5, -3.0, 1.5], [-0.75, 0.1, 0.2, -0.3]]  # [N=3, P=4]


@pytest.mark.parametrize("beta", [0.1, 0.7])
def test_joint_loss_and_each_agents_gradient_equal_comlrl(beta):
    trainer = _comlrl_loss_trainer(DELTAS, beta)
    batch = list(range(4))
    detached = trainer._detached_agent_deltas(batch)
    ours = PairLogps(*(torch.tensor(x) for x in (DELTAS, [[0.0] * 4] * 3, [[0.0] * 4] * 3, [[0.0] * 4] * 3)))
    for i in range(3):
        theirs = trainer._agent_preference_loss(i, batch, detached)
        (g_theirs,) = torch.autograd.grad(theirs, trainer.agents[i].theta)
        own = torch.tensor(DELTAS[i], requires_grad=True)
        mine = joint_dpo_losses(own, ours.others(i), beta).mean()  # reference_free: CoMLRL's form
        (g_mine,) = torch.autograd.grad(mine, own)
        assert float(mine) == pytest.approx(float(theirs), rel=1e-6)
        assert torch.allclose(g_mine, g_theirs, rtol=1e-6, atol=1e-8)


def test_a_non_finite_loss_is_kept_here_where_comlrl_returns_a_constant():
    deltas = [[float("nan"), 1.0], [0.5, 0.5]]
    trainer = _comlrl_loss_trainer(deltas, 0.1)
    detached = trainer._detached_agent_deltas([0, 1])
    theirs = trainer._agent_preference_loss(1, [0, 1], detached)
    assert float(theirs) == pytest.approx(0.1) and theirs.grad_fn is None  # a leaf: no gradient to the agent
    lp = PairLogps(torch.tensor(deltas), *(torch.zeros(2, 2) for _ in range(3)))
    mine = joint_dpo_losses(torch.tensor(deltas[1]), lp.others(1), 0.1).mean()
    assert mine.isnan()  # so on_nonfinite skips (or stops) the step: core/nonfinite.py


def test_sequence_logprob_equals_comlrl_but_for_the_last_token_and_the_temperature():
    from comlrl_lightning.core.loss import completion_logprobs
    from comlrl_lightning.team.agents import build_tiny_gpt2, byte_tokenizer

    torch.manual_seed(0)
    tok = byte_tokenizer()
    model = build_tiny_gpt2(
        tok, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )  # CoMLRL scores in train mode
    trainer = object.__new__(MADPOTrainer)
    trainer.centralized_collaboration, trainer.agents, trainer.tokenizers = None, [model], [tok]
    prompt, completion = torch.tensor([5, 9, 12, 40]), torch.tensor([70, 71, 72, tok.eos_token_id])
    theirs = float(trainer._sequence_log_prob(0, prompt, completion))
    p, c = prompt[None], completion[None]
    per_token = completion_logprobs(model, p, torch.ones_like(p), c, torch.ones_like(c), temperature=1.0)
    assert float(per_token[0, :-1].sum()) == pytest.approx(theirs, rel=1e-5)  # CoMLRL drops the last (EOS)
    assert float(per_token.sum()) != pytest.approx(theirs, rel=1e-3)
    hot = completion_logprobs(model, p, torch.ones_like(p), c, torch.ones_like(c), temperature=0.6)
    assert float(hot[0, :-1].sum()) != pytest.approx(theirs, rel=1e-3)  # CoMLRL ignores the temperature
