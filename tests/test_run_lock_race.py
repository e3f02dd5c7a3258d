"""The lost ``last.ckpt.tmp`` (issue 44, item 5): a second run started against a running run's folder
removed that run's checkpoint mid-write (``InterruptCheckpoint.setup`` cleans ``*.ckpt.tmp`` before
the module's ``setup`` took the lock); the writer's rename then failed, its lock was freed and a third
run wrote ``last-v1.ckpt`` there. A refused run now touches nothing in the held folders; a run
restarted in a finished run's folder keeps that run's ``config.yaml``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from experiments import experiment
from lightning.pytorch.callbacks import ModelCheckpoint

from comlrl_lightning import MAGRPO
from comlrl_lightning.callbacks import InterruptCheckpoint
from comlrl_lightning.cli import main
from comlrl_lightning.datamodules import LengthRatioDataModule
from comlrl_lightning.infra import run_lock
from comlrl_lightning.infra.run_lock import RunFolderBusy, release_run_folders
from comlrl_lightning.team.team import Team

ROOT = Path(__file__).resolve().parents[1]

WRITER = (  # a running run saving last.ckpt as AtomicCheckpointIO does: lock, write the .tmp, rename
    "import importlib.util, os, sys; spec = importlib.util.spec_from_file_location('run_lock', sys.argv[2]); "
    "lock = importlib.util.module_from_spec(spec); spec.loader.exec_module(lock); "
    "folder = sys.argv[1]; lock.hold_run_folder(folder, 'ModelCheckpoint.dirpath'); "
    "tmp = os.path.join(folder, 'last.ckpt.tmp'); f = open(tmp, 'wb'); f.write(b'half'); f.flush(); "
    "print('writing', flush=True); sys.stdin.readline(); f.write(b' and the rest'); f.close()\n"
    "try:\n    os.replace(tmp, os.path.join(folder, 'last.ckpt')); print('renamed', flush=True)\n"
    "except OSError as err:\n    print(type(err).__name__, flush=True)\n"
    "sys.stdin.read()"
)


@pytest.fixture
def writing_run():
    """Start a process that holds a checkpoint folder and is half-way through writing ``last.ckpt``;
    ``finish(child)`` lets it rename and returns what its rename did."""
    children = []

    def start(folder):
        os.makedirs(folder, exist_ok=True)
        (Path(folder) / "last.ckpt").write_bytes(b"the previous save")
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), run_lock.__file__],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert child.stdout.readline().strip() == "writing"
        children.append(child)
        return child

    def finish(child):
        child.stdin.write("\n")
        child.stdin.flush()
        return child.stdout.readline().strip()

    yield start, finish
    for child in children:
        child.kill()
        child.wait()
        child.stdin.close()  # left open, the pipes warn (ResourceWarning) in whichever later test collects them
        child.stdout.close()
    release_run_folders()


def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(Team, "load", refuse)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_refused_fit_leaves_the_running_runs_checkpoint_mid_write_and_its_rename_succeeds(
    trainer_factory, tmp_path, writing_run, monkeypatch
):
    start, finish = writing_run
    child = start(tmp_path / "ckpt")
    no_model_loads(monkeypatch)
    model = MAGRPO(agents="builtin:tiny-gpt2", num_agents=2, num_generations=2, max_new_tokens=4)
    callbacks = [InterruptCheckpoint(dirpath=str(tmp_path / "ckpt")),
                 ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_last=True)]  # fmt: skip
    trainer = trainer_factory(max_steps=2, callbacks=callbacks, enable_checkpointing=True)
    with pytest.raises(RunFolderBusy, match=rf"ckpt is in use by another run, pid {child.pid} "):
        trainer.fit(model, LengthRatioDataModule(batch_size=2, num_train=4))
    # before the fix InterruptCheckpoint.setup had removed the .tmp: the rename failed (FileNotFoundError)
    assert (tmp_path / "ckpt" / "last.ckpt.tmp").read_bytes() == b"half"
    assert finish(child) == "renamed"
    assert (tmp_path / "ckpt" / "last.ckpt").read_bytes() == b"half and the rest"


def test_a_refused_cli_fit_writes_nothing_in_the_running_runs_folder_and_says_why_in_one_line(
    tmp_path, writing_run, monkeypatch, capsys
):
    start, finish = writing_run
    run = tmp_path / "logs" / "run"  # the running run's log folder, its checkpoints inside
    child = start(run / "checkpoints")
    (run / "config.yaml").write_text("the running run's config\n")
    (run / "events.out.tfevents.1.host").write_bytes(b"its scalars")
    before = snapshot(run)
    no_model_loads(monkeypatch)
    os.chdir(ROOT)
    logger = ["--trainer.logger.init_args.name=logs", "--trainer.logger.init_args.version=run"]
    with pytest.raises(SystemExit) as info:
        main(["fit", *experiment("toy_length_ratio.yaml"), f"--trainer.default_root_dir={tmp_path}", *logger])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert (
        last.startswith("RunFolderBusy: ")
        and f"{run / 'checkpoints'} is in use by another run, pid {child.pid}" in last
    )
    # before the fix: config.yaml overwritten, a new event file, the .tmp removed (the rename then failed)
    assert snapshot(run) == before
    assert finish(child) == "renamed"


def test_a_run_restarted_in_a_finished_runs_folder_keeps_its_config_and_says_so(
    tmp_path, monkeypatch, lightning_log
):
    os.chdir(ROOT)
    args = ["fit", *experiment("toy_length_ratio.yaml"), f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger.init_args.version=run", "--validate_before_fit=false", "--trainer.max_steps=2",
            "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false"]  # fmt: skip
    main(args)
    folder = tmp_path / "toy_length_ratio" / "run"
    first = (folder / "config.yaml").read_text()
    no_model_loads(monkeypatch)  # the restart stops once its config is written: no need to train
    with pytest.raises(AssertionError, match="a model loaded"):
        main([*args, "--model.init_args.learning_rate=0.5"])
    assert (folder / "config-v1.yaml").read_text() == first  # before the fix: overwritten, nothing said
    assert yaml.safe_load((folder / "config.yaml").read_text())["model"]["init_args"]["learning_rate"] == 0.5
    assert f"config.yaml: {folder / 'config.yaml'} held the config of an earlier run" in lightning_log.text
    assert "kept as config-v1.yaml" in lightning_log.text


def test_an_unchanged_config_is_rewritten_without_a_copy(tmp_path):
    from comlrl_lightning.infra.run_folders import keep_earlier_config

    (tmp_path / "config.yaml").write_text("a: 1\n")
    assert keep_earlier_config(str(tmp_path / "config.yaml"), "a: 1\n") is None
    assert keep_earlier_config(str(tmp_path / "config.yaml"), "a: 2\n") == str(tmp_path / "config-v1.yaml")
    assert sorted(os.listdir(tmp_path)) == ["config-v1.yaml"]  # the caller writes the new one


HOLD = (  # another run's process that holds a folder's lock before its logger made the folder
    "import importlib.util, sys; spec = importlib.util.spec_from_file_location('run_lock', sys.argv[2]); "
    "lock = importlib.util.module_from_spec(spec); spec.loader.exec_module(lock); "
    "lock.hold_run_folder(sys.argv[1], 'trainer.logger'); print('held', flush=True); sys.stdin.read()"
)


def test_a_numbered_log_folder_taken_by_a_run_started_at_the_same_moment_moves_to_the_next(
    tmp_path, trainer_factory
):
    from lightning.pytorch.loggers import TensorBoardLogger

    from comlrl_lightning.infra.run_folders import hold_fit_folders

    folder = tmp_path / "logs" / "version_0"
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), run_lock.__file__],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "held" and not folder.exists()
        logger = TensorBoardLogger(save_dir=str(tmp_path), name="logs")
        hold_fit_folders(trainer_factory(max_steps=1, logger=logger))
        assert logger.log_dir == str(tmp_path / "logs" / "version_1")  # before: refused (version_0)
        pinned = TensorBoardLogger(save_dir=str(tmp_path), name="logs", version=0)  # a given version: refused
        with pytest.raises(RunFolderBusy, match=r"^trainer.logger: .*version_0 is in use by another run"):
            hold_fit_folders(trainer_factory(max_steps=1, logger=pinned))
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()
        release_run_folders()
