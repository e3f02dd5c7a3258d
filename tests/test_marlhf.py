"""MARLHF: the joint reward model (Bradley-Terry, saved and reloaded as an HF sequence classifier),
MARLHF as the chosen RL module, phase 2 scored by the learned model, bit-exact resume of both phases."""

import os
import signal

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from comlrl_lightning import IAC, MAAC, MAGRPO, MAREINFORCE, MARLHF, MARLOO, RewardModelConfig
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.reward_model import JOINT_RESPONSE_TEMPLATE, RewardModelReward, sequence_logits
from comlrl_lightning.infra.checkpoint_io import AtomicCheckpointIO
from comlrl_lightning.preference.joint_reward_model import (
    RewardFitState,
    bradley_terry_loss,
    fit_reward_model,
    load_reward_backbone,
    pair_texts,
    save_reward_model,
)
from comlrl_lightning.preference.pairs import PreferencePair, write_pairs

TINY = "builtin:tiny-gpt2"


def separable_pairs(n=12):
    """Chosen joint actions shout, rejected ones whisper: a reward model can tell them apart."""
    return [
        PreferencePair(
            prompts=[f"note {i}", f"reply {i}"],
            chosen=["YES YES YES", "GOOD GOOD"],
            rejected=[f"no {i}", "meh"],
            episode={"topic": f"t{i}"},
        )
        for i in range(n)
    ]


def marlhf(tmp_path, rl_algorithm="magrpo", epochs=2, pairs_path=None, rm_dir="rm", **pref):
    return MARLHF(
        agents=[TINY, TINY],
        rl_algorithm=rl_algorithm,
        rollout=dict(num_generations=2),
        sampling=dict(max_new_tokens=6),
        learning_rate=1e-3,
        val_sampling=True,
        reward_model=dict(
            reward_num_train_epochs=epochs,
            reward_learning_rate=1e-3,
            reward_train_batch_size=2,
            reward_val_fraction=0.25,
            reward_model_dir=str(tmp_path / rm_dir),
        ),
        preference=dict(preference_num_candidates=3, preference_pairs_per_sample=2, **pref),
        pair_source=dict(pairs_path=pairs_path, preference_num_prompts=4, preference_batch_size=2),
    )


def data():
    return LengthRatioDataModule(num_train=8, num_val=2, batch_size=2, seed=0)


class Preempted(Exception):
    pass


class Record(pl.Callback):
    """Keeps every StepOutput; raises :class:`Preempted` at batch ``crash_at``."""

    def __init__(self, crash_at=None):
        self.outputs, self.crash_at = [], crash_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if len(self.outputs) == self.crash_at:
            raise Preempted

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.outputs.append(outputs)


def fit(trainer_factory, module, batches, ckpt_path=None, callbacks=(), **kw):
    trainer = trainer_factory(max_steps=MAGRPO.max_steps_for(batches, 2), callbacks=list(callbacks), **kw)
    try:
        trainer.fit(module, data(), ckpt_path=ckpt_path)
    except Preempted:
        pass
    return trainer


def params(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def assert_same(a, b, what):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k}"


# ------------------------------------------------------------------ MARLHF is the chosen module
@pytest.mark.parametrize(
    "algorithm,cls",
    [("magrpo", MAGRPO), ("mareinforce", MAREINFORCE), ("marloo", MARLOO), ("iac", IAC), ("maac", MAAC)],
)
def test_marlhf_is_an_instance_of_the_chosen_rl_module_and_rebuilds_from_its_hparams(
    tmp_path, algorithm, cls
):
    m = marlhf(tmp_path, algorithm)
    assert isinstance(m, MARLHF) and isinstance(m, cls)
    if algorithm == "marloo":
        assert m.advantage.advantage_mode == "rloo"
    again = MARLHF(**m.hparams)  # what load_from_checkpoint does
    assert type(again) is type(m) and dict(again.hparams) == dict(m.hparams)
    assert m.hparams["rollout"]["num_generations"] == 2 and m.hparams["rl_algorithm"] == algorithm


# ------------------------------------------------------------------ the reward model
def test_bradley_terry_loss_is_minus_log_sigmoid_of_the_margin():
    c, r = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 1.0])
    expected = (
        -(
            torch.sigmoid(torch.tensor(2.0)).log()
            + torch.tensor(0.5).log()
            + torch.sigmoid(torch.tensor(-2.0)).log()
        )
        / 3
    )
    assert torch.allclose(bradley_terry_loss(c, r), expected)
    assert torch.allclose(bradley_terry_loss(c + 5.0, r + 5.0), expected)  # a shared bias cancels


def test_reward_model_learns_separable_pairs_and_reloads_as_a_reward_model_reward(tmp_path):
    torch.manual_seed(0)
    model, tok = load_reward_backbone(TINY)
    cfg = RewardModelConfig(
        reward_learning_rate=3e-3,
        reward_num_train_epochs=4,
        reward_train_batch_size=2,
        reward_val_fraction=0.25,
    )
    rm = RewardModelReward(TINY, template=JOINT_RESPONSE_TEMPLATE)
    pairs = separable_pairs()
    logged = []
    state = fit_reward_model(
        model, tok, rm, RewardFitState([p.to_json() for p in pairs]), cfg, log=lambda m, e: logged.append(m)
    )
    first, last = logged[0], logged[-1]
    assert last["reward_model/loss"] < first["reward_model/loss"] < 0.75  # log 2 ~ 0.69 before learning
    assert last["val/reward_model/accuracy"] == 1.0 and last["val/reward_model/loss"] < 0.3
    assert state.epoch == 4 and len(state.history) == 4
    # saved as an HF folder: RewardModelReward(kind="sequence_classification") scores it identically
    save_reward_model(model, tok, str(tmp_path / "rm"), {"template": JOINT_RESPONSE_TEMPLATE})
    reloaded = RewardModelReward(
        str(tmp_path / "rm"), kind="sequence_classification", template=JOINT_RESPONSE_TEMPLATE
    )
    chosen, rejected = pair_texts(rm, pairs)
    with torch.no_grad():
        direct = sequence_logits(model, tok, chosen + rejected, None, torch.device("cpu"))[:, 0]
    assert torch.allclose(reloaded.score_texts(chosen + rejected), direct, atol=1e-6)
    # and as a reward function it renders the same text from the episode and the agents' prompts
    p = pairs[0]
    reloaded.observe = lambda ep, i: p.prompts[i]
    (score,) = reloaded([p.chosen], [Episode(0, p.episode)], 0)
    assert score == pytest.approx(float(direct[0]), abs=1e-6)


def test_a_frozen_reward_model_scores_in_eval_mode_even_after_fit_put_it_in_train_mode(tmp_path):
    model, tok = load_reward_backbone(TINY)
    model.config.resid_pdrop = model.config.embd_pdrop = 0.5
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5
    rm = RewardModelReward(TINY)
    rm._model, rm._tokenizer = model, tok
    model.train()  # what Lightning's fit does to every submodule
    a, b = rm.score_texts(["some joint text"]), rm.score_texts(["some joint text"])
    assert torch.equal(a, b) and not model.training


# ------------------------------------------------------------------ the two phases
def test_phase2_trains_against_the_learned_model_and_validates_with_the_task_reward(
    trainer_factory, tmp_path
):
    pl.seed_everything(0)
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, separable_pairs(8))
    m = marlhf(tmp_path, pairs_path=str(path))
    rec = Record()
    fit(trainer_factory, m, 2, callbacks=[rec])
    rm = m.joint_reward_model
    assert m.reward_info["num_pairs"] == 8 and os.path.exists(tmp_path / "rm" / "marlhf.json")
    out = rec.outputs[-1]
    k = out.num_generations
    for e in range(out.num_episodes):
        for j in range(k):
            joint = [out.completions[i][e * k + j] for i in range(2)]
            text = rm.render(joint, Episode(0, {}), 0, [out.user_prompts[i][e] for i in range(2)])
            assert out.turn0_rewards[e, j].item() == pytest.approx(rm.score_texts([text]).item(), abs=1e-5)
    assert m.rollout_env(evaluation=True) is m.env  # validation: the task's reward
    assert m.rollout_env(evaluation=False).reward_fn.functions == [rm]


def test_phase1_builds_pairs_from_rollouts_of_the_initial_policy(trainer_factory, tmp_path):
    pl.seed_everything(0)
    m = marlhf(tmp_path, epochs=1)
    fit(trainer_factory, m, 1)
    from comlrl_lightning.preference.pairs import read_pairs

    pairs = read_pairs(tmp_path / "rm" / "pairs.jsonl", 2)
    assert 0 < len(pairs) <= 4 * 2 and len(pairs) == m.reward_info["num_pairs"]
    assert all(p.chosen_reward > p.rejected_reward for p in pairs)  # reward_gap: no ties
    prompts = {tuple(p.prompts) for p in pairs}
    assert 1 <= len(prompts) <= 4  # from the first preference_num_prompts=4 training prompts


def test_interrupted_reward_phase_resumes_bit_exact(trainer_factory, tmp_path):
    class Stop(Exception):
        pass

    def stop_after_first(epoch):
        if epoch == 0:
            raise Stop

    pl.seed_everything(0)
    a = marlhf(tmp_path, epochs=3, rm_dir="rm_a")
    a.after_reward_epoch = stop_after_first
    with pytest.raises(Stop):
        fit(trainer_factory, a, 2)
    assert os.path.exists(tmp_path / "rm_a" / "phase1_state.pt")
    assert not os.path.exists(tmp_path / "rm_a" / "marlhf.json")
    pl.seed_everything(0)
    resumed = marlhf(tmp_path, epochs=3, rm_dir="rm_a")  # a fresh process state, the same folder
    fit(trainer_factory, resumed, 2)
    pl.seed_everything(0)
    straight = marlhf(tmp_path, epochs=3, rm_dir="rm_c")
    fit(trainer_factory, straight, 2)
    assert len(resumed.reward_info["history"]) == 3
    assert resumed.reward_info["history"] == straight.reward_info["history"]
    assert_same(params(resumed.reward_models), params(straight.reward_models), "reward model")
    assert_same(params(resumed.agents), params(straight.agents), "agents")
    assert not os.path.exists(tmp_path / "rm_a" / "phase1_state.pt")


def test_rl_phase_resumes_bit_exact_from_a_checkpoint_holding_the_trained_reward_model(
    trainer_factory, tmp_path
):
    pl.seed_everything(0)
    a = marlhf(tmp_path, rm_dir="rm_a")
    saver = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=MAGRPO.max_steps_for(1, 2), save_top_k=-1
    )
    fit(
        trainer_factory,
        a,
        3,
        callbacks=[Record(crash_at=1), saver],
        enable_checkpointing=True,
        plugins=[AtomicCheckpointIO()],
    )
    (ckpt,) = os.listdir(tmp_path / "ckpt")
    saved = torch.load(tmp_path / "ckpt" / ckpt, weights_only=False)
    assert saved["marlhf"]["reward_phase_done"] and any(
        k.startswith("reward_models.0.") for k in saved["state_dict"]
    )
    # resumed in a fresh module whose reward_model_dir holds nothing: the weights come from the checkpoint
    pl.seed_everything(0)
    resumed = marlhf(tmp_path, rm_dir="rm_empty")
    fit(trainer_factory, resumed, 3, ckpt_path=str(tmp_path / "ckpt" / ckpt))
    assert not os.path.exists(tmp_path / "rm_empty")  # phase 1 did not run again
    pl.seed_everything(0)
    straight = marlhf(tmp_path, rm_dir="rm_c")
    fit(trainer_factory, straight, 3)
    assert_same(params(resumed.reward_models), params(straight.reward_models), "reward model")
    assert_same(params(resumed.agents), params(straight.agents), "agents")


def test_a_finished_reward_model_folder_is_loaded_not_trained_again(trainer_factory, tmp_path):
    pl.seed_everything(0)
    first = marlhf(tmp_path, epochs=1)
    fit(trainer_factory, first, 1)
    pl.seed_everything(0)  # another seed is refused (tests/test_silent_cases.py): the folder records it
    second = marlhf(tmp_path, epochs=1)
    second.after_reward_epoch = lambda epoch: pytest.fail("trained again instead of loading the folder")
    fit(trainer_factory, second, 1)
    assert_same(params(first.reward_models), params(second.reward_models), "reward model")
    assert second.reward_info == first.reward_info


# ------------------------------------------------------------------ the CLI
TINY_TEAM = "[{model: builtin:tiny-gpt2}, {model: builtin:tiny-gpt2}]"
SMALL_PHASE1 = [
    "--model.init_args.pair_source.preference_num_prompts=4",
    "--model.init_args.sampling.max_new_tokens=8",
    "--model.init_args.reward_model.reward_num_train_epochs=1",
]


def test_toy_marlhf_config_trains_the_reward_model_then_the_agents_from_the_cli(tmp_path):
    from experiments import ROOT, experiment
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from comlrl_lightning.cli import main

    os.chdir(ROOT)
    main(
        [
            "fit",
            *experiment("toy_marlhf.yaml"),
            *SMALL_PHASE1,
            "--trainer.max_steps=4",
            "--trainer.limit_val_batches=1",
            "--trainer.val_check_interval=2",
            "--trainer.log_every_n_steps=1",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    (done,) = tmp_path.rglob("reward_model/marlhf.json")
    assert (done.parent / "model.safetensors").exists() and (done.parent / "pairs.jsonl").exists()
    (events,) = {
        p.parent for p in tmp_path.rglob("events.out.tfevents.*")
    }  # validation before fit: a file too
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "reward_model/loss",
        "reward_model/accuracy",
        "val/reward_model/loss",
        "val/reward_model/accuracy",
    } <= tags
    assert {"reward", "rewards/joint_reward_model/mean", "z_agent_0/loss", "val/reward"} <= tags
    assert "marlhf/task_reward" in tags  # the config's log_task_reward: the gold reward in TensorBoard


def test_humaneval_marlhf_config_runs_on_the_tiny_model_from_a_users_pair_file(tmp_path, capsys):
    """Random tiny agents solve nothing, so their candidates all tie and make no pairs: the pairs come
    from a file (the human-preference path), the task reward still validates."""
    from experiments import ROOT, experiment

    from comlrl_lightning.cli import main

    os.chdir(ROOT)
    main(
        [
            "fit",
            *experiment("humaneval_marlhf.yaml"),
            f"--model.init_args.agents={TINY_TEAM}",
            *SMALL_PHASE1,
            "--model.init_args.sampling.max_prompt_length=256",
            "--model.init_args.pair_source.pairs_path=configs/data/marlhf_pairs_example.jsonl",
            "--trainer.limit_train_batches=1",
            "--data.init_args.max_val_samples=2",
            "--data.init_args.val_batch_size=2",
            "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    assert "val/pass@1: 0.000 -> 0.000" in capsys.readouterr().out  # validation: the sandboxed task reward
    assert list(tmp_path.rglob("reward_model/marlhf.json"))


@pytest.mark.parametrize("algorithm,n_critics", [("iac", 0), ("maac", 1), ("mareinforce", 0)])
def test_phase2_runs_with_actor_critics_and_raw_advantages(trainer_factory, tmp_path, algorithm, n_critics):
    pl.seed_everything(0)
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, separable_pairs(4))
    m = marlhf(tmp_path, algorithm, epochs=1, pairs_path=str(path))
    rec = Record()
    steps = m.max_steps_for(1, 2, 1, n_critics) if n_critics else m.max_steps_for(1, 2)
    trainer = trainer_factory(max_steps=steps, callbacks=[rec])
    trainer.fit(m, data())
    rm = m.joint_reward_model
    out = rec.outputs[-1]
    joint = [out.completions[i][0] for i in range(2)]
    text = rm.render(joint, Episode(0, {}), 0, [out.user_prompts[i][0] for i in range(2)])
    assert out.turn0_rewards[0, 0].item() == pytest.approx(rm.score_texts([text]).item(), abs=1e-5)
    assert m.reward_info["num_pairs"] == 4


def test_reward_freeze_backbone_trains_only_the_scalar_head():
    torch.manual_seed(0)
    model, tok = load_reward_backbone(TINY)
    base0, head0 = params(model.base_model), model.score.weight.detach().clone()
    cfg = RewardModelConfig(reward_learning_rate=1e-2, reward_freeze_backbone=True, reward_train_batch_size=4)
    rm = RewardModelReward(TINY, template=JOINT_RESPONSE_TEMPLATE)
    fit_reward_model(model, tok, rm, RewardFitState([p.to_json() for p in separable_pairs(8)]), cfg)
    assert_same(params(model.base_model), base0, "frozen backbone")
    assert not torch.equal(model.score.weight, head0)


# ------------------------------------------------------------------ the gold-reward diagnostic
def test_gold_reward_probe_keeps_the_learned_values_and_reports_the_task_reward_beside_them():
    from comlrl_lightning.envs.reward_model import GOLD_KEY, GoldRewardProbe
    from comlrl_lightning.envs.rewards import RewardResult, as_weighted_reward

    def learned(ja, eps, turn):
        return RewardResult([10.0 * len(j[0]) for j in ja], {"seen": [1.0] * len(ja)})

    def per_agent(ja, eps, turn):  # [J, N]: the probe reports the mean over agents
        return [[float(len(t)) for t in j] for j in ja]

    probe = GoldRewardProbe(learned, as_weighted_reward(per_agent))
    out = probe([["ab", "c"], ["abcd", "ef"]], [Episode(0, {})] * 2, 0)
    assert out.values == [20.0, 40.0] and out.metrics["seen"] == [1.0, 1.0]
    assert out.metrics[GOLD_KEY] == [1.5, 3.0] and probe.name == "learned"
    with pytest.raises(ValueError, match="log_task_reward: got 'yes'"):
        RewardModelConfig(log_task_reward="yes").check()


def logging_task_reward(tmp_path, on):
    """A seeded MARLHF on a file of separable pairs, ``reward_model.log_task_reward`` set to ``on``."""
    pl.seed_everything(0)
    path = tmp_path / "pairs.jsonl"
    write_pairs(path, separable_pairs(8))
    m = marlhf(tmp_path, pairs_path=str(path))
    m.reward_config.log_task_reward = on
    return m


@pytest.mark.parametrize("on", [True, False])
def test_rl_phase_logs_the_task_reward_of_its_joint_actions_beside_the_learned_one(
    trainer_factory, tmp_path, on
):
    from comlrl_lightning.core import metrics as M

    class Logged(pl.Callback):
        def __init__(self):
            self.rows = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.rows.append((outputs, list(batch), dict(trainer.callback_metrics)))

    m = logging_task_reward(tmp_path, on)
    logged = Logged()
    fit(trainer_factory, m, 2, callbacks=[logged])
    assert len(logged.rows) == 2
    for out, batch, metrics in logged.rows:
        if not on:
            assert M.MARLHF_TASK_REWARD not in metrics
            continue
        k = out.num_generations
        joint = [
            [out.completions[i][e * k + j] for i in range(2)] for e in range(len(batch)) for j in range(k)
        ]
        episodes = [batch[e] for e in range(len(batch)) for _ in range(k)]
        task = m.env.reward(joint, episodes, 0).total.mean().item()  # LengthRatioReward, the env's own
        assert float(metrics[M.MARLHF_TASK_REWARD]) == pytest.approx(task, abs=1e-6)
        assert float(metrics[M.REWARD]) == pytest.approx(out.rewards.mean().item(), abs=1e-6)
        assert abs(task - out.rewards.mean().item()) > 1e-3  # the learned reward is another number
        rm = m.joint_reward_model  # the update still trains on the learned reward alone
        texts = [
            rm.render(ja, Episode(0, {}), 0, [out.user_prompts[i][n // k] for i in range(2)])
            for n, ja in enumerate(joint)
        ]
        assert out.turn0_rewards.flatten().tolist() == pytest.approx(rm.score_texts(texts).tolist(), abs=1e-5)


def test_a_failing_task_reward_that_is_only_logged_does_not_stop_the_rl_phase(
    trainer_factory, tmp_path, monkeypatch
):
    # before the fix the probe's task-reward error ended the RL phase (it is logged, never trained on)
    from comlrl_lightning.algorithms import marlhf as marlhf_module
    from comlrl_lightning.core import metrics as M
    from comlrl_lightning.envs.reward_model import GoldRewardProbe

    def down(joint_actions, episodes, turn):
        raise RuntimeError("sandbox down")

    probes = []

    class FailingGold(GoldRewardProbe):
        def __init__(self, reward, gold):
            super().__init__(reward, down)
            probes.append(self)

    monkeypatch.setattr(marlhf_module, "GoldRewardProbe", FailingGold)
    m = logging_task_reward(tmp_path, True)
    rec = Record()
    with pytest.warns(UserWarning, match=r"reward_model\.log_task_reward: the task reward raised RuntimeError: "
                                         r"sandbox down \(1 failed call\(s\) so far\)"):  # fmt: skip
        trainer = fit(trainer_factory, m, 3, callbacks=[rec])
    assert len(rec.outputs) == 3 and trainer.global_step == 6  # every RL step ran (2 agents a batch)
    assert len(probes) == 1 and probes[0].failures == 3  # one reward call a step, each counted
    assert M.MARLHF_TASK_REWARD not in trainer.callback_metrics  # no made-up value logged


def test_sigterm_in_the_reward_phase_stops_after_that_epoch_and_resumes_bit_exact(trainer_factory, tmp_path):
    # before the fix a SIGTERM during phase 1 was acted on only at the first RL batch: every remaining
    # reward-model epoch ran first (a preemption grace period can be shorter than that)
    from comlrl_lightning.callbacks import InterruptCheckpoint

    def term_after_first(epoch):
        if epoch == 0:
            os.kill(os.getpid(), signal.SIGTERM)

    pl.seed_everything(0)
    a = marlhf(tmp_path, epochs=3, rm_dir="rm_a")
    a.after_reward_epoch = term_after_first
    stop = InterruptCheckpoint(dirpath=str(tmp_path / "ckpt"))
    with pytest.raises(SystemExit) as info:
        fit(trainer_factory, a, 2, callbacks=[stop])
    assert info.value.code == 128 + signal.SIGTERM
    assert (
        tmp_path / "rm_a" / "phase1_state.pt"
    ).exists()  # phase 1 stopped (else it finished, state removed)
    assert torch.load(tmp_path / "rm_a" / "phase1_state.pt", weights_only=False)["epoch"] == 1
    assert not os.path.exists(tmp_path / "rm_a" / "marlhf.json")  # phase 1 not finished
    pl.seed_everything(0)
    resumed = marlhf(tmp_path, epochs=3, rm_dir="rm_a")
    fit(trainer_factory, resumed, 2, ckpt_path=stop.ckpt_path)
    pl.seed_everything(0)
    straight = marlhf(tmp_path, epochs=3, rm_dir="rm_c")
    fit(trainer_factory, straight, 2)
    assert resumed.reward_info["history"] == straight.reward_info["history"]
    assert_same(params(resumed.reward_models), params(straight.reward_models), "reward model")
    assert_same(params(resumed.agents), params(straight.agents), "agents")
