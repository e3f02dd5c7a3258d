"""A LoRA adapter's config checked before any model loads (team/adapter.py, team/adapter_targets.py):
``target_modules`` against the agent's module names read from its config (near matches, the allowed
names), any other ``peft.LoraConfig`` field by name and type; and those fields reaching PEFT, training
and being checkpointed."""

import copy
import json
import math
from dataclasses import asdict

import pytest
import torch
import yaml
from conftest import tiny_cli_config

from comlrl_lightning import MAGRPO
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.team.agents import AgentSpec

pytest.importorskip("peft")

GPT2_LAYERS = "['c_attn', 'c_fc', 'c_proj', 'lm_head', 'wpe', 'wte']"
"""The tiny GPT-2's module names LoRA can wrap (Conv1D and Embedding layers, the output layer)."""


def team(*adapters, model="builtin:tiny-gpt2", share=False):
    agents = [{"model": model, "adapter": copy.deepcopy(a)} for a in adapters]
    if share:
        agents[1]["share_weights_with"] = 0
    return MAGRPO(
        agents=agents, rollout={"num_generations": 2}, sampling={"max_new_tokens": 8}, learning_rate=1e-2
    )


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load (the agent's build, a from_pretrained, a builtin conversion) fails the test."""
    from transformers import AutoModelForCausalLM

    def fail(*args, **kwargs):
        pytest.fail("a model was loaded")

    monkeypatch.setattr("comlrl_lightning.team.kinds.load_agent", fail)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fail)
    monkeypatch.setattr("comlrl_lightning.team.builtin.resolve_builtin", fail)


# ------------------------------------------------------------------ target_modules against the model's names
@pytest.mark.parametrize(
    ("targets", "problem"),
    [
        ("c_atn", "'c_atn' matches no module of builtin:tiny-gpt2 (GPT2LMHeadModel) (did you mean 'c_attn'?)"),
        ("all_linear", "'all_linear' matches no module of builtin:tiny-gpt2 (GPT2LMHeadModel) (did you mean 'all-linear'?)"),
        (["q_proj"], "'q_proj' matches no module of builtin:tiny-gpt2 (GPT2LMHeadModel) (did you mean 'c_proj'?)"),
        # PEFT alone trains c_attn here and drops q_proj without a word
        (["c_attn", "q_proj"], "'q_proj' matches no module of builtin:tiny-gpt2"),
        (["mlp"], "'mlp' names ['GPT2MLP'] modules of builtin:tiny-gpt2 (GPT2LMHeadModel), which LoRA cannot wrap"),
        (["all-linear"], "'all-linear' matches no module of builtin:tiny-gpt2 (GPT2LMHeadModel) (give it alone"),
    ],
)  # fmt: skip
def test_a_target_module_typo_is_refused_before_any_model_loads_with_near_matches_and_the_models_names(
    no_model_loads, targets, problem
):
    with pytest.raises(ValueError) as err:
        team({"target_modules": ["c_attn"]}, {"target_modules": targets})
    message = str(err.value)
    assert message.startswith(f"agents[1].adapter.target_modules: got {targets!r}; {problem}")
    assert f"allowed: 'all-linear' or names of its layers LoRA can wrap, {GPT2_LAYERS}" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("targets", "wrapped"),
    [
        ("all-linear", {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}),
        (["c_attn"], {"attn.c_attn"}),
        (["attn.c_proj"], {"attn.c_proj"}),  # a dotted suffix: the attention's c_proj, not the MLP's
        (r".*\.mlp\.c_\w+", {"mlp.c_fc", "mlp.c_proj"}),  # one string: a regular expression over full names
    ],
)
def test_accepted_target_modules_wrap_exactly_the_modules_they_name(targets, wrapped):
    model = team({"target_modules": targets})
    model.configure_model()
    names = {n for n, _ in model.agents[0].named_modules() if n.endswith("lora_A")}
    # "base_model.model.transformer.h.0.attn.c_attn.lora_A" -> "attn.c_attn", for each of the 2 layers
    assert {n.split(".h.")[1].split(".", 1)[1].removesuffix(".lora_A") for n in names} == wrapped
    assert len(names) == 2 * len(wrapped)


def test_smollm2_target_modules_are_checked_against_its_config_without_reading_weights(
    no_model_loads, monkeypatch
):
    import comlrl_lightning.team.adapter_targets as targets

    smol = "builtin:smollm2-135m-instruct"
    layers = "['down_proj', 'embed_tokens', 'gate_proj', 'k_proj', 'lm_head', 'o_proj', 'q_proj', 'up_proj', 'v_proj']"
    for converted in (True, False):  # converted: its config.json; not yet: the llama default config
        if not converted:
            monkeypatch.setattr(targets, "converted_folder", lambda name: None)
        team({"target_modules": ["q_proj", "v_proj"]}, model=smol)
        with pytest.raises(ValueError) as err:
            team({"target_modules": ["c_attn"]}, model=smol)
        assert str(err.value).startswith(
            "agents[0].adapter.target_modules: got ['c_attn']; 'c_attn' matches no module of "
            f"{smol} (LlamaForCausalLM); allowed: 'all-linear' or names of its layers LoRA can wrap, {layers}"
        )


# ------------------------------------------------------------------ any LoraConfig field, by name and type
@pytest.mark.parametrize(
    ("adapter", "message"),
    [
        ({"use_dorra": True}, "agents[0].adapter: unknown field 'use_dorra'; did you mean 'use_dora'? allowed: a peft.LoraConfig field, ["),
        ({"lora_target_modules": ["c_attn"]}, "agents[0].adapter: unknown field 'lora_target_modules'; did you mean 'target_modules'?"),
        ({"use_dora": "yes"}, "agents[0].adapter.use_dora: got 'yes', allowed: bool (peft.LoraConfig.use_dora)"),
        ({"use_rslora": "false"}, "agents[0].adapter.use_rslora: got 'false', allowed: bool"),  # truthy in PEFT
        ({"bias": "al"}, "agents[0].adapter.bias: got 'al', allowed: one of ['none', 'all', 'lora_only']"),
        ({"init_lora_weights": "gaussia"}, "agents[0].adapter.init_lora_weights: got 'gaussia', allowed: bool or one of ['gaussian'"),
        ({"modules_to_save": "ln_f"}, "agents[0].adapter.modules_to_save: got 'ln_f', allowed: a list of str or None"),
        ({"task_type": "SEQ_CLS"}, "agents[0].adapter.task_type: got 'SEQ_CLS', but the library sets 'CAUSAL_LM'"),
        ({"inference_mode": True}, "agents[0].adapter.inference_mode: got True, but the adapter trains"),
        ({"layers_pattern": "h"}, "agents[0].adapter: peft.LoraConfig refuses {'layers_pattern': 'h'}: `layers_pattern` cannot be used when `target_modules` is a str."),
        ({"modules_to_save": ["ln_ff"]}, "agents[0].adapter.modules_to_save: got ['ln_ff']; 'ln_ff' matches no module of builtin:tiny-gpt2 (GPT2LMHeadModel) (did you mean 'ln_f'"),
        ({"exclude_modules": ["c_fcc"]}, "agents[0].adapter.exclude_modules: got ['c_fcc']; 'c_fcc' matches no module"),
    ],
)  # fmt: skip
def test_a_bad_lora_config_field_is_refused_naming_it_before_any_model_loads(
    no_model_loads, adapter, message
):
    with pytest.raises(ValueError) as err:
        team(adapter)
    assert str(err.value).startswith(message)


def test_the_check_draws_no_random_numbers():
    # before the fix it did (PEFT initialises the layers it injects): a seeded run's rollouts moved
    torch.manual_seed(0)
    team({"use_dora": True}, {"target_modules": ["c_attn"], "modules_to_save": ["ln_f"]})
    drawn = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(3), drawn)


def test_biases_cannot_train_on_a_base_two_agents_share(no_model_loads):
    with pytest.raises(
        ValueError, match=r"^agents\[0\].adapter.bias: got 'all', but agents 0 and 1 share one base"
    ):
        team({"bias": "all"}, {}, share=True)
    team({"bias": "all"}, {})  # each its own base: fine


def test_a_team_without_adapters_needs_no_peft_and_an_adapter_says_how_to_get_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` fails; find_spec("peft") is None
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, rollout={"num_generations": 2})
    model.configure_model()
    assert len(model.agents) == 2
    with pytest.raises(ValueError, match=r"^agents\[0\].adapter: a LoRA adapter needs the 'peft' package"):
        team({})


# ------------------------------------------------------------------ the options reach PEFT, train, and checkpoint
def test_use_rslora_and_use_dora_reach_each_agents_peft_layers():
    model = team({"r": 4, "lora_alpha": 8, "use_rslora": True, "use_dora": True}, {"r": 4, "lora_alpha": 8})
    model.configure_model()
    for i, (dora, scaling) in enumerate([(True, 8 / math.sqrt(4)), (False, 8 / 4)]):
        agent = model.agents[i]
        config = agent.peft_config["default"]
        assert (config.use_dora, config.use_rslora) == (dora, dora)
        layer = agent.base_model.model.transformer.h[0].attn.c_attn
        assert layer.scaling["default"] == scaling and layer.use_dora["default"] is dora
        magnitude = [p for n, p in agent.named_parameters() if "lora_magnitude_vector" in n]
        assert bool(magnitude) is dora
        trained = {id(p) for p in model.team.trainable_parameters(i)}
        assert all(id(p) in trained for p in magnitude)  # DoRA's magnitudes train too


def test_modules_to_save_and_biases_train_and_are_in_the_checkpoint(trainer_factory):
    # before the fix the optimizer held only "lora_" parameters: the ln_f copy and the biases never moved
    model = team({"target_modules": ["c_attn"], "modules_to_save": ["ln_f"], "bias": "lora_only"}, {})
    model.configure_model()
    agent = model.agents[0]
    copy_weight = agent.base_model.model.transformer.ln_f.modules_to_save["default"].weight
    original = agent.base_model.model.transformer.ln_f.original_module.weight
    bias = agent.base_model.model.transformer.h[0].attn.c_attn.base_layer.bias
    before = [t.detach().clone() for t in (copy_weight, original, bias)]
    trainer = trainer_factory(max_steps=2)  # one batch: each agent one step
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    assert not torch.equal(copy_weight, before[0]) and not torch.equal(bias, before[2])
    assert torch.equal(original, before[1])  # the base's own ln_f stays frozen
    kept = set(model.state_dict()) - model.team.checkpoint_exclusions()
    assert any("ln_f.modules_to_save.default" in k for k in kept)
    assert "agents.0.base_model.model.transformer.h.0.attn.c_attn.base_layer.bias" in kept
    assert not any("original_module" in k or "mlp.c_fc.bias" in k for k in kept)


def test_options_survive_the_hparams_round_trip():
    spec = AgentSpec(
        model="builtin:tiny-gpt2", adapter={"r": 4, "use_dora": True, "modules_to_save": ["ln_f"]}
    )
    assert asdict(spec)["adapter"] == {
        "r": 4, "lora_alpha": 16, "target_modules": "all-linear", "lora_dropout": 0.0,
        "options": {"use_dora": True, "modules_to_save": ["ln_f"]},
    }  # fmt: skip
    assert AgentSpec(**asdict(spec)).adapter == spec.adapter


def test_a_yaml_adapter_with_any_lora_field_parses_trains_and_exports_it(tmp_path):
    from comlrl_lightning.cli import main

    path = tiny_cli_config(tmp_path, "auto")
    config = yaml.safe_load(open(path))
    adapter = {"r": 4, "target_modules": ["c_attn"], "use_dora": True, "use_rslora": True}
    config["model"]["init_args"]["agents"] = [{"model": "builtin:tiny-gpt2", "adapter": adapter}] * 2
    config["trainer"]["callbacks"] = [{"class_path": "comlrl_lightning.callbacks.AgentCheckpoint",
                                       "init_args": {"dirpath": str(tmp_path / "agents"), "every_n_steps": 0}}]  # fmt: skip
    open(path, "w").write(yaml.safe_dump(config))
    main(["fit", "--config", path])
    saved = json.loads((tmp_path / "agents" / "step_1" / "agent_1" / "adapter_config.json").read_text())
    assert (saved["use_dora"], saved["use_rslora"], saved["r"], saved["target_modules"]) == (
        True,
        True,
        4,
        ["c_attn"],
    )


def test_a_yaml_adapter_typo_is_one_line_naming_the_agent_and_the_near_match(tmp_path, capsys):
    from comlrl_lightning.cli import main

    path = tiny_cli_config(tmp_path, "auto")
    config = yaml.safe_load(open(path))
    config["model"]["init_args"]["agents"] = [
        {"model": "builtin:tiny-gpt2"},
        {"model": "builtin:tiny-gpt2", "adapter": {"target_modules": "c_atn"}},
    ]
    open(path, "w").write(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", path])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        "ValueError: agents[1].adapter.target_modules: got 'c_atn'; 'c_atn' matches no module of "
        "builtin:tiny-gpt2 (GPT2LMHeadModel) (did you mean 'c_attn'?)"
    )
    assert not any(line.startswith("Traceback") for line in err)
