"""Dec-POMDP tasks: the protocol (base), the length-coordination toy, cooperative coding."""

from comlrl_lightning.envs.base import DecPOMDP, Episode, Formatter, PromptTemplate, Transition

__all__ = ["DecPOMDP", "Episode", "Formatter", "PromptTemplate", "Transition"]
