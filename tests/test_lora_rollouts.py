"""A LoRA agent's rollouts (``sampling.adapter_rollouts``): ``merged`` samples from base + B @ A held in a
copy of the adapted weights (one per base), equal to PEFT's unmerged layers up to rounding, never writing
the base or the adapter, and following the adapter after every step; what a delta cannot express falls back."""

import copy

import pytest
import torch

import comlrl_lightning.team.team as team_mod
from comlrl_lightning import MAGRPO
from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.team.kinds import mergeable_layers

pytest.importorskip("peft")

ADAPTER = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "lora_dropout": 0.0}
PROMPTS = ["one two three", "a b c d e f"]


def team(adapter=ADAPTER, **sampling):
    agents = [
        {"model": "builtin:tiny-gpt2", "adapter": copy.deepcopy(adapter)},
        {"model": "builtin:tiny-gpt2", "adapter": copy.deepcopy(adapter), "share_weights_with": 0},
    ]
    module = MAGRPO(agents=agents, rollout={"num_generations": 2}, sampling={"max_new_tokens": 6, **sampling})
    module.configure_model()
    torch.manual_seed(0)
    with torch.no_grad():  # PEFT starts B at 0 (no change): give each agent an adapter that changes the model
        for i, model in enumerate(module.team.agents):
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5 + i)
    return module.team


def generated_with(monkeypatch, team, agent, greedy=True):
    """The model ``generate`` was given for agent ``agent``'s rollout and the Generation it returned."""
    seen = []
    real = team_mod.generate

    def spy(model, *args, **kw):
        seen.append(model)
        return real(model, *args, **kw)

    monkeypatch.setattr(team_mod, "generate", spy)
    out = team.generate_one(agent, PROMPTS, 2, greedy=greedy)
    return seen[-1], out


def logits(model, team, agent):
    ids = team.tokenizers[agent](PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def test_a_merged_rollout_samples_the_adapted_model_not_the_base(monkeypatch):
    t = team()
    for agent in (0, 1):
        used, merged = generated_with(monkeypatch, t, agent)
        assert used is not t.agents[agent]  # the merged clone, not PEFT's layers
        adapted, base = (
            logits(t.agents[agent], t, agent),
            logits(t.kinds[agent].pristine_base(agent), t, agent),
        )
        assert (adapted - base).abs().max() > 0.05  # the adapter matters here...
        with t.kinds[agent].rollout_model(agent, t.agents[agent], "merged") as clone:
            # ...and the clone is the adapted model: W + delta against W x + B (A x), fp32 rounding of a
            # 32-wide model (sums of <= 128 terms of size <= ~10: well under 1e-4)
            torch.testing.assert_close(logits(clone, t, agent), adapted, rtol=0, atol=1e-4)
        t.sampling[agent].adapter_rollouts = "unmerged"
        used, unmerged = generated_with(monkeypatch, t, agent)
        t.sampling[agent].adapter_rollouts = "merged"
        assert used is t.agents[agent]
        assert torch.equal(merged.completion_ids, unmerged.completion_ids)  # greedy: the same tokens


def test_a_merged_rollout_writes_neither_the_base_nor_the_adapter(monkeypatch):
    t = team()
    before = {id(p): (p, p.detach().clone()) for m in t.agents for p in m.parameters()}
    generated_with(monkeypatch, t, 0, greedy=False)
    after = {id(p): p for m in t.agents for p in m.parameters()}
    assert after.keys() == before.keys()  # no parameter object replaced in the agents
    for p, saved in before.values():
        assert torch.equal(p, saved)
    clone = t.kinds[0]._merged_clones[0]
    shared = {p.data_ptr() for p, _ in before.values()}
    assert all(p.data_ptr() in shared for p in clone.parameters())  # between rollouts: the shared weights


def test_two_adapters_on_one_base_hold_one_set_of_merged_weights(monkeypatch):
    t = team()
    generated_with(monkeypatch, t, 0)
    generated_with(monkeypatch, t, 1)
    buffers = t.kinds[0]._merged_buffers
    assert t.kinds[1]._merged_buffers is buffers
    adapted = {n.removeprefix("base_model.model."): m.weight for n, m in mergeable_layers(t.agents[0])}
    assert buffers.keys() == adapted.keys()  # one merged copy per adapted weight of the one base
    assert all(
        buffers[n].shape == w.shape and buffers[n].data_ptr() != w.data_ptr() for n, w in adapted.items()
    )


def test_a_merged_rollout_follows_the_adapter_after_a_step(monkeypatch):
    t = team()
    with torch.no_grad():
        for name, p in t.agents[0].named_parameters():
            if "lora_B" in name:
                p.add_(0.3)  # an optimizer step writes the adapter in place
    with t.kinds[0].rollout_model(0, t.agents[0], "merged") as clone:
        torch.testing.assert_close(logits(clone, t, 0), logits(t.agents[0], t, 0), rtol=0, atol=1e-4)


@pytest.mark.parametrize("options", [{"use_dora": True}, {"modules_to_save": ["ln_f"]}])
def test_an_adapter_a_delta_cannot_express_generates_through_peft(monkeypatch, options):
    t = team({**ADAPTER, **options})
    assert mergeable_layers(t.agents[0]) is None
    used, _ = generated_with(monkeypatch, t, 0)
    assert used is t.agents[0]


def test_adapter_rollouts_is_checked_naming_the_field_and_the_allowed_values():
    with pytest.raises(
        ValueError, match=r"adapter_rollouts: got 'fused', allowed: \['auto', 'merged', 'unmerged'\]"
    ):
        SamplingConfig(adapter_rollouts="fused")


def test_a_merged_rollout_under_inference_mode_then_outside_it_works(monkeypatch):
    # Lightning validates under torch.inference_mode: the merge buffers made there must stay writable
    # by the next training rollout (the shipped LoRA config failed at its first training batch)
    t = team()
    with torch.inference_mode():
        generated_with(monkeypatch, t, 0)
    _, out = generated_with(monkeypatch, t, 0)
    assert not t.kinds[0]._merged_buffers["transformer.h.0.attn.c_attn"].is_inference()
    assert out.completion_ids.shape[0] == 2 * len(PROMPTS)
