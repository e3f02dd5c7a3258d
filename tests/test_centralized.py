"""Centralized MAGRPO: the joint actor, its adapter's defined parse outcomes, training, metrics,
exact resume and the shipped configs (the differential against CoMLRL: test_vs_comlrl_centralized.py)."""

import glob
import os
from dataclasses import dataclass

import lightning.pytorch as pl
import pytest
import torch
from experiments import ROOT, experiment
from lightning.pytorch.callbacks import ModelCheckpoint
from test_resume import Preempted, Record

from comlrl_lightning import CentralizedMAGRPO, RolloutConfig, SamplingConfig
from comlrl_lightning.cli import main
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.core.records import Node, TurnState
from comlrl_lightning.datamodules import DecPOMDPDataModule, LengthRatioDataModule
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.toy import LengthRatioReward
from comlrl_lightning.team.centralized import (
    CentralizedParseError,
    JointActor,
    TaggedAdapter,
    split_roles,
)

TAGGED = TaggedAdapter()


# ------------------------------------------------------------------ the adapter's outcomes
def test_a_completion_without_any_section_is_a_parse_failure_with_every_role_empty():
    with pytest.raises(CentralizedParseError):
        TAGGED.parse_completion("just text <agent_0> never closed", {}, 2)
    split = split_roles(TAGGED, "just text <agent_0> never closed", {}, 2)
    assert split.roles == ["", ""] and split.failed and split.empty == 2


def test_a_missing_section_leaves_that_role_empty_without_failing_the_parse():
    split = split_roles(TAGGED, "<agent_1> 12 </agent_1>", {}, 2)
    assert split.roles == ["", "12"] and not split.failed and split.empty == 1


class HalfAdapter:
    """Role 0: the first half of the completion, role 1: the rest; None (a failure) when empty."""

    def build_prompt(self, batch_item, agent_prompts):
        return " / ".join(agent_prompts)

    def parse_completion(self, completion, batch_item, num_agents):
        h = len(completion) // 2
        return [completion[:h], completion[h:]] if completion else None


def test_none_from_an_adapter_is_a_parse_failure_but_a_wrong_count_is_an_adapter_bug():
    assert split_roles(HalfAdapter(), "", {}, 2).failed
    assert split_roles(HalfAdapter(), "abcd", {}, 2).roles == ["ab", "cd"]
    with pytest.raises(ValueError, match="returned 2 role texts; expected 3"):
        split_roles(HalfAdapter(), "abcd", {}, 3)

    class Stringy(HalfAdapter):
        def parse_completion(self, completion, batch_item, num_agents):
            return completion

    with pytest.raises(TypeError, match="must return a sequence of strings, got a string"):
        split_roles(Stringy(), "abcd", {}, 2)


# ------------------------------------------------------------------ the joint actor (the Actors seam)
@dataclass
class FakeTeam:
    """A team of one "model" whose K completions of each prompt are ``texts`` in turn."""

    texts: list[str]

    def render(self, agent, node):
        assert agent == 0 and node.completions == [[]]
        return "<chat>" + node.prompts[0][-1]

    def generate_one(self, agent, prompts, k, greedy=False):
        self.prompts = list(prompts)
        rows = [self.texts[(g * k + j) % len(self.texts)] for g in range(len(prompts)) for j in range(k)]
        z = torch.zeros(len(rows), 1, dtype=torch.long)
        return Generation(z, z, z, z, rows, torch.zeros(len(rows), dtype=torch.bool))


def test_joint_actor_returns_one_generation_and_the_parsed_role_texts_row_by_row():
    texts = [
        "<agent_0>a</agent_0><agent_1>b</agent_1>",
        "no tags",
        "<AGENT_1>y</agent_1> <agent_0>x</agent_0>",
    ]
    team = FakeTeam(texts)
    nodes = [Node(Episode(e, {"q": e}), 0, [[f"role0 p{e}"], [f"role1 p{e}"]], [[], []]) for e in range(2)]
    action = JointActor(team, TAGGED, 2).act(TurnState(0, nodes, 3))
    assert len(action.generations) == 1 and len(action.prompts) == 1  # one trained policy
    assert action.prompts[0] == team.prompts and len(team.prompts) == 2  # one joint prompt per node
    assert action.prompts[0][1].startswith("<chat>You are a centralized coordinator")
    assert "Agent 0 original prompt:\nrole0 p1\n\nAgent 1 original prompt:\nrole1 p1" in action.prompts[0][1]
    # rows g·K + k: node 0 gets texts 0, 1, 2; node 1 texts 0, 1, 2 again
    assert action.texts(0) == ["a", "", "x"] * 2 and action.texts(1) == ["b", "", "y"] * 2
    assert action.generations[0].texts == texts * 2  # the loss trains on the joint completions


def test_joint_actor_refuses_a_second_turn():
    node = Node(Episode(0, {}), 1, [["a", "b"], ["c", "d"]], [["x"], ["y"]])
    with pytest.raises(ValueError, match="acts at turn 0 only"):
        JointActor(FakeTeam(["t"]), TAGGED, 2).act(TurnState(1, [node], 2))


# ------------------------------------------------------------------ the module
class Recorded(LengthRatioReward):
    """The toy reward, recording every joint action it scores."""

    seen: list

    def __call__(self, joint_actions, episodes, turn):
        self.seen = getattr(self, "seen", []) + [list(map(list, joint_actions))]
        return super().__call__(joint_actions, episodes, turn)


def make(adapter=None, **kw):
    return CentralizedMAGRPO(
        "builtin:tiny-gpt2",
        adapter=adapter,
        learning_rate=1e-2,
        rollout=RolloutConfig(num_generations=3),
        sampling=SamplingConfig(max_new_tokens=10),
        **kw,
    )


def topics(reward, n=4):
    rows = [{"topic": t} for t in ("snow", "maps", "tea", "owls", "rain", "ink")[:n]]
    formatters = ["Short note on {topic}:", "Longer note on {topic}:"]
    return DecPOMDPDataModule(rows, formatters, reward, val_dataset=rows[:2], batch_size=2)


def test_one_model_one_optimizer_trains_on_the_joint_completions_the_roles_were_scored_from(trainer_factory):
    pl.seed_everything(0)
    got, reward = {}, Recorded()
    model = make(HalfAdapter())
    before = None

    class Grab(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            nonlocal before
            before = [p.detach().clone() for p in pl_module.agents[0].parameters()]

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            got["out"] = outputs

    update = model.update_agents
    model.update_agents = lambda turns: (got.__setitem__("turns", turns), update(turns))[1]
    trainer = trainer_factory(max_steps=2, callbacks=[Grab()])
    trainer.fit(model, topics(reward))
    assert trainer.global_step == 2 and len(trainer.optimizers) == 1  # one optimizer step per batch
    (turn,) = got["turns"]
    joint = turn.generations[0].texts
    assert len(turn.generations) == 1 and len(joint) == 2 * 3
    assert reward.seen[-1] == [
        [t[: len(t) // 2], t[len(t) // 2 :]] for t in joint
    ]  # roles from the joint text
    rewards = torch.tensor(LengthRatioReward()(reward.seen[-1], None, 0)).view(2, 3)
    centred, std = rewards - rewards.mean(1, keepdim=True), rewards.std(1, keepdim=True)
    expected = torch.where(std > 0, centred / (std + 1e-4), 0.0)  # group baseline over a node's K completions
    assert expected.abs().sum() > 0
    assert torch.allclose(turn.advantages[0], expected.flatten(), atol=1e-5)
    assert any(not torch.equal(b, p) for b, p in zip(before, model.agents[0].parameters()))
    out = got["out"]
    topic = turn.nodes[0].episode.data["topic"]
    assert out.user_prompts[0][0] == f"Short note on {topic}: / Longer note on {topic}:"  # the joint prompt
    assert out.completions == [joint] and out.turn0_rewards.shape == (2, 3)


@pytest.mark.parametrize("kl_mode", ["loss", "reward"])
def test_magrpo_loss_knobs_apply_to_the_joint_actor(trainer_factory, kl_mode):
    model = make(HalfAdapter(), loss=dict(beta=0.1, kl_mode=kl_mode, num_iterations=2, loss_type="dapo"))
    trainer = trainer_factory(max_steps=model.max_steps_for(1, 1, 2), log_every_n_steps=1)
    trainer.fit(model, topics(Recorded()))
    assert trainer.global_step == 2 and len(model.reference_models) == 1  # 2 iterations of the one optimizer
    assert not any(p.requires_grad for p in model.reference_models[0].parameters())


def test_parse_failures_are_scored_as_empty_roles_and_logged(trainer_factory):
    reward = Recorded()
    model = make()  # the tagged adapter: the random tiny model writes no tags
    trainer = trainer_factory(max_steps=1, limit_val_batches=1, val_check_interval=1)
    trainer.fit(model, topics(reward))
    assert reward.seen[0] == [["", ""]] * 6  # the training rollout: both roles empty in every joint action
    m = trainer.callback_metrics
    assert float(m["centralized/parse_failure"]) == 1.0 and float(m["centralized/empty_role"]) == 1.0
    assert float(m["val/centralized/parse_failure"]) == 1.0
    assert float(m["reward"]) == pytest.approx(LengthRatioReward().score("", ""))


def test_the_env_must_have_num_roles_formatters(trainer_factory):
    three = DecPOMDPDataModule([{"q": 1}] * 2, ["{q}", "{q}", "{q}"], LengthRatioReward(), batch_size=2)
    with pytest.raises(ValueError, match=r"the env has 3 formatters .* but model\.num_roles=2"):
        trainer_factory(max_steps=1).fit(make(), three)


# ------------------------------------------------------------------ exact resume
def run(trainer_factory, batches, ckpt_path=None, callbacks=(), **kwargs):
    pl.seed_everything(0)
    model = CentralizedMAGRPO("builtin:tiny-gpt2", adapter=HalfAdapter(), learning_rate=1e-3,
                              rollout=RolloutConfig(num_generations=2), sampling=SamplingConfig(max_new_tokens=12))  # fmt: skip
    callbacks = list(callbacks) if any(isinstance(c, Record) for c in callbacks) else [Record(), *callbacks]
    record = next(c for c in callbacks if isinstance(c, Record))
    trainer = trainer_factory(max_steps=batches, callbacks=callbacks, **kwargs)
    try:
        trainer.fit(
            model, LengthRatioDataModule(batch_size=2, num_train=8, shuffle=True), ckpt_path=ckpt_path
        )
    except Preempted:
        pass
    return model, record.batches


def test_an_interrupted_then_resumed_run_equals_the_uninterrupted_one_bit_for_bit(trainer_factory, tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    _, seen_a = run(trainer_factory, 6, callbacks=[Record(crash_at=3), saver], enable_checkpointing=True)
    (ckpt,) = os.listdir(tmp_path)
    resumed, seen_b = run(trainer_factory, 6, ckpt_path=str(tmp_path / ckpt))
    straight, seen_c = run(trainer_factory, 6)
    assert seen_a + seen_b == seen_c and len(seen_a) == 3
    for (name, a), b in zip(resumed.agents[0].named_parameters(), straight.agents[0].parameters()):
        assert torch.equal(a, b), name
    saved = torch.load(tmp_path / ckpt, weights_only=False)
    hparams = saved["hyper_parameters"]
    assert hparams["num_roles"] == 2 and "num_agents" not in hparams and "adapter" not in hparams
    restored = CentralizedMAGRPO.load_from_checkpoint(tmp_path / ckpt, adapter=HalfAdapter())
    assert isinstance(restored.adapter, HalfAdapter) and restored.rollout_config.num_generations == 2
    for name, p in restored.agents[0].named_parameters():
        assert torch.equal(p, saved["state_dict"][f"agents.0.{name}"]), name


# ------------------------------------------------------------------ the shipped configs from the CLI
def test_the_toy_config_fits_from_the_cli_and_logs_the_parse_metrics(tmp_path):
    os.chdir(ROOT)
    main(["fit", *experiment("toy_centralized_magrpo.yaml"), "--trainer.enable_progress_bar=false",
          "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.log_every_n_steps=1",
          "--trainer.limit_val_batches=1", f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    (events,) = {
        os.path.dirname(p) for p in glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)
    }  # one run: its validation before fit and its fit write a file each
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(events)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"reward", "z_agent_0/loss", "centralized/parse_failure", "val/centralized/parse_failure"} <= tags
    assert "z_agent_1/loss" not in tags  # one trained model


def test_the_humaneval_config_runs_on_the_tiny_model(tmp_path, capsys):
    os.chdir(ROOT)
    main(["fit", *experiment("humaneval_centralized_magrpo.yaml"), "--model.init_args.agents=builtin:tiny-gpt2",
          "--model.init_args.sampling.max_new_tokens=8", "--model.init_args.sampling.max_prompt_length=256",
          "--trainer.limit_train_batches=1", "--data.init_args.max_val_samples=2", "--data.init_args.val_batch_size=2",
          "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert "val/pass@1: 0.000 -> 0.000" in capsys.readouterr().out
    assert list(tmp_path.rglob("agents/*/agent_0/config.json")) and not list(
        tmp_path.rglob("agents/*/agent_1")
    )
