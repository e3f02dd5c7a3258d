"""The Dec-POMDP protocol: episodes, observations (per-agent prompts), shared reward, transitions.

An :class:`Episode` is one dataset row. At turn 0 every agent observes its own prompt, made by its
formatter from the row. The team's joint action (one completion per agent) gets one shared reward.
With ``num_turns > 1`` a :class:`Transition` reads the histories and writes each agent's next prompt.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from comlrl_lightning.envs.episode import Episode as Episode
from comlrl_lightning.envs.rewards import RewardFunction, RewardOutput, WeightedReward, as_weighted_reward

Formatter = Callable[[dict[str, Any]], str]
"""Maps a dataset row to one agent's turn-0 prompt text (before any chat template)."""


class PromptTemplate:
    """A formatter from a ``str.format`` template over the row's fields.

    Example: ``PromptTemplate("Write a helper for:\\n{prompt}")``.

    Raises:
        ValueError: at construction, a template that ``str.format`` cannot parse (``"{topic"``),
            naming the template; when called, a field whose value is ``None`` (a row of a
            ``datasets`` table that lacks the field gets ``None``, which would become the text
            ``"None"`` in the prompt).
        KeyError: when called, a field the row does not have, naming it and the row's fields.
    """

    def __init__(self, template: str) -> None:
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
        except ValueError as err:
            raise ValueError(
                f"PromptTemplate {template!r}: not a valid str.format template ({err})"
            ) from None
        if any(not n or n[0].isdigit() for n in names):
            raise ValueError(
                f"PromptTemplate {template!r}: positional fields ({{}} or {{0}}) have no value; "
                "name a field of the row, e.g. {prompt}"
            )
        self.fields = sorted({n.split(".")[0].split("[")[0] for n in names})
        self.template = template

    def __call__(self, example: dict[str, Any]) -> str:
        missing = [f for f in self.fields if f not in example]
        if missing:
            raise KeyError(
                f"PromptTemplate {self.template[:40]!r} uses field {missing[0]!r}; the row has {sorted(example)}"
            )
        empty = [f for f in self.fields if example[f] is None]
        if empty:
            raise ValueError(
                f"PromptTemplate {self.template[:40]!r}: the row's field {empty[0]!r} is None (missing in "
                "this row); fill or drop such rows"
            )
        return self.template.format(**example)

    def __repr__(self) -> str:
        return f"PromptTemplate({self.template!r})"


class _Solved:
    """The type of :data:`SOLVED` (one instance)."""

    _instance: _Solved | None = None

    def __new__(cls) -> _Solved:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "SOLVED"

    def __reduce__(self) -> str:  # pickles (and copies) as the one instance
        return "SOLVED"


SOLVED = _Solved()
"""What a :class:`Transition` returns to end an episode because the team solved it: the branch enters
an absorbing solved state, whose return counts its reward for every remaining turn (see
:mod:`comlrl_lightning.core.td`). ``None`` ends an episode with nothing after it."""


@runtime_checkable
class Transition(Protocol):
    """Writes each agent's next prompt after a turn (multi-turn Dec-POMDP).

    Called as ``transition(episode, turn, prompts, completions)`` after turn ``turn`` (0-based), where
    ``prompts[i]`` lists agent ``i``'s prompts for turns ``0..turn`` and ``completions[i]`` its
    completions for the same turns; the joint action just taken is ``[c[-1] for c in completions]``.
    Returns one prompt per agent for turn ``turn + 1``; ``None`` to end the episode (no reward after
    it); or :data:`SOLVED` to end it because the team solved it (an absorbing solved state).
    The return annotation is ``Any`` so that a transition named in YAML may annotate its return as it
    likes (jsonargparse compares annotations when it checks a class against this protocol).
    """

    def __call__(
        self,
        episode: Episode,
        turn: int,
        prompts: Sequence[Sequence[str]],
        completions: Sequence[Sequence[str]],
    ) -> Any: ...


class DecPOMDP:
    """A text Dec-POMDP: per-agent formatters, a shared reward, an optional transition.

    Args:
        formatters: one :data:`Formatter` (or template string) per agent; their count is the number
            of agents.
        reward: a reward function, a list of them (summed), or a :class:`WeightedReward`.
        transition: a :class:`Transition` for multi-turn episodes; ``None`` for single-turn tasks.

    Raises:
        ValueError: no formatter given, or a template ``str.format`` cannot parse (``formatters[i]``).
        TypeError: a formatter that is neither a string nor callable (``formatters[i]``).
    """

    def __init__(
        self,
        formatters: Sequence[str | Formatter],
        reward: RewardFunction | WeightedReward | Sequence[RewardFunction],
        transition: Transition | None = None,
    ) -> None:
        if not formatters:
            raise ValueError("DecPOMDP.formatters: give one formatter per agent (got none)")
        self.formatters: list[Formatter] = []
        for i, f in enumerate(formatters):
            if isinstance(f, str):
                try:
                    f = PromptTemplate(f)
                except ValueError as err:
                    raise ValueError(f"formatters[{i}]: {err}") from None
            elif not callable(f):
                raise TypeError(
                    f"formatters[{i}]: got a {type(f).__name__}; give a template string or a callable"
                )
            self.formatters.append(f)
        self.reward_fn = as_weighted_reward(reward)
        self.transition_fn = transition

    @property
    def num_agents(self) -> int:
        """The number of agents (one per formatter)."""
        return len(self.formatters)

    def observe(self, episode: Episode, agent: int) -> str:
        """Agent ``agent``'s turn-0 prompt for ``episode``."""
        return self.formatters[agent](episode.data)

    def reward(
        self, joint_actions: Sequence[Sequence[str]], episodes: Sequence[Episode], turn: int, step: int = -1
    ) -> RewardOutput:
        """Shared rewards for ``J`` joint actions (``joint_actions[j][i]``: agent i's text). See WeightedReward."""
        return self.reward_fn(joint_actions, episodes, turn, step=step)

    def transition(
        self,
        episode: Episode,
        turn: int,
        prompts: Sequence[Sequence[str]],
        completions: Sequence[Sequence[str]],
    ) -> Sequence[str] | _Solved | None:
        """Next prompts per agent after ``turn``; ``None`` or :data:`SOLVED` when the episode ends (see
        Transition)."""
        if self.transition_fn is None:
            return None
        nxt = self.transition_fn(episode, turn, prompts, completions)
        if nxt is not None and nxt is not SOLVED and len(nxt) != self.num_agents:
            raise ValueError(
                f"transition {type(self.transition_fn).__name__} returned {len(nxt)} prompts for "
                f"{self.num_agents} agents at turn {turn}"
            )
        return nxt
