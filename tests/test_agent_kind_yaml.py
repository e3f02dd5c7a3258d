"""The YAML route for a new agent kind: ``agents[i].kind`` names an importable ``AgentKind`` subclass
(here :class:`BiasOnly`, defined in this file), with no change to the library; a bad path is refused,
naming the agent, before any model loads."""

import pytest
import torch
from test_cli import fit

from comlrl_lightning import MAGRPO
from comlrl_lightning.team.kinds import FullFineTuning


class BiasOnly(FullFineTuning):
    """BitFit: the agent trains its biases only. Records each model it builds and its weights then."""

    built: list = []

    def build(self, team, agent):
        model, tokenizer = super().build(team, agent)
        for name, p in model.named_parameters():
            p.requires_grad_(name.endswith(".bias"))
        BiasOnly.built.append((model, {n: p.detach().clone() for n, p in model.named_parameters()}))
        return model, tokenizer


def test_a_kind_named_in_yaml_is_what_the_agents_train(tmp_path):
    BiasOnly.built.clear()
    agent = "{model: builtin:tiny-gpt2, kind: test_agent_kind_yaml.BiasOnly}"
    fit("toy_length_ratio.yaml", tmp_path, f"--model.init_args.agents=[{agent}, {agent}]",
        "--trainer.max_steps=4", "--trainer.limit_val_batches=0", "--validate_before_fit=false")  # fmt: skip
    assert len(BiasOnly.built) == 2
    for model, before in BiasOnly.built:
        after = dict(model.named_parameters())
        moved = {n for n, p in after.items() if not torch.equal(p.detach(), before[n])}
        assert moved and all(n.endswith(".bias") for n in moved)  # the biases trained, nothing else


@pytest.mark.parametrize(
    ("path", "why"),
    [("no_such_module.Kind", "does not import"), ("torch.nn.Linear", "give the import path of an AgentKind subclass"),
     ("FullFineTuning", "give the import path")],
)  # fmt: skip
def test_a_bad_kind_path_names_the_agent_before_any_model_loads(path, why, monkeypatch):
    import comlrl_lightning.team.kinds as kinds

    monkeypatch.setattr(kinds, "load_agent", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises(ValueError, match=rf"agents\[1\]\.kind: got '{path}'.*{why}"):
        MAGRPO(agents=[{"model": "builtin:tiny-gpt2"}, {"model": "builtin:tiny-gpt2", "kind": path}])


@pytest.mark.parametrize("other", [{"adapter": {"r": 4}}, {"share_weights_with": 0}])
def test_a_kind_with_a_field_a_shipped_kind_reads_is_refused(other):
    agent = {"model": "builtin:tiny-gpt2", "kind": "comlrl_lightning.team.kinds.FullFineTuning", **other}
    with pytest.raises(ValueError, match=rf"agents\[1\]\.kind: got .* with agents\[1\]\.{next(iter(other))}"):
        MAGRPO(agents=[{"model": "builtin:tiny-gpt2"}, agent])
