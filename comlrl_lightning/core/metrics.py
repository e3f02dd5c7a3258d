"""Every logged metric name, in one place (TRL's names where the meaning matches).

Scalars of a training step: the module logs :data:`REWARD`, :data:`REWARD_STD`,
:data:`FRAC_REWARD_ZERO_STD`, :data:`MEAN_LENGTH` and :func:`agent` ``(i, "loss")``;
:class:`~comlrl_lightning.callbacks.RewardLogger` logs the rest. Validation logs the ``VAL_*`` names.
"""

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
TOKENS_PER_SECOND = "tokens_per_second"
EPISODES_PER_SECOND = "episodes_per_second"

CRITIC_VALUE_MEAN = "critic/value_mean"
"""IAC / MAAC: mean critic value over the step's samples (before the update), mean over critics."""
CRITIC_VALUE_LOSS = "critic/value_loss"
"""IAC / MAAC: the critics' value loss (``value_loss_coef`` included), mean over critics."""
CRITIC_EXPLAINED_VARIANCE = "critic/explained_variance"
"""IAC / MAAC: ``1 − Var(T − V) / Var(T)`` of the values against their TD targets, mean over critics."""

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


def agent(i: int, name: str) -> str:
    """``agent_<i>/<name>``: a per-agent metric (``loss``, ``grad_norm``, ``kl``, ``completions/...``)."""
    return f"agent_{i}/{name}"


def critic(i: int, name: str) -> str:
    """``critic/agent_<i>/<name>``: one IAC critic's ``value_mean`` / ``value_loss`` / ``explained_variance``."""
    return f"critic/agent_{i}/{name.removeprefix('critic/')}"


def reward_fn(name: str, prefix: str = "") -> str:
    """``[prefix]rewards/<name>/mean``: a reward function's (or reward metric's) mean (TRL's name)."""
    return f"{prefix}rewards/{name}/mean"


def turn(t: int, name: str, prefix: str = "") -> str:
    """``[prefix]turn_<t>/<name>``: a per-turn ``reward`` or ``return``."""
    return f"{prefix}turn_{t}/{name}"
