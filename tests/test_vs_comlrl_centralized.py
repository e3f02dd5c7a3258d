"""Differential against CoMLRL 1.4.3's centralized collaboration (``preference/centralized.py``,
``preference/collaboration.py``), calling CoMLRL's own functions on hand-built inputs.

Compared, and equal:
    - the joint prompt: ``TaggedAdapter.build_prompt`` against ``TaggedCentralizedComparatorAdapter
      .build_prompt`` for 1, 2 and 3 roles (prompts with newlines, braces and tags in them);
    - the parse of tagged texts: our :func:`split_roles` with :class:`TaggedAdapter` against
      ``CentralizedCollaboration.split`` (the texts the reward sees) and whether CoMLRL's adapter
      raises its parse error (our ``RoleSplit.failed``), on :data:`CASES` (well-formed, missing tag,
      unclosed tag, extra text, repeated tags, wrong order, case and spaces in tags, nested sections,
      empty sections, no section at all, the empty completion);
    - CoMLRL's adapter plugged into our :func:`split_roles` (its ``CentralizedComparatorParseError``
      is a ``ValueError``, our failure signal), on the same cases;
    - the joint sequence log-prob the loss uses: ``joint_sequence_log_prob`` (every completion token
      up to and including the first pad/EOS, the last token scored) against the sum of our
      ``completion_logprobs`` over the completion mask, at temperature 1;
    - the gradient of the joint policy-gradient loss (``CentralizedMAGRPOTrainer
      ._compute_loss_with_gradients`` on a trainer made with ``object.__new__``) against ours, for
      every ``advantage_mode`` (mean, raw, max, rloo).

Differences, each with its cause (none changes a compared value above):
    1. Failure signal: CoMLRL's adapter raises ``CentralizedComparatorParseError``; ours raises
       :class:`CentralizedParseError`, and :func:`split_roles` also accepts None from an adapter
       (CoMLRL would fail on ``list(None)``) and treats *any* ``ValueError`` from ``parse_completion``
       as a parse failure (CoMLRL lets other ``ValueError`` s propagate): the brief's rule that a
       parse failure is never a crash, and so CoMLRL's adapters plug in unchanged.
    2. Temperature: CoMLRL scores the joint completion with ``log_softmax(logits)``, ignoring the
       sampling temperature; our loss uses ``logits / temperature`` (the distribution sampled from).
       Compared here at temperature 1, where both are the same quantity.
    3. Chat template: CoMLRL tokenizes the joint prompt as it is; we render it in the model's chat
       template when ``AgentSpec.chat_template`` is on (as for every agent of this library). Not
       compared (a rendering choice shared with MAGRPO).
    4. Metrics: CoMLRL counts no parse failures; we log ``centralized/parse_failure`` and
       ``centralized/empty_role``.
    5. The loss's value: CoMLRL's is ``mean_k(−log π(y_k) · A_k)``; ours (``loss_type="sequence_sum"``)
       is TRL's ratio surrogate ``mean_k Σ_t −ρ_t · A_k`` with ``ρ_t = π/π_old = 1`` in value on-policy
       (so ``num_iterations > 1`` and clipping have a ratio to act on). Different numbers, the same
       gradient: compared below, equal.
    6. Advantage normalisation (CoMLRL's ``advantage_normalization=True``): population std clamped at
       1e-6 there, sample std + ``advantage_eps`` here (``scale_rewards="group"``), as for MAGRPO. The
       gradient is compared with it off (``scale_rewards="none"``).
"""

import pytest
import torch

pytest.importorskip("comlrl")

from comlrl.trainers.preference.centralized import (  # noqa: E402
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl.trainers.preference.collaboration import (  # noqa: E402
    CentralizedCollaboration,
    joint_sequence_log_prob,
)

from comlrl_lightning.core.loss import completion_logprobs  # noqa: E402
from comlrl_lightning.team.agents import AgentSpec, load_agent  # noqa: E402
from comlrl_lightning.team.centralized import TaggedAdapter, split_roles  # noqa: E402

OURS, THEIRS = TaggedAdapter(), TaggedCentralizedComparatorAdapter()

CASES = {  # name -> (completion, number of roles)
    "well-formed": ("<agent_0>\ndef aux(x):\n    return x\n</agent_0>\n<agent_1>\n42\n</agent_1>", 2),
    "missing tag of one role": ("<agent_0>12</agent_0>", 2),
    "unclosed tag": ("<agent_0>12</agent_0><agent_1>34", 2),
    "extra text outside": (
        "Sure! Here you go:\n<agent_0>12</agent_0> and then <agent_1>34</agent_1> done.",
        2,
    ),
    "repeated tags": ("<agent_0>first</agent_0><agent_0>second</agent_0><agent_1>b</agent_1>", 2),
    "wrong order": ("<agent_1>b</agent_1>\n<agent_0>a</agent_0>", 2),
    "case and spaces in tags": ("< Agent_0 >a</ AGENT_0 ><agent_1 >b< /agent_1>", 2),
    "nested sections": ("<agent_0>a<agent_1>b</agent_1>c</agent_0>", 2),
    "empty sections": ("<agent_0></agent_0><agent_1>   </agent_1>", 2),
    "no section": ("The answer is 12 and 34.", 2),
    "empty completion": ("", 2),
    "wrong index only": ("<agent_2>x</agent_2><agent_01>y</agent_01>", 2),
    "three roles, middle missing": ("<agent_0>a</agent_0><agent_2>c</agent_2>", 3),
    "one role": ("<agent_0> only </agent_0>", 1),
    "other closing tag": ("<agent_0>a</agent_1><agent_1>b</agent_1>", 2),
}


def collaboration(num_roles):
    formatters = [lambda item, i=i: f"role {i}" for i in range(num_roles)]
    return CentralizedCollaboration(THEIRS, formatters, lambda *a, **k: [0.0], num_roles)


def their_failed(completion, num_roles):
    try:
        THEIRS.parse_completion(completion, {}, num_roles)
    except CentralizedComparatorParseError:
        return True
    return False


@pytest.mark.parametrize(
    "prompts", [["What is 7 × 3?"], ["a {x} }{", "line 1\nline 2"], ["p0", "<agent_1>x</agent_1>", ""]]
)
def test_the_joint_prompt_is_comlrls(prompts):
    assert OURS.build_prompt({"q": 1}, prompts) == THEIRS.build_prompt({"q": 1}, prompts)


@pytest.mark.parametrize("name", list(CASES))
def test_the_parse_gives_the_roles_comlrls_collaboration_gives(name):
    completion, n = CASES[name]
    ours = split_roles(OURS, completion, {}, n)
    assert ours.roles == collaboration(n).split(completion, {})
    assert ours.failed == their_failed(completion, n)


@pytest.mark.parametrize("name", list(CASES))
def test_comlrls_adapter_plugs_into_our_split(name):
    completion, n = CASES[name]
    assert split_roles(THEIRS, completion, {}, n) == split_roles(OURS, completion, {}, n)


def test_the_cases_cover_each_outcome():
    outcomes = [split_roles(OURS, c, {}, n) for c, n in CASES.values()]
    assert sum(o.failed for o in outcomes) == 3  # no section, the empty completion, wrong index only
    assert any(not o.failed and o.empty for o in outcomes) and any(not o.empty for o in outcomes)


def test_the_joint_sequence_log_prob_is_comlrls_at_temperature_one():
    torch.manual_seed(0)
    model, tok = load_agent(AgentSpec("builtin:tiny-gpt2"))
    model.eval().requires_grad_(False)
    prompt = torch.tensor([5, 17, 42, 9])
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for completion in ([33, 61, 7, eos, pad, pad], [33, 61, 7, 8, 90, 12], [eos, pad, pad, pad, pad, pad]):
        c = torch.tensor(completion)
        theirs = joint_sequence_log_prob(model, tok, prompt, c)
        mask = torch.ones_like(c)
        if eos in completion:  # ours: every token up to and including the first EOS
            mask[completion.index(eos) + 1 :] = 0
        lp = completion_logprobs(model, prompt[None], torch.ones(1, 4, dtype=torch.long), c[None], mask[None])
        assert float((lp * mask).sum()) == pytest.approx(float(theirs), abs=1e-4)


@pytest.mark.parametrize("mode", ["mean", "raw", "max", "rloo"])
def test_the_joint_policy_gradient_is_comlrls(mode):
    """CoMLRL's ``CentralizedMAGRPOTrainer._compute_loss_with_gradients`` (``joint_policy_gradient_loss``)
    on a trainer built with ``object.__new__`` (its ``__init__`` loads models), against our
    ``agent_loss`` with ``loss_type="sequence_sum"`` and ``scale_rewards="none"`` (CoMLRL's
    ``advantage_normalization=False``; with it on CoMLRL divides by the population std clamped at
    1e-6, we by the sample std + ``advantage_eps``: MAGRPO's known difference, not compared)."""
    from types import SimpleNamespace

    from comlrl.trainers.reinforce.centralized_magrpo import CentralizedMAGRPOTrainer

    from comlrl_lightning.core.advantages import group_advantages
    from comlrl_lightning.core.config import LossConfig
    from comlrl_lightning.core.loss import BatchTotals, agent_loss

    torch.manual_seed(0)
    model, tok = load_agent(AgentSpec("builtin:tiny-gpt2"))
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompt = torch.tensor([5, 17, 42, 9])
    rows = [[33, 61, 7, eos, pad], [33, 8, 90, 12, 4], [70, eos, pad, pad, pad]]
    returns = [1.0, 0.25, 0.5]
    trainer = object.__new__(CentralizedMAGRPOTrainer)
    trainer.args = SimpleNamespace(advantage_normalization=False, reference_kl_enabled=False)
    trainer.advantage_mode, trainer.tokenizers = mode, [tok]
    data = {"completion_input_ids": [[torch.tensor(r) for r in rows]], "prompt_input_ids": [prompt]}
    theirs = trainer._compute_loss_with_gradients(model, data, returns)
    theirs.backward()
    their_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    ids = torch.tensor(rows)
    mask = torch.ones_like(ids)
    for r, row in enumerate(rows):
        if eos in row:
            mask[r, row.index(eos) + 1 :] = 0
    k = len(rows)
    logps = completion_logprobs(model, prompt.repeat(k, 1), torch.ones(k, 4, dtype=torch.long), ids, mask)
    adv = group_advantages(torch.tensor([returns]), mode, scale="none").flatten()
    ours = agent_loss(logps, None, None, adv, mask, LossConfig(), BatchTotals(k, int(mask.sum()))).loss
    ours.backward()
    # the values differ by design (difference 5): ours is the ratio surrogate −Σ_t ρ·A with ρ = 1
    value = -(adv[:, None] * mask).sum(-1).mean()
    ours, theirs = float(ours.detach()), float(theirs.detach())
    assert ours == pytest.approx(float(value), abs=1e-6) and abs(ours - theirs) > 0.1
    for (name, p), g in zip(model.named_parameters(), their_grads):
        assert torch.allclose(p.grad, g, atol=1e-5), name
