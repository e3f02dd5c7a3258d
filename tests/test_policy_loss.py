"""TRL loss types (core/loss.py): values and gradients against hand computations on a tiny batch."""

import math

import pytest
import torch

from comlrl_lightning.core.loss import (
    BatchTotals,
    clipped_surrogate,
    logprobs_and_entropy,
    mask_truncated,
    reduce_loss,
    sequence_kl,
)

# two samples: lengths 3 and 1 (4 tokens), advantages +2 and -1; generation limit 4 tokens
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([2.0, -1.0])
TOTALS = BatchTotals(num_rows=2, num_tokens=4, num_micro_batches=1, max_completion_length=4)


def _on_policy(loss_type, totals=TOTALS, rows=(slice(None),)):
    """Loss and d loss / d logps, summing the shares of the micro-batches ``rows``."""
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 9.0, 9.0]], requires_grad=True)
    total = 0.0
    for r in rows:
        per_tok, _, _ = clipped_surrogate(logps[r], None, ADV[r], MASK[r])
        total = total + reduce_loss(per_tok, MASK[r], loss_type, totals)
    total.backward()
    return float(total.detach()), logps.grad


# (loss_type, value, grad of sample 0's tokens, grad of sample 1's token); on-policy ratio 1: loss_t = -A
@pytest.mark.parametrize(
    "loss_type,value,g0,g1",
    [
        ("grpo", (-2 + 1) / 2, -2 / (2 * 3), 1 / (2 * 1)),  # mean over samples of each one's token mean
        ("dapo", (-2 * 3 + 1) / 4, -2 / 4, 1 / 4),  # every token of the agent batch counts once
        ("dr_grpo", (-2 * 3 + 1) / (2 * 4), -2 / 8, 1 / 8),  # constant R * max_completion_length
        ("sequence_sum", (-2 * 3 + 1) / 2, -2 / 2, 1 / 2),  # sequence log-prob x advantage, mean over samples
        ("bnpo", (-2 * 3 + 1) / 4, -2 / 4, 1 / 4),  # one micro-batch: the local token mean is dapo's
    ],
)
def test_loss_type_value_and_gradient(loss_type, value, g0, g1):
    v, grad = _on_policy(loss_type)
    assert v == pytest.approx(value)
    assert torch.allclose(grad, torch.tensor([[g0, g0, g0], [g1, 0.0, 0.0]]))  # padding gets no gradient


def test_dapo_normalises_by_the_whole_agent_batch_across_micro_batches():
    totals = BatchTotals(num_rows=2, num_tokens=4, num_micro_batches=2, max_completion_length=4)
    v, grad = _on_policy("dapo", totals, rows=(slice(0, 1), slice(1, 2)))
    assert v == pytest.approx(-5 / 4)  # same as one micro-batch
    assert torch.allclose(grad[:, 0], torch.tensor([-0.5, 0.25]))


def test_bnpo_normalises_each_micro_batch_by_its_own_tokens():
    totals = BatchTotals(num_rows=2, num_tokens=4, num_micro_batches=2, max_completion_length=4)
    v, grad = _on_policy("bnpo", totals, rows=(slice(0, 1), slice(1, 2)))
    # (-6/3 + 1/1) / 2 micro-batches: differs from dapo's -5/4
    assert v == pytest.approx(-0.5)
    assert torch.allclose(grad[:, 0], torch.tensor([-2 / 3 / 2, 1 / 2]))


def test_grpo_micro_batch_shares_add_up():
    v, _ = _on_policy("grpo", rows=(slice(0, 1), slice(1, 2)))
    assert v == pytest.approx(-0.5)


def test_unknown_loss_type_names_the_field():
    with pytest.raises(ValueError, match=r"loss_type: got 'gspo'.*'dr_grpo'"):
        reduce_loss(torch.zeros(1, 1), torch.ones(1, 1), "gspo", TOTALS)


def _off_policy(level, log_ratio, adv, **kw):
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 5.0, 5.0]])  # padded olds are garbage on purpose
    logps = (old + log_ratio).clone().requires_grad_(True)
    per_tok, low, high = clipped_surrogate(logps, old, adv, MASK, importance_sampling_level=level, **kw)
    loss = reduce_loss(per_tok, MASK, "dapo", TOTALS)
    loss.backward()
    return per_tok.detach(), logps.grad, low, high


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    lr = torch.tensor([[0.05, -0.05, 0.09], [-0.1, 3.0, 3.0]])  # padding's log-ratio must not count
    per_tok, grad, _, _ = _off_policy("sequence", lr, ADV)
    s0, s1 = math.exp(0.03), math.exp(-0.1)  # mean of the unmasked log-ratios
    assert torch.allclose(per_tok[0], torch.full((3,), -2 * s0))
    assert per_tok[1, 0] == pytest.approx(1 * s1)
    # d/dlogp_t of -A*exp(mean_t log r) = -A * s / L, times the 3 tokens sharing it, / 4 tokens (dapo)
    assert torch.allclose(grad[0], torch.full((3,), 3 * (-2 * s0 / 3) / 4))
    assert grad[1, 0] == pytest.approx(s1 / 4)


def test_token_level_ratio_differs_from_gspo_per_token():
    lr = torch.tensor([[0.05, -0.05, 0.09], [-0.1, 3.0, 3.0]])
    per_tok, grad, _, _ = _off_policy("token", lr, ADV)
    assert torch.allclose(per_tok[0], -2 * torch.exp(lr[0]))
    assert torch.allclose(grad[0], -2 * torch.exp(lr[0]) / 4)


def test_clip_higher_lets_a_positive_advantage_ratio_grow_to_epsilon_high():
    lr = torch.tensor([[math.log(1.25)] * 3, [0.0, 0.0, 0.0]])
    per_tok, grad, _, high = _off_policy("token", lr, ADV, epsilon=0.2)
    assert torch.allclose(per_tok[0], torch.full((3,), -2 * 1.2)) and torch.equal(grad[0], torch.zeros(3))
    assert high[0].all() and not high[1].any()
    per_tok, grad, _, high = _off_policy("token", lr, ADV, epsilon=0.2, epsilon_high=0.28)
    assert torch.allclose(per_tok[0], torch.full((3,), -2 * 1.25))
    assert torch.allclose(grad[0], torch.full((3,), -2 * 1.25 / 4)) and not high.any()


def test_delta_caps_a_huge_ratio_on_a_negative_advantage():
    lr = torch.tensor([[0.0, 0.0, 0.0], [math.log(3.0), 0.0, 0.0]])
    per_tok, grad, low, _ = _off_policy("token", lr, ADV)
    assert per_tok[1, 0] == pytest.approx(3.0) and grad[1, 0] == pytest.approx(
        3.0 / 4
    )  # -(-1)*rho, unbounded
    assert not low.any()
    per_tok, grad, _, _ = _off_policy("token", lr, ADV, delta=2.0)
    assert per_tok[1, 0] == pytest.approx(2.0) and grad[1, 0] == 0.0


def test_low_clip_flag_needs_a_negative_advantage():
    lr = torch.tensor([[math.log(0.5)] * 3, [math.log(0.5), 0.0, 0.0]])
    _, _, low, _ = _off_policy("token", lr, ADV)
    assert not low[0].any() and low[1, 0]


def test_mask_truncated_completions_drops_them_from_the_dapo_normaliser():
    mask = mask_truncated(MASK, torch.tensor([True, False]))
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    per_tok, _, _ = clipped_surrogate(torch.zeros(2, 3, requires_grad=True), None, ADV, mask)
    totals = BatchTotals(num_rows=2, num_tokens=int(mask.sum()))
    assert float(reduce_loss(per_tok, mask, "dapo", totals).detach()) == pytest.approx(
        1.0
    )  # only sample 1's -A = 1


def test_entropy_matches_the_full_softmax_and_log_of_vocab_for_uniform_logits():
    torch.manual_seed(0)
    logits = torch.randn(3, 2, 7)
    index = torch.randint(0, 7, (3, 2))
    logps, ent = logprobs_and_entropy(logits, index, chunk_rows=1)
    full = torch.log_softmax(logits, -1)
    assert torch.allclose(logps, full.gather(-1, index[..., None]).squeeze(-1), atol=1e-6)
    assert torch.allclose(ent, -(full.exp() * full).sum(-1), atol=1e-5)
    _, uniform = logprobs_and_entropy(torch.zeros(1, 1, 5), torch.zeros(1, 1, dtype=torch.long))
    assert uniform.item() == pytest.approx(math.log(5))


def test_logprobs_keep_their_gradient_and_entropy_has_none():
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    logps, ent = logprobs_and_entropy(logits, torch.tensor([[2]]))
    logps.sum().backward()
    # d log softmax_2 / d logits = onehot(2) - softmax = [-1/4, -1/4, 3/4, -1/4]
    assert torch.allclose(logits.grad, torch.tensor([[[-0.25, -0.25, 0.75, -0.25]]]))
    assert not ent.requires_grad


def test_sequence_kl_sums_k3_over_completion_tokens():
    logps = torch.tensor([[0.0, -1.0, -1.0], [-2.0, 0.0, 0.0]])
    ref = torch.tensor([[-1.0, -1.0, 5.0], [-1.0, 0.0, 0.0]])
    kl = sequence_kl(logps, ref, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    # r = ref - logp: sample 0: -1, 0 (its third token is padding); sample 1: +1
    assert torch.allclose(kl, torch.tensor([math.exp(-1) - (-1) - 1, math.exp(1) - 1 - 1]))


def test_completion_entropy_from_the_models_forward_matches_a_manual_full_softmax():
    from comlrl_lightning.core.generation import completion_mask_from_ids
    from comlrl_lightning.core.loss import _completion_logits, completion_logprobs, logprobs_and_entropy
    from comlrl_lightning.team.agents import build_tiny_gpt2, byte_tokenizer

    torch.manual_seed(0)
    tok = byte_tokenizer()
    model = build_tiny_gpt2(tok).eval()
    pad, eos, temp = tok.pad_token_id, tok.eos_token_id, 0.7
    prompt = torch.tensor([[pad, 10, 11, 12], [20, 21, 22, 23]])
    pmask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    comp = torch.tensor([[30, 31, eos, pad], [40, 41, 42, 43]])
    cmask, _ = completion_mask_from_ids(comp, eos)
    logps, ent = logprobs_and_entropy(_completion_logits(model, prompt, pmask, comp, cmask, temp), comp)
    logps, ent = logps * cmask, ent * cmask
    assert torch.allclose(logps, completion_logprobs(model, prompt, pmask, comp, cmask, temperature=temp))
    assert ent[0, 3] == 0.0  # padding
    for r in range(2):
        real_prompt = prompt[r][pmask[r].bool()]
        n = int(cmask[r].sum())
        logp = torch.log_softmax(model(torch.cat([real_prompt, comp[r, :n]])[None]).logits[0] / temp, -1)
        rows = logp[
            len(real_prompt) - 1 : len(real_prompt) - 1 + n
        ]  # the positions predicting the completion
        assert torch.allclose(ent[r, :n], -(rows.exp() * rows).sum(-1), atol=1e-4)
