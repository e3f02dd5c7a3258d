"""Every logged metric name, in one place (TRL's names where the meaning matches).

Scalars of a training step: the module logs :data:`REWARD`, :data:`REWARD_STD`,
:data:`FRAC_REWARD_ZERO_STD`, :data:`MEAN_LENGTH` and :func:`agent` ``(i, "loss")``;
:class:`~comlrl_lightning.callbacks.RewardLogger` logs the rest. Validation logs the ``VAL_*`` names.

One scheme everywhere: a team-level metric has TRL's name (``entropy``, ``clip_ratio/low_mean``,
``completions/min_length``); the same quantity for one agent is ``z_agent_<i>/<that name>``
(:func:`agent`). The ``z_`` is for TensorBoard: its SCALARS tab groups tags by the part before the
first ``/``, orders the groups by their first tag and opens only the first two; with ``agent_<i>``
a team's run opened on agent 0's dozen diagnostics (flat-zero clip ratios first) and the shared
``reward`` was card 40. Every team name starts with a letter before ``z`` (``val/`` is the last), so
each agent's group sorts below every team group (tests/test_logging_order.py). TRL reduces ``clip_ratio/low_min`` / ``high_max`` over processes; here they are
the min / max over agents (and ranks). The coordinator's learners, one agent each in their own log
folder, log :func:`update_metrics` under the same names without a prefix.
"""

from collections.abc import Sequence
from typing import Any

import torch

REWARD = "reward"
"""Mean shared reward over the step's joint actions (all turns)."""
REWARD_STD = "reward_std"
"""Mean over nodes of the std of a node's rewards."""
FRAC_REWARD_ZERO_STD = "frac_reward_zero_std"
"""Fraction of nodes whose rewards are all equal (their advantages are 0)."""
MEAN_LENGTH = "completions/mean_length"
"""Mean completion length in tokens over all agents."""
CLIPPED_RATIO = "completions/clipped_ratio"
"""Fraction of completions that hit ``max_new_tokens``."""
MIN_LENGTH = "completions/min_length"
"""Shortest completion in tokens (EOS included), over all agents."""
MAX_LENGTH = "completions/max_length"
"""Longest completion in tokens, over all agents."""
MEAN_TERMINATED_LENGTH = "completions/mean_terminated_length"
"""Mean length of the completions that ended before ``max_new_tokens`` (0 when none did), over all agents."""
ENTROPY = "entropy"
"""Mean over agents of each agent's mean policy entropy over its loss's completion tokens (nats)."""
KL = "kl"
"""Mean over agents of each agent's k3 KL to its reference model (logged when ``beta > 0``)."""
GRAD_NORM = "grad_norm"
"""Total gradient norm before clipping (per agent: ``z_agent_<i>/grad_norm``; learners: their own)."""
LOSS = "loss"
CLIP_RATIO_LOW_MEAN = "clip_ratio/low_mean"
"""Fraction of completion tokens with ``ρ < 1 − ε`` and ``A < 0`` (clipped below), mean over agents."""
CLIP_RATIO_LOW_MIN = "clip_ratio/low_min"
"""The smallest agent's ``clip_ratio/low_mean``."""
CLIP_RATIO_HIGH_MEAN = "clip_ratio/high_mean"
"""Fraction of completion tokens with ``ρ > 1 + ε_high`` and ``A > 0`` (clipped above), mean over agents."""
CLIP_RATIO_HIGH_MAX = "clip_ratio/high_max"
"""The largest agent's ``clip_ratio/high_mean``."""
CLIP_RATIO_REGION_MEAN = "clip_ratio/region_mean"
"""Fraction of completion tokens clipped on either side, mean over agents (0 on-policy)."""
SAMPLING_LOGP_DIFFERENCE_MEAN = "sampling/sampling_logp_difference/mean"
"""Engine rollouts (``generation_backend="vllm"``): mean over completion tokens of
``|log π_trainer − log π_engine|`` (nats), mean over agents (TRL's name)."""
SAMPLING_LOGP_DIFFERENCE_MAX = "sampling/sampling_logp_difference/max"
"""Engine rollouts: the largest per-token ``|log π_trainer − log π_engine|`` over agents (TRL's name)."""
TOKENS_PER_SECOND = "tokens_per_second"
EPISODES_PER_SECOND = "episodes_per_second"

CRITIC_VALUE_MEAN = "critic/value_mean"
"""IAC / MAAC: mean critic value over the step's samples (before the update), mean over critics."""
CRITIC_VALUE_LOSS = "critic/value_loss"
"""IAC / MAAC: the critics' value loss (``value_loss_coef`` included), mean over critics."""
CRITIC_EXPLAINED_VARIANCE = "critic/explained_variance"
"""IAC / MAAC: ``1 − Var(T − V) / Var(T)`` of the values against their TD targets, mean over critics."""

DPO_CHOSEN = "rewards/chosen"
"""MADPO: mean over pairs of the chosen joint action's implied reward ``β·Σ_i (log π_i − log π_ref,i)``
(Σ over agents; TRL's name; the reference term is 0 with ``reference_free``)."""
DPO_REJECTED = "rewards/rejected"
"""MADPO: the same for the rejected joint action (Σ over agents)."""
DPO_MARGINS = "rewards/margins"
"""MADPO: mean of chosen minus rejected, ``β·Σ_i Δ_i`` (Σ over agents; per agent: ``z_agent_<i>/rewards/margins``)."""
DPO_ACCURACIES = "rewards/accuracies"
"""MADPO: fraction of pairs whose joint margin is > 0 (of the Σ over agents)."""
DPO_LOGPS_CHOSEN = "logps/chosen"
"""MADPO: mean over pairs of the chosen joint action's log-prob ``Σ_i log π_i`` (Σ over agents)."""
DPO_LOGPS_REJECTED = "logps/rejected"
"""MADPO: the same for the rejected joint action."""
MARLHF_TASK_REWARD = "marlhf/task_reward"
"""MARLHF's RL phase (``reward_model.log_task_reward``): mean task ("gold") reward of the step's
joint actions, scored by the env's reward beside ``reward`` (there the learned reward the update
used); the two diverging is over-optimisation of the learned model."""
NUM_PAIRS = "preference/num_pairs"
"""MADPO: preference pairs the step trained on (0: every candidate tied)."""
PARSE_FAILURE = "centralized/parse_failure"
"""Centralized actor: fraction of the step's joint completions in which the adapter found no role
section (every role's text was then empty; CoMLRL's outcome). ``val/`` prefixed in validation."""
EMPTY_ROLE = "centralized/empty_role"
"""Centralized actor: fraction of role texts (joint completions × roles) that are empty: a parse
failure, a missing section or an empty one. ``val/`` prefixed in validation."""
COMPARATOR_ERRORS = "comparator/errors"
"""Iterative trainers: failed comparator requests so far (every failed attempt, retries included)."""
COMPARATOR_RETRIES = "comparator/retries"
"""Iterative trainers: comparator requests retried so far (timeouts, refused connections, HTTP 408/429/5xx)."""
COMPARATOR_SKIPPED_PAIRS = "comparator/skipped_pairs"
"""Iterative trainers: candidate pairs (current i, comparator i) not formed because the comparator failed
for their episode (``comparator_on_error="skip"``), so far."""
COMPARATOR_PARSE_FAILURES = "comparator/parse_failures"
"""Iterative trainers: centralized comparator completions with none of the role tags, so far."""
PAIRS_CURRENT = "pairs/current"
"""Iterative trainers: preference pairs the round built (CoMLRL ``iter/current_preference_pairs``)."""
PAIRS_TOTAL = "pairs/total"
"""Iterative trainers: pairs in every replay shard so far (CoMLRL ``iter/total_preference_pairs``)."""
PAIRS_TRAIN = "pairs/train"
"""Iterative trainers: pairs the round trains on after replay (CoMLRL ``iter/train_preference_pairs``)."""
ROUND = "iter/round"
"""Iterative trainers: the round the step belongs to (0-based)."""
SAMPLES = "iter/samples"
"""Iterative trainers: joint responses generated so far for pairs, current plus comparator (the sample budget)."""

VAL_REWARD = "val/reward"
VAL_RETURN = "val/return"
VAL_PASS_AT_1 = "val/pass@1"
"""Validation pass@1 of the team's first answer (a reward's ``PASS_AT_1``): the fraction of problems
its one greedy sample solves, or with ``num_generations_eval = n > 1`` the unbiased estimate from n
samples (see :func:`val_pass_at`)."""


def val_pass_at(k: int, final: bool = False) -> str:
    """``val/pass@<k>`` (turn 0, the team's first answer) or ``val/final/pass@<k>`` (the last joint
    action of each path, multi-turn): unbiased pass@k, mean over problems (core/evaluation.py)."""
    return f"val/{'final/' if final else ''}pass@{k}"


AGENT_PREFIX = "z_agent_"
"""The start of every per-agent metric's name: ``z_agent_<i>/`` sorts after every team metric in
TensorBoard's SCALARS tab (see the module docstring)."""


def agent(i: int, name: str) -> str:
    """``z_agent_<i>/<name>``: a per-agent metric (``loss``, ``grad_norm``, ``kl``, ``completions/...``)."""
    return f"{AGENT_PREFIX}{i}/{name}"


def reward_model(name: str, held_out: bool = False) -> str:
    """``reward_model/<name>`` (per epoch, over MARLHF's training pairs) or ``val/reward_model/<name>``
    (its held-out pairs): ``loss`` (Bradley–Terry), ``accuracy`` (chosen scored above rejected),
    ``margin`` (mean chosen − rejected score), ``skipped_steps`` (non-finite, training only)."""
    return f"{'val/' if held_out else ''}reward_model/{name}"


def critic(i: int, name: str) -> str:
    """``critic/agent_<i>/<name>``: one IAC critic's ``value_mean`` / ``value_loss`` / ``explained_variance``."""
    return f"critic/agent_{i}/{name.removeprefix('critic/')}"


def reward_fn(name: str, prefix: str = "") -> str:
    """``[prefix]rewards/<name>/mean``: a reward function's (or reward metric's) mean (TRL's name)."""
    return f"{prefix}rewards/{name}/mean"


def turn(t: int, name: str, prefix: str = "") -> str:
    """``[prefix]turn_<t>/<name>``: a per-turn ``reward`` or ``return``."""
    return f"{prefix}turn_{t}/{name}"


def update_metrics(stats: Any, beta: float) -> dict[str, float]:
    """One agent's update statistics under their TRL names (prefix them with :func:`agent` for one
    agent of a team): ``grad_norm``, ``entropy``, ``clip_ratio/low_mean``, ``high_mean``,
    ``region_mean``, and ``kl`` when ``beta > 0``.

    Args:
        stats: an :class:`~comlrl_lightning.core.records.AgentStats` (or a mapping with its keys).
        beta: the KL coefficient (``LossConfig.beta``).
    """
    keys = {
        GRAD_NORM: "grad_norm",
        ENTROPY: "entropy",
        CLIP_RATIO_LOW_MEAN: "clip_ratio_low",
        CLIP_RATIO_HIGH_MEAN: "clip_ratio_high",
        CLIP_RATIO_REGION_MEAN: "clip_ratio",
    }
    if beta > 0:
        keys[KL] = "kl"
    return {name: float(stats[key]) for name, key in keys.items()}


def team_update_metrics(per_agent: Sequence[dict[str, float]]) -> dict[str, float]:
    """The team-level TRL names from each agent's :func:`update_metrics`: ``entropy``, ``kl`` and the
    ``*_mean`` clip ratios are means over agents, ``clip_ratio/low_min`` the min of the agents'
    ``low_mean``, ``clip_ratio/high_max`` the max of their ``high_mean``. Empty for no agents."""
    if not per_agent:
        return {}
    out = {}
    for name in (ENTROPY, KL, CLIP_RATIO_LOW_MEAN, CLIP_RATIO_HIGH_MEAN, CLIP_RATIO_REGION_MEAN):
        if name in per_agent[0]:
            out[name] = sum(a[name] for a in per_agent) / len(per_agent)
    out[CLIP_RATIO_LOW_MIN] = min(a[CLIP_RATIO_LOW_MEAN] for a in per_agent)
    out[CLIP_RATIO_HIGH_MAX] = max(a[CLIP_RATIO_HIGH_MEAN] for a in per_agent)
    return out


def length_metrics(lengths: torch.Tensor, clipped: torch.Tensor) -> dict[str, float]:
    """TRL's completion-length metrics of ``lengths`` ``[S]`` (tokens) and ``clipped`` ``[S]`` (hit
    ``max_new_tokens``): ``completions/mean_length``, ``min_length``, ``max_length``,
    ``mean_terminated_length`` (over the completions that were not clipped; 0 when all were) and
    ``clipped_ratio``."""
    lengths, clipped = lengths.float().flatten(), clipped.bool().flatten()
    terminated = lengths[~clipped]
    return {
        MEAN_LENGTH: float(lengths.mean()),
        MIN_LENGTH: float(lengths.min()),
        MAX_LENGTH: float(lengths.max()),
        MEAN_TERMINATED_LENGTH: float(terminated.mean()) if terminated.numel() else 0.0,
        CLIPPED_RATIO: float(clipped.float().mean()),
    }
