"""The Dec-POMDP protocol (base), reward functions and processors, transitions; the tasks built on it
live in :mod:`comlrl_lightning.tasks` (``envs.toy`` is the toy task's old path)."""

from comlrl_lightning.envs.base import SOLVED, DecPOMDP, Episode, Formatter, PromptTemplate, Transition
from comlrl_lightning.envs.trl_reward import TRLReward

__all__ = ["SOLVED", "DecPOMDP", "Episode", "Formatter", "PromptTemplate", "TRLReward", "Transition"]
