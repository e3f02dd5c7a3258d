"""A two-agent toy task that learns on CPU in minutes: length coordination.

Agent 0 writes something; agent 1 should write a completion 2–3× as long (in characters). The
shared reward is 1.0 when ``lo ≤ len(c1) / max(len(c0), 1) ≤ hi`` and decays as ``exp(-d)``
outside, ``d`` being the distance of the ratio to the band. Neither agent can earn it alone: the
team has to settle on lengths together.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from comlrl_lightning.envs.base import Episode

TOPICS = ("cats", "rain", "trains", "tea", "maps", "bees", "snow", "jazz", "clocks", "boats", "ink", "owls")


class LengthRatioReward:
    """Shared reward for the length-coordination task (see module docstring).

    Args:
        lo: lower end of the target ratio band.
        hi: upper end of the target ratio band.

    Raises:
        ValueError: ``lo <= 0`` or ``hi < lo``.
    """

    name = "length_ratio"

    def __init__(self, lo: float = 2.0, hi: float = 3.0) -> None:
        if lo <= 0 or hi < lo:
            raise ValueError(f"LengthRatioReward: need 0 < lo <= hi, got lo={lo}, hi={hi}")
        self.lo, self.hi = lo, hi

    def score(self, first: str, second: str) -> float:
        """The reward of one joint action ``(first, second)``."""
        ratio = len(second) / max(len(first), 1)
        d = max(self.lo - ratio, 0.0, ratio - self.hi)
        return math.exp(-d)

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> list[float]:
        return [self.score(ja[0], ja[1]) for ja in joint_actions]


def length_ratio_rows(num_rows: int, seed: int = 0) -> list[dict[str, str]]:
    """Synthetic episodes: ``{"topic": ...}`` rows drawn with a fixed seed."""
    rng = random.Random(seed)
    return [{"topic": rng.choice(TOPICS) + " " + rng.choice(TOPICS)} for _ in range(num_rows)]


class TargetLengthReward:
    """Single-agent toy reward: ``exp(-|len(c) - target| / target)`` for a completion ``c`` (characters).

    Uses agent 0's completion only, so it works for ``num_agents=1`` (plain GRPO).

    Raises:
        ValueError: ``target < 1``.
    """

    name = "target_length"

    def __init__(self, target: int = 16) -> None:
        if target < 1:
            raise ValueError(f"TargetLengthReward.target: got {target}, must be >= 1")
        self.target = target

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> list[float]:
        return [math.exp(-abs(len(ja[0]) - self.target) / self.target) for ja in joint_actions]


class TeamTargetsReward:
    """A team whose members' contributions differ (the credit-assignment benchmark's task).

    Agent i should write ``targets[i]`` characters; its closeness is ``c_i = exp(-|len_i - t_i| / t_i)``.
    The shared reward is ``w_0·c_0 + w_01·c_0·c_1 + w_2·c_2`` (default 0.6, 0.35, 0.05; max 1.0): agent
    0 matters most, agent 1 earns only when agent 0 is close (agent 0's mistake masks agent 1's
    work), agent 2 barely matters. The reward is multilinear in the ``c_i``, so the expected reward
    given one agent's action is :meth:`combine` at the teammates' expected closeness.

    Raises:
        ValueError: not three targets, a target < 1, or a negative weight.
    """

    name = "team_targets"

    def __init__(
        self, targets: Sequence[int] = (12, 24, 8), weights: Sequence[float] = (0.6, 0.35, 0.05)
    ) -> None:
        if len(targets) != 3 or min(targets) < 1:
            raise ValueError(f"TeamTargetsReward.targets: got {list(targets)}, need three lengths >= 1")
        if len(weights) != 3 or min(weights) < 0:
            raise ValueError(f"TeamTargetsReward.weights: got {list(weights)}, need three weights >= 0")
        self.targets, self.weights = tuple(targets), tuple(weights)

    def closeness(self, agent: int, length: int) -> float:
        """``c_i`` of a completion of ``length`` characters by agent ``agent``."""
        t = self.targets[agent]
        return math.exp(-abs(length - t) / t)

    def combine(self, c: Sequence[float]) -> float:
        """The shared reward from the three closeness values."""
        w0, w01, w2 = self.weights
        return w0 * c[0] + w01 * c[0] * c[1] + w2 * c[2]

    def __call__(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int
    ) -> list[float]:
        return [self.combine([self.closeness(i, len(ja[i])) for i in range(3)]) for ja in joint_actions]
