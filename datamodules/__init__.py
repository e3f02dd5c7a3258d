"""LightningDataModules that yield Dec-POMDP episodes (installed as ``comlrl_lightning.datamodules``).

The generic one (:class:`DecPOMDPDataModule`: rows from the hub, a file or an object, plus formatters
and a reward) lives here; each task's own lives in its folder, ``comlrl_lightning/tasks/<name>/``
(the coding task's in its family, ``comlrl_lightning/coding/``), and is registered below by one import line, which makes ``comlrl_lightning.datamodules.<Class>``
its public path (the ``class_path`` configs use).
"""

from comlrl_lightning.coding.datamodule import HumanEvalDataModule
from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule, load_rows
from comlrl_lightning.tasks.cooperation.datamodule import CooperationDataModule
from comlrl_lightning.tasks.toy.datamodule import LengthRatioDataModule

__all__ = [
    "CooperationDataModule",
    "DecPOMDPDataModule",
    "HumanEvalDataModule",
    "LengthRatioDataModule",
    "load_rows",
]
