"""Value heads and critics: shapes, read positions of V and Q, separate vs shared trunks, the
critic's own tokenizer, MAAC's centralised input, saving a critic as a Hugging Face folder."""

import pytest
import torch
from fp32_tolerance import sum_atol

from comlrl_lightning.core.td import value_loss
from comlrl_lightning.core.value_head import ValueHead, ValueModel, read_positions, trunk_of, values_at
from comlrl_lightning.team.agents import AgentSpec, load_agent
from comlrl_lightning.team.critics import (
    CriticConfig,
    CriticSpec,
    central_observation,
    encode_critic_inputs,
    load_critic,
    validate_critic_spec,
)


@pytest.fixture(scope="module")
def actor():
    torch.manual_seed(0)
    return load_agent(AgentSpec("builtin:tiny-gpt2"))


def test_value_head_shapes_and_zero_initial_output():
    head = ValueHead(64)
    out = head(torch.randn(3, 5, 64))
    assert out.shape == (3, 5) and out.dtype == torch.float32 and torch.all(out == 0)
    deep = ValueHead(64, hidden_dim=16)
    assert deep.hidden[0].weight.shape == (16, 64) and deep.out.weight.shape == (1, 16)
    assert torch.all(
        deep(torch.randn(4, 64)) == 0
    )  # the output layer starts at zero, the hidden one does not
    assert deep.hidden[0].weight.abs().sum() > 0
    with pytest.raises(ValueError, match="value_head_hidden_dim: got 0"):
        ValueHead(64, hidden_dim=0)


def test_read_positions_v_last_prompt_token_q_last_completion_token():
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # left-padded: every prompt ends at index 2
    completion_mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    assert read_positions(prompt_mask, completion_mask, "v").tolist() == [2, 2]
    assert read_positions(prompt_mask, completion_mask, "q").tolist() == [4, 3]  # 2 + length
    assert read_positions(prompt_mask, torch.zeros(2, 4, dtype=torch.long), "q").tolist() == [2, 2]
    with pytest.raises(ValueError, match=r"critic_type: got 'a', allowed: \['v', 'q'\]"):
        read_positions(prompt_mask, completion_mask, "a")


def _batch(tok, prompts, completions, critic_type):
    return encode_critic_inputs(tok, prompts, completions, critic_type=critic_type)


def test_v_ignores_the_completion_and_q_reads_it_and_padding_is_never_read(actor):
    model, tok = actor
    head = ValueHead(64)
    torch.nn.init.normal_(head.out.weight)
    trunk = trunk_of(model)
    prompts, completions = ["a cat", "a cat", "tea"], ["sat down", "ran", "hot and sweet"]
    with torch.no_grad():
        v = values_at(trunk, head, *_batch(tok, prompts, completions, "v"))
        q = values_at(trunk, head, *_batch(tok, prompts, completions, "q"))
        alone = [values_at(trunk, head, *_batch(tok, [p], [c], "q"))[0] for p, c in zip(prompts, completions)]
    assert v.shape == q.shape == (3,)
    # a value is a 64-term dot product of the head with a hidden state (after the final layer norm, each entry
    # at most sqrt(64) = 8): two paddings of one row may differ by that sum's fp32 error (tests/fp32_tolerance.py)
    atol = sum_atol(float(head.out.weight.abs().sum()) * 8, n=64)
    assert v[0] == pytest.approx(float(v[1]), abs=atol)  # same history, different actions: same V
    assert abs(float(q[0] - q[1])) > 100 * atol  # Q sees the action
    # every row read in the padded batch equals the row run alone (left and right padding skipped)
    assert torch.stack(alone).tolist() == pytest.approx(q.tolist(), abs=atol)


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _changed(before, module):
    return [n for n, p in module.named_parameters() if not torch.equal(before[n], p.detach())]


def test_separate_critic_loss_leaves_the_actor_unchanged(actor):
    model, _ = actor
    critic, critic_tok = load_critic(CriticSpec(model="builtin:tiny-gpt2"))
    before_actor, before_critic = _snapshot(model), _snapshot(critic)
    opt = torch.optim.SGD(critic.parameters(), lr=0.5)
    for _ in range(2):
        opt.zero_grad()
        values = critic(*_batch(critic_tok, ["a cat", "tea"], None, "v"))
        value_loss(values, torch.tensor([1.0, -1.0])).backward()
        opt.step()
    assert _changed(before_actor, model) == [] and all(p.grad is None for p in model.parameters())
    changed = _changed(before_critic, critic)
    assert "value_head.out.weight" in changed and any(n.startswith("backbone.") for n in changed)


def test_shared_head_critic_loss_trains_the_actor_trunk(actor):
    model, tok = actor
    head = ValueHead(64)
    trunk = trunk_of(model)
    before = _snapshot(model)
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.5)
    changed_after = []
    for _ in range(2):
        opt.zero_grad()
        values = values_at(trunk, head, *_batch(tok, ["a cat", "tea"], None, "v"))
        value_loss(values, torch.tensor([1.0, -1.0])).backward()
        opt.step()
        changed_after.append(_changed(before, model))
    # step 1: the zero output layer passes no gradient to the trunk; step 2: the trunk moves
    assert changed_after[0] == [] and any(n.startswith("transformer.h.") for n in changed_after[1])


def test_separate_critic_uses_its_own_tokenizer_and_q_reads_the_last_completion_token():
    critic, tok = load_critic(CriticSpec(model="builtin:tiny-llama-gpt2tok", value_head_hidden_dim=8))
    assert len(tok) == 50257 and critic.value_head.hidden_dim == 8  # the GPT-2 BPE, not the actors' bytes
    ids, mask, pos = encode_critic_inputs(
        tok, ["Short note on tea:", "Hi"], [" It is hot.", " Yes"], critic_type="q"
    )
    last = [
        tok(" It is hot.", add_special_tokens=False)["input_ids"][-1],
        tok(" Yes", add_special_tokens=False)["input_ids"][-1],
    ]
    assert [int(ids[r, pos[r]]) for r in range(2)] == last
    assert all(
        int(mask[r, pos[r]]) == 1 and (pos[r] + 1 == ids.shape[1] or mask[r, pos[r] + 1] == 0)
        for r in range(2)
    )
    assert critic(ids, mask, pos).tolist() == [0.0, 0.0]  # zero-initialised head


def test_maac_critic_input_holds_every_agents_observation_and_the_joint_action():
    obs, action = central_observation(
        ["Short note on tea:", "Longer note on tea:"], ["Hot.", "Hot and sweet."]
    )
    assert obs == "[Agent 0] Short note on tea:\n\n[Agent 1] Longer note on tea:"
    assert (
        "[Joint Action]" in action
        and "[Agent 0 action]\nHot." in action
        and "[Agent 1 action]\nHot and sweet." in action
    )
    _, tok = load_agent(AgentSpec("builtin:tiny-llama-gpt2tok"))
    ids, mask, _ = encode_critic_inputs(tok, [obs], [action], critic_type="q")
    text = tok.decode(ids[0][mask[0].bool()])
    assert (
        "Short note on tea:" in text
        and "Longer note on tea:" in text
        and text.rstrip().endswith("Hot and sweet.")
    )
    assert central_observation(["x", "y"])[1] is None
    with pytest.raises(ValueError, match="1 actions for 2 agents"):
        central_observation(["x", "y"], ["a"])


def test_value_model_round_trips_through_a_hugging_face_folder(tmp_path):
    critic, tok = load_critic(CriticSpec(model="builtin:tiny-gpt2", value_head_hidden_dim=4))
    torch.nn.init.normal_(critic.value_head.out.weight)
    critic.save_pretrained(tmp_path / "critic_0", tok)
    loaded = ValueModel.from_pretrained(tmp_path / "critic_0")
    batch = encode_critic_inputs(tok, ["a cat", "tea"])
    with torch.no_grad():
        assert loaded(*batch).tolist() == pytest.approx(critic(*batch).tolist(), abs=1e-6)
    assert (tmp_path / "critic_0" / "config.json").is_file()
    with pytest.raises(FileNotFoundError, match="no value_head.pt"):
        ValueModel.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: CriticConfig(critic_type="w"), r"critic_type: got 'w', allowed: \['v', 'q'\]"),
        (lambda: CriticConfig(value_clip_range=0.0), "value_clip_range: got 0.0, must be > 0 or None"),
        (lambda: CriticConfig(value_loss_coef=-1), "value_loss_coef: got -1, must be > 0"),
        (
            lambda: validate_critic_spec(CriticSpec(model="builtin:nope"), 1),
            r"critics\[1\].model: unknown builtin 'nope'",
        ),
        (
            lambda: validate_critic_spec(CriticSpec(model="x", dtype="int8"), 0),
            r"critics\[0\].dtype: got 'int8'",
        ),
        (
            lambda: validate_critic_spec(CriticSpec(tokenizer="x"), 0),
            r"critics\[0\]: tokenizer/model_kwargs need a separate",
        ),
        (lambda: validate_critic_spec(CriticSpec(learning_rate=0), 2), r"critics\[2\].learning_rate: got 0"),
    ],
)
def test_bad_critic_config_names_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_maac_q_critic_text_is_comlrls_character_for_character():
    # CoMLRL 1.4.3 MAACTrainer._build_critic_input: base + "\n\n" + "\n\n".join(["[Joint Action]", *blocks])
    obs, action = central_observation(["p0", "p1"], ["c0", "c1"])
    comlrl = "[Agent 0] p0\n\n[Agent 1] p1\n\n[Joint Action]\n\n[Agent 0 action]\nc0\n\n[Agent 1 action]\nc1"
    assert obs + action == comlrl  # before: one newline fewer after "[Joint Action]"
    assert central_observation(["p0", "p1"]) == ("[Agent 0] p0\n\n[Agent 1] p1", None)
