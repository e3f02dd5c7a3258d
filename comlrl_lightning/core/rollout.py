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
from typing import Protocol

import torch

from comlrl_lightning.core.advantages import agent_sample_returns, group_advantages, joint_action_indices
from comlrl_lightning.core.config import SolvedReturn
from comlrl_lightning.core.credit import CreditIndex, credit_index, step_advantages, tree_credit_returns
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.core.records import Node, Turn
from comlrl_lightning.core.td import absorbing_rewards
from comlrl_lightning.envs.base import SOLVED, DecPOMDP, Episode


class Actors(Protocol):
    """What the rollout needs from the team (:class:`comlrl_lightning.team.team.Team` is one)."""

    def render(self, agent: int, node: Node) -> str:
        """The prompt text of ``agent`` at ``node`` (history and chat template)."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[str]], num_generations: int, greedy: bool = False
    ) -> list[Generation]:
        """Per agent, ``num_generations`` completions of each of its prompts (one Generation per agent)."""
        ...


def rollout_tree(
    env: DecPOMDP,
    episodes: Sequence[Episode],
    team: Actors,
    num_generations: int,
    num_turns: int,
    joint_mode: str,
    greedy: bool = False,
    stop_reward: float | None = None,
    termination_threshold: float | None = None,
    step: int = -1,
    credit: str = "shared",
) -> list[Turn]:
    """Roll out a batch of episodes as trees, turn by turn (one generate per agent per turn).

    Args:
        env: the Dec-POMDP (observe, reward, transition).
        episodes: ``E`` episodes.
        team: renders each agent's prompt and generates (see :class:`Actors`).
        num_generations: ``K`` samples per agent per node.
        num_turns: maximum turns ``T``.
        joint_mode: ``"aligned"`` or ``"cross"``.
        greedy: decode greedily instead of sampling (evaluation).
        stop_reward: a joint action whose reward is ``>=`` this ends its branch (the team solved the
            task; no revision turn). ``None``: never.
        termination_threshold: CoMLRL's rule: a node whose mean reward is ``>`` this expands no
            children. ``None``: never. With neither set, branches run all ``T`` turns unless the
            transition ends them (CoMLRL's default −0.2 would stop every branch after turn 1).
        step: training step, used in reward error messages.
        credit: ``shared``, or a :mod:`~comlrl_lightning.core.credit` mode (aligned only): the reward
            also scores the extra combinations of the node's samples that mode needs (in
            ``Turn.scored_rewards``); only the K aligned joint actions are expanded and kept in
            ``Turn.rewards``.

    Returns:
        One :class:`~comlrl_lightning.core.records.Turn` per turn reached.
    """
    n = env.num_agents
    shared = credit == "shared"
    joint_index = joint_action_indices(n, num_generations, joint_mode) if shared else credit_index(
        n, num_generations, credit).joint_index  # fmt: skip
    nodes = [Node(ep, 0, [[env.observe(ep, i)] for i in range(n)], [[] for _ in range(n)]) for ep in episodes]
    turns: list[Turn] = []
    for turn in range(num_turns):
        texts = [[team.render(i, node) for node in nodes] for i in range(n)]
        gens = team.generate(texts, num_generations, greedy)
        g, j = len(nodes), joint_index.shape[0]
        rows = torch.arange(g)[:, None] * num_generations + joint_index.T[:, None, :]  # [N, G, J]
        joint_actions = [[gens[i].texts[rows[i, a, b]] for i in range(n)] for a in range(g) for b in range(j)]
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
            if termination_threshold is not None:
                solved |= (rewards.flatten(1).mean(1) > termination_threshold)[:, None]
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
        turns.append(Turn(turn, nodes, texts, gens, rewards, components, child, pass_at_1,
                          solved=solved[:, :j_played], turns_left=num_turns - 1 - turn,
                          scored_solved=None if shared else solved,
                          scored_rewards=None if shared else scored))  # fmt: skip
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
    if solved_return not in SolvedReturn.__args__:
        raise ValueError(f"solved_return: got {solved_return!r}, allowed: {list(SolvedReturn.__args__)}")
    absorbing = solved_return == "absorbing"
    if credit != "shared":
        scored = tree_credit_returns([t.scored_rewards for t in turns], [t.child for t in turns], discount, credit,
                                     solved=[t.scored_solved for t in turns] if absorbing else None,
                                     turns_left=[t.turns_left for t in turns])  # fmt: skip
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
    num_agents: int,
    num_generations: int,
    joint_mode: str,
    mode: str,
    scale: str,
    eps: float,
    credit: str = "shared",
    agent_wise: bool = True,
    sample_costs: list[list[torch.Tensor]] | None = None,
) -> None:
    """Fill ``turn.agent_returns[i]`` and ``turn.advantages[i]`` (each ``[G·K]``, generation-row order).

    ``agent_returns`` is each sample's return before the baseline (the aligned joint action's under
    ``counterfactual``); the advantages come from :func:`~comlrl_lightning.core.credit.step_advantages`
    (``sample_costs``: per turn, per agent ``[G, K]``, e.g. ``β·KL`` for ``kl_mode="reward"``).
    """
    own = joint_action_indices(num_agents, num_generations, joint_mode)
    if credit == "shared" and turns[0].returns is not None and turns[0].returns.dim() == 3:
        # per-agent rewards [G, J, N]: agent i's group baseline uses its own column
        for t in turns:
            t.agent_returns, t.advantages = [], []
            for i in range(num_agents):
                r = agent_sample_returns(t.returns[..., i], own, i, num_generations)  # [G, K]
                t.agent_returns.append(r.flatten())
                t.advantages.append(group_advantages(r, mode, scale, eps).flatten())
        return
    index = (
        CreditIndex(own, None) if credit == "shared" else credit_index(num_agents, num_generations, credit)
    )
    assert all(t.returns is not None for t in turns), "compute_returns first"
    returns = [t.returns if credit == "shared" else t.scored_returns for t in turns]
    advantages = step_advantages(
        returns, index, num_agents, credit, mode, scale, agent_wise, eps, sample_costs
    )
    for n_t, (t, adv) in enumerate(zip(turns, advantages)):
        t.agent_returns = [
            agent_sample_returns(t.returns, own, i, num_generations).flatten() for i in range(num_agents)
        ]
        if sample_costs is not None:
            t.agent_returns = [r - c.flatten() for r, c in zip(t.agent_returns, sample_costs[n_t])]
        t.advantages = [a.flatten() for a in adv]
