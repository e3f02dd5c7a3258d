"""One rule for reward models in every algorithm: listed in ``reward_models`` (placed by the strategy),
never written into a Lightning checkpoint, reloaded from their source on resume."""

import warnings

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from comlrl_lightning import IAC, MAGRPO, ActorCriticRolloutConfig, CriticConfig, SamplingConfig
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.envs.base import DecPOMDP
from comlrl_lightning.envs.reward_model import RewardModelReward
from comlrl_lightning.envs.toy import LengthRatioReward
from comlrl_lightning.infra.strategy import place_module, plan_devices
from comlrl_lightning.team.agents import byte_tokenizer


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    tok = byte_tokenizer()
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=256,
        n_embd=16,
        n_layer=1,
        n_head=2,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    path = tmp_path_factory.mktemp("rm") / "classifier"
    GPT2ForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def build(cls, classifier_dir):
    rm = RewardModelReward(str(classifier_dir))
    env = DecPOMDP(["Short note on {topic}:", "Longer note on {topic}:"], [LengthRatioReward(), rm])
    common = dict(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        sampling=SamplingConfig(max_new_tokens=8),
        learning_rate=1e-3,
        env=env,
    )
    if cls is IAC:
        return IAC(
            critic=CriticConfig(critic_learning_rate=1e-3),
            rollout=ActorCriticRolloutConfig(num_generations=2),
            **common,
        ), rm
    return MAGRPO(num_generations=2, **common), rm


@pytest.mark.parametrize("cls", [MAGRPO, IAC])
def test_the_strategy_places_every_algorithms_reward_models(cls, classifier_dir):
    m, rm = build(cls, classifier_dir)
    m.configure_model()
    assert list(m.reward_models) == [rm.model]
    place_module(m, plan_devices(m, ["cpu", "cpu"], reward_devices=["meta"]))
    assert {p.device for p in rm.model.parameters()} == {torch.device("meta")}


@pytest.mark.parametrize("cls", [MAGRPO, IAC])
def test_checkpoints_leave_out_the_frozen_reward_models_and_resume_with_them(
    cls, classifier_dir, trainer_factory, tmp_path
):
    m, rm = build(cls, classifier_dir)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=m.steps_per_batch)
    trainer = trainer_factory(max_steps=m.steps_per_batch, enable_checkpointing=True, callbacks=[ckpt])
    trainer.fit(m, LengthRatioDataModule(batch_size=2, num_train=8))
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)["state_dict"]
    assert not [k for k in saved if k.startswith("reward_models.")]
    assert [k for k in saved if k.startswith("agents.")]  # the trained weights are there
    # resume (strict loading): the reward models come back from their source, unchanged
    resumed, rm2 = build(cls, classifier_dir)
    trainer = trainer_factory(max_steps=2 * m.steps_per_batch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(
            resumed, LengthRatioDataModule(batch_size=2, num_train=8), ckpt_path=tmp_path / "last.ckpt"
        )
    assert trainer.global_step == 2 * m.steps_per_batch
    # the reloaded frozen reward models are in eval mode by design: Lightning's warning is not raised for them
    assert not [w for w in caught if "in eval mode" in str(w.message)]
    assert list(resumed.reward_models) == [rm2.model]
    source = dict(rm.model.state_dict())
    assert all(torch.equal(v, source[k]) for k, v in rm2.model.state_dict().items())


def test_an_older_checkpoint_with_reward_model_weights_loads_without_an_env(classifier_dir, tmp_path):
    m, rm = build(IAC, classifier_dir)
    m.configure_model()
    checkpoint = {"state_dict": m.state_dict()}  # what IAC wrote before: the reward model included
    assert [k for k in checkpoint["state_dict"] if k.startswith("reward_models.")]
    plain = IAC(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        sampling=SamplingConfig(max_new_tokens=8),
        rollout=ActorCriticRolloutConfig(num_generations=2),
        critic=CriticConfig(critic_learning_rate=1e-3),
    )
    plain.configure_model()
    plain.on_load_checkpoint(checkpoint)
    plain.load_state_dict(checkpoint["state_dict"])  # strict: no unexpected reward_models.* keys
