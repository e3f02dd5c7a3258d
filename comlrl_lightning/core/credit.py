"""Per-agent credit under one shared reward, at aligned-mode generation cost.

With one shared reward every agent of an aligned joint action gets the same return, so agent i's
advantage also carries its teammates' luck. Both modes here score *extra joint actions built from
the samples already generated* (more reward calls, no extra generation); only the K aligned joint
actions are expanded into child nodes. ``credit`` values:

- ``shared`` (MAGRPO): agent i's sample k is scored by the aligned joint action's return.
- ``counterfactual`` (difference rewards; Wolpert & Tumer 2002, COMA's counterfactual baseline,
  Foerster et al. 2018, arXiv 1705.08926): agent i's sample k is compared with the joint actions
  that keep the teammates' samples ``k_-i`` and swap agent i's own,
  ``A_i,k = R(k_i, k_-i) − mean_{k'} R(k', k_-i)`` (``advantage_mode`` picks the baseline over that
  row of K; ``mean`` gives the formula above). The teammates' luck cancels exactly. Cost: K − 1
  extra reward calls per aligned joint action and agent; for N = 2 the swaps of agent 0 and of
  agent 1 are the same off-diagonal joint actions, so the calls are the full K² grid.
- ``cross_rewards`` ("cross rewards, aligned expansion"): the immediate rewards of all K^N
  combinations are computed, agent i's sample k is scored by the mean over the combinations that
  contain it (cross mode's marginal), then the group baseline is taken over its K samples.

Multi-turn. Only aligned joint actions have children, so a combination that was not expanded has no
return of its own. Its continuation is the mean return of the node's expanded children
``C̄ = mean_k R_child(k)``:

- ``cross_rewards``: *every* combination (the aligned ones too) gets ``r_c + γ·C̄``. The continuation
  is one constant per node, so it cancels in the baseline: credit comes from immediate rewards only.
  **Bias**: an action's effect on later turns is invisible to its advantage (a good first draft
  that only pays off after revision gets no credit at turn 0). The child nodes' own advantages are
  unaffected.
- ``counterfactual``: the aligned (actual) joint action keeps its own return
  ``r_k + γ·R_child(k)``; the swapped ones get ``r + γ·C̄``. The actual's future is kept, so long-term
  credit survives; the bias is in the baseline, which treats every swapped action's future as the
  node average (difference rewards with an average-future approximation).

Per-agent rewards (``[J, N]``, one column per agent): every return table gains a trailing agent
dimension and agent i's credit (its swap table, its cross marginal) is computed from column i alone,
so each agent's advantages are those of a shared reward equal to its own column.

A scored row whose joint action is solved (reward ``>= stop_reward``, or a node ended by
``termination_threshold``, or an aligned joint action the transition called ``SOLVED``) returns the
absorbing ``r · Σ_{s=0}^{T−1−t} γ^s`` in every mode (:mod:`comlrl_lightning.core.td`), so a swap that
would have solved the task is credited as solving it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from comlrl_lightning.core.advantages import (
    agent_sample_returns,
    group_advantages,
    joint_action_indices,
    scale_by_std,
)
from comlrl_lightning.core.choices import Choice
from comlrl_lightning.core.td import absorbing_rewards

CREDIT = Choice(
    "credit",
    {
        "shared": "each agent gets the joint action's return (MAGRPO)",
        "counterfactual": "difference rewards, `R(k_i, k_-i) − mean_k' R(k', k_-i)`: K−1 extra reward calls "
        "per joint action and agent (the N=2 grid K²); aligned only",
        "cross_rewards": "rewards of all K^N combinations for credit, only the K aligned ones expanded "
        "(multi-turn: credit from immediate rewards only); aligned only",
    },
)
"""Per-agent credit under the one shared reward (formulas and biases: the module docstring)."""


@dataclass(frozen=True)
class CreditIndex:
    """The joint actions a node's rewards are computed for, and where each credit term finds its row.

    Attributes:
        joint_index: ``[M, N]`` long: sample index of every agent in each scored joint action. The
            first ``K`` rows are the aligned joint actions ``(k, …, k)`` (the expanded ones).
        lookup: ``[N, K, K]`` long, counterfactual mode: ``lookup[i, k, k']`` is the row of the joint
            action where agent i plays sample ``k'`` and every teammate plays ``k``
            (``lookup[i, k, k]`` is the aligned row ``k``). None in the other modes.
    """

    joint_index: torch.Tensor
    lookup: torch.Tensor | None

    @property
    def num_reward_calls(self) -> int:
        """Reward calls per node: ``M``."""
        return int(self.joint_index.shape[0])


def credit_index(num_agents: int, num_generations: int, credit: str) -> CreditIndex:
    """Which joint actions a node's rewards are computed for under ``credit``.

    Rows are deduplicated, so calls shared between agents are made once: ``shared`` scores ``K``
    joint actions; ``counterfactual`` ``K`` for N = 1, ``K²`` for N = 2, ``K + N·K·(K−1)`` for
    N ≥ 3; ``cross_rewards`` ``K^N`` (aligned rows first, then the rest in lexicographic order).

    Raises:
        ValueError: unknown ``credit``.
    """
    n, k = num_agents, num_generations
    aligned = [(j,) * n for j in range(k)]
    if credit == "shared":
        return CreditIndex(joint_action_indices(n, k, "aligned"), None)
    if credit == "cross_rewards":
        rest = [c for c in itertools.product(range(k), repeat=n) if len(set(c)) > 1]
        return CreditIndex(torch.tensor(aligned + rest, dtype=torch.long), None)
    if credit != "counterfactual":
        raise ValueError(f"credit: got {credit!r}, allowed: {list(CREDIT.names)}")
    rows: dict[tuple[int, ...], int] = {c: r for r, c in enumerate(aligned)}
    lookup = torch.empty(n, k, k, dtype=torch.long)
    for i, base, swap in itertools.product(range(n), range(k), range(k)):
        combo = tuple(swap if a == i else base for a in range(n))
        lookup[i, base, swap] = rows.setdefault(combo, len(rows))
    return CreditIndex(torch.tensor(list(rows), dtype=torch.long), lookup)


def agent_column(returns: torch.Tensor, agent: int) -> torch.Tensor:
    """``[G, J]`` returns of ``agent``: its column of per-agent returns ``[G, J, N]``, else the shared ``[G, J]``."""
    return returns[..., agent] if returns.dim() == 3 else returns


def reward_calls_per_episode(num_agents: int, num_generations: int, num_turns: int, credit: str) -> int:
    """Upper bound on reward calls per episode of a full aligned tree under ``credit``.

    Turn t has ``K^t`` nodes (only aligned joint actions are expanded), each costing
    :attr:`CreditIndex.num_reward_calls`: total ``M · Σ_{t<T} K^t``. The generation cost is
    aligned mode's whatever ``credit`` is.
    """
    calls = credit_index(num_agents, num_generations, credit).num_reward_calls
    return calls * sum(num_generations**t for t in range(num_turns))


def check_reward_call_budget(
    num_agents: int, num_generations: int, num_turns: int, credit: str, max_reward_calls_per_episode: int
) -> None:
    """Refuse, at construction, a config whose full tree would make too many reward calls.

    Raises:
        ValueError: :func:`reward_calls_per_episode` exceeds ``max_reward_calls_per_episode``
            (naming both and how to lower it), or ``credit`` is unknown.
    """
    calls = reward_calls_per_episode(num_agents, num_generations, num_turns, credit)
    if calls > max_reward_calls_per_episode:
        raise ValueError(
            f"credit={credit!r}, num_agents={num_agents}, num_generations={num_generations}, num_turns={num_turns} "
            f"make up to {calls} reward calls per episode, over max_reward_calls_per_episode="
            f"{max_reward_calls_per_episode}; lower K/turns, use credit='shared', or raise the limit"
        )


def combination_returns(
    rewards: torch.Tensor,
    child_values: torch.Tensor,
    has_child: torch.Tensor,
    discount: float,
    own_future: bool,
    solved: torch.Tensor | None = None,
    turns_left: int = 0,
) -> torch.Tensor:
    """Returns of every scored joint action of ``G`` nodes (see the module docstring, "Multi-turn").

    Args:
        rewards: ``[G, M]`` immediate shared rewards, rows ordered as :attr:`CreditIndex.joint_index`;
            or ``[G, M, N]`` per-agent rewards (every agent's column its own returns).
        child_values: ``[G, K]`` (per-agent: ``[G, K, N]``) value of aligned joint action k's child
            node: the mean return of that child's aligned joint actions (ignored where ``has_child``
            is False).
        has_child: ``[G, K]`` bool, whether aligned joint action k was expanded.
        discount: γ.
        own_future: the aligned rows keep ``r_k + γ·value(child_k)`` (``shared``, ``counterfactual``);
            False: every row gets ``r + γ·C̄`` (``cross_rewards``).
        solved: ``[G, M]`` bool: rows whose joint action is (or would be) solved; they return the
            absorbing ``r · Σ_{s=0}^{turns_left} γ^s`` whatever the mode
            (:func:`~comlrl_lightning.core.td.absorbing_rewards`). None: no row.
        turns_left: turns after this one.

    Returns:
        ``[G, M]`` float. ``C̄`` is the mean of ``child_values`` over the node's expanded children;
        a node without children has ``C̄ = 0`` (every unsolved return is its reward).
    """
    k = child_values.shape[1]
    per_agent = rewards.dim() == 3  # [G, M, N]: one column per agent, each its own returns
    mask = has_child[..., None] if per_agent else has_child
    future = torch.where(mask, child_values.float(), torch.zeros_like(child_values, dtype=torch.float))
    c_bar = future.sum(1) / mask.sum(1).clamp(min=1)  # [G] (or [G, N])
    out = rewards.float() + discount * c_bar[:, None]
    if own_future:
        out[:, :k] = rewards[:, :k].float() + discount * future
    if solved is not None and turns_left > 0:
        absorbed = absorbing_rewards(rewards, solved, turns_left, discount)
        out = torch.where(solved[..., None] if per_agent else solved, absorbed, out)
    return out


def tree_credit_returns(
    rewards: Sequence[torch.Tensor],
    child: Sequence[torch.Tensor],
    discount: float,
    credit: str,
    solved: Sequence[torch.Tensor | None] | None = None,
    turns_left: Sequence[int] | None = None,
) -> list[torch.Tensor]:
    """Returns of every scored joint action of an aligned-expansion tree, bottom-up.

    Args:
        rewards: per turn t, ``[G_t, M]`` immediate rewards (rows as :func:`credit_index`'s).
        child: per turn t, ``[G_t, K]`` long: the index in turn t+1 of aligned joint action k's child
            node, −1 where the branch ended.
        discount: γ.
        credit: one of :data:`CREDIT` (``shared`` has ``M = K`` and gives MAGRPO's returns).
        solved: per turn ``[G_t, M]`` bool, rows that ended solved (absorbing returns, see
            :func:`combination_returns`); None: none.
        turns_left: per turn, the turns after it (needed with ``solved``).

    Returns:
        Per turn ``[G_t, M]``. A child node's value is the mean return of its K aligned joint actions.

    Raises:
        ValueError: unknown ``credit``.
    """
    CREDIT.check(credit)
    out: list[torch.Tensor] = [torch.empty(0)] * len(rewards)
    below: torch.Tensor | None = None
    for t in reversed(range(len(rewards))):
        has_child = child[t] >= 0
        values = torch.zeros(child[t].shape + rewards[t].shape[2:])  # [G_t, K] (or [G_t, K, N])
        if below is not None:
            node_values = below[:, : child[t].shape[1]].mean(1)  # [G_{t+1}] (or [G_{t+1}, N])
            values[has_child] = node_values[child[t][has_child]]
        out[t] = below = combination_returns(
            rewards[t],
            values,
            has_child,
            discount,
            credit != "cross_rewards",
            None if solved is None else solved[t],
            0 if turns_left is None else turns_left[t],
        )
    return out


def counterfactual_advantages(
    returns: torch.Tensor, index: CreditIndex, mode: str = "mean", costs: Sequence[torch.Tensor] | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Difference-reward advantages of every agent's K samples at ``G`` nodes (before std scaling).

    For agent i and aligned joint action k the group is the row
    ``S_i[k, k'] = R(k' for agent i, k for the teammates)`` over ``k'``; the advantage of sample k is
    element ``k`` of ``group_advantages(S_i[k, :], mode, scale="none")``
    (``mean``: ``R(k,…,k) − mean_{k'} S_i[k, k']``; ``rloo``: the mean over ``k' ≠ k``).

    Args:
        returns: ``[G, M]`` returns of the joint actions of :func:`credit_index` (``"counterfactual"``).
        index: that :class:`CreditIndex` (its ``lookup`` is used).
        mode: ``advantage_mode``.
        costs: optional N tensors ``[G, K]``: a cost of agent i's sample k', subtracted from
            ``S_i[k, k']`` for every k (see :func:`step_advantages`).

    Returns:
        ``(advantages, scores)``: N tensors ``[G, K]`` (agent i's advantage of its sample k, the one
        in aligned joint action k) and N tensors ``[G, X]``: the distinct joint actions of the table
        ``S_i`` (for ``advantages.scale_by_std``). For N ≥ 2 every entry of the K·K table is its own
        joint action, ``X = K²``, and the std is taken over all of them; for N = 1 the table is the
        K returns repeated K times, ``X = K``, so the advantages equal ``shared`` credit's exactly.

    Raises:
        ValueError: ``index`` has no ``lookup`` (not built for ``"counterfactual"``).
    """
    if index.lookup is None:
        raise ValueError("counterfactual_advantages needs credit_index(..., credit='counterfactual')")
    n, k, _ = index.lookup.shape
    g = returns.shape[0]
    advantages, scores = [], []
    for i in range(n):
        own = agent_column(returns, i).float()  # [G, M]: agent i's returns (its column if per-agent)
        table = own[:, index.lookup[i]]  # [G, K, K]: [node, teammates' sample k, own swap k']
        if costs is not None:
            table = table - costs[i].float()[:, None, :]
        adv = group_advantages(table.reshape(g * k, k), mode, "none").view(g, k, k)
        advantages.append(adv.diagonal(dim1=1, dim2=2).clone())
        scores.append(table.reshape(g, k * k)[:, _first_of_each_row(index.lookup[i])])
    return advantages, scores


def _first_of_each_row(lookup: torch.Tensor) -> torch.Tensor:
    """``[X]`` positions in ``lookup.flatten()`` (``[K, K]``) of each distinct joint-action row's first
    entry: the std is taken over distinct joint actions, never over repeats of one (N = 1 repeats
    every row K times, which would shrink the std by ``√(K/(K+1))``)."""
    flat = lookup.flatten()
    _, inverse = torch.unique(flat, return_inverse=True)
    positions = torch.arange(flat.numel())
    first = torch.full((int(inverse.max()) + 1,), flat.numel(), dtype=torch.long)
    return first.scatter_reduce(0, inverse, positions, reduce="amin").sort().values  # table order


def cross_rewards_advantages(
    returns: torch.Tensor,
    index: CreditIndex,
    num_agents: int,
    mode: str = "mean",
    costs: Sequence[torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Cross-credit advantages (before std scaling): agent i's sample k is scored by the mean return
    of the combinations that contain it, then grouped over its K samples.

    Args:
        returns: ``[G, K^N]`` returns of the joint actions of :func:`credit_index` (``"cross_rewards"``).
        index: that :class:`CreditIndex`.
        num_agents: N.
        mode: ``advantage_mode``.
        costs: optional N tensors ``[G, K]`` subtracted from agent i's per-sample scores.

    Returns:
        ``(advantages, scores)``: N tensors ``[G, K]`` each; the scores are the per-sample returns.
    """
    k = int(index.joint_index[:, 0].max()) + 1
    scores = [
        agent_sample_returns(agent_column(returns, i).float(), index.joint_index, i, k)
        for i in range(num_agents)
    ]
    if costs is not None:
        scores = [s - c.float() for s, c in zip(scores, costs)]
    return [group_advantages(r, mode, "none") for r in scores], scores


def step_advantages(
    turn_returns: Sequence[torch.Tensor],
    index: CreditIndex,
    num_agents: int,
    credit: str,
    mode: str = "mean",
    scale: str = "group",
    agent_wise: bool = True,
    eps: float = 1e-4,
    sample_costs: Sequence[Sequence[torch.Tensor]] | None = None,
) -> list[list[torch.Tensor]]:
    """Every agent's advantages for every turn of a step, under ``credit`` and std scaling.

    Args:
        turn_returns: per turn ``[G_t, M]`` returns of the scored joint actions (rows of
            ``index.joint_index``; for ``shared`` credit the joint mode's own ``[J, N]`` table, or
            ``[G_t, J, N]`` per-agent returns: agent i's scores are column i).
        index: the rows' :class:`CreditIndex` (``shared``: ``CreditIndex(joint_index, None)``).
        num_agents: N.
        credit: one of :data:`CREDIT`.
        mode: ``advantage_mode`` (the baseline).
        scale, agent_wise, eps: as in :func:`~comlrl_lightning.core.advantages.scale_by_std`;
            ``batch`` statistics span every turn of the step.
        sample_costs: per turn, per agent ``[G_t, K]`` a cost of each of the agent's own samples,
            subtracted from every score that sample takes part in before the baseline
            (``kl_mode="reward"``: ``β·KL`` to the reference, CoMLRL's shaping). In a counterfactual
            table each swapped-in sample carries its own cost. None: no cost.

    Returns:
        Per turn, per agent ``[G_t, K]`` advantages.

    Raises:
        ValueError: unknown ``credit``, ``mode`` or ``scale``.
    """
    CREDIT.check(credit)
    k = int(index.joint_index[:, 0].max()) + 1
    raw, scores = [], []
    for t, returns in enumerate(turn_returns):
        costs = None if sample_costs is None else [c.float() for c in sample_costs[t]]
        if credit == "counterfactual":
            adv, sc = counterfactual_advantages(returns, index, mode, costs)
        elif credit == "cross_rewards":
            adv, sc = cross_rewards_advantages(returns, index, num_agents, mode, costs)
        else:
            sc = [
                agent_sample_returns(agent_column(returns, i).float(), index.joint_index, i, k)
                for i in range(num_agents)
            ]
            sc = sc if costs is None else [r - c for r, c in zip(sc, costs)]
            adv = [group_advantages(r, mode, "none") for r in sc]
        raw.append(adv)
        scores.append(sc)
    if scale != "batch":
        return [scale_by_std(a, s, scale, agent_wise, eps) for a, s in zip(raw, scores)]
    sizes = [r.shape[0] for r in turn_returns]
    joined = scale_by_std(
        [torch.cat([a[i] for a in raw]) for i in range(num_agents)],
        [torch.cat([s[i] for s in scores]) for i in range(num_agents)],
        scale,
        agent_wise,
        eps,
    )
    parts = [a.split(sizes) for a in joined]
    return [[parts[i][t] for i in range(num_agents)] for t in range(len(turn_returns))]
