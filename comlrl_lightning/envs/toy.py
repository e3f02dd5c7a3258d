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

    def __call__(self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int) -> list[float]:
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

    def __call__(self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int) -> list[float]:
        return [math.exp(-abs(len(ja[0]) - self.target) / self.target) for ja in joint_actions]
