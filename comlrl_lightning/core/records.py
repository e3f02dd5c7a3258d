"""The records one step passes on: a rollout :class:`Node`, a :class:`Turn` (every node of one turn),
an agent's :class:`AgentStats`, and the step's :class:`StepOutput`.

Shapes: ``E`` episodes, ``N`` agents, ``K`` samples per agent per node, ``G`` nodes of a turn,
``J`` joint actions per node (``K`` aligned, ``K^N`` cross), ``S`` the joint actions of all turns
(``Σ_t G_t·J``), ``C_i`` agent i's completions of all turns (``Σ_t G_t·K``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from comlrl_lightning.core.engine_correction import LogprobGap
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.envs.base import Episode


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
class TurnState:
    """The episode state a team acts in at one turn of a rollout (what :meth:`Actors.act` receives).

    Attributes:
        turn: 0-based turn.
        nodes: the ``G`` nodes: each episode with every agent's prompts and completions so far.
        num_generations: ``K`` samples per agent per node.
        joint_mode: how the rollout joins the samples (``aligned``: row ``g·K + k`` of every agent
            forms joint action k of node g, so an actor may condition agent i's row on its teammates'
            rows of the same sample; ``cross``: every combination, so it may not).
        greedy: decode greedily (evaluation).
        credit: the rollout's credit mode (:data:`~comlrl_lightning.core.credit.CREDIT`): modes other
            than ``shared`` also score combinations of the agents' separate samples of a node.
    """

    turn: int
    nodes: list[Node]
    num_generations: int
    joint_mode: str = "aligned"
    greedy: bool = False
    credit: str = "shared"


@dataclass
class TeamAction:
    """What a team did at one turn: per agent, ``G·K`` completion rows (row ``g·K + k`` is sample k at
    node g) and the texts they conditioned on.

    Attributes:
        prompts: per agent, the rendered prompt of each node (``[G]``), or of each row (``[G·K]``)
            when an agent's samples conditioned on different texts (e.g. on teammates' completions).
        generations: the Generations the loss trains on (token ids, masks, texts), one per trained
            policy: one per agent for a team of independent agents; a centralised actor (one model
            writing every agent's part in one tagged completion) gives its one model's.
        completions: per agent (the env's roles), the ``G·K`` texts the env sees as that agent's
            action; None: each agent's generation's ``texts``. A centralised actor gives the parsed
            parts here.
    """

    prompts: list[list[str]]
    generations: list[Generation]
    completions: list[list[str]] | None = None

    def texts(self, agent: int) -> list[str]:
        """Agent ``agent``'s ``G·K`` action texts."""
        return self.generations[agent].texts if self.completions is None else self.completions[agent]


@dataclass
class Turn:
    """All nodes of one turn and what happened there (``G`` nodes, ``J`` joint actions per node).

    Attributes:
        turn: 0-based turn.
        nodes: the ``G`` nodes.
        prompt_texts: per agent, the rendered prompt of each node (history and chat template), or of
            each row when the actors conditioned rows differently (:attr:`TeamAction.prompts`).
        generations: per agent, a Generation whose row ``g·K + k`` is sample k at node g.
        rewards: ``[G, J]`` shared rewards, or ``[G, J, N]`` when the reward is per agent.
        components: reward-function (or metric) name -> ``[G, J]`` raw values.
        child: ``[G, J]`` index of the child node in the next turn, −1 where the branch ended.
        pass_at_1: ``[G, J]`` 1.0 where the joint action solved the task (None: no reward reports it).
        solved: ``[G, J]`` bool, True where the joint action ended its branch solved before the last
            turn (``stop_reward``, ``termination_threshold`` or a transition's ``SOLVED``): its return
            is an absorbing solved state's (:func:`~comlrl_lightning.core.td.absorbing_rewards`).
            None: no branch did.
        turns_left: turns after this one up to ``num_turns`` (what a solved state is paid for).
        scored_solved: ``[G, M]`` bool, the same for every scored joint action under a credit mode.
        scored_rewards: ``[G, M]`` under a credit mode: rewards of every joint action the mode scores
            (rows of ``credit.credit_index``; the first ``J = K`` are ``rewards``). None otherwise.
        scored_returns: ``[G, M]`` their returns (``credit.tree_credit_returns``). None otherwise.
        returns: ``[G, J]`` returns (filled by :func:`~comlrl_lightning.core.rollout.compute_returns`).
        agent_returns: per agent ``[G·K]`` return of each sample (generation-row order).
        advantages: per agent ``[G·K]`` advantage of each sample (generation-row order).
    """

    turn: int
    nodes: list[Node]
    prompt_texts: list[list[str]]
    generations: list[Generation]
    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    child: torch.Tensor
    pass_at_1: torch.Tensor | None = None
    solved: torch.Tensor | None = None
    turns_left: int = 0
    scored_solved: torch.Tensor | None = None
    scored_rewards: torch.Tensor | None = None
    scored_returns: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    agent_returns: list[torch.Tensor] = field(default_factory=list)
    advantages: list[torch.Tensor] = field(default_factory=list)


@dataclass
class AgentStats:
    """What one agent's update reports (the last of its ``num_iterations`` passes).

    Attributes:
        loss: the loss summed over micro-batches (its aggregation is ``loss_type``).
        kl: k3 KL to the reference model, token mean (0 when ``beta == 0``).
        clip_ratio: fraction of completion tokens whose ratio was clipped (0 when on-policy).
        clip_ratio_low: fraction clipped below (``ρ < 1 − ε``, ``A < 0``; TRL's ``clip_ratio/low_*``).
        clip_ratio_high: fraction clipped above (``ρ > 1 + ε_high``, ``A > 0``; ``clip_ratio/high_*``).
        grad_norm: total gradient norm before clipping.
        entropy: mean policy entropy over the loss's completion tokens (nats; TRL's ``entropy``).
        engine_gap: ``|log π_trainer − log π_engine|`` over the completion tokens when an inference
            engine sampled them (``generation_backend="vllm"``); None otherwise.
    """

    loss: float = 0.0
    kl: float = 0.0
    clip_ratio: float = 0.0
    clip_ratio_low: float = 0.0
    clip_ratio_high: float = 0.0
    grad_norm: float = 0.0
    entropy: float = 0.0
    engine_gap: LogprobGap | None = None

    def __getitem__(self, key: str) -> float:  # stats["loss"]: the spelling callbacks used before
        return getattr(self, key)


@dataclass
class StepOutput(Mapping):
    """The one contract between a training step and its readers (callbacks, benchmarks, tests).

    Returned by ``training_step``; Lightning hands it to ``on_train_batch_end`` as ``outputs``. Fields
    read as attributes (``out.rewards``) or, for Lightning's sake, as keys (``out["rewards"]``).

    Attributes:
        loss: ``[]`` sum of the agents' losses (detached).
        rewards: ``[S]`` shared reward of every joint action of every turn.
        reward_std: ``[]`` mean over nodes of the std of a node's rewards.
        frac_reward_zero_std: ``[]`` fraction of nodes whose rewards are all equal (zero advantage).
        reward_components: name -> ``[S]`` each reward function's (or metric's) raw values.
        turn_rewards: per turn ``[G_t·J]`` rewards.
        turn_returns: per turn ``[G_t·J]`` returns.
        completion_lengths: per agent ``[C_i]`` completion lengths in tokens (EOS included).
        clipped: per agent ``[C_i]`` True where a completion hit ``max_new_tokens``.
        agent_stats: per agent its :class:`AgentStats`.
        num_episodes: ``E``.
        num_tokens: completion tokens generated by all agents.
        prompts: per agent the ``E`` rendered turn-0 prompts.
        user_prompts: per agent the ``E`` turn-0 prompts as the formatter wrote them (the user's turn).
        completions: per agent the ``E·K`` turn-0 completions (row ``e·K + k``).
        turn0_rewards: ``[E, J]`` turn-0 rewards.
        num_generations: ``K``.
        rollout_time_s: seconds spent in the rollout (generation and reward).
        step_time_s: seconds for the whole step.
    """

    loss: torch.Tensor
    rewards: torch.Tensor
    reward_std: torch.Tensor
    frac_reward_zero_std: torch.Tensor
    reward_components: dict[str, torch.Tensor]
    turn_rewards: list[torch.Tensor]
    turn_returns: list[torch.Tensor]
    completion_lengths: list[torch.Tensor]
    clipped: list[torch.Tensor]
    agent_stats: list[AgentStats]
    num_episodes: int
    num_tokens: int
    prompts: list[list[str]]
    completions: list[list[str]]
    turn0_rewards: torch.Tensor
    num_generations: int
    rollout_time_s: float = 0.0
    step_time_s: float = 0.0
    user_prompts: list[list[str]] = field(default_factory=list)

    @classmethod
    def from_turns(cls, turns: list[Turn], agent_stats: list[AgentStats], num_generations: int) -> StepOutput:
        """Collect a step's output from its rolled-out ``turns`` (returns filled) and agent stats."""
        num_agents = len(turns[0].generations)
        rewards = torch.cat([t.rewards.flatten() for t in turns])
        # std over each node's joint actions (per agent when rewards are [G, J, N])
        node_std = torch.cat(
            [
                t.rewards.std(1).flatten() if t.rewards.shape[1] > 1 else torch.zeros(t.rewards[:, 0].numel())
                for t in turns
            ]
        )
        components: dict[str, list[torch.Tensor]] = {}
        for t in turns:
            for name, v in t.components.items():
                components.setdefault(name, []).append(v.flatten())
        first = turns[0]
        gens = [[t.generations[i] for t in turns] for i in range(num_agents)]
        return cls(
            loss=torch.tensor(sum(s.loss for s in agent_stats)),
            rewards=rewards,
            reward_std=node_std.mean(),
            frac_reward_zero_std=(node_std == 0).float().mean(),
            reward_components={k: torch.cat(v) for k, v in components.items()},
            turn_rewards=[t.rewards.flatten() for t in turns],
            turn_returns=[t.returns.flatten() for t in turns if t.returns is not None],
            completion_lengths=[torch.cat([g.lengths for g in agent]) for agent in gens],
            clipped=[torch.cat([g.clipped for g in agent]) for agent in gens],
            agent_stats=agent_stats,
            num_episodes=len(first.nodes),
            num_tokens=int(sum(int(g.completion_mask.sum()) for agent in gens for g in agent)),
            prompts=first.prompt_texts,
            user_prompts=[[node.prompts[i][-1] for node in first.nodes] for i in range(num_agents)],
            completions=[first.generations[i].texts for i in range(num_agents)],
            turn0_rewards=first.rewards if first.rewards.dim() == 2 else first.rewards.mean(-1),  # team mean
            num_generations=num_generations,
        )

    # Mapping protocol: Lightning's manual loop copies a returned mapping and detaches its "loss"
    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self._names():
            raise KeyError(f"StepOutput has no field {key!r}")
        setattr(self, key, value)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def copy(self) -> StepOutput:
        """A shallow copy (what Lightning's manual loop asks of a returned mapping)."""
        return dataclasses.replace(self)

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))
