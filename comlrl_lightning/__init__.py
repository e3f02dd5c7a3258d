"""comlrl-lightning: cooperative multi-LLM reinforcement learning as PyTorch Lightning modules."""

from comlrl_lightning.agents import AgentSpec
from comlrl_lightning.envs.base import DecPOMDP, Episode, PromptTemplate, Transition
from comlrl_lightning.magrpo import MAGRPO, MAReMax, MAREINFORCE, MARLOO
from comlrl_lightning.rewards import RewardFunction, RewardOutput, RewardProcessor, WeightedReward

__all__ = [
    "MAGRPO", "MAREINFORCE", "MARLOO", "MAReMax", "AgentSpec", "DecPOMDP", "Episode", "PromptTemplate",
    "Transition", "RewardFunction", "RewardOutput", "RewardProcessor", "WeightedReward",
]  # fmt: skip
__version__ = "0.1.0"
