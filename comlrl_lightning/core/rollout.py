"""Tree rollouts over turns (MAGRPO, Liu et al. 2025, arXiv 2508.04652, Alg. 1; CoMLRL ``magrpo.py``).

At every *node* (an episode at a turn, with each agent's history) every agent samples ``K``
completions in one batched call for all nodes of the turn. The node's joint actions are ``K``
(``aligned``) or ``K^N`` (``cross``). Each joint action gets the shared reward; unless the episode
ends there, the transition writes every agent's next prompt and the joint action becomes the parent
of a child node. Returns are computed bottom-up:

    R_t(j) = r_t(j) + discount · mean_{j'} R_{t+1}(j')      (children j' of joint action j)

A leaf's return is its reward. Advantages are grouped per node and agent (the K siblings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from comlrl_lightning.core.advantages import agent_sample_returns, group_advantages, joint_action_indices
from comlrl_lightning.envs.base import DecPOMDP, Episode
from comlrl_lightning.core.generation import Generation

GenerateFn = Callable[[Sequence[Sequence[str]]], list[Generation]]
"""Given, per agent, the prompt texts of all nodes of a turn, returns one Generation per agent."""


@dataclass
class Node:
    """An episode at a turn, with every agent's history.

    Attributes:
        episode: the episode.
        turn: 0-based turn.
        prompts: ``prompts[i]``: agent i's prompts for turns ``0..turn``.
        completions: ``completions[i]``: agent i's completions for turns ``0..turn-1``.
    """

    episode: Episode
    turn: int
    prompts: list[list[str]]
    completions: list[list[str]]


@dataclass
class Level:
    """All nodes of one turn and what happened there (``G`` nodes, ``J`` joint actions per node).

    Attributes:
        prompt_texts: per agent, the rendered prompt of each node (history and chat template).
        generations: per agent, a Generation whose row ``g·K + k`` is sample k at node g.
        rewards: ``[G, J]`` shared rewards, or ``[G, J, N]`` when the reward is per agent.
        components: reward-function name -> ``[G, J]`` (or ``[G, J, N]``) raw values.
        child: ``[G, J]`` index of the child node in the next level, −1 where the branch ended.
        returns: ``[G, J]`` (or ``[G, J, N]``) returns (filled by :func:`compute_returns`).
    """

    turn: int
    nodes: list[Node]
    prompt_texts: list[list[str]]
    generations: list[Generation]
    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    child: torch.Tensor
    returns: torch.Tensor | None = None
    agent_returns: list[torch.Tensor] = field(default_factory=list)
    advantages: list[torch.Tensor] = field(default_factory=list)


def generations_per_episode(num_agents: int, num_generations: int, num_turns: int, joint_mode: str) -> int:
    """Upper bound on completions generated per episode by a full tree.

    A node has ``J = K`` (aligned) or ``K^N`` (cross) children; turn t has ``J^t`` nodes; each node
    costs ``N·K`` completions: total ``N·K·Σ_{t<T} J^t``.
    """
    j = num_generations if joint_mode == "aligned" else num_generations**num_agents
    return num_agents * num_generations * sum(j**t for t in range(num_turns))


def rollout_tree(
    env: DecPOMDP,
    episodes: Sequence[Episode],
    generate_fn: GenerateFn,
    render_fn: Callable[[int, Node], str],
    num_generations: int,
    num_turns: int,
    joint_mode: str,
    termination_threshold: float | None = None,
    step: int = -1,
) -> list[Level]:
    """Roll out a batch of episodes as trees, level by level (one generate per agent per turn).

    Args:
        env: the Dec-POMDP (observe, reward, transition).
        episodes: ``E`` episodes.
        generate_fn: see :data:`GenerateFn`.
        render_fn: ``(agent, node) -> prompt text`` (history + chat template).
        num_generations: ``K`` samples per agent per node.
        num_turns: maximum turns ``T``.
        joint_mode: ``"aligned"`` or ``"cross"``.
        termination_threshold: a joint action whose reward is ``>=`` this ends its branch (the team
            solved the task; no revision turn). ``None``: branches run all ``T`` turns unless the
            transition ends them. Unlike CoMLRL's default (−0.2 on the node mean, which with
            non-negative rewards stops every branch after turn 1) nothing stops early by default.
        step: training step, used in reward error messages.

    Returns:
        One :class:`Level` per turn reached.
    """
    n = env.num_agents
    joint_index = joint_action_indices(n, num_generations, joint_mode)
    nodes = [Node(ep, 0, [[env.observe(ep, i)] for i in range(n)], [[] for _ in range(n)]) for ep in episodes]
    levels: list[Level] = []
    for turn in range(num_turns):
        texts = [[render_fn(i, node) for node in nodes] for i in range(n)]
        gens = generate_fn(texts)
        g, j = len(nodes), joint_index.shape[0]
        rows = torch.arange(g)[:, None] * num_generations + joint_index.T[:, None, :]  # [N, G, J]
        joint_actions = [[gens[i].texts[rows[i, a, b]] for i in range(n)] for a in range(g) for b in range(j)]
        out = env.reward(joint_actions, [nodes[a].episode for a in range(g) for _ in range(j)], turn, step=step)
        rewards = out.total.view(g, j, *out.total.shape[1:])
        child = torch.full((g, j), -1, dtype=torch.long)
        next_nodes: list[Node] = []
        if turn + 1 < num_turns:
            for a, node in enumerate(nodes):
                for b in range(j):
                    # per-agent rewards: the branch ends when every agent reached the threshold
                    if termination_threshold is not None and rewards[a, b].min() >= termination_threshold:
                        continue
                    acts = joint_actions[a * j + b]
                    comps = [node.completions[i] + [acts[i]] for i in range(n)]
                    nxt = env.transition(node.episode, turn, node.prompts, comps)
                    if nxt is None:
                        continue
                    child[a, b] = len(next_nodes)
                    next_nodes.append(Node(node.episode, turn + 1, [node.prompts[i] + [nxt[i]] for i in range(n)], comps))
        levels.append(Level(turn, nodes, texts, gens, rewards, {k: v.view(g, j, *v.shape[1:]) for k, v in out.components.items()}, child))
        if not next_nodes:
            break
        nodes = next_nodes
    return levels


def compute_returns(levels: list[Level], discount: float) -> None:
    """Fill ``level.returns`` bottom-up: ``R = r + discount · mean(child returns)`` (leaf: ``R = r``);
    per agent when the rewards are ``[G, J, N]``."""
    below: torch.Tensor | None = None
    for level in reversed(levels):
        returns = level.rewards.clone()
        if below is not None:
            has_child = level.child >= 0
            child_mean = below.mean(1)  # [G_next] (or [G_next, N]): mean over the child's joint actions
            returns[has_child] += discount * child_mean[level.child[has_child]]
        level.returns = returns
        below = returns


def compute_advantages(
    levels: list[Level], num_agents: int, num_generations: int, joint_mode: str, mode: str, scale: str, eps: float
) -> None:
    """Fill ``level.agent_returns[i]`` and ``level.advantages[i]`` (each ``[G·K]``, generation-row order);
    with per-agent returns ``[G, J, N]`` agent i's group baseline uses its own column."""
    joint_index = joint_action_indices(num_agents, num_generations, joint_mode)
    for level in levels:
        assert level.returns is not None, "compute_returns first"
        level.agent_returns, level.advantages = [], []
        for i in range(num_agents):
            joint = level.returns[..., i] if level.returns.dim() == 3 else level.returns
            r = agent_sample_returns(joint, joint_index, i, num_generations)  # [G, K]
            level.agent_returns.append(r.flatten())
            level.advantages.append(group_advantages(r, mode, scale, eps).flatten())
