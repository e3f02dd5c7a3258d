"""Sampling sees only the configured knobs, never a checkpoint's generation_config.json (issue 12 B2)."""

import torch

from comlrl_lightning.core.config import SamplingConfig
from comlrl_lightning.core.generation import generate
from comlrl_lightning.team.agents import AgentSpec, load_agent


def test_the_models_generation_config_does_not_change_the_samples():
    model, tok = load_agent(AgentSpec("builtin:tiny-gpt2"))
    sampling = SamplingConfig(max_new_tokens=12)

    def sample():
        torch.manual_seed(0)
        return generate(model, tok, ["a", "bb"], 3, sampling, False).completion_ids

    plain = sample()
    own = model.generation_config
    # what a checkpoint's generation_config.json may carry; each alone would change these samples
    own.repetition_penalty, own.no_repeat_ngram_size = 100.0, 1
    own.suppress_tokens = [t for t in range(len(tok)) if t % 2 == 0 and t != tok.eos_token_id]
    assert torch.equal(sample(), plain)
    assert model.generation_config is own and own.no_repeat_ngram_size == 1  # put back unchanged
    assert bool((plain % 2 == 0).any())  # the suppression would have mattered
