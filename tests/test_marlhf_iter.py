"""Iterative MARLHF on tiny models: rounds of build (current vs comparator), a reward model re-initialised
from its backbone and trained on the round's pairs, then the chosen RL module against it; ordering by
the previous round's reward model; bit-exact resume in the build, the reward-model and RL sub-phases
and at a round boundary; both configs from the CLI."""

from __future__ import annotations

import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from local_http import chat_reply, serving

from comlrl_lightning import IAC, MAGRPO, MARLHFIter
from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.records import StepOutput
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.envs.reward_model import sequence_logits
from comlrl_lightning.preference.joint_reward_model import load_reward_backbone, pair_texts
from comlrl_lightning.preference.pairs import read_pairs

TINY = "builtin:tiny-gpt2"
server_factory = pytest.fixture(serving)
K, BATCH, TRAIN, RM_EPOCHS = 2, 2, 4, 2
BUILD, RL = TRAIN // BATCH, TRAIN // BATCH  # training steps of a round's build and RL phase
ROUND = BUILD + RM_EPOCHS + RL


def _module(rl_algorithm="magrpo", **kw):
    args = dict(
        agents=[TINY, TINY],
        rl_algorithm=rl_algorithm,
        rollout=dict(num_generations=2),
        sampling=dict(max_new_tokens=6),
        learning_rate=1e-3,
        reward_model=dict(
            reward_num_train_epochs=RM_EPOCHS,
            reward_learning_rate=1e-3,
            reward_train_batch_size=2,
            reward_val_fraction=0.25,
        ),
        preference=dict(preference_num_candidates=K, preference_pairs_per_sample=2),
        rounds=dict(num_rounds=2),
        comparator=dict(comparator_policy="current_copy"),
        rl_phase=dict(num_train_epochs=1),
    )
    args.update(kw)
    return MARLHFIter(**args)


def _data(shuffle=False):
    return LengthRatioDataModule(num_train=TRAIN, num_val=2, batch_size=BATCH, seed=0, shuffle=shuffle)


def _rm(model):
    return {k: v.detach().clone() for k, v in model.reward_models[model._rm_index].state_dict().items()}


class Record(pl.Callback):
    """Per training step: (round, phase, position) before it, its output; the reward model before
    each build's first step."""

    def __init__(self):
        self.steps, self.rm_before_build = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        state = (pl_module.round, pl_module._phase, pl_module._position)
        if state[1:] == ("build", 0):
            self.rm_before_build.append(_rm(pl_module))
        self.before = state

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps.append((self.before, outputs))


def test_two_rounds_reinitialise_the_reward_model_train_it_then_run_rl_against_it(trainer_factory, tmp_path):
    pl.seed_everything(0)
    model, rec = _module(), Record()
    fresh = []  # the reward model right after each re-initialisation, before its first step
    reinit = model.reinit_reward_model
    model.reinit_reward_model = lambda: (reinit(), fresh.append(_rm(model)))
    assert isinstance(model, MARLHFIter) and isinstance(model, MAGRPO)
    assert type(MARLHFIter(**model.hparams)) is type(model)  # what load_from_checkpoint does
    trainer = trainer_factory(max_steps=-1, max_epochs=100, callbacks=[rec], default_root_dir=tmp_path)
    trainer.fit(model, _data())
    assert model.round == 2 and trainer.should_stop
    phases = [(r, phase) for (r, phase, _), _ in rec.steps]
    one = ["build"] * BUILD + ["reward"] * RM_EPOCHS + ["rl"] * RL
    assert phases == [(r, p) for r in range(2) for p in one]
    assert trainer.global_step == 2 * len(rec.steps)  # build and reward steps count N skipped steps
    outs = [o for (_, phase, _), o in rec.steps if phase == "rl"]
    assert all(isinstance(o, StepOutput) and o.num_episodes == BATCH for o in outs)
    shards = [read_pairs(tmp_path / "preference_replay" / f"round_{r}.jsonl", 2) for r in range(2)]
    assert all(0 < len(s) <= TRAIN * 2 for s in shards)
    assert model.reward_info["round"] == 1 and model.reward_info["num_pairs"] == len(shards[1])
    assert len(model.reward_info["history"]) == RM_EPOCHS
    assert "val/reward_model/accuracy" in model.reward_info["history"][-1]
    # each round's reward model starts from a fresh load of its backbone, not the last round's weights
    fresh0, fresh1 = fresh
    torch.manual_seed(model.reward_config.reward_seed)
    loaded, _ = load_reward_backbone(TINY)
    for name, value in loaded.state_dict().items():
        assert torch.equal(fresh1[name], value) and torch.equal(fresh0[name], value), name
    trained0 = rec.rm_before_build[1]  # round 0's trained model, as round 1's build began
    assert any(not torch.equal(trained0[k], fresh1[k]) for k in fresh1)
    # saved as an HF folder per round; the earlier one removed
    assert sorted(os.listdir(tmp_path / "reward_model")) == ["round_1"]
    assert os.path.exists(tmp_path / "reward_model" / "round_1" / "marlhf.json")
    m = trainer.callback_metrics
    assert int(m[M.PAIRS_TOTAL]) == sum(len(s) for s in shards) and int(m[M.PAIRS_CURRENT]) == len(shards[1])
    assert float(m[M.SAMPLES]) == 2 * TRAIN * (K + K)


def test_reward_model_scoring_orders_round_1_by_round_0s_model_and_round_0_by_the_task(
    trainer_factory, tmp_path
):
    pl.seed_everything(0)
    model, rec = _module(rounds=dict(num_rounds=2, preference_scoring_reward="reward_model")), Record()
    trainer = trainer_factory(max_steps=-1, max_epochs=100, callbacks=[rec], default_root_dir=tmp_path)
    trainer.fit(model, _data())
    shards = [read_pairs(tmp_path / "preference_replay" / f"round_{r}.jsonl", 2) for r in range(2)]
    rm, tok = model.joint_reward_model, model.joint_reward_model._tokenizer
    net, _ = load_reward_backbone(TINY)

    def scores(weights, pairs):
        net.load_state_dict(weights)
        net.eval()
        chosen, rejected = pair_texts(rm, pairs)
        with torch.no_grad():
            logits = sequence_logits(net, tok, chosen + rejected, rm.max_length, torch.device("cpu"))[:, 0]
        return logits[: len(pairs)], logits[len(pairs) :]

    c, r = scores(rec.rm_before_build[1], shards[1])  # round 0's trained model
    assert torch.allclose(c, torch.tensor([p.chosen_reward for p in shards[1]]), atol=1e-5)
    assert torch.allclose(r, torch.tensor([p.rejected_reward for p in shards[1]]), atol=1e-5)
    assert all(p.chosen_reward > p.rejected_reward for p in shards[1])
    # round 0 (no model trained yet) is ordered by the task reward: exp(-distance), in (0, 1]
    c0, _ = scores(rec.rm_before_build[1], shards[0])
    assert all(0.0 < p.rejected_reward < p.chosen_reward <= 1.0 for p in shards[0])
    assert not torch.allclose(c0, torch.tensor([p.chosen_reward for p in shards[0]]), atol=1e-3)


def test_a_round_without_pairs_skips_the_reward_model_and_rl(trainer_factory, tmp_path, monkeypatch):
    from comlrl_lightning.algorithms import round_loop

    real = round_loop.build_candidates

    def tied(*args, **kwargs):  # every candidate tied: no pair
        built = real(*args, **kwargs)
        built.pairs = []
        return built

    monkeypatch.setattr(round_loop, "build_candidates", tied)
    pl.seed_everything(0)
    model, rec = _module(), Record()
    trainer = trainer_factory(max_steps=-1, max_epochs=100, callbacks=[rec], default_root_dir=tmp_path)
    trainer.fit(model, _data())
    assert model.round == 2 and [p for (_, p, _), _ in rec.steps] == ["build"] * (2 * BUILD)
    assert int(trainer.callback_metrics[M.PAIRS_TRAIN]) == 0 and not os.path.exists(tmp_path / "reward_model")


def test_rl_phase_is_the_chosen_actor_critic_module(trainer_factory, tmp_path):
    pl.seed_everything(0)
    model = _module("iac", rollout=dict(num_generations=2), rounds=dict(num_rounds=1))
    assert isinstance(model, IAC)
    model.configure_model()
    before = [[p.detach().clone() for p in c.parameters()] for c in model.critics]
    trainer = trainer_factory(max_steps=-1, max_epochs=100, default_root_dir=tmp_path)
    trainer.fit(model, _data())
    assert model.round == 1
    # IAC's own step ran in the RL phase: every critic moved (CoMLRL's actor-critic against the model)
    for b, critic in zip(before, model.critics):
        assert any(not torch.equal(x, p) for x, p in zip(b, critic.parameters()))


@pytest.mark.parametrize(
    "comparator",
    [
        dict(comparator_policy="current"),
        dict(comparator_policy="model", comparator_model_name=TINY, comparator_num_candidates=3),
        dict(comparator_policy="current_copy", comparator_generation_mode="centralized"),
        "api",
    ],
    ids=["current", "model", "current_copy-centralized", "api"],
)
def test_every_comparator_runs_a_round_in_a_fit(trainer_factory, tmp_path, server_factory, comparator):
    if comparator == "api":
        srv = server_factory(handler=lambda r: chat_reply([f"x{j}" * (j + 1) for j in range(r["body"]["n"])]))
        comparator = dict(
            comparator_policy="api",
            comparator_api_url=srv.url,
            comparator_api_format="openai_chat",
            comparator_api_model="tiny",
            comparator_api_timeout=10.0,
        )
    pl.seed_everything(0)
    model, rec = _module(comparator=comparator, rounds=dict(num_rounds=1)), Record()
    trainer = trainer_factory(max_steps=-1, max_epochs=100, callbacks=[rec], default_root_dir=tmp_path)
    trainer.fit(model, _data())
    assert model.round == 1 and model.samples_generated == TRAIN * (
        K + comparator.get("comparator_num_candidates", K)
    )
    pairs = read_pairs(tmp_path / "preference_replay" / "round_0.jsonl", 2)
    assert 0 < len(pairs) <= TRAIN * 2 and all(p.chosen_reward > p.rejected_reward for p in pairs)
    assert [p for (_, p, _), _ in rec.steps] == ["build"] * BUILD + ["reward"] * RM_EPOCHS + ["rl"] * RL


class Preempted(Exception):
    pass


def _run(trainer_factory, root, ckpt_path=None, callbacks=(), crash_at=None, **kw):
    pl.seed_everything(0)
    model = _module(
        rounds=dict(num_rounds=2, preference_scoring_reward="reward_model"),
        comparator=dict(comparator_policy="history", comparator_history_k=1),
        replay=dict(preference_replay_mode="lambda_decay", preference_replay_lambda=0.5),
    )

    class Crash(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if crash_at is not None and trainer.global_step == 2 * crash_at:
                raise Preempted  # after the checkpoint of step crash_at

    trainer = trainer_factory(
        max_steps=-1, max_epochs=100, callbacks=[Crash(), *callbacks], default_root_dir=root, **kw
    )
    try:
        trainer.fit(model, _data(shuffle=True), ckpt_path=ckpt_path)
    except Preempted:
        pass
    return model


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    from conftest import tiny_trainer

    root = tmp_path_factory.mktemp("straight")
    return _run(tiny_trainer, root), root


# training steps done at the checkpoint -> (round, phase, position) it holds
CRASHES = {
    1: (0, "build", BATCH),  # inside round 0's build
    BUILD: (0, "reward", 0),  # the build done, the reward model not yet re-initialised
    BUILD + 1: (0, "reward", 1),  # after the reward model's first epoch
    BUILD + RM_EPOCHS + 1: (0, "rl", 1),  # inside the RL phase
    ROUND: (1, "build", 0),  # the round boundary
    ROUND + 1: (1, "build", BATCH),  # round 1's build, scoring with round 0's reward model
}


@pytest.mark.parametrize("crash_at", sorted(CRASHES))
def test_resume_in_every_phase_is_bit_exact(trainer_factory, tmp_path, straight, crash_at):
    reference, root = straight
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2 * crash_at, save_top_k=-1)
    _run(trainer_factory, tmp_path, callbacks=[saver], crash_at=crash_at, enable_checkpointing=True)
    (ckpt,) = os.listdir(tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / ckpt, weights_only=False)
    state = saved["iterative"]
    assert (state["round"], state["phase"], state["position"]) == CRASHES[crash_at]
    # the weights while trained and needed: after a reward epoch, in RL, in a reward_model-scored build
    trained = (state["phase"] == "reward" and state["position"] > 0) or state["phase"] == "rl"
    keeps_rm = trained or state["round"] == 1
    assert any(k.startswith("reward_models.") for k in saved["state_dict"]) == keeps_rm
    assert (saved["marlhf_iter"]["reward_fit"] is not None) == (state["phase"] == "reward")
    resumed = _run(trainer_factory, tmp_path, ckpt_path=str(tmp_path / "ckpt" / ckpt))
    assert_same_run(resumed, tmp_path, reference, root)


def assert_same_run(resumed, resumed_root, reference, root):
    """The resumed fit ended where the straight one did: rounds, samples, every round's pairs, the
    reward model's history and weights, the replay's generator and every agent's weights."""
    assert resumed.round == reference.round == 2 and resumed.samples_generated == reference.samples_generated
    for r in range(2):
        name = f"preference_replay/round_{r}.jsonl"
        assert read_pairs(resumed_root / name) == read_pairs(root / name), name
    assert resumed.reward_info["history"] == reference.reward_info["history"]
    assert resumed.replay.rng.getstate() == reference.replay.rng.getstate()
    for a, b in zip(
        resumed.reward_models.state_dict().values(), reference.reward_models.state_dict().values()
    ):
        assert torch.equal(a, b)
    for i in range(2):
        for (name, a), b in zip(resumed.agents[i].named_parameters(), reference.agents[i].parameters()):
            assert torch.equal(a, b), f"agent {i} {name}"


def test_the_toy_config_trains_two_rounds_from_the_cli(tmp_path):
    import glob

    from experiments import ROOT, experiment
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from comlrl_lightning.cli import main

    os.chdir(ROOT)  # configs use paths relative to the repository root
    main(
        [
            "fit",
            *experiment("toy_marlhf_iterative.yaml"),
            "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.default_root_dir={tmp_path}",
            "--data.init_args.num_train=8",
            "--model.init_args.sampling.max_new_tokens=8",
            "--trainer.limit_val_batches=1",
        ]
    )
    shards = [read_pairs(tmp_path / "preference_replay" / f"round_{r}.jsonl", 2) for r in range(2)]
    assert len(list(tmp_path.rglob("reward_model/round_1/marlhf.json"))) == 1
    (events,) = {
        os.path.dirname(p) for p in glob.glob(str(tmp_path / "**" / "events.out.tfevents.*"), recursive=True)
    }  # one run: its validation before fit and its fit write a file each
    acc = EventAccumulator(events)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"pairs/current", "pairs/train", "pairs/total", "iter/round", "iter/samples", "val/reward"} <= tags
    assert {"reward_model/loss", "val/reward_model/accuracy", "reward", "z_agent_0/loss"} <= tags
    assert sorted({int(e.value) for e in acc.Scalars("iter/round")}) == [0, 1]
    assert {int(e.value) for e in acc.Scalars("pairs/current")} == {len(s) for s in shards}
    assert len(acc.Scalars("reward_model/loss")) == 2 * 2  # 2 rounds x reward_num_train_epochs


def test_the_humaneval_config_trains_two_rounds_on_the_tiny_team(tmp_path):
    from experiments import ROOT, experiment

    from comlrl_lightning.cli import main

    os.chdir(ROOT)
    main(
        [
            "fit",
            *experiment("humaneval_marlhf_iterative.yaml"),
            "--trainer.enable_progress_bar=false",
            "--model.init_args.agents=[{model: builtin:tiny-gpt2}, {model: builtin:tiny-gpt2}]",
            "--model.init_args.reward_model.reward_model=builtin:tiny-gpt2",
            "--model.init_args.sampling.max_new_tokens=8",
            "--model.init_args.sampling.max_prompt_length=256",
            "--model.init_args.reward_model.reward_max_length=256",
            "--trainer.limit_train_batches=1",
            "--data.init_args.max_val_samples=2",
            "--data.init_args.val_batch_size=2",
            "--validate_before_fit=false",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    shards = sorted(p.name for p in (tmp_path / "preference_replay").iterdir())
    assert shards == ["round_0.jsonl", "round_1.jsonl"]
    assert sorted(p.name for p in (tmp_path / "policy_checkpoints").iterdir()) == ["round_1"]


def test_rl_steps_per_round_are_passes_times_an_epochs_batches(monkeypatch):
    model = _module(rl_phase=dict(num_train_epochs=3))
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
    model.trainer = trainer
    monkeypatch.setattr(pl.Trainer, "num_training_batches", 5, raising=False)
    assert model.rl_steps_per_round == 15
    monkeypatch.setattr(pl.Trainer, "num_training_batches", float("inf"), raising=False)
    with pytest.raises(ValueError, match=r"rl_phase.num_train_epochs: the training dataloader has no length"):
        _ = model.rl_steps_per_round


def _interrupted(trainer_factory, root, where, monkeypatch):
    """A fit with ``InterruptCheckpoint`` whose SIGTERM lands inside a training step (``build``: after
    a build batch's candidates were sampled and scored, before they are kept; ``reward``: in the
    reward model's second epoch, after its first optimizer step), then the resumed fit."""
    import signal

    from comlrl_lightning.algorithms import joint_reward_model, round_loop
    from comlrl_lightning.callbacks import InterruptCheckpoint

    calls = {"build": 0, "epochs": 0, "losses": 0}
    real_build, real_eval, real_loss = (
        round_loop.build_candidates,
        joint_reward_model.evaluate_pairs,
        joint_reward_model.bradley_terry_loss,
    )

    def build(*args, **kw):
        out = real_build(*args, **kw)
        calls["build"] += 1
        if where == "build" and calls["build"] == 2:  # round 0's second build batch
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    def evaluate(*args, **kw):  # once at each epoch's end (held-out pairs; one loss call)
        calls["epochs"], calls["losses"] = calls["epochs"] + 1, 0
        return real_eval(*args, **kw)

    def loss(*args, **kw):
        calls["losses"] += 1
        if where == "reward" and calls["epochs"] == 1 and calls["losses"] == 3:  # a step into epoch 1
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(*args, **kw)

    patched = dict(evaluate_pairs=evaluate, bradley_terry_loss=loss)
    monkeypatch.setattr(round_loop, "build_candidates", build)
    for name, fn in patched.items():
        monkeypatch.setattr(joint_reward_model, name, fn)
    stop = InterruptCheckpoint(dirpath=str(root / "ckpt"))
    with pytest.raises(SystemExit) as info:
        _run(trainer_factory, root, callbacks=[stop])
    assert info.value.code == 128 + signal.SIGTERM
    monkeypatch.undo()
    phase = torch.load(stop.ckpt_path, weights_only=False)["iterative"]["phase"]
    assert phase == where
    return _run(trainer_factory, root, ckpt_path=stop.ckpt_path)


@pytest.mark.parametrize("where", ["build", "reward"])
def test_sigterm_inside_a_build_or_reward_step_resumes_bit_exact(
    trainer_factory, tmp_path, straight, where, monkeypatch
):
    # before the fix the abandoned step's half-done round state (the comparator's draws, the reward
    # model's weights part-way through an epoch) went into the checkpoint with the step before's counters
    reference, root = straight
    assert_same_run(_interrupted(trainer_factory, tmp_path, where, monkeypatch), tmp_path, reference, root)


def test_reward_model_scoring_does_not_run_the_task_reward_probe_in_the_build(
    trainer_factory, tmp_path, monkeypatch
):
    # before the fix the build scored with the RL phase's env, whose reward (log_task_reward) also ran
    # the task reward on every candidate, current and comparator, for a number nobody logged
    # (HumanEval: a sandboxed test run each)
    from comlrl_lightning.envs import reward_model

    phases, real = [], reward_model.GoldRewardProbe.__call__
    rec = Record()

    def probe(self, *args, **kw):
        phases.append(rec.before[1])
        return real(self, *args, **kw)

    monkeypatch.setattr(reward_model.GoldRewardProbe, "__call__", probe)
    pl.seed_everything(0)
    model = _module(
        rounds=dict(num_rounds=2, preference_scoring_reward="reward_model"),
        reward_model=dict(reward_num_train_epochs=1, reward_train_batch_size=2, log_task_reward=True),
    )
    trainer = trainer_factory(max_steps=-1, max_epochs=100, callbacks=[rec], default_root_dir=tmp_path)
    trainer.fit(model, _data())
    assert model.round == 2 and M.MARLHF_TASK_REWARD in trainer.callback_metrics
    built = [(r, p) for (r, p, _), _ in rec.steps if p == "build"]
    assert (1, "build") in built  # round 1's build scored with round 0's reward model
    assert set(phases) == {"rl"}  # the probe ran in the RL phases only


@pytest.mark.parametrize("limit", [dict(max_steps=6), dict(max_epochs=2), None])
def test_a_trainer_limit_that_ends_the_fit_before_the_last_round_is_warned(trainer_factory, tmp_path, limit):
    # before the fix the fit ended mid-round without a word (here: round 0's reward or RL phase)
    import warnings

    pl.seed_everything(0)
    model = _module(rounds=dict(num_rounds=1))
    args = {"max_steps": -1, "max_epochs": 100, "default_root_dir": tmp_path, **(limit or {})}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer_factory(**args).fit(model, _data())
    said = [str(w.message) for w in seen if "before the last round" in str(w.message)]
    if limit is None:
        assert model.round == 1 and not said
    else:
        assert model.round == 0 and len(said) == 1
        assert said[0].startswith("MARLHFIterMAGRPO: the fit ended in round 0 of rounds.num_rounds=1 (phase ")
