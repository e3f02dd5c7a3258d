"""IAC and MAAC as modules: config errors before loading, step counting, separate vs shared critics,
MAAC's centralised critic input, placement, critic folders, exact resume, CLI runs."""

import glob
import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from experiments import experiment
from lightning.pytorch.callbacks import ModelCheckpoint

import comlrl_lightning.team.critics as critics_mod
from comlrl_lightning import IAC, MAAC, ActorCriticRolloutConfig, CriticConfig, CriticSpec, SamplingConfig
from comlrl_lightning.callbacks import AgentCheckpoint
from comlrl_lightning.cli import main
from comlrl_lightning.core.value_head import ValueHead, ValueModel
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.infra.strategy import place_module, plan_devices
from comlrl_lightning.team.critics import encode_critic_inputs

ROOT = Path(__file__).resolve().parents[1]
META = torch.device("meta")


def make(cls=IAC, k=2, critics=None, critic_type="v", **kw):
    return cls(agents="builtin:tiny-gpt2", num_agents=2, critics=critics,
               critic=CriticConfig(critic_type=critic_type, critic_learning_rate=1e-3),
               rollout=ActorCriticRolloutConfig(num_generations=k), sampling=SamplingConfig(max_new_tokens=8),
               learning_rate=1e-3, **kw)  # fmt: skip


def data(**kw):
    return LengthRatioDataModule(batch_size=2, num_train=8, **kw)


SEPARATE = CriticSpec(model="builtin:tiny-gpt2")


@pytest.mark.parametrize(
    "build,match",
    [
        (
            lambda: make(MAAC, critics=CriticSpec()),
            r"critics\[0\].model: MAAC's centralised critic reads every agent",
        ),
        (lambda: make(IAC, critics=[SEPARATE] * 3), "critics: got 3 specs, IAC needs 2"),
        (lambda: make(k=0), "num_generations: got 0, must be >= 1"),
        (
            lambda: make(critics=CriticSpec(model="builtin:nope")),
            r"critics\[0\].model: unknown builtin 'nope'",
        ),
    ],
)
def test_bad_actor_critic_config_fails_before_any_model_loads(monkeypatch, build, match):
    monkeypatch.setattr(critics_mod, "load_agent", lambda *a: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(ValueError, match=match):
        build()


def test_one_sample_per_agent_is_allowed_and_broadcast_critics_are_copies():
    m = make(k=1, critics=SEPARATE)
    assert m.rollout_config.num_generations == 1 and len(m.critic_specs) == 2
    assert m.critic_specs[0] is not m.critic_specs[1] and m.separate_critics == [0, 1]
    assert make().separate_critics == []  # default IAC critic: a head on each agent's trunk
    assert (
        make(MAAC).critic_specs[0].model == "builtin:tiny-gpt2"
    )  # default MAAC critic: a copy of agent 0's model


class Snapshots(pl.Callback):
    """Agent weights right before each separate critic's step and at the end of the batch."""

    def __init__(self):
        self.before_critic = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if optimizer in trainer.optimizers[pl_module.num_agents :]:
            self.before_critic.append([p.detach().clone() for p in pl_module.agents.parameters()])


def test_separate_critics_step_on_their_own_optimizers_and_leave_the_agents(trainer_factory):
    m, snap = make(critics=SEPARATE), Snapshots()
    trainer = trainer_factory(max_steps=IAC.max_steps_for(1, 2, num_critics=2), callbacks=[snap])
    trainer.fit(m, data())
    assert trainer.global_step == 4 and len(trainer.optimizers) == 4  # 2 agents + 2 critics, one step each
    assert len(snap.before_critic) == 2
    after = [p.detach() for p in m.agents.parameters()]
    assert all(
        torch.equal(a, b) for a, b in zip(snap.before_critic[0], after)
    )  # critic steps moved no agent weight
    assert trainer.optimizers[2].param_groups[0]["lr"] == 1e-3
    assert {id(p) for p in m.critics[0].parameters()} == {
        id(p) for g in trainer.optimizers[2].param_groups for p in g["params"]
    }


def test_a_head_on_the_trunk_is_a_parameter_group_of_its_agents_optimizer(trainer_factory):
    m = make(critics=CriticSpec(learning_rate=3e-3))
    trainer = trainer_factory(max_steps=IAC.max_steps_for(1, 2))
    trainer.fit(m, data())
    assert trainer.global_step == 2 and len(trainer.optimizers) == 2  # no critic optimizer
    groups = trainer.optimizers[1].param_groups
    assert groups[1]["lr"] == 3e-3 and {id(p) for p in groups[1]["params"]} == {
        id(p) for p in m.critics[1].parameters()
    }
    assert m.critics[1].out.weight.abs().sum() > 0  # the joint loss trained the zero-initialised head


def test_maac_critic_reads_every_agents_observation(trainer_factory, monkeypatch):
    m = make(MAAC, critic_type="q")
    seen = []
    real = MAAC._read

    def spy(self, critic, prompts, completions):
        seen.append((list(prompts), completions))
        return real(self, critic, prompts, completions)

    monkeypatch.setattr(MAAC, "_read", spy)
    trainer_factory(max_steps=MAAC.max_steps_for(1, 2, num_critics=1)).fit(m, data())
    prompts, actions = seen[0]
    assert len(prompts) == 2 * 2  # 2 episodes x K=2 aligned joint actions
    for p in prompts:
        assert p.startswith("[Agent 0] Short note on ") and "\n\n[Agent 1] Longer note on " in p
    assert all("[Agent 0 action]" in a and "[Agent 1 action]" in a for a in actions)


def test_critics_are_placed_on_their_own_device():
    m = make(critics=[SEPARATE, CriticSpec()])
    m.configure_model()
    plan = plan_devices(m, ["cpu", "cpu"], critic_devices=["meta", "cpu"])
    place_module(m, plan)
    assert {p.device for p in m.critics[0].parameters()} == {META}
    assert {p.device for p in m.critics[1].parameters()} == {torch.device("cpu")}
    assert all(p.device.type == "cpu" for p in m.agents.parameters())


def test_agent_checkpoint_writes_critic_folders(trainer_factory, tmp_path):
    m = make(critics=[SEPARATE, CriticSpec()])
    saver = AgentCheckpoint(dirpath=str(tmp_path), every_n_steps=0)
    trainer_factory(max_steps=IAC.max_steps_for(1, 2, num_critics=1), callbacks=[saver]).fit(m, data())
    step = tmp_path / "step_1"
    loaded = ValueModel.from_pretrained(step / "critic_0")
    batch = encode_critic_inputs(m.critic_tokenizers[0], ["a cat"])
    with torch.no_grad():
        assert float(loaded(*batch)) == pytest.approx(float(m.critics[0](*batch)), abs=1e-6)
    assert (step / "critic_1" / "value_head.pt").is_file() and (step / "agent_1" / "config.json").is_file()
    head = ValueHead(64)
    head.load_state_dict(torch.load(step / "critic_1" / "value_head.pt", weights_only=True))
    assert torch.equal(head.out.weight, m.critics[1].out.weight)


def _fit_iac(trainer_factory, batches, ckpt_path=None, callbacks=(), **kw):
    pl.seed_everything(0)
    m = make(critics=[SEPARATE, CriticSpec()])
    trainer = trainer_factory(
        max_steps=IAC.max_steps_for(batches, 2, num_critics=1), callbacks=list(callbacks), **kw
    )
    trainer.fit(m, data(shuffle=True), ckpt_path=ckpt_path)
    return m


def test_iac_resumed_run_equals_uninterrupted(trainer_factory, tmp_path):
    saver = ModelCheckpoint(
        dirpath=tmp_path, every_n_train_steps=IAC.max_steps_for(2, 2, num_critics=1), save_top_k=-1
    )
    _fit_iac(trainer_factory, 2, callbacks=[saver], enable_checkpointing=True)
    (ckpt,) = os.listdir(tmp_path)
    resumed = _fit_iac(trainer_factory, 4, ckpt_path=str(tmp_path / ckpt))
    straight = _fit_iac(trainer_factory, 4)
    for name in ("agents", "critics"):
        for (key, a), b in zip(
            getattr(resumed, name).named_parameters(), getattr(straight, name).parameters()
        ):
            assert torch.equal(a, b), f"{name} {key}"
    first = _fit_iac(trainer_factory, 2)
    assert not torch.equal(first.critics[0].value_head.out.weight, straight.critics[0].value_head.out.weight)


def _cli_fit(config, tmp_path, *extra):
    os.chdir(ROOT)
    main(["fit", *experiment(config), "--trainer.enable_progress_bar=false",
          f"--trainer.logger.init_args.save_dir={tmp_path}", *extra])  # fmt: skip
    return glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)


@pytest.mark.parametrize("config", ["toy_iac.yaml", "toy_maac.yaml"])
def test_actor_critic_cli_fit_logs_critic_metrics(tmp_path, config):
    events = _cli_fit(config, tmp_path, "--trainer.max_steps=8", "--trainer.val_check_interval=2",
                      "--trainer.log_every_n_steps=1", "--trainer.callbacks=[]")  # fmt: skip
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(
        os.path.dirname(events[0])
    )  # the run's folder: validation before fit writes a file too
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "reward",
        "val/reward",
        "critic/value_mean",
        "critic/value_loss",
        "critic/explained_variance",
        "z_agent_0/entropy",  # docs/magrpo.md says z_agent_<i>/entropy is logged, for IAC and MAAC too
        "z_agent_1/entropy",
    } <= tags


TINY_TEAM = "[{model: builtin:tiny-gpt2}, {model: builtin:tiny-gpt2}]"


@pytest.mark.parametrize(
    "config,extra",
    [
        ("humaneval_iac.yaml", []),
        ("humaneval_maac.yaml", ["--model.init_args.critics=[{model: builtin:tiny-gpt2}]"]),
    ],
)
def test_actor_critic_coding_configs_run_on_the_tiny_model(tmp_path, capsys, config, extra):
    os.chdir(ROOT)
    main(["fit", *experiment(config), f"--model.init_args.agents={TINY_TEAM}", *extra,
          "--model.init_args.sampling.max_new_tokens=8", "--model.init_args.sampling.max_prompt_length=256",
          "--trainer.limit_train_batches=1", "--data.init_args.max_val_samples=2", "--data.init_args.val_batch_size=2",
          "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert "val/pass@1: 0.000 -> 0.000" in capsys.readouterr().out
    assert list(tmp_path.rglob("agents/*/critic_0/value_head.pt"))  # AgentCheckpoint wrote the critic


def test_a_non_finite_value_loss_skips_or_stops_before_any_critic_step(trainer_factory, monkeypatch):
    from comlrl_lightning.core.config import LossConfig

    m = make(critics=SEPARATE, loss=LossConfig(on_nonfinite="stop"))
    real = IAC.critic_values

    def poisoned(self, critic, turn):
        v = real(self, critic, turn)
        return v * float("nan") if torch.is_grad_enabled() else v  # the update's forward, not the rollout's

    monkeypatch.setattr(IAC, "critic_values", poisoned)
    with pytest.raises(
        FloatingPointError,
        match=r"critic 0: non-finite loss \(nan\) .* at epoch 0, batch 0, global_step=2; stopping",
    ):
        trainer_factory(max_steps=IAC.max_steps_for(1, 2, num_critics=2)).fit(m, data())
    assert all(torch.isfinite(p).all() for p in m.critics.parameters())
    m = make(critics=SEPARATE)  # on_nonfinite="skip": both critics' steps are skipped and counted
    with pytest.warns(UserWarning, match=r"critic 1: non-finite loss \(nan\)"):
        trainer_factory(max_steps=IAC.max_steps_for(1, 2, num_critics=2)).fit(m, data())
    # skipped steps still count in global_step: max_steps=4 is still one batch
    assert m.critic_skipped_steps == [1, 1] and m.skipped_steps == [0, 0]
    assert all(torch.isfinite(p).all() for p in m.critics.parameters())


def test_reward_models_of_the_env_are_listed_for_the_strategy(tmp_path):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from comlrl_lightning.envs.base import DecPOMDP
    from comlrl_lightning.envs.reward_model import RewardModelReward
    from comlrl_lightning.envs.toy import LengthRatioReward
    from comlrl_lightning.team.agents import byte_tokenizer

    tok = byte_tokenizer()
    GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, num_labels=1,
                                             pad_token_id=tok.pad_token_id)).save_pretrained(tmp_path)  # fmt: skip
    tok.save_pretrained(tmp_path)
    rm = RewardModelReward(str(tmp_path))
    env = DecPOMDP(["{topic}", "{topic}"], [LengthRatioReward(), rm])
    m = make(env=env)
    m.configure_model()
    assert list(m.reward_models) == [rm.model]
    place_module(m, plan_devices(m, ["cpu", "cpu"], reward_devices=["meta"]))
    assert {p.device for p in rm.model.parameters()} == {META}


def _two_turns(turn0_rewards):
    """Hand-built K=2 aligned tree: turn 0 one node, joint actions with children 0 and 1; turn 1 two leaves."""
    from comlrl_lightning.core.records import Turn

    t0 = Turn(0, [None], [], [], turn0_rewards, {}, torch.tensor([[0, 1]]))
    t1 = Turn(1, [None, None], [], [], torch.tensor([[2.0, 0.0], [1.0, 1.0]]), {}, torch.full((2, 2), -1))
    return [t0, t1]


VALUES = {0: [torch.tensor([0.5, 0.5]), torch.tensor([4.0, 4.0, 2.0, 2.0])],  # turn -> [G·K] (or [G·J])
          1: [torch.zeros(2), torch.zeros(4)]}  # fmt: skip


def _with_values(cls, monkeypatch):
    m = cls(agents="builtin:tiny-gpt2", num_agents=2, critic=CriticConfig(advantage_normalization=False),
            rollout=ActorCriticRolloutConfig(num_generations=2, num_turns=2, discount=0.5))  # fmt: skip
    monkeypatch.setattr(cls, "critic_values", lambda self, c, turn: VALUES[c][turn.turn])
    return m


def test_iac_targets_and_advantages_on_a_two_turn_tree_with_per_agent_rewards(monkeypatch):
    m = _with_values(IAC, monkeypatch)
    turns = _two_turns(
        torch.tensor([[[1.0, 5.0], [0.0, 6.0]]])
    )  # [G=1, J=2, N=2]: agent 1 has its own column
    batches = m.estimate(turns)
    # agent 0: T0 = [1 + .5*mean(4, 4), 0 + .5*mean(2, 2)] = [3, 1], A0 = T0 - V(h0) = [2.5, 0.5]
    assert turns[0].agent_returns[0].tolist() == [3.0, 1.0] and turns[0].advantages[0].tolist() == [2.5, 0.5]
    assert turns[1].advantages[0].tolist() == [-2.0, -4.0, -1.0, -1.0]  # last turn: T = r
    assert turns[0].advantages[1].tolist() == [5.0, 6.0]  # agent 1: its own rewards, its own critic (V = 0)
    assert batches[0].targets[0].tolist() == [3.0, 1.0] and len(batches) == 2


def test_maac_gives_every_agent_the_centralised_td_error(monkeypatch):
    m = _with_values(MAAC, monkeypatch)
    turns = _two_turns(torch.tensor([[1.0, 0.0]]))
    (batch,) = m.estimate(turns)
    assert turns[0].advantages[0].tolist() == turns[0].advantages[1].tolist() == [2.5, 0.5]
    assert batch.targets[0].tolist() == [3.0, 1.0] and batch.targets[1].tolist() == [2.0, 0.0, 1.0, 1.0]
    per_agent = _two_turns(torch.tensor([[[1.0, 5.0], [0.0, 6.0]]]))
    (batch,) = m.estimate(per_agent)
    assert per_agent[0].advantages[1].tolist() == [6.5, 6.5]  # [5 + .5*4, 6 + .5*2] - V(h0) 0.5
    assert batch.targets[0].tolist() == [5.0, 4.0]  # the critic regresses on the team's mean target
