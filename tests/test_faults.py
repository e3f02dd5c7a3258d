"""Faults during training are contained: signals, reward errors, stale temp files, unwritable or full disks (issue 12 §3)."""

import copy
import glob
import os
import signal
import threading
import time
from functools import partial

import lightning.pytorch as pl
import pytest
import torch

from comlrl_lightning import MAGRPO
from comlrl_lightning.callbacks import InterruptCheckpoint
from comlrl_lightning.datamodules import DecPOMDPDataModule, LengthRatioDataModule
from comlrl_lightning.envs.rewards import WeightedReward
from comlrl_lightning.infra.checkpoint_io import AtomicCheckpointIO, prepare_checkpoint_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SignalAt(pl.Callback):
    """Sends ``signum`` to this process once, in training batch number ``at``: at its start (before its
    generation), at its ``nth`` backward or at its ``nth`` optimizer step (``hook``)."""

    def __init__(self, signum, at, hook="on_train_batch_start", nth=1):
        self.signum, self.at, self.hook, self.nth, self.seen, self.sent = signum, at, hook, nth, [], False
        self.calls = 0

    def _send(self, hook):
        if hook == self.hook and len(self.seen) == self.at + 1 and not self.sent:
            self.calls += 1
            if self.calls == self.nth:
                self.sent = True
                os.kill(os.getpid(), self.signum)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append([e.index for e in batch])
        self._send("on_train_batch_start")

    def on_before_backward(self, trainer, pl_module, loss):
        self._send("on_before_backward")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self._send("on_before_optimizer_step")


def run(trainer_factory, batches, callbacks, ckpt_path=None, root=None, data=None, **trainer_kwargs):
    pl.seed_everything(0)
    model = MAGRPO(
        agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=8, learning_rate=1e-3
    )
    trainer = trainer_factory(max_steps=MAGRPO.max_steps_for(batches, 2), callbacks=callbacks,
                              default_root_dir=root, plugins=[AtomicCheckpointIO()], **trainer_kwargs)  # fmt: skip
    data = data or LengthRatioDataModule(batch_size=2, num_train=8, shuffle=True)
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return model


def resumes_exactly(trainer_factory, tmp_path, first_seen, trained, data=None, **trainer_kwargs):
    """Resume from the interruption checkpoint: the batches after the ``trained`` ones of ``first_seen``
    follow on, and the weights equal those of a run that never stopped."""
    ckpt = tmp_path / "interrupted.ckpt"
    tail = SignalAt(signal.SIGUSR2, at=99)
    resumed = run(trainer_factory, 6, [tail, InterruptCheckpoint(dirpath=str(tmp_path))], ckpt_path=str(ckpt),
                  **trainer_kwargs)  # fmt: skip
    straight_seen = SignalAt(signal.SIGUSR2, at=99)
    straight = run(trainer_factory, 6, [straight_seen], **trainer_kwargs)
    assert first_seen[:trained] + tail.seen == straight_seen.seen
    for a, b in zip(resumed.agents.parameters(), straight.agents.parameters()):
        assert torch.equal(a, b)
    assert not ckpt.exists()  # a fit that ends normally removes the interruption checkpoint


@pytest.mark.parametrize(
    "signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"]
)
@pytest.mark.parametrize(
    "hook,nth",
    [("on_train_batch_start", 1), ("on_before_backward", 1), ("on_before_optimizer_step", 1),
     ("on_before_backward", 2), ("on_before_optimizer_step", 2)],
    ids=["generation", "backward", "update", "second-agent-backward", "second-agent-update"],
)  # fmt: skip
def test_a_signal_saves_the_last_trained_batch_and_exits_non_zero_then_resumes_exactly(
    trainer_factory, tmp_path, signum, code, hook, nth
):
    sender = SignalAt(signum, at=2, hook=hook, nth=nth)
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under nohup / `&`
    before_term = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as info:
        run(trainer_factory, 6, [InterruptCheckpoint(dirpath=str(tmp_path)), sender])
    assert info.value.code == code
    assert len(sender.seen) == 3  # batch 3 never started
    # before agent 0's step batch 2 is abandoned (batches 0, 1 saved); after it batch 2's remaining
    # updates run and batches 0-2 are saved (no copy to undo agent 0 from: InterruptCheckpoint's docstring)
    trained = 2 if hook == "on_train_batch_start" or (hook, nth) == ("on_before_backward", 1) else 3
    ckpt = tmp_path / "interrupted.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == MAGRPO.max_steps_for(trained, 2)
    assert signal.getsignal(signal.SIGINT) is before  # our handlers are gone again
    assert signal.getsignal(signal.SIGTERM) is before_term
    resumes_exactly(trainer_factory, tmp_path, sender.seen, trained)


def hanging_at(call, fn, where):
    """``fn`` that, at its ``call``-th call, sends SIGTERM to this process half a second later and hangs
    (for 20 s, then it returns ``fn``'s values: without a working interrupt the test fails on time)."""
    calls = []

    def reward(joint_actions, episodes, turn):
        calls.append(1)
        if len(calls) == call:
            where.append(time.monotonic())
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
            while (
                time.monotonic() - where[-1] < 20
            ):  # hangs (20 s at most: a test that fails, not one that hangs)
                time.sleep(0.1)
        return fn(joint_actions, episodes, turn)

    reward.name = getattr(fn, "name", "reward")
    return reward


@pytest.mark.parametrize("phase", ["reward", "validation"])
def test_sigterm_in_a_hanging_reward_saves_at_once_and_resumes_exactly(trainer_factory, tmp_path, phase):
    data = LengthRatioDataModule(batch_size=2, num_train=8, num_val=2, shuffle=True)
    functions = data.env.reward_fn.functions
    # training batches 0, 1 call the reward once each; validation (after batch 1) is the third call
    functions[0] = hanging_at(3, functions[0], where := [])
    val = dict(limit_val_batches=1, val_check_interval=2) if phase == "validation" else {}
    sender = SignalAt(signal.SIGUSR2, at=99)
    with pytest.raises(SystemExit) as info:
        run(trainer_factory, 6, [sender, InterruptCheckpoint(dirpath=str(tmp_path))], data=data, **val)
    assert info.value.code == 143
    assert time.monotonic() - where[0] < 10  # not blocked by the reward (Slurm's KillWait is 30 s)
    trained = 2
    ckpt = torch.load(tmp_path / "interrupted.ckpt", weights_only=False)
    assert ckpt["global_step"] == MAGRPO.max_steps_for(trained, 2)
    resumes_exactly(trainer_factory, tmp_path, sender.seen, trained, **val)


def test_a_reward_past_reward_timeout_s_is_abandoned_and_counted_as_an_error():
    release = threading.Event()

    def stuck(joint_actions, episodes, turn):
        release.wait()  # hangs until the test ends
        return [1.0] * len(joint_actions)

    def grad_mode(joint_actions, episodes, turn):
        return [float(torch.is_grad_enabled())] * len(joint_actions)

    data = DecPOMDPDataModule([{"q": "x"}], ["{q}"], [stuck, grad_mode], reward_timeout_s=0.2)
    reward = data.env.reward_fn
    start = time.monotonic()
    try:
        with (
            pytest.warns(UserWarning, match="reward function 'stuck' failed.*reward_timeout_s=0.2"),
            torch.no_grad(),
        ):
            out = reward([["a"], ["b"]], [None] * 2, 0)
    finally:
        release.set()
    assert time.monotonic() - start < 5
    assert out.components["errors"].tolist() == [1.0, 1.0]  # counted without skip_invalid
    assert out.total.tolist() == [0.0, 0.0]  # invalid_reward
    assert out.components["grad_mode"].tolist() == [0.0, 0.0]  # the worker ran under the caller's no_grad
    assert reward.num_invalid == 2


def test_every_shipped_config_saves_on_interruption():
    import glob

    import yaml

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = glob.glob(os.path.join(root, "configs", "*.yaml")) + [os.path.join(root, "configs", "callbacks",
                                                                                "default.yaml")]  # fmt: skip
    for path in paths:  # an experiment without its own list uses configs/callbacks/default.yaml
        with open(path) as f:
            callbacks = (yaml.safe_load(f).get("trainer") or {}).get("callbacks")
        assert callbacks is None or any(c["class_path"].endswith("InterruptCheckpoint") for c in callbacks), (
            path
        )


def test_an_unwritable_checkpoint_folder_fails_at_setup_naming_it(trainer_factory, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError, match=f"checkpoint folder '{blocker}/ckpts' is not writable"):
        run(trainer_factory, 1, [InterruptCheckpoint(dirpath=str(blocker / "ckpts"))])


def test_stale_temp_files_are_removed_and_checkpoints_kept(tmp_path):
    (tmp_path / "last.ckpt.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "last.ckpt").write_bytes(b"a whole one")
    assert prepare_checkpoint_dir(tmp_path) == [str(tmp_path / "last.ckpt.tmp")]
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]


@pytest.mark.parametrize(
    "failure",
    [OSError(28, "No space left on device"), RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")],
    ids=["ENOSPC", "torch-unexpected-pos"],
)  # fmt: skip
def test_a_full_disk_says_which_file_how_many_bytes_it_needs_and_how_many_are_left(
    tmp_path, monkeypatch, failure
):
    import shutil

    def full(obj, f, *args, **kwargs):
        raise failure

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
    target = tmp_path / "ckpts" / "last.ckpt"
    with pytest.raises(OSError) as info:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(2 * 1024**2), "step": 3}, target)
    assert info.value.errno == 28
    assert str(info.value).endswith(f"could not write the checkpoint '{target}': no space left on the device (it needs "
                                    f"about 8.0 MiB (8388608 bytes), 100 bytes left in '{target.parent}')")  # fmt: skip
    assert not os.listdir(tmp_path / "ckpts")


def test_skipped_reward_errors_are_counted_and_logged():
    calls = []

    def flaky(joint_actions, episodes, turn):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("sandbox died")
        return [float("nan")] + [1.0] * (len(joint_actions) - 1)

    reward = WeightedReward([flaky], skip_invalid=True)
    with pytest.warns(UserWarning, match="reward function 'flaky'.*non-finite"):
        first = reward([["a"], ["b"], ["c"]], [None] * 3, 0)
    with pytest.warns(UserWarning, match="reward function 'flaky' failed.*sandbox died"):
        second = reward([["a"], ["b"]], [None] * 2, 0)
    assert first.components["errors"].tolist() == [1.0, 0.0, 0.0]
    assert second.components["errors"].tolist() == [1.0, 1.0]
    assert reward.num_invalid == 3
    from comlrl_lightning.callbacks.reward_logger import step_metrics

    out = {"reward_components": first.components, "completion_lengths": [torch.ones(3)],
           "clipped": [torch.zeros(3, dtype=torch.bool)], "num_tokens": 3, "num_episodes": 1}  # fmt: skip
    metrics = step_metrics(out, {}, 0.0)
    assert metrics["rewards/errors"] == 1.0 and "rewards/errors/mean" not in metrics


def cli_callbacks(monkeypatch, tmp_path, *args, signal_at=None):
    """The callbacks ``comlrl-lightning fit`` gives its trainer; with ``signal_at`` the fit runs and is sent
    SIGTERM in that batch (returns ``(callbacks, exit code)``), else it stops before training."""
    import comlrl_lightning.cli as cli

    os.chdir(ROOT)
    seen = {}

    def before_fit(self):
        seen["callbacks"] = list(self.trainer.callbacks)
        if signal_at is None:
            raise SystemExit(0)
        self.trainer.callbacks.append(SignalAt(signal.SIGTERM, at=signal_at))

    monkeypatch.setattr(cli.CoMLRLCLI, "before_fit", before_fit)
    with pytest.raises(SystemExit) as info:
        cli.main(["fit", *args, "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}",
                  "--trainer.max_steps=8", "--model.init_args.rollout.num_generations=2",
                  "--model.init_args.sampling.max_new_tokens=8"])  # fmt: skip
    return [c for c in seen["callbacks"] if isinstance(c, InterruptCheckpoint)], info.value.code


def test_a_cli_fit_without_the_callbacks_block_still_saves_on_sigterm(monkeypatch, tmp_path):
    interrupts, code = cli_callbacks(monkeypatch, tmp_path, "--config", "configs/toy_length_ratio.yaml",
                                     signal_at=2)  # fmt: skip
    assert len(interrupts) == 1 and code == 143
    saved = glob.glob(str(tmp_path / "**" / "checkpoints" / "interrupted.ckpt"), recursive=True)
    assert len(saved) == 1
    assert torch.load(saved[0], weights_only=False)["global_step"] == MAGRPO.max_steps_for(2, 2)


@pytest.mark.parametrize(
    "blocks,switch,count",
    [(["configs/callbacks/default.yaml"], [], 1), ([], ["--save_on_interrupt=false"], 0),
     (["configs/callbacks/default.yaml"], ["--save_on_interrupt=false"], 1)],
    ids=["listed-not-twice", "switched-off", "listed-kept"],
)  # fmt: skip
def test_the_cli_adds_one_interrupt_checkpoint_unless_listed_or_switched_off(monkeypatch, tmp_path, blocks,
                                                                              switch, count):  # fmt: skip
    configs = [a for b in blocks for a in ("--config", b)] + ["--config", "configs/toy_length_ratio.yaml"]
    interrupts, _ = cli_callbacks(monkeypatch, tmp_path, *configs, *switch)
    assert len(interrupts) == count


def test_sigterm_in_the_validation_before_fit_stops_at_once(monkeypatch, tmp_path):
    import comlrl_lightning.cli as cli
    from comlrl_lightning.envs import toy

    where = []
    real = toy.TargetLengthReward.__call__
    monkeypatch.setattr(toy.TargetLengthReward, "__call__", lambda self, *a: hanging_at(1, partial(real, self),
                                                                                        where)(*a))  # fmt: skip
    os.chdir(ROOT)
    with pytest.raises(SystemExit) as info:
        cli.main(["fit", "--config", "configs/selfplay_grpo.yaml", "--validate_before_fit=true",
                  "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert info.value.code == 143
    assert time.monotonic() - where[0] < 10
    assert signal.getsignal(signal.SIGTERM) is not None and not glob.glob(
        str(tmp_path / "**" / "*.ckpt"), recursive=True
    )


def test_an_iac_batch_interrupted_in_its_updates_saves_the_weights_and_optimizer_state_of_its_end(
    trainer_factory, tmp_path
):
    from comlrl_lightning import IAC, ActorCriticRolloutConfig, CriticConfig, CriticSpec, SamplingConfig

    class Snapshot(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.state = {k: v.clone() for k, v in pl_module.state_dict().items()}
            self.optim = [copy.deepcopy(o.state_dict()) for o in trainer.optimizers]

    pl.seed_everything(0)
    model = IAC(
        agents="builtin:tiny-gpt2",
        num_agents=2,
        critics=CriticSpec(model="builtin:tiny-gpt2"),
        critic=CriticConfig(critic_learning_rate=1e-2),
        rollout=ActorCriticRolloutConfig(num_generations=2),
        sampling=SamplingConfig(max_new_tokens=8),
        learning_rate=1e-3,
    )
    per = model.steps_per_batch  # 2 agents + 2 separate critics
    snap, sender = Snapshot(), SignalAt(signal.SIGTERM, at=2, hook="on_before_optimizer_step", nth=per - 1)
    trainer = trainer_factory(
        max_steps=6 * per, callbacks=[InterruptCheckpoint(dirpath=str(tmp_path)), snap, sender]
    )
    with pytest.raises(SystemExit):
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=12))
    ckpt = torch.load(tmp_path / "interrupted.ckpt", weights_only=False)
    assert ckpt["global_step"] == 3 * per  # batches 0-2: batch 2's last step ran, then the save
    assert all(torch.equal(ckpt["state_dict"][k], v) for k, v in snap.state.items())
    for saved, before in zip(ckpt["optimizer_states"], snap.optim):
        assert saved["state"].keys() == before["state"].keys()
        for i, s in before["state"].items():
            assert all(torch.equal(saved["state"][i][k], v) for k, v in s.items() if torch.is_tensor(v))
