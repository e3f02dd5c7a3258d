"""One coordinator round: route prompts to learners, collect K responses each, score the joint
responses with one shared reward, and hand each learner its own experience.

A round is a sequence of :class:`Stage` s. Stage ``s`` routes a prompt to one learner; the prompt is
built from the episode's row and the responses of the earlier stages of the same joint response
(e.g. a reviser sees the proposer's draft). A *joint response* is one response per stage; the
shared reward scores each joint response once (``reward(joint_responses, episodes, turn=0)``, the
:class:`~comlrl_lightning.envs.rewards.RewardFunction` contract with stages in place of agents).

Joint responses (``G`` episodes, ``K_s`` samples at stage ``s``):
    - ``aligned`` (default): ``J = K`` per episode. Stage 0 samples K responses of one prompt;
      stage ``s > 0`` answers each of the K partial joint responses once, so joint response ``j``
      is the ``j``-th sample of every stage. All stages need the same K.
    - ``cross``: every partial joint response gets ``K_s`` answers, so ``J = Π_s K_s`` per episode
      (a tree). A response's return is the mean reward of the joint responses it is part of
      (the mean, as :func:`~comlrl_lightning.core.advantages.agent_sample_returns`).

Group baselines: a stage's K sibling responses form a group: in ``aligned`` mode the K responses
of one episode (for ``s > 0`` their prompts differ by the earlier responses, so the baseline is
the episode's mean over the joint policy), in ``cross`` mode the K answers to one partial joint
response (same prompt). Each learner's own ``advantage_mode`` / ``scale_advantages`` apply.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from comlrl_lightning.core.advantages import JOINT_MODE
from comlrl_lightning.core.generation import Generation
from comlrl_lightning.envs.base import Episode
from comlrl_lightning.envs.rewards import WeightedReward


class EpisodeSource(ABC):
    """Where a coordinator's episodes come from (a class, so YAML can name one by ``class_path``)."""

    @abstractmethod
    def episodes(self) -> list[Episode]:
        """The training episodes, in a fixed order (the coordinator shuffles them per epoch)."""


class RowEpisodes(EpisodeSource):
    """Episodes from a list of rows (dicts), e.g. inline in YAML or in tests."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            raise ValueError("episodes.rows: give at least one row")
        self.rows = rows

    def episodes(self) -> list[Episode]:
        return [Episode(i, dict(r)) for i, r in enumerate(self.rows)]


JointMode = JOINT_MODE.literal
"""The rollout's ``joint_mode`` choice (``core/advantages.py``), also for a coordinator's rounds."""


@runtime_checkable
class StageFormatter(Protocol):
    """``fn(row, responses) -> prompt``: ``responses`` maps each earlier stage's learner name to its response.

    (A protocol rather than a ``Callable`` alias so that YAML can name a formatter class by ``class_path``.)
    """

    def __call__(self, row: dict[str, Any], responses: Mapping[str, str]) -> str: ...


@dataclass
class Stage:
    """One routing step of a round: which learner answers, and its prompt.

    Attributes:
        learner: the name of the learner that answers.
        prompt: a ``str.format`` template over the row's fields and the earlier stages' responses
            (each under its learner's name, e.g. ``"{prompt}\\n\\nDraft:\\n{proposer}"``), or a
            :data:`StageFormatter`.
    """

    learner: str
    prompt: str | StageFormatter

    def format(self, row: dict[str, Any], responses: Mapping[str, str]) -> str:
        """The prompt text for ``row`` after the earlier ``responses``.

        Raises:
            KeyError: the template uses a field that neither the row nor an earlier stage has.
        """
        if callable(self.prompt):
            return self.prompt(row, responses)
        fields = {**row, **responses}
        try:
            return self.prompt.format(**fields)
        except KeyError as err:
            raise KeyError(
                f"stage of learner {self.learner!r}: the prompt uses {{{err.args[0]}}}; available: "
                f"{sorted(fields)} (row fields and earlier stages' learner names)"
            ) from None


class Player(Protocol):
    """What a round needs from a learner (see :class:`~comlrl_lightning.coordinator.learner.Learner`)."""

    num_generations: int

    def render(self, prompt: str) -> str:
        """The prompt text as the model sees it (chat template applied when the learner uses one)."""
        ...

    def generate(self, rendered: Sequence[str], k: int) -> Generation:
        """``k`` sampled responses to each of ``B`` rendered prompts (row ``b·k + i``)."""
        ...

    def advantages(self, returns: torch.Tensor) -> torch.Tensor:
        """``[groups, K]`` returns -> ``[groups, K]`` advantages (the learner's own baseline)."""
        ...


@dataclass
class Experience:
    """What one learner did at one stage of one round: everything its update needs.

    Attributes:
        learner: the learner's name.
        round: the round it was collected at.
        stage: the stage index.
        prompt_texts: ``[R]`` rendered prompts, one per response row.
        generation: ``R = groups·K`` rows (row ``g·K + k`` is sample k of group g).
        returns: ``[groups, K]`` returns of the responses (the shared rewards they earned).
        advantages: ``[R]`` advantages in row order.
        episode_indices: ``[R]`` the episode each row belongs to.
    """

    learner: str
    round: int
    stage: int
    prompt_texts: list[str]
    generation: Generation
    returns: torch.Tensor
    advantages: torch.Tensor
    episode_indices: list[int]


@dataclass
class RoundOutput:
    """The result of one round (``J`` joint responses in all).

    Attributes:
        round: the round index.
        rewards: ``[J]`` shared rewards.
        components: reward-function name -> ``[J]`` raw values (``rewards/<name>/mean`` in logs).
        joint_responses: ``J`` lists of one response per stage.
        episode_indices: ``[J]`` the episode of each joint response.
        experiences: learner name -> its experiences of this round (one per stage it answered).
        trained: the learners that updated at this round (filled by the coordinator).
        learner_stats: learner name -> its update stats (filled by the coordinator).
        seconds: wall-clock seconds of the round (filled by the coordinator).
        pass_at_1: ``[J]`` 1.0 where the joint response solved the task (the reward's ``PASS_AT_1``
            metric), None when the reward reports none.
    """

    round: int
    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    joint_responses: list[list[str]]
    episode_indices: list[int]
    experiences: dict[str, list[Experience]]
    trained: list[str] = field(default_factory=list)
    learner_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    pass_at_1: torch.Tensor | None = None


def check_stages(stages: Sequence[Stage], players: Mapping[str, Player], joint_mode: str) -> None:
    """Raise ``ValueError`` for a stage naming an unknown learner, a learner in no stage, or
    different ``num_generations`` across stages in ``aligned`` mode."""
    if not stages:
        raise ValueError("rounds.stages: give at least one stage")
    JOINT_MODE.check(joint_mode)
    for s, st in enumerate(stages):
        if st.learner not in players:
            raise ValueError(
                f"rounds.stages[{s}].learner: got {st.learner!r}, the learners are {list(players)}"
            )
    idle = [x for x in players if all(st.learner != x for st in stages)]
    if idle:
        raise ValueError(
            f"learners {idle} answer in no stage of rounds.stages; route a stage to each learner"
        )
    ks = {st.learner: players[st.learner].num_generations for st in stages}
    if joint_mode == "aligned" and len(set(ks.values())) > 1:
        raise ValueError(
            f"num_generations: joint_mode='aligned' pairs the j-th responses of every stage, so every "
            f"learner needs the same K; got {ks} (use joint_mode='cross' for different K)"
        )


def check_stage_fields(stages: Sequence[Stage], episodes: Sequence[Episode]) -> None:
    """Every template stage's fields exist for every episode (row fields, or an earlier stage's
    learner name), so a row that lacks one fails before any learner loads, not in the round that
    first draws it.

    Raises:
        ValueError: naming the stage, the field and the first episode without it.
    """
    import string

    for s, st in enumerate(stages):
        if callable(st.prompt):
            continue
        earlier = {x.learner for x in stages[:s]}
        fields = {
            name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(st.prompt) if name
        }
        for ep in episodes:
            missing = sorted(f for f in fields - earlier if ep.data.get(f) is None)
            if missing:
                raise ValueError(
                    f"rounds.stages[{s}].prompt: uses {{{missing[0]}}}, which episode {ep.index} (row "
                    f"fields {sorted(ep.data)}) lacks and no earlier stage answers; fill or drop such "
                    "rows"
                )


def play_round(
    round: int,
    stages: Sequence[Stage],
    episodes: Sequence[Episode],
    players: Mapping[str, Player],
    reward: WeightedReward,
    joint_mode: JointMode = "aligned",
) -> RoundOutput:
    """Play one round over ``G = len(episodes)`` episodes (see the module docstring).

    Returns:
        A :class:`RoundOutput` with ``J = G·K`` (aligned) or ``G·Π K_s`` (cross) joint responses,
        in episode-major order (cross: stage 0's sample index varies slowest).

    Raises:
        RewardError: from the reward (named, with the round as its step).
    """
    check_stages(stages, players, joint_mode)
    joint_mode = JOINT_MODE.canonical(joint_mode)
    # A partial joint response: (episode position, the responses so far by learner name).
    prefixes: list[tuple[int, dict[str, str]]] = [(g, {}) for g in range(len(episodes))]
    stage_rows: list[tuple[str, list[str], Generation, int]] = []  # learner, prompts, generation, K
    for st in stages:
        player = players[st.learner]
        k = player.num_generations
        texts = [player.render(st.format(episodes[g].data, resp)) for g, resp in prefixes]
        if joint_mode == "aligned" and stage_rows:
            gen = player.generate(texts, 1)  # one answer per partial joint response
            prompts = texts
            prefixes = [(g, {**resp, st.learner: gen.texts[p]}) for p, (g, resp) in enumerate(prefixes)]
        else:
            gen = player.generate(texts, k)
            prompts = [t for t in texts for _ in range(k)]
            prefixes = [
                (g, {**resp, st.learner: gen.texts[p * k + i]})
                for p, (g, resp) in enumerate(prefixes)
                for i in range(k)
            ]
        stage_rows.append((st.learner, prompts, gen, k))
    joint = _joint_texts(stage_rows, len(episodes), joint_mode)
    ep_of_joint = [g for g, _ in prefixes]
    out = reward(joint, [episodes[g] for g in ep_of_joint], 0, step=round)
    rewards = out.total
    experiences: dict[str, list[Experience]] = {name: [] for name in players}
    for s, (name, prompts, gen, _) in enumerate(stage_rows):
        returns = _stage_returns(rewards, [r[3] for r in stage_rows], s, len(episodes), joint_mode)
        adv = players[name].advantages(returns).flatten()
        rows_per_ep = returns.numel() // len(episodes)
        experiences[name].append(
            Experience(
                learner=name,
                round=round,
                stage=s,
                prompt_texts=prompts,
                generation=gen,
                returns=returns,
                advantages=adv,
                episode_indices=[episodes[r // rows_per_ep].index for r in range(returns.numel())],
            )
        )
    return RoundOutput(
        round,
        rewards,
        dict(out.components),
        joint,
        [episodes[g].index for g in ep_of_joint],
        experiences,
        pass_at_1=out.pass_at_1,
    )


def _joint_texts(
    stage_rows: list[tuple[str, list[str], Generation, int]], num_episodes: int, joint_mode: str
) -> list[list[str]]:
    """One response per stage for every joint response (episode-major order)."""
    if joint_mode == "aligned":
        return [list(texts) for texts in zip(*(gen.texts for _, _, gen, _ in stage_rows))]
    ks = [k for *_, k in stage_rows]
    out = []
    for j in range(num_episodes * math.prod(ks)):
        # stage s's row of joint response j: j with the trailing stages' sample indices dropped
        out.append([gen.texts[j // math.prod(ks[s + 1 :])] for s, (_, _, gen, _) in enumerate(stage_rows)])
    return out


def _stage_returns(
    rewards: torch.Tensor, ks: list[int], stage: int, num_episodes: int, joint_mode: str
) -> torch.Tensor:
    """``[groups, K_s]`` returns of stage ``stage``'s responses from the ``[J]`` shared rewards."""
    if joint_mode == "aligned":
        return rewards.view(num_episodes, ks[0]).clone()
    tree = rewards.view(num_episodes, *ks)
    per_response = tree.mean(dim=tuple(range(stage + 2, len(ks) + 1))) if stage + 1 < len(ks) else tree
    return per_response.reshape(-1, ks[stage]).clone()
