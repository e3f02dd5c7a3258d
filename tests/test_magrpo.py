import warnings

import pytest
import torch

import comlrl_lightning.team.team as team_mod
from comlrl_lightning import MAGRPO, MAREINFORCE, MARLOO, MAReMax
from comlrl_lightning.datamodules import DecPOMDPDataModule, LengthRatioDataModule
from comlrl_lightning.envs.toy import TargetLengthReward, length_ratio_rows


def tiny(num_agents=2, **kw):
    kw.setdefault("max_new_tokens", 12)
    kw.setdefault("learning_rate", 1e-3)
    return MAGRPO(agents="builtin:tiny-gpt2", num_agents=num_agents, num_generations=kw.pop("k", 2), **kw)


class RecordingAdamW(torch.optim.AdamW):
    """Records, at each step, which agents' parameters the step changed."""

    log: list = []
    module = None

    def step(self, closure=None):
        before = [[p.detach().clone() for p in a.parameters()] for a in RecordingAdamW.module.agents]
        out = super().step(closure)
        changed = [any(not torch.equal(b, p) for b, p in zip(bs, a.parameters()))
                   for bs, a in zip(before, RecordingAdamW.module.agents)]  # fmt: skip
        RecordingAdamW.log.append((id(self), changed))
        return out


def test_one_training_step_changes_each_agent_only_through_its_own_optimizer(trainer_factory):
    RecordingAdamW.log = []
    model = tiny(optimizer=lambda params: RecordingAdamW(params, lr=1e-2))
    RecordingAdamW.module = model
    initial = None

    class Snap(__import__("lightning").pytorch.Callback):
        def on_train_start(self, trainer, pl_module):
            nonlocal initial
            initial = [[p.detach().clone() for p in a.parameters()] for a in pl_module.agents]

    trainer = trainer_factory(max_steps=2, callbacks=[Snap()])
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=8))
    opts = trainer.optimizers
    assert [entry[0] for entry in RecordingAdamW.log] == [id(opts[0]), id(opts[1])]
    assert RecordingAdamW.log[0][1] == [True, False]  # agent 0's optimizer moved only agent 0
    assert RecordingAdamW.log[1][1] == [False, True]
    for before, agent in zip(initial, model.agents):
        assert any(not torch.equal(b, p) for b, p in zip(before, agent.parameters()))


@pytest.mark.parametrize("num_agents,max_steps,batches", [(2, 6, 3), (1, 6, 6)])
def test_max_steps_counts_every_agents_optimizer_step(trainer_factory, num_agents, max_steps, batches):
    seen = []

    class Count(__import__("lightning").pytorch.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(batch_idx)

    if num_agents == 2:
        dm = LengthRatioDataModule(batch_size=2, num_train=32)
    else:
        dm = DecPOMDPDataModule(
            length_ratio_rows(32), ["Note on {topic}:"], TargetLengthReward(8), batch_size=2
        )
    trainer = trainer_factory(max_steps=max_steps, callbacks=[Count()])
    trainer.fit(tiny(num_agents), dm)
    assert len(seen) == batches
    assert trainer.global_step == max_steps == MAGRPO.max_steps_for(batches, num_agents)


def test_training_step_returns_rewards_lengths_and_texts_for_callbacks(trainer_factory):
    got = {}

    class Grab(__import__("lightning").pytorch.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            got.update(outputs)

    trainer = trainer_factory(max_steps=2, callbacks=[Grab()])
    trainer.fit(tiny(k=3), LengthRatioDataModule(batch_size=2, num_train=8))
    assert got["rewards"].shape == (2 * 3,)  # 2 episodes x K=3 aligned joint actions
    assert set(got["reward_components"]) == {"length_ratio"}
    assert len(got["completions"]) == 2 and len(got["completions"][0]) == 6
    assert all(0 < length <= 12 for length in got["completion_lengths"][1].tolist())
    for key in (
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "z_agent_0/loss",
        "z_agent_1/loss",
        "completions/mean_length",
    ):
        assert key in trainer.callback_metrics, key


def test_formatter_count_must_match_num_agents():
    with pytest.raises(ValueError, match="data.formatters"):
        LengthRatioDataModule(num_agents=3)


def test_env_with_other_agent_count_fails_in_setup_before_loading(trainer_factory):
    model = tiny(3)
    with pytest.raises(ValueError, match="num_agents=3"):
        trainer_factory(max_steps=1).fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    assert len(model.agents) == 0  # setup raised before configure_model loaded anything


def test_aliases_only_change_the_advantage_mode():
    assert MAREINFORCE(agents="builtin:tiny-gpt2").advantage.advantage_mode == "raw"
    assert MARLOO(agents="builtin:tiny-gpt2").advantage.advantage_mode == "rloo"
    assert MAReMax(agents="builtin:tiny-gpt2").hparams.advantage["advantage_mode"] == "max"


def test_beta_keeps_a_frozen_reference_and_reports_kl(trainer_factory):
    got = {}

    class Grab(__import__("lightning").pytorch.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            got.update(outputs)

    class Modes(__import__("lightning").pytorch.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            got["ref_training"] = [m.training for m in pl_module.reference_models.modules()]

    model = tiny(beta=0.1, num_iterations=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer_factory(max_steps=2 * 2 * 2, callbacks=[Grab(), Modes()]).fit(
            model, LengthRatioDataModule(batch_size=2, num_train=8)
        )
    # the frozen copies score in eval mode, and Lightning's "module(s) in eval mode" warning is not raised
    # for them (it was, for every reference submodule, before the base class flagged them around it)
    assert got["ref_training"] and not any(got["ref_training"])
    assert not [w for w in caught if "in eval mode" in str(w.message)]
    assert len(model.reference_models) == 2
    assert not any(p.requires_grad for p in model.reference_models.parameters())
    # the reference stays at the initial weights while the agent moved: the KL is positive
    assert all(s["kl"] > 0 for s in got["agent_stats"])
    ref0, agent0 = model.reference_models[0], model.agents[0]
    assert any(not torch.equal(a, b) for a, b in zip(ref0.parameters(), agent0.parameters()))


@pytest.mark.parametrize("val_sampling", [False, True])
def test_validation_decodes_greedily_unless_val_sampling(trainer_factory, monkeypatch, val_sampling):
    seen = []
    real = team_mod.generate

    def spy(*args, **kwargs):
        seen.append((args[3], kwargs["do_sample"]))  # (num_generations, do_sample)
        return real(*args, **kwargs)

    monkeypatch.setattr(team_mod, "generate", spy)
    trainer = trainer_factory(max_steps=2, limit_val_batches=1)
    trainer.fit(tiny(val_sampling=val_sampling), LengthRatioDataModule(batch_size=2, num_train=2, num_val=2))
    assert (2, True) in seen  # training: K samples
    assert (1, val_sampling) in seen and (1, not val_sampling) not in seen


def test_max_steps_not_a_whole_number_of_batches_warns_with_the_numbers(trainer_factory):
    import warnings

    trainer = trainer_factory(max_steps=5)
    with pytest.warns(UserWarning, match=r"max_steps=5 is not a multiple of the 4 optimizer steps one batch takes "
                      r"\(num_agents=2 × num_iterations=2\): training runs 2 batches and stops at global_step=8; "
                      r"set max_steps=4 or 8"):  # fmt: skip
        trainer.fit(tiny(num_iterations=2), LengthRatioDataModule(batch_size=2, num_train=8))
    assert trainer.global_step == 8  # what the warning says happens
    trainer = trainer_factory(max_steps=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(tiny(num_iterations=2), LengthRatioDataModule(batch_size=2, num_train=8))
    assert not [w for w in caught if "max_steps=" in str(w.message)]
    with pytest.warns(
        UserWarning, match=r"stops at global_step=4; set max_steps=4 \(max_steps_for"
    ):  # never 0
        trainer_factory(max_steps=1).fit(
            tiny(num_iterations=2), LengthRatioDataModule(batch_size=2, num_train=8)
        )
