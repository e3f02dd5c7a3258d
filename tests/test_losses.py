import torch

from comlrl_lightning.core.generation import completion_mask_from_ids
from comlrl_lightning.core.loss import (
    BatchTotals,
    clipped_surrogate,
    completion_logprobs,
    k3_kl,
    reduce_loss,
    selective_log_softmax,
)
from comlrl_lightning.team.agents import build_tiny_gpt2, byte_tokenizer


def test_selective_log_softmax_matches_full_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(5, 7, 11)
    index = torch.randint(0, 11, (5, 7))
    full = torch.log_softmax(logits, -1).gather(-1, index[..., None]).squeeze(-1)
    assert torch.allclose(selective_log_softmax(logits, index, chunk_rows=2), full, atol=1e-6)


def test_completion_logprob_equals_manual_sum_with_eos_counted_and_pads_excluded():
    torch.manual_seed(0)
    tok = byte_tokenizer()
    model = build_tiny_gpt2(tok).eval()
    pad, eos, temp = tok.pad_token_id, tok.eos_token_id, 0.7
    # row 0: prompt of 3 tokens (one left pad); completion a b EOS pad
    # row 1: prompt of 4 tokens; completion c d e f (clipped, no EOS)
    prompt = torch.tensor([[pad, 10, 11, 12], [20, 21, 22, 23]])
    pmask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    comp = torch.tensor([[30, 31, eos, pad], [40, 41, 42, 43]])
    cmask, clipped = completion_mask_from_ids(comp, eos)
    assert cmask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]] and clipped.tolist() == [False, True]
    got = completion_logprobs(model, prompt, pmask, comp, cmask, temperature=temp).sum(-1)

    for r in range(2):
        real_prompt = prompt[r][pmask[r].bool()]
        n = int(cmask[r].sum())
        ids = torch.cat([real_prompt, comp[r, :n]])[None]
        logits = model(ids).logits[0] / temp  # unpadded, positions 0..L-1
        logp = torch.log_softmax(logits, -1)
        manual = sum(logp[len(real_prompt) - 1 + t, comp[r, t]] for t in range(n))
        assert torch.allclose(got[r], manual, atol=1e-4), (r, got[r], manual)


def test_sequence_sum_mean_and_token_mean_aggregations():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    totals = BatchTotals(num_rows=2, num_tokens=4)
    assert reduce_loss(v, m, "sequence_sum", totals).item() == (6 + 4) / 2
    assert reduce_loss(v, m, "grpo", totals).item() == (2 + 4) / 2  # formerly sequence_mean
    assert reduce_loss(v, m, "dapo", totals).item() == 10 / 4  # formerly token_mean


def test_micro_batch_shares_add_up_to_the_full_batch_loss():
    torch.manual_seed(1)
    v, m = torch.randn(6, 5), (torch.rand(6, 5) > 0.3).long()
    for agg in ("sequence_sum", "grpo", "dapo", "dr_grpo"):
        full = reduce_loss(v, m, agg, BatchTotals(6, int(m.sum()), 1, 5))
        parts = sum(
            reduce_loss(v[i : i + 2], m[i : i + 2], agg, BatchTotals(6, int(m.sum()), 3, 5))
            for i in range(0, 6, 2)
        )
        assert torch.allclose(full, parts), agg


def test_on_policy_surrogate_gradient_is_minus_advantage_times_grad_logprob():
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([0.5])
    loss, low, high = clipped_surrogate(logps, None, adv, torch.ones(1, 2), 0.2, 0.2)
    loss.sum().backward()
    assert torch.allclose(loss.detach(), torch.tensor([[-0.5, -0.5]]))
    assert torch.allclose(logps.grad, torch.tensor([[-0.5, -0.5]]))
    assert not (low | high).any()


def test_ratio_is_clipped_for_positive_advantage():
    logps = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-1.0]])  # ratio e ~ 2.72 > 1.2
    loss, _, high = clipped_surrogate(logps, old, torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.2)
    assert torch.allclose(loss, torch.tensor([[-1.2]]))
    assert high.all()
    loss.sum().backward()
    assert logps.grad.abs().sum() == 0  # clipped: no gradient


def test_k3_kl_is_zero_for_equal_policies_and_positive_otherwise():
    a = torch.tensor([-1.0, -2.0])
    assert torch.equal(k3_kl(a, a), torch.zeros(2))
    assert (k3_kl(a, a - 0.5) > 0).all()


def test_loaded_agents_have_no_dropout_so_logprobs_match_the_sampling_policy():
    from comlrl_lightning.team.agents import AgentSpec, load_agent

    model, _ = load_agent(AgentSpec("builtin:tiny-gpt2"))  # GPT2Config defaults to 0.1 dropout
    assert model.training
    x = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(model(x).logits, model(x).logits)
