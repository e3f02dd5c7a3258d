"""The toy task's old import path, kept for code and configs written against it
(``class_path: comlrl_lightning.envs.toy.TargetLengthReward``): its rows and rewards live in
:mod:`comlrl_lightning.tasks.toy.env`; both paths give the same objects."""

from comlrl_lightning.tasks.toy.env import (
    TOPICS,
    LengthRatioReward,
    TargetLengthReward,
    TeamTargetsReward,
    length_ratio_rows,
)

__all__ = ["TOPICS", "LengthRatioReward", "TargetLengthReward", "TeamTargetsReward", "length_ratio_rows"]
