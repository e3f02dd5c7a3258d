"""Dec-POMDP tasks: the protocol (base), the length-coordination toy, cooperative coding."""

from comlrl_lightning.envs.base import SOLVED, DecPOMDP, Episode, Formatter, PromptTemplate, Transition
from comlrl_lightning.envs.trl_reward import TRLReward

__all__ = ["SOLVED", "DecPOMDP", "Episode", "Formatter", "PromptTemplate", "TRLReward", "Transition"]
