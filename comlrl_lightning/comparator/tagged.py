"""The tagged joint format of a centralized comparator: one prompt that asks one model for every
role, and the split of its completion back into per-agent texts; any adapter with CoMLRL's
``CentralizedComparatorAdapter`` methods (``build_prompt``, ``parse_completion``) can replace it.

A transcription of CoMLRL 1.4.3 ``preference/centralized.py`` ``TaggedCentralizedComparatorAdapter``
(prompt text and tag pattern verbatim, so a comparator served for CoMLRL answers the same). The
centralized actor (centralized MAGRPO) uses the same adapter protocol; one tagged adapter should
serve both once they live side by side.

Where this differs from CoMLRL on purpose: a completion with none of the tags is a defined outcome
(every role ``""``, ``parsed=False``; the pair is then ordered by what the reward makes of empty
responses) instead of CoMLRL's ``CentralizedComparatorParseError``, which stops the run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class CentralizedComparatorAdapter(Protocol):
    """CoMLRL 1.4.3's adapter protocol (``preference/centralized.py``): a CoMLRL adapter works as is."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str: ...

    def parse_completion(
        self, completion: str, batch_item: dict[str, Any], num_agents: int
    ) -> Sequence[str] | None:
        """The ``num_agents`` role texts; None or a ``ValueError``: the completion could not be parsed."""
        ...


def build_tagged_prompt(agent_prompts: Sequence[str]) -> str:
    """One prompt asking for every agent's output in ``<agent_i>...</agent_i>`` sections.

    Args:
        agent_prompts: ``[N]`` each agent's observation text.
    """
    sections = "\n\n".join(f"Agent {i} original prompt:\n{p}" for i, p in enumerate(agent_prompts))
    tags = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(len(agent_prompts)))
    return f"""You are a centralized coordinator producing the separate outputs of {len(agent_prompts)} agents.

Each output must satisfy its corresponding original prompt. Keep the outputs separate;
do not merge them or add commentary outside the required tags.

{sections}

Return exactly one section for each agent in this format:
{tags}
"""


def parse_tagged_completion(completion: str, num_agents: int) -> tuple[list[str], bool]:
    """Split a tagged completion into ``[num_agents]`` texts (a missing section: ``""``).

    Returns:
        ``(texts, parsed)``: ``parsed`` is False when no section was found (every text ``""``).
    """
    texts, found = [], False
    for i in range(num_agents):
        match = re.search(
            rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", str(completion), re.IGNORECASE | re.DOTALL
        )
        found = found or match is not None
        texts.append(match.group(1).strip() if match is not None else "")
    return texts, found


@dataclass(frozen=True)
class TaggedAdapter:
    """The default adapter: :func:`build_tagged_prompt` and :func:`parse_tagged_completion` behind
    CoMLRL's adapter methods (a completion without tags raises ``ValueError``, as CoMLRL's does)."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        return build_tagged_prompt(agent_prompts)

    def parse_completion(
        self, completion: str, batch_item: dict[str, Any], num_agents: int
    ) -> Sequence[str] | None:
        texts, parsed = parse_tagged_completion(completion, num_agents)
        if not parsed:
            raise ValueError("the completion contains no <agent_i> ... </agent_i> section")
        return texts


def joint_prompt(
    adapter: CentralizedComparatorAdapter, batch_item: dict[str, Any], agent_prompts: Sequence[str]
) -> str:
    """The adapter's joint prompt for one episode.

    Raises:
        ValueError: the adapter returned an empty or non-string prompt (CoMLRL refuses it too).
    """
    prompt = adapter.build_prompt(batch_item, list(agent_prompts))
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(
            f"{type(adapter).__name__}.build_prompt must return a non-empty string, got {prompt!r}"
        )
    return prompt


def split_completion(
    adapter: CentralizedComparatorAdapter, completion: str, batch_item: dict[str, Any], num_agents: int
) -> tuple[list[str], bool]:
    """``(texts, parsed)``: the adapter's ``num_agents`` texts, or every text ``""`` and ``parsed=False``
    when it returns None or raises ``ValueError``.

    Raises:
        TypeError: the adapter returned a string or non-string texts (an adapter bug, as in CoMLRL).
        ValueError: it returned another number of texts than ``num_agents``.
    """
    try:
        texts = adapter.parse_completion(completion, batch_item, num_agents)
    except ValueError:
        texts = None
    if texts is None:
        return [""] * num_agents, False
    if isinstance(texts, (str, bytes)) or not all(isinstance(t, str) for t in texts):
        raise TypeError(
            f"{type(adapter).__name__}.parse_completion must return a sequence of strings, got {texts!r}"
        )
    if len(texts) != num_agents:
        raise ValueError(
            f"{type(adapter).__name__}.parse_completion returned {len(texts)} texts for {num_agents} agents"
        )
    return list(texts), True
