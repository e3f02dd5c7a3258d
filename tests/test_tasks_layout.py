"""Tasks in one place: each core task is a folder ``comlrl_lightning/tasks/<name>/`` holding its rows,
reward and DataModule, registered by one line in ``datamodules/__init__.py`` (docs/architecture.md,
"Adding a task"); the coding task, an opt-in family with its sandbox, is ``comlrl_lightning/coding/``,
registered the same way; the old import paths keep working."""

import importlib
from pathlib import Path

import lightning.pytorch as pl
import pytest

import comlrl_lightning.datamodules as datamodules
from comlrl_lightning import tasks

ROOT = Path(__file__).resolve().parents[1]
TASK_DIRS = sorted(p.name for p in Path(tasks.__file__).parent.iterdir() if (p / "__init__.py").exists())
TASK_PACKAGES = [f"comlrl_lightning.tasks.{name}" for name in TASK_DIRS] + ["comlrl_lightning.coding"]


def test_the_core_tasks_are_folders_and_the_coding_task_is_its_family():
    assert TASK_DIRS == ["cooperation", "toy"]
    assert (ROOT / "comlrl_lightning" / "coding" / "datamodule.py").exists()


@pytest.mark.parametrize("package", TASK_PACKAGES)
def test_each_task_folder_holds_its_datamodule_and_the_public_path_registers_it(package):
    module = importlib.import_module(f"{package}.datamodule")
    own = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, pl.LightningDataModule) and v.__module__ == module.__name__
    ]
    assert len(own) == 1, f"{package}.datamodule defines {own}"
    assert getattr(datamodules, own[0].__name__) is own[0]
    assert own[0].__name__ in datamodules.__all__
    # a non-editable install ships only the packages pyproject lists
    assert f'"{package}"' in (ROOT / "pyproject.toml").read_text()


def test_the_root_datamodules_folder_holds_no_task_of_its_own():
    assert sorted(p.name for p in (ROOT / "datamodules").glob("*.py")) == [
        "__init__.py",
        "decpomdp.py",
        "loader.py",
    ]


def test_the_toy_tasks_old_path_gives_the_same_objects():
    from comlrl_lightning.envs import toy as old
    from comlrl_lightning.tasks.toy import env as new

    for name in old.__all__:
        assert getattr(old, name) is getattr(new, name)
    assert {"LengthRatioReward", "TargetLengthReward", "TeamTargetsReward", "length_ratio_rows"} <= set(
        old.__all__
    )
