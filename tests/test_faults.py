"""Faults during training are contained: signals, reward errors, stale temp files, unwritable or full disks (issue 12 §3)."""

import os
import signal

import lightning.pytorch as pl
import pytest
import torch

from comlrl_lightning import MAGRPO
from comlrl_lightning.callbacks import InterruptCheckpoint
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.envs.rewards import WeightedReward
from comlrl_lightning.infra.checkpoint_io import AtomicCheckpointIO, prepare_checkpoint_dir


class SignalAt(pl.Callback):
    """Sends ``signum`` to this process once, in the middle of training batch number ``at``."""

    def __init__(self, signum, at):
        self.signum, self.at, self.seen = signum, at, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append([e.index for e in batch])
        if len(self.seen) == self.at + 1:
            os.kill(os.getpid(), self.signum)


def run(trainer_factory, batches, callbacks, ckpt_path=None, root=None):
    pl.seed_everything(0)
    model = MAGRPO(
        agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=8, learning_rate=1e-3
    )
    trainer = trainer_factory(max_steps=MAGRPO.max_steps_for(batches, 2), callbacks=callbacks,
                              default_root_dir=root, plugins=[AtomicCheckpointIO()])  # fmt: skip
    trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=8, shuffle=True), ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize(
    "signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_mid_batch_finishes_the_batch_saves_and_exits_non_zero_then_resumes_exactly(
    trainer_factory, tmp_path, signum, code
):
    sender = SignalAt(signum, at=2)
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under nohup / `&`
    with pytest.raises(SystemExit) as info:
        run(trainer_factory, 6, [sender, InterruptCheckpoint(dirpath=str(tmp_path))])
    assert info.value.code == code
    assert len(sender.seen) == 3  # batch 2 was finished, batch 3 never started
    ckpt = tmp_path / "interrupted.ckpt"
    assert torch.load(ckpt, weights_only=False)["global_step"] == MAGRPO.max_steps_for(3, 2)
    assert signal.getsignal(signal.SIGINT) is before  # our handler is gone again
    tail = SignalAt(signal.SIGUSR2, at=99)
    resumed = run(trainer_factory, 6, [tail, InterruptCheckpoint(dirpath=str(tmp_path))], ckpt_path=str(ckpt))
    straight_seen = SignalAt(signal.SIGUSR2, at=99)
    straight = run(trainer_factory, 6, [straight_seen])
    assert sender.seen + tail.seen == straight_seen.seen
    for a, b in zip(resumed.agents.parameters(), straight.agents.parameters()):
        assert torch.equal(a, b)
    assert not ckpt.exists()  # a fit that ends normally removes the interruption checkpoint


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


def test_a_full_disk_names_the_checkpoint_path(tmp_path, monkeypatch):
    def full(obj, f, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    target = tmp_path / "ckpts" / "last.ckpt"
    with pytest.raises(OSError, match=f"could not write the checkpoint '{target}': No space left on device"):
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(2)}, target)
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
