"""comlrl-lightning: cooperative multi-LLM reinforcement learning as PyTorch Lightning modules."""

from comlrl_lightning.algorithms.actor_critic import ActorCritic, ActorCriticRolloutConfig
from comlrl_lightning.algorithms.base import CoMLRLModule
from comlrl_lightning.algorithms.centralized_magrpo import CentralizedMAGRPO
from comlrl_lightning.algorithms.iac import IAC
from comlrl_lightning.algorithms.maac import MAAC
from comlrl_lightning.algorithms.magrpo import MAGRPO, MAREINFORCE, MARLOO, MAReMax
from comlrl_lightning.core.config import (
    AdvantageConfig,
    LossConfig,
    PlacementConfig,
    RolloutConfig,
    SamplingConfig,
)
from comlrl_lightning.core.records import AgentStats, StepOutput
from comlrl_lightning.envs.base import DecPOMDP, Episode, PromptTemplate, Transition
from comlrl_lightning.envs.rewards import RewardFunction, RewardOutput, RewardProcessor, WeightedReward
from comlrl_lightning.infra.quiet import silence_start_up_noise
from comlrl_lightning.infra.sharded import ShardedTeamStrategy  # registers 'fsdp2'
from comlrl_lightning.infra.strategy import (
    AgentParallelStrategy,  # registers the 'agent_parallel' strategy name
)
from comlrl_lightning.moved import install as _answer_moved_paths
from comlrl_lightning.preference.dpo import DPOConfig
from comlrl_lightning.preference.joint_reward_model import RewardModelConfig
from comlrl_lightning.preference.madpo import MADPO
from comlrl_lightning.preference.madpo_iter import MADPOIter
from comlrl_lightning.preference.marlhf import MARLHF
from comlrl_lightning.preference.marlhf_iter import MARLHFIter, RLPhaseConfig
from comlrl_lightning.preference.pair_source import PairSourceConfig
from comlrl_lightning.preference.selection import PreferenceConfig
from comlrl_lightning.team.agents import AgentSpec
from comlrl_lightning.team.critics import CriticConfig, CriticSpec
from comlrl_lightning.team.team import Team

__all__ = [
    "MAGRPO",
    "MAREINFORCE",
    "MARLOO",
    "MAReMax",
    "CentralizedMAGRPO",
    "AgentSpec",
    "DecPOMDP",
    "Episode",
    "PromptTemplate",
    "Transition",
    "RewardFunction",
    "RewardOutput",
    "RewardProcessor",
    "WeightedReward",
    "AgentParallelStrategy",
    "ShardedTeamStrategy",
    "CoMLRLModule",
    "Team",
    "RolloutConfig",
    "AdvantageConfig",
    "LossConfig",
    "SamplingConfig",
    "PlacementConfig",
    "StepOutput",
    "AgentStats",
    "IAC",
    "MAAC",
    "ActorCritic",
    "ActorCriticRolloutConfig",
    "CriticConfig",
    "CriticSpec",
    "MARLHF",
    "RewardModelConfig",
    "PairSourceConfig",
    "MADPO",
    "MADPOIter",
    "MARLHFIter",
    "RLPhaseConfig",
    "DPOConfig",
    "PreferenceConfig",
]
__version__ = "0.2.0"

_answer_moved_paths()  # the families' old import paths, with a DeprecationWarning (moved.py)
silence_start_up_noise()  # precise filters for Lightning/transformers start-up noise (infra/quiet.py)
