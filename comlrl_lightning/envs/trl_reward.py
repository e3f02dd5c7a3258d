"""`TRLReward`: a TRL-style reward function used as a Dec-POMDP reward.

TRL's ``GRPOTrainer`` calls each reward function as
``fn(prompts=..., completions=..., completion_ids=..., **dataset_columns)`` and expects one float
(or ``None``) per completion. :class:`TRLReward` makes such a function a
:class:`~comlrl_lightning.envs.rewards.RewardFunction` (``fn(joint_actions, episodes, turn)``).

How N agents' completions map onto ``completions``:

- ``agent="each"`` (default): the function is called once per agent, with that agent's completions
  of the ``J`` joint actions, and its values become that agent's column: a per-agent reward
  ``[J, N]`` (each agent judged on its own completion, as TRL judges one model's).
- ``agent=k``: called once with agent ``k``'s completions; the values are the team's shared reward
  ``[J]`` (e.g. the last agent writes the final answer).
- ``agent="joined"``: called once with the agents' completions of each joint action joined by
  ``separator`` (agent order); the shared reward ``[J]`` scores the team's text as one.

The keyword arguments are TRL's: ``prompts`` is the dataset's ``prompt`` column (``prompt_field``)
of each joint action's episode, every other column of the row is passed under its own name as a
list (TRL's ``**kwargs``), ``completion_ids`` holds the completions' token ids when a
``tokenizer`` is given (else ``None``). When the prompt is conversational (a list of
``{"role", "content"}`` messages), each completion is passed as TRL does:
``[{"role": "assistant", "content": text}]``. A ``None`` value (TRL: "this function does not apply
to the sample", summed as 0 by TRL's ``nansum``) becomes 0.0.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from comlrl_lightning.core.choices import Choice

TRL_REWARD_AGENT = Choice(
    "TRLReward.agent",
    {
        "each": "called once per agent with that agent's completions; a per-agent reward [J, N]",
        "joined": "called once with each joint action's completions joined by `separator`; a shared reward [J]",
    },
)
"""The string values of :class:`TRLReward`'s ``agent`` (an agent index >= 0 is the third form: that
agent's completions, a shared reward ``[J]``)."""
Agent = int | TRL_REWARD_AGENT.literal


class TRLReward:
    """A TRL-style reward ``fn(prompts, completions, **kwargs) -> list[float | None]`` as a Dec-POMDP reward.

    Args:
        function: the TRL reward function, or its import path (``"my_rewards.accuracy"``).
        agent: ``"each"``, an agent index, or ``"joined"`` (see the module docstring).
        prompt_field: the row field passed as ``prompts``.
        separator: between the agents' texts with ``agent="joined"``.
        tokenizer: a tokenizer name or path (``transformers.AutoTokenizer``) for ``completion_ids``;
            None passes ``completion_ids=None``.
        name: the metric name (``rewards/<name>/mean``); default the function's ``__name__``.

    Raises:
        TypeError: ``function`` is not callable, or cannot be called with ``prompts`` and
            ``completions`` as keywords.
        ValueError: a negative ``agent`` index or a string not in :data:`TRL_REWARD_AGENT`.
    """

    def __init__(
        self,
        function: Callable[..., Sequence[float | None]] | str,
        agent: Agent = "each",
        prompt_field: str = "prompt",
        separator: str = "\n\n",
        tokenizer: str | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(function, str):
            module, _, attr = function.rpartition(".")
            function = getattr(importlib.import_module(module), attr)
        if not callable(function):
            raise TypeError(f"TRLReward.function: got a {type(function).__name__}; give a callable")
        _check_trl_signature(function)
        if not (agent in TRL_REWARD_AGENT.names or (isinstance(agent, int) and agent >= 0)):
            allowed = ", ".join(repr(v) for v in TRL_REWARD_AGENT.names)
            raise ValueError(f"TRLReward.agent: got {agent!r}; allowed: {allowed} or an agent index >= 0")
        self.function, self.agent, self.prompt_field, self.separator = (
            function,
            agent,
            prompt_field,
            separator,
        )
        self.name = name or getattr(function, "__name__", type(function).__name__)
        self._tokenizer_name, self._tokenizer = tokenizer, None

    def __call__(self, joint_actions: Any, episodes: Any, turn: Any, /) -> list[Any]:
        """``[J]`` shared or ``[J, N]`` per-agent rewards (see the module docstring).

        Raises:
            IndexError: ``agent`` is not an agent of these joint actions.
        """
        rows = [dict(getattr(e, "data", None) or {}) for e in episodes]
        num_agents = len(joint_actions[0]) if joint_actions else 0
        if self.agent == "each":
            columns = [self._score([a[i] for a in joint_actions], rows) for i in range(num_agents)]
            return [list(values) for values in zip(*columns)]
        if self.agent == "joined":
            return self._score([self.separator.join(a) for a in joint_actions], rows)
        if self.agent >= num_agents:
            raise IndexError(f"TRLReward.agent: got {self.agent}; the joint actions have {num_agents} agents")
        return self._score([a[self.agent] for a in joint_actions], rows)

    def _score(self, texts: list[str], rows: list[dict[str, Any]]) -> list[float]:
        prompts = [row.get(self.prompt_field) for row in rows]
        conversational = bool(prompts) and isinstance(prompts[0], list)
        completions: list[Any] = (
            [[{"role": "assistant", "content": t}] for t in texts] if conversational else texts
        )
        columns = {
            k for row in rows for k in row if k not in (self.prompt_field, "completion", "completion_ids")
        }
        kwargs = {k: [row.get(k) for row in rows] for k in sorted(columns)}
        values = self.function(
            prompts=prompts, completions=completions, completion_ids=self._ids(texts), **kwargs
        )
        return [0.0 if v is None else v for v in values]

    def _ids(self, texts: list[str]) -> list[list[int]] | None:
        if self._tokenizer_name is None:
            return None
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_name)
        return [self._tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _check_trl_signature(function: Callable[..., Any]) -> None:
    import inspect

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: the first call will tell
        return
    try:
        signature.bind_partial(prompts=[], completions=[], completion_ids=None)  # columns may be named too
    except TypeError as err:
        raise TypeError(
            f"TRLReward.function: {getattr(function, '__name__', function)}{signature} cannot be called "
            f"as fn(prompts=..., completions=..., completion_ids=..., **columns) ({err}); a TRL reward "
            "takes (prompts, completions, **kwargs)"
        ) from None
