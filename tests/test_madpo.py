"""MADPO (preference/madpo.py): the joint DPO loss, both modes training, and exact resume."""

from __future__ import annotations

import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.preference.dpo import DPOConfig, PairLogps, dpo_metrics, joint_dpo_losses
from comlrl_lightning.preference.madpo import MADPO
from comlrl_lightning.preference.selection import PreferenceConfig


def test_each_agents_gradient_is_the_joint_losses_through_its_own_delta_only():
    d = torch.tensor([[0.5, -1.0, 2.0], [0.25, 0.5, -3.0]], requires_grad=True)  # [N=2, P=3] Δ_i
    beta = 0.7
    for i in range(2):
        others = d.detach().sum(0) - d.detach()[i]
        loss = joint_dpo_losses(d[i], others, beta).mean()
        (g,) = torch.autograd.grad(loss, d)
        z = d.detach().sum(0)
        expected = -beta * torch.sigmoid(-beta * z) / 3  # d/dz of −log σ(βz), through Δ_i only
        assert torch.allclose(g[i], expected) and torch.equal(g[1 - i], torch.zeros(3))
        assert float(loss) == pytest.approx(float(-torch.nn.functional.logsigmoid(beta * z).mean()))


def test_ipo_hinge_and_label_smoothing_follow_trl():
    z = torch.tensor([0.2, -1.0])
    beta = 0.5
    assert torch.allclose(joint_dpo_losses(z, torch.zeros(2), beta, "ipo"), (z - 1.0) ** 2)
    assert torch.allclose(joint_dpo_losses(z, torch.zeros(2), beta, "hinge"), torch.relu(1 - beta * z))
    smooth = joint_dpo_losses(z, torch.zeros(2), beta, "sigmoid", 0.1)
    ls = torch.nn.functional.logsigmoid
    assert torch.allclose(smooth, -0.9 * ls(beta * z) - 0.1 * ls(-beta * z))
    with pytest.raises(ValueError, match="label_smoothing: got 0.1, must be 0 with loss_type='hinge'"):
        DPOConfig(loss_type="hinge", label_smoothing=0.1)


def test_dpo_metrics_sum_agents_and_subtract_the_reference():
    lp = PairLogps(
        chosen=torch.tensor([[-1.0, -2.0], [-3.0, -1.0]]),
        rejected=torch.tensor([[-2.0, -2.0], [-3.0, -4.0]]),
        ref_chosen=torch.tensor([[-1.5, -2.0], [-3.0, -1.0]]),
        ref_rejected=torch.tensor([[-1.5, -2.0], [-3.0, -2.0]]),
    )
    m = dpo_metrics(lp, 0.5)
    # pair 0: Δ = (1 − 0) + (0 − 0) = 1; pair 1: Δ = 0 + (3 − 1) = 2
    assert m["rewards/margins"] == pytest.approx(0.5 * 1.5)
    assert m["z_agent_0/rewards/margins"] == pytest.approx(0.25) and m["z_agent_1/rewards/margins"] == 0.5
    assert m["rewards/chosen"] == pytest.approx(0.5 * (0.5 + 0.0) / 2)
    assert m["logps/chosen"] == pytest.approx((-4.0 - 3.0) / 2) and m["rewards/accuracies"] == 1.0


_ONE_SHOT_PASSES = {"one_shot": {"num_train_epochs": 2, "train_batch_size": 3}}  # online refuses them


def _madpo(mode, **dpo):
    return MADPO(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        learning_rate=1e-3,
        preference=PreferenceConfig(preference_num_candidates=3, preference_pairs_per_sample=2),
        dpo=DPOConfig(preference_mode=mode, **{**_ONE_SHOT_PASSES.get(mode, {}), **dpo}),
        sampling={"max_new_tokens": 8},
    )


class Grab(pl.Callback):
    def __init__(self):
        self.outputs, self.metrics = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.outputs.append(outputs)
        self.metrics.append(dict(trainer.callback_metrics))


def test_online_mode_rebuilds_pairs_each_batch_and_moves_every_agent(trainer_factory):
    pl.seed_everything(0)
    model, grab = _madpo("online"), Grab()
    model.configure_model()
    before = [[p.detach().clone() for p in a.parameters()] for a in model.agents]
    trainer = trainer_factory(max_steps=2 * 2, callbacks=[grab])
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    assert trainer.global_step == 4 and model.pairs is None
    out = grab.outputs[0]
    assert out.num_generations == 3 and out.rewards.shape == (2 * 3,)  # every candidate of the batch
    logged = grab.metrics[-1]
    for name in ("rewards/chosen", "rewards/margins", "rewards/accuracies", "logps/rejected"):
        assert name in logged and torch.isfinite(logged[name])
    assert "z_agent_1/rewards/margins" in logged and float(logged["preference/num_pairs"]) > 0
    assert len(model.reference_models) == 2  # DPO proper by default
    for b, agent in zip(before, model.agents):
        assert any(not torch.equal(x, p) for x, p in zip(b, agent.parameters()))


def test_one_shot_builds_pairs_once_and_stops_after_its_passes(trainer_factory):
    pl.seed_everything(0)
    model, grab = _madpo("one_shot", reference_free=True), Grab()
    trainer = trainer_factory(max_steps=-1, max_epochs=100, callbacks=[grab])
    calls = []
    build = model._build
    model._build = lambda episodes: (calls.append(len(episodes)), build(episodes))[1]
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=6))
    p = len(model.pairs)
    assert calls == [2, 2, 2] and p > 0 and len(model.reference_models) == 0
    updates = 2 * -(-p // 3)  # num_train_epochs × ceil(P / train_batch_size)
    assert len(grab.outputs) == updates and trainer.global_step == 2 * updates
    assert all(o.num_generations == 2 for o in grab.outputs)
    assert sum(o.num_episodes for o in grab.outputs) == 2 * p  # every pair, once per pass


class Preempted(Exception):
    pass


def run(trainer_factory, mode, ckpt_path=None, callbacks=(), crash_at=None, **kw):
    pl.seed_everything(0)
    model = _madpo(mode)

    class Crash(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if crash_at is not None and trainer.global_step == 2 * crash_at:
                raise Preempted  # after the checkpoint of batch crash_at

    trainer = trainer_factory(max_steps=2 * 5, max_epochs=100, callbacks=[Crash(), *callbacks], **kw)
    try:
        trainer.fit(
            model, LengthRatioDataModule(batch_size=2, num_train=4, shuffle=True), ckpt_path=ckpt_path
        )
    except Preempted:
        pass
    return model


@pytest.mark.parametrize("mode", ["one_shot", "online"])
def test_interrupted_then_resumed_run_equals_uninterrupted(trainer_factory, tmp_path, mode):
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2 * 2, save_top_k=-1)
    run(trainer_factory, mode, callbacks=[saver], crash_at=3, enable_checkpointing=True)
    (ckpt,) = os.listdir(tmp_path)
    saved = torch.load(tmp_path / ckpt, weights_only=False)
    assert ("preference_pairs" in saved) == (mode == "one_shot")
    resumed = run(trainer_factory, mode, ckpt_path=str(tmp_path / ckpt))
    straight = run(trainer_factory, mode)
    if mode == "one_shot":
        assert resumed.pairs == straight.pairs and resumed._order == straight._order
    loaded = MADPO.load_from_checkpoint(tmp_path / ckpt)  # the hyperparameters rebuild the module
    assert loaded.dpo.preference_mode == mode and loaded.preference.preference_num_candidates == 3
    assert (loaded.pairs is not None) == (mode == "one_shot") and loaded.sampling_config.max_new_tokens == 8
    for i in range(2):
        for (name, a), b in zip(resumed.agents[i].named_parameters(), straight.agents[i].parameters()):
            assert torch.equal(a, b), f"agent {i} {name}"


class HalvesAdapter:
    """A test adapter: role i's text is the i-th half of the joint completion (never a parse failure)."""

    def build_prompt(self, batch_item, agent_prompts):
        return " | ".join(agent_prompts)

    def parse_completion(self, completion, batch_item, num_agents):
        mid = len(completion) // 2
        return [completion[:mid], completion[mid:]]


def test_centralized_trains_one_joint_actor_on_pairs_of_its_joint_completions(trainer_factory):
    pl.seed_everything(0)
    model = MADPO(
        agents="builtin:tiny-gpt2",
        collaboration_mode="centralized",
        num_roles=2,
        adapter=HalvesAdapter(),
        learning_rate=1e-3,
        preference=PreferenceConfig(preference_num_candidates=4, preference_pairs_per_sample=3),
        dpo=DPOConfig(preference_mode="online"),
        sampling={"max_new_tokens": 12},
    )
    assert model.num_agents == 1 and model.num_roles == 2 and "adapter" not in model.hparams
    built = []
    build = model._build
    joint = []
    model._build = lambda episodes: _record(build(episodes))

    def _record(out):
        built.append(out)
        joint.append(list(model.joint_actor.joint_prompts))
        return out

    grab = Grab()
    trainer = trainer_factory(max_steps=2, callbacks=[grab])
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    assert trainer.global_step == 2  # one optimizer: one step per batch
    pairs = [p for b in built for p in b.pairs]
    assert pairs and all(len(p.chosen) == 1 for p in pairs)  # one policy: the joint completion
    first = built[0]
    for pair, ix in zip(first.pairs, first.index):
        assert pair.prompts == [joint[0][ix.node]] and " | " in pair.prompts[0]  # the adapter's joint prompt
        assert pair.chosen[0] == first.turn.generations[0].texts[ix.node * 4 + ix.chosen]
    assert len(model.reference_models) == 1 and "z_agent_0/rewards/margins" in grab.metrics[-1]
    assert "centralized/parse_failure" in grab.metrics[-1]
    with pytest.raises(ValueError, match="data.formatters: the env has 2 formatters .* model.num_roles=3"):
        bad = MADPO(agents="builtin:tiny-gpt2", collaboration_mode="centralized", num_roles=3)
        trainer_factory(max_steps=1).fit(bad, LengthRatioDataModule(batch_size=2, num_train=4))


def test_a_non_finite_dpo_loss_skips_the_step_instead_of_stepping_on_a_constant(trainer_factory, monkeypatch):
    import comlrl_lightning.preference.madpo as madpo_mod

    real = madpo_mod.joint_dpo_losses
    monkeypatch.setattr(madpo_mod, "joint_dpo_losses", lambda *a, **k: real(*a, **k) * float("nan"))
    pl.seed_everything(0)
    model = _madpo("online")
    model.configure_model()
    before = [[p.detach().clone() for p in a.parameters()] for a in model.agents]
    trainer = trainer_factory(max_steps=2)
    with pytest.warns(UserWarning, match="non-finite loss"):
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    assert trainer.global_step == 2 and model.skipped_steps == [1, 1]
    for b, agent in zip(before, model.agents):
        assert all(torch.equal(x, p) for x, p in zip(b, agent.parameters()))


def test_sigterm_inside_a_one_shot_update_resumes_bit_exact(trainer_factory, tmp_path, monkeypatch):
    # InterruptCheckpoint abandons the step a SIGTERM lands in; before the fix the checkpoint held the
    # pass cursor already moved past that step's pairs, so the resumed run never trained on them
    import signal

    from comlrl_lightning.callbacks import InterruptCheckpoint

    calls, real = [], MADPO.update_agents

    def update(self, tokens):  # the second update: its pairs drawn, no forward yet
        calls.append(len(tokens))
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, tokens)

    monkeypatch.setattr(MADPO, "update_agents", update)
    stop = InterruptCheckpoint(dirpath=str(tmp_path / "ckpt"))
    with pytest.raises(SystemExit) as info:
        run(trainer_factory, "one_shot", callbacks=[stop], default_root_dir=tmp_path)
    assert info.value.code == 128 + signal.SIGTERM
    monkeypatch.undo()
    saved = torch.load(stop.ckpt_path, weights_only=False)["preference_pairs"]
    assert saved["cursor"] == calls[0] and saved["epoch"] == 0  # after the first update only
    resumed = run(trainer_factory, "one_shot", ckpt_path=stop.ckpt_path, default_root_dir=tmp_path)
    straight = run(trainer_factory, "one_shot", default_root_dir=tmp_path / "straight")
    for i in range(2):
        for (name, a), b in zip(resumed.agents[i].named_parameters(), straight.agents[i].parameters()):
            assert torch.equal(a, b), f"agent {i} {name}"
