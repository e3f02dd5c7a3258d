"""Lightning callbacks for multi-agent RL (installed as ``comlrl_lightning.callbacks``).

- :class:`RewardLogger`: TRL-style reward, length, per-agent and throughput metrics.
- :class:`CompletionLogger`: prompts, completions and rewards as TensorBoard text tables.
- :class:`GradientCheckpointing`: activation checkpointing on every agent.
- :class:`AgentCheckpoint`: each agent as a Hugging Face folder, atomically, last k kept.
- :class:`HeldOutOutcomes`: each validation problem's outcome per validation; the before -> after gain.
- :class:`InterruptCheckpoint`: SIGTERM / Ctrl+C save a resumable checkpoint and exit non-zero.
- :class:`RichProgress` / :class:`TQDMProgress`: Lightning's progress bars without ``v_num``;
  :class:`ProgressLines`: plain metric lines for a log file; :func:`default_progress_bar` picks one.
- :class:`FitSummary`: the start -> end of the key scalars when ``fit`` ends (resumed runs too).
- :class:`TeamFirstLayout`: TensorBoard's CUSTOM SCALARS tab, the team's reward first.
"""

from comlrl_lightning.callbacks.agent_checkpoint import AgentCheckpoint
from comlrl_lightning.callbacks.completion_logger import CompletionLogger
from comlrl_lightning.callbacks.fit_summary import FitSummary
from comlrl_lightning.callbacks.gradient_checkpointing import GradientCheckpointing
from comlrl_lightning.callbacks.held_out import HeldOutOutcomes
from comlrl_lightning.callbacks.interrupt_checkpoint import InterruptCheckpoint
from comlrl_lightning.callbacks.progress_bar import (
    ProgressLines,
    RichProgress,
    TQDMProgress,
    default_progress_bar,
)
from comlrl_lightning.callbacks.reward_logger import RewardLogger
from comlrl_lightning.callbacks.scalar_layout import TeamFirstLayout

__all__ = [
    "AgentCheckpoint",
    "CompletionLogger",
    "FitSummary",
    "GradientCheckpointing",
    "HeldOutOutcomes",
    "InterruptCheckpoint",
    "ProgressLines",
    "RewardLogger",
    "RichProgress",
    "TQDMProgress",
    "TeamFirstLayout",
    "default_progress_bar",
]
