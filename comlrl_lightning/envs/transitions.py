"""Generic transitions for multi-turn episodes (usable from YAML).

A transition writes every agent's next prompt; the agent also sees its own earlier prompts and
completions (the module renders the whole history, with the chat template when there is one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from comlrl_lightning.envs.base import Episode


class RolePromptTransition:
    """Next prompts from ``str.format`` templates, one list per turn after the first.

    ``templates[t]`` holds the prompts for turn ``t + 1``: one template per agent, or a single one
    for every agent. Fields: the episode row's fields, ``{completion}`` (the agent's own last
    completion), ``{teammates}`` (the other agents' last completions, one per line, prefixed
    ``[Agent j]``), ``{turn}`` (the 1-based number of the turn being prompted).

    With ``num_agents=1`` this is self-play by role: e.g. turn 0 proposes, turn 1's template asks
    the same model to critique its previous answer and write a better one.

    Args:
        templates: per turn after the first, the templates (a string is one template for all agents).

    Raises:
        ValueError: no templates, or an entry whose agent count does not match at call time.
    """

    def __init__(self, templates: Sequence[str | Sequence[str]]) -> None:
        if not templates:
            raise ValueError("RolePromptTransition.templates: give at least one turn of templates")
        self.templates = [[t] if isinstance(t, str) else list(t) for t in templates]

    def __call__(
        self,
        episode: Episode,
        turn: int,
        prompts: Sequence[Sequence[str]],
        completions: Sequence[Sequence[str]],
    ) -> Sequence[str] | None:
        if turn >= len(self.templates):
            return None
        n = len(completions)
        row = self.templates[turn]
        if len(row) not in (1, n):
            raise ValueError(
                f"RolePromptTransition.templates[{turn}]: got {len(row)} templates for {n} agents"
            )
        out = []
        for i in range(n):
            fields: dict[str, Any] = dict(episode.data)
            others = [f"[Agent {j}] {completions[j][-1]}" for j in range(n) if j != i]
            fields.update(completion=completions[i][-1], teammates="\n".join(others), turn=turn + 2)
            out.append((row[0] if len(row) == 1 else row[i]).format(**fields))
        return out
