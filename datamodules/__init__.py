"""LightningDataModules that yield Dec-POMDP episodes (installed as ``comlrl_lightning.datamodules``)."""

from comlrl_lightning.datamodules.cooperation import CooperationDataModule
from comlrl_lightning.datamodules.decpomdp import DecPOMDPDataModule, load_rows
from comlrl_lightning.datamodules.humaneval import HumanEvalDataModule
from comlrl_lightning.datamodules.toy import LengthRatioDataModule

__all__ = [
    "CooperationDataModule",
    "DecPOMDPDataModule",
    "HumanEvalDataModule",
    "LengthRatioDataModule",
    "load_rows",
]
