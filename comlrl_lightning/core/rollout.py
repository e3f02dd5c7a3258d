"""Tree rollouts over turns (MAGRPO, Liu et al. 2025, arXiv 2508.04652, Alg. 1; CoMLRL ``magrpo.py``).

At every *node* (an episode at a turn, with each agent's history) every agent samples ``K``
completions in one batched call for all nodes of the turn. The node's joint actions are ``K``
(``aligned``) or ``K^N`` (``cross``). Each joint action gets the shared reward; unless the episode
ends there, the transition writes every agent's next prompt and the joint action becomes the parent
of a child node. Returns are computed bottom-up:

    R_t(j) = r_t(j) + discount · mean_{j'} R_{t+1}(j')      (children j' of joint action j)

A leaf's return is its reward. A joint action whose branch ended *solved* before the last turn
(``stop_reward``, ``termination_threshold``, or a transition returning ``SOLVED``) returns the value
of an absorbing solved state, ``r_t · Σ_{s=0}^{T−1−t} discount^s`` (``solved_return="absorbing"``,
the default; :mod:`comlrl_lightning.core.td`), so solving early is never ranked below solving later
with the same reward; ``solved_return="reward"`` keeps CoMLRL's ``R_t = r_t``. Advantages are
grouped per node and agent (the K siblings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from comlrl_lightning.core.advantages import agent_sample_returns, joint_action_indices
from comlrl_lightning.core.credit import (
    CreditIndex,
    agent_column,
    credit_index,
    step_advantages,
    tree_credit_returns,
)
from comlrl_lightning.core.records import Node, TeamAction, Turn, TurnState
from comlrl_lightning.core.td import SOLVED_RETURN, absorbing_rewards
from comlrl_lightning.envs.base import SOLVED, DecPOMDP, Episode

if TYPE_CHECKING:  # the config imports the choices of modules this one imports
    from comlrl_lightning.core.config import AdvantageConfig, RolloutConfig


class Actors(Protocol):
    """Who generates what: the one seam between a rollout and the models that act in it.

    :class:`~comlrl_lightning.team.team.Team` is the default (each agent renders its own history and
    samples K completions per node). An algorithm that changes who generates what (sequential agents
    that see their teammates' completions of the same sample, one model writing every agent's part,
    a comparator choosing among candidates) returns its own from ``CoMLRLModule.actors``.

    An actor that cannot act under some rollout settings declares it in an optional attribute
    ``rollout_limits: dict[str, tuple[tuple[str, ...], str]]``: rollout field (``joint_mode``,
    ``credit``) -> (the values it supports, why); :func:`refuse_unsupported` reads it (each rollout,
    and a module that builds its actor early, before any model loads). :class:`TurnState` carries both.
    """

    def act(self, state: TurnState) -> TeamAction:
        """Every agent's ``G·K`` completions at ``state`` (row ``g·K + k``: sample k at node g)."""
        ...


def refuse_unsupported(actors: object, joint_mode: str, credit: str) -> None:
    """Refuse a rollout that ``actors`` (an instance or its class) declares it cannot act in
    (:class:`Actors`' ``rollout_limits``; an actor without one acts under any settings).

    Raises:
        ValueError: ``rollout.<field>: got <value>, allowed: [...]; <the actor's reason>``; a
            ``rollout_limits`` key other than ``joint_mode`` and ``credit``.
    """
    limits = getattr(actors, "rollout_limits", None) or {}
    given = {"joint_mode": joint_mode, "credit": credit}
    unknown = sorted(set(limits) - set(given))
    if unknown:  # a limit nobody enforces would be silent
        raise ValueError(
            f"{type(actors).__name__}.rollout_limits: unknown fields {unknown}; allowed: {list(given)}"
        )
    for field, value in given.items():
        if field in limits and value not in limits[field][0]:
            allowed, why = limits[field]
            raise ValueError(f"rollout.{field}: got {value!r}, allowed: {list(allowed)}; {why}")


def independent_action(actor: object, state: TurnState) -> TeamAction:
    """Every agent renders its own history at each node (``actor.render(i, node)``) and samples ``K``
    completions of it (``actor.generate(prompts, K, greedy)``, one batched call per agent): how a
    team of independent agents acts (:meth:`Team.act`; ``act = independent_action`` in a class with
    ``render`` and ``generate`` makes it an :class:`Actors`)."""
    n = len(state.nodes[0].prompts)
    prompts = [[actor.render(i, node) for node in state.nodes] for i in range(n)]
    return TeamAction(prompts, actor.generate(prompts, state.num_generations, state.greedy))


@dataclass(frozen=True)
class RolloutPlan:
    """What one rollout does: the knobs of :class:`RolloutConfig` one call needs, resolved for
    training or evaluation (:meth:`of`)."""

    num_generations: int
    """``K`` samples per agent per node."""
    num_turns: int = 1
    """Maximum turns ``T``."""
    joint_mode: str = "aligned"
    """One of :data:`~comlrl_lightning.core.advantages.JOINT_MODE`."""
    credit: str = "shared"
    """:data:`~comlrl_lightning.core.credit.CREDIT`: other modes also score the extra combinations
    of a node's samples they need (``Turn.scored_rewards``); only the K aligned ones are expanded."""
    greedy: bool = False
    """Decode greedily instead of sampling (evaluation)."""
    stop_reward: float | None = None
    """A joint action whose reward is ``>=`` this ends its branch solved. None: never."""
    termination_threshold: float | None = None
    """CoMLRL's rule: a node whose mean reward is ``>`` this expands no children. None: never."""
    discount: float = 1.0
    """γ of the returns."""
    solved_return: str = "absorbing"
    """:data:`~comlrl_lightning.core.td.SOLVED_RETURN`."""

    @classmethod
    def of(cls, cfg: RolloutConfig, evaluation: bool = False, greedy: bool = False) -> RolloutPlan:
        """Training: ``cfg`` as is; ``evaluation``: one aligned sample per agent per node, ``shared`` credit."""
        return cls(
            num_generations=1 if evaluation else cfg.num_generations,
            num_turns=cfg.num_turns,
            joint_mode="aligned" if evaluation else cfg.joint_mode,
            credit="shared" if evaluation else cfg.credit,
            greedy=greedy,
            stop_reward=cfg.stop_reward,
            termination_threshold=cfg.termination_threshold,
            discount=cfg.discount,
            solved_return=cfg.solved_return,
        )


def rollout_tree(
    env: DecPOMDP, episodes: Sequence[Episode], actors: Actors, plan: RolloutPlan, step: int = -1
) -> list[Turn]:
    """Roll out a batch of episodes as trees, turn by turn (one :meth:`Actors.act` per turn).

    Args:
        env: the Dec-POMDP (observe, reward, transition).
        episodes: ``E`` episodes.
        actors: who generates what (:class:`Actors`; the module's team by default).
        plan: K, turns, joint mode, credit, stopping rules (:class:`RolloutPlan`). With neither
            ``stop_reward`` nor ``termination_threshold`` set, branches run all ``T`` turns unless the
            transition ends them (CoMLRL's default −0.2 would stop every branch after turn 1).
        step: training step, used in reward error messages.

    Returns:
        One :class:`~comlrl_lightning.core.records.Turn` per turn reached.
    """
    num_generations, num_turns, stop_reward = plan.num_generations, plan.num_turns, plan.stop_reward
    refuse_unsupported(actors, plan.joint_mode, plan.credit)
    n = env.num_agents
    shared = plan.credit == "shared"
    if shared:
        joint_index = joint_action_indices(n, num_generations, plan.joint_mode)
    else:
        joint_index = credit_index(n, num_generations, plan.credit).joint_index
    nodes = [Node(ep, 0, [[env.observe(ep, i)] for i in range(n)], [[] for _ in range(n)]) for ep in episodes]
    turns: list[Turn] = []
    for turn in range(num_turns):
        action = actors.act(
            TurnState(turn, nodes, num_generations, plan.joint_mode, plan.greedy, plan.credit)
        )
        acted = [action.texts(i) for i in range(n)]
        g, j = len(nodes), joint_index.shape[0]
        rows = torch.arange(g)[:, None] * num_generations + joint_index.T[:, None, :]  # [N, G, J]
        joint_actions = [[acted[i][rows[i, a, b]] for i in range(n)] for a in range(g) for b in range(j)]
        out = env.reward(
            joint_actions, [nodes[a].episode for a in range(g) for _ in range(j)], turn, step=step
        )
        scored = out.total.view(g, j, *out.total.shape[1:])  # [G, J] or, per agent, [G, J, N]
        j_played = j if shared else num_generations  # the aligned rows come first
        rewards = scored[:, :j_played]
        child = torch.full((g, j_played), -1, dtype=torch.long)
        solved = torch.zeros(scored.shape[:2], dtype=torch.bool)  # [G, J] or, scored, [G, M]
        next_nodes: list[Node] = []
        if turn + 1 < num_turns:
            if stop_reward is not None:  # per-agent rewards: solved when every agent reached it
                solved |= (scored if scored.dim() == 2 else scored.amin(-1)) >= stop_reward
            if plan.termination_threshold is not None:
                solved |= (rewards.flatten(1).mean(1) > plan.termination_threshold)[:, None]
            for a, node in enumerate(nodes):
                for b in range(j_played):
                    if solved[a, b]:
                        continue
                    acts = joint_actions[a * j + b]
                    comps = [node.completions[i] + [acts[i]] for i in range(n)]
                    nxt = env.transition(node.episode, turn, node.prompts, comps)
                    if nxt is SOLVED:
                        solved[a, b] = True
                    if nxt is None or nxt is SOLVED:
                        continue
                    child[a, b] = len(next_nodes)
                    next_nodes.append(
                        Node(node.episode, turn + 1, [node.prompts[i] + [nxt[i]] for i in range(n)], comps)
                    )
        pass_at_1 = None if out.pass_at_1 is None else out.pass_at_1.view(g, j)[:, :j_played]
        components = {k: v.view(g, j, *v.shape[1:])[:, :j_played] for k, v in out.components.items()}
        turns.append(
            Turn(
                turn,
                nodes,
                action.prompts,
                action.generations,
                rewards,
                components,
                child,
                pass_at_1,
                solved=solved[:, :j_played],
                turns_left=num_turns - 1 - turn,
                scored_solved=None if shared else solved,
                scored_rewards=None if shared else scored,
            )
        )
        if not next_nodes:
            break
        nodes = next_nodes
    return turns


def compute_returns(
    turns: list[Turn], discount: float, credit: str = "shared", solved_return: str = "absorbing"
) -> None:
    """Fill ``turn.returns`` bottom-up: ``R = r + discount · mean(child returns)`` (leaf: ``R = r``);
    per agent when the rewards are ``[G, J, N]``; under a credit mode also ``turn.scored_returns``
    (:func:`~comlrl_lightning.core.credit.tree_credit_returns`).

    ``solved_return``: ``"absorbing"``: a joint action that ended its branch solved
    (``turn.solved``) returns ``r · Σ_{s=0}^{turns_left} discount^s``
    (:func:`~comlrl_lightning.core.td.absorbing_rewards`); ``"reward"``: ``R = r`` (CoMLRL).
    """
    SOLVED_RETURN.check(solved_return)
    absorbing = solved_return == "absorbing"
    if credit != "shared":
        scored = tree_credit_returns(
            [t.scored_rewards for t in turns],
            [t.child for t in turns],
            discount,
            credit,
            solved=[t.scored_solved for t in turns] if absorbing else None,
            turns_left=[t.turns_left for t in turns],
        )
        for t, r in zip(turns, scored):
            t.scored_returns = r
    below: torch.Tensor | None = None
    for t in reversed(turns):
        solved = t.solved if absorbing else None
        returns = absorbing_rewards(t.rewards, solved, t.turns_left, discount).to(t.rewards.dtype)
        if below is not None:
            has_child = t.child >= 0
            child_mean = below.mean(1)  # [G_next] (or [G_next, N]): mean over the child's joint actions
            returns[has_child] += discount * child_mean[t.child[has_child]]
        t.returns = returns
        below = returns


def compute_advantages(
    turns: list[Turn],
    plan: RolloutPlan,
    cfg: AdvantageConfig,
    num_agents: int,
    sample_costs: list[list[torch.Tensor]] | None = None,
) -> None:
    """Fill ``turn.agent_returns[i]`` and ``turn.advantages[i]`` (each ``[G·K]``, generation-row order).

    ``agent_returns`` is each sample's return before the baseline (the aligned joint action's under
    ``counterfactual``); the advantages (baseline ``cfg.mode``, scaling ``cfg.scale``, none with one
    sample per node) come from :func:`~comlrl_lightning.core.credit.step_advantages`
    (``sample_costs``: per turn, per agent ``[G, K]``, e.g. ``β·KL`` for ``kl_mode="reward"``).
    """
    num_generations, joint_mode, credit = plan.num_generations, plan.joint_mode, plan.credit
    mode, eps, agent_wise = cfg.mode, cfg.advantage_eps, cfg.agent_wise_normalization
    scale = cfg.scale if num_generations > 1 else "none"
    own = joint_action_indices(num_agents, num_generations, joint_mode)
    assert all(t.returns is not None for t in turns), "compute_returns first"
    index = (
        CreditIndex(own, None) if credit == "shared" else credit_index(num_agents, num_generations, credit)
    )
    returns = [t.returns if credit == "shared" else t.scored_returns for t in turns]
    advantages = step_advantages(
        returns,
        index,
        num_agents,
        credit,
        mode=mode,
        scale=scale,
        agent_wise=agent_wise,
        eps=eps,
        sample_costs=sample_costs,
    )
    for n_t, (t, adv) in enumerate(zip(turns, advantages)):
        t.agent_returns = [
            agent_sample_returns(agent_column(t.returns, i), own, i, num_generations).flatten()
            for i in range(num_agents)
        ]
        if sample_costs is not None:
            t.agent_returns = [r - c.flatten() for r, c in zip(t.agent_returns, sample_costs[n_t])]
        t.advantages = [a.flatten() for a in adv]
