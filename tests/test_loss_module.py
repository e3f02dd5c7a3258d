"""The loss module (core/loss.py) decides from LossConfig what it computes and what has a gradient;
its worked-example knob, the entropy bonus (``entropy_coeff``), adds exactly the entropy term's
gradient, and the default 0 leaves the loss and its gradients bit for bit as the plain policy loss."""

import pytest
import torch
from fp32_tolerance import sum_atol

from comlrl_lightning.core.generation import Generation, completion_mask_from_ids
from comlrl_lightning.core.loss import (
    BatchTotals,
    clipped_surrogate,
    completion_logprobs,
    loss_inputs,
    micro_batch_loss,
    reduce_loss,
)
from comlrl_lightning.core.loss_config import LossConfig
from comlrl_lightning.team.agents import build_tiny_gpt2, byte_tokenizer

TEMPERATURE = 0.7


def _batch():
    torch.manual_seed(0)
    tok = byte_tokenizer()
    model = build_tiny_gpt2(tok).eval()  # no dropout: every forward gives the same logits
    pad, eos = tok.pad_token_id, tok.eos_token_id
    prompt = torch.tensor([[pad, 10, 11, 12], [20, 21, 22, 23], [pad, pad, 30, 31]])
    pmask = (prompt != pad).long()
    comp = torch.tensor([[30, 31, eos, pad], [40, 41, 42, 43], [50, eos, pad, pad]])
    cmask, _ = completion_mask_from_ids(comp, eos)
    gen = Generation(prompt, pmask, comp, cmask, ["", "", ""], torch.zeros(3, dtype=torch.bool))
    totals = BatchTotals(num_rows=3, num_tokens=int(cmask.sum()), max_completion_length=4)
    return model, gen, torch.tensor([1.0, -0.5, 2.0]), totals


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def _full_softmax_entropy(model, gen):
    """``[R, C]`` entropy from the full-sequence forward, one row at a time (no padding, no chunking)."""
    rows = []
    for r in range(len(gen.texts)):
        prompt = gen.prompt_ids[r][gen.prompt_mask[r].bool()]
        n = int(gen.completion_mask[r].sum())
        logits = model(torch.cat([prompt, gen.completion_ids[r, :n]])[None]).logits[0] / TEMPERATURE
        logp = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + n], -1)
        h = -(logp.exp() * logp).sum(-1)
        rows.append(torch.cat([h, h.new_zeros(gen.completion_ids.shape[1] - n)]))
    return torch.stack(rows)


@pytest.mark.parametrize("loss_type", ["sequence_sum", "dapo", "grpo"])
def test_entropy_coeff_adds_exactly_the_entropy_terms_gradient(loss_type):
    model, gen, adv, totals = _batch()
    mask, coeff = gen.completion_mask, 0.3
    plain = micro_batch_loss(
        model, gen, None, None, adv, mask, LossConfig(loss_type=loss_type), totals, TEMPERATURE
    )
    cfg = LossConfig(loss_type=loss_type, entropy_coeff=coeff)
    bonus = micro_batch_loss(model, gen, None, None, adv, mask, cfg, totals, TEMPERATURE)
    g_plain, g_bonus = _grads(model, plain.loss), _grads(model, bonus.loss)
    # the entropy term alone, from an independent full-softmax forward: −c·H aggregated like the loss
    h = _full_softmax_entropy(model, gen)
    g_term = _grads(model, reduce_loss(-coeff * h, mask, loss_type, totals))
    assert bonus.loss.item() == pytest.approx(
        plain.loss.item() + reduce_loss(-coeff * h, mask, loss_type, totals).item(), abs=1e-5
    )
    # gb - gp cancels two gradients of size ~|gb|: their fp32 error, not the term's size, sets the tolerance
    # (the longest reduction is over the vocabulary; the summed magnitudes taken as the gradients' largest entry)
    scale = max(float(g.abs().max()) for g in [*g_plain, *g_bonus])
    atol = sum_atol(scale, n=model.config.vocab_size)
    assert max(float(g.abs().max()) for g in g_term) > 50 * atol  # a 2% error in the term would fail
    for gp, gb, gt in zip(g_plain, g_bonus, g_term):
        torch.testing.assert_close(gb - gp, gt, atol=atol, rtol=0)
    assert bonus.entropy_sum == pytest.approx(
        float(h.detach().sum()), rel=1e-5
    )  # the logged entropy is unchanged


def test_entropy_coeff_zero_is_the_plain_policy_loss_bit_for_bit():
    model, gen, adv, totals = _batch()
    terms = micro_batch_loss(
        model, gen, None, None, adv, gen.completion_mask, LossConfig(), totals, TEMPERATURE
    )
    # the loss before the knob existed: log-probs → clipped surrogate → loss_type's reduction
    args = (gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask, TEMPERATURE)
    logps = completion_logprobs(model, *args)
    per_token, _, _ = clipped_surrogate(logps, None, adv, gen.completion_mask)
    old = reduce_loss(per_token, gen.completion_mask, "sequence_sum", totals)
    assert torch.equal(terms.loss, old)
    for a, b in zip(_grads(model, terms.loss), _grads(model, old)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "0.1"])
def test_entropy_coeff_must_be_a_finite_number(bad):
    with pytest.raises(ValueError, match=r"entropy_coeff: got .*must be a finite number"):
        LossConfig(entropy_coeff=bad)


def test_loss_inputs_computes_only_what_the_config_needs_and_without_gradients():
    model, gen, _, _ = _batch()
    gen.clipped = torch.tensor([False, True, False])
    reference = build_tiny_gpt2(byte_tokenizer()).eval()
    assert loss_inputs(model, reference, gen, LossConfig(), TEMPERATURE)[:2] == (None, None)
    cfg = LossConfig(num_iterations=2, beta=0.1, mask_truncated_completions=True)
    old, ref, mask = loss_inputs(model, reference, gen, cfg, TEMPERATURE)
    args = (gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask, TEMPERATURE)
    assert torch.equal(old, completion_logprobs(model, *args)) and not old.requires_grad
    assert torch.equal(ref, completion_logprobs(reference, *args)) and not ref.requires_grad
    assert mask[1].sum() == 0 and torch.equal(mask[[0, 2]], gen.completion_mask[[0, 2]])  # truncated row out
    kl_as_reward = LossConfig(beta=0.1, kl_mode="reward")  # the KL is a cost in the return: no reference pass
    assert loss_inputs(model, reference, gen, kl_as_reward, TEMPERATURE)[1] is None
