"""A coordinator of one trainer per agent (multi-agent recursive self-improvement); see coordinator.py."""

from comlrl_lightning.coordinator.coordinator import Coordinator
from comlrl_lightning.coordinator.evaluation import EvalOutput, evaluate_episodes
from comlrl_lightning.coordinator.learner import Learner, LearnerConfig
from comlrl_lightning.coordinator.rounds import (
    EpisodeSource,
    Experience,
    RoundOutput,
    RowEpisodes,
    Stage,
    play_round,
)
from comlrl_lightning.coordinator.schedule import (
    Alternate,
    EveryN,
    EveryRound,
    RoundRobin,
    WarmupFreeze,
    scheduled,
)

__all__ = [
    "Alternate",
    "Coordinator",
    "EpisodeSource",
    "EvalOutput",
    "EveryN",
    "EveryRound",
    "Experience",
    "Learner",
    "LearnerConfig",
    "RoundOutput",
    "RoundRobin",
    "RowEpisodes",
    "Stage",
    "WarmupFreeze",
    "evaluate_episodes",
    "play_round",
    "scheduled",
]
