"""One run per folder: a second process writing a locked folder (checkpoints, MADPOIter's replay) fails
at once naming the holder; a dead holder's lock is recovered with a line saying so."""

import os
import signal
import socket
import subprocess
import sys

import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from test_madpo_iter import _run as run_madpo_iter

from comlrl_lightning import MAGRPO
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.infra import run_lock
from comlrl_lightning.infra.run_lock import RunFolderBusy, hold_run_folder, lock_path, release_run_folders
from comlrl_lightning.team.team import Team

HOLD = (  # run_lock.py loaded alone (no torch, no Lightning): another run's process, started in a blink
    "import importlib.util, sys; spec = importlib.util.spec_from_file_location('run_lock', sys.argv[2]); "
    "lock = importlib.util.module_from_spec(spec); spec.loader.exec_module(lock); "
    "lock.hold_run_folder(sys.argv[1], 'test'); print('held', flush=True); sys.stdin.read()"
)


@pytest.fixture
def other_run():
    """Start a process that holds a folder's lock (another run) until it is killed or its stdin closes."""
    children = []

    def start(folder):
        child = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(folder), run_lock.__file__, "--marker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout.readline().strip() == "held"
        children.append(child)
        return child

    yield start
    for child in children:
        child.kill()
        child.wait()
    release_run_folders()


def test_a_held_folder_is_refused_naming_the_other_run_and_a_dead_ones_lock_recovered(
    tmp_path, other_run, lightning_log
):
    child = other_run(tmp_path / "run")
    with pytest.raises(RunFolderBusy) as err:
        hold_run_folder(str(tmp_path / "run"), "checkpoint folder")
    message = str(err.value)
    assert f"pid {child.pid} on host {socket.gethostname()}" in message
    assert "-c" in message and "--marker" in message and "(started 20" in message  # the command, start time
    assert message.startswith("checkpoint folder: ")
    child.send_signal(signal.SIGKILL)  # dies holding it: the OS drops the lock, the record stays
    child.wait()
    assert os.path.exists(lock_path(str(tmp_path / "run")) + ".json")
    hold_run_folder(str(tmp_path / "run"), "checkpoint folder")
    assert f"recovered the stale lock of pid {child.pid}" in lightning_log.text
    release_run_folders()
    assert not os.path.exists(lock_path(str(tmp_path / "run")) + ".json")


def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded before the folder lock")

    monkeypatch.setattr(Team, "load", refuse)


def test_a_second_fit_into_a_held_checkpoint_folder_fails_before_any_model_loads(
    trainer_factory, tmp_path, other_run, monkeypatch
):
    child = other_run(tmp_path / "ckpt")
    no_model_loads(monkeypatch)
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=4)
    saver = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)
    trainer = trainer_factory(max_steps=2, callbacks=[saver], enable_checkpointing=True)
    with pytest.raises(RunFolderBusy, match=rf"ModelCheckpoint.dirpath: .* pid {child.pid} "):
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))


def test_a_second_madpo_iter_run_on_a_held_replay_folder_fails(
    trainer_factory, tmp_path, other_run, monkeypatch
):
    child = other_run(tmp_path / "preference_replay")
    no_model_loads(monkeypatch)
    with pytest.raises(RunFolderBusy, match=rf"replay.preference_replay_dir: .* pid {child.pid} "):
        run_madpo_iter(trainer_factory, tmp_path)
    # nothing written there by the refused run
    assert not (tmp_path / "preference_replay").exists()


def test_a_second_marlhf_run_training_in_a_held_reward_model_folder_fails(
    trainer_factory, tmp_path, other_run
):
    from test_marlhf import fit, marlhf

    child = other_run(tmp_path / "rm")
    with pytest.raises(RunFolderBusy, match=rf"reward_model.reward_model_dir: .* pid {child.pid} "):
        fit(trainer_factory, marlhf(tmp_path, epochs=1), 1)
    assert not (tmp_path / "rm").exists()  # no pairs built, nothing written
